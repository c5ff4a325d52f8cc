//! The terminating hook's handler: one Lambda event in, every record handled, the lifecycle
//! action completed when the node is drained (or cannot be).
//!
//! [`Drainer`] is built once per execution environment (clients, caches, settings) and
//! borrowed by every invocation; [`Drainer::handle`] is the whole algorithm of one
//! invocation, from notification to `CompleteLifecycleAction` or hand-over.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::Value;
use tracing::Instrument;

use crate::aws::{
    AutoScaling, AwsError, CompletionOutcome, Instances, LifecycleActionResult, Notifications,
};
use crate::cluster::ClusterAccessError;
use crate::cluster::connection::KubeConnection;
use crate::lifecycle::budget::InvocationBudget;
use crate::lifecycle::hand_over::{ContinuationError, HandOver, complete_action, hand_over};
use crate::lifecycle::heartbeat::{ActionGone, HeartbeatKeeper};
use crate::lifecycle::hook_timings::HookTimings;
use crate::lifecycle::node::{NodeLookupError, find_node};
use crate::lifecycle::notification::{
    Delivery, InstancePlace, LifecycleMessage, LifecycleNotification, LifecycleTransition,
    NotificationError, parse_event,
};
use crate::lifecycle::scope::{GroupScope, ScopeDecision, account_id_from_function_arn};
use crate::lifecycle::settings::DrainSettings;

use super::backoff::Backoff;
use super::events::{DrainEvents, reason};
use super::eviction::grace_to_send;
use super::force::{ForcedDeletion, delete_pod_with_retries};
use super::lease::{self, Claim, LeaseHolder, Update};
use super::metrics::DrainMetrics;
use super::node_pods::NodePods;
use super::session::{
    DrainSession, SessionEnd, SessionSettings, SessionStats, StuckPod, StuckReason,
};

/// The function's name: the `Function` metric dimension and the Events' reporter.
pub const FUNCTION_NAME: &str = "terminating-hook";

/// Everything an invocation of the terminating hook needs, built once per execution
/// environment and borrowed by every invocation.
pub struct Drainer<K, A, I, N> {
    /// The way to the cluster's API; asked for a client only when a record needs one.
    pub kube: K,
    pub autoscaling: A,
    pub instances: I,
    pub notifications: N,
    pub settings: DrainSettings,
    pub scope: GroupScope,
    pub hooks: HookTimings,
    /// Whether Kubernetes Events are written (off only in tests that count API calls).
    pub record_events: bool,
}

impl<K, A, I, N> Drainer<K, A, I, N> {
    pub fn new(
        kube: K,
        autoscaling: A,
        instances: I,
        notifications: N,
        settings: DrainSettings,
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
            record_events: true,
        }
    }
}

/// What an invocation did, record by record: the Lambda response.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DrainReport {
    pub records: Vec<RecordReport>,
    #[serde(skip)]
    pub outcomes: Vec<DeliveryOutcome>,
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
            } => {
                format!(
                    "completed {} ({}, {outcome:?})",
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
    /// Deadline passed; the remaining pods were deleted (force).
    Forced(Vec<String>),
    /// Deadline passed; these pods were still there (PodEvictionFailure).
    EvictionFailure(Vec<String>),
}

impl DrainEnd {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Drained => "Drained",
            Self::NodeGone => "NodeGone",
            Self::Forced(_) => "Forced",
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
    #[error("the drain deadline of node {node} passed and force is configured, but these pods could not be deleted yet (the invocation fails so it is retried): {}", .pods.join(", "))]
    ForceIncomplete { node: String, pods: Vec<String> },
    #[error("{} of the event's records failed: {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Records(Vec<DrainError>),
}

impl DrainError {
    /// A short name for logs and the Lambda error type.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Notification(_) => "MalformedNotification",
            Self::Cluster(_) => "ClusterAccessFailed",
            Self::Scope(_) => "ScopeCheckFailed",
            Self::NodeLookup { .. } => "NodeLookupFailed",
            Self::Kubernetes { .. } => "KubernetesApiFailed",
            Self::Complete { .. } => "CompleteLifecycleActionFailed",
            Self::HandOver { .. } => "HandOverFailed",
            Self::ForceIncomplete { .. } => "ForcedDeletionIncomplete",
            Self::NoTimeToWork { .. } => "HandOverMarginTooLarge",
            Self::Records(_) => "RecordsFailed",
        }
    }
}

