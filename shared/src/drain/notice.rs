//! The drain an instance notice starts (a Spot interruption warning, a rebalance
//! recommendation, scheduled maintenance, an instance stopping): no lifecycle action to prove,
//! heartbeat or complete, and an end the instance sets, not a hook timeout.
//!
//! It is the lifecycle drain's session on the same checkpoint, so the two never both run:
//! - a lifecycle drain already on the node is *joined* (the notice's end becomes its deadline
//!   and caps its grace periods, [`DrainCheckpoint::joined_by`]); nothing else is written;
//! - a lifecycle notification arriving during a notice drain waits for it to end and takes
//!   the drain over ([`DrainCheckpoint::decide`]), then completes its action.
//!
//! Which notices lead here, and when, is `crate::instance_notice`'s decision.

use std::ops::ControlFlow;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Api;

use super::drainer::{Drainer, kube_error};
use super::events::{DrainEvents, reason};
use super::lease::{self, Claim, LeaseHolder, NodeLease, Update, lease_wait};
use super::report::DrainError;
use super::session::{DrainSession, SessionEnd};
use crate::aws::LifecycleActionRef;
use crate::cluster::ThrottledRetries;
use crate::lifecycle::handler::{HookClients, Invocation};
use crate::node_marks::checkpoint::{
    DrainCheckpoint, DrainResult, InstanceNotice, checkpoint_of, record_patch,
};
use crate::node_marks::out_of_service::CordonReport;
use crate::node_marks::{PatchStep, Patched, Reread, patch_recomputing};

/// Time kept back, after outwaiting a lifecycle drain's lease, to claim the drain and start it.
const LOOK_AGAIN_ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(2);

/// What became of a notice's drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeDrainOutcome {
    /// The node is empty (and settled, as far as the instance's end allowed).
    Drained { pods_evicted: u32 },
    /// The instance's end (or the drain deadline) came first: these pods were still there.
    PodsLeft { pods: Vec<String> },
    /// Taken out of service only (`REBALANCE_ACTION=cordon`).
    CordonedOnly,
    /// A lifecycle drain of the instance is under way: the notice was added to it.
    JoinedLifecycleDrain,
    /// The node was drained already (by this notice's drain or a lifecycle drain).
    AlreadyDrained,
    /// Another invocation is draining the node for this notice.
    Duplicate { holder: String },
    /// A lifecycle drain took the drain over.
    TakenOverByLifecycleDrain,
    /// The node disappeared.
    NodeGone,
    /// This invocation ran out of time; the lease was released for whoever comes next.
    OutOfTime,
}

impl NoticeDrainOutcome {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Drained { .. } => "Drained",
            Self::PodsLeft { .. } => "PodsLeft",
            Self::CordonedOnly => "CordonedOnly",
            Self::JoinedLifecycleDrain => "JoinedLifecycleDrain",
            Self::AlreadyDrained => "AlreadyDrained",
            Self::Duplicate { .. } => "Duplicate",
            Self::TakenOverByLifecycleDrain => "TakenOverByLifecycleDrain",
            Self::NodeGone => "NodeGone",
            Self::OutOfTime => "OutOfTime",
        }
    }
}

/// One notice about one instance whose node was found.
pub struct NoticeDrainRequest<'a> {
    pub client: &'a kube::Client,
    pub node: Node,
    /// The instance's [`crate::node_marks::checkpoint::notice_action`].
    pub action: &'a LifecycleActionRef,
    pub notice: &'a InstanceNotice,
    /// When the drain must be over.
    pub deadline: Timestamp,
    pub invocation: &'a Invocation,
    pub events: &'a DrainEvents,
}

/// A notice drain this invocation took: the node as written and its checkpoint.
struct ClaimedNoticeDrain {
    node: Node,
    checkpoint: DrainCheckpoint,
    resumed: bool,
    cordon: CordonReport,
}

