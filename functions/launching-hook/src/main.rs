//! The launching hook Lambda function: wiring only. The behaviour lives in
//! `node_manager::launch`; this builds the clients once per execution environment and hands
//! every invocation to it.

use lambda_runtime::{LambdaEvent, service_fn};
use node_manager::aws::http_client::load_sdk_config;
use node_manager::aws::sdk::{SdkAutoScaling, SdkEks, SdkInstances, SdkNotifications};
use node_manager::cluster::ClusterAccess;
use node_manager::cluster::connection::EksConnection;
use node_manager::launch::{self, Launcher};
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::LaunchSettings;
use node_manager::settings::ProcessEnv;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    node_manager::telemetry::init();
    let settings = LaunchSettings::from_source(&ProcessEnv)?;
    let sdk_config = load_sdk_config().await;
    let access = ClusterAccess::new(
        &sdk_config,
        settings.lifecycle.cluster.cluster_name.clone(),
        launch::FUNCTION_NAME,
    );
    let connection = EksConnection {
        access,
        eks: SdkEks::new(&sdk_config),
    };
    let launcher = Launcher::new(
        connection,
        SdkAutoScaling::new(&sdk_config),
        SdkInstances::new(&sdk_config),
        SdkNotifications::new(&sdk_config),
        settings,
    );
    let launcher = &launcher;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        launcher.handle(event.payload, &event.context).await
    }))
    .await
}
