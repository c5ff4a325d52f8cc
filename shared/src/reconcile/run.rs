//! One reconcile run over the marked nodes: list, ask AWS, decide, converge the marks. The
//! drains it decides on are handed back to the caller (the terminating hook's sweep), which
//! runs them within its invocation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;

use super::converge;
use super::desired::{Action, Policy, desired};
use super::facts::{CallCounts, KnownInstances, add_calls, gather, gather_knowing};
use crate::aws::{GroupActivity, InstanceNoticesBatch};
use crate::cluster::pages::Pages;
use crate::node_marks::checkpoint::DrainCheckpoint;
use crate::node_marks::maintenance::MAINTENANCE_LABEL;
use crate::node_marks::marks::NodeMarks;
use crate::node_marks::{EXCLUDE_FROM_LOAD_BALANCERS_LABEL, MARKED_LABEL};

/// How long the writes of one node may take in all: a node that hangs is reported and the
/// run goes on with the next.
pub const NODE_BOUND: Duration = Duration::from_secs(30);

/// How long reconciling one node after an event may take in all.
pub const AFTER_EVENT_BOUND: Duration = Duration::from_secs(20);

/// How long one list request (a page) may take.
const LIST_BOUND: Duration = Duration::from_secs(30);

/// What one action on one node came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeOutcome {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    pub action: String,
    pub outcome: String,
    /// The action could not be applied (tried again next run).
    pub failed: bool,
}

/// A drain the run decided on, for the caller to run.
#[derive(Debug, Clone)]
pub struct DueDrain {
    pub marks: NodeMarks,
    pub action: Action,
}

/// What a run did to the marks, and the drains left to run.
#[derive(Debug, Default)]
pub struct Reconciled {
    pub outcomes: Vec<NodeOutcome>,
    pub drains: Vec<DueDrain>,
    /// The AWS calls made, per operation.
    pub aws_calls: CallCounts,
    /// The Kubernetes lists made.
    pub lists: u32,
    /// Nodes looked at.
    pub nodes: usize,
    /// The instances whose node carries a maintenance plan or a drain record other than a
    /// rebalance cordon: a scheduled event of theirs is already planned, or their node is
    /// drained or draining (see [`NodeMarks::covers_maintenance`]).
    pub maintenance_covered: BTreeSet<String>,
    /// The lifecycle drains' records found, by their action's instance: whether a
    /// terminating action Auto Scaling lists as waiting has a drain (see
    /// [`crate::lifecycle::redeliver`]).
    pub lifecycle_drains: BTreeMap<String, DrainCheckpoint>,
}

/// Lists the marked nodes a page at a time ([`PAGE`]), asks AWS about each page's
/// instances, converges their marks: memory holds one page, whatever the cluster's size.
pub async fn reconcile_marks<E, A>(
    client: &kube::Client,
    ec2: &E,
    autoscaling: &A,
    policy: Policy,
) -> Result<Reconciled, kube::Error>
where
    E: InstanceNoticesBatch,
    A: GroupActivity,
{
    let mut reconciled = Reconciled::default();
    for (selector, required) in marked_selectors() {
        let mut pages = MarkedPages::new(client, &selector);
        loop {
            let page = match pages.next().await {
                Ok(Some(page)) => page,
                Ok(None) => break,
                Err(error) if !required => {
                    tracing::warn!(selector, %error, "could not list the nodes marked before the common label: they are looked at next run");
                    break;
                }
                Err(error) => return Err(error),
            };
            reconciled.lists += 1;
            reconcile_page(client, ec2, autoscaling, &policy, page, &mut reconciled).await;
        }
    }
    tracing::info!(
        step = "reconciled",
        nodes = reconciled.nodes,
        changes = reconciled.outcomes.len(),
        drains = reconciled.drains.len(),
        aws_calls = ?reconciled.aws_calls,
        "marks reconciled with what AWS says now"
    );
    Ok(reconciled)
}

