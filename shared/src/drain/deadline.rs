//! What this invocation's share of a drain comes to ([`NextStep`]), and the policy at the
//! drain deadline: report the pods still there (PodEvictionFailure, completed as
//! `DRAIN_TIMEOUT_RESULT` and the group's instance retention say, [`super::retention`]), or
//! with `DRAIN_FORCE` delete them ([`super::force`]) and settle.

use std::time::Duration;

use tokio::time::Instant;

use super::events::{DrainEvents, reason};
use super::force::{ForcedDeletion, delete_pod_with_retries};
use super::plan::PodKey;
use super::report::DrainEnd;
use super::retention::{FailedDrainCompletion, RETENTION_LOOKUP_BOUND, complete_failed_drain};
use super::session::{DrainSession, SessionEnd};
use super::stuck::{StuckPod, StuckReason};
use crate::aws::{AutoScaling, LifecycleActionRef};
use crate::cluster::ThrottledRetries;
use crate::lifecycle::settings::DrainTimeoutResult;

/// What the invocation does once its session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// The drain is over: complete the lifecycle action; how, when the drain failed (pods
    /// left at the deadline), otherwise with CONTINUE.
    Complete(DrainEnd, Option<FailedDrainCompletion>),
    /// The invocation is nearly out of time: hand the drain to a fresh one.
    HandOver,
    /// Another invocation took the drain: stop quietly.
    LeaseLost,
    /// Forced deletion of these pods kept failing: fail the invocation so it is retried.
    RetryForcedDeletion(Vec<String>),
}

/// The deadline policy, from [`crate::lifecycle::settings::DrainSettings`], and what it asks
/// Auto Scaling about the instance's group.
pub struct DeadlinePolicy<'a, A: AutoScaling> {
    /// `DRAIN_FORCE`: delete the pods eviction could not move.
    pub force: bool,
    /// `DRAIN_TIMEOUT_RESULT`: how a drain with pods left is completed ([`super::retention`]).
    pub timeout_result: DrainTimeoutResult,
    pub autoscaling: &'a A,
    /// The lifecycle action being completed (its group and instance).
    pub action: &'a LifecycleActionRef,
}

