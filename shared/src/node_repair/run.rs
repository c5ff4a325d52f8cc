//! One scheduled run: read the Nodes and their instances, decide per group, act, report.
//!
//! Requests per run: the Node list (pages of [`NODE_PAGE_SIZE`]), one
//! `DescribeAutoScalingInstances` per 50 instances, one `DescribeAutoScalingGroups` per 50
//! groups, and per repair one annotation patch, one AWS action and one Event. Nothing is
//! cached between runs: every decision rests on what this run saw.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde::Serialize;
use serde_json::{Value, json};

use crate::aws::{AwsError, GroupInstance, InstanceHealth, InstanceReboot};
use crate::cluster::ClusterAccessError;
use crate::cluster::connection::KubeConnection;
use crate::diagnostic::{FunctionError, diagnostic};
use crate::drain::checkpoint::CHECKPOINT_ANNOTATION;
use crate::drain::events::{DrainEvents, truncate_note};
use crate::lifecycle::node::node_instance_id;
use crate::lifecycle::scope::{ScopeDecision, decide_by_tags};
use crate::telemetry::{MetricSet, Unit};

use super::FUNCTION_NAME;
use super::decision::{
    GroupObservation, NodeObservation, ObservedCondition, Verdict, decide_group,
};
use super::memory::{REPAIR_ANNOTATION, RepairRecord};
use super::policy::RepairAction;
use super::settings::RepairSettings;

/// Nodes per page of the list.
pub const NODE_PAGE_SIZE: u32 = 500;

/// The label EKS puts on the nodes of a managed node group (which EKS repairs itself).
pub const MANAGED_NODEGROUP_LABEL: &str = "eks.amazonaws.com/nodegroup";
/// The label Karpenter puts on its nodes (Karpenter repairs them itself).
pub const KARPENTER_NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";

/// Event reasons.
pub mod reason {
    pub const NODE_REPAIR_STARTED: &str = "NodeRepairStarted";
    pub const NODE_REPAIR_PAUSED: &str = "NodeRepairPaused";
}

/// Everything a run needs, built once per execution environment.
pub struct RepairContext<K, H, R> {
    pub kube: K,
    pub health: H,
    pub reboot: R,
    pub settings: RepairSettings,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[from] ClusterAccessError),
    #[error("cannot list the nodes: {0}")]
    ListNodes(#[source] kube::Error),
    #[error("cannot read the Auto Scaling groups: {0}")]
    Describe(#[source] AwsError),
    #[error("{} of {attempted} repairs failed: {}", failures.len(), failures.join("; "))]
    Repairs {
        attempted: usize,
        failures: Vec<String>,
    },
}

impl FunctionError for RepairError {
    fn kind(&self) -> &'static str {
        match self {
            Self::Cluster(_) => "ClusterAccessFailed",
            Self::ListNodes(_) => "ListNodesFailed",
            Self::Describe(_) => "DescribeAutoScalingFailed",
            Self::Repairs { .. } => "RepairsFailed",
        }
    }
}

impl From<RepairError> for lambda_runtime::Diagnostic {
    fn from(error: RepairError) -> Self {
        diagnostic(&error)
    }
}

/// What the run did about one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_scaling_group: Option<String>,
    /// `Healthy`, `Waiting`, `Repair`, `Paused`, ... or `NotOurs`.
    pub outcome: String,
    /// In words, for people.
    pub why: String,
    /// The verdict's details (problem, action, limit, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// For `Repair`: whether the action was taken (`false` in a dry run or on failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acted: Option<bool>,
}

/// The run's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairReport {
    pub dry_run: bool,
    pub nodes: Vec<NodeReport>,
    pub groups: Vec<GroupSummary>,
    /// Pages of the Node list read.
    pub node_pages: u32,
}

/// One group's totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupSummary {
    pub group: String,
    pub nodes: usize,
    pub unhealthy: usize,
    pub in_flight: usize,
    pub repairs_started: usize,
    pub repairs_paused: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,
}

/// Why a node is left out before any decision.
fn not_ours(node: &str, why: String) -> NodeReport {
    NodeReport {
        node: node.to_owned(),
        instance_id: None,
        auto_scaling_group: None,
        outcome: "NotOurs".to_owned(),
        why,
        verdict: None,
        acted: None,
    }
}

