//! What one node's marks should become, given what AWS says now: pure, no I/O.
//!
//! Each mark names its reason (the drain's record its notice and instance, the refresh's
//! record its refresh, the maintenance plan its instance and start); [`desired`] checks each
//! reason against AWS's current answers and says what to change. A reason AWS cannot be
//! asked about right now leaves its mark as it is ([`Action::Unchecked`]): nothing is
//! removed on a missing answer.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use super::marks::NodeMarks;
use crate::aws::{InstanceFacts, ScheduledInstanceEvent};
use crate::instance_notice::event::SPOT_NOTICE;
use crate::instance_notice::maintenance::{MaintenanceRecord, announced_event};
use crate::node_marks::checkpoint::{DrainCheckpoint, InstanceNotice, NoticeKind};
use crate::node_marks::refresh::RefreshMarks;

/// One answer of AWS, or why there is none this time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact<T> {
    Known(T),
    /// The call failed or timed out: why.
    Unknown(String),
}

impl<T> Fact<T> {
    fn known(&self) -> Result<&T, String> {
        match self {
            Self::Known(value) => Ok(value),
            Self::Unknown(why) => Err(why.clone()),
        }
    }
}

/// What AWS says now about one marked node's instance (and its refresh, if it carries a
/// refresh's record). A fact the node's marks do not need is `Known` and empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsFacts {
    /// EC2's `DescribeInstances`; `None`: EC2 does not know the instance (gone).
    pub instance: Fact<Option<InstanceFacts>>,
    /// Auto Scaling's lifecycle state; `None`: in no group.
    pub lifecycle_state: Fact<Option<String>>,
    /// The instance's Spot request status; `None`: not a Spot instance, or not asked.
    pub spot_status: Fact<Option<String>>,
    /// The instance's scheduled events (`DescribeInstanceStatus`).
    pub scheduled: Fact<Vec<ScheduledInstanceEvent>>,
    /// The status of the refresh the node's refresh record names; `None`: Auto Scaling
    /// does not know it.
    pub refresh_status: Fact<Option<String>>,
}

impl Default for AwsFacts {
    fn default() -> Self {
        Self {
            instance: Fact::Known(None),
            lifecycle_state: Fact::Known(None),
            spot_status: Fact::Known(None),
            scheduled: Fact::Known(Vec::new()),
            refresh_status: Fact::Known(None),
        }
    }
}

/// The settings the decision uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// `MAINTENANCE_DRAIN_MARGIN_SECONDS`: how long before a maintenance the drain is due.
    pub maintenance_margin: Duration,
}

/// One change to converge a node to.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Action {
    /// Undo an instance refresh's marks and remove its record (only what the record says,
    /// only where still in place).
    RemoveRefreshMarks { refresh_id: String, why: String },
    /// Undo what a notice's drain record says it did and remove the record: a rebalance
    /// cordon no termination followed, or a notice drain whose reason AWS no longer
    /// reports.
    #[serde(rename_all = "camelCase")]
    UndoNoticeMarks {
        #[serde(skip)]
        record: Box<DrainCheckpoint>,
        why: String,
    },
    /// Remove a maintenance plan.
    DropMaintenancePlan {
        #[serde(skip)]
        record: MaintenanceRecord,
        why: String,
    },
    /// EC2 moved the maintenance: the plan is rewritten to its new start.
    #[serde(rename_all = "camelCase")]
    ReplanMaintenance {
        #[serde(skip)]
        record: MaintenanceRecord,
        starts_at: Timestamp,
        drain_from: Timestamp,
    },
    /// The planned maintenance is due: drain now, until its start.
    #[serde(rename_all = "camelCase")]
    DrainForMaintenance {
        #[serde(skip)]
        record: MaintenanceRecord,
        starts_at: Timestamp,
    },
    /// EC2 marked the Spot request of a marked node's instance for interruption (its
    /// warning may have been lost): drain now, for Spot's two minutes.
    #[serde(rename_all = "camelCase")]
    DrainForSpotInterruption {
        #[serde(skip)]
        notice: InstanceNotice,
        group: String,
        instance_id: String,
        deadline: Timestamp,
    },
    /// A notice drain whose reason stands and that nobody runs: drain in place.
    #[serde(rename_all = "camelCase")]
    ResumeNoticeDrain {
        #[serde(skip)]
        notice: InstanceNotice,
        group: String,
        instance_id: String,
        deadline: Timestamp,
    },
    /// The node carries a mark of ours but not the common label: add it.
    AddMarkedLabel,
    /// The node carries the common label and no mark of ours: remove it.
    RemoveMarkedLabel,
    /// This mark's reason could not be checked this time: left as it is.
    Unchecked { mark: &'static str, why: String },
}

