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

use super::notice_kinds::{Stands, rules};
use crate::aws::{InstanceFacts, ScheduledInstanceEvent, marked_for_interruption};
use crate::instance_notice::event::SPOT_NOTICE;
use crate::node_marks::checkpoint::{DrainCheckpoint, InstanceNotice, NoticeKind};
use crate::node_marks::maintenance::{MaintenanceRecord, ScheduledEventRef, drain_from};
use crate::node_marks::marks::NodeMarks;
use crate::node_marks::refresh::RefreshMarks;
use crate::node_marks::shutdown::ShutdownRecord;

/// One answer of AWS, or why there is none this time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact<T> {
    Known(T),
    /// The call failed or timed out: why.
    Unknown(String),
}

impl<T> Fact<T> {
    pub(super) fn known(&self) -> Result<&T, String> {
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
    /// `REBALANCE_UNDO_SECONDS`: how long a rebalance recommendation keeps its node out of
    /// service (cordoned or drained) when no interruption or termination follows.
    pub rebalance_undo: Duration,
}

/// One change to converge a node to.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Action {
    /// Undo an instance refresh's marks and remove its record (only what the record says,
    /// only where still in place).
    RemoveRefreshMarks { refresh_id: String, why: String },
    /// Undo what a drain record says it did and remove the record: a rebalance cordon or
    /// drain no termination followed, a notice drain whose reason AWS no longer reports, a
    /// lifecycle drain whose instance Auto Scaling put back in service (a return from the
    /// warm pool whose launch was not handled).
    #[serde(rename_all = "camelCase")]
    UndoDrainRecord {
        #[serde(skip)]
        record: Box<DrainCheckpoint>,
        why: String,
    },
    /// Lift the out-of-service taint we put on a node whose kubelet was gone, and its
    /// record: the node is Ready again.
    LiftShutdownTaint {
        #[serde(skip)]
        record: ShutdownRecord,
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
    /// The planned maintenance is due: drain now, until its start, for its EC2 event.
    #[serde(rename_all = "camelCase")]
    DrainForMaintenance {
        #[serde(skip)]
        record: MaintenanceRecord,
        starts_at: Timestamp,
        #[serde(skip)]
        event: ScheduledEventRef,
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
            Self::UndoDrainRecord { record, .. } if !record.action.is_notice() => {
                "LifecycleDrainUndone"
            }
            Self::UndoDrainRecord { record, .. }
                if record.notice.as_ref().is_some_and(|n| n.cordon_only) =>
            {
                "RebalanceCordonUndone"
            }
            Self::UndoDrainRecord { record, .. }
                if record
                    .notice
                    .as_ref()
                    .is_some_and(|n| n.kind == NoticeKind::RebalanceRecommendation) =>
            {
                "RebalanceDrainUndone"
            }
            Self::UndoDrainRecord { record, .. }
                if record.completed_at.is_some()
                    && record
                        .notice
                        .as_ref()
                        .is_some_and(|n| n.kind == NoticeKind::ScheduledMaintenance) =>
            {
                "RestoredAfterMaintenance"
            }
            Self::UndoDrainRecord { .. } => "NoticeDrainUndone",
            Self::LiftShutdownTaint { .. } => "OutOfServiceTaintLifted",
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

/// Auto Scaling's refresh statuses while it still replaces the outdated instances, so
/// the refresh's marks on them stand. A rollback (`RollbackInProgress`) keeps exactly the
/// instances the refresh marked and replaces the new ones: the marks go, as the
/// `Rollback Started` event's handling removes them.
pub fn refresh_in_progress(status: &str) -> bool {
    matches!(status, "Pending" | "InProgress" | "Cancelling" | "Baking")
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
        actions.extend(for_checkpoint(checkpoint, marks, facts, policy, now));
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
    if let Some(record) = &marks.shutdown {
        actions.extend(for_shutdown(record, marks));
    }
    if let Some(spot) = spot_interruption(marks, facts, now) {
        // The interruption's drain takes the rebalance cordon over and comes before any
        // other drain of the node.
        actions.retain(|a| {
            !matches!(
                a,
                Action::UndoDrainRecord { .. }
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

/// The out-of-service taint's reason is a kubelet that is gone: once the node is Ready
/// again (its kubelet posts status: a rebooted instance, one started again), the taint would
/// only evict every pod scheduled there, so it goes. Kubernetes, not AWS, knows whether the
/// kubelet is back. A node whose instance is gone is deleted with it.
fn for_shutdown(record: &ShutdownRecord, marks: &NodeMarks) -> Option<Action> {
    marks.ready.then(|| Action::LiftShutdownTaint {
        record: record.clone(),
        why: format!(
            "the node is Ready again (taint added by {} at {}: {})",
            record.by, record.at, record.why
        ),
    })
}

/// A drain record's rule: a lifecycle drain's ends when Auto Scaling put its instance back
/// in service; a notice drain's when AWS no longer reports its reason. A drain at work (a
/// live lease) is left to its invocation.
fn for_checkpoint(
    checkpoint: &DrainCheckpoint,
    marks: &NodeMarks,
    facts: &AwsFacts,
    policy: &Policy,
    now: Timestamp,
) -> Option<Action> {
    if !record_open_to_change(checkpoint, marks, now) {
        return None;
    }
    if !checkpoint.action.is_notice() {
        return back_in_service(checkpoint, facts);
    }
    let notice = checkpoint.notice.as_ref()?;
    if checkpoint.completed_at.is_some() {
        return came_back(checkpoint, notice, marks, facts, policy, now);
    }
    if notice.cordon_only {
        rebalance_cordon(checkpoint, notice, marks, facts, policy, now)
    } else {
        abandoned_notice_drain(checkpoint, notice, facts, policy, now)
    }
}

/// A lifecycle drain's record names a terminating lifecycle action, which exists only while
/// Auto Scaling holds the instance in a `*:Wait` state on its way out. Once Auto Scaling
/// reports the instance `InService` and EC2 running, that action is over and the instance
/// stays: the record ends by [`lifecycle_drain_ends`], seen after the fact (the launch out of
/// the warm pool was lost, or its launching hook failed). A record of a later action (another
/// token) is another record: the write is conditional on this one.
fn back_in_service(checkpoint: &DrainCheckpoint, facts: &AwsFacts) -> Option<Action> {
    let unchecked = |why| {
        Some(Action::Unchecked {
            mark: "lifecycle-drain",
            why,
        })
    };
    let state = match facts.lifecycle_state.known() {
        Err(why) => return unchecked(why),
        Ok(state) => state.clone(),
    };
    if state.as_deref() != Some("InService") {
        return None;
    }
    match facts.instance.known() {
        Err(why) => unchecked(why),
        Ok(Some(instance)) if instance.state.as_deref() == Some("running") => Some(
            lifecycle_drain_ends(checkpoint, BackInService::ListedInService),
        ),
        Ok(_) => None,
    }
}

/// How a lifecycle drain's instance is seen going back into service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackInService {
    /// The launching hook is about to complete the instance's launch out of the warm pool
    /// with `CONTINUE`: its node is Ready, or the launch timeout passed (the instance goes
    /// into service either way).
    LaunchCompleting,
    /// Auto Scaling lists the instance `InService` and EC2 `running`: the same transition
    /// after the fact, for the reconciler.
    ListedInService,
}

/// The one rule for the end of a lifecycle drain's record: it goes, with what it did, when
/// its instance goes back into service (a return from the warm pool), however that is seen.
/// Whether the node is Ready does not matter: the instance serves from then on, and a
/// NotReady node takes no pods anyway.
pub fn lifecycle_drain_ends(checkpoint: &DrainCheckpoint, seen: BackInService) -> Action {
    let action = &checkpoint.action;
    let how = match seen {
        BackInService::LaunchCompleting => "its launch out of the warm pool completes",
        BackInService::ListedInService => "Auto Scaling lists it InService and EC2 running",
    };
    Action::UndoDrainRecord {
        record: Box::new(checkpoint.clone()),
        why: format!(
            "instance {} is back in service ({how}): lifecycle action of hook {} over",
            action.instance_id, action.lifecycle_hook_name
        ),
    }
}

/// What the launching hook, about to complete a launch out of the warm pool with
/// `CONTINUE`, must converge the returning node to: its lifecycle drain's record ended by
/// [`lifecycle_drain_ends`], when the record is of this instance and no drain holds it (the
/// same gate as the reconciler's). Other marks are not the launch's to judge: the
/// reconciler's next run does.
pub fn at_return_from_warm_pool(marks: &NodeMarks, now: Timestamp) -> Option<Action> {
    let checkpoint = marks.checkpoint.as_ref()?;
    if !record_open_to_change(checkpoint, marks, now) || checkpoint.action.is_notice() {
        return None;
    }
    Some(lifecycle_drain_ends(
        checkpoint,
        BackInService::LaunchCompleting,
    ))
}

/// Whether a drain record may be changed by a decision: it is of the node's own instance
/// and no drain holds its lease (a drain at work is left to its invocation).
fn record_open_to_change(checkpoint: &DrainCheckpoint, marks: &NodeMarks, now: Timestamp) -> bool {
    marks.instance_id.as_deref() == Some(&checkpoint.action.instance_id)
        && !checkpoint.lease.held_by_other("", now)
}

/// A completed notice drain: once the instance runs again, its group is not terminating
/// it, and AWS no longer reports the notice's reason (the maintenance is over or
/// cancelled, the stopped instance was started, the Spot request is no longer marked, a
/// rebalance recommendation past `REBALANCE_UNDO_SECONDS`), our marks go as soon as the
/// node is Ready again (kept cordoned until then).
fn came_back(
    checkpoint: &DrainCheckpoint,
    notice: &InstanceNotice,
    marks: &NodeMarks,
    facts: &AwsFacts,
    policy: &Policy,
    now: Timestamp,
) -> Option<Action> {
    let unchecked = |why| {
        Some(Action::Unchecked {
            mark: "notice-drain",
            why,
        })
    };
    match leaving(facts) {
        Err(why) => return unchecked(why),
        Ok(true) => return None,
        Ok(false) => {}
    }
    let why = match reason_stands(notice, facts, policy, now) {
        Err(why) => return unchecked(why),
        Ok(Ok(())) => return None,
        Ok(Err(why)) => why,
    };
    marks.ready.then(|| Action::UndoDrainRecord {
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
        || marks
            .checkpoint
            .as_ref()
            .is_some_and(|c| !record_open_to_change(c, marks, now))
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
    if !marked_for_interruption(status) {
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
            scheduled_event: None,
        },
        group,
        instance_id: marks.instance()?.to_owned(),
        deadline: ends_at,
    })
}

/// A rebalance cordon is undone when its recommendation no longer stands (the one rule for
/// rebalance records, cordon or drain: [`reason_stands`]), unless an instance refresh still
/// running has marked the node too (the refresh's end, or its drain, decides then).
fn rebalance_cordon(
    checkpoint: &DrainCheckpoint,
    notice: &InstanceNotice,
    marks: &NodeMarks,
    facts: &AwsFacts,
    policy: &Policy,
    now: Timestamp,
) -> Option<Action> {
    let unchecked = |why| {
        Some(Action::Unchecked {
            mark: "rebalance-cordon",
            why,
        })
    };
    let why = match reason_stands(notice, facts, policy, now) {
        Err(why) => return unchecked(why),
        Ok(Ok(())) => return None,
        Ok(Err(why)) => why,
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
    Some(Action::UndoDrainRecord {
        record: Box::new(checkpoint.clone()),
        why,
    })
}

/// Whether the instance is on its way out: EC2 does not know it, it is not running, or its
/// group is terminating it or sending it to its warm pool.
pub(super) fn leaving(facts: &AwsFacts) -> Result<bool, String> {
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
        .is_some_and(|s| s.starts_with("Terminating") || s.starts_with("Warmed"));
    Ok(!running || terminating)
}

/// A notice drain nobody runs (its invocation ran out of time, or failed): resumed while
/// its reason stands and its deadline has not passed; undone when AWS no longer reports
/// the reason.
fn abandoned_notice_drain(
    checkpoint: &DrainCheckpoint,
    notice: &InstanceNotice,
    facts: &AwsFacts,
    policy: &Policy,
    now: Timestamp,
) -> Option<Action> {
    let unchecked = |why| {
        Some(Action::Unchecked {
            mark: "notice-drain",
            why,
        })
    };
    let instance_gone = match facts.instance.known() {
        Err(why) => return unchecked(why),
        Ok(None) => true,
        Ok(Some(instance)) => matches!(
            instance.state.as_deref(),
            Some("shutting-down" | "terminated")
        ),
    };
    // Gone, or going: its node goes with it.
    if instance_gone {
        return None;
    }
    let stands = match reason_stands(notice, facts, policy, now) {
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
        Err(why) => Some(Action::UndoDrainRecord {
            record: Box::new(checkpoint.clone()),
            why,
        }),
    }
}

/// Whether AWS still reports what the notice announced, by its kind's rule
/// ([`super::notice_kinds`]); never without EC2's answer about the instance.
fn reason_stands(
    notice: &InstanceNotice,
    facts: &AwsFacts,
    policy: &Policy,
    now: Timestamp,
) -> Stands {
    facts.instance.known()?;
    (rules(notice.kind).stands)(notice, facts, policy, now)
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
    // The plan's own event: another event of the instance is not it.
    let Some((starts_at, event)) = plan
        .pending_event(events)
        .map(|e| (e.not_before.unwrap_or(plan.starts_at), plan.event_ref(e)))
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
        current.drain_from = drain_from(starts_at, policy.maintenance_margin);
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
            event,
        });
    }
    actions
}

#[cfg(test)]
#[path = "desired_tests.rs"]
mod tests;
