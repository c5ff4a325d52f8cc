//! Instances that wait in, leave and return to an Auto Scaling warm pool.
//!
//! Two things differ from a plain launch:
//! - **into the pool** (`EC2 -> WarmPool`): the instance is being pre-initialised and is
//!   stopped (or kept out of service) as soon as the action completes, so its node would
//!   never turn Ready; the hook completes once EC2 reports the instance running
//!   ([`wait_until_running`]) unless `WARM_POOL_WAIT_FOR_NODE` asks for the node;
//! - **out of the pool** (`WarmPool -> AutoScalingGroup`): the node comes back under the name
//!   it had, still carrying what the terminating hook did when the instance was scaled in
//!   with reuse (cordon, exclude-from-load-balancers label, taint, drain checkpoint). Once the
//!   node is Ready (or the launch timeout passed, completing with `CONTINUE`),
//!   [`restore_returning_node`] ends the drain's record by the reconciler's rule and writer,
//!   undoing exactly what it records the drain changed, before the action is completed.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde::Serialize;

use crate::aws::{AwsError, Instances};
use crate::node_marks::checkpoint::DrainCheckpoint;
use crate::node_marks::marks::NodeMarks;
use crate::node_marks::out_of_service::Undone;
use crate::reconcile::converge::{self, RecordUndo};
use crate::reconcile::desired::{self, Action};
use crate::retry::{RetryPolicy, with_retries};

/// How often EC2 is asked whether an instance launching into the pool runs yet.
const RUNNING_POLL: Duration = Duration::from_secs(2);

/// How a wait for a pooled instance to run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunningWait {
    /// EC2 reports this state, which is not `pending`: nothing more to wait for (`running`;
    /// or a stopped/terminated instance whose action Auto Scaling settles itself).
    Settled(String),
    /// EC2 does not know the instance.
    Unknown,
    /// Still `pending` when the wait had to stop.
    StillPending,
}

/// Asks EC2 for the instance's state until it is no longer `pending`, or `stop_at`.
pub(crate) async fn wait_until_running(
    instances: &impl Instances,
    instance_id: &str,
    stop_at: tokio::time::Instant,
) -> Result<RunningWait, AwsError> {
    loop {
        let state = with_retries(&RetryPolicy::AWS_CALL, || {
            instances.instance_state(instance_id)
        })
        .await?;
        match state.as_deref() {
            None => return Ok(RunningWait::Unknown),
            Some("pending") => {}
            Some(state) => return Ok(RunningWait::Settled(state.to_owned())),
        }
        let next = tokio::time::Instant::now() + RUNNING_POLL;
        if next >= stop_at {
            return Ok(RunningWait::StillPending);
        }
        tokio::time::sleep_until(next).await;
    }
}

/// What the return from the warm pool undid on the node (the launch report's `restored`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Restored {
    /// What was undone: the cordon, the load-balancer label, the drain's taint.
    #[serde(flatten)]
    pub undone: Undone,
    /// When the instance went to the pool, as the terminating hook recorded it (`None`: the
    /// scale-in's completion was not recorded, e.g. its action timed out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub went_to_pool_at: Option<String>,
    /// The checkpoint did not say what the drain changed (written by an older version): only
    /// the checkpoint was removed, and a cordon stays for a person to lift.
    pub unknown_changes: bool,
}

impl Restored {
    /// The undone items, for log lines and Events.
    pub fn summary(&self) -> String {
        let mut items = self.undone.items();
        items.push("drain checkpoint removed".to_owned());
        items.join(", ")
    }

    /// The report of `record` ended with `undone` undone (`None`: the record did not say
    /// what the drain changed).
    pub(crate) fn of(record: &DrainCheckpoint, undone: Option<Undone>) -> Self {
        Self {
            went_to_pool_at: record.to_warm_pool_at.map(|t| t.to_string()),
            unknown_changes: undone.is_none(),
            undone: undone.unwrap_or_default(),
        }
    }
}

/// The drain record a node back from the warm pool loses as its launch completes with
/// `CONTINUE`, as the reconciler's one rule for a lifecycle drain's end decides it
/// ([`desired::at_return_from_warm_pool`]); `None`: nothing of ours for the launch to end.
pub(crate) fn record_to_end(node: &Node, now: jiff::Timestamp) -> Option<Box<DrainCheckpoint>> {
    match desired::at_return_from_warm_pool(&NodeMarks::of(node), now)? {
        Action::UndoDrainRecord { record, .. } => Some(record),
        _ => None,
    }
}

/// The outcome of [`restore_returning_node`].
#[derive(Debug, Clone, PartialEq)]
pub enum Restore {
    /// Our drain was undone; the node as written.
    Restored { node: Box<Node>, restored: Restored },
    /// The node carries no drain record of ours for the launch to end, or it changed
    /// meanwhile (or the node was deleted): left as it is.
    NothingOfOurs,
}

