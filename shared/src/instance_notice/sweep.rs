//! The sweep, run by the stack's schedule (every five minutes): the reconciler
//! ([`crate::reconcile`]) over every node carrying a mark of ours, then the drains it found
//! due.
//!
//! The reconciler undoes what lost, late or retried events left: an instance refresh's marks
//! once Auto Scaling no longer reports the refresh running, a rebalance cordon no termination
//! followed within `REBALANCE_UNDO_SECONDS` (kept while a refresh of the node runs), a notice
//! drain whose reason AWS no longer reports, a maintenance plan EC2 cancelled (moved when EC2
//! moved it). The drains run here, in this invocation, one after another while it has time
//! (what is left waits for the next run, nothing is lost):
//! - **planned maintenance that is due** ([`super::maintenance`]): drained until its start;
//! - **a notice drain nobody runs** (its invocation ran out of time or failed) whose reason
//!   stands: resumed on its own record, until its own deadline;
//! - **a Spot instance EC2 marks for interruption** (its warning may have been lost): found
//!   by one account-wide `DescribeSpotInstanceRequests` by status code, drained as for its
//!   warning;
//! - **a scheduled maintenance whose AWS Health event was lost** on a node not planned yet:
//!   found by one account-wide `DescribeInstanceStatus` by event code, planned (or drained,
//!   when due) as for its Health event.

use std::collections::BTreeSet;

use jiff::Timestamp;

use super::event::{Announcement, InstanceEvent};
use super::handler::{
    InstanceOutcome, NoticeError, NoticeHandler, NoticeReport, kube_error, maintenance_drain,
};
use crate::aws::{GroupActivity, InstanceNoticesBatch, ScheduledInstanceEvent};
use crate::cluster::connection::KubeConnection;
use crate::drain::Drainer;
use crate::lifecycle::handler::{HookClients, Invocation};
use crate::lifecycle::redeliver::redeliver_waiting;
use crate::node_marks::maintenance::health_type_code;
use crate::reconcile::Action;
use crate::reconcile::run::{DueDrain, Reconciled, reconcile_marks};

pub(super) async fn sweep<C: HookClients>(
    drainer: &Drainer<C>,
    invocation: &Invocation,
) -> Result<NoticeReport, NoticeError>
where
    C::Instances: InstanceNoticesBatch,
    C::AutoScaling: GroupActivity,
{
    let client = drainer.context.kube.client().await?;
    let context = &drainer.context;
    let policy = context.settings.notices.reconcile_policy();
    let reconciled = reconcile_marks(&client, &context.instances, &context.autoscaling, policy)
        .await
        .map_err(|source| kube_error("", source))?;
    let Reconciled {
        outcomes,
        drains,
        maintenance_covered,
        lifecycle_drains,
        ..
    } = reconciled;
    let mut instances: Vec<InstanceOutcome> = outcomes
        .into_iter()
        .map(|o| InstanceOutcome {
            instance_id: o.instance_id.unwrap_or_default(),
            outcome: if o.failed {
                "Failed".to_owned()
            } else {
                o.action.clone()
            },
            detail: Some(if o.failed {
                format!("node {}: {} {}", o.node, o.action, o.outcome)
            } else {
                format!("node {}: {}", o.node, o.outcome)
            }),
        })
        .collect();
    let handler = NoticeHandler { drainer };
    let mut drained: BTreeSet<String> = BTreeSet::new();
    for due in drains {
        drained.extend(due.marks.instance().map(str::to_owned));
        instances.push(run_drain(&handler, &client, due, invocation).await);
    }
    let spot = lost_spot_warnings(&handler, &drained, invocation).await;
    let mut covered = maintenance_covered;
    covered.extend(drained);
    covered.extend(spot.iter().map(|o| o.instance_id.clone()));
    instances.extend(spot);
    instances.extend(lost_health_events(&handler, &covered, invocation).await);
    instances.extend(lost_lifecycle_notifications(drainer, &lifecycle_drains).await);
    Ok(NoticeReport {
        event: "Sweep".to_owned(),
        instances,
    })
}

