//! The built `launching-hook` binary, run through the local Lambda Runtime API as Lambda runs
//! it, against the fake AWS endpoints and the fake API server: the fixtures, then a launch
//! that completes once the node is Ready.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing the function.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use node_manager::aws::LifecycleActionResult;
use node_manager_testkit::e2e::{FunctionWorld, GROUP, Target};
use node_manager_testkit::kube::SimulationTimings;
use node_manager_testkit::soak::corpus::fixture;
use serde_json::Value;

/// The launching fixture's instance.
const INSTANCE: &str = "i-0a1b2c3d4e5f60718";

#[tokio::test]
async fn launching_hook_binary_handles_the_fixtures_and_a_live_launch() {
    let w = FunctionWorld::builder()
        .functions(&[Target::LaunchingHook])
        .pending_instance(INSTANCE)
        .simulation(SimulationTimings::real_time())
        .env("LAUNCH_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
        .start()
        .await;
    let (aws, server) = (&w.aws, &w.server);
    let mut subscription = aws.sns().subscribe(&w.topic).unwrap();
    let lambda = w.function(Target::LaunchingHook);
    let dns_name = w.node.clone();

    // The test notification: acknowledged.
    let answer = lambda
        .response_to(&fixture("sns-test-notification.json"))
        .await;
    assert_eq!(answer["records"][0]["outcome"], "TestNotification");

    // The launching fixture (from 2022: its launch timeout passed long ago) for an instance
    // whose node is Ready: one look, CONTINUE. Auto Scaling does not know the fixture's
    // token, so the completion answers "No active Lifecycle Action", which is success.
    server
        .register_node(&dns_name, &w.provider_id(), Some(Duration::ZERO))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = lambda
        .response_to(&fixture("sns-lifecycle-launching.json"))
        .await;
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
    let answer = lambda.response_to(&event).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(answer["records"][0]["node"], dns_name.as_str());
    let completions = aws.autoscaling().completions();
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);

    // A malformed message: a clear error naming the field.
    let mut malformed = fixture("sns-lifecycle-launching.json");
    malformed["Records"][0]["Sns"]["Message"] =
        "{\"LifecycleTransition\":\"autoscaling:EC2_INSTANCE_LAUNCHING\"}".into();
    let (error_type, error_message) = lambda.error_from(&malformed).await;
    assert_eq!(error_type, "RecordsFailed");
    assert!(error_message.contains("record 0"), "{error_message}");

    // One JSON log line per step, with the fields an operator searches by.
    let output = lambda.runtime.output();
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
