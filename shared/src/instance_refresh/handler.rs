//! One refresh event: check it, prove it with Auto Scaling, then mark the outdated nodes
//! (start) or undo our marks on the nodes that stay (end).
//!
//! Requests: one `DescribeAutoScalingGroups` (scope, configuration, instances) and one
//! `DescribeInstanceRefreshes` per event; at the start a paged list of the Nodes and one
//! conditional patch per node to mark; at the end a list of the Nodes labelled with the
//! refresh and one patch per node to restore. Every write is idempotent (a duplicate or
//! retried event finds its marks in place and writes nothing), so a failed invocation is
//! simply retried by Lambda's asynchronous invocation.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde::Serialize;
use serde_json::Value;

use super::FUNCTION_NAME;
use super::event::{RefreshEvent, RefreshEventError, RefreshEventKind};
use super::plan::{MarkPlan, plan};
use super::settings::RefreshSettings;
use crate::aws::{AwsError, InstanceRefreshes};
use crate::cluster::ClusterAccessError;
use crate::cluster::connection::KubeConnection;
use crate::diagnostic::{FunctionError, diagnostic};
use crate::lifecycle::node::node_instance_id;
use crate::lifecycle::scope::{GroupScope, ScopeDecision};
use crate::node_marks::out_of_service::Undone;
use crate::node_marks::refresh::{Marked, REFRESH_LABEL, mark_node, refresh_marks_of, unmark_node};
use crate::telemetry::{MetricSet, Unit};

/// Nodes per page of the list.
const NODE_PAGE_SIZE: u32 = 500;

/// Everything an invocation needs, built once per execution environment.
pub struct RefreshContext<K, A> {
    pub kube: K,
    pub autoscaling: A,
    pub settings: RefreshSettings,
}

/// Why an invocation failed (Lambda retries it; every write is idempotent).
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("{0}")]
    BadEvent(#[from] RefreshEventError),
    #[error("cannot read Auto Scaling: {0}")]
    Describe(#[source] AwsError),
    #[error(
        "Auto Scaling knows no instance refresh {instance_refresh_id} of group {group}: nothing written"
    )]
    RefreshUnknown {
        instance_refresh_id: String,
        group: String,
    },
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[from] ClusterAccessError),
    #[error("cannot list the nodes: {0}")]
    ListNodes(#[source] kube::Error),
    #[error("{} node write(s) failed: {}", failures.len(), failures.join("; "))]
    Writes { failures: Vec<String> },
}

impl FunctionError for RefreshError {
    fn kind(&self) -> &'static str {
        match self {
            Self::BadEvent(_) => "InvalidEvent",
            Self::Describe(_) => "DescribeAutoScalingFailed",
            Self::RefreshUnknown { .. } => "InstanceRefreshUnknown",
            Self::Cluster(_) => "ClusterAccessFailed",
            Self::ListNodes(_) => "ListNodesFailed",
            Self::Writes { .. } => "NodeWritesFailed",
        }
    }
}

impl From<RefreshError> for lambda_runtime::Diagnostic {
    fn from(error: RefreshError) -> Self {
        diagnostic(&error)
    }
}

/// A node whose refresh marks were undone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnmarkedNode {
    pub node: String,
    pub instance_refresh_id: String,
    #[serde(flatten)]
    pub undone: Undone,
}

/// The invocation's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefreshReport {
    pub event: RefreshEventKind,
    pub instance_refresh_id: String,
    pub auto_scaling_group_name: String,
    /// `Marked`, `Unmarked`, `Ignored`, `NotOurs`, `Stale`.
    pub outcome: &'static str,
    /// In words, for people.
    pub why: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<MarkPlan>,
    /// Nodes marked (or found marked) for this refresh.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub marked: Vec<String>,
    /// Nodes whose drain had begun: their marks are the drain's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<String>,
    /// Outdated instances with no node (not registered, or gone).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub without_node: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unmarked: Vec<UnmarkedNode>,
}

impl RefreshReport {
    fn new(event: &RefreshEvent, outcome: &'static str, why: String) -> Self {
        Self {
            event: event.kind,
            instance_refresh_id: event.instance_refresh_id.clone(),
            auto_scaling_group_name: event.group_name.clone(),
            outcome,
            why,
            plan: None,
            marked: Vec::new(),
            draining: Vec::new(),
            without_node: Vec::new(),
            unmarked: Vec::new(),
        }
    }

    fn emit_metrics(&self) {
        MetricSet::new(FUNCTION_NAME)
            .dimension("Outcome", self.outcome)
            .metric("NodesMarked", self.marked.len() as f64, Unit::Count)
            .metric("NodesUnmarked", self.unmarked.len() as f64, Unit::Count)
            .property("AutoScalingGroupName", self.auto_scaling_group_name.clone())
            .property("InstanceRefreshId", self.instance_refresh_id.clone())
            .emit();
    }
}

