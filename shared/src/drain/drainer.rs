//! The terminating hook: one Lambda event in, every record handled, the lifecycle action
//! completed when the node is drained (or cannot be).
//!
//! The story of one drain, in `Drainer::drain_node`'s order:
//! 1. **find** the instance's Node while proving the lifecycle action is still pending
//!    (`find_node`);
//! 2. **claim** the drain on the Node, or resume it, or leave it to the invocation already
//!    on it (`claim`, over [`super::lease`]);
//! 3. **announce** it: log lines and Events for the start and the cordon (`announce`);
//! 4. **drive** the drain session until it ends, heartbeating meanwhile, with the deadline
//!    policy of [`super::deadline`] (`drive`);
//! 5. **finish**: complete the action, hand over, or stop (`finish`, in `finish.rs`).
//!
//! [`Drainer`] is built once per execution environment and borrowed by every invocation;
//! the per-record loop is the hooks' shared skeleton ([`crate::lifecycle::handler`]).

use std::ops::ControlFlow;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Api;
use kube::runtime::events::{Recorder, Reporter};
use tracing::Instrument;

use crate::aws::{AutoScaling, Instances, LifecycleActionResult, Notifications};
use crate::cluster::connection::KubeConnection;
use crate::cluster::{AfterFailure, ThrottledRetries};
use crate::lifecycle::hand_over::{HandOver, predecessor_of};
use crate::lifecycle::handler::{
    Clients, HandledRecord, HookClients, HookContext, HookHandler, Invocation,
};
use crate::lifecycle::heartbeat::{ActionGone, HeartbeatKeeper, PendingUnproven};
use crate::lifecycle::node::{NodeLookupError, find_node};
use crate::lifecycle::notification::{
    Delivery, LifecycleMessage, LifecycleNotification, LifecycleTransition,
};
use crate::lifecycle::scope::ScopeDecision;
use crate::lifecycle::settings::DrainSettings;

use super::backoff::Backoff;
use super::deadline::{DeadlinePolicy, NextStep};
use super::events::{DrainEvents, reason};
use super::eviction::grace_to_send;
use super::lease::{self, Claim, LeaseHolder, NodeLease, lease_wait};
use super::load_balancers::LoadBalancerTarget;
use super::metrics::DrainMetrics;
use super::node_pods::PrefetchedPods;
use super::report::{DeliveryOutcome, DrainError, DrainReport};
use super::session::{DrainSession, SessionSettings, SessionStats};
use crate::aws::LoadBalancers;
use crate::node_marks::checkpoint::DrainCheckpoint;
use crate::node_marks::out_of_service::CordonReport;

/// How often a lifecycle drain waiting for a notice drain on its node looks again: the notice
/// drain lets go of its lease when it ends, and the lifecycle drain should follow at once.
const NOTICE_DRAIN_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// The function's name: the `Function` metric dimension and the Events' reporter.
pub const FUNCTION_NAME: &str = "terminating-hook";

/// Everything an invocation of the terminating hook needs, built once per execution
/// environment and borrowed by every invocation.
pub struct Drainer<C: HookClients> {
    pub context: HookContext<C, DrainSettings>,
    /// Whether Kubernetes Events are written (off only in tests that count API calls).
    pub record_events: bool,
    /// Elastic Load Balancing, for the wait until the instance's load balancers let go of it
    /// ([`super::load_balancers`]); `None`: the settle period only. The drain alone calls
    /// it, so it stays out of the client types every hook shares.
    pub load_balancers: Option<Box<dyn LoadBalancers>>,
}

impl<K, A, I, N> Drainer<Clients<K, A, I, N>>
where
    K: KubeConnection,
    A: AutoScaling,
    I: Instances,
    N: Notifications,
{
    pub fn new(
        kube: K,
        autoscaling: A,
        instances: I,
        notifications: N,
        settings: DrainSettings,
    ) -> Self {
        Self {
            context: HookContext::new(kube, autoscaling, instances, notifications, settings),
            record_events: true,
            load_balancers: None,
        }
    }
}

impl<C: HookClients> Drainer<C> {
    pub(super) fn settings(&self) -> &DrainSettings {
        &self.context.settings
    }

    /// Waits, after each drain, for the load balancers `client` reads, unless
    /// `LOAD_BALANCER_WAIT` is off.
    pub fn with_load_balancers(mut self, client: impl LoadBalancers + 'static) -> Self {
        if self.settings().load_balancer_wait {
            self.load_balancers = Some(Box::new(client));
        }
        self
    }

