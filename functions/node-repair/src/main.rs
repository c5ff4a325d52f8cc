//! The node repair Lambda function: wiring only. The behaviour lives in
//! `node_manager::node_repair`; this reads the settings (a bad one fails the start-up),
//! builds the clients once per execution environment and hands every scheduled run to it.

use lambda_runtime::{LambdaEvent, service_fn};
use node_manager::aws::http_client::load_sdk_config;
use node_manager::aws::sdk::{SdkAutoScaling, SdkEks, SdkInstances};
use node_manager::cluster::ClusterAccess;
use node_manager::cluster::connection::EksConnection;
use node_manager::node_repair::FUNCTION_NAME;
use node_manager::node_repair::run::{self, RepairContext};
use node_manager::node_repair::settings::RepairSettings;
use node_manager::settings::ProcessEnv;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    node_manager::telemetry::init();
    let settings = RepairSettings::from_source(&ProcessEnv)?;
    let sdk_config = load_sdk_config().await;
    let access = ClusterAccess::new(
        &sdk_config,
        settings.cluster.cluster_name.clone(),
        FUNCTION_NAME,
    );
    let context = RepairContext {
        kube: EksConnection {
            access,
            eks: SdkEks::new(&sdk_config),
        },
        health: SdkAutoScaling::new(&sdk_config),
        ec2: SdkInstances::new(&sdk_config),
        settings,
    };
    let context = &context;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        Box::pin(run::handle(context, event.payload)).await
    }))
    .await
}
