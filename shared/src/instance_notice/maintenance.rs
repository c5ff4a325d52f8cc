//! Scheduled maintenance planned ahead: AWS Health announces retirements and maintenance
//! about two weeks before; the drain is due only `MAINTENANCE_DRAIN_MARGIN_SECONDS` before the
//! start. Until then the plan is kept on the node (a label to find it, an annotation with the
//! times), where the sweep ([`super::sweep`]) finds it and starts the drain when due. Nothing
//! else changes on the node: it stays in service until then.
//!
//! Which of EC2's scheduled events an AWS Health event announces ([`announced_event`]): the
//! pending one of the Health event's own code, nearest its start, never another code's. And
//! what becomes of a node drained for a maintenance it comes back from (a reboot, network
//! maintenance) once the maintenance is completed ([`after_maintenance`], pure): our marks
//! are undone when the node is Ready again; a cordon somebody else made stays.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::aws::ScheduledInstanceEvent;
use crate::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, DrainCheckpoint, NoticeKind};
use crate::node_marks::out_of_service::add_undo_to_patch;
use crate::node_marks::{MARKED_LABEL, PatchStep, Patched, Reread, patch_recomputing};

/// Label on a node with planned maintenance (value `planned`): the sweep lists by it.
pub const MAINTENANCE_LABEL: &str = "open-node-manager.io/maintenance";
/// Annotation with the [`MaintenanceRecord`] as JSON.
pub const MAINTENANCE_ANNOTATION: &str = "open-node-manager.io/maintenance";

/// A scheduled change of an instance, as confirmed by EC2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMaintenance {
    pub type_code: String,
    pub starts_at: Timestamp,
    pub drain_from: Timestamp,
}

/// What is kept on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceRecord {
    pub type_code: String,
    pub instance_id: String,
    pub auto_scaling_group_name: String,
    pub starts_at: Timestamp,
    pub drain_from: Timestamp,
}

impl MaintenanceRecord {
    pub fn of(node: &Node) -> Option<Self> {
        let raw = node
            .metadata
            .annotations
            .as_ref()?
            .get(MAINTENANCE_ANNOTATION)?;
        serde_json::from_str(raw).ok()
    }
}

/// Records `planned` on `node` (conditional write, recomputed on conflicts); `false` when
/// the same plan was there already.
pub async fn plan_maintenance(
    client: &kube::Client,
    node: Node,
    group: &str,
    instance_id: &str,
    planned: &PlannedMaintenance,
) -> Result<bool, kube::Error> {
    let record = MaintenanceRecord {
        type_code: planned.type_code.clone(),
        instance_id: instance_id.to_owned(),
        auto_scaling_group_name: group.to_owned(),
        starts_at: planned.starts_at,
        drain_from: planned.drain_from,
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let written = patch_recomputing(&nodes, node, Reread::Get, "planning maintenance", |node| {
        // An earlier plan for an earlier start stays: the drain is due by the first one.
        let kept = MaintenanceRecord::of(node)
            .filter(|r| r.instance_id == instance_id && r.drain_from <= record.drain_from);
        if kept.is_some() {
            return PatchStep::Stop(());
        }
        PatchStep::Write(
            json!({"metadata": {
                "resourceVersion": node.metadata.resource_version,
                "labels": {MAINTENANCE_LABEL: "planned", MARKED_LABEL: "true"},
                "annotations": {MAINTENANCE_ANNOTATION: serde_json::to_string(&record).unwrap_or_default()},
            }}),
            (),
        )
    })
    .await?;
    Ok(matches!(written, Patched::Written(..)))
}

/// Removes the plan from the node (it is due, or past), if it is still `record`.
pub async fn clear_maintenance(
    client: &kube::Client,
    node: Node,
    record: &MaintenanceRecord,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    patch_recomputing(
        &nodes,
        node,
        Reread::Get,
        "clearing planned maintenance",
        |node| {
            if MaintenanceRecord::of(node).as_ref() != Some(record) {
                return PatchStep::Stop(());
            }
            PatchStep::Write(
                json!({"metadata": {
                    "resourceVersion": node.metadata.resource_version,
                    "labels": {MAINTENANCE_LABEL: null},
                    "annotations": {MAINTENANCE_ANNOTATION: null},
                }}),
                (),
            )
        },
    )
    .await?;
    Ok(())
}

/// The EC2 scheduled-event code (`DescribeInstanceStatus`'s `code`) an AWS Health
/// scheduled change for EC2 announces, `None` for a type code that names none.
pub fn ec2_event_code(health_type_code: &str) -> Option<&'static str> {
    Some(match health_type_code {
        "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED" => "instance-retirement",
        "AWS_EC2_INSTANCE_STOP_SCHEDULED" => "instance-stop",
        "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED"
        | "AWS_EC2_INSTANCE_REBOOT_FLEXIBLE_MAINTENANCE_SCHEDULED" => "instance-reboot",
        "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED" => "system-reboot",
        "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED"
        | "AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED"
        | "AWS_EC2_SYSTEM_MAINTENANCE_SCHEDULED" => "system-maintenance",
        _ => return None,
    })
}

/// The AWS Health type code that announces EC2's scheduled event `ec2_code` (the inverse of
/// [`ec2_event_code`], one type code per EC2 code): a scheduled event found in EC2's own
/// schedule whose Health event was lost is planned as that Health event would have been.
pub fn health_type_code(ec2_code: &str) -> Option<&'static str> {
    Some(match ec2_code {
        "instance-retirement" => "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        "instance-stop" => "AWS_EC2_INSTANCE_STOP_SCHEDULED",
        "instance-reboot" => "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
        "system-reboot" => "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
        "system-maintenance" => "AWS_EC2_SYSTEM_MAINTENANCE_SCHEDULED",
        _ => return None,
    })
}