/// One page of marked nodes: their facts asked, their marks decided and converged.
async fn reconcile_page<E, A>(
    client: &kube::Client,
    ec2: &E,
    autoscaling: &A,
    policy: &Policy,
    marked: Vec<NodeMarks>,
    reconciled: &mut Reconciled,
) where
    E: InstanceNoticesBatch,
    A: GroupActivity,
{
    let (facts, aws_calls) = gather(ec2, autoscaling, &marked).await;
    for (operation, count) in aws_calls {
        add_calls(&mut reconciled.aws_calls, operation, count);
    }
    reconciled.nodes += marked.len();
    let now = Timestamp::now();
    for (marks, facts) in marked.into_iter().zip(facts) {
        if marks.covers_maintenance()
            && let Some(instance) = marks.instance()
        {
            reconciled.maintenance_covered.insert(instance.to_owned());
        }
        if let Some(record) = marks.checkpoint.as_ref().filter(|c| !c.action.is_notice()) {
            let instance = record.action.instance_id.clone();
            reconciled.lifecycle_drains.insert(instance, record.clone());
        }
        let actions = desired(&marks, &facts, policy, now);
        converge_node(client, marks, actions, reconciled).await;
    }
}

/// Reconciles node `name` alone, right after an event about it was handled, so a stale mark
/// goes now rather than at the next scheduled run: its facts only (`known`, the instance's
/// facts the event just read, are not asked again), within [`AFTER_EVENT_BOUND`]. The drains
/// it finds due are left to the scheduled run. Never fails the event: what went wrong is
/// logged, and the scheduled run tries again.
pub async fn reconcile_node<E, A>(
    client: &kube::Client,
    ec2: &E,
    autoscaling: &A,
    policy: Policy,
    name: &str,
    known: Option<&KnownInstances>,
) -> Reconciled
where
    E: InstanceNoticesBatch,
    A: GroupActivity,
{
    let mut reconciled = Reconciled::default();
    let run = async {
        let nodes: Api<Node> = Api::all(client.clone());
        let Some(node) = nodes.get_opt(name).await? else {
            return Ok(());
        };
        let marks = NodeMarks::of(&node);
        if !marks.any() && !marks.labelled {
            return Ok(());
        }
        let (mut facts, aws_calls) =
            gather_knowing(ec2, autoscaling, std::slice::from_ref(&marks), known).await;
        reconciled.aws_calls = aws_calls;
        reconciled.nodes = 1;
        let facts = facts.pop().unwrap_or_default();
        let actions = desired(&marks, &facts, &policy, Timestamp::now());
        converge_node(client, marks, actions, &mut reconciled).await;
        Ok::<(), kube::Error>(())
    };
    match tokio::time::timeout(AFTER_EVENT_BOUND, run).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(step = "reconcile_failed", node = name, %error, "could not reconcile the node after the event: the scheduled run does");
        }
        Err(_) => {
            tracing::warn!(
                step = "reconcile_failed",
                node = name,
                "reconciling the node after the event took too long: the scheduled run does"
            );
        }
    }
    for drain in &reconciled.drains {
        tracing::info!(
            step = "reconcile",
            node = name,
            action = drain.action.name(),
            "a drain is due: the scheduled run runs it"
        );
    }
    reconciled
}

/// What a feature calls once it handled an event about node `found` (its marks as the
/// event found them; `event_drained`: the event ran a notice drain, which decides on the
/// node's drain record itself): the node is reconciled now ([`reconcile_node`]) if it
/// carried a mark the event's handling did not look at (an instance refresh's record, a
/// maintenance plan, a drain record the event left alone). `known`: the instance's facts
/// the event just read.
pub async fn after_event<E, A>(
    client: &kube::Client,
    ec2: &E,
    autoscaling: &A,
    policy: Policy,
    found: &NodeMarks,
    event_drained: bool,
    known: Option<&KnownInstances>,
) -> Option<Reconciled>
where
    E: InstanceNoticesBatch,
    A: GroupActivity,
{
    let worth = found.refresh.is_some()
        || found.maintenance.is_some()
        || (found.checkpoint.is_some() && !event_drained);
    if !worth {
        return None;
    }
    Some(reconcile_node(client, ec2, autoscaling, policy, &found.node, known).await)
}

