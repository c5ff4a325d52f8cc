//! One refresh event: check it, prove it with Auto Scaling, then mark the outdated nodes
//! (start, checkpoint) or undo our marks on the nodes that stay (end).
//!
//! Requests: one `DescribeAutoScalingGroups` (scope, configuration, instances) and one
//! `DescribeInstanceRefreshes` per event; at the start one `DescribeInstances` (launch
//! times), with `SkipMatching` one `DescribeLaunchTemplates` per template involved, a paged
//! list of the Nodes, one conditional patch per node to mark and one more
//! `DescribeInstanceRefreshes`; at the end a list of the Nodes labelled with the refresh and
//! one patch per node to restore. Every write is idempotent and the plan a function of what
//! Auto Scaling and EC2 say now, so a duplicate, late or retried event changes nothing more,
//! and a failed invocation is simply retried by Lambda's asynchronous invocation.

use serde::Serialize;
use serde_json::Value;

use super::FUNCTION_NAME;
use super::event::{RefreshEvent, RefreshEventError, RefreshEventKind};
use super::marking::{GroupFacts, mark_outdated, unmark_refresh};
use super::matching::{DesiredConfiguration, ResolvedVersions};
use super::plan::{LaunchFacts, MarkPlan, plan};
use super::settings::RefreshSettings;
use crate::aws::{
    AwsError, GroupConfiguration, InstanceRefreshDescription, InstanceRefreshes, RefreshInstances,
};
use crate::cluster::ClusterAccessError;
use crate::cluster::connection::KubeConnection;
use crate::diagnostic::{FunctionError, diagnostic};
use crate::lifecycle::scope::{GroupScope, ScopeDecision};
use crate::node_marks::out_of_service::Undone;
use crate::retry::RetryPolicy;
use crate::telemetry::{MetricSet, Unit};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;

/// How long an end event waits for Auto Scaling to report the status it announces (the
/// event can run ahead of `DescribeInstanceRefreshes`): four reads within about four
/// seconds, then the invocation fails and Lambda retries it.
const END_STATUS_READS: RetryPolicy = RetryPolicy {
    max_attempts: 4,
    base_delay: std::time::Duration::from_millis(500),
    max_delay: std::time::Duration::from_secs(2),
};

/// Everything an invocation needs, built once per execution environment.
pub struct RefreshContext<K, A, E> {
    pub kube: K,
    pub autoscaling: A,
    pub ec2: E,
    pub settings: RefreshSettings,
}