impl<A: AutoScaling> DeadlinePolicy<'_, A> {
    /// Runs the session, then applies the policy if it ended at the deadline.
    pub async fn run(
        &self,
        session: &mut DrainSession<'_>,
        events: &DrainEvents,
        hand_over_at: Instant,
    ) -> Result<NextStep, kube::Error> {
        let stuck = match session.run(hand_over_at).await? {
            SessionEnd::Settled => return Ok(NextStep::Complete(DrainEnd::Drained, None)),
            SessionEnd::NodeGone => return Ok(NextStep::Complete(DrainEnd::NodeGone, None)),
            SessionEnd::HandOver => return Ok(NextStep::HandOver),
            SessionEnd::LeaseLost => return Ok(NextStep::LeaseLost),
            SessionEnd::PodsUnknown(cause) => {
                return Ok(self.report_pods_unknown(session, events, cause).await);
            }
            SessionEnd::DeadlinePassed(stuck) => stuck,
        };
        if self.force {
            self.force_and_settle(session, events, &stuck, hand_over_at)
                .await
        } else {
            Ok(self.report_stuck(session, events, &stuck).await)
        }
    }

    /// [`Self::run`], run again while the API server throttles one of its steps past that
    /// request's time bound, until `hand_over_at`; then [`NextStep::HandOver`]. Running again
    /// is safe: the session starts over from the checkpoint and the cluster (its writes are
    /// guarded by the node's `resourceVersion`, its evictions idempotent), as a fresh
    /// invocation would.
    pub async fn run_through_throttling(
        &self,
        session: &mut DrainSession<'_>,
        events: &DrainEvents,
        hand_over_at: Instant,
    ) -> Result<NextStep, kube::Error> {
        let run = async || self.run(session, events, hand_over_at).await;
        let next = ThrottledRetries::until(hand_over_at).retry(run).await?;
        Ok(next.unwrap_or(NextStep::HandOver))
    }

    /// How the drain that failed is completed (asking the group's retention when it matters).
    async fn failed_drain_completion(&self) -> FailedDrainCompletion {
        complete_failed_drain(
            self.timeout_result,
            self.autoscaling,
            self.action,
            RETENTION_LOOKUP_BOUND,
        )
        .await
    }

    /// The pods were never listed: they may still be running; complete, and say so.
    async fn report_pods_unknown(
        &self,
        session: &DrainSession<'_>,
        events: &DrainEvents,
        cause: String,
    ) -> NextStep {
        let completion = self.failed_drain_completion().await;
        let note = format!(
            "The drain deadline of node {} passed and its pods could not be listed ({cause}): they may still be running. {}",
            session.node_name, completion.sentence
        );
        tracing::warn!(
            step = "pod_eviction_failure",
            cause,
            result = completion.result.as_str(),
            instance = completion.fate.label(),
            "{note}"
        );
        events.warning(
            &session.node_reference(),
            reason::POD_EVICTION_FAILURE,
            note,
        );
        NextStep::Complete(
            DrainEnd::EvictionFailure(vec![format!("pods unknown: {cause}")]),
            Some(completion),
        )
    }

    /// Without force: name the pods still there, and complete.
    async fn report_stuck(
        &self,
        session: &DrainSession<'_>,
        events: &DrainEvents,
        stuck: &[StuckPod],
    ) -> NextStep {
        let completion = self.failed_drain_completion().await;
        let listed: Vec<String> = stuck.iter().map(ToString::to_string).collect();
        let note = format!(
            "{} pod(s) could not be evicted from node {} before the drain deadline: {}. {}",
            stuck.len(),
            session.node_name,
            listed.join(", "),
            completion.sentence
        );
        tracing::warn!(step = "pod_eviction_failure", pods = ?listed, result = completion.result.as_str(), instance = completion.fate.label(), "{note}");
        events.warning(
            &session.node_reference(),
            reason::POD_EVICTION_FAILURE,
            note,
        );
        NextStep::Complete(DrainEnd::EvictionFailure(listed), Some(completion))
    }

    /// With force: delete the pods eviction could not move, wait (within the time left)
    /// for them to be gone, then record the node drained and settle. What really happened
    /// is reported: pods whose deletion was refused, and pods still terminating when time
    /// ran out, are not reported as forced out.
    async fn force_and_settle(
        &self,
        session: &mut DrainSession<'_>,
        events: &DrainEvents,
        stuck: &[StuckPod],
        hand_over_at: Instant,
    ) -> Result<NextStep, kube::Error> {
        let forced = force_delete(session, stuck).await;
        let (deleted, refused, failed) = (
            names(&forced.deleted),
            names(&forced.refused),
            names(&forced.failed),
        );
        if !failed.is_empty() {
            report_failed_deletions(session, events, &deleted, &failed);
            // Completing now would let the instance go with the pods still running, which
            // is what force is configured to prevent: fail the invocation so it is retried.
            return Ok(NextStep::RetryForcedDeletion(failed));
        }
        // Deleted pods (and those terminating already) keep running through their grace
        // period: wait for them, renewing the lease, until the invocation must stop.
        let mut leaving = forced.deleted.clone();
        leaving.extend(forced.terminating.iter().cloned());
        // The drained mark and the settle period still have to fit before the hand-over;
        // otherwise the invocation would hand over for the last few milliseconds of settle.
        let wait_until = hand_over_at
            .checked_sub(session.settings.settle + DRAINED_MARK_ALLOWANCE)
            .unwrap_or(hand_over_at);
        let terminating = match wait_until_gone(session, leaving, wait_until).await? {
            Ok(left) => names(&left),
            Err(end) => {
                return Ok(match end {
                    SessionEnd::LeaseLost => NextStep::LeaseLost,
                    _ => NextStep::Complete(DrainEnd::NodeGone, None),
                });
            }
        };
        let end = forced_end(&deleted, &refused, &terminating);
        // Pods refused for good still run: the drain failed, completed as DRAIN_TIMEOUT_RESULT says.
        let completion = if refused.is_empty() {
            None
        } else {
            Some(self.failed_drain_completion().await)
        };
        let mut note = forced_note(&deleted, &refused, &terminating);
        if let Some(completion) = &completion {
            note.push_str(&format!(". {}", completion.sentence));
        }
        tracing::warn!(step = "forced", outcome = end.label(), pods = ?deleted, refused = ?refused, terminating = ?terminating, "{note}");
        events.warning(&session.node_reference(), reason::DRAIN_FORCED, note);
        if let Some(end) = session.mark_drained().await? {
            return Ok(match end {
                SessionEnd::LeaseLost => NextStep::LeaseLost,
                _ => NextStep::Complete(DrainEnd::NodeGone, None),
            });
        }
        Ok(match session.settle(hand_over_at).await? {
            SessionEnd::HandOver => NextStep::HandOver,
            SessionEnd::LeaseLost => NextStep::LeaseLost,
            _ => NextStep::Complete(end, completion),
        })
    }
}

