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
//!   node is Ready, [`restore_returning_node`] undoes exactly what the checkpoint records the
//!   drain changed, in one conditional write, before the action is completed.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde::Serialize;
use serde_json::Value;

use crate::aws::{AwsError, Instances};
use crate::node_marks::checkpoint::{DrainCheckpoint, checkpoint_of, undo_record_patch};
use crate::node_marks::out_of_service::Undone;
use crate::node_marks::{PatchStep, Patched, Reread, patch_recomputing};
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
}

/// The merge patch that undoes our drain on `node` and what it undoes; `None` when the node
/// carries no checkpoint of ours for `instance_id` (nothing of ours to undo).
///
/// Only what the checkpoint records the drain changed is undone, and only where it is still
/// in place: a cordon or taint somebody else put there (before or after the drain) stays. The
/// patch carries the node's `resourceVersion`, so it applies to exactly the node it was
/// computed from.
pub(crate) fn restore_patch(node: &Node, instance_id: &str) -> Option<(Value, Restored)> {
    let checkpoint: DrainCheckpoint = checkpoint_of(node)?;
    if checkpoint.action.instance_id != instance_id {
        return None;
    }
    let (patch, undone) = undo_record_patch(node, &checkpoint);
    let restored = Restored {
        went_to_pool_at: checkpoint.to_warm_pool_at.map(|t| t.to_string()),
        unknown_changes: undone.is_none(),
        undone: undone.unwrap_or_default(),
    };
    Some((patch, restored))
}

/// The outcome of [`restore_returning_node`].
#[derive(Debug, Clone, PartialEq)]
pub enum Restore {
    /// Our drain was undone; the node as written.
    Restored { node: Box<Node>, restored: Restored },
    /// The node carries no drain checkpoint of ours for this instance: left as it is.
    NothingOfOurs,
    /// The node was deleted meanwhile.
    NodeGone,
}

/// Undoes our drain on the node of `instance_id`, which came back from the warm pool, in one
/// conditional write; on a conflict (the kubelet updates the node often) reads it again and
/// recomputes. Safe to repeat: once the checkpoint is gone there is nothing of ours left.
pub(crate) async fn restore_returning_node(
    nodes: &Api<Node>,
    node: Node,
    instance_id: &str,
) -> Result<Restore, kube::Error> {
    let patched = patch_recomputing(
        nodes,
        node,
        Reread::Get,
        "its drain was being undone",
        |node| match restore_patch(node, instance_id) {
            Some((patch, restored)) => PatchStep::Write(patch, restored),
            None => PatchStep::Stop(()),
        },
    )
    .await?;
    Ok(match patched {
        Patched::Written(node, restored) => Restore::Restored { node, restored },
        Patched::Stopped(()) => Restore::NothingOfOurs,
        Patched::NodeGone => Restore::NodeGone,
    })
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
    use crate::node_marks::checkpoint::{AddedTaint, OutOfService};
    use serde_json::json;

    const INSTANCE: &str = "i-0123456789abcdef0";

    fn checkpoint(instance_id: &str, out_of_service: Option<OutOfService>) -> String {
        let action = LifecycleActionRef {
            auto_scaling_group_name: "g".into(),
            lifecycle_hook_name: "h".into(),
            instance_id: instance_id.into(),
            token: "t".into(),
        };
        let mut checkpoint = DrainCheckpoint::start(
            &action,
            Timestamp::UNIX_EPOCH,
            Duration::from_secs(900),
            "req",
            Duration::from_secs(60),
        );
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
        let (patch, restored) = restore_patch(&node, INSTANCE).unwrap();
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
        let (patch, restored) = restore_patch(&node, INSTANCE).unwrap();
        assert!(patch.get("spec").is_none(), "{patch}");
        assert!(!restored.undone.uncordoned && restored.undone.unlabelled);
        assert_eq!(restored.undone.untainted, None);
    }

    #[test]
    fn a_checkpoint_without_the_record_only_loses_the_annotation() {
        let node = drained_node(Some(checkpoint(INSTANCE, None)));
        let (patch, restored) = restore_patch(&node, INSTANCE).unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "42", "annotations": {CHECKPOINT_ANNOTATION: null}}})
        );
        assert!(restored.unknown_changes && !restored.undone.uncordoned);
    }

    #[test]
    fn a_node_without_our_checkpoint_for_this_instance_is_left_alone() {
        assert_eq!(restore_patch(&drained_node(None), INSTANCE), None);
        let other = drained_node(Some(checkpoint("i-0fedcba9876543210", Some(everything()))));
        assert_eq!(restore_patch(&other, INSTANCE), None);
        let unreadable = drained_node(Some("{not json".into()));
        assert_eq!(restore_patch(&unreadable, INSTANCE), None);
    }

    /// The common label the reconciler lists marked nodes by goes with our last mark, in the
    /// same write; another mark of ours (a maintenance plan) keeps it.
    #[test]
    fn the_common_label_goes_with_the_last_mark() {
        let mut node = drained_node(Some(checkpoint(INSTANCE, Some(everything()))));
        let labels = node.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(MARKED_LABEL.into(), "true".into());
        let (patch, _) = restore_patch(&node, INSTANCE).unwrap();
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
        let (patch, _) = restore_patch(&node, INSTANCE).unwrap();
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
        let (patch, restored) = restore_patch(&node, INSTANCE).unwrap();
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