impl From<DrainError> for lambda_runtime::Diagnostic {
    fn from(error: DrainError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: error.kind().to_owned(),
            error_message: error.to_string(),
        }
    }
}

/// The invocation a record is handled in: who is working (the lease holder) and until when.
/// Built from the Lambda context by [`Drainer::handle`]; tests build it directly to simulate
/// short invocations.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The Lambda request id: the lease holder's name. Lambda's own retries of a failed
    /// invocation keep it, so a retry resumes its own lease at once.
    pub request_id: String,
    /// This function's account (from its ARN); `None` skips the account check.
    pub function_account: Option<String>,
    pub budget: InvocationBudget,
}

impl Invocation {
    pub fn from_context(
        lambda: &lambda_runtime::Context,
        hand_over_margin: std::time::Duration,
    ) -> Self {
        Self {
            request_id: lambda.request_id.clone(),
            function_account: account_id_from_function_arn(&lambda.invoked_function_arn),
            budget: InvocationBudget::from_context(lambda, hand_over_margin),
        }
    }
}

impl<K, A, I, N> Drainer<K, A, I, N>
where
    K: KubeConnection,
    A: AutoScaling,
    I: Instances,
    N: Notifications,
{
    /// Handles every record of `event`. Records that fail are reported together after the
    /// others were handled.
    pub async fn handle(
        &self,
        event: Value,
        lambda: &lambda_runtime::Context,
    ) -> Result<DrainReport, DrainError> {
        let invocation = Invocation::from_context(lambda, self.settings.lifecycle.hand_over_margin);
        self.handle_invocation(event, &invocation).await
    }

    /// [`Self::handle`] for an invocation described directly (tests, local runs).
    pub async fn handle_invocation(
        &self,
        event: Value,
        invocation: &Invocation,
    ) -> Result<DrainReport, DrainError> {
        let mut outcomes = Vec::new();
        let mut errors = Vec::new();
        for parsed in parse_event(&event) {
            let result = match parsed {
                Ok(delivery) => self.handle_delivery(&delivery, invocation).await,
                Err(error) => {
                    tracing::error!(%error, "malformed notification: nothing done for this record");
                    Err(DrainError::Notification(error))
                }
            };
            match result {
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

    async fn handle_delivery(
        &self,
        delivery: &Delivery,
        invocation: &Invocation,
    ) -> Result<DeliveryOutcome, DrainError> {
        let notification = match &delivery.message {
            LifecycleMessage::Test(test) => {
                tracing::info!(step = "test_notification", asg = ?test.group_name, "test notification acknowledged");
                return Ok(DeliveryOutcome::TestNotification);
            }
            LifecycleMessage::UnknownTransition {
                transition,
                group_name,
                instance_id,
            } => {
                tracing::info!(step = "ignored", transition, asg = ?group_name, instance_id = ?instance_id, "not a transition this function handles; acknowledged");
                return Ok(DeliveryOutcome::OtherTransition(transition.clone()));
            }
            LifecycleMessage::Lifecycle(n) if n.transition != LifecycleTransition::Terminating => {
                tracing::info!(step = "ignored", transition = %n.transition, instance_id = %n.action.instance_id, asg = %n.action.auto_scaling_group_name, "a launch notification reached the terminating hook; acknowledged (check the SNS subscription filter)");
                return Ok(DeliveryOutcome::OtherTransition(
                    n.transition.as_str().to_owned(),
                ));
            }
            LifecycleMessage::Lifecycle(n) => n,
        };
        let span = tracing::info_span!(
            "drain",
            instance_id = %notification.action.instance_id,
            asg = %notification.action.auto_scaling_group_name,
            hook = %notification.action.lifecycle_hook_name,
            request_id = %invocation.request_id,
            continuation = notification.continuation,
            node = tracing::field::Empty,
        );
        // Boxed: the drain's future is deep (watch, evictions, heartbeats, timers), and an
        // unboxed one overflows the compiler's layout depth in the binary's `main`.
        Box::pin(
            self.terminating(delivery, notification, invocation)
                .instrument(span),
        )
        .await
    }

    async fn terminating(
        &self,
        delivery: &Delivery,
        notification: &LifecycleNotification,
        invocation: &Invocation,
    ) -> Result<DeliveryOutcome, DrainError> {
        let action = &notification.action;
        let decision = self
            .scope
            .decide_for_account(
                &self.autoscaling,
                invocation.function_account.as_deref(),
                &notification.account_id,
                &action.auto_scaling_group_name,
            )
            .await
            .map_err(DrainError::Scope)?;
        if let ScopeDecision::Foreign(reason) = decision {
            tracing::info!(step = "foreign_group", %reason, "not this cluster's Auto Scaling group: left alone");
            return Ok(DeliveryOutcome::Foreign(reason.to_string()));
        }

        let client = self.kube.client().await?;
        let events = if self.record_events {
            DrainEvents::new(Recorder::new(
                client.clone(),
                Reporter {
                    controller: format!("open-node-manager/{FUNCTION_NAME}"),
                    instance: Some(invocation.request_id.clone()).filter(|id| !id.is_empty()),
                },
            ))
        } else {
            DrainEvents::disabled()
        };
        let outcome =
            Box::pin(self.drain_node(delivery, notification, invocation, &client, &events)).await;
        events.flush().await;
        outcome
    }

    /// From the instance's Node to the completion or hand-over; Events are queued on
    /// `events` and written by [`Self::terminating`] before it returns.
    async fn drain_node(
        &self,
        delivery: &Delivery,
        notification: &LifecycleNotification,
        invocation: &Invocation,
        client: &kube::Client,
        events: &DrainEvents,
    ) -> Result<DeliveryOutcome, DrainError> {
        let action = &notification.action;
        // Ask Auto Scaling first: only a pending action (this token, this hook) may drain a
        // node. A stale redelivery, a replayed or forged message, or a typo'd hook name must
        // not cordon and empty a live node. The heartbeat is the cheapest call that proves
        // the action exists, and it also restarts the hook's heartbeat timer. It runs
        // concurrently with the node lookup (which only reads); its answer is looked at
        // before the first write.
        let heartbeat = async {
            let hook = self
                .hooks
                .get_or_default(
                    &self.autoscaling,
                    &action.auto_scaling_group_name,
                    &action.lifecycle_hook_name,
                )
                .await;
            let mut keeper =
                HeartbeatKeeper::new(action.clone(), &hook, notification.time, notification.time);
            let beat = keeper.beat(&self.autoscaling).await;
            (keeper, beat)
        };
        let (node, (mut keeper, beat)) = tokio::join!(
            find_node(client, &self.instances, &action.instance_id),
            heartbeat
        );
        let node = node.map_err(|source| DrainError::NodeLookup {
            instance_id: action.instance_id.clone(),
            source,
        })?;
        let Some(node) = node else {
            tracing::info!(
                step = "no_node",
                "the instance has no node (never joined or already gone): completing"
            );
            let outcome = self
                .complete(notification, LifecycleActionResult::Continue)
                .await?;
            self.metrics(notification, None, "NoNode").emit();
            return Ok(DeliveryOutcome::NoNode(outcome));
        };
        let node_name = node.metadata.name.clone().unwrap_or_default();
        tracing::Span::current().record("node", node_name.as_str());
        if !invocation.budget.has_working_slice() {
            let error = DrainError::NoTimeToWork {
                remaining: invocation.budget.remaining(),
                margin: self.settings.lifecycle.hand_over_margin,
            };
            tracing::error!(step = "no_time_to_work", %error, "nothing done");
            return Err(error);
        }
        let kube_error = |source| DrainError::Kubernetes {
            node: node_name.clone(),
            source,
        };

        if beat.is_err() {
            tracing::info!(
                step = "action_gone",
                "Auto Scaling has no pending lifecycle action for this token: nothing drained"
            );
            return Ok(DeliveryOutcome::ActionGone);
        }

        // The node's pods are listed while the node is claimed and cordoned: a read, and the
        // watch that follows the list sees every pod the claim's cordon did not stop.
        let prefetch = PrefetchedPods::start(client, &node_name);
        let holder = LeaseHolder {
            id: invocation.request_id.clone(),
            lease_duration: self.settings.lease_duration,
        };
        let nodes: Api<Node> = Api::all(client.clone());
        let mut node = node;
        let mut waited_for_lease = false;
        let taint = self.settings.taint.as_ref().map(|t| t.to_taint());
        let (node, checkpoint, resumed, cordon) = loop {
            let claim = lease::claim(
                &nodes,
                node,
                action,
                &holder,
                self.settings.drain_timeout,
                taint.as_ref(),
            )
            .await
            .map_err(kube_error)?;
            match claim {
                Claim::Claimed {
                    node,
                    checkpoint,
                    resumed,
                    cordon,
                } => break (*node, checkpoint, resumed, cordon),
                Claim::HeldByOther { holder, until } => {
                    // A live holder renews its lease; a dead one (killed mid-drain) does not.
                    // Wait once for the lease to run out, within this invocation's budget,
                    // then look again: a renewed lease means a duplicate, an expired one is
                    // taken over, so a redelivery after a crash is never lost.
                    let wait = lease_wait(until);
                    if waited_for_lease || wait >= invocation.budget.remaining() {
                        tracing::info!(step = "duplicate", holder, until = %until, "another invocation is draining this node: exiting quietly");
                        return Ok(DeliveryOutcome::Duplicate { holder });
                    }
                    tracing::info!(step = "lease_wait", holder, until = %until, "another invocation holds the drain: waiting for its lease to run out or be renewed");
                    waited_for_lease = true;
                    // Heartbeats go on while waiting: the wait may be as long as the lease,
                    // and the hook's heartbeat timeout may be shorter.
                    if keeper
                        .keep_alive(&self.autoscaling, tokio::time::sleep(wait))
                        .await
                        .is_err()
                    {
                        tracing::info!(
                            step = "action_gone",
                            "Auto Scaling no longer has this lifecycle action: stopping"
                        );
                        return Ok(DeliveryOutcome::ActionGone);
                    }
                    node = match nodes.get_opt(&node_name).await.map_err(kube_error)? {
                        Some(node) => node,
                        None => {
                            let outcome = self
                                .complete(notification, LifecycleActionResult::Continue)
                                .await?;
                            return Ok(DeliveryOutcome::NoNode(outcome));
                        }
                    };
                }
                Claim::AlreadyCompleted => {
                    tracing::info!(
                        step = "already_completed",
                        "this lifecycle action's drain is complete already"
                    );
                    return Ok(DeliveryOutcome::AlreadyCompleted);
                }
                Claim::NodeGone => {
                    tracing::info!(step = "no_node", "the node was deleted: completing");
                    let outcome = self
                        .complete(notification, LifecycleActionResult::Continue)
                        .await?;
                    return Ok(DeliveryOutcome::NoNode(outcome));
                }
            }
        };
        let node_reference = DrainEvents::node_reference(&node_name, node.metadata.uid.as_deref());
        if resumed {
            tracing::info!(step = "resumed", started_at = %checkpoint.started_at, deadline = %checkpoint.deadline, continuations = checkpoint.continuations, "resuming the drain");
        } else {
            tracing::info!(step = "drain_started", deadline = %checkpoint.deadline, "drain started");
            events.normal(
                &node_reference,
                reason::DRAIN_STARTED,
                format!(
                    "Draining node {node_name} for the termination of instance {} (Auto Scaling group {}, deadline {})",
                    action.instance_id, action.auto_scaling_group_name, checkpoint.deadline
                ),
            );
        }
        if cordon.changed_anything() {
            tracing::info!(
                step = "cordoned",
                labelled = cordon.labelled,
                cordoned = cordon.cordoned,
                tainted = cordon.tainted,
                "node excluded from load balancers and cordoned"
            );
            events.normal(
                &node_reference,
                reason::CORDONED,
                format!("Node {node_name} excluded from external load balancers and marked unschedulable"),
            );
        }

        let session_settings = SessionSettings {
            settle: self.settings.settle,
            eviction_concurrency: self.settings.eviction_concurrency,
            backoff: Backoff {
                base: self.settings.eviction_backoff,
                max: self
                    .settings
                    .eviction_backoff_max
                    .max(self.settings.eviction_backoff),
            },
            grace_period_seconds: self.settings.pod_grace_period.map(grace_to_send),
            stuck_pod_after: self.settings.stuck_pod_after,
        };
        let mut session = DrainSession {
            client,
            node_name: node_name.clone(),
            node_uid: node.metadata.uid.clone(),
            holder: &holder,
            settings: &session_settings,
            events,
            checkpoint,
            last_written: Some(node),
            stats: SessionStats::default(),
            node_not_ready_since: None,
            reported_stuck: Default::default(),
            renew_failures: 0,
            first_listed: None,
            prefetched_pods: prefetch.take().await,
        };
        let hand_over_at = invocation.budget.hand_over_at();
        let driven = keeper
            .keep_alive(
                &self.autoscaling,
                Box::pin(self.drive(&mut session, events, hand_over_at)),
            )
            .await;
        let stats = session.stats;
        let mut last_written = session.last_written.take();
        let end = match driven {
            Err(ActionGone) => {
                tracing::warn!(
                    step = "action_gone",
                    "Auto Scaling no longer has this lifecycle action (completed elsewhere or timed out): stopping"
                );
                self.release(&nodes, &node_name, &holder, &mut last_written)
                    .await;
                self.metrics(notification, Some(stats), "ActionGone").emit();
                return Ok(DeliveryOutcome::ActionGone);
            }
            Ok(result) => result.map_err(kube_error)?,
        };
        match end {
            Driven::HandOver => {
                let handed =
                    match lease::update(&nodes, &node_name, &holder, &mut last_written, |c, now| {
                        c.handed_over(now)
                    })
                    .await
                    .map_err(kube_error)?
                    {
                        Update::Written(_) => true,
                        Update::LeaseLost => false,
                        Update::NodeGone => {
                            let outcome = self
                                .complete(notification, LifecycleActionResult::Continue)
                                .await?;
                            return Ok(DeliveryOutcome::NoNode(outcome));
                        }
                    };
                if !handed {
                    return Ok(DeliveryOutcome::LeaseLost);
                }
                let handed = hand_over(
                    &self.autoscaling,
                    &self.notifications,
                    &mut keeper,
                    delivery,
                    self.settings.lifecycle.continuation_topic_arn.as_deref(),
                )
                .await
                .map_err(|source| DrainError::HandOver {
                    node: node_name.clone(),
                    source,
                })?;
                self.metrics(notification, Some(stats), "HandedOver")
                    .metric("Continuations", 1.0, crate::telemetry::Unit::Count)
                    .emit();
                match handed {
                    HandOver::Published { continuation, .. } => {
                        tracing::info!(
                            step = "handed_over",
                            continuation,
                            pods_evicted = stats.pods_evicted,
                            "invocation time nearly up: drain handed to a fresh invocation"
                        );
                        Ok(DeliveryOutcome::HandedOver { continuation })
                    }
                    HandOver::ActionGone => Ok(DeliveryOutcome::ActionGone),
                }
            }
            Driven::ForceIncomplete(pods) => {
                self.release(&nodes, &node_name, &holder, &mut last_written)
                    .await;
                self.metrics(notification, Some(stats), "ForceIncomplete")
                    .emit();
                Err(DrainError::ForceIncomplete {
                    node: node_name.clone(),
                    pods,
                })
            }
            Driven::LeaseLost => {
                tracing::info!(
                    step = "lease_lost",
                    "another invocation took over the drain: stopping"
                );
                Ok(DeliveryOutcome::LeaseLost)
            }
            Driven::Finished(drain) => {
                let result = match &drain {
                    DrainEnd::EvictionFailure(_) => self.settings.timeout_result,
                    _ => LifecycleActionResult::Continue,
                };
                let outcome = self.complete(notification, result).await?;
                let started_at = session.checkpoint.started_at;
                let to_warm_pool = notification.route.destination == InstancePlace::WarmPool;
                let completed =
                    lease::update(&nodes, &node_name, &holder, &mut last_written, |c, now| {
                        let mut next = c.handed_over(now);
                        next.continuations = c.continuations;
                        // Without a settle period the drained time was not written yet.
                        next.drained_at = c.drained_at.or(Some(now));
                        next.completed_at = Some(now);
                        // Scale-in with reuse: the node returns under its name; the mark
                        // lets the launching hook recognise the return (README "Warm pools").
                        if to_warm_pool {
                            next.to_warm_pool_at = Some(now);
                        }
                        next
                    })
                    .await;
                if to_warm_pool {
                    tracing::info!(
                        step = "to_warm_pool",
                        recorded = completed.is_ok(),
                        "the instance goes back to the warm pool: the node keeps its drain record so its return is recognised"
                    );
                }
                if let Err(error) = completed {
                    tracing::warn!(%error, "could not mark the drain checkpoint completed (harmless: a duplicate would find no active action)");
                }
                let duration = Timestamp::now().duration_since(started_at);
                tracing::info!(step = "completed", result = result.as_str(), completion = ?outcome, drain = drain.label(), drain_seconds = duration.as_secs_f64(), "lifecycle action completed");
                events.normal(
                    &node_reference,
                    reason::LIFECYCLE_ACTION_COMPLETED,
                    format!(
                        "Lifecycle action of instance {} completed with {} ({})",
                        action.instance_id,
                        result.as_str(),
                        drain.label()
                    ),
                );
                self.metrics(notification, Some(stats), drain.label())
                    .metric(
                        "DrainDuration",
                        duration.as_secs_f64().max(0.0),
                        crate::telemetry::Unit::Seconds,
                    )
                    .emit();
                Ok(DeliveryOutcome::Completed {
                    result,
                    outcome,
                    drain,
                })
            }
        }
    }

    /// The session, plus what happens at the deadline (report, or force and settle).
    async fn drive(
        &self,
        session: &mut DrainSession<'_>,
        events: &DrainEvents,
        hand_over_at: tokio::time::Instant,
    ) -> Result<Driven, kube::Error> {
        let end = session.run(hand_over_at).await?;
        let stuck = match end {
            SessionEnd::Settled => return Ok(Driven::Finished(DrainEnd::Drained)),
            SessionEnd::NodeGone => return Ok(Driven::Finished(DrainEnd::NodeGone)),
            SessionEnd::HandOver => return Ok(Driven::HandOver),
            SessionEnd::LeaseLost => return Ok(Driven::LeaseLost),
            SessionEnd::PodsUnknown(cause) => {
                let note = format!(
                    "The drain deadline of node {} passed and its pods could not be listed ({cause}): they may still be running. Completing the lifecycle action with {}.",
                    session.node_name,
                    self.settings.timeout_result.as_str()
                );
                tracing::warn!(step = "pod_eviction_failure", cause, "{note}");
                events.warning(
                    &session.node_reference(),
                    reason::POD_EVICTION_FAILURE,
                    note,
                );
                return Ok(Driven::Finished(DrainEnd::EvictionFailure(vec![format!(
                    "pods unknown: {cause}"
                )])));
            }
            SessionEnd::DeadlinePassed(stuck) => stuck,
        };
        let listed: Vec<String> = stuck.iter().map(ToString::to_string).collect();
        let node_reference = session.node_reference();
        if !self.settings.force {
            let note = format!(
                "{} pod(s) could not be evicted from node {} before the drain deadline: {}. Completing the lifecycle action with {}.",
                stuck.len(),
                session.node_name,
                listed.join(", "),
                self.settings.timeout_result.as_str()
            );
            tracing::warn!(step = "pod_eviction_failure", pods = ?listed, "{note}");
            events.warning(&node_reference, reason::POD_EVICTION_FAILURE, note);
            return Ok(Driven::Finished(DrainEnd::EvictionFailure(listed)));
        }
        let (deleted, failed) = self.force_delete(session, &stuck).await;
        let mut note = format!(
            "Drain deadline passed: deleted {} pod(s) that eviction could not move (DRAIN_FORCE): {}",
            deleted.len(),
            deleted.join(", ")
        );
        if !failed.is_empty() {
            note.push_str(&format!(
                "; could not delete {} (retried by the next invocation): {}",
                failed.len(),
                failed.join(", ")
            ));
        }
        tracing::warn!(step = "forced", pods = ?deleted, failed = ?failed, "{note}");
        events.warning(&node_reference, reason::DRAIN_FORCED, note);
        if !failed.is_empty() {
            // Completing now would let the instance go with the pods still running, which
            // is what force is configured to prevent: fail the invocation so it is retried.
            return Ok(Driven::ForceIncomplete(failed));
        }
        if let Some(end) = session.mark_drained().await? {
            return Ok(match end {
                SessionEnd::LeaseLost => Driven::LeaseLost,
                _ => Driven::Finished(DrainEnd::NodeGone),
            });
        }
        Ok(match session.settle(hand_over_at).await? {
            SessionEnd::HandOver => Driven::HandOver,
            SessionEnd::LeaseLost => Driven::LeaseLost,
            _ => Driven::Finished(DrainEnd::Forced(deleted)),
        })
    }

    /// Deletes the pods eviction could not move, `EVICTION_CONCURRENCY` at a time (each
    /// retrying on its own): (deleted, failed after retries).
    async fn force_delete(
        &self,
        session: &DrainSession<'_>,
        stuck: &[StuckPod],
    ) -> (Vec<String>, Vec<String>) {
        use futures::StreamExt;
        let grace = session.settings.grace_period_seconds;
        // Pods already terminating are on their way; a second DELETE would change nothing.
        let outcomes: Vec<(String, ForcedDeletion)> =
            futures::stream::iter(stuck.iter().filter(|p| p.why != StuckReason::Terminating))
                .map(|pod| async move {
                    let outcome = delete_pod_with_retries(session.client, &pod.pod, grace).await;
                    (pod.pod.to_string(), outcome)
                })
                .buffer_unordered(session.settings.eviction_concurrency.max(1))
                .collect()
                .await;
        let mut deleted = Vec::new();
        let mut failed = Vec::new();
        for (pod, outcome) in outcomes {
            match outcome {
                ForcedDeletion::Deleted => deleted.push(pod),
                ForcedDeletion::AlreadyGone => {}
                ForcedDeletion::Refused(error) => {
                    tracing::warn!(pod, %error, "the API server refused to delete the pod (check the role's force-delete group)");
                }
                ForcedDeletion::Failed(error) => {
                    tracing::warn!(pod, %error, "could not delete the pod");
                    failed.push(pod);
                }
            }
        }
        deleted.sort();
        failed.sort();
        (deleted, failed)
    }

    async fn complete(
        &self,
        notification: &LifecycleNotification,
        result: LifecycleActionResult,
    ) -> Result<CompletionOutcome, DrainError> {
        let outcome = complete_action(&self.autoscaling, &notification.action, result)
            .await
            .map_err(|source| DrainError::Complete {
                instance_id: notification.action.instance_id.clone(),
                source,
            })?;
        if outcome == CompletionOutcome::NoActiveAction {
            tracing::info!(
                step = "completed",
                result = result.as_str(),
                "no active lifecycle action: it was completed already or timed out"
            );
        }
        Ok(outcome)
    }

    /// Lets go of the lease so another invocation need not wait for it to expire.
    async fn release(
        &self,
        nodes: &Api<Node>,
        node_name: &str,
        holder: &LeaseHolder,
        last_written: &mut Option<Node>,
    ) {
        let released = lease::update(nodes, node_name, holder, last_written, |c, now| {
            let mut next = c.handed_over(now);
            next.continuations = c.continuations;
            next
        })
        .await;
        if let Err(error) = released {
            tracing::debug!(%error, "could not release the drain lease; it expires by itself");
        }
    }

    fn metrics(
        &self,
        notification: &LifecycleNotification,
        stats: Option<SessionStats>,
        outcome: &str,
    ) -> crate::telemetry::MetricSet {
        DrainMetrics::new(
            FUNCTION_NAME,
            notification,
            stats.unwrap_or_default(),
            outcome,
        )
        .metric_set()
    }
}

/// The watch of the node's pods, started in the background so its first list overlaps the
/// claim; stopped when the drain does not start.
struct PrefetchedPods {
    task: tokio::task::JoinHandle<NodePods>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl PrefetchedPods {
    fn start(client: &kube::Client, node_name: &str) -> Self {
        let mut pods = NodePods::watch(client, node_name);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // Until the list is complete or the session wants the watch (listed or not:
            // `changed` is cancel-safe and the list in progress lives in the stream).
            let listed = async {
                while !pods.is_synced() {
                    if pods.changed().await.is_err() {
                        break;
                    }
                }
            };
            tokio::select! {
                _ = listed => {}
                _ = stopped => {}
            }
            pods
        });
        Self {
            task,
            stop: Some(stop),
        }
    }

    /// The watch, at once; `None` if its task failed (the session starts its own).
    async fn take(mut self) -> Option<NodePods> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.ok()
    }
}

impl Drop for PrefetchedPods {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What driving the drain in this invocation came to.
enum Driven {
    Finished(DrainEnd),
    HandOver,
    LeaseLost,
    /// Forced deletion of these pods kept failing: retry the invocation.
    ForceIncomplete(Vec<String>),
}

/// How long until a lease that runs `until` has expired (plus a little slack for clock
/// differences between invocations); zero when it has already.
fn lease_wait(until: jiff::Timestamp) -> std::time::Duration {
    let left = until.duration_since(jiff::Timestamp::now());
    std::time::Duration::try_from(left)
        .unwrap_or_default()
        .saturating_add(std::time::Duration::from_millis(500))
}