/// The terminating actions Auto Scaling lists as waiting that nobody drains, published to
/// the lifecycle topic again ([`crate::lifecycle::redeliver`]); none without a topic
/// (`CONTINUATION_TOPIC_ARN`).
async fn lost_lifecycle_notifications<C: HookClients>(
    drainer: &Drainer<C>,
    lifecycle_drains: &std::collections::BTreeMap<
        String,
        crate::node_marks::checkpoint::DrainCheckpoint,
    >,
) -> Vec<InstanceOutcome>
where
    C::AutoScaling: GroupActivity,
{
    let context = &drainer.context;
    let Some(topic_arn) = context.settings.lifecycle.continuation_topic_arn.as_deref() else {
        return Vec::new();
    };
    let groups = context.scope.query();
    let Some(waiting) = scan(
        "the waiting terminating actions",
        context.autoscaling.waiting_terminations(&groups, topic_arn),
    )
    .await
    else {
        return Vec::new();
    };
    let found =
        redeliver_waiting(&context.notifications, topic_arn, waiting, lifecycle_drains).await;
    found
        .into_iter()
        .map(|r| InstanceOutcome {
            instance_id: r.instance_id,
            outcome: r.outcome.to_owned(),
            detail: Some(r.detail),
        })
        .collect()
}

/// How long each account-wide scan (EC2's Spot requests marked for interruption and
/// scheduled events, Auto Scaling's waiting terminating actions) may take.
const SCAN_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// The answer of one account-wide scan within [`SCAN_BOUND`]; `None` (logged) when it failed
/// or took too long: the next run scans again.
async fn scan<T>(
    what: &'static str,
    call: impl std::future::Future<Output = Result<T, crate::aws::AwsError>>,
) -> Option<T> {
    match tokio::time::timeout(SCAN_BOUND, call).await {
        Ok(Ok(found)) => Some(found),
        Ok(Err(error)) => {
            tracing::warn!(%error, what, "could not scan AWS: the next run does");
            None
        }
        Err(_) => {
            tracing::warn!(
                what,
                "AWS did not answer the scan in time: the next run does"
            );
            None
        }
    }
}

/// The Spot instances EC2 marks for interruption now, account-wide (one
/// `DescribeSpotInstanceRequests` by status code), handled as if their interruption warning
/// had just arrived (the warning may have been lost): checked as the warning would be (ours,
/// confirmed), then drained for Spot's two minutes. Those the reconciler drained already are
/// skipped; an instance of another cluster is left alone as for its warning.
async fn lost_spot_warnings<C: HookClients>(
    handler: &NoticeHandler<'_, C>,
    drained: &BTreeSet<String>,
    invocation: &Invocation,
) -> Vec<InstanceOutcome>
where
    C::Instances: InstanceNoticesBatch,
    C::AutoScaling: GroupActivity,
{
    let instances = &handler.drainer.context.instances;
    let Some(interrupted) = scan(
        "the Spot requests marked for interruption",
        instances.interrupted_spot_instances(),
    )
    .await
    else {
        return Vec::new();
    };
    let found = spot_announcements(&interrupted, drained);
    handle_lost(handler, "spot", found, invocation).await
}

/// The instances with a scheduled event EC2 lists as pending and not yet started, of the
/// codes AWS Health announces, account-wide (one `DescribeInstanceStatus` by event code,
/// every page), handled as if their AWS Health event had just arrived (it may have been
/// lost): checked as it would be (ours, confirmed in EC2's schedule), then planned for
/// `MAINTENANCE_DRAIN_MARGIN_SECONDS` before the start, or drained now when that time has
/// come. An instance whose node is planned, drained or draining already (`covered`) is
/// skipped; one of another cluster is left alone as for its Health event.
async fn lost_health_events<C: HookClients>(
    handler: &NoticeHandler<'_, C>,
    covered: &BTreeSet<String>,
    invocation: &Invocation,
) -> Vec<InstanceOutcome>
where
    C::Instances: InstanceNoticesBatch,
    C::AutoScaling: GroupActivity,
{
    let instances = &handler.drainer.context.instances;
    let Some(scheduled) = scan(
        "the scheduled events",
        instances.instances_with_scheduled_events(),
    )
    .await
    else {
        return Vec::new();
    };
    let found = health_announcements(&scheduled, covered, Timestamp::now());
    handle_lost(handler, "maintenance", found, invocation).await
}

