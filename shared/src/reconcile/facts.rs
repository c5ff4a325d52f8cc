//! What AWS says now about the marked nodes' instances, asked in batches: one
//! `DescribeInstances` and one `DescribeAutoScalingInstances` for all of them, one
//! `DescribeSpotInstanceRequests` for the Spot requests a notice drain needs, one
//! `DescribeInstanceStatus` per hundred instances with maintenance marks, one
//! `DescribeInstanceRefreshes` per refresh named by a record. The number of calls grows with
//! the marked nodes, never with the cluster. Each call is bounded in time; a call that fails
//! leaves its fact [`Fact::Unknown`] for the nodes it was about, and only those.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use super::desired::{AwsFacts, Fact, may_need_spot_drain};
use super::marks::NodeMarks;
use crate::aws::{AwsError, GroupActivity, InstanceFacts, InstanceNoticesBatch};
use crate::node_marks::checkpoint::NoticeKind;

/// How long one AWS call of the reconciler may take.
pub const CALL_BOUND: Duration = Duration::from_secs(10);

/// How many calls of each AWS operation one run made (for its report and the benchmark).
pub type CallCounts = BTreeMap<&'static str, u32>;

/// What `DescribeInstances` answered moments ago (an event's own proof), reused instead of
/// asking again.
pub type KnownInstances = BTreeMap<String, InstanceFacts>;

/// The facts of each node of `nodes` (same order), and the calls made for them.
pub async fn gather<E, A>(
    ec2: &E,
    autoscaling: &A,
    nodes: &[NodeMarks],
) -> (Vec<AwsFacts>, CallCounts)
where
    E: InstanceNoticesBatch,
    A: GroupActivity,
{
    gather_knowing(ec2, autoscaling, nodes, None).await
}

/// [`gather`], with `known` instances' facts taken as answered (no `DescribeInstances` when
/// they cover every node's instance).
pub async fn gather_knowing<E, A>(
    ec2: &E,
    autoscaling: &A,
    nodes: &[NodeMarks],
    known: Option<&KnownInstances>,
) -> (Vec<AwsFacts>, CallCounts)
where
    E: InstanceNoticesBatch,
    A: GroupActivity,
{
    let mut calls = CallCounts::new();
    let ids: Vec<String> = distinct(nodes.iter().filter_map(|n| n.instance().map(str::to_owned)));
    let instances = match known.filter(|k| ids.iter().all(|id| k.contains_key(id))) {
        Some(known) => Ok(known.clone()),
        None => {
            ask(&mut calls, "DescribeInstances", !ids.is_empty(), || {
                ec2.instances_facts(&ids)
            })
            .await
        }
    };
    let states = ask(
        &mut calls,
        "DescribeAutoScalingInstances",
        !ids.is_empty(),
        || autoscaling.lifecycle_states(&ids),
    )
    .await;
    let spot_ids = match &instances {
        Ok(known) => distinct(
            nodes
                .iter()
                .filter(|n| needs_spot_status(n))
                .filter_map(|n| known.get(n.instance()?)?.spot_request_id.clone()),
        ),
        Err(_) => Vec::new(),
    };
    let spot = ask(
        &mut calls,
        "DescribeSpotInstanceRequests",
        !spot_ids.is_empty(),
        || ec2.spot_request_statuses(&spot_ids),
    )
    .await;
    // Only instances EC2 just listed: `DescribeInstanceStatus` fails a whole batch on an id
    // it does not know.
    let scheduled_ids = match &instances {
        Ok(known) => distinct(
            nodes
                .iter()
                .filter(|n| needs_schedule(n))
                .filter_map(|n| n.instance().filter(|id| known.contains_key(*id)))
                .map(str::to_owned),
        ),
        Err(_) => Vec::new(),
    };
    let scheduled = ask(
        &mut calls,
        "DescribeInstanceStatus",
        !scheduled_ids.is_empty(),
        || ec2.scheduled_events_of(&scheduled_ids),
    )
    .await;
    let refreshes = refresh_statuses(autoscaling, nodes, &mut calls).await;
    let facts = nodes
        .iter()
        .map(|node| facts_of(node, &instances, &states, &spot, &scheduled, &refreshes))
        .collect();
    (facts, calls)
}

type Answer<T> = Result<T, String>;

