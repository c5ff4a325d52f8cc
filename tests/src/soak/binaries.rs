//! The three function binaries running under the local Lambda Runtime API against the fake
//! AWS endpoints and the fake API server (EKS tokens through access entries, the shipped
//! RBAC), for the suite's end-to-end tests through the real processes.

use std::sync::Arc;
use std::time::Duration;

use node_manager::aws::LifecycleActionResult;

use super::corpus::{self, Target};
use crate::account::{FakeAccount, FakeCredentials};
use crate::aws::{
    FakeAutoScalingGroup, FakeAws, FakeCluster, FakeInstance, FakeLifecycleHook, FakeNodegroup,
};
use crate::binaries::function_binary;
use crate::kube::FakeApiServer;
use crate::lambda_api::{FunctionSpec, LambdaRuntimeApi};

pub const CLUSTER: &str = "ironman-2022";
pub const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
pub const INSTANCE: &str = "i-07e9ea9eb19a67337";
pub const NODE: &str = "ip-192-168-12-34.eu-west-1.compute.internal";
const FUNCTIONS_GROUP: &str = "open-node-manager:functions";

/// The fakes and the three functions, in the order terminating, launching, nodegroup-auth.
pub struct FunctionWorld {
    pub aws: FakeAws,
    pub server: FakeApiServer,
    pub functions: Vec<(Target, LambdaRuntimeApi, FakeCredentials)>,
}

/// Starts the world; `extra_env` is added to every function's environment (after the
/// defaults, so it overrides them).
pub async fn function_world(extra_env: &[(&str, &str)]) -> FunctionWorld {
    let account = FakeAccount::reference();
    let aws = FakeAws::start(account.clone())
        .await
        .expect("function world set-up");
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .account(account.clone())
        .access_entries(Arc::new(aws.eks()))
        .start()
        .await
        .expect("function world set-up");
    server
        .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
        .expect("function world set-up");
    aws.eks().add_cluster(
        FakeCluster::new(CLUSTER, server.url(), &server.ca_data())
            .authentication_mode(Some("API_AND_CONFIG_MAP")),
    );
    aws.eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new("demo-ng", &account.role_arn("demo-ng-node-role"))
                .ami_type("AL2_x86_64")
                .auto_scaling_group(GROUP),
        )
        .expect("function world set-up");
    let topic = aws.sns().create_topic("eks-asg-lifecycle-hook-topic");
    aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", CLUSTER)
            .availability_zones(&["eu-west-1a"]),
    );
    for hook in [
        FakeLifecycleHook::terminating("Terminate-LC-Hook"),
        FakeLifecycleHook::launching("Launch-LC-Hook"),
    ] {
        aws.autoscaling()
            .add_hook(
                GROUP,
                hook.heartbeat_timeout(Duration::from_secs(300))
                    .default_result(LifecycleActionResult::Continue)
                    .notification_target(&topic),
            )
            .expect("function world set-up");
    }
    aws.ec2().add_instance(
        FakeInstance::new(INSTANCE, "eu-west-1")
            .private_dns_name(NODE)
            .availability_zone("eu-west-1a"),
    );
    aws.autoscaling()
        .add_instance(GROUP, INSTANCE, "eu-west-1a")
        .expect("function world set-up");
    server
        .register_node(
            NODE,
            &format!("aws:///eu-west-1a/{INSTANCE}"),
            Some(Duration::ZERO),
        )
        .expect("function world set-up");

    let mut functions = Vec::new();
    for target in [
        Target::TerminatingHook,
        Target::LaunchingHook,
        Target::NodegroupAuth,
    ] {
        let name = target.function_name();
        let creds = account.add_role_credentials(&format!("open-node-manager-{name}"));
        aws.eks()
            .add_access_entry(
                CLUSTER,
                &creds.principal_arn,
                "STANDARD",
                Some(name),
                &[FUNCTIONS_GROUP],
            )
            .expect("function world set-up");
        let spec = FunctionSpec::new(name, function_binary(name))
            .envs(aws.environment(&creds))
            .env("CLUSTER_NAME", CLUSTER)
            .env("CONTINUATION_TOPIC_ARN", &topic)
            .env("SETTLE_SECONDS", "0")
            .env("DRAIN_TIMEOUT_SECONDS", "5")
            .env("LAUNCH_TIMEOUT_SECONDS", "2")
            .env("DELETE_WAIT_SECONDS", "1")
            .env("DELETE_POLL_SECONDS", "1")
            .env("HAND_OVER_MARGIN_SECONDS", "1")
            // The most verbose logging a function can be configured with: nothing it
            // logs may hold a credential.
            .env("RUST_LOG", "trace")
            .env("AWS_LAMBDA_LOG_LEVEL", "TRACE")
            .envs(
                extra_env
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<Vec<_>>(),
            );
        let runtime = LambdaRuntimeApi::start_function(spec)
            .await
            .expect("function world set-up");
        functions.push((target, runtime, creds));
    }
    FunctionWorld {
        aws,
        server,
        functions,
    }
}