/// What a lost Spot interruption warning announced (a `terminate`: the sweep handles every
/// interruption so), for each interrupted instance not `covered` already.
fn spot_announcements<'a>(
    interrupted: &'a [String],
    covered: &'a BTreeSet<String>,
) -> impl Iterator<Item = (&'a str, Announcement)> + 'a {
    interrupted
        .iter()
        .filter(|id| !covered.contains(*id))
        .map(|id| {
            let announcement = Announcement::SpotInterruption {
                action: "terminate".to_owned(),
            };
            (id.as_str(), announcement)
        })
}

/// What a lost AWS Health event announced, for each instance not `covered` already that has
/// an upcoming scheduled event of a code Health announces (see [`first_upcoming`]).
fn health_announcements<'a>(
    scheduled: &'a std::collections::BTreeMap<String, Vec<ScheduledInstanceEvent>>,
    covered: &'a BTreeSet<String>,
    now: Timestamp,
) -> impl Iterator<Item = (&'a str, Announcement)> + 'a {
    scheduled
        .iter()
        .filter(|(id, _)| !covered.contains(*id))
        .filter_map(move |(id, events)| {
            let (type_code, starts_at) = first_upcoming(events, now)?;
            let announcement = Announcement::ScheduledChange {
                type_code: type_code.to_owned(),
                starts_at: Some(starts_at),
                closed: false,
            };
            Some((id.as_str(), announcement))
        })
}

/// Handles each found instance as if the event announcing it (`kind`: `spot`,
/// `maintenance`) had just arrived, one after another while the invocation has a working
/// slice left (the next run finds the others again).
async fn handle_lost<'a, C: HookClients>(
    handler: &NoticeHandler<'_, C>,
    kind: &str,
    found: impl Iterator<Item = (&'a str, Announcement)>,
    invocation: &Invocation,
) -> Vec<InstanceOutcome>
where
    C::Instances: InstanceNoticesBatch,
    C::AutoScaling: GroupActivity,
{
    let mut outcomes = Vec::new();
    for (instance_id, announcement) in found {
        if !invocation.budget.has_working_slice() {
            break;
        }
        let event = found_event(handler, kind, instance_id, announcement, invocation);
        outcomes.push(handle_found(handler, &event, instance_id, invocation).await);
    }
    outcomes
}

/// Of an instance's scheduled events, the first pending one not started yet of a code AWS
/// Health announces: the Health type code that announces it, and its start.
fn first_upcoming(
    events: &[ScheduledInstanceEvent],
    now: Timestamp,
) -> Option<(&'static str, Timestamp)> {
    events
        .iter()
        .filter(|e| e.is_pending())
        .filter_map(|e| Some((health_type_code(&e.code)?, e.not_before?)))
        .filter(|(_, starts_at)| *starts_at > now)
        .min_by_key(|(_, starts_at)| *starts_at)
}

/// The event a lost one is handled as: from this function's account and region, now.
fn found_event<C: HookClients>(
    handler: &NoticeHandler<'_, C>,
    kind: &str,
    instance_id: &str,
    announcement: Announcement,
    invocation: &Invocation,
) -> InstanceEvent {
    let notices = &handler.drainer.context.settings.notices;
    InstanceEvent {
        id: format!("sweep-{kind}-{instance_id}"),
        account: invocation.function_account.clone().unwrap_or_default(),
        region: notices.region.clone().unwrap_or_default(),
        time: Timestamp::now(),
        announcement,
        instance_ids: vec![instance_id.to_owned()],
    }
}

/// Handles a found instance as its event; a failure is this instance's alone.
async fn handle_found<C: HookClients>(
    handler: &NoticeHandler<'_, C>,
    event: &InstanceEvent,
    instance_id: &str,
    invocation: &Invocation,
) -> InstanceOutcome
where
    C::Instances: InstanceNoticesBatch,
    C::AutoScaling: GroupActivity,
{
    match handler.instance(event, instance_id, invocation).await {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::error!(step = "sweep_drain_failed", instance_id, event_id = event.id, %error, "a lost event's handling failed: the next run tries again");
            InstanceOutcome {
                instance_id: instance_id.to_owned(),
                outcome: "Failed".to_owned(),
                detail: Some(error.to_string()),
            }
        }
    }
}

/// Runs one drain the reconciler found due, if the invocation still has time for it; a
/// failure is this node's alone.
async fn run_drain<C: HookClients>(
    handler: &NoticeHandler<'_, C>,
    client: &kube::Client,
    due: DueDrain,
    invocation: &Invocation,
) -> InstanceOutcome
where
    C::Instances: InstanceNoticesBatch,
    C::AutoScaling: GroupActivity,
{
    let DueDrain { marks, action } = due;
    let report = |outcome: &str, detail: String| InstanceOutcome {
        instance_id: marks.instance().unwrap_or_default().to_owned(),
        outcome: outcome.to_owned(),
        detail: Some(format!("node {}: {detail}", marks.node)),
    };
    if !invocation.budget.has_working_slice() {
        tracing::info!(
            step = "drain_left_for_next_run",
            node = marks.node,
            "no time left in this invocation: the next run drains the node"
        );
        return report("LeftForNextRun", action.name().to_owned());
    }
    let drain_timeout = handler.drainer.context.settings.drain_timeout;
    let Some(DrainToRun {
        group,
        instance_id,
        notice,
        deadline,
    }) = drain_to_run(&action, drain_timeout)
    else {
        return report(action.name(), "not a drain".to_owned());
    };
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let node = match nodes.get_opt(&marks.node).await {
        Ok(Some(node)) => node,
        Ok(None) => return report("NodeGone", action.name().to_owned()),
        Err(error) => return failed(&marks.node, kube_error(&marks.node, error), report),
    };
    let drained = handler
        .drain(
            client,
            node,
            &group,
            &instance_id,
            &notice,
            deadline,
            invocation,
        )
        .await;
    match drained {
        Ok(outcome) => {
            tracing::info!(
                step = "sweep_drain",
                node = marks.node,
                instance_id,
                action = action.name(),
                outcome = outcome.name(),
                "drain run by the sweep"
            );
            report(outcome.name(), action.name().to_owned())
        }
        Err(error) => failed(&marks.node, error, report),
    }
}

