//! The Node writes of a refresh: mark the plan's nodes at the start, undo the refresh's
//! marks at its end. Each write is one conditional patch ([`crate::node_marks::refresh`]);
//! a failed write is collected, not fatal, so the other nodes are still written.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, ListParams};

use super::event::RefreshEvent;
use super::handler::{RefreshError, RefreshReport, UnmarkedNode};
use super::plan::MarkPlan;
use crate::lifecycle::node::node_instance_id;
use crate::node_marks::refresh::{Marked, REFRESH_LABEL, mark_node, refresh_marks_of, unmark_node};

/// Nodes per page of the list.
const NODE_PAGE_SIZE: u32 = 500;

/// Every node, page by page.
pub(super) async fn list_nodes(
    nodes: &Api<Node>,
    params: ListParams,
) -> Result<Vec<Node>, RefreshError> {
    let mut params = params.limit(NODE_PAGE_SIZE);
    let mut all = Vec::new();
    loop {
        let page = nodes.list(&params).await.map_err(RefreshError::ListNodes)?;
        all.extend(page.items);
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(all),
        }
    }
}

/// Marks the plan's nodes; undoes the marks of an earlier refresh of this group (whose end
/// was missed) on the group's nodes this one does not mark.
pub(super) async fn mark_outdated(
    nodes: &Api<Node>,
    event: &RefreshEvent,
    mark_plan: &MarkPlan,
    taint: Option<&Taint>,
    report: &mut RefreshReport,
) -> Result<Vec<String>, RefreshError> {
    let listed = list_nodes(nodes, ListParams::default()).await?;
    let mut by_instance: BTreeMap<&str, &Node> = BTreeMap::new();
    for node in &listed {
        if let Some(instance_id) = node_instance_id(node) {
            by_instance.insert(instance_id, node);
        }
    }
    let mut failures = Vec::new();
    for instance_id in &mark_plan.mark {
        let Some(node) = by_instance.get(instance_id.as_str()) else {
            report.without_node.push(instance_id.clone());
            continue;
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        match mark_node(
            nodes,
            (*node).clone(),
            &event.instance_refresh_id,
            &event.group_name,
            instance_id,
            taint,
        )
        .await
        {
            Ok(Marked::Marked(_)) => report.marked.push(name),
            Ok(Marked::Draining) => report.draining.push(name),
            Ok(Marked::NodeGone) => report.without_node.push(instance_id.clone()),
            Err(error) => failures.push(format!("marking node {name}: {error}")),
        }
    }
    for node in &listed {
        let Some(marks) = refresh_marks_of(node) else {
            continue;
        };
        let stale = marks.auto_scaling_group_name == event.group_name
            && marks.instance_refresh_id != event.instance_refresh_id
            && !mark_plan.mark.contains(&marks.instance_id);
        if stale {
            unmark_one(
                nodes,
                node,
                &marks.instance_refresh_id,
                report,
                &mut failures,
            )
            .await;
        }
    }
    Ok(failures)
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
    match unmark_node(nodes, node.clone(), refresh_id).await {
        Ok(Some(undone)) => report.unmarked.push(UnmarkedNode {
            node: name,
            instance_refresh_id: refresh_id.to_owned(),
            undone,
        }),
        Ok(None) => {}
        Err(error) => failures.push(format!("undoing the marks on node {name}: {error}")),
    }
}
