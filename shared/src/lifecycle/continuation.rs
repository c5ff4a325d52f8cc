//! Waits longer than one invocation.
//!
//! A Lambda invocation ends after at most 15 minutes, but a lifecycle hook may wait for hours.
//! The work therefore runs inside an [`InvocationBudget`]; while it runs a [`HeartbeatKeeper`]
//! keeps the lifecycle action alive; when the budget is spent, [`hand_over`] records a
//! heartbeat and publishes the notification again so a fresh invocation picks it up. Deadlines
//! that must outlive an invocation are counted from the notification's own time, which the
//! republished message carries unchanged.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use jiff::Timestamp;
use rand::Rng;
use tokio::time::Instant;

use crate::aws::{
    AutoScaling, AwsError, CompletionOutcome, HeartbeatOutcome, LifecycleActionRef,
    LifecycleActionResult, LifecycleHook, Notifications,
};

use super::notification::{Delivery, DeliverySource};

/// Lambda's own limit, used when the context has no deadline (local runs).
const LAMBDA_MAX_DURATION: Duration = Duration::from_secs(900);

/// The part of this invocation the work may use: up to the Lambda deadline minus a margin
/// kept for handing over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvocationBudget {
    hand_over_at: Instant,
}

impl InvocationBudget {
    pub fn from_context(context: &lambda_runtime::Context, margin: Duration) -> Self {
        let remaining = if context.deadline == 0 {
            LAMBDA_MAX_DURATION
        } else {
            context
                .deadline()
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        };
        Self::new(remaining, margin)
    }

    /// `remaining`: time until the invocation's deadline.
    pub fn new(remaining: Duration, margin: Duration) -> Self {
        Self {
            hand_over_at: Instant::now() + remaining.saturating_sub(margin),
        }
    }

    /// When the work must stop and hand over.
    pub fn hand_over_at(&self) -> Instant {
        self.hand_over_at
    }

    /// Time left before the hand-over.
    pub fn remaining(&self) -> Duration {
        self.hand_over_at.saturating_duration_since(Instant::now())
    }

    pub fn is_spent(&self) -> bool {
        Instant::now() >= self.hand_over_at
    }

    /// Whether at least [`MIN_WORKING_SLICE`] is left before the hand-over: with less, an
    /// invocation would hand over at once and the notification loop through SNS without any
    /// work done (a `HAND_OVER_MARGIN_SECONDS` as large as the function's timeout).
    pub fn has_working_slice(&self) -> bool {
        self.remaining() >= MIN_WORKING_SLICE
    }
}

/// The least time an invocation must have for work before its hand-over time.
pub const MIN_WORKING_SLICE: Duration = Duration::from_secs(1);

/// The `Instant` at which wall-clock time `at` arrives (now, when it is past).
pub fn instant_at(at: Timestamp) -> Instant {
    let now = Timestamp::now();
    let ahead = now.duration_until(at).try_into().unwrap_or(Duration::ZERO);
    Instant::now() + ahead
}

/// The hooks' timings, read once per group and hook with `DescribeLifecycleHooks` and kept
/// for the life of the execution environment.
#[derive(Debug, Default)]
pub struct HookTimings {
    known: Mutex<HashMap<(String, String), LifecycleHook>>,
}

impl HookTimings {
    pub fn new() -> Self {
        Self::default()
    }

    /// The hook, or Auto Scaling's defaults when the hook is not found (it may have been
    /// deleted while its last actions are still pending).
    pub async fn get(
        &self,
        autoscaling: &impl AutoScaling,
        group: &str,
        hook: &str,
    ) -> Result<LifecycleHook, AwsError> {
        let key = (group.to_owned(), hook.to_owned());
        if let Some(found) = self.lock().get(&key) {
            return Ok(found.clone());
        }
        let described = with_retries(&RetryPolicy::default(), || {
            autoscaling.describe_lifecycle_hook(group, hook)
        })
        .await?;
        let timings = described.unwrap_or_else(|| default_hook(hook));
        self.lock().insert(key, timings.clone());
        Ok(timings)
    }