/// Ends the lifecycle drain's record on the node of an instance back from the warm pool,
/// through the reconciler's one writer ([`converge::undo_drain_record`]: one conditional
/// write of exactly what the record says we did). Safe to repeat: once the record is gone
/// there is nothing of ours left.
pub(crate) async fn restore_returning_node(
    nodes: &Api<Node>,
    node: Node,
) -> Result<Restore, kube::Error> {
    let Some(record) = record_to_end(&node, jiff::Timestamp::now()) else {
        return Ok(Restore::NothingOfOurs);
    };
    Ok(
        match converge::undo_drain_record(nodes, node, &record).await? {
            RecordUndo::Undone(node, undone) => Restore::Restored {
                node,
                restored: Restored::of(&record, undone),
            },
            RecordUndo::Left => Restore::NothingOfOurs,
        },
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use jiff::Timestamp;

    use super::*;
    use crate::aws::LifecycleActionRef;
    use crate::aws::in_memory::InMemoryInstances;
    use crate::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;
    use crate::node_marks::MARKED_LABEL;
    use crate::node_marks::checkpoint::CHECKPOINT_ANNOTATION;
    use crate::node_marks::checkpoint::undo_record_patch;
    use crate::node_marks::checkpoint::{AddedTaint, OutOfService};
    use serde_json::{Value, json};

    const INSTANCE: &str = "i-0123456789abcdef0";

    /// The patch the launch's undo writes on `node` (the record the one rule ends, and
    /// exactly what it did), and its report; `None`: nothing for the launch to end.
    fn restore_patch(node: &Node) -> Option<(Value, Restored)> {
        let record = record_to_end(node, Timestamp::now())?;
        let (patch, undone) = undo_record_patch(node, &record);
        Some((patch, Restored::of(&record, undone)))
    }

    /// A drain record of `action` started at `at`, held by its invocation, that took the node
    /// out of service.
    fn record(action: &LifecycleActionRef, at: Timestamp) -> DrainCheckpoint {
        let mut record = DrainCheckpoint::start(
            action,
            at,
            Duration::from_secs(900),
            "req",
            Duration::from_secs(60),
        );
        record.out_of_service = Some(everything());
        record
    }

    fn lifecycle_action(instance_id: &str) -> LifecycleActionRef {
        LifecycleActionRef {
            auto_scaling_group_name: "g".into(),
            lifecycle_hook_name: "h".into(),
            instance_id: instance_id.into(),
            token: "t".into(),
        }
    }

    fn checkpoint(instance_id: &str, out_of_service: Option<OutOfService>) -> String {
        let mut checkpoint = record(&lifecycle_action(instance_id), Timestamp::UNIX_EPOCH);
        checkpoint.out_of_service = out_of_service;
        checkpoint.completed_at = Some(Timestamp::UNIX_EPOCH);
        checkpoint.to_warm_pool_at = Some(Timestamp::UNIX_EPOCH);
        checkpoint.to_json()
    }

    fn drained_node(annotation: Option<String>) -> Node {
        let mut value = json!({
            "metadata": {
                "name": "n1",
                "resourceVersion": "42",
                "labels": {EXCLUDE_FROM_LOAD_BALANCERS_LABEL: "true", "team": "a"},
            },
            "spec": {
                "providerID": format!("aws:///us-east-1a/{INSTANCE}"),
                "unschedulable": true,
                "taints": [
                    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                    {"key": "open-node-manager.io/draining", "value": "true", "effect": "NoSchedule"}
                ],
            },
        });
        if let Some(annotation) = annotation {
            value["metadata"]["annotations"] = json!({CHECKPOINT_ANNOTATION: annotation});
        }
        serde_json::from_value(value).unwrap()
    }

    fn everything() -> OutOfService {
        OutOfService {
            labelled: true,
            cordoned: true,
            taint: Some(AddedTaint {
                key: "open-node-manager.io/draining".into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
            }),
        }
    }

    #[test]
    fn undoes_exactly_what_the_drain_recorded_in_one_conditional_patch() {
        let node = drained_node(Some(checkpoint(INSTANCE, Some(everything()))));
        let (patch, restored) = restore_patch(&node).unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "resourceVersion": "42",
                    "annotations": {CHECKPOINT_ANNOTATION: null},
                    "labels": {EXCLUDE_FROM_LOAD_BALANCERS_LABEL: null},
                },
                "spec": {
                    "unschedulable": null,
                    "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
                },
            })
        );
        assert!(
            restored.undone.uncordoned && restored.undone.unlabelled && !restored.unknown_changes
        );
        assert_eq!(
            restored.undone.untainted.as_deref(),
            Some("open-node-manager.io/draining=true:NoSchedule")
        );
        assert!(restored.went_to_pool_at.is_some());
        assert!(restored.summary().contains("uncordoned"));
    }

    #[test]
    fn a_cordon_the_drain_found_in_place_is_kept() {
        // Somebody cordoned the node before the scale-in: the drain only labelled it.
        let only_label = OutOfService {
            labelled: true,
            ..OutOfService::default()
        };
        let node = drained_node(Some(checkpoint(INSTANCE, Some(only_label))));
        let (patch, restored) = restore_patch(&node).unwrap();
        assert!(patch.get("spec").is_none(), "{patch}");
        assert!(!restored.undone.uncordoned && restored.undone.unlabelled);
        assert_eq!(restored.undone.untainted, None);
    }

    #[test]
    fn a_checkpoint_without_the_record_only_loses_the_annotation() {
        let node = drained_node(Some(checkpoint(INSTANCE, None)));
        let (patch, restored) = restore_patch(&node).unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "42", "annotations": {CHECKPOINT_ANNOTATION: null}}})
        );
        assert!(restored.unknown_changes && !restored.undone.uncordoned);
    }

    #[test]
    fn a_node_without_our_checkpoint_for_this_instance_is_left_alone() {
        assert_eq!(restore_patch(&drained_node(None)), None);
        let other = drained_node(Some(checkpoint("i-0fedcba9876543210", Some(everything()))));
        assert_eq!(restore_patch(&other), None);
        let unreadable = drained_node(Some("{not json".into()));
        assert_eq!(restore_patch(&unreadable), None);
    }

    /// The launch ends a lifecycle drain's record by the reconciler's own gate: not one a
    /// drain holds right now (left to it, then to the reconciler), and not a notice drain's
    /// (whether its reason stands is AWS's answer, the reconciler's to ask).
    #[test]
    fn a_held_or_notice_record_is_not_the_launchs_to_end() {
        let held = record(&lifecycle_action(INSTANCE), Timestamp::now());
        assert_eq!(restore_patch(&drained_node(Some(held.to_json()))), None);
        let released = held.released(Timestamp::now());
        assert!(restore_patch(&drained_node(Some(released.to_json()))).is_some());

        let notice = crate::node_marks::checkpoint::notice_action("g", INSTANCE);
        let notice_record = record(&notice, Timestamp::UNIX_EPOCH);
        assert_eq!(
            restore_patch(&drained_node(Some(notice_record.to_json()))),
            None
        );
    }

    /// The common label the reconciler lists marked nodes by goes with our last mark, in the
    /// same write; another mark of ours (a maintenance plan) keeps it.
    #[test]
    fn the_common_label_goes_with_the_last_mark() {
        let mut node = drained_node(Some(checkpoint(INSTANCE, Some(everything()))));
        let labels = node.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(MARKED_LABEL.into(), "true".into());
        let (patch, _) = restore_patch(&node).unwrap();
        assert_eq!(
            patch["metadata"]["labels"][MARKED_LABEL],
            Value::Null,
            "{patch}"
        );
        assert!(
            patch["metadata"]["labels"].get(MARKED_LABEL).is_some(),
            "{patch}"
        );
        let plan = crate::node_marks::maintenance::MaintenanceRecord {
            type_code: "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED".into(),
            instance_id: INSTANCE.into(),
            auto_scaling_group_name: "g".into(),
            starts_at: Timestamp::UNIX_EPOCH,
            drain_from: Timestamp::UNIX_EPOCH,
            event: None,
        };
        node.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                crate::node_marks::maintenance::MAINTENANCE_ANNOTATION.into(),
                serde_json::to_string(&plan).unwrap(),
            );
        let (patch, _) = restore_patch(&node).unwrap();
        assert!(
            patch["metadata"]["labels"].get(MARKED_LABEL).is_none(),
            "{patch}"
        );
    }

    #[test]
    fn steps_already_undone_by_someone_are_not_written_again() {
        let mut node = drained_node(Some(checkpoint(INSTANCE, Some(everything()))));
        node.spec.as_mut().unwrap().unschedulable = Some(false);
        node.spec.as_mut().unwrap().taints = None;
        node.metadata.labels = None;
        let (patch, restored) = restore_patch(&node).unwrap();
        assert!(patch.get("spec").is_none() && patch["metadata"].get("labels").is_none());
        assert!(
            !restored.undone.uncordoned
                && !restored.undone.unlabelled
                && restored.undone.untainted.is_none()
        );
    }

    #[tokio::test]
    async fn waits_while_pending_and_stops_at_the_bound() {
        let instances = InMemoryInstances::default();
        instances.add(INSTANCE, "n1");
        let soon = tokio::time::Instant::now() + Duration::from_secs(60);
        assert_eq!(
            wait_until_running(&instances, INSTANCE, soon)
                .await
                .unwrap(),
            RunningWait::Settled("running".into())
        );
        instances.set_state(INSTANCE, "pending");
        let now = tokio::time::Instant::now();
        assert_eq!(
            wait_until_running(&instances, INSTANCE, now + Duration::from_millis(10))
                .await
                .unwrap(),
            RunningWait::StillPending
        );
        assert_eq!(
            wait_until_running(&instances, "i-0000000000000000f", soon)
                .await
                .unwrap(),
            RunningWait::Unknown
        );
    }
}