/// One bounded call, counted; `Ok(default)` without a call when there is nothing to ask.
async fn ask<T: Default, F: Future<Output = Result<T, AwsError>>>(
    calls: &mut CallCounts,
    operation: &'static str,
    needed: bool,
    call: impl FnOnce() -> F,
) -> Answer<T> {
    if !needed {
        return Ok(T::default());
    }
    *calls.entry(operation).or_default() += 1;
    match tokio::time::timeout(CALL_BOUND, call()).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => {
            tracing::warn!(operation, %error, "the reconciler could not ask AWS: the marks it needed are left as they are this time");
            Err(error.to_string())
        }
        Err(_) => {
            tracing::warn!(
                operation,
                "AWS did not answer the reconciler in time: the marks it needed are left as they are this time"
            );
            Err(format!("{operation} did not answer within {CALL_BOUND:?}"))
        }
    }
}

/// The status of each refresh named by a record, one call per (group, refresh).
async fn refresh_statuses<A: GroupActivity>(
    autoscaling: &A,
    nodes: &[NodeMarks],
    calls: &mut CallCounts,
) -> BTreeMap<(String, String), Answer<Option<String>>> {
    let named: BTreeSet<(String, String)> = nodes
        .iter()
        .filter_map(|n| n.refresh.as_ref())
        .map(|r| {
            (
                r.auto_scaling_group_name.clone(),
                r.instance_refresh_id.clone(),
            )
        })
        .collect();
    let mut out = BTreeMap::new();
    for (group, id) in named {
        let status = ask(calls, "DescribeInstanceRefreshes", true, || {
            autoscaling.instance_refresh_status(&group, &id)
        })
        .await;
        out.insert((group, id), status);
    }
    out
}

fn facts_of(
    node: &NodeMarks,
    instances: &Answer<BTreeMap<String, InstanceFacts>>,
    states: &Answer<BTreeMap<String, String>>,
    spot: &Answer<BTreeMap<String, String>>,
    scheduled: &Answer<BTreeMap<String, Vec<crate::aws::ScheduledInstanceEvent>>>,
    refreshes: &BTreeMap<(String, String), Answer<Option<String>>>,
) -> AwsFacts {
    let id = node.instance().unwrap_or_default();
    let instance = fact(instances, |m| m.get(id).cloned());
    let spot_request = match &instance {
        Fact::Known(Some(facts)) => facts.spot_request_id.clone(),
        _ => None,
    };
    let spot_status = match (&instance, spot_request) {
        (Fact::Unknown(why), _) => Fact::Unknown(why.clone()),
        (_, Some(request)) if needs_spot_status(node) => fact(spot, |m| m.get(&request).cloned()),
        _ => Fact::Known(None),
    };
    let refresh_status = match &node.refresh {
        None => Fact::Known(None),
        Some(r) => {
            let key = (
                r.auto_scaling_group_name.clone(),
                r.instance_refresh_id.clone(),
            );
            match refreshes.get(&key) {
                Some(answer) => fact(answer, Clone::clone),
                None => Fact::Known(None),
            }
        }
    };
    AwsFacts {
        scheduled: match &instance {
            Fact::Unknown(why) => Fact::Unknown(why.clone()),
            _ => fact(scheduled, |m| m.get(id).cloned().unwrap_or_default()),
        },
        lifecycle_state: fact(states, |m| m.get(id).cloned()),
        instance,
        spot_status,
        refresh_status,
    }
}

fn fact<T, U>(answer: &Answer<T>, pick: impl FnOnce(&T) -> U) -> Fact<U> {
    match answer {
        Ok(value) => Fact::Known(pick(value)),
        Err(why) => Fact::Unknown(why.clone()),
    }
}

/// A notice drain of a Spot interruption or a rebalance recommendation (running or done)
/// is checked against its Spot request, and so is a marked node's Spot instance no drain
/// runs on (its interruption warning may be lost).
fn needs_spot_status(node: &NodeMarks) -> bool {
    matches!(
        notice_kind(node),
        Some(NoticeKind::SpotInterruption | NoticeKind::RebalanceRecommendation)
    ) || may_need_spot_drain(node)
}

/// A maintenance plan, or a maintenance drain (running or done: after the maintenance our
/// cordon goes), is checked against EC2's schedule.
fn needs_schedule(node: &NodeMarks) -> bool {
    node.maintenance.is_some() || notice_kind(node) == Some(NoticeKind::ScheduledMaintenance)
}

/// The notice of a notice drain of this node's instance, running or done.
fn notice_kind(node: &NodeMarks) -> Option<NoticeKind> {
    let checkpoint = node.checkpoint.as_ref()?;
    if !checkpoint.action.is_notice() {
        return None;
    }
    checkpoint.notice.as_ref().map(|n| n.kind)
}

fn distinct(ids: impl Iterator<Item = String>) -> Vec<String> {
    ids.collect::<BTreeSet<_>>().into_iter().collect()
}
