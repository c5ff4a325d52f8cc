//! How a drain ends in this invocation, once its session is over: the lifecycle action
//! completed (and the completion recorded on the node), the drain handed to a fresh
//! invocation, or the invocation stopped or failed for a retry.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;

use super::deadline::NextStep;
use super::drainer::{DrainProgress, DrainRequest, Drainer};
use super::events::reason;
use super::lease::{NodeLease, Update};
use super::report::{DeliveryOutcome, DrainEnd, DrainError};
use super::retention::{FailedDrainCompletion, InstanceFate};
use super::session::SessionStats;
use crate::aws::{CompletionOutcome, LifecycleActionResult};
use crate::lifecycle::hand_over::{HandOver, complete_action, hand_over_from};
use crate::lifecycle::handler::HookClients;
use crate::lifecycle::heartbeat::HeartbeatKeeper;
use crate::lifecycle::notification::{InstancePlace, LifecycleNotification};
use crate::node_marks::checkpoint::DrainResult;

impl<C: HookClients> Drainer<C> {
    /// What the session came to: complete the action, hand over, or stop.
    pub(super) async fn finish(
        &self,
        progress: DrainProgress,
        lease: &mut NodeLease,
        node_reference: &ObjectReference,
        request: &DrainRequest<'_>,
        keeper: &mut HeartbeatKeeper,
    ) -> Result<DeliveryOutcome, DrainError> {
        let notification = request.notification;
        let DrainProgress {
            next,
            stats,
            started_at,
        } = progress;
        match next {
            NextStep::HandOver => self.hand_over(lease, request, keeper, stats).await,
            NextStep::RetryForcedDeletion(pods) => {
                lease
                    .release(request.invocation.budget.closing_write_bound())
                    .await;
                self.metrics(notification, Some(stats), "ForceIncomplete")
                    .emit();
                Err(DrainError::ForceIncomplete {
                    node: lease.name.clone(),
                    pods,
                })
            }
            NextStep::LeaseLost => {
                tracing::info!(
                    step = "lease_lost",
                    "another invocation took over the drain: stopping"
                );
                Ok(DeliveryOutcome::LeaseLost)
            }
            NextStep::Complete(drain, failed) => {
                let finished = (stats, started_at);
                self.complete_drain(drain, failed, finished, lease, node_reference, request)
                    .await
            }
        }
    }

    /// Releases the lease (as handed over) and publishes the notification again for a fresh
    /// invocation.
    async fn hand_over(
        &self,
        lease: &mut NodeLease,
        request: &DrainRequest<'_>,
        keeper: &mut HeartbeatKeeper,
        stats: SessionStats,
    ) -> Result<DeliveryOutcome, DrainError> {
        let notification = request.notification;
        // Bounded, and not required: without the mark the continuation still takes the drain
        // over, since the message it gets names this invocation as the lease's holder.
        // Failing here instead would leave the drain to Lambda's retries (minutes) or the
        // hook's expiry.
        let bound = request.invocation.budget.closing_write_bound();
        let update = tokio::time::timeout(bound, lease.update(|c, now| c.handed_over(now))).await;
        match update {
            Ok(Ok(Update::Written(_))) => {}
            Ok(Ok(Update::LeaseLost)) => return Ok(DeliveryOutcome::LeaseLost),
            Ok(Ok(Update::NodeGone)) => return self.node_gone(notification).await,
            Ok(Err(error)) => {
                tracing::warn!(step = "hand_over_unrecorded", %error, "could not record the hand-over on the node: the continuation resumes once this lease lapses");
            }
            Err(_) => {
                tracing::warn!(
                    step = "hand_over_unrecorded",
                    bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
                    "the hand-over mark got no answer in time: the continuation resumes once this lease lapses"
                );
            }
        }
        // The message names this invocation: the continuation takes over a lease that still
        // names it (the mark above may not have been written) instead of waiting for it.
        let handed = hand_over_from(
            &self.context.autoscaling,
            &self.context.notifications,
            keeper,
            request.delivery,
            self.settings().lifecycle.continuation_topic_arn.as_deref(),
            Some(&lease.holder.id),
        )
        .await
        .map_err(|source| DrainError::HandOver {
            node: lease.name.clone(),
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

    /// Completes the lifecycle action after the drain, records the completion on the node
    /// (and a trip to the warm pool), and says so.
    async fn complete_drain(
        &self,
        drain: DrainEnd,
        failed: Option<FailedDrainCompletion>,
        (stats, started_at): (SessionStats, Timestamp),
        lease: &mut NodeLease,
        node_reference: &ObjectReference,
        request: &DrainRequest<'_>,
    ) -> Result<DeliveryOutcome, DrainError> {
        let notification = request.notification;
        // A failed drain (pods left) was decided at the deadline, retention included; any
        // other end lets the instance go.
        let left = if failed.is_some() {
            DrainResult::PodsLeft
        } else {
            DrainResult::Drained
        };
        let (result, instance) = failed.map_or(
            (LifecycleActionResult::Continue, InstanceFate::Terminates),
            |f| (f.result, f.fate),
        );
        let outcome = self.complete(notification, result).await?;
        let to_warm_pool = notification.route.destination == InstancePlace::WarmPool;
        let bound = request.invocation.budget.closing_write_bound();
        if tokio::time::timeout(bound, record_completion(lease, left, to_warm_pool))
            .await
            .is_err()
        {
            tracing::warn!(
                recorded = false,
                "the completion mark got no answer in time (harmless: a duplicate would find no active action)"
            );
        }
        let duration = Timestamp::now().duration_since(started_at);
        tracing::info!(step = "completed", result = result.as_str(), instance = instance.label(), completion = ?outcome, drain = drain.label(), drain_seconds = duration.as_secs_f64(), "lifecycle action completed");
        let kept = match instance {
            InstanceFate::Retained => {
                "; the instance and this node are kept (Terminating:Retained)"
            }
            InstanceFate::Unknown => {
                "; the instance is kept only if its group retains abandoned instances"
            }
            InstanceFate::Terminates => "",
        };
        request.events.normal(
            node_reference,
            reason::LIFECYCLE_ACTION_COMPLETED,
            format!(
                "Lifecycle action of instance {} completed with {} ({}){kept}",
                notification.action.instance_id,
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
            .property("LifecycleActionResult", result.as_str())
            .property("Instance", instance.label())
            .emit();
        Ok(DeliveryOutcome::Completed {
            result,
            outcome,
            drain,
            instance,
        })
    }

    /// The node is gone: the instance has nothing left to drain; complete.
    pub(super) async fn node_gone(
        &self,
        notification: &LifecycleNotification,
    ) -> Result<DeliveryOutcome, DrainError> {
        let outcome = self
            .complete(notification, LifecycleActionResult::Continue)
            .await?;
        Ok(DeliveryOutcome::NoNode(outcome))
    }

    pub(super) async fn complete(
        &self,
        notification: &LifecycleNotification,
        result: LifecycleActionResult,
    ) -> Result<CompletionOutcome, DrainError> {
        let outcome = complete_action(&self.context.autoscaling, &notification.action, result)
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
}

/// Marks the drain completed on the node with how it `left` the node, and the trip to the
/// warm pool when the instance goes there. A failure is logged, not fatal: a duplicate would
/// find no active action.
async fn record_completion(lease: &mut NodeLease, left: DrainResult, to_warm_pool: bool) {
    let completed = lease
        .update(|c, now| {
            let mut next = c.finished(now, left);
            // Scale-in with reuse: the node returns under its name; the mark lets the
            // launching hook recognise the return (README "Warm pools").
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
}
