//! Scheduled maintenance: which of EC2's scheduled events a mark answers, what that event
//! does to the instance, and the plan kept on a node until its drain is due.
//!
//! AWS Health announces an EC2 scheduled change about two weeks ahead; EC2's own schedule of
//! the instance (`DescribeInstanceStatus`) lists the event with its id, code and start. Every
//! record made for a scheduled change names that one event ([`ScheduledEventRef`]): it stands
//! while EC2 lists that event as pending, and no other event keeps or ends it. The drain is
//! due only `MAINTENANCE_DRAIN_MARGIN_SECONDS` before the start; until then the plan
//! ([`MaintenanceRecord`]) waits on the node (a label to find it, an annotation with the
//! event and the times), and the node stays in service.
//!
//! The AWS Health type codes for EC2 scheduled changes, and what each does, have one home:
//! [`SCHEDULED_CHANGES`] (documented in docs/instance-notices.md).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{MARKED_LABEL, PatchStep, Patched, Reread, patch_recomputing};
use crate::aws::ScheduledInstanceEvent;

/// Label on a node with planned maintenance (value `planned`): the sweep lists by it.
pub const MAINTENANCE_LABEL: &str = "open-node-manager.io/maintenance";
/// Annotation with the [`MaintenanceRecord`] as JSON.
pub const MAINTENANCE_ANNOTATION: &str = "open-node-manager.io/maintenance";

/// What a scheduled event does to the instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventEffect {
    /// Stopped (EBS-backed) or terminated (instance store): its pods go with it.
    Ends,
    /// Rebooted (the instance, its host, or power maintenance): back after a short outage.
    Reboots,
    /// Network maintenance: the instance runs on through a brief loss of connectivity.
    RunsOn,
}

impl EventEffect {
    /// Whether pods must leave whatever they ask (`karpenter.sh/do-not-disrupt` included):
    /// the instance stops or restarts under them.
    pub fn involuntary(self) -> bool {
        self != Self::RunsOn
    }

    /// Whether the instance, and its node, is still there after the event.
    pub fn comes_back(self) -> bool {
        self != Self::Ends
    }
}

/// One AWS Health type code for an EC2 scheduled change: the EC2 event codes that carry it in
/// the instance's schedule, and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledChange {
    pub health_type_code: &'static str,
    pub ec2_codes: &'static [&'static str],
    pub effect: EventEffect,
}

const RETIREMENT: &[&str] = &["instance-retirement", "instance-stop"];

/// Every AWS Health type code for a scheduled change of EC2 instances that AWS documents.
/// A type code not listed here is still matched to EC2's schedule (by the event's start
/// alone, see [`announced_event`]): the EC2 event it finds decides what happens.
pub const SCHEDULED_CHANGES: &[ScheduledChange] = &[
    change(
        "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        RETIREMENT,
        EventEffect::Ends,
    ),
    change(
        "AWS_EC2_INSTANCE_RETIREMENT_EXPEDITED",
        RETIREMENT,
        EventEffect::Ends,
    ),
    change(
        "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED",
        RETIREMENT,
        EventEffect::Ends,
    ),
    change(
        "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_EXPEDITED",
        RETIREMENT,
        EventEffect::Ends,
    ),
    change(
        "AWS_EC2_INSTANCE_TERMINATION_SCHEDULED",
        RETIREMENT,
        EventEffect::Ends,
    ),
    change(
        "AWS_EC2_INSTANCE_STOP_SCHEDULED",
        &["instance-stop"],
        EventEffect::Ends,
    ),
    change(
        "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
        &["instance-reboot"],
        EventEffect::Reboots,
    ),
    change(
        "AWS_EC2_INSTANCE_REBOOT_FLEXIBLE_MAINTENANCE_SCHEDULED",
        &["instance-reboot"],
        EventEffect::Reboots,
    ),
    change(
        "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
        &["system-reboot"],
        EventEffect::Reboots,
    ),
    change(
        "AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED",
        &["system-maintenance"],
        EventEffect::Reboots,
    ),
    change(
        "AWS_EC2_PERSISTENT_INSTANCE_POWER_MAINTENANCE_SCHEDULED",
        &["system-maintenance"],
        EventEffect::Reboots,
    ),
    change(
        "AWS_EC2_SYSTEM_MAINTENANCE_SCHEDULED",
        &["system-maintenance"],
        EventEffect::Reboots,
    ),
    change(
        "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED",
        &["system-maintenance"],
        EventEffect::RunsOn,
    ),
];

const fn change(
    health_type_code: &'static str,
    ec2_codes: &'static [&'static str],
    effect: EventEffect,
) -> ScheduledChange {
    ScheduledChange {
        health_type_code,
        ec2_codes,
        effect,
    }
}

/// The table's row for an AWS Health type code.
pub fn scheduled_change(health_type_code: &str) -> Option<&'static ScheduledChange> {
    SCHEDULED_CHANGES
        .iter()
        .find(|c| c.health_type_code == health_type_code)
}

/// The AWS Health type code that announces EC2's scheduled event `ec2_code`, for a
/// scheduled event found in EC2's own schedule whose Health event was lost (the first row of
/// the table that carries it: the one that says least about network-only maintenance).
pub fn health_type_code(ec2_code: &str) -> Option<&'static str> {
    SCHEDULED_CHANGES
        .iter()
        .find(|c| c.ec2_codes.contains(&ec2_code))
        .map(|c| c.health_type_code)
}