/// Whether the instance (and its node) is still there after an event of this EC2 code: a
/// reboot or system maintenance ends; a retirement or stop ends the instance.
pub fn instance_comes_back(ec2_code: &str) -> bool {
    matches!(
        ec2_code,
        "instance-reboot" | "system-reboot" | "system-maintenance"
    )
}

/// Of EC2's scheduled events for the instance, the one an AWS Health event with
/// `health_type_code` starting at `starts_at` announces: pending, of that event's code, the
/// nearest to the Health event's start (the earliest without one). Another code's event is
/// never taken for it: a reboot must not be drained like a retirement, nor at its time.
pub fn announced_event<'a>(
    scheduled: &'a [ScheduledInstanceEvent],
    health_type_code: &str,
    starts_at: Option<Timestamp>,
) -> Option<&'a ScheduledInstanceEvent> {
    let code = ec2_event_code(health_type_code)?;
    let distance = |event: &ScheduledInstanceEvent| match (event.not_before, starts_at) {
        (Some(at), Some(start)) => at.duration_since(start).abs(),
        _ => jiff::SignedDuration::ZERO,
    };
    scheduled
        .iter()
        .filter(|e| e.is_pending() && e.code == code)
        .min_by_key(|e| (distance(e), e.not_before))
}

/// What becomes of a node after a completed scheduled maintenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterMaintenance {
    /// Put it back in service: undo what our drain's record says it did, drop the record.
    Restore,
    /// Not yet: the node is not Ready again.
    WaitForReady,
    /// Leave it as it is; why.
    Leave(&'static str),
}

/// Whether a node comes back into service after the maintenance `ec2_code` (still
/// pending or not, as EC2 lists it) given our drain's record on it and its readiness.
/// Only a drain of ours for scheduled maintenance, that no lifecycle action took over and
/// no invocation is running, is undone; a cordon that was there before it is not ours and
/// stays (the record says what we did).
pub fn after_maintenance(
    ec2_code: &str,
    still_pending: bool,
    checkpoint: Option<&DrainCheckpoint>,
    node_ready: bool,
    now: Timestamp,
) -> AfterMaintenance {
    if !instance_comes_back(ec2_code) {
        return AfterMaintenance::Leave("the instance does not come back from this event");
    }
    if still_pending {
        return AfterMaintenance::Leave("EC2 lists the maintenance as pending");
    }
    let Some(checkpoint) = checkpoint else {
        return AfterMaintenance::Leave("no drain of ours on the node");
    };
    let ours_for_maintenance = checkpoint.action.is_notice()
        && checkpoint
            .notice
            .as_ref()
            .is_some_and(|n| n.kind == NoticeKind::ScheduledMaintenance);
    if !ours_for_maintenance {
        return AfterMaintenance::Leave("the node's drain is not for scheduled maintenance");
    }
    if checkpoint.lease.holder.is_some() && now < checkpoint.lease.expires_at() {
        return AfterMaintenance::Leave("a drain is running on the node");
    }
    if !node_ready {
        return AfterMaintenance::WaitForReady;
    }
    AfterMaintenance::Restore
}

/// Restores `node` after the completed maintenance `ec2_code`: undoes what our drain's
/// record says it did (where still in place) and removes the record, in one write
/// conditional on the node's `resourceVersion`, re-deciding on every read. The items
/// undone (empty when nothing was written).
pub async fn restore_after_maintenance(
    client: &kube::Client,
    node: Node,
    ec2_code: &str,
) -> Result<Vec<String>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let written = patch_recomputing(
        &nodes,
        node,
        Reread::Get,
        "restoring after maintenance",
        |node| {
            let checkpoint = crate::node_marks::checkpoint::checkpoint_of(node);
            let ready = crate::lifecycle::node::is_ready(node);
            let decision = after_maintenance(
                ec2_code,
                false,
                checkpoint.as_ref(),
                ready,
                Timestamp::now(),
            );
            let (AfterMaintenance::Restore, Some(checkpoint)) = (decision, checkpoint) else {
                return PatchStep::Stop(());
            };
            let mut patch = json!({"metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {CHECKPOINT_ANNOTATION: null},
            }});
            let ours = checkpoint.out_of_service.unwrap_or_default();
            let undone = add_undo_to_patch(&ours, node, &mut patch);
            PatchStep::Write(patch, undone.items())
        },
    )
    .await?;
    Ok(match written {
        Patched::Written(_, items) => items,
        Patched::Stopped(()) | Patched::NodeGone => Vec::new(),
    })
}

/// Moves the plan `from` on `node` to `to` (EC2 rescheduled the maintenance), if the node
/// still carries `from`; `false` when it did not (changed or removed meanwhile).
pub async fn replan_maintenance(
    client: &kube::Client,
    node: Node,
    from: &MaintenanceRecord,
    to: &MaintenanceRecord,
) -> Result<bool, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let written = patch_recomputing(&nodes, node, Reread::Get, "moving planned maintenance", |node| {
        if MaintenanceRecord::of(node).as_ref() != Some(from) {
            return PatchStep::Stop(());
        }
        PatchStep::Write(
            json!({"metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {MAINTENANCE_ANNOTATION: serde_json::to_string(to).unwrap_or_default()},
            }}),
            (),
        )
    })
    .await?;
    Ok(matches!(written, Patched::Written(..)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::SCHEDULED_EVENT_CODES;

    #[test]
    fn every_scheduled_event_code_has_the_health_type_code_that_announces_it() {
        for code in SCHEDULED_EVENT_CODES {
            let type_code = health_type_code(code);
            assert_eq!(type_code.and_then(ec2_event_code), Some(code), "{code}");
        }
        assert_eq!(health_type_code("instance-launch"), None);
    }
}