impl<C: HookClients> Drainer<C> {
    /// Takes the node out of service and drains it for `request.notice`, or joins the
    /// lifecycle drain already on it.
    pub async fn drain_for_notice(
        &self,
        request: NoticeDrainRequest<'_>,
    ) -> Result<NoticeDrainOutcome, DrainError> {
        let name = request.node.metadata.name.clone().unwrap_or_default();
        let nodes: Api<Node> = Api::all(request.client.clone());
        let holder = LeaseHolder {
            id: request.invocation.request_id.clone(),
            lease_duration: self.settings().lease_duration,
        };
        let mut claim = self.claim_for_notice(&request, &nodes, &holder).await?;
        if let ControlFlow::Break(NoticeDrainOutcome::JoinedLifecycleDrain) = claim
            && let Some(wait) = lifecycle_lease_to_outwait(&request)
        {
            // The lifecycle invocation's lease may be a crashed one's: outwaited once, it is
            // renewed by a live invocation (joined, done) or lapses (this notice stands in).
            tracing::info!(
                step = "lifecycle_drain_wait",
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "joined the lifecycle drain: looking again when its lease ends whether it still runs"
            );
            tokio::time::sleep(wait).await;
            claim = self.claim_for_notice(&request, &nodes, &holder).await?;
        }
        let claimed = match claim {
            ControlFlow::Continue(claimed) => claimed,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        announce(&request, &name, &claimed);
        if claimed
            .checkpoint
            .notice
            .as_ref()
            .is_some_and(|n| n.cordon_only)
        {
            return Ok(NoticeDrainOutcome::CordonedOnly);
        }
        let mut lease = NodeLease {
            nodes,
            name,
            holder,
            last_written: None,
        };
        self.run_notice_session(claimed.node, claimed.checkpoint, &mut lease, &request)
            .await
    }

    /// Claims the node's drain for the notice (cordoning it in the same write), within the
    /// invocation's time; or what became of the notice when the drain is not this
    /// invocation's to run.
    async fn claim_for_notice(
        &self,
        request: &NoticeDrainRequest<'_>,
        nodes: &Api<Node>,
        holder: &LeaseHolder,
    ) -> Result<ControlFlow<NoticeDrainOutcome, ClaimedNoticeDrain>, DrainError> {
        let taint = self.settings().taint.as_ref().map(|t| t.to_taint());
        let decide = |existing: Option<&DrainCheckpoint>, now| {
            DrainCheckpoint::decide_notice(
                existing,
                request.action,
                request.notice,
                &holder.id,
                now,
                request.deadline,
                holder.lease_duration,
            )
        };
        let name = request.node.metadata.name.as_deref().unwrap_or_default();
        let budget = request.invocation.budget;
        // Tried again while the API server throttles it (guarded by the node's
        // resourceVersion), until the hand-over time; a claim without an answer by then fails
        // the invocation, and the notice's redelivery tries again.
        let mut retries = ThrottledRetries::until(budget.hand_over_at());
        let claim = retries.retry(async || {
            lease::claim_with(nodes, request.node.clone(), taint.as_ref(), decide).await
        });
        let unanswered = || DrainError::NoAnswerBeforeHandOver {
            instance_id: request.action.instance_id.clone(),
        };
        let claim = tokio::time::timeout_at(budget.cutoff_at(), claim)
            .await
            .map_err(|_| unanswered())?
            .map_err(|source| kube_error(name, source))?
            .ok_or_else(unanswered)?;
        Ok(ControlFlow::Break(match claim {
            Claim::Claimed {
                node,
                checkpoint,
                resumed,
                cordon,
            } => {
                return Ok(ControlFlow::Continue(ClaimedNoticeDrain {
                    node: *node,
                    checkpoint,
                    resumed,
                    cordon,
                }));
            }
            Claim::HeldByOther { holder, .. } => {
                tracing::info!(
                    step = "duplicate",
                    holder,
                    "another invocation is draining this node for the notice: exiting quietly"
                );
                NoticeDrainOutcome::Duplicate { holder }
            }
            Claim::AlreadyCompleted => {
                tracing::info!(step = "already_drained", "the node was drained already");
                NoticeDrainOutcome::AlreadyDrained
            }
            Claim::JoinLifecycleDrain { node } => {
                join_lifecycle_drain(nodes, *node, request.notice).await?
            }
            Claim::NodeGone => NoticeDrainOutcome::NodeGone,
        }))
    }

    /// Runs the session on the claimed checkpoint and records how it ended.
    async fn run_notice_session(
        &self,
        node: Node,
        checkpoint: DrainCheckpoint,
        lease: &mut NodeLease,
        request: &NoticeDrainRequest<'_>,
    ) -> Result<NoticeDrainOutcome, DrainError> {
        let settings = self.session_settings();
        let stands_in = checkpoint.notice_stands_in;
        let mut session = DrainSession::start(
            request.client,
            node,
            checkpoint,
            &lease.holder,
            &settings,
            request.events,
            None,
        );
        session.load_balancers = self.load_balancer_target(&request.action.instance_id);
        let budget = request.invocation.budget;
        // A step the API server throttles past its request's bound is tried again, until the
        // hand-over time ([`ThrottledRetries`]).
        let hand_over_at = budget.hand_over_at();
        let run = async || session.run(hand_over_at).await;
        let mut retries = ThrottledRetries::until(hand_over_at);
        let retried = retries.retry(run);
        let ran = tokio::time::timeout_at(budget.cutoff_at(), retried)
            .await
            .unwrap_or(Ok(None))
            .map_err(|source| kube_error(&lease.name, source))?
            .unwrap_or(SessionEnd::HandOver);
        let node_reference = session.node_reference();
        lease.last_written = session.last_written.take();
        let ended = SessionReport {
            pods_evicted: session.stats.pods_evicted,
            node_reference: &node_reference,
            node_name: &lease.name,
            events: request.events,
        };
        let outcome = match ended.outcome(ran) {
            ControlFlow::Continue(outcome) => outcome,
            ControlFlow::Break(NoticeDrainOutcome::OutOfTime) => {
                lease.release(budget.closing_write_bound()).await;
                return Ok(NoticeDrainOutcome::OutOfTime);
            }
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        Ok(record_end(lease, budget.closing_write_bound(), outcome, stands_in).await)
    }
}

/// How long to wait for the lease of the lifecycle drain a notice joined to end, when that is
/// before the notice's deadline and this invocation's hand-over; `None` when it is not.
fn lifecycle_lease_to_outwait(request: &NoticeDrainRequest<'_>) -> Option<std::time::Duration> {
    let until = checkpoint_of(&request.node)?.lease.expires_at();
    let wait = lease_wait(until);
    let then = Timestamp::now().checked_add(wait).ok()?;
    let in_time = wait + LOOK_AGAIN_ALLOWANCE < request.invocation.budget.remaining();
    (in_time && then < request.deadline).then_some(wait)
}

/// Logs and records as Events that the node was taken out of service and, for a new drain,
/// that the drain started.
fn announce(request: &NoticeDrainRequest<'_>, name: &str, claimed: &ClaimedNoticeDrain) {
    let node_reference = DrainEvents::node_reference(name, claimed.node.metadata.uid.as_deref());
    let kind = request.notice.kind.as_str();
    let cordon = &claimed.cordon;
    if cordon.changed_anything() {
        tracing::info!(
            step = "cordoned",
            notice = kind,
            labelled = cordon.labelled,
            cordoned = cordon.cordoned,
            tainted = cordon.tainted,
            "node excluded from load balancers and cordoned"
        );
        request.events.normal(
            &node_reference,
            reason::CORDONED,
            format!("Node {name} excluded from external load balancers and marked unschedulable ({kind} of instance {})", request.action.instance_id),
        );
    }
    let is_cordon_only = claimed
        .checkpoint
        .notice
        .as_ref()
        .is_some_and(|n| n.cordon_only);
    if claimed.checkpoint.notice_stands_in {
        tracing::info!(step = "stands_in", notice = kind, deadline = %claimed.checkpoint.deadline, "no invocation runs the lifecycle drain on this node: draining it for the notice until the action's next invocation takes it over");
        request.events.normal(
            &node_reference,
            reason::DRAIN_STARTED,
            format!("Draining node {name} for the {kind} of instance {}: its lifecycle drain had no running invocation (deadline {})", request.action.instance_id, claimed.checkpoint.deadline),
        );
        return;
    }
    if claimed.resumed || is_cordon_only {
        return;
    }
    let ends = request
        .notice
        .instance_ends_at
        .map(|t| format!(", the instance stops at {t}"))
        .unwrap_or_default();
    let deadline = claimed.checkpoint.deadline;
    tracing::info!(step = "drain_started", notice = kind, deadline = %deadline, "drain started for an instance notice");
    request.events.normal(
        &node_reference,
        reason::DRAIN_STARTED,
        format!(
            "Draining node {name}: {kind} of instance {}{ends} (deadline {deadline})",
            request.action.instance_id
        ),
    );
}

/// How a notice drain's session ended, for the outcome and its Events.
struct SessionReport<'a> {
    pods_evicted: u32,
    node_reference: &'a ObjectReference,
    node_name: &'a str,
    events: &'a DrainEvents,
}

impl SessionReport<'_> {
    /// The outcome to record on the checkpoint (`Continue`), or one that ends the
    /// invocation with nothing more to record (`Break`; `OutOfTime` releases the lease).
    fn outcome(&self, ran: SessionEnd) -> ControlFlow<NoticeDrainOutcome, NoticeDrainOutcome> {
        match ran {
            SessionEnd::Settled => {
                tracing::info!(
                    step = "drained",
                    pods_evicted = self.pods_evicted,
                    "node drained for the instance notice"
                );
                ControlFlow::Continue(NoticeDrainOutcome::Drained {
                    pods_evicted: self.pods_evicted,
                })
            }
            SessionEnd::DeadlinePassed(stuck) => {
                let pods: Vec<String> = stuck.iter().map(|p| p.pod.to_string()).collect();
                let still_there: Vec<String> = stuck.iter().map(ToString::to_string).collect();
                let note = format!(
                    "The instance's end came before node {} was empty; still there: {}",
                    self.node_name,
                    still_there.join("; ")
                );
                tracing::warn!(step = "pod_eviction_failure", pods = ?pods, "{note}");
                self.events
                    .warning(self.node_reference, reason::POD_EVICTION_FAILURE, note);
                ControlFlow::Continue(NoticeDrainOutcome::PodsLeft { pods })
            }
            SessionEnd::PodsUnknown(cause) => {
                let note = format!(
                    "The instance's end came and the pods of node {} could not be listed ({cause}): they may still be running",
                    self.node_name
                );
                tracing::warn!(step = "pod_eviction_failure", cause, "{note}");
                self.events
                    .warning(self.node_reference, reason::POD_EVICTION_FAILURE, note);
                ControlFlow::Continue(NoticeDrainOutcome::PodsLeft {
                    pods: vec![format!("pods unknown: {cause}")],
                })
            }
            SessionEnd::HandOver => {
                tracing::warn!(
                    step = "out_of_time",
                    "the invocation ran out of time before the notice drain ended: lease released"
                );
                ControlFlow::Break(NoticeDrainOutcome::OutOfTime)
            }
            SessionEnd::LeaseLost => {
                tracing::info!(
                    step = "taken_over",
                    "a lifecycle drain took the drain over: stopping"
                );
                ControlFlow::Break(NoticeDrainOutcome::TakenOverByLifecycleDrain)
            }
            SessionEnd::NodeGone => ControlFlow::Break(NoticeDrainOutcome::NodeGone),
        }
    }
}

