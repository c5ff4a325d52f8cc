//! The lifecycle hooks' timeouts, read per lifecycle action (and at least every
//! [`super::recent::MAX_AGE`]), with Auto Scaling's defaults when a hook cannot be read.

use std::time::Duration;

use crate::aws::{AutoScaling, AwsError, LifecycleActionResult, LifecycleHook};
use crate::retry::{RetryPolicy, with_retries};

use super::recent::RecentReads;

/// The hooks' timings, read with `DescribeLifecycleHooks` for each new lifecycle action and
/// reused for that action's redeliveries and hand-overs for at most [`super::recent::MAX_AGE`]: a lowered
/// `HeartbeatTimeout` must pace the next heartbeats, or the action expires mid-drain.
#[derive(Debug, Default)]
pub struct HookTimings {
    known: RecentReads<(String, String), LifecycleHook>,
}

impl HookTimings {
    pub fn new() -> Self {
        Self::default()
    }

    /// The hook, or Auto Scaling's defaults when the hook is not found (it may have been
    /// deleted while its last actions are still pending). `action_token`: the lifecycle
    /// action the timings are for; a read for another action is not reused.
    pub async fn get(
        &self,
        autoscaling: &impl AutoScaling,
        group: &str,
        hook: &str,
        action_token: &str,
    ) -> Result<LifecycleHook, AwsError> {
        let key = (group.to_owned(), hook.to_owned());
        if let Some(found) = self.known.get(&key, action_token) {
            return Ok(found);
        }
        let described = with_retries(&RetryPolicy::AWS_CALL, || {
            autoscaling.describe_lifecycle_hook(group, hook)
        })
        .await?;
        let timings = described.unwrap_or_else(|| default_hook(hook));
        self.known.insert(key, action_token, timings.clone());
        Ok(timings)
    }

    /// [`Self::get`], falling back to Auto Scaling's defaults when the hook cannot be read
    /// (a missing IAM permission must not stop the hook from completing).
    pub async fn get_or_default(
        &self,
        autoscaling: &impl AutoScaling,
        group: &str,
        hook: &str,
        action_token: &str,
    ) -> LifecycleHook {
        match self.get(autoscaling, group, hook, action_token).await {
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
}

/// The timings assumed while a hook's cannot be read: the shortest heartbeat timeout Auto
/// Scaling accepts, so heartbeats come often enough whatever the hook's real one is. Not
/// cached: the next invocation reads the hook again.
pub(crate) fn unreadable_hook(name: &str) -> LifecycleHook {
    LifecycleHook {
        heartbeat_timeout: MIN_HEARTBEAT_TIMEOUT,
        ..default_hook(name)
    }
}

/// The shortest `HeartbeatTimeout` Auto Scaling accepts for a lifecycle hook.
pub(crate) const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

/// Auto Scaling's defaults: heartbeat timeout 3600 s, global timeout the smaller of 100
/// heartbeat timeouts and 48 hours, result ABANDON.
pub(crate) fn default_hook(name: &str) -> LifecycleHook {
    LifecycleHook {
        name: name.to_owned(),
        transition: String::new(),
        heartbeat_timeout: Duration::from_secs(3600),
        global_timeout: Duration::from_secs(172_800),
        default_result: LifecycleActionResult::Abandon,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::aws::AwsErrorKind;
    use crate::aws::in_memory::InMemoryAutoScaling;
    use crate::lifecycle::test_support::hook;

    #[tokio::test]
    async fn hook_timings_are_read_per_action() {
        let asg = InMemoryAutoScaling::new();
        asg.add_hook("asg", hook(120, 12000));
        let timings = HookTimings::new();
        let first = timings
            .get(&asg, "asg", "Launch-LC-Hook", "token-1")
            .await
            .unwrap();
        assert_eq!(first.heartbeat_timeout, Duration::from_secs(120));
        // Lowered by the operator: the same action reuses its read for a while...
        asg.add_hook("asg", hook(60, 12000));
        let same_action = timings
            .get(&asg, "asg", "Launch-LC-Hook", "token-1")
            .await
            .unwrap();
        assert_eq!(same_action, first);
        // ...a new action reads it again (the age bound: `recent.rs`).
        let next_action = timings
            .get(&asg, "asg", "Launch-LC-Hook", "token-2")
            .await
            .unwrap();
        assert_eq!(next_action.heartbeat_timeout, Duration::from_secs(60));
        // Unreadable (five failures queued): heartbeats as if the timeout were the shortest
        // allowed, and that is not remembered, so the hook is read once it can be.
        asg.faults
            .fail("DescribeLifecycleHooks", AwsErrorKind::AccessDenied, 5);
        let mut other = hook(600, 60000);
        other.name = "Other".into();
        asg.add_hook("asg", other);
        for _ in 0..5 {
            let fallback = timings
                .get_or_default(&asg, "asg", "Other", "token-2")
                .await;
            assert_eq!(fallback.heartbeat_timeout, MIN_HEARTBEAT_TIMEOUT);
        }
        let read = timings
            .get_or_default(&asg, "asg", "Other", "token-2")
            .await;
        assert_eq!(read.heartbeat_timeout, Duration::from_secs(600));
    }
}
