//! Reading and writing the drain checkpoint on the Node, with optimistic concurrency.
//!
//! Every write is a merge patch that carries the `resourceVersion` the decision was made
//! from: when two invocations race for a drain, the API server accepts one write and answers
//! 409 Conflict to the other, which reads the node again and sees the winner's lease. That is
//! what makes "at most one invocation drains a node" hold without any lock service.
//!
//! The claim also takes the node out of service in the same write (load-balancer label,
//! `unschedulable`, optional taint; see [`super::cordon`]): one round trip instead of three,
//! and a node is never cordoned by an invocation that lost the race for its drain.

use std::ops::ControlFlow;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::aws::LifecycleActionRef;
use crate::node_marks::checkpoint::{DrainCheckpoint, LeaseDecision, checkpoint_of, record_patch};
use crate::node_marks::out_of_service::{CordonReport, CordonSteps};
use crate::node_marks::refresh::refresh_marks_of;
use crate::node_marks::{CONFLICT_ATTEMPTS, conflicts_exhausted};
use crate::retry::backoff_delay;

/// Calls in total for a checkpoint write the API server keeps refusing transiently, and the
/// jittered backoff between them: about two seconds at most, so a renewal stays well inside
/// its interval and a longer outage is left to the caller (see [`update`]).
const TRANSIENT_ATTEMPTS: u32 = 4;
const TRANSIENT_BASE: Duration = Duration::from_millis(100);
const TRANSIENT_CAP: Duration = Duration::from_secs(1);

/// The outcome of trying to take a drain.
// Returned once per claim, never stored in bulk: size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Claim {
    /// This invocation now holds the drain, and the node is out of service.
    Claimed {
        /// The node as written.
        node: Box<Node>,
        checkpoint: DrainCheckpoint,
        resumed: bool,
        /// What the claim's write changed besides the checkpoint.
        cordon: CordonReport,
    },
    /// Another invocation holds it: exit quietly. `notice_drain`: the holder drains for an
    /// instance notice, or stands in for this action's drain for one (a lifecycle drain waits
    /// for it to end, then takes its drain over).
    HeldByOther {
        holder: String,
        until: Timestamp,
        notice_drain: bool,
    },
    /// The drain of this action is complete.
    AlreadyCompleted,
    /// (Notices only.) A lifecycle drain of the instance is under way; nothing written.
    JoinLifecycleDrain { node: Box<Node> },
    /// The node was deleted meanwhile.
    NodeGone,
}

/// The outcome of updating a checkpoint this invocation holds.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Update {
    Written(DrainCheckpoint),
    /// The lease expired and someone else took the drain: stop working on it.
    LeaseLost,
    NodeGone,
}

/// Identifies the invocation and how long its claims last.
#[derive(Debug, Clone)]
pub struct LeaseHolder {
    /// The Lambda request id.
    pub id: String,
    pub lease_duration: Duration,
}

/// Takes the drain of `node` for `action` and takes the node out of service (with `taint`
/// when given), or learns who has the drain. `predecessor`: the invocation that handed this
/// action's drain over to this one, as its message says; its lease counts as let go (see
/// [`DrainCheckpoint::handed_over_by`]).
pub async fn claim(
    nodes: &Api<Node>,
    node: Node,
    action: &LifecycleActionRef,
    holder: &LeaseHolder,
    drain_timeout: Duration,
    taint: Option<&Taint>,
    predecessor: Option<&str>,
) -> Result<Claim, kube::Error> {
    let decide = |existing: Option<&DrainCheckpoint>, now| {
        let existing = existing.map(|e| match predecessor {
            Some(predecessor) => e.clone().handed_over_by(predecessor, action),
            None => e.clone(),
        });
        DrainCheckpoint::decide(
            existing.as_ref(),
            action,
            &holder.id,
            now,
            drain_timeout,
            holder.lease_duration,
        )
    };
    claim_with(nodes, node, taint, decide).await
}

