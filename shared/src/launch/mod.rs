//! The launching hook: complete an instance's launch lifecycle action once its node has
//! registered and is Ready.
//!
//! Auto Scaling holds a launching instance in `Pending:Wait` until the hook completes, so a
//! group does not count an instance as in service (and does not move on to the next one in
//! an instance refresh) before it can run pods. The wait is bounded by the launch timeout,
//! counted from the notification's own time so a continuation keeps the original deadline;
//! after it the configured result is given (CONTINUE keeps the instance, ABANDON makes Auto
//! Scaling replace it). The node is only read and given Events, with one exception: a node
//! coming back from a warm pool gets the scale-in's drain undone ([`warm_pool`]). A launch
//! into a warm pool completes without waiting for a node (see README "Warm pools").

pub mod readiness;
pub mod warm_pool;

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde::Serialize;
use serde_json::Value;

use crate::aws::{
    AutoScaling, AwsError, CompletionOutcome, Instances, LifecycleActionResult, Notifications,
};
use crate::cluster::ClusterAccessError;
use crate::cluster::connection::KubeConnection;
use crate::lifecycle::budget::{InvocationBudget, instant_at};
use crate::lifecycle::hand_over::{ContinuationError, HandOver, complete_action, hand_over};
use crate::lifecycle::heartbeat::HeartbeatKeeper;
use crate::lifecycle::hook_timings::HookTimings;
use crate::lifecycle::node::{find_node, is_ready, private_dns_name};
use crate::lifecycle::notification::{
    Delivery, LifecycleMessage, LifecycleNotification, LifecycleTransition, NotificationError,
    parse_event,
};
use crate::lifecycle::scope::{GroupScope, ScopeDecision, account_id_from_function_arn};
use crate::lifecycle::settings::LaunchSettings;
use crate::telemetry::{MetricSet, Unit};

use self::readiness::{NodeSighting, wait_until_ready};
use self::warm_pool::{Restore, Restored, RunningWait, restore_returning_node, wait_until_running};

/// The function name used for metrics and as the Events' reporting controller.
pub const FUNCTION_NAME: &str = "launching-hook";

/// The least time an invocation must have for waiting before it hands over.
const MIN_WAIT_SLICE: Duration = Duration::from_secs(1);

/// Everything an invocation needs, built once per execution environment.
pub struct LaunchContext<K, A, I, N> {
    pub kube: K,
    pub autoscaling: A,
    pub instances: I,
    pub notifications: N,
    pub settings: LaunchSettings,
    pub scope: GroupScope,
    pub hooks: HookTimings,
}

impl<K, A, I, N> LaunchContext<K, A, I, N> {
    pub fn new(
        kube: K,
        autoscaling: A,
        instances: I,
        notifications: N,
        settings: LaunchSettings,
    ) -> Self {
        let scope = GroupScope::from_settings(&settings.lifecycle);
        Self {
            kube,
            autoscaling,
            instances,
            notifications,
            settings,
            scope,
            hooks: HookTimings::new(),
        }
    }
}

/// What the invocation did, record by record (the Lambda response).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchReport {
    pub records: Vec<RecordReport>,
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

impl LaunchError {
    /// A short name for logs and the Lambda error type.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "MalformedNotification",
            Self::Scope(_) => "ScopeCheckFailed",
            Self::Cluster(_) => "ClusterAccessFailed",
            Self::Complete(_) => "CompleteLifecycleActionFailed",
            Self::InstanceState(_) => "InstanceStateUnavailable",
            Self::StillPending => "InstanceStillPending",
            Self::Restore { .. } => "WarmPoolRestoreFailed",
            Self::Continuation(_) => "HandOverFailed",
            Self::NoTimeToWait { .. } => "NoTimeToWait",
            Self::Records { .. } => "RecordsFailed",
        }
    }
}

impl From<LaunchError> for lambda_runtime::Diagnostic {
    fn from(error: LaunchError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: error.kind().to_owned(),
            error_message: error.to_string(),
        }
    }
}