    /// What the drain of `instance_id`'s node waits for once the node is empty.
    pub(super) fn load_balancer_target<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> Option<LoadBalancerTarget<'a>> {
        Some(LoadBalancerTarget {
            client: self.load_balancers.as_deref()?,
            cluster: &self.settings().lifecycle.cluster.cluster_name,
            instance_id,
        })
    }
}

/// One terminating notification being handled: the record, the invocation it is handled in,
/// and the cluster's client and Events queue.
pub(super) struct DrainRequest<'a> {
    pub(super) delivery: &'a Delivery,
    pub(super) notification: &'a LifecycleNotification,
    pub(super) invocation: &'a Invocation,
    pub(super) client: &'a kube::Client,
    /// Queued here, written by [`Drainer::terminating`] before it returns.
    pub(super) events: &'a DrainEvents,
}

/// The drain as [`Drainer::claim`] took it.
struct ClaimedDrain {
    /// The node as the claim wrote it.
    node: Node,
    checkpoint: DrainCheckpoint,
    resumed: bool,
    cordon: CordonReport,
}

/// What looking up the instance's Node came to.
// Returned once per lookup, never stored in bulk: size does not matter.
#[allow(clippy::large_enum_variant)]
enum NodeLookup {
    /// The node, or `None` when the cluster has none.
    Found(Option<Node>),
    /// The API server kept throttling the lookup until the hand-over time.
    OutOfTime,
}

/// Why taking the drain took nothing.
enum Unclaimed {
    /// The delivery is done with (a duplicate, the action or node gone, ...).
    Done(DeliveryOutcome),
    /// The invocation's time is up before the drain could be taken: hand the notification
    /// to a fresh invocation.
    HandOver,
}

/// Where driving the session left the drain.
pub(super) struct DrainProgress {
    pub(super) next: NextStep,
    pub(super) stats: SessionStats,
    /// When the drain started (the first invocation's claim).
    pub(super) started_at: Timestamp,
}

impl<C: HookClients> HookHandler for Drainer<C> {
    type Outcome = DeliveryOutcome;
    type Error = DrainError;
    type Report = DrainReport;

    fn hand_over_margin(&self) -> std::time::Duration {
        self.settings().lifecycle.hand_over_margin
    }

    fn report(
        &self,
        records: Vec<HandledRecord<DeliveryOutcome, DrainError>>,
        _invocation: &Invocation,
    ) -> Result<DrainReport, DrainError> {
        DrainReport::from_records(records)
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
}

impl<C: HookClients> Drainer<C> {
    /// A terminating notification: ours or not, then the drain, with its Events written
    /// before returning.
    async fn terminating(
        &self,
        delivery: &Delivery,
        notification: &LifecycleNotification,
        invocation: &Invocation,
    ) -> Result<DeliveryOutcome, DrainError> {
        let decision = self
            .context
            .decide_scope(notification, invocation)
            .await
            .map_err(DrainError::Scope)?;
        if let ScopeDecision::Foreign(reason) = decision {
            tracing::info!(step = "foreign_group", %reason, "not this cluster's Auto Scaling group: left alone");
            return Ok(DeliveryOutcome::Foreign(reason.to_string()));
        }

        let client = self.context.kube.client().await?;
        let events = self.events_queue(&client, invocation);
        let request = DrainRequest {
            delivery,
            notification,
            invocation,
            client: &client,
            events: &events,
        };
        let outcome = Box::pin(self.drain_node(&request)).await;
        events.flush().await;
        outcome
    }

    /// The queue of this invocation's Events (disabled when `record_events` is off).
    pub fn events_queue(&self, client: &kube::Client, invocation: &Invocation) -> DrainEvents {
        if !self.record_events {
            return DrainEvents::disabled();
        }
        DrainEvents::new(Recorder::new(
            client.clone(),
            Reporter {
                controller: format!("open-node-manager/{FUNCTION_NAME}"),
                instance: Some(invocation.request_id.clone()).filter(|id| !id.is_empty()),
            },
        ))
    }

