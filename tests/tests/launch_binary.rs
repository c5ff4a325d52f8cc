//! The built `launching-hook` binary, run through the local Lambda Runtime API as Lambda runs
//! it, against the fake AWS endpoints and the fake API server: the fixtures, then a launch
//! that completes once the node is Ready.
//!
//! Uses the binary as built: run `cargo build --workspace --bins` after changing the function.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use node_manager::aws::LifecycleActionResult;
use node_manager_testkit::account::FakeAccount;
use node_manager_testkit::aws::{FakeAutoScalingGroup, FakeAws, FakeCluster, FakeLifecycleHook};
use node_manager_testkit::binaries::function_binary;
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use node_manager_testkit::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};
use serde_json::Value;

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
const INSTANCE: &str = "i-0a1b2c3d4e5f60718";

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/../../shared/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn response(outcome: InvocationOutcome, output: &str) -> Value {
    match outcome {
        InvocationOutcome::Response(value) => value,
        other => panic!("expected a response, got {other:?}\n--- function output ---\n{output}"),
    }
}

#[tokio::test]
async fn launching_hook_binary_handles_the_fixtures_and_a_live_launch() {
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("launching-hook");
    let aws = FakeAws::start(account.clone()).await.unwrap();
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .account(account.clone())
        .access_entries(Arc::new(aws.eks()))
        .simulation(SimulationTimings::real_time())
        .start()
        .await
        .unwrap();
    server
        .apply_manifest_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/rbac.yaml"),
        )
        .unwrap();
    aws.eks()
        .add_cluster(FakeCluster::new(CLUSTER, server.url(), &server.ca_data()));
    aws.eks()
        .add_access_entry(
            CLUSTER,
            &credentials.principal_arn,
            "STANDARD",
            None,
            &["open-node-manager:functions"],
        )
        .unwrap();
    let topic = aws.sns().create_topic("eks-asg-lifecycle-hook-topic");
    let mut subscription = aws.sns().subscribe(&topic).unwrap();
    aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .availability_zones(&["eu-west-1a"])
            .tag("eks:cluster-name", CLUSTER),
    );
    aws.autoscaling()
        .add_hook(
            GROUP,
            FakeLifecycleHook::launching("Launch-LC-Hook").notification_target(&topic),
        )
        .unwrap();
    let dns_name = aws.ec2().add_running_instance(INSTANCE).private_dns_name;
    let provider_id = format!("aws:///eu-west-1a/{INSTANCE}");

    let lambda = LambdaRuntimeApi::start_function(
        FunctionSpec::new("launching-hook", function_binary("launching-hook"))
            .envs(aws.environment(&credentials))
            .env("CLUSTER_NAME", CLUSTER)
            .env("LAUNCH_TIMEOUT_SECONDS", "20")
            .env("HAND_OVER_MARGIN_SECONDS", "5")
            .env("RUST_LOG", "info"),
    )
    .await
    .unwrap();
    let timeout = Duration::from_secs(30);

    // The test notification: acknowledged.
    let answer = response(
        lambda
            .invoke(&fixture("sns-test-notification.json"), timeout)
            .await
            .unwrap(),
        &lambda.output(),
    );
    assert_eq!(answer["records"][0]["outcome"], "TestNotification");

    // The launching fixture (from 2022: its launch timeout passed long ago) for an instance
    // whose node is Ready: one look, CONTINUE. Auto Scaling does not know the fixture's
    // token, so the completion answers "No active Lifecycle Action", which is success.
    server
        .register_node(&dns_name, &provider_id, Some(Duration::ZERO))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = response(
        lambda
            .invoke(&fixture("sns-lifecycle-launching.json"), timeout)
            .await
            .unwrap(),
        &lambda.output(),
    );
    assert_eq!(
        answer["records"][0]["outcome"], "AlreadyCompleted",
        "{answer}"
    );
    let calls = aws.requests_for("CompleteLifecycleAction");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0]
            .params
            .get("LifecycleActionToken")
            .map(String::as_str),
        Some("71514b9d-6a40-4b26-8523-05e7ee35fa40")
    );
    assert_eq!(
        calls[0]
            .params
            .get("LifecycleActionResult")
            .map(String::as_str),
        Some("CONTINUE")
    );

    // A live launch: completed with CONTINUE.
    aws.autoscaling().launch_instance(GROUP, INSTANCE).unwrap();
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let answer = response(
        lambda.invoke(&event, timeout).await.unwrap(),
        &lambda.output(),
    );
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(answer["records"][0]["node"], dns_name.as_str());
    let completions = aws.autoscaling().completions();
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);

    // A malformed message: a clear error naming the field.
    let mut malformed = fixture("sns-lifecycle-launching.json");
    malformed["Records"][0]["Sns"]["Message"] =
        "{\"LifecycleTransition\":\"autoscaling:EC2_INSTANCE_LAUNCHING\"}".into();
    match lambda.invoke(&malformed, timeout).await.unwrap() {
        InvocationOutcome::Error {
            error_type,
            error_message,
        } => {
            assert_eq!(error_type, "RecordsFailed");
            assert!(error_message.contains("record 0"), "{error_message}");
        }
        other => panic!("expected an error, got {other:?}"),
    }

    // One JSON log line per step, with the fields an operator searches by.
    let output = lambda.output();
    let step = output
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line.to_string().contains("launch completed with CONTINUE"))
        .unwrap_or_else(|| panic!("no JSON log line for the completion:\n{output}"));
    let text = step.to_string();
    for field in ["instance_id", "asg", "hook", "request_id", "node"] {
        assert!(text.contains(field), "{field} missing from {text}");
    }
    // An EMF metric line for the completion.
    assert!(
        output
            .lines()
            .any(|l| l.contains("\"_aws\"") && l.contains("LaunchWaitDuration")),
        "{output}"
    );
}
