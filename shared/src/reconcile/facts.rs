//! What AWS says now about the marked nodes' instances, asked in batches of the size each
//! API takes: `DescribeInstances` (200 instances a call), `DescribeAutoScalingInstances`
//! (50), `DescribeSpotInstanceRequests` (200 requests) for the Spot requests a notice drain
//! needs, `DescribeInstanceStatus` (100) for the instances with maintenance marks, one
//! `DescribeInstanceRefreshes` per refresh named by a record. The number of calls grows with
//! the marked nodes, never with the cluster. Each call is bounded in time ([`CALL_BOUND`])
//! and [`CONCURRENT_CALLS`] run at once, so thousands of marked nodes are asked within a few
//! bounds, not one per batch; a call that fails leaves its fact [`Fact::Unknown`] for the
//! instances of its batch, and only those.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;

use super::desired::{AwsFacts, Fact, may_need_spot_drain};
use super::notice_kinds::rules;
use crate::aws::{
    AUTO_SCALING_BATCH, AwsError, GroupActivity, INSTANCE_FILTER_BATCH, INSTANCE_STATUS_BATCH,
    InstanceFacts, InstanceNoticesBatch,
};
use crate::node_marks::checkpoint::NoticeKind;
use crate::node_marks::marks::NodeMarks;

/// How long one AWS call of the reconciler may take.
pub const CALL_BOUND: Duration = Duration::from_secs(10);

/// How many of the reconciler's AWS calls run at once (well under the APIs' request rates:
/// a run makes a few calls per hundred marked nodes).
pub const CONCURRENT_CALLS: usize = 8;

/// How many calls of each AWS operation one run made (for its report and the benchmark).
pub type CallCounts = BTreeMap<&'static str, u32>;

/// Adds `count` calls of `operation` to `calls` (nothing for none).
pub fn add_calls(calls: &mut CallCounts, operation: &'static str, count: u32) {
    if count > 0 {
        *calls.entry(operation).or_default() += count;
    }
}

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
        Some(known) => Answers::all_known(known.clone()),
        None => {
            let asked = ask_batched(
                "DescribeInstances",
                &ids,
                INSTANCE_FILTER_BATCH,
                |b| async move { ec2.instances_facts(&b).await },
            )
            .await;
            add_calls(&mut calls, "DescribeInstances", asked.calls);
            asked
        }
    };
    let spot_ids = distinct(
        nodes
            .iter()
            .filter(|n| needs_spot_status(n))
            .filter_map(|n| instances.known.get(n.instance()?)?.spot_request_id.clone()),
    );
    // Only instances EC2 just listed: `DescribeInstanceStatus` fails a whole batch on an id
    // it does not know.
    let scheduled_ids = distinct(
        nodes
            .iter()
            .filter(|n| needs_schedule(n))
            .filter_map(|n| n.instance().filter(|id| instances.known.contains_key(*id)))
            .map(str::to_owned),
    );
    let (states, spot, scheduled) = futures::join!(
        ask_batched(
            "DescribeAutoScalingInstances",
            &ids,
            AUTO_SCALING_BATCH,
            |b| { async move { autoscaling.lifecycle_states(&b).await } }
        ),
        ask_batched(
            "DescribeSpotInstanceRequests",
            &spot_ids,
            INSTANCE_FILTER_BATCH,
            |b| { async move { ec2.spot_request_statuses(&b).await } }
        ),
        ask_batched(
            "DescribeInstanceStatus",
            &scheduled_ids,
            INSTANCE_STATUS_BATCH,
            |b| { async move { ec2.scheduled_events_of(&b).await } }
        ),
    );
    add_calls(&mut calls, "DescribeAutoScalingInstances", states.calls);
    add_calls(&mut calls, "DescribeSpotInstanceRequests", spot.calls);
    add_calls(&mut calls, "DescribeInstanceStatus", scheduled.calls);
    let refreshes = refresh_statuses(autoscaling, nodes, &mut calls).await;
    let facts = nodes
        .iter()
        .map(|node| facts_of(node, &instances, &states, &spot, &scheduled, &refreshes))
        .collect();
    (facts, calls)
}

type Answer<T> = Result<T, String>;

/// The answers of one operation's batched calls: what the calls that answered said, why
/// each id of a call that did not answer is unknown, and how many calls were made.
#[derive(Debug, Clone, Default)]
struct Answers<T> {
    known: BTreeMap<String, T>,
    failed: BTreeMap<String, String>,
    calls: u32,
}

