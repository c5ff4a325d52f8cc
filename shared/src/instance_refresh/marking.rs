//! The Node writes of a refresh: mark the outdated nodes the room rule chooses
//! ([`super::room`], from one list of the Nodes and, when an outdated node is still in
//! service, one of the pods placed on nodes) whenever the refresh plans, undo the refresh's
//! marks at its end. Each write is one conditional patch ([`crate::node_marks::refresh`]);
//! a failed write is collected, not fatal, so the other nodes are still written.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{Api, ListParams};

use super::capacity::{PodTally, decision_needs_pods, survey};
use super::event::RefreshEvent;
use super::handler::{RefreshError, RefreshReport, UnmarkedNode};
use super::plan::MarkPlan;
use super::room::{RoomDecision, choose};
use crate::cluster::pages::Pages;
use crate::lifecycle::node::node_instance_id;
use crate::node_marks::refresh::{MarkAs, Marked, REFRESH_LABEL, mark_node, refresh_marks_of};
use crate::reconcile::converge::remove_refresh_marks;

/// Objects per page of a list.
const PAGE_SIZE: u32 = 500;

/// Every object `params` selects, page by page.
async fn list_all<K>(api: &Api<K>, params: ListParams) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut pages = Pages::new(api.clone(), params.limit(PAGE_SIZE));
    let mut all = Vec::new();
    while let Some(page) = pages.next().await? {
        all.extend(page);
    }
    Ok(all)
}

/// Every node `params` selects.
pub(super) async fn list_nodes(
    nodes: &Api<Node>,
    params: ListParams,
) -> Result<Vec<Node>, RefreshError> {
    list_all(nodes, params)
        .await
        .map_err(RefreshError::ListNodes)
}

/// What Auto Scaling and EC2 say of the group's instances, for the room rule.
pub(super) struct GroupFacts<'a> {
    /// Each instance's `LaunchTime` (the oldest outdated nodes are marked first).
    pub launch_times: &'a BTreeMap<String, jiff::Timestamp>,
    /// The group's instances on their way out (`Terminating*`: a scale-in whose drain has
    /// not begun yet; `Warmed*`: back to the warm pool; `Detaching`, `Detached`): their
    /// nodes are no room, and their pods claim room first (they move too).
    pub leaving: BTreeSet<&'a str>,
}

impl<'a> GroupFacts<'a> {
    pub fn new(
        group: &'a crate::aws::GroupConfiguration,
        launch_times: &'a BTreeMap<String, jiff::Timestamp>,
    ) -> Self {
        Self {
            launch_times,
            leaving: group
                .instances
                .iter()
                .filter(|i| {
                    ["Terminating", "Warmed", "Detach"]
                        .iter()
                        .any(|state| i.lifecycle_state.starts_with(state))
                })
                .map(|i| i.instance_id.as_str())
                .collect(),
        }
    }
}

/// Chooses with the room rule which outdated nodes to mark (filling the plan's `mark` and
/// `kept`) and marks them; undoes the marks of an earlier refresh of this group (whose end
/// was missed) on the group's nodes this one does not mark.
pub(super) async fn mark_outdated(
    nodes: &Api<Node>,
    pods: &Api<Pod>,
    event: &RefreshEvent,
    mark_plan: &mut MarkPlan,
    group: &GroupFacts<'_>,
    taint: Option<&Taint>,
    report: &mut RefreshReport,
) -> Result<Vec<String>, RefreshError> {
    let listed = list_nodes(nodes, ListParams::default()).await?;
    let outdated: BTreeMap<&str, Option<jiff::Timestamp>> = mark_plan
        .outdated
        .iter()
        .map(|id| (id.as_str(), group.launch_times.get(id).copied()))
        .collect();
    let decision = decide(pods, &listed, &outdated, &group.leaving, &event.group_name).await?;
    mark_plan.mark = decision.mark;
    mark_plan.kept = decision.kept;
    let by_instance: BTreeMap<&str, &Node> = listed
        .iter()
        .filter_map(|node| Some((node_instance_id(node)?, node)))
        .collect();
    report.without_node.extend(
        mark_plan
            .outdated
            .iter()
            .filter(|id| !by_instance.contains_key(id.as_str()))
            .cloned(),
    );
    let mut failures = Vec::new();
    let out_of_service = MarkAs::OutOfService { taint };
    let chosen = (mark_plan.mark.iter().map(|id| (id, out_of_service)))
        .chain(mark_plan.kept.iter().map(|id| (id, MarkAs::Outdated)));
    for (instance_id, mark_as) in chosen {
        if let Some(node) = by_instance.get(instance_id.as_str()) {
            let target = MarkTarget {
                node,
                instance_id,
                mark_as,
            };
            mark_one(nodes, target, event, report, &mut failures).await;
        }
    }
    for node in &listed {
        let Some(marks) = refresh_marks_of(node) else {
            continue;
        };
        let stale = marks.auto_scaling_group_name == event.group_name
            && marks.instance_refresh_id != event.instance_refresh_id
            && !mark_plan.mark.contains(&marks.instance_id)
            && !mark_plan.kept.contains(&marks.instance_id);
        if stale {
            let refresh_id = &marks.instance_refresh_id;
            unmark_one(nodes, node, refresh_id, report, &mut failures).await;
        }
    }
    Ok(failures)
}

/// One node to mark, and how.
struct MarkTarget<'a> {
    node: &'a Node,
    instance_id: &'a str,
    mark_as: MarkAs<'a>,
}