/// What EC2's event `ec2_code` does, refined by the Health type code that announced it
/// (EC2's `system-maintenance` is power or network maintenance; only Health tells which).
pub fn effect_of(ec2_code: &str, health_type_code: Option<&str>) -> EventEffect {
    let announced = health_type_code
        .and_then(scheduled_change)
        .filter(|c| c.ec2_codes.contains(&ec2_code));
    if let Some(change) = announced {
        return change.effect;
    }
    match ec2_code {
        "instance-reboot" | "system-reboot" | "system-maintenance" => EventEffect::Reboots,
        _ => EventEffect::Ends,
    }
}

/// Which of EC2's scheduled events a record answers: its id (`InstanceEventId`), its code,
/// and the AWS Health type code that announced it, if one did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledEventRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_type_code: Option<String>,
}

impl ScheduledEventRef {
    pub fn of(event: &ScheduledInstanceEvent, health_type_code: Option<&str>) -> Self {
        Self {
            id: event.id.clone(),
            code: event.code.clone(),
            health_type_code: health_type_code.map(str::to_owned),
        }
    }

    pub fn effect(&self) -> EventEffect {
        effect_of(&self.code, self.health_type_code.as_deref())
    }

    /// This event in EC2's schedule, while EC2 lists it as pending: by its id; by its code,
    /// nearest `near`, only where EC2 gave no ids.
    pub fn find_pending<'a>(
        &self,
        events: &'a [ScheduledInstanceEvent],
        near: Option<Timestamp>,
    ) -> Option<&'a ScheduledInstanceEvent> {
        let ids_listed = events.iter().any(|e| e.id.is_some());
        match &self.id {
            Some(id) if ids_listed => events
                .iter()
                .find(|e| e.id.as_deref() == Some(id.as_str()))
                .filter(|e| e.is_pending()),
            _ => nearest(events.iter().filter(|e| e.code == self.code), near),
        }
    }
}

/// Of EC2's scheduled events for the instance, the one an AWS Health event with
/// `health_type_code` starting at `starts_at` announces: pending, of a code that type code
/// carries (any code for a type code [`SCHEDULED_CHANGES`] does not list), the nearest to
/// the Health event's start (the earliest without one). An event of a code the type code
/// does not carry is never taken for it: a reboot must not be drained like a retirement.
pub fn announced_event<'a>(
    scheduled: &'a [ScheduledInstanceEvent],
    health_type_code: &str,
    starts_at: Option<Timestamp>,
) -> Option<&'a ScheduledInstanceEvent> {
    let codes = scheduled_change(health_type_code).map(|c| c.ec2_codes);
    let carried = |e: &&ScheduledInstanceEvent| codes.is_none_or(|c| c.contains(&e.code.as_str()));
    nearest(scheduled.iter().filter(carried), starts_at)
}

/// The pending event nearest `near` (the earliest when `near` is unknown).
fn nearest<'a>(
    events: impl Iterator<Item = &'a ScheduledInstanceEvent>,
    near: Option<Timestamp>,
) -> Option<&'a ScheduledInstanceEvent> {
    let distance = |event: &ScheduledInstanceEvent| match (event.not_before, near) {
        (Some(at), Some(start)) => at.duration_since(start).abs(),
        _ => jiff::SignedDuration::ZERO,
    };
    events
        .filter(|e| e.is_pending())
        .min_by_key(|e| (distance(e), e.not_before))
}

/// A scheduled change of an instance, as confirmed by EC2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMaintenance {
    pub type_code: String,
    pub event: ScheduledEventRef,
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
    /// The EC2 event the plan is for; `None` in a plan written before it was kept (then the
    /// pending event of the type code's EC2 codes nearest the start is taken for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<ScheduledEventRef>,
}

/// When the drain for a maintenance starting at `starts_at` is due:
/// `MAINTENANCE_DRAIN_MARGIN_SECONDS` (`margin`) before it. The one formula for the plan the
/// Health event writes and for the plan the reconciler moves when EC2 reschedules.
pub fn drain_from(starts_at: Timestamp, margin: std::time::Duration) -> Timestamp {
    starts_at.checked_sub(margin).unwrap_or(starts_at)
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

    /// The plan's own event in EC2's schedule while EC2 lists it as pending.
    pub fn pending_event<'a>(
        &self,
        scheduled: &'a [ScheduledInstanceEvent],
    ) -> Option<&'a ScheduledInstanceEvent> {
        match &self.event {
            Some(event) => event.find_pending(scheduled, Some(self.starts_at)),
            None => announced_event(scheduled, &self.type_code, Some(self.starts_at)),
        }
    }

    /// The event the plan answers, as a drain for it records it.
    pub fn event_ref(&self, scheduled: &ScheduledInstanceEvent) -> ScheduledEventRef {
        self.event
            .clone()
            .unwrap_or_else(|| ScheduledEventRef::of(scheduled, Some(&self.type_code)))
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
        event: Some(planned.event.clone()),
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
#[path = "maintenance_tests.rs"]
mod tests;