    /// [`Self::get`], falling back to Auto Scaling's defaults when the hook cannot be read
    /// (a missing IAM permission must not stop the hook from completing).
    pub async fn get_or_default(
        &self,
        autoscaling: &impl AutoScaling,
        group: &str,
        hook: &str,
    ) -> LifecycleHook {
        match self.get(autoscaling, group, hook).await {
            Ok(timings) => timings,
            Err(error) => {
                tracing::warn!(
                    asg = group,
                    hook,
                    error = %error,
                    "cannot read the lifecycle hook's timeouts; heartbeating as if its heartbeat timeout were the shortest Auto Scaling allows (30 s) until it can be read"
                );
                unreadable_hook(hook)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), LifecycleHook>> {
        self.known
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The timings assumed while a hook's cannot be read: the shortest heartbeat timeout Auto
/// Scaling accepts, so heartbeats come often enough whatever the hook's real one is. Not
/// cached: the next invocation reads the hook again.
pub fn unreadable_hook(name: &str) -> LifecycleHook {
    LifecycleHook {
        heartbeat_timeout: MIN_HEARTBEAT_TIMEOUT,
        ..default_hook(name)
    }
}

/// The shortest `HeartbeatTimeout` Auto Scaling accepts for a lifecycle hook.
pub const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

/// Auto Scaling's defaults: heartbeat timeout 3600 s, global timeout the smaller of 100
/// heartbeat timeouts and 48 hours, result ABANDON.
pub fn default_hook(name: &str) -> LifecycleHook {
    LifecycleHook {
        name: name.to_owned(),
        transition: String::new(),
        heartbeat_timeout: Duration::from_secs(3600),
        global_timeout: Duration::from_secs(172_800),
        default_result: LifecycleActionResult::Abandon,
    }
}

/// The lifecycle action is gone (completed by someone else, or expired): stop working on it
/// and do not complete it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lifecycle action is no longer active (completed elsewhere or timed out)")]
pub struct ActionGone;

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
    pub async fn beat(&mut self, autoscaling: &impl AutoScaling) -> Result<(), ActionGone> {
        if Instant::now() >= self.global_deadline_at {
            return Err(ActionGone);
        }
        let outcome = with_retries(&RetryPolicy::default(), || {
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
            Ok(HeartbeatOutcome::NoActiveAction) => Err(ActionGone),
            Err(error) => {
                tracing::warn!(
                    instance_id = %self.action.instance_id,
                    asg = %self.action.auto_scaling_group_name,
                    hook = %self.action.lifecycle_hook_name,
                    error = %error,
                    "lifecycle heartbeat failed; trying again sooner"
                );
                self.next_due = Instant::now() + self.interval / 4;
                Ok(())
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

/// What [`hand_over`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandOver {
    /// A fresh invocation will continue: the message went to `topic_arn` with this
    /// continuation count.
    Published {
        topic_arn: String,
        continuation: u32,
    },
    /// The heartbeat found the action gone: nothing to continue.
    ActionGone,
}

/// A hand-over that could not happen.
#[derive(Debug, thiserror::Error)]
pub enum ContinuationError {
    #[error(
        "cannot continue a notification that arrived through EventBridge: set CONTINUATION_TOPIC_ARN to an SNS topic that invokes this function"
    )]
    NoTopic,
    #[error("only lifecycle notifications can be continued")]
    NotALifecycleNotification,
    #[error(transparent)]
    Aws(#[from] AwsError),
}

/// Extends the action with a heartbeat, then publishes the notification again to the topic it
/// came from (or `fallback_topic` for EventBridge deliveries) so a fresh invocation resumes.
pub async fn hand_over(
    autoscaling: &impl AutoScaling,
    notifications: &impl Notifications,
    keeper: &mut HeartbeatKeeper,
    delivery: &Delivery,
    fallback_topic: Option<&str>,
) -> Result<HandOver, ContinuationError> {
    let notification = delivery
        .lifecycle()
        .ok_or(ContinuationError::NotALifecycleNotification)?;
    let topic_arn = match &delivery.source {
        DeliverySource::Sns { topic_arn } => topic_arn.as_str(),
        DeliverySource::EventBridge => fallback_topic.ok_or(ContinuationError::NoTopic)?,
    };
    if keeper.beat(autoscaling).await.is_err() {
        return Ok(HandOver::ActionGone);
    }
    let continuation = notification.continuation.saturating_add(1);
    let message = delivery.message_for_continuation(continuation);
    with_retries(&RetryPolicy::default(), || {
        notifications.publish(topic_arn, delivery.subject.as_deref(), &message)
    })
    .await?;
    tracing::info!(
        instance_id = %notification.action.instance_id,
        asg = %notification.action.auto_scaling_group_name,
        hook = %notification.action.lifecycle_hook_name,
        request_id = %notification.request_id,
        topic_arn,
        continuation,
        "handed over to a fresh invocation"
    );
    Ok(HandOver::Published {
        topic_arn: topic_arn.to_owned(),
        continuation,
    })
}

/// `CompleteLifecycleAction`, retried when that may help. `Ok(NoActiveAction)` means it was
/// done already (by a duplicate, or it timed out): a success for the caller.
pub async fn complete_action(
    autoscaling: &impl AutoScaling,
    action: &LifecycleActionRef,
    result: LifecycleActionResult,
) -> Result<CompletionOutcome, AwsError> {
    with_retries(&RetryPolicy::default(), || {
        autoscaling.complete_lifecycle_action(action, result)
    })
    .await
}

/// How often and how patiently a retryable AWS call is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls in total, the first included.
    pub attempts: u32,
    pub base: Duration,
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            base: Duration::from_millis(200),
            cap: Duration::from_secs(5),
        }
    }
}

/// Calls `call` until it succeeds, fails for good ([`AwsError::is_retryable`] false), or the
/// policy's attempts are used; waits a jittered, growing delay in between.
pub async fn with_retries<T, F, Fut>(policy: &RetryPolicy, mut call: F) -> Result<T, AwsError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, AwsError>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) if error.is_retryable() && attempt + 1 < policy.attempts => {
                let delay = backoff_delay(attempt, policy.base, policy.cap);
                tracing::warn!(
                    operation = error.operation,
                    error = %error,
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "AWS call failed; retrying"
                );
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Exponential backoff with "equal jitter": half the step is fixed, half random, so
/// concurrent callers spread out but none retries immediately.
pub fn backoff_delay(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let step = base
        .saturating_mul(2u32.saturating_pow(attempt.min(30)))
        .min(cap);
    let half = step / 2;
    let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(rand::rng().random_range(0..=jitter_nanos))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::aws::AwsErrorKind;
    use crate::aws::fake::{FakeAutoScaling, FakeNotifications};
    use crate::lifecycle::notification::parse_event;

    fn action() -> LifecycleActionRef {
        LifecycleActionRef {
            auto_scaling_group_name: "asg".into(),
            lifecycle_hook_name: "Launch-LC-Hook".into(),
            instance_id: "i-0a1b2c3d4e5f60718".into(),
            token: "tok".into(),
        }
    }

    fn hook(heartbeat_secs: u64, global_secs: u64) -> LifecycleHook {
        LifecycleHook {
            name: "Launch-LC-Hook".into(),
            transition: "autoscaling:EC2_INSTANCE_LAUNCHING".into(),
            heartbeat_timeout: Duration::from_secs(heartbeat_secs),
            global_timeout: Duration::from_secs(global_secs),
            default_result: LifecycleActionResult::Abandon,
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(1);
        for _ in 0..50 {
            let first = backoff_delay(0, base, cap);
            assert!(
                first >= Duration::from_millis(50) && first <= base,
                "{first:?}"
            );
            let late = backoff_delay(20, base, cap);
            assert!(late >= cap / 2 && late <= cap, "{late:?}");
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A hook whose timings are in milliseconds, so waits run in real time quickly.
    fn fast_hook(heartbeat_ms: u64, global_ms: u64) -> LifecycleHook {
        LifecycleHook {
            heartbeat_timeout: ms(heartbeat_ms),
            global_timeout: ms(global_ms),
            ..hook(0, 0)
        }
    }

    #[tokio::test]
    async fn retries_only_what_may_succeed() {
        let asg = FakeAutoScaling::new();
        asg.start_action(&action());
        asg.faults
            .fail("CompleteLifecycleAction", AwsErrorKind::Transient, 1);
        let outcome = complete_action(&asg, &action(), LifecycleActionResult::Continue)
            .await
            .unwrap();
        assert_eq!(outcome, CompletionOutcome::Completed);
        assert_eq!(asg.completions().len(), 1);
        // Already done: success, not an error.
        assert_eq!(
            complete_action(&asg, &action(), LifecycleActionResult::Continue)
                .await
                .unwrap(),
            CompletionOutcome::NoActiveAction
        );
        asg.faults
            .fail("CompleteLifecycleAction", AwsErrorKind::AccessDenied, 1);
        let err = complete_action(&asg, &action(), LifecycleActionResult::Continue)
            .await
            .unwrap_err();
        assert_eq!(err.kind, AwsErrorKind::AccessDenied);
    }

    #[tokio::test]
    async fn retries_stop_after_the_policy_attempts() {
        let policy = RetryPolicy {
            attempts: 3,
            base: ms(1),
            cap: ms(2),
        };
        let calls = std::sync::atomic::AtomicU32::new(0);
        let result: Result<(), AwsError> = with_retries(&policy, || {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                Err(AwsError::new(
                    "Publish",
                    AwsErrorKind::Transient,
                    "throttled",
                ))
            }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn budget_counts_down_to_the_margin() {
        let budget = InvocationBudget::new(ms(100), ms(60));
        assert!(budget.remaining() <= ms(40) && budget.remaining() > ms(30));
        assert!(!budget.is_spent());
        tokio::time::sleep(ms(45)).await;
        assert!(budget.is_spent());
        assert_eq!(budget.remaining(), Duration::ZERO);
        let short = InvocationBudget::new(ms(10), ms(30));
        assert!(short.is_spent());
    }

    #[test]
    fn budget_from_a_lambda_context() {
        let mut context = lambda_runtime::Context::default();
        let deadline = SystemTime::now() + Duration::from_secs(120);
        context.deadline = u64::try_from(
            deadline
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
        let budget = InvocationBudget::from_context(&context, Duration::from_secs(20));
        let remaining = budget.remaining();
        assert!(
            remaining <= Duration::from_secs(100) && remaining > Duration::from_secs(95),
            "{remaining:?}"
        );
    }

    #[tokio::test]
    async fn heartbeats_every_half_timeout_while_work_runs() {
        let asg = FakeAutoScaling::new();
        asg.start_action(&action());
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &fast_hook(100, 60_000),
            Timestamp::now(),
            Timestamp::now(),
        );
        assert_eq!(keeper.interval(), ms(50));
        let out = keeper
            .keep_alive(&asg, async {
                tokio::time::sleep(ms(175)).await;
                7
            })
            .await
            .unwrap();
        assert_eq!(out, 7);
        // Due at 50, 100, 150 ms.
        assert_eq!(asg.heartbeats().len(), 3);
        assert_eq!(keeper.heartbeats(), 3);
    }

    #[tokio::test]
    async fn a_gone_action_stops_the_work() {
        let asg = FakeAutoScaling::new();
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
        let asg = FakeAutoScaling::new();
        asg.start_action(&action());
        // Global timeout 80 ms: the beat due at 50 ms is sent, the one at 100 ms is not.
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &fast_hook(100, 80),
            Timestamp::now(),
            Timestamp::now(),
        );
        keeper
            .keep_alive(&asg, tokio::time::sleep(ms(200)))
            .await
            .unwrap();
        assert_eq!(asg.heartbeats().len(), 1);
    }

    #[tokio::test]
    async fn failing_heartbeats_do_not_stop_the_work() {
        let asg = FakeAutoScaling::new();
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

    fn delivery(path: &str) -> Delivery {
        let path = format!("{}/../tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
        let event = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        parse_event(&event).remove(0).unwrap()
    }

    #[tokio::test]
    async fn hand_over_beats_then_republishes_to_the_same_topic() {
        let delivery = delivery("sns-lifecycle-launching.json");
        let action = delivery.lifecycle().unwrap().action.clone();
        let asg = FakeAutoScaling::new();
        asg.start_action(&action);
        let sns = FakeNotifications::default();
        let mut keeper = HeartbeatKeeper::new(
            action.clone(),
            &hook(60, 6000),
            Timestamp::now(),
            Timestamp::now(),
        );
        let outcome = hand_over(&asg, &sns, &mut keeper, &delivery, None)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            HandOver::Published {
                topic_arn: "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic".into(),
                continuation: 1
            }
        );
        assert_eq!(asg.heartbeats().len(), 1);
        let published = sns.published();
        assert_eq!(published.len(), 1);
        let again = serde_json::json!({"Records": [{"Sns": {
            "TopicArn": published[0].topic_arn,
            "Message": published[0].message,
        }}]});
        let resumed = parse_event(&again).remove(0).unwrap();
        let resumed = resumed.lifecycle().unwrap();
        assert_eq!(resumed.continuation, 1);
        assert_eq!(resumed.time, delivery.lifecycle().unwrap().time);
        assert_eq!(resumed.action, action);
    }

    #[tokio::test]
    async fn hand_over_of_a_gone_action_publishes_nothing() {
        let delivery = delivery("sns-lifecycle-launching.json");
        let action = delivery.lifecycle().unwrap().action.clone();
        let asg = FakeAutoScaling::new();
        let sns = FakeNotifications::default();
        let mut keeper =
            HeartbeatKeeper::new(action, &hook(60, 6000), Timestamp::now(), Timestamp::now());
        let outcome = hand_over(&asg, &sns, &mut keeper, &delivery, None)
            .await
            .unwrap();
        assert_eq!(outcome, HandOver::ActionGone);
        assert!(sns.published().is_empty());
    }

    #[tokio::test]
    async fn eventbridge_deliveries_continue_through_the_configured_topic() {
        let event: serde_json::Value = serde_json::json!({
            "id": "e-1",
            "detail-type": "EC2 Instance-launch Lifecycle Action",
            "account": "111111111111",
            "time": "2022-09-25T12:59:58Z",
            "detail": {
                "LifecycleActionToken": "tok",
                "AutoScalingGroupName": "asg",
                "LifecycleHookName": "Launch-LC-Hook",
                "EC2InstanceId": "i-0a1b2c3d4e5f60718",
                "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING"
            }
        });
        let delivery = parse_event(&event).remove(0).unwrap();
        let asg = FakeAutoScaling::new();
        asg.start_action(&action());
        let sns = FakeNotifications::default();
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &hook(60, 6000),
            Timestamp::now(),
            Timestamp::now(),
        );
        let err = hand_over(&asg, &sns, &mut keeper, &delivery, None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("CONTINUATION_TOPIC_ARN"), "{err}");
        let outcome = hand_over(
            &asg,
            &sns,
            &mut keeper,
            &delivery,
            Some("arn:aws:sns:eu-west-1:111111111111:continue"),
        )
        .await
        .unwrap();
        assert!(matches!(
            outcome,
            HandOver::Published {
                continuation: 1,
                ..
            }
        ));
        let published = sns.published();
        assert_eq!(
            published[0].topic_arn,
            "arn:aws:sns:eu-west-1:111111111111:continue"
        );
        // What was published is an Auto Scaling SNS message for the same action.
        let again = serde_json::json!({"Records": [{"Sns": {
            "TopicArn": published[0].topic_arn,
            "Message": published[0].message,
        }}]});
        let resumed = parse_event(&again).remove(0).unwrap();
        assert_eq!(resumed.lifecycle().unwrap().action, action());
        assert_eq!(resumed.lifecycle().unwrap().continuation, 1);
    }

    #[tokio::test]
    async fn hook_timings_are_read_once() {
        let asg = FakeAutoScaling::new();
        asg.add_hook("asg", hook(120, 12000));
        let timings = HookTimings::new();
        let first = timings.get(&asg, "asg", "Launch-LC-Hook").await.unwrap();
        asg.faults
            .fail("DescribeLifecycleHooks", AwsErrorKind::AccessDenied, 5);
        let second = timings.get(&asg, "asg", "Launch-LC-Hook").await.unwrap();
        assert_eq!(first, second);
        assert_eq!(first.heartbeat_timeout, Duration::from_secs(120));
        // Unreadable (five failures queued): heartbeats as if the timeout were the shortest
        // allowed, and that is not remembered, so the hook is read once it can be.
        let mut other = hook(600, 60000);
        other.name = "Other".into();
        asg.add_hook("asg", other);
        for _ in 0..5 {
            let fallback = timings.get_or_default(&asg, "asg", "Other").await;
            assert_eq!(fallback.heartbeat_timeout, MIN_HEARTBEAT_TIMEOUT);
        }
        let read = timings.get_or_default(&asg, "asg", "Other").await;
        assert_eq!(read.heartbeat_timeout, Duration::from_secs(600));
    }
}