/// Handles every record of one Lambda event. Records that cannot be handled are reported and
/// make the invocation fail after the others were handled.
pub async fn handle<K, A, I, N>(
    ctx: &LaunchContext<K, A, I, N>,
    event: Value,
    lambda: &lambda_runtime::Context,
) -> Result<LaunchReport, LaunchError>
where
    K: KubeConnection,
    A: AutoScaling,
    I: Instances,
    N: Notifications,
{
    let budget = InvocationBudget::from_context(lambda, ctx.settings.lifecycle.hand_over_margin);
    let invocation = Invocation {
        budget,
        function_account: account_id_from_function_arn(&lambda.invoked_function_arn),
        lambda_request_id: lambda.request_id.clone(),
    };
    let deliveries = parse_event(&event);
    let total = deliveries.len();
    let mut records = Vec::with_capacity(total);
    let mut failures = Vec::new();
    for parsed in deliveries {
        let report = match parsed {
            Ok(delivery) => handle_delivery(ctx, &invocation, &delivery).await,
            Err(error) => {
                let record = error
                    .location()
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "event".to_owned());
                (record, None, None, Err(LaunchError::Malformed(error)))
            }
        };
        let (record, instance_id, group, result) = report;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::error!(
                    record = %record,
                    instance_id = instance_id.as_deref().unwrap_or_default(),
                    asg = group.as_deref().unwrap_or_default(),
                    lambda_request_id = %invocation.lambda_request_id,
                    error_kind = error.kind(),
                    error = %error,
                    "record failed"
                );
                failures.push(format!("{record}: {error}"));
                LaunchOutcome::Failed {
                    error: error.to_string(),
                }
            }
        };
        records.push(RecordReport {
            record,
            instance_id,
            auto_scaling_group: group,
            outcome,
        });
    }
    if failures.is_empty() {
        Ok(LaunchReport { records })
    } else {
        Err(LaunchError::Records { total, failures })
    }
}

/// Facts about the current invocation.
struct Invocation {
    budget: InvocationBudget,
    function_account: Option<String>,
    lambda_request_id: String,
}

type RecordResult = (
    String,
    Option<String>,
    Option<String>,
    Result<LaunchOutcome, LaunchError>,
);

async fn handle_delivery<K, A, I, N>(
    ctx: &LaunchContext<K, A, I, N>,
    invocation: &Invocation,
    delivery: &Delivery,
) -> RecordResult
where
    K: KubeConnection,
    A: AutoScaling,
    I: Instances,
    N: Notifications,
{
    let record = delivery.location.to_string();
    match &delivery.message {
        LifecycleMessage::Test(test) => {
            tracing::info!(
                record = %record,
                asg = test.group_name.as_deref().unwrap_or_default(),
                request_id = test.request_id.as_deref().unwrap_or_default(),
                "test notification acknowledged; nothing to do"
            );
            (
                record,
                None,
                test.group_name.clone(),
                Ok(LaunchOutcome::TestNotification),
            )
        }
        LifecycleMessage::UnknownTransition {
            transition,
            group_name,
            instance_id,
        } => {
            tracing::info!(
                record = %record,
                transition = %transition,
                instance_id = instance_id.as_deref().unwrap_or_default(),
                asg = group_name.as_deref().unwrap_or_default(),
                "notification for a transition the launching hook does not handle; acknowledged"
            );
            (
                record,
                instance_id.clone(),
                group_name.clone(),
                Ok(LaunchOutcome::UnknownTransition {
                    transition: transition.clone(),
                }),
            )
        }
        LifecycleMessage::Lifecycle(notification) => {
            let instance_id = Some(notification.action.instance_id.clone());
            let group = Some(notification.action.auto_scaling_group_name.clone());
            let result = if notification.transition == LifecycleTransition::Launching {
                launch(ctx, invocation, delivery, notification).await
            } else {
                log_step(
                    notification,
                    None,
                    "notification for another transition reached the launching hook; acknowledged, nothing done",
                );
                Ok(LaunchOutcome::OtherTransition {
                    transition: notification.transition.as_str().to_owned(),
                })
            };
            (record, instance_id, group, result)
        }
    }
}

/// One structured log line with the fields every step carries.
fn log_step(notification: &LifecycleNotification, node: Option<&str>, step: &str) {
    tracing::info!(
        instance_id = %notification.action.instance_id,
        node = node.unwrap_or_default(),
        hook = %notification.action.lifecycle_hook_name,
        asg = %notification.action.auto_scaling_group_name,
        request_id = %notification.request_id,
        continuation = notification.continuation,
        "{step}"
    );
}

