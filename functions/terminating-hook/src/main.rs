//! The terminating hook Lambda function: wiring only. The drain lives in
//! `node_manager::drain`, instance notices (Spot, rebalance, maintenance) in
//! `node_manager::instance_notice`; this builds the clients once per execution environment and
//! hands every invocation to them.

use lambda_runtime::{LambdaEvent, service_fn};
use node_manager::aws::http_client::load_sdk_config;
use node_manager::aws::load_balancing::SdkLoadBalancers;
use node_manager::aws::sdk::{SdkAutoScaling, SdkEks, SdkInstances, SdkNotifications};
use node_manager::cluster::ClusterAccess;
use node_manager::cluster::connection::EksConnection;
use node_manager::drain::{self, Drainer, Invocation};
use node_manager::instance_notice;
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::DrainSettings;
use node_manager::settings::ProcessEnv;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    node_manager::telemetry::init();
    let settings = DrainSettings::from_source(&ProcessEnv)?;
    let sdk_config = load_sdk_config().await;
    let access = ClusterAccess::new(
        &sdk_config,
        settings.lifecycle.cluster.cluster_name.clone(),
        drain::FUNCTION_NAME,
    );
    let connection = EksConnection {
        access,
        eks: SdkEks::new(&sdk_config),
    };
    let drainer = Drainer::new(
        connection,
        SdkAutoScaling::new(&sdk_config),
        SdkInstances::new(&sdk_config),
        SdkNotifications::new(&sdk_config),
        settings,
    )
    .with_load_balancers(SdkLoadBalancers::new(&sdk_config));
    let drainer = &drainer;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let invocation = Invocation::from_context(&event.context, drainer.hand_over_margin());
        instance_notice::handle_terminating_hook_event(drainer, event.payload, &invocation).await
    }))
    .await
}