/// [`claim`] with the decision given: the lifecycle drain's ([`DrainCheckpoint::decide`]) or
/// an instance notice's ([`DrainCheckpoint::decide_notice`]). The decision sees the
/// checkpoint as it stands against the node now ([`DrainCheckpoint::as_found_on`]).
pub async fn claim_with(
    nodes: &Api<Node>,
    node: Node,
    taint: Option<&Taint>,
    decide: impl Fn(Option<&DrainCheckpoint>, Timestamp) -> LeaseDecision,
) -> Result<Claim, kube::Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut node = node;
    let mut transient_failures = 0;
    let mut conflicts = 0;
    while conflicts < CONFLICT_ATTEMPTS {
        let existing = checkpoint_of(&node).map(|c| c.as_found_on(&node));
        let decision = decide(existing.as_ref(), Timestamp::now());
        let steps = CordonSteps::needed(&node, taint);
        let (checkpoint, resumed) = match checkpoint_to_write(decision, existing, &node, &steps) {
            ControlFlow::Continue(to_write) => to_write,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        let written = write(nodes, &name, &node, &checkpoint, Some(&steps)).await;
        match retry_transient(written, &name, &mut transient_failures).await? {
            Written::Node(written) => {
                return Ok(Claim::Claimed {
                    node: written,
                    checkpoint,
                    resumed,
                    cordon: steps.report(),
                });
            }
            Written::Conflict => {
                conflicts += 1;
                match get_retrying(nodes, &name, &mut transient_failures).await? {
                    Some(fresh) => node = fresh,
                    None => return Ok(Claim::NodeGone),
                }
            }
            Written::NodeGone => return Ok(Claim::NodeGone),
        }
    }
    Err(too_many_conflicts(&name))
}

/// The checkpoint a claim writes (with whether it resumes a drain), or the claim's outcome
/// when the decision writes nothing.
fn checkpoint_to_write(
    decision: LeaseDecision,
    existing: Option<DrainCheckpoint>,
    node: &Node,
    steps: &CordonSteps,
) -> ControlFlow<Claim, (DrainCheckpoint, bool)> {
    match decision {
        LeaseDecision::Claim {
            mut checkpoint,
            resumed,
        } => {
            // Record what this write changes on top of what any earlier drain of ours
            // recorded (a resumed drain, or one replacing the checkpoint of an earlier
            // scale-in whose changes are still on the node): a node back from a warm
            // pool gets exactly that undone.
            // An instance refresh's marks become the drain's when the node goes with its
            // instance (see `DrainCheckpoint::takes_over_refresh`): the refresh's end must
            // not lift the cordon of a node being drained, and a return from a warm pool
            // undoes them with the drain's own.
            let earlier = existing.and_then(|e| e.out_of_service).unwrap_or_default();
            let refreshed = refresh_marks_of(node)
                .filter(|_| checkpoint.takes_over_refresh())
                .map(|m| m.out_of_service)
                .unwrap_or_default();
            checkpoint.out_of_service = Some(earlier.union(&refreshed).union(&steps.record()));
            ControlFlow::Continue((checkpoint, resumed))
        }
        LeaseDecision::HeldByOther { holder, until } => {
            // A notice standing in for this action's drain ends with its notice, like a
            // notice drain: the action's invocation waits for it, then takes the drain over.
            let notice_drain = existing.is_some_and(|e| e.action.is_notice() || e.notice_stands_in);
            ControlFlow::Break(Claim::HeldByOther {
                holder,
                until,
                notice_drain,
            })
        }
        LeaseDecision::AlreadyCompleted => ControlFlow::Break(Claim::AlreadyCompleted),
        LeaseDecision::JoinLifecycleDrain => ControlFlow::Break(Claim::JoinLifecycleDrain {
            node: Box::new(node.clone()),
        }),
    }
}