impl Action {
    /// The name in the report (the outcome once applied).
    pub fn name(&self) -> &'static str {
        match self {
            Self::RemoveRefreshMarks { .. } => "RefreshMarksRemoved",
            Self::UndoNoticeMarks { record, .. }
                if record.notice.as_ref().is_some_and(|n| n.cordon_only) =>
            {
                "RebalanceCordonUndone"
            }
            Self::UndoNoticeMarks { record, .. }
                if record.completed_at.is_some()
                    && record
                        .notice
                        .as_ref()
                        .is_some_and(|n| n.kind == NoticeKind::ScheduledMaintenance) =>
            {
                "RestoredAfterMaintenance"
            }
            Self::UndoNoticeMarks { .. } => "NoticeDrainUndone",
            Self::DropMaintenancePlan { .. } => "MaintenancePlanDropped",
            Self::ReplanMaintenance { .. } => "MaintenancePlanMoved",
            Self::DrainForMaintenance { .. } => "MaintenanceDrainDue",
            Self::ResumeNoticeDrain { .. } => "NoticeDrainResumed",
            Self::DrainForSpotInterruption { .. } => "SpotDrainDue",
            Self::AddMarkedLabel => "MarkedLabelAdded",
            Self::RemoveMarkedLabel => "MarkedLabelRemoved",
            Self::Unchecked { .. } => "Unchecked",
        }
    }
}

/// Auto Scaling's refresh statuses while it still replaces (or rolls back) instances.
pub fn refresh_in_progress(status: &str) -> bool {
    matches!(
        status,
        "Pending" | "InProgress" | "Cancelling" | "RollbackInProgress" | "Baking"
    )
}

/// What `marks` should become given `facts` at `now`, in the order to apply.
pub fn desired(
    marks: &NodeMarks,
    facts: &AwsFacts,
    policy: &Policy,
    now: Timestamp,
) -> Vec<Action> {
    let mut actions = Vec::new();
    if let Some(refresh) = &marks.refresh {
        actions.extend(for_refresh(refresh, facts));
    }
    if let Some(checkpoint) = &marks.checkpoint {
        actions.extend(for_checkpoint(checkpoint, marks, facts, now));
    }
    if let Some(plan) = &marks.maintenance {
        let planned = for_maintenance(plan, marks, facts, policy, now);
        // A due plan drains on the notice drain's checkpoint: resuming it as well would be
        // the same drain twice.
        if planned
            .iter()
            .any(|a| matches!(a, Action::DrainForMaintenance { .. }))
        {
            actions.retain(|a| !matches!(a, Action::ResumeNoticeDrain { .. }));
        }
        actions.extend(planned);
    }
    if let Some(spot) = spot_interruption(marks, facts, now) {
        // The interruption's drain takes the rebalance cordon over and comes before any
        // other drain of the node.
        actions.retain(|a| {
            !matches!(
                a,
                Action::UndoNoticeMarks { .. }
                    | Action::DrainForMaintenance { .. }
                    | Action::ResumeNoticeDrain { .. }
            )
        });
        actions.push(spot);
    }
    match (marks.any(), marks.labelled) {
        (true, false) => actions.push(Action::AddMarkedLabel),
        (false, true) => actions.push(Action::RemoveMarkedLabel),
        _ => {}
    }
    actions
}