/// How a forced drain ended: pods refused deletion for good, pods still terminating when
/// time ran out, or every pod gone.
fn forced_end(deleted: &[String], refused: &[String], terminating: &[String]) -> DrainEnd {
    if !refused.is_empty() {
        DrainEnd::ForceRefused {
            deleted: deleted.to_vec(),
            refused: refused.to_vec(),
        }
    } else if !terminating.is_empty() {
        DrainEnd::ForcedStillTerminating {
            deleted: deleted.to_vec(),
            terminating: terminating.to_vec(),
        }
    } else {
        DrainEnd::Forced(deleted.to_vec())
    }
}

/// Logs and records as an Event the forced deletions that failed (retried by the next
/// invocation).
fn report_failed_deletions(
    session: &DrainSession<'_>,
    events: &DrainEvents,
    deleted: &[String],
    failed: &[String],
) {
    let note = format!(
        "Drain deadline passed: deleted {} pod(s) that eviction could not move (DRAIN_FORCE); could not delete {} (retried by the next invocation): {}",
        deleted.len(),
        failed.len(),
        failed.join(", ")
    );
    tracing::warn!(step = "forced", pods = ?deleted, failed = ?failed, "{note}");
    events.warning(&session.node_reference(), reason::DRAIN_FORCED, note);
}

/// Time kept, after waiting for forced deletions, for writing the drained mark (one PATCH).
const DRAINED_MARK_ALLOWANCE: Duration = Duration::from_secs(1);

/// What the forced deletions came to, pod by pod.
#[derive(Debug, Default)]
struct ForcedDeletions {
    deleted: Vec<PodKey>,
    /// Refused for good (403, ...): still running.
    refused: Vec<PodKey>,
    /// Still failing after the retries: the invocation fails so it is retried.
    failed: Vec<PodKey>,
    /// Terminating already (not deleted again).
    terminating: Vec<PodKey>,
}

/// The `DrainForced` Event's note: what was deleted, refused and still terminating, each list
/// named only when it has pods (an Event reading "deleted 0 pod(s): " says nothing).
fn forced_note(deleted: &[String], refused: &[String], terminating: &[String]) -> String {
    let mut note = format!(
        "Drain deadline passed: deleted {} pod(s) that eviction could not move (DRAIN_FORCE){}",
        deleted.len(),
        listed(deleted)
    );
    if !refused.is_empty() {
        note.push_str(&format!(
            "; the API server refused to delete {} (they still run; check the role's force-delete group){}",
            refused.len(),
            listed(refused)
        ));
    }
    if !terminating.is_empty() {
        note.push_str(&format!(
            "; {} still terminating when the invocation's time ran out{}",
            terminating.len(),
            listed(terminating)
        ));
    }
    note
}

/// `": a, b"`, or nothing for no names.
fn listed(names: &[String]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!(": {}", names.join(", "))
    }
}

fn names(pods: &[PodKey]) -> Vec<String> {
    let mut names: Vec<String> = pods.iter().map(ToString::to_string).collect();
    names.sort();
    names
}

