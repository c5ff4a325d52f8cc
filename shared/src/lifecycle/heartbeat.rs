//! Keeping a lifecycle action alive while the work runs: `RecordLifecycleActionHeartbeat` at
//! least every half of the hook's heartbeat timeout, never after its global deadline.

use std::future::Future;
use std::time::Duration;

use jiff::Timestamp;
use tokio::time::Instant;

use crate::aws::{AutoScaling, AwsError, HeartbeatOutcome, LifecycleActionRef, LifecycleHook};
use crate::retry::{RetryPolicy, with_retries};

use super::budget::instant_at;

/// The lifecycle action is gone (completed by someone else, or expired): stop working on it
/// and do not complete it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lifecycle action is no longer active (completed elsewhere or timed out)")]
pub struct ActionGone;

/// Why an action could not be shown to be pending before the first write.
#[derive(Debug, thiserror::Error)]
pub enum PendingUnproven {
    /// Auto Scaling answered that it has no such action.
    #[error(transparent)]
    Gone(#[from] ActionGone),
    /// The heartbeat failed otherwise (denied, throttled past its retries, unreachable): the
    /// action may or may not be pending, so nothing may be written on its behalf.
    #[error(
        "cannot prove the lifecycle action is still pending: RecordLifecycleActionHeartbeat failed: {0}"
    )]
    Unanswered(#[source] AwsError),
}

/// Keeps one lifecycle action alive with `RecordLifecycleActionHeartbeat`, at least every
/// half of the hook's heartbeat timeout and never after its global deadline.
#[derive(Debug)]
pub struct HeartbeatKeeper {
    action: LifecycleActionRef,
    interval: Duration,
    global_deadline: Timestamp,
    /// `global_deadline` on the monotonic clock, fixed once so a paused test clock and a
    /// wall clock that jumps agree.
    global_deadline_at: Instant,
    next_due: Instant,
    heartbeats: u32,
}

impl HeartbeatKeeper {
    /// `last_known_heartbeat`: the latest time the action is known to have been extended,
    /// at the latest its start (the notification's time). Earlier is safe: the keeper only
    /// beats sooner.
    pub fn new(
        action: LifecycleActionRef,
        hook: &LifecycleHook,
        action_started: Timestamp,
        last_known_heartbeat: Timestamp,
    ) -> Self {
        let interval = (hook.heartbeat_timeout / 2).max(Duration::from_millis(10));
        let global_deadline = action_started
            .checked_add(
                jiff::SignedDuration::try_from(hook.global_timeout)
                    .unwrap_or(jiff::SignedDuration::MAX),
            )
            .unwrap_or(Timestamp::MAX);
        let first_due = last_known_heartbeat
            .checked_add(
                jiff::SignedDuration::try_from(interval).unwrap_or(jiff::SignedDuration::MAX),
            )
            .unwrap_or(Timestamp::MAX);
        Self {
            action,
            interval,
            global_deadline,
            global_deadline_at: instant_at(global_deadline),
            next_due: instant_at(first_due),
            heartbeats: 0,
        }
    }

    /// When Auto Scaling gives up on the action whatever happens (its global timeout).
    pub fn global_deadline(&self) -> Timestamp {
        self.global_deadline
    }

    /// The spacing of heartbeats (half the hook's heartbeat timeout).
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Heartbeats this keeper recorded.
    pub fn heartbeats(&self) -> u32 {
        self.heartbeats
    }

    pub fn action(&self) -> &LifecycleActionRef {
        &self.action
    }

    /// Records a heartbeat now. A heartbeat that keeps failing is logged, not fatal: the
    /// next one is tried sooner. Past the global deadline the action is gone.
    ///
    /// Only for an action already shown to be pending ([`Self::prove_pending`]): a failure
    /// here does not stop work already under way.
    pub async fn beat(&mut self, autoscaling: &impl AutoScaling) -> Result<(), ActionGone> {
        match self.try_beat(autoscaling).await {
            Ok(()) => Ok(()),
            Err(PendingUnproven::Gone(gone)) => Err(gone),
            Err(PendingUnproven::Unanswered(_)) => Ok(()),
        }
    }

    /// Records a heartbeat as proof that the action is pending, before anything is written
    /// on its behalf: only Auto Scaling's acceptance counts. A heartbeat answered with
    /// anything else (AccessDenied, throttling past the retries) proves nothing, so the
    /// caller must not act (fail open would cordon and empty a node for an action that may
    /// not exist).
    pub async fn prove_pending(
        &mut self,
        autoscaling: &impl AutoScaling,
    ) -> Result<(), PendingUnproven> {
        self.try_beat(autoscaling).await
    }

    async fn try_beat(&mut self, autoscaling: &impl AutoScaling) -> Result<(), PendingUnproven> {
        if Instant::now() >= self.global_deadline_at {
            return Err(ActionGone.into());
        }
        let outcome = with_retries(&RetryPolicy::AWS_CALL, || {
            autoscaling.record_lifecycle_action_heartbeat(&self.action)
        })
        .await;
        match outcome {
            Ok(HeartbeatOutcome::Recorded) => {
                self.heartbeats += 1;
                self.next_due = Instant::now() + self.interval;
                tracing::info!(
                    instance_id = %self.action.instance_id,
                    asg = %self.action.auto_scaling_group_name,
                    hook = %self.action.lifecycle_hook_name,
                    "lifecycle heartbeat recorded"
                );
                Ok(())
            }
            Ok(HeartbeatOutcome::NoActiveAction) => Err(ActionGone.into()),
            Err(error) => {
                tracing::warn!(
                    instance_id = %self.action.instance_id,
                    asg = %self.action.auto_scaling_group_name,
                    hook = %self.action.lifecycle_hook_name,
                    error = %error,
                    "lifecycle heartbeat failed; trying again sooner"
                );
                self.next_due = Instant::now() + self.interval / 4;
                Err(PendingUnproven::Unanswered(error))
            }
        }
    }