/// A refresh's record stays while Auto Scaling reports the refresh running.
fn for_refresh(refresh: &RefreshMarks, facts: &AwsFacts) -> Option<Action> {
    let id = &refresh.instance_refresh_id;
    let why = match facts.refresh_status.known() {
        Err(why) => {
            return Some(Action::Unchecked {
                mark: "instance-refresh",
                why,
            });
        }
        Ok(Some(status)) if refresh_in_progress(status) => return None,
        Ok(Some(status)) => format!("instance refresh {id} is {status}"),
        Ok(None) => format!("Auto Scaling no longer knows instance refresh {id}"),
    };
    Some(Action::RemoveRefreshMarks {
        refresh_id: id.clone(),
        why,
    })
}

/// Only notice records are the reconciler's to change here: a lifecycle drain's record is
/// its lifecycle action's, and a completed notice drain's stays for what comes next.
fn for_checkpoint(
    checkpoint: &DrainCheckpoint,
    marks: &NodeMarks,
    facts: &AwsFacts,
    now: Timestamp,
) -> Option<Action> {
    let notice = checkpoint.notice.as_ref()?;
    let same_instance = marks.instance_id.as_deref() == Some(&checkpoint.action.instance_id);
    if !checkpoint.action.is_notice() || !same_instance || checkpoint.lease.held_by_other("", now) {
        return None;
    }
    if checkpoint.completed_at.is_some() {
        return came_back(checkpoint, notice, marks, facts);
    }
    if notice.cordon_only {
        rebalance_cordon(checkpoint, marks, facts, now)
    } else {
        abandoned_notice_drain(checkpoint, notice, facts, now)
    }
}

/// A completed notice drain: once the instance runs again and AWS no longer reports the
/// notice's reason (the maintenance is over or cancelled, the stopped instance was started,
/// the Spot request is no longer marked), our marks go as soon as the node is Ready again
/// (kept cordoned until then). A rebalance drain's reason cannot be asked again: kept.
fn came_back(
    checkpoint: &DrainCheckpoint,
    notice: &InstanceNotice,
    marks: &NodeMarks,
    facts: &AwsFacts,
) -> Option<Action> {
    let unchecked = |why| {
        Some(Action::Unchecked {
            mark: "notice-drain",
            why,
        })
    };
    let instance = match facts.instance.known() {
        Err(why) => return unchecked(why),
        Ok(Some(instance)) if instance.state.as_deref() == Some("running") => instance,
        Ok(_) => return None,
    };
    let why = match reason_stands(notice.kind, instance, facts) {
        Err(why) => return unchecked(why),
        Ok(Ok(())) => return None,
        Ok(Err(why)) => why,
    };
    marks.ready.then(|| Action::UndoNoticeMarks {
        record: Box::new(checkpoint.clone()),
        why: format!("{why}, and the node is Ready again"),
    })
}

/// Whether a node's marks leave room for a Spot interruption's drain: none of ours, or a
/// rebalance cordon (EC2 recommends a rebalance before it interrupts); not a drain that
/// runs or ran.
pub(super) fn may_need_spot_drain(marks: &NodeMarks) -> bool {
    match &marks.checkpoint {
        None => true,
        Some(checkpoint) => {
            checkpoint.action.is_notice()
                && checkpoint.completed_at.is_none()
                && checkpoint.notice.as_ref().is_some_and(|n| n.cordon_only)
        }
    }
}