/// Applies one node's actions in order; the first failure ends that node's turn (a later
/// action may depend on it) and is reported, the run goes on.
async fn converge_node(
    client: &kube::Client,
    marks: NodeMarks,
    actions: Vec<Action>,
    reconciled: &mut Reconciled,
) {
    let outcome = |action: &Action, outcome: String, failed: bool| NodeOutcome {
        node: marks.node.clone(),
        instance_id: marks.instance().map(str::to_owned),
        action: action.name().to_owned(),
        outcome,
        failed,
    };
    let removes_a_mark = actions.iter().any(|a| {
        matches!(
            a,
            Action::RemoveRefreshMarks { .. }
                | Action::UndoDrainRecord { .. }
                | Action::DropMaintenancePlan { .. }
                | Action::LiftShutdownTaint { .. }
        )
    });
    let has_label_action = actions
        .iter()
        .any(|a| matches!(a, Action::AddMarkedLabel | Action::RemoveMarkedLabel));
    for action in actions {
        if matches!(
            action,
            Action::DrainForMaintenance { .. }
                | Action::ResumeNoticeDrain { .. }
                | Action::DrainForSpotInterruption { .. }
        ) {
            reconciled.drains.push(DueDrain {
                marks: marks.clone(),
                action,
            });
            continue;
        }
        let applied =
            tokio::time::timeout(NODE_BOUND, converge::apply(client, &marks.node, &action)).await;
        let (text, failed) = match applied {
            Ok(Ok(Some(text))) => (text, false),
            Ok(Ok(None)) => continue,
            Ok(Err(error)) => (format!("failed: {error}"), true),
            Err(_) => (format!("failed: no answer within {NODE_BOUND:?}"), true),
        };
        if failed {
            tracing::error!(
                step = "reconcile_failed",
                node = marks.node,
                action = action.name(),
                outcome = text,
                "could not converge this node: the others go on, it is tried again next run"
            );
        } else {
            tracing::info!(
                step = "reconcile",
                node = marks.node,
                action = action.name(),
                outcome = text,
                "mark converged"
            );
        }
        reconciled.outcomes.push(outcome(&action, text, failed));
        if failed {
            return;
        }
    }
    // The last mark gone: the common label goes in the same run.
    if removes_a_mark && !has_label_action {
        let synced =
            tokio::time::timeout(NODE_BOUND, converge::sync_label(client, &marks.node)).await;
        if let Ok(Ok(Some(text))) = synced {
            reconciled
                .outcomes
                .push(outcome(&Action::RemoveMarkedLabel, text, false));
        }
    }
}

/// How many nodes one list request returns: the memory of a run is about one page of
/// marked nodes and their facts.
pub const PAGE: u32 = 500;

/// The label selectors that find every node carrying a mark of ours, each node once, and
/// whether a failure of that list fails the run: the common label ([`MARKED_LABEL`]); for
/// marks written before it existed, the load-balancer exclusion label (every drain record and
/// refresh record comes with it), then the maintenance label, each without the labels
/// listed before it.
fn marked_selectors() -> [(String, bool); 3] {
    [
        (MARKED_LABEL.to_owned(), true),
        (
            format!("!{MARKED_LABEL},{EXCLUDE_FROM_LOAD_BALANCERS_LABEL}"),
            false,
        ),
        (
            format!("!{MARKED_LABEL},!{EXCLUDE_FROM_LOAD_BALANCERS_LABEL},{MAINTENANCE_LABEL}"),
            false,
        ),
    ]
}

/// The marked nodes of one selector, a page at a time (each request bounded by
/// [`LIST_BOUND`]).
struct MarkedPages<'a> {
    pages: Pages<Node>,
    selector: &'a str,
}

impl<'a> MarkedPages<'a> {
    fn new(client: &kube::Client, selector: &'a str) -> Self {
        let params = ListParams::default().labels(selector).limit(PAGE);
        Self {
            pages: Pages::new(Api::all(client.clone()), params),
            selector,
        }
    }

    /// The next page's nodes that carry a mark of ours or the common label; `None` after the
    /// last page.
    async fn next(&mut self) -> Result<Option<Vec<NodeMarks>>, kube::Error> {
        let listed = tokio::time::timeout(LIST_BOUND, self.pages.next())
            .await
            .unwrap_or_else(|_| Err(list_timeout(self.selector)))?;
        Ok(listed.map(|nodes| {
            nodes
                .iter()
                .map(NodeMarks::of)
                .filter(|marks| marks.any() || marks.labelled)
                .collect()
        }))
    }
}

fn list_timeout(selector: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(
            &format!("listing nodes by {selector} got no answer within {LIST_BOUND:?}"),
            "Timeout",
        )
        .with_code(504)
        .boxed(),
    )
}