/// Deletes the pods eviction could not move, `EVICTION_CONCURRENCY` at a time (each
/// retrying on its own).
async fn force_delete(session: &DrainSession<'_>, stuck: &[StuckPod]) -> ForcedDeletions {
    use futures::StreamExt;
    let grace = session.settings.grace_period_seconds;
    let mut forced = ForcedDeletions::default();
    // Pods already terminating are on their way; a second DELETE would change nothing.
    let (terminating, to_delete): (Vec<&StuckPod>, Vec<&StuckPod>) = stuck
        .iter()
        .partition(|p| p.why == StuckReason::Terminating);
    forced.terminating = terminating.into_iter().map(|p| p.pod.clone()).collect();
    let outcomes: Vec<(PodKey, ForcedDeletion)> = futures::stream::iter(to_delete)
        .map(|pod| async move {
            let outcome = delete_pod_with_retries(session.client, &pod.pod, grace).await;
            (pod.pod.clone(), outcome)
        })
        .buffer_unordered(session.settings.eviction_concurrency.max(1))
        .collect()
        .await;
    for (pod, outcome) in outcomes {
        match outcome {
            ForcedDeletion::Deleted => forced.deleted.push(pod),
            ForcedDeletion::AlreadyGone => {}
            ForcedDeletion::Refused(error) => {
                tracing::warn!(pod = %pod, %error, "the API server refused to delete the pod (check the role's force-delete group)");
                forced.refused.push(pod);
            }
            ForcedDeletion::Failed(error) => {
                tracing::warn!(pod = %pod, %error, "could not delete the pod");
                forced.failed.push(pod);
            }
        }
    }
    forced
}

/// Waits until none of `pods` (these UIDs) is on the node any more, renewing the lease,
/// until `hand_over_at`: `Ok` with the pods still there then (none when all left), `Err`
/// when the session has to stop (lease lost, node gone).
async fn wait_until_gone(
    session: &mut DrainSession<'_>,
    mut pods: Vec<PodKey>,
    hand_over_at: Instant,
) -> Result<Result<Vec<PodKey>, SessionEnd>, kube::Error> {
    let poll = session
        .settings
        .backoff
        .base
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut renew_at = Instant::now() + session.renew_interval();
    loop {
        if pods.is_empty() {
            return Ok(Ok(pods));
        }
        let on_node = match session.pod_uids_on_node().await {
            Ok(uids) => Some(uids),
            Err(error) => {
                tracing::info!(%error, "could not list the node's pods while waiting for forced deletions");
                None
            }
        };
        if let Some(on_node) = on_node {
            pods.retain(|p| on_node.contains(&p.uid));
            if pods.is_empty() {
                return Ok(Ok(pods));
            }
        }
        let now = Instant::now();
        if now >= hand_over_at {
            return Ok(Ok(pods));
        }
        if now >= renew_at {
            if let Some(end) = session.renew().await {
                return Ok(Err(end));
            }
            renew_at = Instant::now() + session.renew_interval();
        }
        tokio::time::sleep_until((now + poll).min(hand_over_at).min(renew_at)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::forced_note;

    fn pods(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_string()).collect()
    }

    #[test]
    fn forced_note_names_no_empty_list() {
        let note = forced_note(&[], &[], &pods(&["web/a"]));
        assert_eq!(
            note,
            "Drain deadline passed: deleted 0 pod(s) that eviction could not move (DRAIN_FORCE); 1 still terminating when the invocation's time ran out: web/a"
        );
        assert!(!note.contains(": ;"), "{note}");
    }

    #[test]
    fn forced_note_lists_every_group_that_has_pods() {
        let note = forced_note(&pods(&["web/a", "web/b"]), &pods(&["db/c"]), &[]);
        assert_eq!(
            note,
            "Drain deadline passed: deleted 2 pod(s) that eviction could not move (DRAIN_FORCE): web/a, web/b; the API server refused to delete 1 (they still run; check the role's force-delete group): db/c"
        );
    }
}