/// What a due drain works on: the instance, its group, the notice and the deadline.
struct DrainToRun {
    group: String,
    instance_id: String,
    notice: crate::node_marks::checkpoint::InstanceNotice,
    deadline: Timestamp,
}

/// The drain `action` asks for (`None` for an action that is no drain): a planned
/// maintenance from now to its start, or a notice drain resumed on its own record.
fn drain_to_run(action: &Action, drain_timeout: std::time::Duration) -> Option<DrainToRun> {
    match action {
        Action::DrainForMaintenance {
            record,
            starts_at,
            event,
        } => {
            let (notice, deadline) =
                maintenance_drain(*starts_at, event.clone(), Timestamp::now(), drain_timeout);
            Some(DrainToRun {
                group: record.auto_scaling_group_name.clone(),
                instance_id: record.instance_id.clone(),
                notice,
                deadline,
            })
        }
        Action::ResumeNoticeDrain {
            notice,
            group,
            instance_id,
            deadline,
        }
        | Action::DrainForSpotInterruption {
            notice,
            group,
            instance_id,
            deadline,
        } => Some(DrainToRun {
            group: group.clone(),
            instance_id: instance_id.clone(),
            notice: notice.clone(),
            deadline: *deadline,
        }),
        _ => None,
    }
}

fn failed(
    node: &str,
    error: NoticeError,
    report: impl Fn(&str, String) -> InstanceOutcome,
) -> InstanceOutcome {
    tracing::error!(step = "sweep_drain_failed", node, %error, "the drain failed: the others go on, the next run tries it again");
    report("Failed", error.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use jiff::{SignedDuration, Timestamp};

    use super::{Announcement, health_announcements, spot_announcements};
    use crate::aws::ScheduledInstanceEvent;

    fn covered(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|id| (*id).to_owned()).collect()
    }

    fn event(code: &str, starts_at: Timestamp, description: &str) -> ScheduledInstanceEvent {
        ScheduledInstanceEvent {
            id: None,
            code: code.to_owned(),
            not_before: Some(starts_at),
            description: description.to_owned(),
        }
    }

    #[test]
    fn every_interrupted_instance_not_covered_is_announced_as_a_termination() {
        let interrupted = vec!["i-a".to_owned(), "i-b".to_owned(), "i-c".to_owned()];
        let drained = covered(&["i-b"]);
        let found: Vec<_> = spot_announcements(&interrupted, &drained).collect();
        let terminate = Announcement::SpotInterruption {
            action: "terminate".to_owned(),
        };
        assert_eq!(
            found,
            [("i-a", terminate.clone()), ("i-c", terminate)],
            "the drained instance is skipped, the others kept in order"
        );
    }

    #[test]
    fn an_instance_with_an_upcoming_health_event_not_covered_is_announced_by_its_first() {
        let now = Timestamp::now();
        let hours = |h: i64| now + SignedDuration::from_hours(h);
        let scheduled = BTreeMap::from([
            (
                "i-planned".to_owned(),
                vec![event("system-reboot", hours(5), "reboot")],
            ),
            (
                "i-two".to_owned(),
                vec![
                    event("system-reboot", hours(9), "reboot"),
                    event("instance-retirement", hours(3), "retirement"),
                    event("instance-stop", hours(1), "[Canceled] stop"),
                ],
            ),
            (
                "i-started".to_owned(),
                vec![event("system-maintenance", hours(-1), "maintenance")],
            ),
            (
                "i-unknown-code".to_owned(),
                vec![event("no-such-code", hours(2), "what")],
            ),
        ]);
        let planned = covered(&["i-planned"]);
        let found: Vec<_> = health_announcements(&scheduled, &planned, now).collect();
        assert_eq!(
            found,
            [(
                "i-two",
                Announcement::ScheduledChange {
                    type_code: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".to_owned(),
                    starts_at: Some(hours(3)),
                    closed: false,
                }
            )],
            "covered, started and unknown events are skipped; the first pending one wins"
        );
    }
}
