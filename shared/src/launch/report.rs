//! What a launching-hook invocation reports: each record's outcome, and the errors that make
//! the invocation fail (so Lambda retries it).

use std::time::Duration;

use serde::Serialize;

use super::warm_pool::Restored;
use crate::aws::AwsError;
use crate::cluster::ClusterAccessError;
use crate::diagnostic::{FunctionError, diagnostic};
use crate::lifecycle::hand_over::ContinuationError;
use crate::lifecycle::handler::HandledRecord;
use crate::lifecycle::notification::NotificationError;

/// What the invocation did, record by record (the Lambda response).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchReport {
    pub records: Vec<RecordReport>,
}

impl LaunchReport {
    /// The report of every record, failed ones included; or, when any failed, the
    /// invocation's failure naming them (each logged here).
    pub fn from_records(
        handled: Vec<HandledRecord<LaunchOutcome, LaunchError>>,
        lambda_request_id: &str,
    ) -> Result<Self, LaunchError> {
        let total = handled.len();
        let mut records = Vec::with_capacity(total);
        let mut failures = Vec::new();
        for handled in handled {
            let outcome = match handled.result {
                Ok(outcome) => outcome,
                Err(error) => {
                    tracing::error!(
                        record = %handled.record,
                        instance_id = handled.instance_id.as_deref().unwrap_or_default(),
                        asg = handled.auto_scaling_group.as_deref().unwrap_or_default(),
                        lambda_request_id,
                        error_kind = error.kind(),
                        error = %error,
                        "record failed"
                    );
                    failures.push(format!("{}: {error}", handled.record));
                    LaunchOutcome::Failed {
                        error: error.to_string(),
                    }
                }
            };
            records.push(RecordReport {
                record: handled.record,
                instance_id: handled.instance_id,
                auto_scaling_group: handled.auto_scaling_group,
                outcome,
            });
        }
        if failures.is_empty() {
            Ok(LaunchReport { records })
        } else {
            Err(LaunchError::Records { total, failures })
        }
    }
}

/// What happened to one record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordReport {
    /// `record 0`, `EventBridge event`.
    pub record: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_scaling_group: Option<String>,
    #[serde(flatten)]
    pub outcome: LaunchOutcome,
}

/// The outcome of one record.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome")]
pub enum LaunchOutcome {
    /// The node is Ready and the action was completed with CONTINUE.
    Completed {
        node: String,
        waited_seconds: f64,
        /// Back from the warm pool: what of the scale-in's drain was undone on the node.
        #[serde(skip_serializing_if = "Option::is_none")]
        restored: Option<Restored>,
    },
    /// A launch into the warm pool, completed with CONTINUE once EC2 reported the instance
    /// out of `pending`, without waiting for a node (`WARM_POOL_WAIT_FOR_NODE=false`).
    EnteredWarmPool {
        /// The EC2 state seen (`running`; `unknown` when EC2 does not know the instance).
        instance_state: String,
        waited_seconds: f64,
        /// False when Auto Scaling had no active action any more (a duplicate delivery).
        completed: bool,
    },
    /// The node is Ready but Auto Scaling had no active action any more (completed by a
    /// duplicate delivery, or timed out).
    AlreadyCompleted { node: String },
    /// The launch timeout passed: completed with the configured result.
    TimedOut {
        result: String,
        /// The node, when it registered but did not turn Ready.
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// Back from the warm pool and completed with CONTINUE: what of the scale-in's drain
        /// was undone on the node (undone whether or not it was Ready in time).
        #[serde(skip_serializing_if = "Option::is_none")]
        restored: Option<Restored>,
    },
    /// The invocation's time ran out: a fresh invocation continues.
    HandedOver { continuation: u32 },
    /// Auto Scaling dropped the action while waiting (completed elsewhere or expired).
    ActionGone,
    /// `autoscaling:TEST_NOTIFICATION`: nothing to do.
    TestNotification,
    /// A terminating notification reached the launching hook: acknowledged, ignored.
    OtherTransition { transition: String },
    /// A transition these functions do not know: acknowledged, ignored.
    UnknownTransition { transition: String },
    /// The group belongs to another cluster or account: left alone.
    NotOurs { reason: String },
    /// The record could not be handled; the invocation fails after the other records.
    Failed { error: String },
}

impl LaunchOutcome {
    /// The outcome's name, as in the report and the `Outcome` metric dimension.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Completed { .. } => "Completed",
            Self::EnteredWarmPool { .. } => "EnteredWarmPool",
            Self::AlreadyCompleted { .. } => "AlreadyCompleted",
            Self::TimedOut { .. } => "TimedOut",
            Self::HandedOver { .. } => "HandedOver",
            Self::ActionGone => "ActionGone",
            Self::TestNotification => "TestNotification",
            Self::OtherTransition { .. } => "OtherTransition",
            Self::UnknownTransition { .. } => "UnknownTransition",
            Self::NotOurs { .. } => "NotOurs",
            Self::Failed { .. } => "Failed",
        }
    }
}

/// Why one record could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("malformed notification: {0}")]
    Malformed(#[from] NotificationError),
    #[error("cannot tell whether the Auto Scaling group is this cluster's: {0}")]
    Scope(#[source] AwsError),
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[from] ClusterAccessError),
    #[error("cannot complete the lifecycle action: {0}")]
    Complete(#[source] AwsError),
    #[error("cannot read the instance's state from EC2: {0}")]
    InstanceState(#[source] AwsError),
    #[error(
        "the instance launching into the warm pool is still pending in EC2 and the invocation's time is up; a retry continues"
    )]
    StillPending,
    #[error("cannot undo the scale-in's drain on node {node}, back from the warm pool: {source}")]
    Restore {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot look up the instance's node to undo the scale-in's drain: {0}")]
    NodeLookup(#[source] crate::lifecycle::node::NodeLookupError),
    #[error("cannot hand the wait over to a fresh invocation: {0}")]
    Continuation(#[from] ContinuationError),
    #[error(
        "the invocation has {remaining:?} left for waiting after the hand-over margin of {margin:?}: raise the function's timeout or lower HAND_OVER_MARGIN_SECONDS"
    )]
    NoTimeToWait {
        remaining: Duration,
        margin: Duration,
    },
    #[error("{} of {total} records failed: {}", failures.len(), failures.join("; "))]
    Records { total: usize, failures: Vec<String> },
}

impl FunctionError for LaunchError {
    fn kind(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "MalformedNotification",
            Self::Scope(_) => "ScopeCheckFailed",
            Self::Cluster(_) => "ClusterAccessFailed",
            Self::Complete(_) => "CompleteLifecycleActionFailed",
            Self::InstanceState(_) => "InstanceStateUnavailable",
            Self::StillPending => "InstanceStillPending",
            Self::Restore { .. } => "WarmPoolRestoreFailed",
            Self::NodeLookup(_) => "NodeLookupFailed",
            Self::Continuation(_) => "HandOverFailed",
            Self::NoTimeToWait { .. } => "NoTimeToWait",
            Self::Records { .. } => "RecordsFailed",
        }
    }
}

impl From<LaunchError> for lambda_runtime::Diagnostic {
    fn from(error: LaunchError) -> Self {
        diagnostic(&error)
    }
}