async fn launch<K, A, I, N>(
    ctx: &LaunchContext<K, A, I, N>,
    invocation: &Invocation,
    delivery: &Delivery,
    notification: &LifecycleNotification,
) -> Result<LaunchOutcome, LaunchError>
where
    K: KubeConnection,
    A: AutoScaling,
    I: Instances,
    N: Notifications,
{
    let action = &notification.action;
    log_step(notification, None, "launch notification received");
    let decision = ctx
        .scope
        .decide_for_account(
            &ctx.autoscaling,
            invocation.function_account.as_deref(),
            &notification.account_id,
            &action.auto_scaling_group_name,
        )
        .await
        .map_err(LaunchError::Scope)?;
    match decision {
        ScopeDecision::Foreign(reason) => {
            tracing::info!(
                instance_id = %action.instance_id,
                hook = %action.lifecycle_hook_name,
                asg = %action.auto_scaling_group_name,
                request_id = %notification.request_id,
                reason = %reason,
                "Auto Scaling group is not this cluster's; left alone"
            );
            return Ok(LaunchOutcome::NotOurs {
                reason: reason.to_string(),
            });
        }
        ScopeDecision::Ours { evidence } => {
            tracing::debug!(asg = %action.auto_scaling_group_name, evidence, "group is this cluster's");
        }
    }
    let route = notification.route;
    if route.is_into_warm_pool() {
        if !ctx.settings.warm_pool_wait_for_node {
            log_step(
                notification,
                None,
                "launch into the warm pool: completing as soon as the instance runs, without waiting for a node (WARM_POOL_WAIT_FOR_NODE=false)",
            );
            return into_warm_pool(ctx, invocation, notification).await;
        }
        log_step(
            notification,
            None,
            "launch into the warm pool: waiting for the node to be Ready (WARM_POOL_WAIT_FOR_NODE=true)",
        );
    } else if route.is_out_of_warm_pool() {
        log_step(
            notification,
            None,
            "launch out of the warm pool: waiting for the node to be Ready, then undoing the scale-in's drain if the node carries ours",
        );
    }

    let client = ctx.kube.client().await?;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: format!("open-node-manager/{FUNCTION_NAME}"),
            // events.k8s.io/v1 requires a reporting instance: the function's name in Lambda.
            instance: Some(
                std::env::var("AWS_LAMBDA_FUNCTION_NAME")
                    .unwrap_or_else(|_| FUNCTION_NAME.to_owned()),
            ),
        },
    );
    match wait_for_node(ctx, invocation, delivery, notification, &client).await? {
        WaitEnd::Ready(node) if route.is_out_of_warm_pool() => {
            let (node, restored) = restore(&client, &recorder, notification, *node).await?;
            complete_ready(ctx, &recorder, notification, &node, restored).await
        }
        WaitEnd::Ready(node) => complete_ready(ctx, &recorder, notification, &node, None).await,
        WaitEnd::LaunchTimeout(node) => {
            complete_timed_out(ctx, &recorder, notification, node.as_deref()).await
        }
        WaitEnd::Stopped(outcome) => Ok(outcome),
    }
}

/// When the launch timeout runs out: counted from Auto Scaling's own time, so continuations
/// and retries keep it.
fn launch_deadline<K, A, I, N>(
    ctx: &LaunchContext<K, A, I, N>,
    notification: &LifecycleNotification,
) -> Timestamp {
    notification
        .time
        .checked_add(
            jiff::SignedDuration::try_from(ctx.settings.launch_timeout)
                .unwrap_or(jiff::SignedDuration::MAX),
        )
        .unwrap_or(Timestamp::MAX)
}