/// The pods that hold a place on a node: bound to one and not finished (the selector
/// cluster-autoscaler's lister of scheduled pods uses). The room rule counts no other pod,
/// so a cluster's finished Jobs and its pods waiting for a node are not transferred.
const PLACED_PODS: &str = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// The room rule's decision on `outdated` among the `listed` nodes. The pods are listed
/// only when the decision needs them ([`decision_needs_pods`]): once every outdated node is
/// out of service, a plan lists no pods.
///
/// The nodes of the group's `leaving` instances are no room, and their pods are about to
/// move too: they claim room first, as the outdated nodes already out of service do, and
/// the decision names them only if they are outdated. The nodes other groups' refreshes
/// replace count the same way ([`OtherRefreshes`]).
async fn decide(
    pods: &Api<Pod>,
    listed: &[Node],
    outdated: &BTreeMap<&str, Option<jiff::Timestamp>>,
    leaving: &BTreeSet<&str>,
    group_name: &str,
) -> Result<RoomDecision, RefreshError> {
    let mut moving = outdated.clone();
    for id in leaving {
        moving.entry(id).or_insert(None);
    }
    let placed = if decision_needs_pods(listed, &moving) {
        tally_placed_pods(pods).await?
    } else {
        PodTally::default()
    };
    let others = OtherRefreshes::on(listed, group_name);
    for id in others.leaving.iter().chain(&others.outdated_only) {
        moving.entry(id).or_insert(None);
    }
    let (room, mut moving_nodes) = survey(listed, &placed, &moving);
    moving_nodes.retain(|node| !others.outdated_only.contains(node.instance_id.as_str()));
    for node in &mut moving_nodes {
        let id = node.instance_id.as_str();
        node.out_of_service |= leaving.contains(id) || others.leaving.contains(id);
    }
    let mut decision = choose(room, &moving_nodes);
    let is_outdated = |id: &String| outdated.contains_key(id.as_str());
    decision.mark.retain(is_outdated);
    decision.kept.retain(is_outdated);
    Ok(decision)
}

/// The nodes that other groups' instance refreshes replace, as their records on the nodes
/// say. Two groups refreshing at once share the room: the nodes another refresh took out of
/// service claim room first, as this group's leaving nodes do (their pods move next), and
/// the ones it only marked outdated are no room (they go too; counting them as room, or
/// its leaving nodes' pods as needing none, counts the same room twice).
struct OtherRefreshes<'a> {
    leaving: BTreeSet<&'a str>,
    outdated_only: BTreeSet<&'a str>,
}

impl<'a> OtherRefreshes<'a> {
    fn on(listed: &'a [Node], group_name: &str) -> Self {
        let mut others = Self {
            leaving: BTreeSet::new(),
            outdated_only: BTreeSet::new(),
        };
        for node in listed {
            let Some(instance_id) = node_instance_id(node) else {
                continue;
            };
            match refresh_marks_of(node) {
                Some(marks) if marks.auto_scaling_group_name != group_name => {
                    if marks.outdated_only {
                        others.outdated_only.insert(instance_id);
                    } else {
                        others.leaving.insert(instance_id);
                    }
                }
                _ => {}
            }
        }
        others
    }
}

/// Tallies the pods placed on nodes page by page ([`PodTally`]): at most one page of pods
/// is held at a time.
async fn tally_placed_pods(pods: &Api<Pod>) -> Result<PodTally, RefreshError> {
    let params = ListParams::default().fields(PLACED_PODS).limit(PAGE_SIZE);
    let mut pages = Pages::new(pods.clone(), params);
    let mut tally = PodTally::default();
    while let Some(page) = pages.next().await.map_err(RefreshError::ListPods)? {
        page.iter().for_each(|pod| tally.add(pod));
    }
    Ok(tally)
}

async fn mark_one(
    nodes: &Api<Node>,
    target: MarkTarget<'_>,
    event: &RefreshEvent,
    report: &mut RefreshReport,
    failures: &mut Vec<String>,
) {
    let MarkTarget {
        node,
        instance_id,
        mark_as,
    } = target;
    let name = node.metadata.name.clone().unwrap_or_default();
    let refresh_id = &event.instance_refresh_id;
    let group = &event.group_name;
    match mark_node(nodes, node.clone(), refresh_id, group, instance_id, mark_as).await {
        Ok(Marked::Marked(marks)) if marks.outdated_only => report.outdated.push(name),
        Ok(Marked::Marked(_)) => report.marked.push(name),
        Ok(Marked::Draining) => report.draining.push(name),
        Ok(Marked::NodeGone) => report.without_node.push(instance_id.to_owned()),
        Err(error) => failures.push(format!("marking node {name}: {error}")),
    }
}

/// Undoes this refresh's marks on every node labelled with it.
pub(super) async fn unmark_refresh(
    nodes: &Api<Node>,
    event: &RefreshEvent,
    report: &mut RefreshReport,
) -> Result<Vec<String>, RefreshError> {
    let selector = format!("{REFRESH_LABEL}={}", event.instance_refresh_id);
    let labelled = list_nodes(nodes, ListParams::default().labels(&selector)).await?;
    let mut failures = Vec::new();
    for node in &labelled {
        unmark_one(
            nodes,
            node,
            &event.instance_refresh_id,
            report,
            &mut failures,
        )
        .await;
    }
    Ok(failures)
}

async fn unmark_one(
    nodes: &Api<Node>,
    node: &Node,
    refresh_id: &str,
    report: &mut RefreshReport,
    failures: &mut Vec<String>,
) {
    let name = node.metadata.name.clone().unwrap_or_default();
    match remove_refresh_marks(nodes, node.clone(), refresh_id).await {
        Ok(Some(undone)) => report.unmarked.push(UnmarkedNode {
            node: name,
            instance_refresh_id: refresh_id.to_owned(),
            undone,
        }),
        Ok(None) => {}
        Err(error) => failures.push(format!("undoing the marks on node {name}: {error}")),
    }
}
