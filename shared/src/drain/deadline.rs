//! What this invocation's share of a drain comes to ([`NextStep`]), and the policy at the
//! drain deadline: report the pods still there (PodEvictionFailure, completed with
//! `DRAIN_TIMEOUT_RESULT`), or with `DRAIN_FORCE` delete them ([`super::force`]) and settle.

use tokio::time::Instant;

use super::events::{DrainEvents, reason};
use super::force::{ForcedDeletion, delete_pod_with_retries};
use super::report::DrainEnd;
use super::session::{DrainSession, SessionEnd};
use super::stuck::{StuckPod, StuckReason};
use crate::aws::LifecycleActionResult;

/// What the invocation does once its session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// The drain is over: complete the lifecycle action.
    Complete(DrainEnd),
    /// The invocation is nearly out of time: hand the drain to a fresh one.
    HandOver,
    /// Another invocation took the drain: stop quietly.
    LeaseLost,
    /// Forced deletion of these pods kept failing: fail the invocation so it is retried.
    RetryForcedDeletion(Vec<String>),
}

/// The deadline policy, from [`crate::lifecycle::settings::DrainSettings`].
#[derive(Debug, Clone, Copy)]
pub struct DeadlinePolicy {
    /// `DRAIN_FORCE`: delete the pods eviction could not move.
    pub force: bool,
    /// `DRAIN_TIMEOUT_RESULT`: named in the report of the pods left.
    pub timeout_result: LifecycleActionResult,
}

impl DeadlinePolicy {
    /// Runs the session, then applies the policy if it ended at the deadline.
    pub async fn run(
        &self,
        session: &mut DrainSession<'_>,
        events: &DrainEvents,
        hand_over_at: Instant,
    ) -> Result<NextStep, kube::Error> {
        let stuck = match session.run(hand_over_at).await? {
            SessionEnd::Settled => return Ok(NextStep::Complete(DrainEnd::Drained)),
            SessionEnd::NodeGone => return Ok(NextStep::Complete(DrainEnd::NodeGone)),
            SessionEnd::HandOver => return Ok(NextStep::HandOver),
            SessionEnd::LeaseLost => return Ok(NextStep::LeaseLost),
            SessionEnd::PodsUnknown(cause) => {
                return Ok(self.report_pods_unknown(session, events, cause));
            }
            SessionEnd::DeadlinePassed(stuck) => stuck,
        };
        if self.force {
            self.force_and_settle(session, events, &stuck, hand_over_at)
                .await
        } else {
            Ok(self.report_stuck(session, events, &stuck))
        }
    }

    /// The pods were never listed: they may still be running; complete, and say so.
    fn report_pods_unknown(
        &self,
        session: &DrainSession<'_>,
        events: &DrainEvents,
        cause: String,
    ) -> NextStep {
        let note = format!(
            "The drain deadline of node {} passed and its pods could not be listed ({cause}): they may still be running. Completing the lifecycle action with {}.",
            session.node_name,
            self.timeout_result.as_str()
        );
        tracing::warn!(step = "pod_eviction_failure", cause, "{note}");
        events.warning(
            &session.node_reference(),
            reason::POD_EVICTION_FAILURE,
            note,
        );
        NextStep::Complete(DrainEnd::EvictionFailure(vec![format!(
            "pods unknown: {cause}"
        )]))
    }

    /// Without force: name the pods still there, and complete.
    fn report_stuck(
        &self,
        session: &DrainSession<'_>,
        events: &DrainEvents,
        stuck: &[StuckPod],
    ) -> NextStep {
        let listed: Vec<String> = stuck.iter().map(ToString::to_string).collect();
        let note = format!(
            "{} pod(s) could not be evicted from node {} before the drain deadline: {}. Completing the lifecycle action with {}.",
            stuck.len(),
            session.node_name,
            listed.join(", "),
            self.timeout_result.as_str()
        );
        tracing::warn!(step = "pod_eviction_failure", pods = ?listed, "{note}");
        events.warning(
            &session.node_reference(),
            reason::POD_EVICTION_FAILURE,
            note,
        );
        NextStep::Complete(DrainEnd::EvictionFailure(listed))
    }

    /// With force: delete the pods eviction could not move, then record the node drained
    /// and settle.
    async fn force_and_settle(
        &self,
        session: &mut DrainSession<'_>,
        events: &DrainEvents,
        stuck: &[StuckPod],
        hand_over_at: Instant,
    ) -> Result<NextStep, kube::Error> {
        let (deleted, failed) = force_delete(session, stuck).await;
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
        events.warning(&session.node_reference(), reason::DRAIN_FORCED, note);
        if !failed.is_empty() {
            // Completing now would let the instance go with the pods still running, which
            // is what force is configured to prevent: fail the invocation so it is retried.
            return Ok(NextStep::RetryForcedDeletion(failed));
        }
        if let Some(end) = session.mark_drained().await? {
            return Ok(match end {
                SessionEnd::LeaseLost => NextStep::LeaseLost,
                _ => NextStep::Complete(DrainEnd::NodeGone),
            });
        }
        Ok(match session.settle(hand_over_at).await? {
            SessionEnd::HandOver => NextStep::HandOver,
            SessionEnd::LeaseLost => NextStep::LeaseLost,
            _ => NextStep::Complete(DrainEnd::Forced(deleted)),
        })
    }
}

/// Deletes the pods eviction could not move, `EVICTION_CONCURRENCY` at a time (each
/// retrying on its own): (deleted, failed after retries).
async fn force_delete(
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
