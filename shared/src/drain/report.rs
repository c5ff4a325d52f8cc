//! What a terminating-hook invocation reports: each record's outcome, how a drain ended, and
//! the errors that make the invocation fail (so Lambda retries it).

use super::retention::InstanceFate;
use crate::aws::{AwsError, CompletionOutcome, LifecycleActionResult};
use crate::cluster::ClusterAccessError;
use crate::diagnostic::{FunctionError, diagnostic};
use crate::lifecycle::hand_over::ContinuationError;
use crate::lifecycle::handler::HandledRecord;
use crate::lifecycle::node::NodeLookupError;
use crate::lifecycle::notification::NotificationError;

/// What an invocation did, record by record: the Lambda response.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DrainReport {
    pub records: Vec<RecordReport>,
    #[serde(skip)]
    pub outcomes: Vec<DeliveryOutcome>,
}

impl DrainReport {
    /// The report of an invocation's records; or its failure: the one record that failed,
    /// or all those that did.
    pub fn from_records(
        records: Vec<HandledRecord<DeliveryOutcome, DrainError>>,
    ) -> Result<Self, DrainError> {
        let mut outcomes = Vec::new();
        let mut errors = Vec::new();
        for record in records {
            match record.result {
                Ok(outcome) => outcomes.push(outcome),
                Err(error) => errors.push(error),
            }
        }
        match errors.len() {
            0 => Ok(DrainReport {
                records: outcomes
                    .iter()
                    .map(|o| RecordReport {
                        outcome: o.name(),
                        summary: o.summary(),
                    })
                    .collect(),
                outcomes,
            }),
            1 => Err(errors.remove(0)),
            _ => Err(DrainError::Records(errors)),
        }
    }
}

/// One record's outcome in the Lambda response.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecordReport {
    /// The [`DeliveryOutcome`] variant: `Completed`, `Duplicate`, `HandedOver`, ...
    pub outcome: &'static str,
    /// The same in words, e.g. `completed CONTINUE (Drained, Completed)`.
    pub summary: String,
}

/// What the handler did with one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// `autoscaling:TEST_NOTIFICATION`: acknowledged.
    TestNotification,
    /// A launch notification, or a transition these functions do not handle: acknowledged.
    OtherTransition(String),
    /// The group belongs to another cluster or account: left alone.
    Foreign(String),
    /// The instance has no node: completed at once.
    NoNode(CompletionOutcome),
    /// Another invocation is draining this node: nothing done.
    Duplicate { holder: String },
    /// This action's drain was completed already.
    AlreadyCompleted,
    /// Drained (or out of time) and completed.
    Completed {
        result: LifecycleActionResult,
        outcome: CompletionOutcome,
        drain: DrainEnd,
        /// Whether the instance terminates or is kept (a failed drain on a group that
        /// retains abandoned instances, see [`super::retention`]).
        instance: InstanceFate,
    },
    /// Handed to a fresh invocation.
    HandedOver { continuation: u32 },
    /// Auto Scaling no longer has the action (completed elsewhere or expired): stopped.
    ActionGone,
    /// Our lease expired and another invocation took over: stopped.
    LeaseLost,
}

impl DeliveryOutcome {
    /// The variant's name, for the Lambda response and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::TestNotification => "TestNotification",
            Self::OtherTransition(_) => "OtherTransition",
            Self::Foreign(_) => "Foreign",
            Self::NoNode(_) => "NoNode",
            Self::Duplicate { .. } => "Duplicate",
            Self::AlreadyCompleted => "AlreadyCompleted",
            Self::Completed { .. } => "Completed",
            Self::HandedOver { .. } => "HandedOver",
            Self::ActionGone => "ActionGone",
            Self::LeaseLost => "LeaseLost",
        }
    }

    /// One line for the Lambda response.
    pub fn summary(&self) -> String {
        match self {
            Self::TestNotification => "TestNotification acknowledged".to_owned(),
            Self::OtherTransition(t) => format!("{t} acknowledged (not handled here)"),
            Self::Foreign(reason) => format!("left alone: {reason}"),
            Self::NoNode(outcome) => format!("no node: completed ({outcome:?})"),
            Self::Duplicate { holder } => format!("duplicate: {holder} is draining the node"),
            Self::AlreadyCompleted => "already completed".to_owned(),
            Self::Completed {
                result,
                outcome,
                drain,
                instance,
            } => {
                let kept = match instance {
                    InstanceFate::Terminates => "",
                    InstanceFate::Retained => ", instance retained",
                    InstanceFate::Unknown => ", instance retained if its group retains",
                };
                format!(
                    "completed {} ({}, {outcome:?}{kept})",
                    result.as_str(),
                    drain.label()
                )
            }
            Self::HandedOver { continuation } => {
                format!("handed over (continuation {continuation})")
            }
            Self::ActionGone => "lifecycle action gone: stopped".to_owned(),
            Self::LeaseLost => "lease lost to another invocation: stopped".to_owned(),
        }
    }
}