/// Runs once. The event (an EventBridge schedule) carries nothing the run needs.
pub async fn handle<K, H, R>(
    ctx: &RepairContext<K, H, R>,
    _event: Value,
) -> Result<RepairReport, RepairError>
where
    K: KubeConnection,
    H: InstanceHealth,
    R: InstanceReboot,
{
    let client = ctx.kube.client().await?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    // Boxed sub-futures keep this future's type shallow (the compiler's layout query depth).
    let (nodes, node_pages) = Box::pin(list_nodes(&nodes_api)).await?;

    // Which nodes may be ours: an EC2 instance, not a managed node group's, not Karpenter's.
    let mut reports = Vec::new();
    let mut candidates: Vec<(&Node, String)> = Vec::new();
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.as_ref();
        if let Some(ng) = labels.and_then(|l| l.get(MANAGED_NODEGROUP_LABEL)) {
            reports.push(not_ours(
                &name,
                format!(
                    "managed node group {ng} (label {MANAGED_NODEGROUP_LABEL}): EKS repairs it"
                ),
            ));
        } else if let Some(pool) = labels.and_then(|l| l.get(KARPENTER_NODEPOOL_LABEL)) {
            reports.push(not_ours(&name, format!("Karpenter node pool {pool} (label {KARPENTER_NODEPOOL_LABEL}): Karpenter repairs it")));
        } else if let Some(instance) = node_instance_id(node) {
            candidates.push((node, instance.to_owned()));
        } else {
            reports.push(not_ours(
                &name,
                "spec.providerID names no EC2 instance".to_owned(),
            ));
        }
    }

    let ids: Vec<String> = candidates.iter().map(|(_, id)| id.clone()).collect();
    let memberships: BTreeMap<String, GroupInstance> = if ids.is_empty() {
        BTreeMap::new()
    } else {
        ctx.health
            .describe_group_instances(&ids)
            .await
            .map_err(RepairError::Describe)?
            .into_iter()
            .map(|m| (m.instance_id.clone(), m))
            .collect()
    };
    let group_names: Vec<String> = memberships
        .values()
        .map(|m| m.auto_scaling_group_name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let groups: BTreeMap<String, _> = if group_names.is_empty() {
        BTreeMap::new()
    } else {
        ctx.health
            .describe_group_health_settings(&group_names)
            .await
            .map_err(RepairError::Describe)?
            .into_iter()
            .map(|g| (g.name.clone(), g))
            .collect()
    };

    let settings = &ctx.settings;
    let mut observed: BTreeMap<String, (GroupObservation, Vec<&Node>)> = BTreeMap::new();
    for (node, instance_id) in candidates {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(membership) = memberships.get(&instance_id) else {
            let mut report = not_ours(&name, "instance is in no Auto Scaling group".to_owned());
            report.instance_id = Some(instance_id);
            reports.push(report);
            continue;
        };
        let group_name = &membership.auto_scaling_group_name;
        let Some(group) = groups.get(group_name) else {
            let mut report = not_ours(&name, format!("Auto Scaling group {group_name} not found"));
            report.instance_id = Some(instance_id);
            reports.push(report);
            continue;
        };
        // The hooks' scope rules: the allow-list, else a tag naming this cluster.
        let scope = if settings.allowed_groups.iter().any(|g| g == group_name) {
            ScopeDecision::Ours {
                evidence: "AUTO_SCALING_GROUP_NAMES".to_owned(),
            }
        } else {
            decide_by_tags(&settings.cluster, &group.tags)
        };
        if let ScopeDecision::Foreign(reason) = scope {
            let mut report = not_ours(&name, format!("Auto Scaling group {group_name}: {reason}"));
            report.instance_id = Some(instance_id);
            report.auto_scaling_group = Some(group_name.clone());
            reports.push(report);
            continue;
        }
        let entry = observed.entry(group_name.clone()).or_insert_with(|| {
            (
                GroupObservation {
                    name: group_name.clone(),
                    health_check_grace_period: group.health_check_grace_period,
                    nodes: Vec::new(),
                },
                Vec::new(),
            )
        });
        entry
            .0
            .nodes
            .push(observe(node, name, instance_id, membership));
        entry.1.push(node);
    }

    let now = Timestamp::now();
    let recorder = (!settings.dry_run).then(|| {
        Recorder::new(
            client.clone(),
            Reporter {
                controller: format!("open-node-manager/{FUNCTION_NAME}"),
                instance: Some(
                    std::env::var("AWS_LAMBDA_FUNCTION_NAME")
                        .unwrap_or_else(|_| FUNCTION_NAME.to_owned()),
                ),
            },
        )
    });
    let mut summaries = Vec::new();
    let mut attempted = 0;
    let mut failures = Vec::new();
    for (observation, group_nodes) in observed.values() {
        let decision = decide_group(&settings.policy, observation, now);
        let mut started = 0;
        let mut paused = 0;
        for ((name, verdict), (seen, node)) in decision
            .verdicts
            .into_iter()
            .zip(observation.nodes.iter().zip(group_nodes))
        {
            let mut acted = None;
            match &verdict {
                Verdict::Repair {
                    problem,
                    action,
                    attempt,
                } => {
                    attempted += 1;
                    let record = RepairRecord {
                        action: *action,
                        at: now,
                        attempt: *attempt,
                        condition: problem.condition.clone(),
                        reason: problem.reason.clone(),
                    };
                    if settings.dry_run {
                        acted = Some(false);
                    } else {
                        match Box::pin(repair(ctx, &nodes_api, node, seen, &record)).await {
                            Ok(true) => {
                                started += 1;
                                acted = Some(true);
                                let note = format!(
                                    "{} since {}: {} (attempt {})",
                                    problem.describe(),
                                    problem.since,
                                    action.as_str(),
                                    attempt
                                );
                                Box::pin(publish(
                                    recorder.as_ref(),
                                    &name,
                                    node,
                                    EventType::Normal,
                                    reason::NODE_REPAIR_STARTED,
                                    note,
                                ))
                                .await;
                            }
                            Ok(false) => acted = Some(false),
                            Err(error) => {
                                acted = Some(false);
                                failures.push(format!("{name}: {error}"));
                            }
                        }
                    }
                }
                Verdict::Paused { problem, limit, .. } => {
                    paused += 1;
                    let note = format!(
                        "{} since {}: repairs of Auto Scaling group {} are paused by {limit}",
                        problem.describe(),
                        problem.since,
                        observation.name
                    );
                    Box::pin(publish(
                        recorder.as_ref(),
                        &name,
                        node,
                        EventType::Warning,
                        reason::NODE_REPAIR_PAUSED,
                        note,
                    ))
                    .await;
                }
                _ => {}
            }
            let report = NodeReport {
                node: name,
                instance_id: Some(seen.instance_id.clone()),
                auto_scaling_group: Some(observation.name.clone()),
                outcome: verdict.name().to_owned(),
                why: explain(&verdict, settings.dry_run),
                verdict: Some(verdict),
                acted,
            };
            log_decision(&report, settings.dry_run);
            reports.push(report);
        }
        let summary = GroupSummary {
            group: observation.name.clone(),
            nodes: decision.nodes,
            unhealthy: decision.unhealthy,
            in_flight: decision.in_flight,
            repairs_started: started,
            repairs_paused: paused,
            paused_by: decision.paused_by,
        };
        MetricSet::new(FUNCTION_NAME)
            .dimension("AutoScalingGroupName", &summary.group)
            .metric("UnhealthyNodes", summary.unhealthy as f64, Unit::Count)
            .metric(
                "RepairsStarted",
                summary.repairs_started as f64,
                Unit::Count,
            )
            .metric("RepairsPaused", summary.repairs_paused as f64, Unit::Count)
            .property("DryRun", settings.dry_run)
            .emit();
        summaries.push(summary);
    }
    for report in reports.iter().filter(|r| r.outcome == "NotOurs") {
        log_decision(report, settings.dry_run);
    }

    if !failures.is_empty() {
        return Err(RepairError::Repairs {
            attempted,
            failures,
        });
    }
    reports.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(RepairReport {
        dry_run: settings.dry_run,
        nodes: reports,
        groups: summaries,
        node_pages,
    })
}

