//! What the user sees of a launch besides the Lambda response: a log line per step, Kubernetes
//! Events on the node, and one metric set per record.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};

use super::FUNCTION_NAME;
use crate::lifecycle::notification::LifecycleNotification;
use crate::telemetry::{MetricSet, Unit};

/// One structured log line with the fields every step carries.
pub(super) fn log_step(notification: &LifecycleNotification, node: Option<&str>, step: &str) {
    tracing::info!(
        instance_id = %notification.action.instance_id,
        node = node.unwrap_or_default(),
        hook = %notification.action.lifecycle_hook_name,
        asg = %notification.action.auto_scaling_group_name,
        request_id = %notification.request_id,
        continuation = notification.continuation,
        "{step}"
    );
}

/// How long ago `time` was, in seconds; zero for a time in the future.
pub(super) fn seconds_since(time: Timestamp) -> f64 {
    let elapsed: Duration = time
        .duration_until(Timestamp::now())
        .try_into()
        .unwrap_or(Duration::ZERO);
    elapsed.as_secs_f64()
}

/// A Kubernetes Event on the node. An Event that cannot be written is logged, never fatal.
pub(super) async fn publish_event(
    recorder: &Recorder,
    node: &Node,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "CompleteLifecycleAction".to_owned(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &node.object_ref(&())).await {
        tracing::warn!(
            node = node.metadata.name.as_deref().unwrap_or_default(),
            reason,
            error = %error,
            "cannot record a Kubernetes Event on the node"
        );
    }
}

/// The record's metric set: its outcome, how long the launch waited, the continuations.
pub(super) fn emit_metrics(
    outcome: &str,
    notification: &LifecycleNotification,
    node: Option<&str>,
    continuations: u32,
) {
    let mut metrics = MetricSet::new(FUNCTION_NAME)
        .dimension("Outcome", outcome)
        .metric(
            "LaunchWaitDuration",
            seconds_since(notification.time),
            Unit::Seconds,
        )
        .metric("Continuations", f64::from(continuations), Unit::Count)
        .property("InstanceId", notification.action.instance_id.as_str())
        .property(
            "AutoScalingGroupName",
            notification.action.auto_scaling_group_name.as_str(),
        )
        .property("RequestId", notification.request_id.as_str());
    if let Some(node) = node {
        metrics = metrics.property("NodeName", node);
    }
    metrics.emit();
}
