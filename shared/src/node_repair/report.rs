//! What a run answers and how it fails: the report per node and per group, the error, and
//! the log line and metrics that say the same to CloudWatch.

use serde::Serialize;

use crate::aws::AwsError;
use crate::cluster::ClusterAccessError;
use crate::diagnostic::{FunctionError, diagnostic};
use crate::telemetry::{MetricSet, Unit};

use super::FUNCTION_NAME;
use super::decision::Verdict;

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
    /// Nodes whose instance is not in service (warm pool, pending, standby): not judged.
    pub out_of_service: usize,
    pub unhealthy: usize,
    pub in_flight: usize,
    pub repairs_started: usize,
    pub repairs_paused: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,
}

/// The outcome of a node left out before any decision.
pub(super) const NOT_OURS: &str = "NotOurs";

/// Why a node is left out before any decision.
pub(super) fn not_ours(node: &str, why: String) -> NodeReport {
    NodeReport {
        node: node.to_owned(),
        instance_id: None,
        auto_scaling_group: None,
        outcome: NOT_OURS.to_owned(),
        why,
        verdict: None,
        acted: None,
    }
}

impl GroupSummary {
    /// The group's figures as CloudWatch metrics (embedded metric format).
    pub(super) fn emit_metrics(&self, dry_run: bool) {
        MetricSet::new(FUNCTION_NAME)
            .dimension("AutoScalingGroupName", &self.group)
            .metric("UnhealthyNodes", self.unhealthy as f64, Unit::Count)
            .metric("RepairsStarted", self.repairs_started as f64, Unit::Count)
            .metric("RepairsPaused", self.repairs_paused as f64, Unit::Count)
            .property("DryRun", dry_run)
            .emit();
    }
}

/// The verdict in words, for the report's `why`.
pub(super) fn explain(verdict: &Verdict, dry_run: bool) -> String {
    match verdict {
        Verdict::Healthy => "no watched condition is unhealthy".to_owned(),
        Verdict::OutOfService { lifecycle_state } => format!(
            "instance is {lifecycle_state}, not in service: not judged by its node, not counted"
        ),
        Verdict::Draining { problem } => {
            let state = match problem {
                Some(problem) => format!("; {} counts as unhealthy", problem.describe()),
                None => String::new(),
            };
            format!("our drain's checkpoint is on it (cordoned on purpose), not repaired{state}")
        }
        Verdict::RepairInFlight { detail, problem } => {
            let state = match problem {
                Some(problem) => format!("; {} counts as unhealthy", problem.describe()),
                None => String::new(),
            };
            format!("repair under way until the instance has left its group: {detail}{state}")
        }
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
pub(super) fn log_decision(report: &NodeReport, dry_run: bool) {
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
