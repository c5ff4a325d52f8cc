//! The launching hook's handling of records that need no Kubernetes access: test
//! notifications, unknown and other transitions, other clusters' groups, malformed input.
//! Each must leave Auto Scaling untouched (no completion, no heartbeat, nothing published).
#![allow(clippy::unwrap_used)]

use node_manager::lifecycle::handler::Clients;
use std::time::{Duration, SystemTime};

use node_manager::aws::in_memory::{InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications};
use node_manager::launch::{LaunchError, LaunchOutcome, Launcher};
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::LaunchSettings;
use serde_json::{Value, json};

const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";

fn fixture(name: &str) -> Value {
    let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A client for an address where nothing listens: these records must never reach it.
fn unreachable_client() -> kube::Client {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

struct Harness {
    asg: InMemoryAutoScaling,
    sns: InMemoryNotifications,
    ctx: Launcher<
        Clients<kube::Client, InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications>,
    >,
}

fn harness(extra: &[(&str, &str)]) -> Harness {
    let mut env: Vec<(&str, &str)> = vec![("CLUSTER_NAME", "ironman-2022")];
    env.extend_from_slice(extra);
    let settings = LaunchSettings::from_source(env.as_slice()).unwrap();
    let asg = InMemoryAutoScaling::new();
    let sns = InMemoryNotifications::default();
    let ctx = Launcher::new(
        unreachable_client(),
        asg.clone(),
        InMemoryInstances::default(),
        sns.clone(),
        settings,
    );
    Harness { asg, sns, ctx }
}

fn lambda_context() -> lambda_runtime::Context {
    let mut context = lambda_runtime::Context::default();
    context.request_id = "lambda-request-1".into();
    context.invoked_function_arn =
        "arn:aws:lambda:eu-west-1:111111111111:function:launching-hook".into();
    let deadline = SystemTime::now() + Duration::from_secs(60);
    context.deadline = u64::try_from(
        deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    context
}

fn assert_untouched(h: &Harness) {
    assert!(h.asg.completions().is_empty(), "{:?}", h.asg.completions());
    assert!(h.asg.heartbeats().is_empty());
    assert!(h.sns.published().is_empty());
}

/// The launching fixture with its message edited.
fn launching_with(edit: impl FnOnce(&mut Value)) -> Value {
    let mut event = fixture("sns-lifecycle-launching.json");
    let mut message: Value =
        serde_json::from_str(event["Records"][0]["Sns"]["Message"].as_str().unwrap()).unwrap();
    edit(&mut message);
    event["Records"][0]["Sns"]["Message"] = Value::from(message.to_string());
    event
}

#[tokio::test]
async fn test_notification_is_acknowledged() {
    let h = harness(&[]);
    let report = h
        .ctx
        .handle(fixture("sns-test-notification.json"), &lambda_context())
        .await
        .unwrap();
    assert_eq!(report.records.len(), 1);
    assert_eq!(report.records[0].outcome, LaunchOutcome::TestNotification);
    assert_untouched(&h);
}

#[tokio::test]
async fn unknown_transition_is_acknowledged() {
    let h = harness(&[]);
    let event = launching_with(|m| {
        m["LifecycleTransition"] = "autoscaling:EC2_INSTANCE_WARMING".into();
    });
    let report = h.ctx.handle(event, &lambda_context()).await.unwrap();
    assert_eq!(
        report.records[0].outcome,
        LaunchOutcome::UnknownTransition {
            transition: "autoscaling:EC2_INSTANCE_WARMING".into()
        }
    );
    assert_untouched(&h);
}

#[tokio::test]
async fn terminating_notification_is_not_the_launching_hooks_business() {
    let h = harness(&[]);
    h.asg
        .add_group(GROUP, &[("eks:cluster-name", "ironman-2022")]);
    let report = h
        .ctx
        .handle(fixture("sns-lifecycle-terminating.json"), &lambda_context())
        .await
        .unwrap();
    assert!(matches!(
        report.records[0].outcome,
        LaunchOutcome::OtherTransition { .. }
    ));
    assert_untouched(&h);
}

#[tokio::test]
async fn another_clusters_group_is_left_alone() {
    let h = harness(&[]);
    h.asg
        .add_group(GROUP, &[("eks:cluster-name", "other-cluster")]);
    let report = h
        .ctx
        .handle(fixture("sns-lifecycle-launching.json"), &lambda_context())
        .await
        .unwrap();
    match &report.records[0].outcome {
        LaunchOutcome::NotOurs { reason } => assert!(reason.contains("no tag"), "{reason}"),
        other => panic!("expected NotOurs, got {other:?}"),
    }
    assert_eq!(
        report.records[0].instance_id.as_deref(),
        Some("i-0a1b2c3d4e5f60718")
    );
    assert_untouched(&h);
}

#[tokio::test]
async fn another_accounts_notification_is_left_alone() {
    let h = harness(&[]);
    h.asg
        .add_group(GROUP, &[("eks:cluster-name", "ironman-2022")]);
    let event = launching_with(|m| m["AccountId"] = "222222222222".into());
    let report = h.ctx.handle(event, &lambda_context()).await.unwrap();
    assert!(matches!(
        &report.records[0].outcome,
        LaunchOutcome::NotOurs { reason } if reason.contains("222222222222")
    ));
    assert_untouched(&h);
}

#[tokio::test]
async fn malformed_message_is_a_clear_error() {
    let h = harness(&[]);
    h.asg
        .add_group(GROUP, &[("eks:cluster-name", "ironman-2022")]);
    let event = launching_with(|m| {
        m.as_object_mut().unwrap().remove("EC2InstanceId");
    });
    let err = h.ctx.handle(event, &lambda_context()).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LaunchError::Records { total: 1, .. }));
    assert!(
        text.contains("record 0") && text.contains("EC2InstanceId"),
        "{text}"
    );
    let diagnostic: lambda_runtime::Diagnostic = err.into();
    assert_eq!(diagnostic.error_type, "RecordsFailed");
    assert_untouched(&h);
}

#[tokio::test]
async fn a_malformed_record_does_not_hide_the_others() {
    let h = harness(&[]);
    let good = fixture("sns-test-notification.json")["Records"][0].clone();
    let mut bad = good.clone();
    bad["Sns"]["Message"] = "{not json".into();
    let event = json!({"Records": [good, bad]});
    let err = h.ctx.handle(event, &lambda_context()).await.unwrap_err();
    match err {
        LaunchError::Records { total, failures } => {
            assert_eq!(total, 2);
            assert_eq!(failures.len(), 1);
            assert!(failures[0].starts_with("record 1"), "{failures:?}");
        }
        other => panic!("{other}"),
    }
    assert_untouched(&h);
}

#[tokio::test]
async fn unrecognised_event_is_an_error() {
    let h = harness(&[]);
    let err = h
        .ctx
        .handle(json!({"hello": "world"}), &lambda_context())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("neither"), "{err}");
    assert_untouched(&h);
}