/// A marked node's Spot instance whose request EC2 marks for interruption (`marked-for-*`)
/// while it still runs: its drain is due now, whether or not the warning arrived.
fn spot_interruption(marks: &NodeMarks, facts: &AwsFacts, now: Timestamp) -> Option<Action> {
    if !may_need_spot_drain(marks)
        || marks.checkpoint.as_ref().is_some_and(|c| {
            c.lease.held_by_other("", now)
                || marks.instance_id.as_deref() != Some(&c.action.instance_id)
        })
    {
        return None;
    }
    let Fact::Known(Some(instance)) = &facts.instance else {
        return None;
    };
    instance.spot_request_id.as_ref()?;
    if instance.state.as_deref() != Some("running") {
        return None;
    }
    let status = match facts.spot_status.known() {
        Err(why) => {
            return Some(Action::Unchecked {
                mark: "spot-request",
                why,
            });
        }
        Ok(status) => status.as_deref()?,
    };
    if !status.starts_with("marked-for-") {
        return None;
    }
    let group = instance.auto_scaling_group.clone().or_else(|| {
        marks
            .checkpoint
            .as_ref()
            .map(|c| c.action.auto_scaling_group_name.clone())
            .or_else(|| {
                marks
                    .refresh
                    .as_ref()
                    .map(|r| r.auto_scaling_group_name.clone())
            })
            .or_else(|| {
                marks
                    .maintenance
                    .as_ref()
                    .map(|m| m.auto_scaling_group_name.clone())
            })
    })?;
    let ends_at = now.checked_add(SPOT_NOTICE).unwrap_or(now);
    Some(Action::DrainForSpotInterruption {
        notice: InstanceNotice {
            kind: NoticeKind::SpotInterruption,
            received_at: now,
            instance_ends_at: Some(ends_at),
            cordon_only: false,
        },
        group,
        instance_id: marks.instance()?.to_owned(),
        deadline: ends_at,
    })
}

/// A rebalance cordon past its time is undone unless the instance is leaving, or an
/// instance refresh still running has marked the node too (the refresh's end, or its
/// drain, decides then).
fn rebalance_cordon(
    checkpoint: &DrainCheckpoint,
    marks: &NodeMarks,
    facts: &AwsFacts,
    now: Timestamp,
) -> Option<Action> {
    if now < checkpoint.deadline {
        return None;
    }
    let unchecked = |why| {
        Some(Action::Unchecked {
            mark: "rebalance-cordon",
            why,
        })
    };
    // A refresh that only marked the node outdated did not cordon it: the rebalance cordon
    // is the only reason it is cordoned.
    if marks.refresh.as_ref().is_some_and(|r| !r.outdated_only) {
        match facts.refresh_status.known() {
            Err(why) => return unchecked(why),
            Ok(Some(status)) if refresh_in_progress(status) => return None,
            Ok(_) => {}
        }
    }
    match leaving(facts) {
        Err(why) => unchecked(why),
        Ok(true) => None,
        Ok(false) => Some(Action::UndoNoticeMarks {
            record: Box::new(checkpoint.clone()),
            why: "no termination followed the rebalance recommendation".to_owned(),
        }),
    }
}

/// Whether the instance is on its way out: EC2 does not know it, it is not running, or its
/// group is terminating it.
fn leaving(facts: &AwsFacts) -> Result<bool, String> {
    let state = facts
        .instance
        .known()?
        .as_ref()
        .and_then(|f| f.state.clone());
    let running = matches!(state.as_deref(), Some("running" | "pending"));
    let terminating = facts
        .lifecycle_state
        .known()?
        .as_deref()
        .is_some_and(|s| s.starts_with("Terminating"));
    Ok(!running || terminating)
}

/// A notice drain nobody runs (its invocation ran out of time, or failed): resumed while
/// its reason stands and its deadline has not passed; undone when AWS no longer reports
/// the reason.
fn abandoned_notice_drain(
    checkpoint: &DrainCheckpoint,
    notice: &InstanceNotice,
    facts: &AwsFacts,
    now: Timestamp,
) -> Option<Action> {
    let unchecked = |why| {
        Some(Action::Unchecked {
            mark: "notice-drain",
            why,
        })
    };
    let instance = match facts.instance.known() {
        Err(why) => return unchecked(why),
        // Gone, or going: its node goes with it.
        Ok(None) => return None,
        Ok(Some(instance)) => instance,
    };
    if matches!(
        instance.state.as_deref(),
        Some("shutting-down" | "terminated")
    ) {
        return None;
    }
    let stands = match reason_stands(notice.kind, instance, facts) {
        Err(why) => return unchecked(why),
        Ok(stands) => stands,
    };
    match stands {
        Ok(()) if now < checkpoint.deadline => Some(Action::ResumeNoticeDrain {
            notice: notice.clone(),
            group: checkpoint.action.auto_scaling_group_name.clone(),
            instance_id: checkpoint.action.instance_id.clone(),
            deadline: checkpoint.deadline,
        }),
        Ok(()) => None,
        Err(why) => Some(Action::UndoNoticeMarks {
            record: Box::new(checkpoint.clone()),
            why,
        }),
    }
}