/// A launch into the warm pool: complete with CONTINUE once EC2 has the instance out of
/// `pending` (Auto Scaling then stops, hibernates or keeps it running in the pool).
async fn into_warm_pool<K, A, I, N>(
    ctx: &LaunchContext<K, A, I, N>,
    invocation: &Invocation,
    notification: &LifecycleNotification,
) -> Result<LaunchOutcome, LaunchError>
where
    A: AutoScaling,
    I: Instances,
{
    let action = &notification.action;
    let deadline = launch_deadline(ctx, notification);
    let stop_at = instant_at(deadline).min(invocation.budget.hand_over_at());
    let waited = wait_until_running(&ctx.instances, &action.instance_id, stop_at)
        .await
        .map_err(LaunchError::InstanceState)?;
    let instance_state = match waited {
        RunningWait::Settled(state) => state,
        RunningWait::Unknown => "unknown".to_owned(),
        RunningWait::StillPending if Timestamp::now() >= deadline => {
            tracing::warn!(
                instance_id = %action.instance_id,
                hook = %action.lifecycle_hook_name,
                asg = %action.auto_scaling_group_name,
                result = ctx.settings.timeout_result.as_str(),
                "the instance launching into the warm pool stayed pending past the launch timeout; completing with the timeout result"
            );
            complete_action(&ctx.autoscaling, action, ctx.settings.timeout_result)
                .await
                .map_err(LaunchError::Complete)?;
            emit_metrics("TimedOut", notification, None, notification.continuation);
            return Ok(LaunchOutcome::TimedOut {
                result: ctx.settings.timeout_result.as_str().to_owned(),
                node: None,
            });
        }
        RunningWait::StillPending => return Err(LaunchError::StillPending),
    };
    let outcome = complete_action(&ctx.autoscaling, action, LifecycleActionResult::Continue)
        .await
        .map_err(LaunchError::Complete)?;
    let completed = outcome == CompletionOutcome::Completed;
    tracing::info!(
        instance_id = %action.instance_id,
        hook = %action.lifecycle_hook_name,
        asg = %action.auto_scaling_group_name,
        request_id = %notification.request_id,
        instance_state = %instance_state,
        completed,
        "launch into the warm pool completed with CONTINUE"
    );
    let outcome = LaunchOutcome::EnteredWarmPool {
        instance_state,
        waited_seconds: seconds_since(notification.time),
        completed,
    };
    emit_metrics(
        outcome.name(),
        notification,
        None,
        notification.continuation,
    );
    Ok(outcome)
}

/// Back from the warm pool with a Ready node: undo the scale-in's drain if the node carries
/// ours, before the action completes (the group counts the instance in service from then).
async fn restore(
    client: &kube::Client,
    recorder: &Recorder,
    notification: &LifecycleNotification,
    node: Node,
) -> Result<(Node, Option<Restored>), LaunchError> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let restore = restore_returning_node(&nodes, node.clone(), &notification.action.instance_id)
        .await
        .map_err(|source| LaunchError::Restore {
            node: node_name.clone(),
            source,
        })?;
    match restore {
        Restore::Restored { node, restored } => {
            tracing::info!(
                instance_id = %notification.action.instance_id,
                node = %node_name,
                asg = %notification.action.auto_scaling_group_name,
                went_to_pool_at = restored.went_to_pool_at.as_deref().unwrap_or_default(),
                uncordoned = restored.uncordoned,
                unlabelled = restored.unlabelled,
                untainted = restored.untainted.as_deref().unwrap_or_default(),
                "node back from the warm pool: the scale-in's drain undone ({})",
                restored.summary()
            );
            if restored.unknown_changes {
                publish_event(
                    recorder,
                    &node,
                    EventType::Warning,
                    "WarmPoolReturnUnknownDrain",
                    format!(
                        "Node back from the warm pool with instance {}: its drain checkpoint does not record what the drain changed, so only the checkpoint was removed; uncordon it if the drain cordoned it",
                        notification.action.instance_id
                    ),
                )
                .await;
            } else {
                publish_event(
                    recorder,
                    &node,
                    EventType::Normal,
                    "WarmPoolReturn",
                    format!(
                        "Node back from the warm pool with instance {}: {}",
                        notification.action.instance_id,
                        restored.summary()
                    ),
                )
                .await;
            }
            Ok((*node, Some(restored)))
        }
        Restore::NothingOfOurs => {
            log_step(
                notification,
                Some(&node_name),
                "node back from the warm pool carries no drain of ours: nothing to undo",
            );
            Ok((node, None))
        }
        Restore::NodeGone => {
            log_step(
                notification,
                Some(&node_name),
                "node deleted while its drain was being undone; completing as Ready was seen",
            );
            Ok((node, None))
        }
    }
}

/// How a wait ended.
enum WaitEnd {
    Ready(Box<Node>),
    /// The launch timeout passed; the instance's node as last seen, if it registered.
    LaunchTimeout(Option<Box<Node>>),
    /// Nothing left to do in this invocation (handed over, or the action is gone).
    Stopped(LaunchOutcome),
}