/// The notice's drain is over: marks it so, with how it left the node (a repeated notice
/// then has nothing to do if it drained it), and lets go of the lease at once, so a
/// lifecycle drain waiting for it takes the node over now rather than when the lease would
/// lapse. A stand-in only stands down: the drain is the lifecycle action's, whose next
/// invocation completes it ([`DrainCheckpoint::stood_down`]).
async fn record_end(
    lease: &mut NodeLease,
    bound: std::time::Duration,
    outcome: NoticeDrainOutcome,
    stands_in: bool,
) -> NoticeDrainOutcome {
    let left = match outcome {
        NoticeDrainOutcome::Drained { .. } => DrainResult::Drained,
        _ => DrainResult::PodsLeft,
    };
    let end = |c: &DrainCheckpoint, now| {
        if stands_in {
            c.stood_down(now)
        } else {
            c.finished(now, left)
        }
    };
    let finished = tokio::time::timeout(bound, lease.update(end)).await;
    match finished {
        Ok(Ok(Update::Written(_))) => {}
        Ok(Ok(Update::LeaseLost)) => return NoticeDrainOutcome::TakenOverByLifecycleDrain,
        Ok(Ok(Update::NodeGone)) => return NoticeDrainOutcome::NodeGone,
        Ok(Err(error)) => {
            tracing::warn!(step = "end_unrecorded", %error, "could not record the end of the notice drain; its lease lapses by itself");
        }
        Err(_) => {
            tracing::warn!(
                step = "end_unrecorded",
                "recording the end of the notice drain got no answer in time; its lease lapses by itself"
            );
        }
    }
    outcome
}