/// `Ok(Ok(()))`: AWS still reports what the notice announced; `Ok(Err(why))`: it no longer
/// does; `Err`: it could not be asked.
fn reason_stands(
    kind: NoticeKind,
    instance: &InstanceFacts,
    facts: &AwsFacts,
) -> Result<Result<(), String>, String> {
    let state = instance.state.as_deref().unwrap_or("unknown");
    Ok(match kind {
        NoticeKind::SpotInterruption => match facts.spot_status.known()? {
            Some(status) if status.starts_with("marked-for-") => Ok(()),
            _ if state != "running" => Ok(()),
            status => Err(format!(
                "the Spot request is {}, no longer marked for interruption",
                status.as_deref().unwrap_or("unknown")
            )),
        },
        NoticeKind::InstanceStopping => match state {
            "running" | "pending" => Err(format!("the instance is {state} again")),
            _ => Ok(()),
        },
        NoticeKind::ScheduledMaintenance => match first_pending(facts.scheduled.known()?, None) {
            Some(_) => Ok(()),
            None => Err("EC2 lists no pending scheduled event: completed or cancelled".into()),
        },
        // EC2 has no call that reads a recommendation again: the drain decided on stands.
        NoticeKind::RebalanceRecommendation => Ok(()),
    })
}

/// The earliest start of a pending scheduled event (an event without a start counts from
/// `fallback`).
fn first_pending(
    events: &[ScheduledInstanceEvent],
    fallback: Option<Timestamp>,
) -> Option<Timestamp> {
    events
        .iter()
        .filter(|e| e.is_pending())
        .filter_map(|e| e.not_before.or(fallback))
        .min()
}

/// A maintenance plan follows EC2's schedule: dropped when EC2 lists no pending event any
/// more, moved when the event moved, drained when due, dropped once started.
fn for_maintenance(
    plan: &MaintenanceRecord,
    marks: &NodeMarks,
    facts: &AwsFacts,
    policy: &Policy,
    now: Timestamp,
) -> Vec<Action> {
    let drop = |why: String| {
        vec![Action::DropMaintenancePlan {
            record: plan.clone(),
            why,
        }]
    };
    if marks.instance_id.as_deref() != Some(plan.instance_id.as_str()) {
        return drop("the node now belongs to another instance".into());
    }
    let events = match facts.scheduled.known() {
        Err(why) => {
            return vec![Action::Unchecked {
                mark: "maintenance-plan",
                why,
            }];
        }
        Ok(events) => events,
    };
    // The plan's own event (its code, nearest its start): another code's event is not it.
    let Some(starts_at) = announced_event(events, &plan.type_code, Some(plan.starts_at))
        .map(|e| e.not_before.unwrap_or(plan.starts_at))
    else {
        return drop(format!(
            "EC2 lists no pending scheduled event ({}): completed or cancelled",
            plan.type_code
        ));
    };
    let mut actions = Vec::new();
    let mut current = plan.clone();
    if starts_at != plan.starts_at {
        current.starts_at = starts_at;
        current.drain_from = starts_at
            .checked_sub(policy.maintenance_margin)
            .unwrap_or(starts_at);
        actions.push(Action::ReplanMaintenance {
            record: plan.clone(),
            starts_at: current.starts_at,
            drain_from: current.drain_from,
        });
    }
    if now >= current.starts_at {
        return drop(format!(
            "{} started at {}",
            current.type_code, current.starts_at
        ));
    }
    if now >= current.drain_from {
        actions.push(Action::DrainForMaintenance {
            starts_at: current.starts_at,
            record: current,
        });
    }
    actions
}

#[cfg(test)]
#[path = "desired_tests.rs"]
mod tests;