/// Waits, within the launch timeout and this invocation's budget, for the instance's node to
/// be Ready; hands over when the budget runs out first.
async fn wait_for_node<K, A, I, N>(
    ctx: &LaunchContext<K, A, I, N>,
    invocation: &Invocation,
    delivery: &Delivery,
    notification: &LifecycleNotification,
    client: &kube::Client,
) -> Result<WaitEnd, LaunchError>
where
    K: KubeConnection,
    A: AutoScaling,
    I: Instances,
    N: Notifications,
{
    let action = &notification.action;
    let dns_name = private_dns_name(&ctx.instances, &action.instance_id).await;
    let launch_deadline = launch_deadline(ctx, notification);
    let launch_deadline_at = instant_at(launch_deadline);
    let deadline_passed = Timestamp::now() >= launch_deadline;
    // Handing over at once would republish the notification in a tight loop until the launch
    // timeout: with no time to wait, look once and report the configuration error.
    let no_time_to_wait = !deadline_passed
        && invocation.budget.remaining() < MIN_WAIT_SLICE
        && invocation.budget.hand_over_at() < launch_deadline_at;
    if deadline_passed || no_time_to_wait {
        // A late continuation or delivery, or no time: one look, no wait.
        let node = find_node(client, &ctx.instances, &action.instance_id)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(instance_id = %action.instance_id, error = %error, "cannot look up the node");
                None
            });
        return match node {
            Some(node) if is_ready(&node) => Ok(WaitEnd::Ready(Box::new(node))),
            _ if no_time_to_wait => Err(LaunchError::NoTimeToWait {
                remaining: invocation.budget.remaining(),
                margin: ctx.settings.lifecycle.hand_over_margin,
            }),
            node => Ok(WaitEnd::LaunchTimeout(node.map(Box::new))),
        };
    }

    let hook = ctx
        .hooks
        .get_or_default(
            &ctx.autoscaling,
            &action.auto_scaling_group_name,
            &action.lifecycle_hook_name,
        )
        .await;
    let mut keeper =
        HeartbeatKeeper::new(action.clone(), &hook, notification.time, notification.time);
    let stop_at = launch_deadline_at.min(invocation.budget.hand_over_at());
    log_step(
        notification,
        dns_name.as_deref(),
        "waiting for the node to register and turn Ready",
    );
    let sighting = NodeSighting::default();
    let wait = tokio::time::timeout_at(
        stop_at,
        wait_until_ready(client, &action.instance_id, dns_name.as_deref(), &sighting),
    );
    let waited = keeper.keep_alive(&ctx.autoscaling, wait).await;
    let outcome = match waited {
        Ok(Ok(node)) => return Ok(WaitEnd::Ready(Box::new(node))),
        Ok(Err(_elapsed)) if tokio::time::Instant::now() >= launch_deadline_at => {
            return Ok(WaitEnd::LaunchTimeout(sighting.node().map(Box::new)));
        }
        Err(_gone) => {
            log_step(
                notification,
                None,
                "the lifecycle action is gone (completed elsewhere or expired); stopping",
            );
            LaunchOutcome::ActionGone
        }
        Ok(Err(_elapsed)) => {
            log_step(
                notification,
                dns_name.as_deref(),
                "invocation time running out; handing the wait over",
            );
            match hand_over(
                &ctx.autoscaling,
                &ctx.notifications,
                &mut keeper,
                delivery,
                ctx.settings.lifecycle.continuation_topic_arn.as_deref(),
            )
            .await?
            {
                HandOver::Published { continuation, .. } => {
                    LaunchOutcome::HandedOver { continuation }
                }
                HandOver::ActionGone => {
                    log_step(notification, None, "the lifecycle action is gone; stopping");
                    LaunchOutcome::ActionGone
                }
            }
        }
    };
    let continuations = match &outcome {
        LaunchOutcome::HandedOver { continuation } => *continuation,
        _ => notification.continuation,
    };
    emit_metrics(outcome.name(), notification, None, continuations);
    Ok(WaitEnd::Stopped(outcome))
}