/// Handles one event. `function_account`: this function's account (from its ARN), `None`
/// to skip the account check (local runs).
pub async fn handle<K, A>(
    ctx: &RefreshContext<K, A>,
    payload: &Value,
    function_account: Option<&str>,
) -> Result<RefreshReport, RefreshError>
where
    K: KubeConnection,
    A: InstanceRefreshes,
{
    let event = RefreshEvent::parse(payload).inspect_err(|error| {
        tracing::warn!(%error, "refusing the event: nothing written");
    })?;
    let report = Box::pin(handle_event(ctx, &event, function_account)).await?;
    tracing::info!(
        event = ?report.event,
        instance_refresh_id = %report.instance_refresh_id,
        group = %report.auto_scaling_group_name,
        outcome = report.outcome,
        marked = report.marked.len(),
        unmarked = report.unmarked.len(),
        "{}",
        report.why
    );
    report.emit_metrics();
    Ok(report)
}

async fn handle_event<K, A>(
    ctx: &RefreshContext<K, A>,
    event: &RefreshEvent,
    function_account: Option<&str>,
) -> Result<RefreshReport, RefreshError>
where
    K: KubeConnection,
    A: InstanceRefreshes,
{
    if event.kind == RefreshEventKind::CheckpointReached {
        return Ok(RefreshReport::new(
            event,
            "Ignored",
            "a checkpoint changes nothing on the nodes".to_owned(),
        ));
    }
    let group = ctx
        .autoscaling
        .describe_group_configuration(&event.group_name)
        .await
        .map_err(RefreshError::Describe)?;
    let scope = GroupScope::new(
        ctx.settings.cluster.clone(),
        ctx.settings.allowed_groups.clone(),
        None,
    );
    let decision = scope.decide_with_tags(
        function_account,
        &event.account,
        &event.group_name,
        group.as_ref().map(|g| &g.tags),
    );
    let (ScopeDecision::Ours { .. }, Some(group)) = (&decision, group) else {
        let why = match decision {
            ScopeDecision::Foreign(reason) => format!("not this cluster's group: {reason}"),
            ScopeDecision::Ours { .. } => "the group does not exist (any more)".to_owned(),
        };
        return Ok(RefreshReport::new(event, "NotOurs", why));
    };
    let refresh = ctx
        .autoscaling
        .describe_instance_refresh(&event.group_name, &event.instance_refresh_id)
        .await
        .map_err(RefreshError::Describe)?
        .ok_or_else(|| RefreshError::RefreshUnknown {
            instance_refresh_id: event.instance_refresh_id.clone(),
            group: event.group_name.clone(),
        })?;
    if !event.kind.proven_by(&refresh.status) {
        return Ok(RefreshReport::new(
            event,
            "Stale",
            format!(
                "Auto Scaling reports the refresh {}, which this {:?} event does not describe (a late or repeated delivery): nothing written",
                refresh.status, event.kind
            ),
        ));
    }
    let client = ctx.kube.client().await?;
    let nodes: Api<Node> = Api::all(client);
    if event.kind.ends_replacement() {
        let mut report = RefreshReport::new(event, "Unmarked", String::new());
        let failures = Box::pin(unmark_refresh(&nodes, event, &mut report)).await?;
        report.why = format!(
            "refresh {}: our marks undone on {} node(s) that stay",
            refresh.status,
            report.unmarked.len()
        );
        return finish(report, failures);
    }
    let mark_plan = plan(&refresh, &group);
    let mut report = RefreshReport::new(event, "Marked", String::new());
    let taint = ctx.settings.taint.as_ref().map(|t| t.to_taint());
    let failures = Box::pin(mark_outdated(
        &nodes,
        event,
        &mark_plan,
        taint.as_ref(),
        &mut report,
    ))
    .await?;
    report.why = format!(
        "{} of {} outdated node(s) taken out of service ({}; {} left schedulable as room)",
        report.marked.len(),
        mark_plan.outdated.len(),
        if mark_plan.launch_before_terminate {
            "launch before terminate: all at once"
        } else {
            "terminate first: one batch kept"
        },
        mark_plan.reserve.len()
    );
    report.plan = Some(mark_plan);
    finish(report, failures)
}

fn finish(report: RefreshReport, failures: Vec<String>) -> Result<RefreshReport, RefreshError> {
    if failures.is_empty() {
        Ok(report)
    } else {
        Err(RefreshError::Writes { failures })
    }
}

/// Every node, page by page.
async fn list_nodes(nodes: &Api<Node>, params: ListParams) -> Result<Vec<Node>, RefreshError> {
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
async fn mark_outdated(
    nodes: &Api<Node>,
    event: &RefreshEvent,
    mark_plan: &MarkPlan,
    taint: Option<&k8s_openapi::api::core::v1::Taint>,
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
async fn unmark_refresh(
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