/// Why an invocation failed (Lambda retries it; every write is idempotent).
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("{0}")]
    BadEvent(#[from] RefreshEventError),
    #[error("cannot read Auto Scaling: {0}")]
    Describe(#[source] AwsError),
    #[error("cannot read EC2: {0}")]
    DescribeEc2(#[source] AwsError),
    #[error(
        "Auto Scaling knows no instance refresh {instance_refresh_id} of group {group}: nothing written"
    )]
    RefreshUnknown {
        instance_refresh_id: String,
        group: String,
    },
    #[error(
        "the {kind:?} event of refresh {instance_refresh_id} came before Auto Scaling reports its end (status {status}): nothing undone yet, retry"
    )]
    NotFinalYet {
        kind: RefreshEventKind,
        instance_refresh_id: String,
        status: String,
    },
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[from] ClusterAccessError),
    #[error("cannot list the nodes: {0}")]
    ListNodes(#[source] kube::Error),
    #[error("cannot list the pods: {0}")]
    ListPods(#[source] kube::Error),
    #[error("{} node write(s) failed: {}", failures.len(), failures.join("; "))]
    Writes { failures: Vec<String> },
}

impl FunctionError for RefreshError {
    fn kind(&self) -> &'static str {
        match self {
            Self::BadEvent(_) => "InvalidEvent",
            Self::Describe(_) => "DescribeAutoScalingFailed",
            Self::DescribeEc2(_) => "DescribeEc2Failed",
            Self::RefreshUnknown { .. } => "InstanceRefreshUnknown",
            Self::NotFinalYet { .. } => "InstanceRefreshNotFinal",
            Self::Cluster(_) => "ClusterAccessFailed",
            Self::ListNodes(_) => "ListNodesFailed",
            Self::ListPods(_) => "ListPodsFailed",
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
    /// `Marked`, `Unmarked`, `NotOurs`, `Stale`, `NoRefresh` (an instance event for a
    /// group with no refresh in progress).
    pub outcome: &'static str,
    /// In words, for people.
    pub why: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<MarkPlan>,
    /// Nodes marked (or found marked) for this refresh: out of service.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub marked: Vec<String>,
    /// Nodes marked outdated only (or found so): schedulable, with the `PreferNoSchedule`
    /// taint `open-node-manager.io/outdated`, until there is room for their pods.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outdated: Vec<String>,
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
    pub(super) fn new(event: &RefreshEvent, outcome: &'static str, why: String) -> Self {
        Self {
            event: event.kind,
            instance_refresh_id: event.instance_refresh_id.clone(),
            auto_scaling_group_name: event.group_name.clone(),
            outcome,
            why,
            plan: None,
            marked: Vec::new(),
            outdated: Vec::new(),
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
pub async fn handle<K, A, E>(
    ctx: &RefreshContext<K, A, E>,
    payload: &Value,
    function_account: Option<&str>,
) -> Result<RefreshReport, RefreshError>
where
    K: KubeConnection,
    A: InstanceRefreshes,
    E: RefreshInstances,
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

async fn handle_event<K, A, E>(
    ctx: &RefreshContext<K, A, E>,
    event: &RefreshEvent,
    function_account: Option<&str>,
) -> Result<RefreshReport, RefreshError>
where
    K: KubeConnection,
    A: InstanceRefreshes,
    E: RefreshInstances,
{
    let group = match our_group(ctx, event, function_account).await? {
        Ok(group) => group,
        Err(why) => return Ok(RefreshReport::new(event, "NotOurs", why)),
    };
    let (event, refresh) = if event.kind.names_an_instance() {
        match ctx
            .autoscaling
            .active_instance_refresh(&event.group_name)
            .await
            .map_err(RefreshError::Describe)?
        {
            Some(refresh) => {
                let mut resolved = event.clone();
                resolved.instance_refresh_id = refresh.instance_refresh_id.clone();
                (resolved, refresh)
            }
            None => return Ok(RefreshReport::new(event, "NoRefresh", no_refresh(event))),
        }
    } else {
        (
            event.clone(),
            describe_refresh(&ctx.autoscaling, event).await?,
        )
    };
    let event = &event;
    if event.kind.ends_replacement() {
        let refresh = await_announced_status(&ctx.autoscaling, event, refresh).await?;
        return Box::pin(undo_marks(ctx, event, &refresh.status)).await;
    }
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
    Box::pin(mark_refresh(ctx, event, &refresh, &group)).await
}

fn no_refresh(event: &RefreshEvent) -> String {
    format!(
        "{:?} of {} in group {}: no refresh in progress, nothing to plan",
        event.kind,
        event.instance_id.as_deref().unwrap_or("an instance"),
        event.group_name
    )
}

/// The event's group when it is this cluster's; else why not (nothing is written).
async fn our_group<K, A, E>(
    ctx: &RefreshContext<K, A, E>,
    event: &RefreshEvent,
    function_account: Option<&str>,
) -> Result<Result<GroupConfiguration, String>, RefreshError>
where
    A: InstanceRefreshes,
{
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
    Ok(match (decision, group) {
        (ScopeDecision::Ours { .. }, Some(group)) => Ok(group),
        (ScopeDecision::Foreign(reason), _) => Err(format!("not this cluster's group: {reason}")),
        (ScopeDecision::Ours { .. }, None) => Err("the group does not exist (any more)".to_owned()),
    })
}

async fn describe_refresh<A: InstanceRefreshes>(
    autoscaling: &A,
    event: &RefreshEvent,
) -> Result<InstanceRefreshDescription, RefreshError> {
    autoscaling
        .describe_instance_refresh(&event.group_name, &event.instance_refresh_id)
        .await
        .map_err(RefreshError::Describe)?
        .ok_or_else(|| RefreshError::RefreshUnknown {
            instance_refresh_id: event.instance_refresh_id.clone(),
            group: event.group_name.clone(),
        })
}

/// The refresh once Auto Scaling reports the status the end event announces, read again a
/// few times within seconds ([`END_STATUS_READS`]). Still not: the invocation fails, so
/// Lambda retries it (twice, minutes apart) instead of dropping the end as stale.
async fn await_announced_status<A: InstanceRefreshes>(
    autoscaling: &A,
    event: &RefreshEvent,
    mut refresh: InstanceRefreshDescription,
) -> Result<InstanceRefreshDescription, RefreshError> {
    let mut attempt = 0;
    while !event.kind.proven_by(&refresh.status) {
        if attempt + 1 >= END_STATUS_READS.max_attempts {
            return Err(RefreshError::NotFinalYet {
                kind: event.kind,
                instance_refresh_id: event.instance_refresh_id.clone(),
                status: refresh.status,
            });
        }
        tokio::time::sleep(END_STATUS_READS.delay(attempt)).await;
        attempt += 1;
        refresh = describe_refresh(autoscaling, event).await?;
    }
    Ok(refresh)
}

/// The end: our marks undone on every node labelled with the refresh.
async fn undo_marks<K, A, E>(
    ctx: &RefreshContext<K, A, E>,
    event: &RefreshEvent,
    status: &str,
) -> Result<RefreshReport, RefreshError>
where
    K: KubeConnection,
{
    let client = ctx.kube.client().await?;
    let nodes: Api<Node> = Api::all(client);
    let mut report = RefreshReport::new(event, "Unmarked", String::new());
    let failures = Box::pin(unmark_refresh(&nodes, event, &mut report)).await?;
    report.why = format!(
        "refresh {status}: our marks undone on {} node(s) that stay",
        report.unmarked.len()
    );
    finish(report, failures)
}

/// The start, a checkpoint, or an instance in or out of service: the outdated nodes the
/// room rule chooses are marked. Then the refresh is read again: if
/// it ended meanwhile, its end may have listed the labelled nodes before these writes, so
/// the marks just written are undone here (an end's list either sees a mark, or the mark
/// was written after the end was final and this read sees the end).
pub async fn mark_refresh<K, A, E>(
    ctx: &RefreshContext<K, A, E>,
    event: &RefreshEvent,
    refresh: &InstanceRefreshDescription,
    group: &GroupConfiguration,
) -> Result<RefreshReport, RefreshError>
where
    K: KubeConnection,
    A: InstanceRefreshes,
    E: RefreshInstances,
{
    let facts = launch_facts(&ctx.ec2, refresh, group).await?;
    let mut mark_plan = plan(refresh, group, &facts);
    let client = ctx.kube.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client);
    let mut report = RefreshReport::new(event, "Marked", String::new());
    let taint = ctx.settings.taint.as_ref().map(|t| t.to_taint());
    let mut failures = Box::pin(mark_outdated(
        &nodes,
        &pods,
        event,
        &mut mark_plan,
        &GroupFacts::new(group, &facts.launch_times),
        taint.as_ref(),
        &mut report,
    ))
    .await?;
    let now = describe_refresh(&ctx.autoscaling, event).await?;
    if !RefreshEventKind::Started.proven_by(&now.status) {
        failures.extend(Box::pin(unmark_refresh(&nodes, event, &mut report)).await?);
        report.outcome = "Unmarked";
        report.why = format!(
            "the refresh ended ({}) while its nodes were being marked: our marks undone on {} node(s)",
            now.status,
            report.unmarked.len()
        );
        return finish(report, failures);
    }
    report.why = format!(
        "{} of {} outdated node(s) out of service ({} being drained), as far as the room the refresh does not replace takes their pods; {} left schedulable until there is room for their pods; {} outdated instance(s) without a node",
        report.marked.len(),
        mark_plan.outdated.len(),
        report.draining.len(),
        mark_plan.kept.len(),
        report.without_node.len(),
    );
    report.plan = Some(mark_plan);
    finish(report, failures)
}

/// What EC2 says for the plan: the launch times of the group's instances, and, with
/// `SkipMatching`, what the symbolic versions of the templates involved stand for.
async fn launch_facts<E: RefreshInstances>(
    ec2: &E,
    refresh: &InstanceRefreshDescription,
    group: &GroupConfiguration,
) -> Result<LaunchFacts, RefreshError> {
    let ids: Vec<String> = group
        .instances
        .iter()
        .map(|i| i.instance_id.clone())
        .collect();
    let launch_times = if ids.is_empty() || refresh.start_time.is_none() {
        Default::default()
    } else {
        ec2.launch_times(&ids)
            .await
            .map_err(RefreshError::DescribeEc2)?
    };
    let mut versions = ResolvedVersions::default();
    if refresh.skip_matching {
        let mut templates: Vec<_> = DesiredConfiguration::of(refresh, group)
            .templates()
            .into_iter()
            .chain(
                group
                    .instances
                    .iter()
                    .filter_map(|i| i.launch_template.as_ref()),
            )
            .map(|t| crate::aws::LaunchTemplateRef {
                version: None,
                ..t.clone()
            })
            .collect();
        templates.sort_by(|a, b| (&a.id, &a.name).cmp(&(&b.id, &b.name)));
        templates
            .dedup_by(|a, b| a.id.is_some() && a.id == b.id || a.id.is_none() && a.name == b.name);
        versions.templates = ec2
            .launch_template_versions(&templates)
            .await
            .map_err(RefreshError::DescribeEc2)?;
    }
    Ok(LaunchFacts {
        launch_times,
        versions,
    })
}

fn finish(report: RefreshReport, failures: Vec<String>) -> Result<RefreshReport, RefreshError> {
    if failures.is_empty() {
        Ok(report)
    } else {
        Err(RefreshError::Writes { failures })
    }
}