async fn list_nodes(api: &Api<Node>) -> Result<(Vec<Node>, u32), RepairError> {
    let mut params = ListParams::default().limit(NODE_PAGE_SIZE);
    let mut nodes = Vec::new();
    let mut pages = 0;
    loop {
        let page = api.list(&params).await.map_err(RepairError::ListNodes)?;
        pages += 1;
        nodes.extend(page.items);
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((nodes, pages)),
        }
    }
}

fn observe(
    node: &Node,
    name: String,
    instance_id: String,
    membership: &GroupInstance,
) -> NodeObservation {
    let annotations = node.metadata.annotations.as_ref();
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|conditions| {
            conditions
                .iter()
                .map(|c| ObservedCondition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone().filter(|r| !r.is_empty()),
                    last_transition: c.last_transition_time.as_ref().map(|t| t.0),
                })
                .collect()
        })
        .unwrap_or_default();
    NodeObservation {
        node: name,
        instance_id,
        created_at: node.metadata.creation_timestamp.as_ref().map(|t| t.0),
        conditions,
        lifecycle_state: membership.lifecycle_state.clone(),
        health_status: membership.health_status.clone(),
        draining: annotations.is_some_and(|a| a.contains_key(CHECKPOINT_ANNOTATION)),
        last_repair: RepairRecord::from_annotation(
            annotations
                .and_then(|a| a.get(REPAIR_ANNOTATION))
                .map(String::as_str),
        ),
    }
}