/// The node is Ready: complete with CONTINUE, and say so on the node.
async fn complete_ready<K, A, I, N>(
    ctx: &LaunchContext<K, A, I, N>,
    recorder: &Recorder,
    notification: &LifecycleNotification,
    node: &Node,
    restored: Option<Restored>,
) -> Result<LaunchOutcome, LaunchError>
where
    A: AutoScaling,
{
    let action = &notification.action;
    let node_name = node.metadata.name.clone().unwrap_or_default();
    log_step(
        notification,
        Some(&node_name),
        "node is Ready; completing with CONTINUE",
    );
    let outcome = complete_action(&ctx.autoscaling, action, LifecycleActionResult::Continue)
        .await
        .map_err(LaunchError::Complete)?;
    let waited_seconds = seconds_since(notification.time);
    let outcome = match outcome {
        CompletionOutcome::Completed => {
            log_step(
                notification,
                Some(&node_name),
                "launch completed with CONTINUE",
            );
            publish_event(
                recorder,
                node,
                EventType::Normal,
                "LaunchCompleted",
                format!(
                    "Node is Ready: lifecycle action {} of instance {} completed with CONTINUE after {waited_seconds:.0} s",
                    action.lifecycle_hook_name, action.instance_id
                ),
            )
            .await;
            LaunchOutcome::Completed {
                node: node_name.clone(),
                waited_seconds,
                restored,
            }
        }
        CompletionOutcome::NoActiveAction => {
            log_step(
                notification,
                Some(&node_name),
                "node is Ready; the lifecycle action was already completed",
            );
            LaunchOutcome::AlreadyCompleted {
                node: node_name.clone(),
            }
        }
    };
    emit_metrics(
        outcome.name(),
        notification,
        Some(&node_name),
        notification.continuation,
    );
    Ok(outcome)
}

/// The launch timeout passed: complete with the configured result and report it.
async fn complete_timed_out<K, A, I, N>(
    ctx: &LaunchContext<K, A, I, N>,
    recorder: &Recorder,
    notification: &LifecycleNotification,
    node: Option<&Node>,
) -> Result<LaunchOutcome, LaunchError>
where
    A: AutoScaling,
{
    let action = &notification.action;
    let result = ctx.settings.timeout_result;
    let node_name = node.and_then(|n| n.metadata.name.clone());
    tracing::warn!(
        instance_id = %action.instance_id,
        node = node_name.as_deref().unwrap_or_default(),
        hook = %action.lifecycle_hook_name,
        asg = %action.auto_scaling_group_name,
        request_id = %notification.request_id,
        registered = node.is_some(),
        result = result.as_str(),
        timeout_seconds = ctx.settings.launch_timeout.as_secs_f64(),
        "the node did not become Ready within the launch timeout; completing with the timeout result"
    );
    complete_action(&ctx.autoscaling, action, result)
        .await
        .map_err(LaunchError::Complete)?;
    if let Some(node) = node {
        publish_event(
            recorder,
            node,
            EventType::Warning,
            "LaunchTimedOut",
            format!(
                "Node not Ready {:.0} s after instance {} launched: lifecycle action {} completed with {}",
                ctx.settings.launch_timeout.as_secs_f64(),
                action.instance_id,
                action.lifecycle_hook_name,
                result.as_str()
            ),
        )
        .await;
    }
    emit_metrics(
        "TimedOut",
        notification,
        node_name.as_deref(),
        notification.continuation,
    );
    Ok(LaunchOutcome::TimedOut {
        result: result.as_str().to_owned(),
        node: node_name,
    })
}

fn seconds_since(time: Timestamp) -> f64 {
    let elapsed: Duration = time
        .duration_until(Timestamp::now())
        .try_into()
        .unwrap_or(Duration::ZERO);
    elapsed.as_secs_f64()
}

/// A Kubernetes Event on the node. An Event that cannot be written is logged, never fatal.
async fn publish_event(
    recorder: &Recorder,
    node: &Node,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "CompleteLifecycleAction".to_owned(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &node.object_ref(&())).await {
        tracing::warn!(
            node = node.metadata.name.as_deref().unwrap_or_default(),
            reason,
            error = %error,
            "cannot record a Kubernetes Event on the node"
        );
    }
}

fn emit_metrics(
    outcome: &str,
    notification: &LifecycleNotification,
    node: Option<&str>,
    continuations: u32,
) {
    let mut metrics = MetricSet::new(FUNCTION_NAME)
        .dimension("Outcome", outcome)
        .metric(
            "LaunchWaitDuration",
            seconds_since(notification.time),
            Unit::Seconds,
        )
        .metric("Continuations", f64::from(continuations), Unit::Count)
        .property("InstanceId", notification.action.instance_id.as_str())
        .property(
            "AutoScalingGroupName",
            notification.action.auto_scaling_group_name.as_str(),
        )
        .property("RequestId", notification.request_id.as_str());
    if let Some(node) = node {
        metrics = metrics.property("NodeName", node);
    }
    metrics.emit();
}