    /// From the instance's Node to the completion or hand-over: find, claim, announce,
    /// drive, finish. Events are queued on `events` and written by [`Self::terminating`].
    async fn drain_node(&self, request: &DrainRequest<'_>) -> Result<DeliveryOutcome, DrainError> {
        let (node, mut keeper) = match self.find_node(request).await? {
            ControlFlow::Continue(found) => found,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        // The node's pods are listed while the node is claimed and cordoned: a read, and the
        // watch that follows the list sees every pod the claim's cordon did not stop.
        let prefetch = PrefetchedPods::start(request.client, &name);
        let mut lease = NodeLease {
            nodes: Api::all(request.client.clone()),
            name,
            holder: LeaseHolder {
                id: request.invocation.request_id.clone(),
                lease_duration: self.settings().lease_duration,
            },
            last_written: None,
        };
        // Taking the drain is bounded too: a claim still without an answer at the cut-off (a
        // brownout) is handed over like one the server kept throttling (a claim that landed
        // is taken over once its lease lapses).
        let claim = self.claim(&lease, node, request, &mut keeper);
        let claimed =
            match tokio::time::timeout_at(request.invocation.budget.cutoff_at(), claim).await {
                Ok(claimed) => claimed?,
                Err(_) => ControlFlow::Break(Unclaimed::HandOver),
            };
        let claimed = match claimed {
            ControlFlow::Continue(claimed) => claimed,
            ControlFlow::Break(Unclaimed::Done(outcome)) => return Ok(outcome),
            ControlFlow::Break(Unclaimed::HandOver) => {
                return self.hand_over_unclaimed(request, &mut keeper).await;
            }
        };
        let node_reference =
            DrainEvents::node_reference(&lease.name, claimed.node.metadata.uid.as_deref());
        self.announce(&claimed, &lease.name, &node_reference, request);
        let progress = self
            .drive(claimed, prefetch, &mut lease, &mut keeper, request)
            .await?;
        let progress = match progress {
            ControlFlow::Continue(progress) => progress,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        self.finish(progress, &mut lease, &node_reference, request, &mut keeper)
            .await
    }

    /// The instance's Node, looked up while a heartbeat proves the action still pending.
    ///
    /// Auto Scaling is asked first: only a pending action (this token, this hook) may drain
    /// a node. A stale redelivery, a replayed or forged message, or a typo'd hook name must
    /// not cordon and empty a live node. The heartbeat is the cheapest call that proves the
    /// action exists, and it also restarts the hook's heartbeat timer. It runs concurrently
    /// with the node lookup (which only reads); its answer is looked at before the first
    /// write.
    async fn find_node(
        &self,
        request: &DrainRequest<'_>,
    ) -> Result<ControlFlow<DeliveryOutcome, (Node, HeartbeatKeeper)>, DrainError> {
        let (notification, invocation) = (request.notification, request.invocation);
        let action = &notification.action;
        // Whether the settings leave this invocation time to work at all (not whether a slow
        // lookup used it up: the drain then hands over).
        let has_time_to_work = invocation.budget.has_working_slice();
        let heartbeat = async {
            let mut keeper = self.context.heartbeat_keeper(notification).await;
            let beat = keeper.prove_pending(&self.context.autoscaling).await;
            (keeper, beat)
        };
        // Bounded: a heartbeat still without an answer at the cut-off fails the invocation
        // (nothing was written; Lambda retries it), the last resort, since a hand-over needs
        // that heartbeat. The lookup itself ends at the hand-over time.
        let joined = async { tokio::join!(self.look_up_node(request), heartbeat) };
        let (node, (mut keeper, beat)) =
            tokio::time::timeout_at(invocation.budget.cutoff_at(), joined)
                .await
                .map_err(|_| DrainError::NoAnswerBeforeHandOver {
                    instance_id: action.instance_id.clone(),
                })?;
        // Without proof that the action is pending nothing is written for it (not even a
        // completion): the invocation fails with the reason, and Lambda retries it.
        if let Err(PendingUnproven::Unanswered(source)) = beat {
            tracing::error!(step = "action_unproven", error = %source, "cannot prove the lifecycle action is pending: nothing done");
            return Err(DrainError::ActionUnproven {
                instance_id: action.instance_id.clone(),
                source,
            });
        }
        let pending = beat.is_ok();
        let node = match node {
            Ok(NodeLookup::Found(Some(node))) => node,
            Ok(NodeLookup::Found(None)) => return self.complete_without_node(notification).await,
            Ok(NodeLookup::OutOfTime) => {
                if let Some(outcome) = self.may_not_drain(invocation, has_time_to_work, pending)? {
                    return Ok(ControlFlow::Break(outcome));
                }
                let outcome = self.hand_over_unclaimed(request, &mut keeper).await?;
                return Ok(ControlFlow::Break(outcome));
            }
            Err(source) => {
                return Err(DrainError::NodeLookup {
                    instance_id: action.instance_id.clone(),
                    source,
                });
            }
        };
        let node_name = node.metadata.name.as_deref().unwrap_or_default();
        tracing::Span::current().record("node", node_name);
        if let Some(outcome) = self.may_not_drain(invocation, has_time_to_work, pending)? {
            return Ok(ControlFlow::Break(outcome));
        }
        Ok(ControlFlow::Continue((node, keeper)))
    }

    /// The instance has no node (never joined or already gone): complete.
    async fn complete_without_node(
        &self,
        notification: &LifecycleNotification,
    ) -> Result<ControlFlow<DeliveryOutcome, (Node, HeartbeatKeeper)>, DrainError> {
        tracing::info!(
            step = "no_node",
            "the instance has no node (never joined or already gone): completing"
        );
        let outcome = self
            .complete(notification, LifecycleActionResult::Continue)
            .await?;
        self.metrics(notification, None, "NoNode").emit();
        Ok(ControlFlow::Break(DeliveryOutcome::NoNode(outcome)))
    }

    /// Why this invocation may not work on the drain (nor hand it over), if it may not: the
    /// settings leave it no time to work (an error: a hand-over would loop), or Auto Scaling
    /// has no pending action for its token.
    fn may_not_drain(
        &self,
        invocation: &Invocation,
        has_time_to_work: bool,
        pending: bool,
    ) -> Result<Option<DeliveryOutcome>, DrainError> {
        if !has_time_to_work {
            let error = DrainError::NoTimeToWork {
                remaining: invocation.budget.remaining(),
                margin: self.settings().lifecycle.hand_over_margin,
            };
            tracing::error!(step = "no_time_to_work", %error, "nothing done");
            return Err(error);
        }
        if !pending {
            tracing::info!(
                step = "action_gone",
                "Auto Scaling has no pending lifecycle action for this token: nothing drained"
            );
            return Ok(Some(DeliveryOutcome::ActionGone));
        }
        Ok(None)
    }

    /// The instance's Node ([`find_node`]), looked up again while the API server throttles
    /// the lookup, until the hand-over time (a call still in flight then is abandoned).
    async fn look_up_node(
        &self,
        request: &DrainRequest<'_>,
    ) -> Result<NodeLookup, NodeLookupError> {
        let hand_over_at = request.invocation.budget.hand_over_at();
        let instance_id = &request.notification.action.instance_id;
        let mut retries = ThrottledRetries::until(hand_over_at);
        let lookup = async {
            loop {
                let error =
                    match find_node(request.client, &self.context.instances, instance_id).await {
                        Err(NodeLookupError::Kube(error)) => error,
                        other => return other.map(NodeLookup::Found),
                    };
                match retries.after(&error).await {
                    AfterFailure::TryAgain => {}
                    AfterFailure::OutOfTime => return Ok(NodeLookup::OutOfTime),
                    AfterFailure::NotThrottled => return Err(NodeLookupError::Kube(error)),
                }
            }
        };
        tokio::time::timeout_at(hand_over_at, lookup)
            .await
            .unwrap_or(Ok(NodeLookup::OutOfTime))
    }

    /// Takes the drain on the node (cordoning it in the same write), resumes it, or leaves it
    /// to the live invocation already on it.
    async fn claim(
        &self,
        lease: &NodeLease,
        mut node: Node,
        request: &DrainRequest<'_>,
        keeper: &mut HeartbeatKeeper,
    ) -> Result<ControlFlow<Unclaimed, ClaimedDrain>, DrainError> {
        let notification = request.notification;
        let mut waited_for_lease = false;
        let mut retries = ThrottledRetries::until(request.invocation.budget.hand_over_at());
        loop {
            // Guarded by the node's resourceVersion: a retry after a throttled try that did
            // land meets a conflict, reads the node again and resumes its own claim.
            let claim = match self.claim_once(lease, node.clone(), request).await {
                Ok(claim) => claim,
                Err(error) => match retries.after(&error).await {
                    AfterFailure::TryAgain => continue,
                    AfterFailure::OutOfTime => return Ok(ControlFlow::Break(Unclaimed::HandOver)),
                    AfterFailure::NotThrottled => return Err(kube_error(&lease.name, error)),
                },
            };
            let (holder, until) = match claim {
                Claim::Claimed {
                    node,
                    checkpoint,
                    resumed,
                    cordon,
                } => {
                    return Ok(ControlFlow::Continue(ClaimedDrain {
                        node: *node,
                        checkpoint,
                        resumed,
                        cordon,
                    }));
                }
                Claim::HeldByOther {
                    holder,
                    until,
                    notice_drain: true,
                } => {
                    node = match self
                        .outwait_notice_drain(
                            lease,
                            (holder, until),
                            &mut waited_for_lease,
                            request,
                            keeper,
                        )
                        .await?
                    {
                        ControlFlow::Continue(node) => node,
                        ControlFlow::Break(unclaimed) => return Ok(ControlFlow::Break(unclaimed)),
                    };
                    continue;
                }
                Claim::HeldByOther { holder, until, .. } => (holder, until),
                unclaimed => {
                    return self
                        .not_claimed(unclaimed, notification)
                        .await
                        .map(|outcome| ControlFlow::Break(Unclaimed::Done(outcome)));
                }
            };
            node = match self
                .outlast_lease(lease, (holder, until), waited_for_lease, request, keeper)
                .await?
            {
                ControlFlow::Continue(node) => node,
                ControlFlow::Break(unclaimed) => return Ok(ControlFlow::Break(unclaimed)),
            };
            waited_for_lease = true;
        }
    }

    /// One try at taking the drain of `node` ([`lease::claim`]).
    async fn claim_once(
        &self,
        lease: &NodeLease,
        node: Node,
        request: &DrainRequest<'_>,
    ) -> Result<Claim, kube::Error> {
        let taint = self.settings().taint.as_ref().map(|t| t.to_taint());
        let predecessor = predecessor_of(request.delivery);
        lease::claim(
            &lease.nodes,
            node,
            &request.notification.action,
            &lease.holder,
            self.settings().drain_timeout,
            taint.as_ref(),
            predecessor.as_deref(),
        )
        .await
    }

    /// A drain started by an instance notice (Spot warning, ...) is on the node: it ends
    /// within its notice's time, then this drain takes it over (keeping what it did), so
    /// exactly one drain runs and this action is still completed. Wait for it, looking often
    /// (it lets go of its lease when it ends); hand over when this invocation runs out of
    /// time. Returns the node read again.
    async fn outwait_notice_drain(
        &self,
        lease: &NodeLease,
        (holder, until): (String, Timestamp),
        waited_for_lease: &mut bool,
        request: &DrainRequest<'_>,
        keeper: &mut HeartbeatKeeper,
    ) -> Result<ControlFlow<Unclaimed, Node>, DrainError> {
        if !*waited_for_lease {
            tracing::info!(step = "notice_drain_wait", holder, until = %until, "a drain for an instance notice is on this node: taking it over when it ends");
            *waited_for_lease = true;
        }
        let wait = lease_wait(until).min(NOTICE_DRAIN_POLL);
        if wait + NOTICE_DRAIN_POLL >= request.invocation.budget.remaining() {
            return Ok(ControlFlow::Break(Unclaimed::HandOver));
        }
        self.wait_for_lease(lease, wait, request.notification, keeper)
            .await
    }

    /// What a claim that took no drain and waits for no holder means for the delivery.
    async fn not_claimed(
        &self,
        claim: Claim,
        notification: &LifecycleNotification,
    ) -> Result<DeliveryOutcome, DrainError> {
        match claim {
            Claim::AlreadyCompleted => {
                tracing::info!(
                    step = "already_completed",
                    "this lifecycle action's drain is complete already"
                );
                Ok(DeliveryOutcome::AlreadyCompleted)
            }
            Claim::NodeGone => {
                tracing::info!(step = "no_node", "the node was deleted: completing");
                self.node_gone(notification).await
            }
            // Only a notice's decision joins; a lifecycle claim never gets this.
            Claim::JoinLifecycleDrain { .. } => Err(DrainError::Internal(
                "a lifecycle claim was told to join a lifecycle drain".to_owned(),
            )),
            Claim::Claimed { .. } | Claim::HeldByOther { .. } => Err(DrainError::Internal(
                "a claimed or held drain was taken for an unclaimed one".to_owned(),
            )),
        }
    }

    /// Another invocation holds the lease until `until`. A live holder renews its lease; a
    /// dead one (killed mid-drain) does not. Wait once for the lease to run out, within this
    /// invocation's budget, then look again (the node read again is returned): a renewed
    /// lease proves a live holder (a duplicate), an expired one is taken over, so a
    /// redelivery after a crash is never lost. A lease this invocation cannot wait out
    /// proves nothing: the notification is handed on rather than dropped.
    async fn outlast_lease(
        &self,
        lease: &NodeLease,
        (holder, until): (String, Timestamp),
        waited_for_lease: bool,
        request: &DrainRequest<'_>,
        keeper: &mut HeartbeatKeeper,
    ) -> Result<ControlFlow<Unclaimed, Node>, DrainError> {
        let wait = lease_wait(until);
        if waited_for_lease {
            tracing::info!(step = "duplicate", holder, until = %until, "another invocation is draining this node: exiting quietly");
            return Ok(ControlFlow::Break(Unclaimed::Done(
                DeliveryOutcome::Duplicate { holder },
            )));
        }
        if wait + NOTICE_DRAIN_POLL >= request.invocation.budget.remaining() {
            tracing::info!(step = "lease_outlasts_invocation", holder, until = %until, "another invocation's lease outlasts this invocation: handing the notification on");
            return Ok(ControlFlow::Break(Unclaimed::HandOver));
        }
        tracing::info!(step = "lease_wait", holder, until = %until, "another invocation holds the drain: waiting for its lease to run out or be renewed");
        self.wait_for_lease(lease, wait, request.notification, keeper)
            .await
    }

    /// Hands the notification to a fresh invocation before this one claimed anything (it ran
    /// out of time waiting for a notice drain to end or a lease to lapse, or the API server
    /// kept throttling the lookup or the claim until the hand-over time). The message keeps
    /// the predecessor it named, whose lease may still be on the node.
    async fn hand_over_unclaimed(
        &self,
        request: &DrainRequest<'_>,
        keeper: &mut HeartbeatKeeper,
    ) -> Result<DeliveryOutcome, DrainError> {
        let handed = self
            .context
            .hand_over(keeper, request.delivery)
            .await
            .map_err(|source| DrainError::HandOver {
                node: String::new(),
                source,
            })?;
        Ok(match handed {
            HandOver::Published { continuation, .. } => {
                tracing::info!(
                    step = "handed_over",
                    continuation,
                    "invocation time nearly up before the drain could be taken: handed to a fresh invocation"
                );
                DeliveryOutcome::HandedOver { continuation }
            }
            HandOver::ActionGone => DeliveryOutcome::ActionGone,
        })
    }

    /// Waits `wait` for another holder's lease to run out, heartbeating (the wait may be as
    /// long as the lease, the hook's heartbeat timeout shorter); then reads the node again.
    async fn wait_for_lease(
        &self,
        lease: &NodeLease,
        wait: std::time::Duration,
        notification: &LifecycleNotification,
        keeper: &mut HeartbeatKeeper,
    ) -> Result<ControlFlow<Unclaimed, Node>, DrainError> {
        if keeper
            .keep_alive(&self.context.autoscaling, tokio::time::sleep(wait))
            .await
            .is_err()
        {
            tracing::info!(
                step = "action_gone",
                "Auto Scaling no longer has this lifecycle action: stopping"
            );
            return Ok(ControlFlow::Break(Unclaimed::Done(
                DeliveryOutcome::ActionGone,
            )));
        }
        let node = lease
            .nodes
            .get_opt(&lease.name)
            .await
            .map_err(|source| kube_error(&lease.name, source))?;
        match node {
            Some(node) => Ok(ControlFlow::Continue(node)),
            None => self
                .node_gone(notification)
                .await
                .map(|outcome| ControlFlow::Break(Unclaimed::Done(outcome))),
        }
    }

    /// Says that the drain started (or resumed) and what the cordon changed.
    fn announce(
        &self,
        claimed: &ClaimedDrain,
        node_name: &str,
        node_reference: &ObjectReference,
        request: &DrainRequest<'_>,
    ) {
        let (action, events) = (&request.notification.action, request.events);
        let checkpoint = &claimed.checkpoint;
        if claimed.resumed {
            tracing::info!(step = "resumed", started_at = %checkpoint.started_at, deadline = %checkpoint.deadline, continuations = checkpoint.continuations, "resuming the drain");
        } else {
            tracing::info!(step = "drain_started", deadline = %checkpoint.deadline, "drain started");
            events.normal(
                node_reference,
                reason::DRAIN_STARTED,
                format!(
                    "Draining node {node_name} for the termination of instance {} (Auto Scaling group {}, deadline {})",
                    action.instance_id, action.auto_scaling_group_name, checkpoint.deadline
                ),
            );
        }
        let cordon = &claimed.cordon;
        if cordon.changed_anything() {
            tracing::info!(
                step = "cordoned",
                labelled = cordon.labelled,
                cordoned = cordon.cordoned,
                tainted = cordon.tainted,
                "node excluded from load balancers and cordoned"
            );
            events.normal(
                node_reference,
                reason::CORDONED,
                format!("Node {node_name} excluded from external load balancers and marked unschedulable"),
            );
        }
    }

    /// Runs the drain session (and the deadline policy) while heartbeating, until the
    /// session ends or the invocation has to hand over.
    async fn drive(
        &self,
        claimed: ClaimedDrain,
        prefetch: PrefetchedPods,
        lease: &mut NodeLease,
        keeper: &mut HeartbeatKeeper,
        request: &DrainRequest<'_>,
    ) -> Result<ControlFlow<DeliveryOutcome, DrainProgress>, DrainError> {
        let session_settings = self.session_settings();
        let prefetched = prefetch.take().await;
        let mut session = DrainSession::start(
            request.client,
            claimed.node,
            claimed.checkpoint,
            &lease.holder,
            &session_settings,
            request.events,
            prefetched,
        );
        session.load_balancers =
            self.load_balancer_target(&request.notification.action.instance_id);
        let policy = DeadlinePolicy {
            force: self.settings().force,
            timeout_result: self.settings().timeout_result,
            autoscaling: &self.context.autoscaling,
            action: &request.notification.action,
        };
        let budget = request.invocation.budget;
        let hand_over_at = budget.hand_over_at();
        // Every wait of the session ends at the hand-over time; a Kubernetes call still
        // without an answer shortly after it (a brownout) is abandoned, and the drain handed
        // over like one that stopped on time: its state is on the node, not in this future.
        let bounded = async {
            let session = policy.run_through_throttling(&mut session, request.events, hand_over_at);
            match tokio::time::timeout_at(budget.cutoff_at(), session).await {
                Ok(next) => next,
                Err(_) => {
                    tracing::warn!(
                        step = "cut_off",
                        "the Kubernetes API did not answer before the hand-over time: handing over"
                    );
                    Ok(NextStep::HandOver)
                }
            }
        };
        let ran = keeper
            .keep_alive(&self.context.autoscaling, Box::pin(bounded))
            .await;
        let stats = session.stats;
        let started_at = session.checkpoint.started_at;
        lease.last_written = session.last_written.take();
        let next = match ran {
            Err(ActionGone) => {
                tracing::warn!(
                    step = "action_gone",
                    "Auto Scaling no longer has this lifecycle action (completed elsewhere or timed out): stopping"
                );
                lease.release(budget.closing_write_bound()).await;
                self.metrics(request.notification, Some(stats), "ActionGone")
                    .emit();
                return Ok(ControlFlow::Break(DeliveryOutcome::ActionGone));
            }
            Ok(next) => next.map_err(|source| kube_error(&lease.name, source))?,
        };
        Ok(ControlFlow::Continue(DrainProgress {
            next,
            stats,
            started_at,
        }))
    }

    /// The knobs of a session, from the settings.
    pub(super) fn session_settings(&self) -> SessionSettings {
        let settings = self.settings();
        SessionSettings {
            settle: settings.settle,
            eviction_concurrency: settings.eviction_concurrency,
            backoff: Backoff {
                base: settings.eviction_backoff,
                max: settings.eviction_backoff_max.max(settings.eviction_backoff),
            },
            grace_period_seconds: settings.pod_grace_period.map(grace_to_send),
            stuck_pod_after: settings.stuck_pod_after,
            volume_detach: settings.volume_detach,
            blocked_report: settings.blocked_report,
            out_of_service_taint: settings.out_of_service_taint,
        }
    }

    pub(super) fn metrics(
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

pub(super) fn kube_error(node: &str, source: kube::Error) -> DrainError {
    DrainError::Kubernetes {
        node: node.to_owned(),
        source,
    }
}