impl<T: Clone> Answers<T> {
    fn all_known(known: BTreeMap<String, T>) -> Self {
        Self {
            known,
            failed: BTreeMap::new(),
            calls: 0,
        }
    }

    /// The answer about `id`: its value (`None`: the answer did not name it), or why there
    /// is none.
    fn about(&self, id: &str) -> Fact<Option<T>> {
        match self.failed.get(id) {
            Some(why) => Fact::Unknown(why.clone()),
            None => Fact::Known(self.known.get(id).cloned()),
        }
    }
}

/// `ids` asked `size` at a time, [`CONCURRENT_CALLS`] calls at once, each bounded and
/// counted; nothing is asked for no ids.
async fn ask_batched<T, F>(
    operation: &'static str,
    ids: &[String],
    size: usize,
    call: impl Fn(Vec<String>) -> F,
) -> Answers<T>
where
    F: Future<Output = Result<BTreeMap<String, T>, AwsError>>,
{
    let batches: Vec<Vec<String>> = ids.chunks(size.max(1)).map(<[String]>::to_vec).collect();
    let calls = u32::try_from(batches.len()).unwrap_or(u32::MAX);
    let call = &call;
    let mut answered = futures::stream::iter(batches)
        .map(|batch| async move {
            let answer = bounded(operation, call(batch.clone())).await;
            (batch, answer)
        })
        .buffer_unordered(CONCURRENT_CALLS);
    let mut answers = Answers {
        known: BTreeMap::new(),
        failed: BTreeMap::new(),
        calls,
    };
    while let Some((batch, answer)) = answered.next().await {
        match answer {
            Ok(known) => answers.known.extend(known),
            Err(why) => answers
                .failed
                .extend(batch.iter().map(|id| (id.clone(), why.clone()))),
        }
    }
    answers
}

/// One call within [`CALL_BOUND`]; why it gave no answer, logged.
async fn bounded<T>(
    operation: &'static str,
    call: impl Future<Output = Result<T, AwsError>>,
) -> Answer<T> {
    match tokio::time::timeout(CALL_BOUND, call).await {
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
        add_calls(calls, "DescribeInstanceRefreshes", 1);
        let status = bounded(
            "DescribeInstanceRefreshes",
            autoscaling.instance_refresh_status(&group, &id),
        )
        .await;
        out.insert((group, id), status);
    }
    out
}

fn facts_of(
    node: &NodeMarks,
    instances: &Answers<InstanceFacts>,
    states: &Answers<String>,
    spot: &Answers<String>,
    scheduled: &Answers<Vec<crate::aws::ScheduledInstanceEvent>>,
    refreshes: &BTreeMap<(String, String), Answer<Option<String>>>,
) -> AwsFacts {
    let id = node.instance().unwrap_or_default();
    let instance = instances.about(id);
    let spot_request = match &instance {
        Fact::Known(Some(facts)) => facts.spot_request_id.clone(),
        _ => None,
    };
    let spot_status = match (&instance, spot_request) {
        (Fact::Unknown(why), _) => Fact::Unknown(why.clone()),
        (_, Some(request)) if needs_spot_status(node) => spot.about(&request),
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
                Some(Ok(status)) => Fact::Known(status.clone()),
                Some(Err(why)) => Fact::Unknown(why.clone()),
                None => Fact::Known(None),
            }
        }
    };
    let scheduled = match (&instance, scheduled.about(id)) {
        (Fact::Unknown(why), _) => Fact::Unknown(why.clone()),
        (_, Fact::Unknown(why)) => Fact::Unknown(why),
        (_, Fact::Known(events)) => Fact::Known(events.unwrap_or_default()),
    };
    AwsFacts {
        scheduled,
        lifecycle_state: states.about(id),
        instance,
        spot_status,
        refresh_status,
    }
}

/// A notice drain of a Spot interruption or a rebalance recommendation (running or done)
/// is checked against its Spot request, and so is a marked node's Spot instance no drain
/// runs on (its interruption warning may be lost).
fn needs_spot_status(node: &NodeMarks) -> bool {
    notice_kind(node).is_some_and(|kind| rules(kind).needs_spot_status) || may_need_spot_drain(node)
}

/// A maintenance plan, or a maintenance drain (running or done: after the maintenance our
/// cordon goes), is checked against EC2's schedule.
fn needs_schedule(node: &NodeMarks) -> bool {
    node.maintenance.is_some() || notice_kind(node).is_some_and(|kind| rules(kind).needs_schedule)
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