/// How the drain part ended, for completions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainEnd {
    /// Every pod left; settled.
    Drained,
    /// The node disappeared during the drain.
    NodeGone,
    /// Deadline passed; the remaining pods were deleted (force) and are gone.
    Forced(Vec<String>),
    /// Deadline passed and force is configured, but the API server refused to delete these
    /// pods for good (e.g. 403: the role lacks the force-delete group): they still run.
    /// Completed with `DRAIN_TIMEOUT_RESULT`, like any pod left at the deadline.
    ForceRefused {
        deleted: Vec<String>,
        refused: Vec<String>,
    },
    /// Deadline passed; the remaining pods were deleted (force), but these were still
    /// terminating (within their grace period) when the invocation's time ran out.
    ForcedStillTerminating {
        deleted: Vec<String>,
        terminating: Vec<String>,
    },
    /// Deadline passed; these pods were still there (PodEvictionFailure).
    EvictionFailure(Vec<String>),
}

impl DrainEnd {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Drained => "Drained",
            Self::NodeGone => "NodeGone",
            Self::Forced(_) => "Forced",
            Self::ForceRefused { .. } => "ForceRefused",
            Self::ForcedStillTerminating { .. } => "ForcedStillTerminating",
            Self::EvictionFailure(_) => "PodEvictionFailure",
        }
    }
}

/// A record that could not be handled. The invocation fails (so Lambda retries it) after the
/// other records were handled.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("malformed notification: {0}")]
    Notification(#[from] NotificationError),
    #[error("cannot reach the cluster's Kubernetes API: {0}")]
    Cluster(#[from] ClusterAccessError),
    #[error("cannot decide whether the Auto Scaling group is this cluster's: {0}")]
    Scope(#[source] AwsError),
    #[error(
        "cannot prove the lifecycle action of instance {instance_id} is still pending (nothing was written): {source}"
    )]
    ActionUnproven {
        instance_id: String,
        #[source]
        source: AwsError,
    },
    #[error("cannot find the node of instance {instance_id}: {source}")]
    NodeLookup {
        instance_id: String,
        #[source]
        source: NodeLookupError,
    },
    #[error("Kubernetes API call failed while draining node {node}: {source}")]
    Kubernetes {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("CompleteLifecycleAction failed for instance {instance_id}: {source}")]
    Complete {
        instance_id: String,
        #[source]
        source: AwsError,
    },
    #[error("cannot hand the drain of node {node} to a fresh invocation: {source}")]
    HandOver {
        node: String,
        #[source]
        source: ContinuationError,
    },
    #[error(
        "the invocation has {remaining:?} left for draining after the hand-over margin of {margin:?} (HAND_OVER_MARGIN_SECONDS): raise the function's timeout or lower HAND_OVER_MARGIN_SECONDS; failing instead of handing over in a tight loop"
    )]
    NoTimeToWork {
        remaining: std::time::Duration,
        margin: std::time::Duration,
    },
    #[error(
        "the Kubernetes API did not answer in time to look up or take the drain of instance {instance_id}'s node before the hand-over time (the invocation fails so it is retried)"
    )]
    NoAnswerBeforeHandOver { instance_id: String },
    #[error("the drain deadline of node {node} passed and force is configured, but these pods could not be deleted yet (the invocation fails so it is retried): {}", .pods.join(", "))]
    ForceIncomplete { node: String, pods: Vec<String> },
    #[error("internal error (a bug; please report it): {0}")]
    Internal(String),
    #[error("{} of the event's records failed: {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Records(Vec<DrainError>),
}

impl FunctionError for DrainError {
    fn kind(&self) -> &'static str {
        match self {
            Self::Notification(_) => "MalformedNotification",
            Self::Cluster(_) => "ClusterAccessFailed",
            Self::Scope(_) => "ScopeCheckFailed",
            Self::ActionUnproven { .. } => "LifecycleActionUnproven",
            Self::NodeLookup { .. } => "NodeLookupFailed",
            Self::Kubernetes { .. } => "KubernetesApiFailed",
            Self::Complete { .. } => "CompleteLifecycleActionFailed",
            Self::HandOver { .. } => "HandOverFailed",
            Self::ForceIncomplete { .. } => "ForcedDeletionIncomplete",
            Self::NoTimeToWork { .. } => "HandOverMarginTooLarge",
            Self::NoAnswerBeforeHandOver { .. } => "NoAnswerBeforeHandOver",
            Self::Internal(_) => "InternalError",
            Self::Records(_) => "RecordsFailed",
        }
    }
}

impl From<DrainError> for lambda_runtime::Diagnostic {
    fn from(error: DrainError) -> Self {
        diagnostic(&error)
    }
}
