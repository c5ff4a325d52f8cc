//! The one retry policy and the one backoff curve.
//!
//! Every wait before trying again — an AWS call, an `aws-auth` write that lost a race, a
//! refused eviction, a lease renewal — is [`backoff_delay`]: exponential, capped, with "equal
//! jitter" (half the step fixed, half random), so concurrent callers spread out but none
//! retries at once. What differs between callers is only numbers, kept as [`RetryPolicy`]
//! constants beside the code that uses them.

use std::future::Future;
use std::time::Duration;

use rand::Rng;

use crate::aws::AwsError;

/// How often and how patiently something is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries in total, the first included.
    pub max_attempts: u32,
    /// The first backoff step; it doubles per attempt.
    pub base_delay: Duration,
    /// The largest step.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// A retryable AWS call of the hooks (`CompleteLifecycleAction`, heartbeats, `Publish`,
    /// `DescribeLifecycleHooks`, ...): five tries within a few seconds.
    pub const AWS_CALL: Self = Self {
        max_attempts: 5,
        base_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(5),
    };

    /// A read-merge-write of `aws-auth` that lost a race to another writer (409): twelve
    /// tries, from a fresh read each time.
    pub const AWS_AUTH_WRITE: Self = Self {
        max_attempts: 12,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(5),
    };

    /// The wait before retry number `attempt` (0 for the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        backoff_delay(attempt, self.base_delay, self.max_delay)
    }
}

/// Calls `call` until it succeeds, fails for good ([`AwsError::is_retryable`] false), or the
/// policy's attempts are used; waits [`RetryPolicy::delay`] in between.
pub(crate) async fn with_retries<T, F, Fut>(
    policy: &RetryPolicy,
    mut call: F,
) -> Result<T, AwsError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, AwsError>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) if error.is_retryable() && attempt + 1 < policy.max_attempts => {
                let delay = policy.delay(attempt);
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

/// Exponential backoff with "equal jitter": the step `base · 2^attempt` (at most `cap`), half
/// of it fixed and half random.
pub(crate) fn backoff_delay(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let step = base
        .saturating_mul(2u32.saturating_pow(attempt.min(30)))
        .min(cap);
    let half = step / 2;
    let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(rand::rng().random_range(0..=jitter_nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::AwsErrorKind;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
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

    #[test]
    fn the_policy_delay_is_the_backoff_of_its_numbers() {
        let policy = RetryPolicy::AWS_AUTH_WRITE;
        for attempt in 0..20 {
            let step = policy
                .base_delay
                .saturating_mul(1 << attempt.min(10))
                .min(policy.max_delay);
            let delay = policy.delay(attempt);
            assert!(delay >= step / 2 && delay <= step, "{attempt}: {delay:?}");
        }
    }

    #[tokio::test]
    async fn retries_stop_after_the_policy_attempts() {
        let policy = RetryPolicy {
            max_attempts: 3,
            base_delay: ms(1),
            max_delay: ms(2),
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
}
