//! The node group auth Lambda function: wiring only. The mapping logic lives in
//! `node_manager::nodegroup_auth`; this builds the clients once per execution environment
//! and hands every invocation to it.

use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use node_manager::aws::http_client::load_sdk_config;
use node_manager::aws::iam::SigV4Iam;
use node_manager::aws::sdk::{SdkEks, SdkInstances};
use node_manager::cluster::ClusterAccess;
use node_manager::cluster::connection::EksConnection;
use node_manager::nodegroup_auth::handler::{FUNCTION_NAME, NodegroupAuth};
use node_manager::nodegroup_auth::kube_store::KubeAwsAuthStore;
use node_manager::nodegroup_auth::settings::NodegroupAuthSettings;
use node_manager::settings::ProcessEnv;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    node_manager::telemetry::init();
    let settings = NodegroupAuthSettings::from_source(&ProcessEnv)?;
    let sdk_config = load_sdk_config().await;
    let eks = SdkEks::new(&sdk_config);
    let aws_auth = KubeAwsAuthStore::new(EksConnection {
        access: ClusterAccess::new(
            &sdk_config,
            settings.scope.cluster_name.clone(),
            FUNCTION_NAME,
        ),
        eks: eks.clone(),
    });
    let function = NodegroupAuth::new(
        eks,
        aws_auth,
        SigV4Iam::new(&sdk_config),
        SdkInstances::new(&sdk_config),
        settings,
    );
    let function = &function;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let report = function
            .handle(&event.payload, &event.context.invoked_function_arn)
            .await
            .map_err(Diagnostic::from)?;
        serde_json::to_value(report).map_err(|err| Diagnostic {
            error_type: "NodegroupAuth.Serialize".to_owned(),
            error_message: err.to_string(),
        })
    }))
    .await
}