/// Records the repair on the node, then acts. `Ok(false)`: the node changed since it was read
/// (another run got there first): nothing done, the next run decides again.
async fn repair<K, H, R>(
    ctx: &RepairContext<K, H, R>,
    api: &Api<Node>,
    node: &Node,
    seen: &NodeObservation,
    record: &RepairRecord,
) -> Result<bool, String>
where
    H: InstanceHealth,
    R: InstanceReboot,
{
    let name = &seen.node;
    // The record first, guarded by the resourceVersion read: of two concurrent runs only one
    // writes it, and only that one acts.
    let patch = json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": {REPAIR_ANNOTATION: record.to_annotation()},
        }
    });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            tracing::info!(node = %name, "node changed since it was read; its repair is left to the next run");
            return Ok(false);
        }
        Err(error) => return Err(format!("cannot record the repair on the node: {error}")),
    }
    let acted = match record.action {
        RepairAction::Replace => ctx.health.set_instance_unhealthy(&seen.instance_id).await,
        RepairAction::Reboot => ctx.reboot.reboot_instance(&seen.instance_id).await,
        RepairAction::NoAction => Ok(()),
    };
    if let Err(error) = acted {
        // Forget the record so the next run tries again rather than waiting for a repair
        // that never started. Best effort: a failure here only delays the retry.
        let previous = seen.last_repair.as_ref().map(RepairRecord::to_annotation);
        let undo = json!({"metadata": {"annotations": {REPAIR_ANNOTATION: previous}}});
        if let Err(undo_error) = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&undo))
            .await
        {
            tracing::warn!(node = %name, error = %undo_error, "could not remove the repair record after the failed action");
        }
        return Err(error.to_string());
    }
    Ok(true)
}

async fn publish(
    recorder: Option<&Recorder>,
    name: &str,
    node: &Node,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let Some(recorder) = recorder else {
        return;
    };
    let reference = DrainEvents::node_reference(name, node.metadata.uid.as_deref());
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate_note(note)),
        action: "Repair".to_owned(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &reference).await {
        tracing::warn!(node = %name, reason, %error, "could not record a Kubernetes Event (the repair goes on)");
    }
}

fn explain(verdict: &Verdict, dry_run: bool) -> String {
    match verdict {
        Verdict::Healthy => "no watched condition is unhealthy".to_owned(),
        Verdict::Draining => "our drain is working on it (cordoned on purpose)".to_owned(),
        Verdict::RepairInFlight { detail } => format!("repair under way: {detail}"),
        Verdict::NoAction { problem } => {
            format!("{}: reported only, no repair", problem.describe())
        }
        Verdict::Waiting {
            problem,
            action,
            repair_at,
        } => format!(
            "{} since {}: {} at {repair_at} if it lasts",
            problem.describe(),
            problem.since,
            action.as_str()
        ),
        Verdict::WithinGracePeriod { problem, until } => format!(
            "{}: the instance is within its group's health-check grace period until {until}",
            problem.describe()
        ),
        Verdict::Repair {
            problem,
            action,
            attempt,
        } => format!(
            "{} since {}: {}{} (attempt {attempt})",
            problem.describe(),
            problem.since,
            action.as_str(),
            if dry_run {
                " would start (dry run)"
            } else {
                " started"
            }
        ),
        Verdict::Paused { problem, limit, .. } => {
            format!("{}: repairs paused by {limit}", problem.describe())
        }
        Verdict::Queued { problem, limit, .. } => {
            format!("{}: waits for a repair slot, {limit}", problem.describe())
        }
    }
}

/// One log line per decision, with the fields a Logs Insights query filters on.
fn log_decision(report: &NodeReport, dry_run: bool) {
    let problem = report.verdict.as_ref().and_then(Verdict::problem);
    let action = match &report.verdict {
        Some(
            Verdict::Repair { action, .. }
            | Verdict::Waiting { action, .. }
            | Verdict::Paused { action, .. }
            | Verdict::Queued { action, .. },
        ) => action.as_str(),
        _ => "",
    };
    tracing::info!(
        node = %report.node,
        instance_id = report.instance_id.as_deref().unwrap_or_default(),
        asg = report.auto_scaling_group.as_deref().unwrap_or_default(),
        outcome = %report.outcome,
        condition = problem.map(|p| p.condition.as_str()).unwrap_or_default(),
        reason = problem.and_then(|p| p.reason.as_deref()).unwrap_or_default(),
        action,
        acted = report.acted.unwrap_or(false),
        dry_run,
        why = %report.why,
        "node repair decision"
    );
}
