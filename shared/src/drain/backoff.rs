//! When to try a refused eviction again: exponential, jittered, never sooner than the API
//! server's `Retry-After`.
//!
//! Jitter matters here: a node's pods are often replicas of one Deployment behind one PDB,
//! and retrying them in lock-step just collides on the PDB again. The jittered curve itself is
//! the crate's one backoff ([`backoff_delay`]); this adds the server's say.

use std::time::Duration;

use crate::retry::backoff_delay;

/// Exponential backoff between `base` and `max` with equal jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The wait before retry number `attempt` (0 for the first retry). A server-sent
    /// `retry_after` is honoured as the lower bound, capped at `max` so a drain never sleeps
    /// longer than the operator configured (and tests can scale it down).
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let computed = backoff_delay(attempt, self.base, self.max);
        match retry_after {
            Some(server) => computed.max(server.min(self.max)),
            None => computed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(30),
    };

    #[test]
    fn grows_within_bounds_and_is_jittered() {
        for attempt in 0..40 {
            let ceiling = Duration::from_secs(1u64 << attempt.min(5)).min(BACKOFF.max);
            let d = BACKOFF.delay(attempt, None);
            assert!(d >= ceiling / 2 && d <= ceiling, "attempt {attempt}: {d:?}");
        }
        let samples: std::collections::BTreeSet<_> =
            (0..20).map(|_| BACKOFF.delay(3, None)).collect();
        assert!(samples.len() > 1, "jitter spreads retries: {samples:?}");
    }

    #[test]
    fn retry_after_is_a_floor_capped_at_max() {
        let d = BACKOFF.delay(0, Some(Duration::from_secs(10)));
        assert!(d >= Duration::from_secs(10), "{d:?}");
        assert_eq!(
            BACKOFF.delay(0, Some(Duration::from_secs(3600))),
            Duration::from_secs(30)
        );
        let tiny = Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(40),
        };
        assert!(tiny.delay(0, Some(Duration::from_secs(10))) <= tiny.max);
    }
}