/// Adds `notice` to the lifecycle drain's checkpoint on `node` (conditional on the node's
/// `resourceVersion`, recomputed on conflicts): its session takes the new deadline and the
/// grace cap at its next checkpoint write.
async fn join_lifecycle_drain(
    nodes: &Api<Node>,
    node: Node,
    notice: &InstanceNotice,
) -> Result<NoticeDrainOutcome, DrainError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let written = patch_recomputing(
        nodes,
        node,
        Reread::Get,
        "adding an instance notice to its drain",
        |node| {
            let Some(current) = checkpoint_of(node).filter(|c| !c.action.is_notice()) else {
                return PatchStep::Stop(());
            };
            match current.joined_by(notice) {
                Some(next) => PatchStep::Write(record_patch(node, &next, None), ()),
                None => PatchStep::Stop(()),
            }
        },
    )
    .await
    .map_err(|source| kube_error(&name, source))?;
    match written {
        Patched::Written(..) => {
            tracing::info!(
                step = "joined",
                "a lifecycle drain is on the node: the notice's end is now its deadline"
            );
            Ok(NoticeDrainOutcome::JoinedLifecycleDrain)
        }
        Patched::Stopped(()) => Ok(NoticeDrainOutcome::JoinedLifecycleDrain),
        Patched::NodeGone => Ok(NoticeDrainOutcome::NodeGone),
    }
}