/// A write's result, with one refused write (a 5xx, a throttle past kube's retries) turned
/// into a retry against a fresh read after a backoff: it must not fail the invocation. The
/// retries are bounded by `transient_failures` (shared with the claim's reads).
async fn retry_transient(
    written: Result<Written, kube::Error>,
    name: &str,
    transient_failures: &mut u32,
) -> Result<Written, kube::Error> {
    match written {
        Err(error) if is_transient(&error) && *transient_failures + 1 < TRANSIENT_ATTEMPTS => {
            let delay = backoff_delay(*transient_failures, TRANSIENT_BASE, TRANSIENT_CAP);
            tracing::warn!(node = %name, %error, retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "could not take the drain; retrying");
            *transient_failures += 1;
            tokio::time::sleep(delay).await;
            Ok(Written::Conflict)
        }
        other => other,
    }
}

/// [`get`], retried on transient errors while `transient_failures` (shared with the caller's
/// writes) stays under [`TRANSIENT_ATTEMPTS`].
async fn get_retrying(
    nodes: &Api<Node>,
    name: &str,
    transient_failures: &mut u32,
) -> Result<Option<Node>, kube::Error> {
    loop {
        match get(nodes, name).await {
            Err(error) if is_transient(&error) && *transient_failures + 1 < TRANSIENT_ATTEMPTS => {
                let delay = backoff_delay(*transient_failures, TRANSIENT_BASE, TRANSIENT_CAP);
                *transient_failures += 1;
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

/// Applies `change` to the checkpoint this invocation holds (renewing the lease, recording
/// progress, handing over). Fails with [`Update::LeaseLost`] only when the lease names
/// another holder (or none): a competitor took the drain, or it was released.
///
/// The lease's expiry does not decide this: while the checkpoint still names this invocation,
/// nobody took over (a competitor's claim writes its own name), so a lease that lapsed while
/// the API server refused writes (a 503/429 burst during a big scale-in) is simply renewed by
/// this write. The write is conditional on the `resourceVersion` read, so a competitor's claim
/// made meanwhile makes it fail with a conflict, and the fresh read then names the competitor.
///
/// Transient failures (429, 5xx, transport) are retried a few times with jittered backoff;
/// after that the error is returned and the caller decides (renewals try again later; a
/// write the drain cannot go on without fails the invocation).
///
/// `known` is the node as this invocation last wrote it, if it has it: the write is tried
/// against that `resourceVersion` without reading first (a success proves nobody changed the
/// node since, so the lease is still ours; a conflict means a fresh read). It is replaced by
/// the node as written, so the next update is one round trip too.
pub async fn update(
    nodes: &Api<Node>,
    name: &str,
    holder: &LeaseHolder,
    known: &mut Option<Node>,
    change: impl Fn(&DrainCheckpoint, Timestamp) -> DrainCheckpoint,
) -> Result<Update, kube::Error> {
    let mut transient_failures = 0;
    let mut conflicts = 0;
    while conflicts < CONFLICT_ATTEMPTS {
        let attempt = async {
            let node = match known.take() {
                Some(node) => node,
                None => match get(nodes, name).await? {
                    Some(node) => node,
                    None => return Ok(Some(Update::NodeGone)),
                },
            };
            let now = Timestamp::now();
            let Some(current) = checkpoint_of(&node).filter(|c| c.names_holder(&holder.id)) else {
                return Ok(Some(Update::LeaseLost));
            };
            let next = change(&current, now);
            match write(nodes, name, &node, &next, None).await? {
                Written::Node(written) => {
                    *known = Some(*written);
                    Ok(Some(Update::Written(next)))
                }
                Written::Conflict => Ok(None),
                Written::NodeGone => Ok(Some(Update::NodeGone)),
            }
        };
        match attempt.await {
            Ok(Some(update)) => return Ok(update),
            Ok(None) => conflicts += 1,
            Err(error) if is_transient(&error) && transient_failures + 1 < TRANSIENT_ATTEMPTS => {
                let delay = backoff_delay(transient_failures, TRANSIENT_BASE, TRANSIENT_CAP);
                tracing::warn!(node = name, %error, retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "could not write the drain checkpoint; retrying");
                transient_failures += 1;
                tokio::time::sleep(delay).await;
            }
            Err(error) => return Err(error),
        }
    }
    Err(too_many_conflicts(name))
}

/// Whether a Kubernetes call may succeed when simply tried again: throttling (429), a server
/// error (5xx) or a connection that failed.
pub(crate) fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

enum Written {
    Node(Box<Node>),
    Conflict,
    NodeGone,
}

/// Writes `checkpoint` (and the cordon `steps`) as a merge patch conditional on the
/// `resourceVersion` of `read`.
async fn write(
    nodes: &Api<Node>,
    name: &str,
    read: &Node,
    checkpoint: &DrainCheckpoint,
    steps: Option<&CordonSteps>,
) -> Result<Written, kube::Error> {
    let patch = record_patch(read, checkpoint, steps);
    match nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(node) => Ok(Written::Node(Box::new(node))),
        Err(kube::Error::Api(status)) if status.is_conflict() => Ok(Written::Conflict),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Written::NodeGone),
        Err(error) => Err(error),
    }
}

/// Whether `checkpoint` only takes the node out of service (`REBALANCE_ACTION=cordon`).
async fn get(nodes: &Api<Node>, name: &str) -> Result<Option<Node>, kube::Error> {
    nodes.get_opt(name).await
}

fn too_many_conflicts(name: &str) -> kube::Error {
    conflicts_exhausted(format!(
        "the drain checkpoint on node {name} could not be written: it changed \
         {CONFLICT_ATTEMPTS} times while being updated"
    ))
}

/// The node whose drain this invocation works on, and the lease it holds it with.
pub(super) struct NodeLease {
    pub(super) nodes: Api<Node>,
    pub(super) name: String,
    pub(super) holder: LeaseHolder,
    /// The node as this invocation last wrote it: lease updates go against its
    /// `resourceVersion` without reading first (see [`update`]).
    pub(super) last_written: Option<Node>,
}

impl NodeLease {
    /// Changes the checkpoint of the drain held.
    pub(super) async fn update(
        &mut self,
        change: impl Fn(&DrainCheckpoint, Timestamp) -> DrainCheckpoint,
    ) -> Result<Update, kube::Error> {
        update(
            &self.nodes,
            &self.name,
            &self.holder,
            &mut self.last_written,
            change,
        )
        .await
    }

    /// Lets go of the lease so another invocation need not wait for it to expire; gives up
    /// after `within` (the lease then expires by itself).
    pub(super) async fn release(&mut self, within: Duration) {
        let released = tokio::time::timeout(within, self.update(|c, now| c.released(now))).await;
        match released {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(%error, "could not release the drain lease; it expires by itself");
            }
            Err(_) => {
                tracing::debug!(
                    "releasing the drain lease got no answer in time; it expires by itself"
                );
            }
        }
    }
}

/// How long until a lease that runs `until` has expired (plus a little slack for clock
/// differences between invocations); zero when it has already.
pub(super) fn lease_wait(until: jiff::Timestamp) -> std::time::Duration {
    let left = until.duration_since(jiff::Timestamp::now());
    std::time::Duration::try_from(left)
        .unwrap_or_default()
        .saturating_add(std::time::Duration::from_millis(500))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::node_marks::checkpoint::CHECKPOINT_ANNOTATION;

    fn node(annotation: Option<&str>) -> Node {
        let mut node = Node::default();
        if let Some(value) = annotation {
            node.metadata.annotations =
                Some([(CHECKPOINT_ANNOTATION.to_owned(), value.to_owned())].into());
        }
        node
    }

    #[test]
    fn reads_the_checkpoint_and_ignores_an_unreadable_one() {
        let action = LifecycleActionRef {
            auto_scaling_group_name: "g".into(),
            lifecycle_hook_name: "h".into(),
            instance_id: "i-1".into(),
            token: "t".into(),
        };
        let checkpoint = DrainCheckpoint::start(
            &action,
            Timestamp::UNIX_EPOCH,
            Duration::from_secs(900),
            "req-1",
            Duration::from_secs(60),
        );
        assert_eq!(
            checkpoint_of(&node(Some(&checkpoint.to_json()))),
            Some(checkpoint)
        );
        assert_eq!(checkpoint_of(&node(Some("{not json"))), None);
        assert_eq!(checkpoint_of(&node(None)), None);
    }
}