    /// Runs `work` to its end while recording heartbeats when due. `Err(ActionGone)` (and
    /// `work` dropped) when Auto Scaling says the action is gone.
    pub async fn keep_alive<T>(
        &mut self,
        autoscaling: &impl AutoScaling,
        work: impl Future<Output = T>,
    ) -> Result<T, ActionGone> {
        let mut work = std::pin::pin!(work);
        loop {
            let due = self.next_beat();
            tokio::select! {
                biased;
                output = &mut work => return Ok(output),
                () = sleep_until(due) => self.beat(autoscaling).await?,
            }
        }
    }

    /// When the next heartbeat is due; `None` when it would fall after the global deadline
    /// (no heartbeat can extend that).
    fn next_beat(&self) -> Option<Instant> {
        (self.next_due < self.global_deadline_at).then_some(self.next_due)
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::aws::AwsErrorKind;
    use crate::aws::in_memory::InMemoryAutoScaling;
    use crate::lifecycle::test_support::{action, fast_hook, ms};

    #[tokio::test]
    async fn heartbeats_every_half_timeout_while_work_runs() {
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action());
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &fast_hook(100, 60_000),
            Timestamp::now(),
            Timestamp::now(),
        );
        assert_eq!(keeper.interval(), ms(50));
        let started = Instant::now();
        // The work ends once it has seen three heartbeats: they come while it runs. (Counted
        // by the work, not by a fixed sleep, so a loaded machine cannot change the answer.)
        let work = async {
            while asg.heartbeats().len() < 3 {
                tokio::time::sleep(ms(5)).await;
            }
            7
        };
        let out = tokio::time::timeout(Duration::from_secs(10), keeper.keep_alive(&asg, work))
            .await
            .expect("heartbeats came while the work ran")
            .unwrap();
        assert_eq!(out, 7);
        // Never earlier than due: the third at 150 ms at the soonest.
        assert!(started.elapsed() >= ms(150), "{:?}", started.elapsed());
        assert_eq!(keeper.heartbeats() as usize, asg.heartbeats().len());
    }

    #[tokio::test]
    async fn a_gone_action_stops_the_work() {
        let asg = InMemoryAutoScaling::new();
        // Never started: the heartbeat finds no active action.
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &fast_hook(40, 60_000),
            Timestamp::now(),
            Timestamp::now(),
        );
        let result = keeper
            .keep_alive(&asg, tokio::time::sleep(Duration::from_secs(10)))
            .await;
        assert_eq!(result, Err(ActionGone));
    }

    #[tokio::test]
    async fn no_heartbeat_after_the_global_deadline() {
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action());
        // Global timeout 80 ms: the beat due at 50 ms is sent, the one at 100 ms is not.
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &fast_hook(100, 80),
            Timestamp::now(),
            Timestamp::now(),
        );
        keeper
            .keep_alive(&asg, tokio::time::sleep(ms(300)))
            .await
            .unwrap();
        // The second beat is due at 100 ms at the soonest, past the deadline: at most the
        // first is sent (a loaded machine may delay even that one past the deadline).
        assert!(asg.heartbeats().len() <= 1, "{:?}", asg.heartbeats());
    }

    #[tokio::test]
    async fn only_an_accepted_heartbeat_proves_the_action_pending() {
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action());
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &fast_hook(200, 60_000),
            Timestamp::now(),
            Timestamp::now(),
        );
        asg.faults.fail(
            "RecordLifecycleActionHeartbeat",
            AwsErrorKind::AccessDenied,
            1,
        );
        let denied = keeper.prove_pending(&asg).await;
        assert!(
            matches!(&denied, Err(PendingUnproven::Unanswered(e)) if e.kind == AwsErrorKind::AccessDenied),
            "{denied:?}"
        );
        keeper.prove_pending(&asg).await.unwrap();
        let gone = HeartbeatKeeper::new(
            LifecycleActionRef {
                token: "another".into(),
                ..action()
            },
            &fast_hook(200, 60_000),
            Timestamp::now(),
            Timestamp::now(),
        )
        .prove_pending(&asg)
        .await;
        assert!(matches!(gone, Err(PendingUnproven::Gone(_))), "{gone:?}");
    }

    #[tokio::test]
    async fn failing_heartbeats_do_not_stop_the_work() {
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action());
        asg.faults.fail(
            "RecordLifecycleActionHeartbeat",
            AwsErrorKind::AccessDenied,
            1,
        );
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &fast_hook(200, 60_000),
            Timestamp::now(),
            Timestamp::now(),
        );
        keeper
            .keep_alive(&asg, tokio::time::sleep(ms(160)))
            .await
            .unwrap();
        // Failed at 100 ms, tried again sooner (125 ms) and recorded.
        assert_eq!(asg.heartbeats().len(), 1);
    }
}
