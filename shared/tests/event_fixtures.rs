//! Every payload in `tests/fixtures/` is read by the parser that serves it, with the real-world
//! quirks the fixtures keep on purpose (see `tests/fixtures/README.md`): both spellings of the
//! SNS URL fields, `NotificationMetadata` present or absent, `Origin`/`Destination` naming the
//! warm pool, EventBridge delivery, node role names longer than IAM's documented 64
//! characters, and a failed CloudTrail call with `errorCode` and null `responseElements`.
#![allow(clippy::unwrap_used)]

use node_manager::lifecycle::notification::{
    DeliverySource, LifecycleMessage, LifecycleTransition, parse_event,
};
use node_manager::nodegroup_auth::event::{Invocation, Origin};
use node_manager::nodegroup_auth::role_arn::NodeRoleArn;
use node_manager::settings::ClusterScope;
use serde_json::Value;

const ACCOUNT: &str = "111111111111";
const REGION: &str = "eu-west-1";
const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";

fn fixture(name: &str) -> Value {
    let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The one lifecycle notification of a fixture, with how it arrived.
fn lifecycle(
    name: &str,
) -> (
    DeliverySource,
    node_manager::lifecycle::notification::LifecycleNotification,
) {
    let mut deliveries = parse_event(&fixture(name));
    assert_eq!(deliveries.len(), 1, "{name}: {deliveries:?}");
    let delivery = deliveries
        .remove(0)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    match delivery.message {
        LifecycleMessage::Lifecycle(notification) => (delivery.source, notification),
        other => panic!("{name}: expected a lifecycle notification, got {other:?}"),
    }
}

fn scope() -> ClusterScope {
    ClusterScope {
        cluster_name: "ironman-2022".into(),
        additional_cluster_names: vec![],
    }
}

fn origin() -> Origin {
    Origin {
        account_id: ACCOUNT.into(),
        region: REGION.into(),
    }
}

#[test]
fn sns_fixtures_with_either_url_spelling_are_lifecycle_notifications() {
    let raw = std::fs::read_to_string(format!(
        "{}/../tests/fixtures/sns-lifecycle-launching-into-warm-pool.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    assert!(
        raw.contains("\"SigningCertURL\""),
        "the HTTP spelling is kept"
    );
    let lambda_spelling = std::fs::read_to_string(format!(
        "{}/../tests/fixtures/sns-lifecycle-terminating.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    assert!(
        lambda_spelling.contains("\"SigningCertUrl\""),
        "Lambda's spelling is kept"
    );

    for (name, transition, hook) in [
        (
            "sns-lifecycle-terminating.json",
            LifecycleTransition::Terminating,
            "Terminate-LC-Hook",
        ),
        (
            "sns-lifecycle-launching.json",
            LifecycleTransition::Launching,
            "Launch-LC-Hook",
        ),
        (
            "sns-lifecycle-launching-into-warm-pool.json",
            LifecycleTransition::Launching,
            "Launch-LC-Hook",
        ),
        (
            "sns-lifecycle-terminating-to-warm-pool.json",
            LifecycleTransition::Terminating,
            "Terminate-LC-Hook",
        ),
    ] {
        let (source, notification) = lifecycle(name);
        assert!(matches!(source, DeliverySource::Sns { .. }), "{name}");
        assert_eq!(notification.transition, transition, "{name}");
        assert_eq!(notification.action.lifecycle_hook_name, hook, "{name}");
        assert_eq!(notification.action.auto_scaling_group_name, GROUP, "{name}");
        assert_eq!(notification.account_id, ACCOUNT, "{name}");
    }
}

#[test]
fn notification_metadata_and_warm_pool_directions_are_read_as_sent() {
    let (_, plain) = lifecycle("sns-lifecycle-terminating.json");
    assert_eq!(plain.notification_metadata, None);
    assert_eq!(plain.origin.as_deref(), Some("AutoScalingGroup"));
    assert_eq!(plain.destination.as_deref(), Some("EC2"));

    let (_, into_pool) = lifecycle("sns-lifecycle-launching-into-warm-pool.json");
    assert_eq!(into_pool.origin.as_deref(), Some("EC2"));
    assert_eq!(into_pool.destination.as_deref(), Some("WarmPool"));
    assert_eq!(
        into_pool.notification_metadata.as_deref(),
        Some(r#"{"cluster":"ironman-2022"}"#)
    );

    let (_, back_to_pool) = lifecycle("sns-lifecycle-terminating-to-warm-pool.json");
    assert_eq!(back_to_pool.origin.as_deref(), Some("AutoScalingGroup"));
    assert_eq!(back_to_pool.destination.as_deref(), Some("WarmPool"));
}

#[test]
fn eventbridge_lifecycle_fixture_names_the_same_action_as_the_sns_one() {
    let (source, from_eventbridge) = lifecycle("eventbridge-lifecycle-terminating.json");
    assert_eq!(source, DeliverySource::EventBridge);
    let (_, from_sns) = lifecycle("sns-lifecycle-terminating.json");
    assert_eq!(from_eventbridge.action, from_sns.action);
    assert_eq!(
        from_eventbridge.notification_metadata.as_deref(),
        Some("drain")
    );
}

#[test]
fn test_notification_fixture_is_a_test_notification() {
    let deliveries = parse_event(&fixture("sns-test-notification.json"));
    match &deliveries[..] {
        [Ok(delivery)] => match &delivery.message {
            LifecycleMessage::Test(test) => assert_eq!(test.group_name.as_deref(), Some(GROUP)),
            other => panic!("expected a test notification, got {other:?}"),
        },
        other => panic!("expected one delivery, got {other:?}"),
    }
}

#[test]
fn cloudtrail_fixtures_name_their_node_group_and_roles_longer_than_64_characters_parse() {
    let create = Invocation::parse(
        &fixture("eventbridge-create-nodegroup.json"),
        &origin(),
        &scope(),
    )
    .unwrap();
    assert_eq!(
        create,
        Invocation::Grant {
            cluster: "ironman-2022".into(),
            nodegroup: "demo-ng".into()
        }
    );
    let delete = Invocation::parse(
        &fixture("eventbridge-delete-nodegroup.json"),
        &origin(),
        &scope(),
    )
    .unwrap();
    let Invocation::Revoke {
        nodegroup,
        event_node_role: Some(role),
        ..
    } = delete
    else {
        panic!("expected a revoke, got {delete:?}");
    };
    assert_eq!(nodegroup, "demo-ng");
    let role = NodeRoleArn::parse(&role, ACCOUNT, REGION).unwrap();
    assert_eq!(
        role.name().len(),
        67,
        "the reference cluster's node role name"
    );

    let failed = fixture("eventbridge-create-nodegroup-failed.json");
    let long_role = failed["detail"]["requestParameters"]["nodeRole"]
        .as_str()
        .unwrap();
    assert_eq!(
        NodeRoleArn::parse(long_role, ACCOUNT, REGION)
            .unwrap()
            .name()
            .len(),
        69
    );
}

#[test]
fn a_failed_call_with_error_code_and_null_response_is_ignored() {
    let failed = fixture("eventbridge-create-nodegroup-failed.json");
    assert!(failed["detail"]["responseElements"].is_null());
    assert!(failed["detail"]["errorCode"].is_string());
    match Invocation::parse(&failed, &origin(), &scope()).unwrap() {
        Invocation::Ignore { reason } => {
            assert!(reason.contains("ResourceInUseException"), "{reason}")
        }
        other => panic!("a failed CreateNodegroup must change nothing, got {other:?}"),
    }
}
