//! The terminating hook Lambda function: wiring only. The drain lives in
//! `node_manager::drain`; this builds the clients once per execution environment and hands
//! every invocation to it.

use lambda_runtime::{LambdaEvent, service_fn};
use node_manager::aws::http_client::load_sdk_config;
use node_manager::aws::sdk::{SdkAutoScaling, SdkEks, SdkInstances, SdkNotifications};
use node_manager::cluster::ClusterAccess;
use node_manager::drain::{self, Drainer};
use node_manager::lifecycle::connection::EksConnection;
use node_manager::lifecycle::settings::DrainSettings;
use node_manager::settings::ProcessEnv;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let t0 = std::time::Instant::now();
    let mark = |what: &str| {
        if std::env::var_os("ONM_EXP_TIME").is_some() {
            eprintln!("TIMING {what} {:?}", t0.elapsed());
        }
    };
    node_manager::telemetry::init();
    mark("telemetry");
    let settings = DrainSettings::from_source(&ProcessEnv)?;
    mark("settings");
    let sdk_config = load_sdk_config().await;
    mark("sdk_config");
    let access = ClusterAccess::new(
        &sdk_config,
        settings.lifecycle.cluster.cluster_name.clone(),
        drain::FUNCTION_NAME,
    );
    mark("access");
    let eks = SdkEks::new(&sdk_config);
    mark("eks");
    let connection = EksConnection { access, eks };
    let asg = SdkAutoScaling::new(&sdk_config);
    mark("asg");
    let ec2 = SdkInstances::new(&sdk_config);
    mark("ec2");
    let sns = SdkNotifications::new(&sdk_config);
    mark("sns");
    let drainer = Drainer::new(connection, asg, ec2, sns, settings);
    mark("drainer");
    let drainer = &drainer;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        drain::handle(drainer, event.payload, &event.context).await
    }))
    .await
}
