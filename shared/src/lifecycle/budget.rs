//! The part of an invocation the work may use.
//!
//! A Lambda invocation ends after at most 15 minutes, but a lifecycle hook may wait for hours.
//! The work therefore runs inside an [`InvocationBudget`]: when it is spent, the work stops and
//! hands over ([`super::hand_over`]) to a fresh invocation. Deadlines that must outlive an
//! invocation are counted from the notification's own time, which the republished message
//! carries unchanged; [`instant_at`] puts such a wall-clock time on the monotonic clock.

use std::time::{Duration, SystemTime};

use jiff::Timestamp;
use tokio::time::Instant;

/// Lambda's own limit, used when the context has no deadline (local runs).
const LAMBDA_MAX_DURATION: Duration = Duration::from_secs(900);

/// The part of this invocation the work may use: up to the Lambda deadline minus a margin
/// kept for handing over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvocationBudget {
    hand_over_at: Instant,
    margin: Duration,
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
            margin,
        }
    }

    /// When the work is cut off if a call in flight at the hand-over time has not answered
    /// (an API brownout): a tenth of the margin later, at most [`MAX_CUTOFF_DELAY`]. The work
    /// is then handed over as if it had stopped on time.
    pub fn cutoff_at(&self) -> Instant {
        self.hand_over_at + (self.margin / 10).min(MAX_CUTOFF_DELAY)
    }

    /// The longest a write that closes this invocation's share may take (the hand-over or
    /// completion mark on the node): a quarter of the margin, within
    /// [`MIN_CLOSING_WRITE`]..=[`MAX_CLOSING_WRITE`]. What is left of the margin after the
    /// cut-off and this write is for the heartbeat and the republish. The floor keeps the
    /// marks written with a tiny margin (which then cannot keep the deadline anyway).
    pub fn closing_write_bound(&self) -> Duration {
        (self.margin / 4).clamp(MIN_CLOSING_WRITE, MAX_CLOSING_WRITE)
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

/// See [`InvocationBudget::cutoff_at`].
pub(crate) const MAX_CUTOFF_DELAY: Duration = Duration::from_secs(1);
/// See [`InvocationBudget::closing_write_bound`].
pub(crate) const MIN_CLOSING_WRITE: Duration = Duration::from_secs(1);
/// See [`InvocationBudget::closing_write_bound`].
pub(crate) const MAX_CLOSING_WRITE: Duration = Duration::from_secs(5);

/// The least time an invocation must have for work before its hand-over time.
pub(crate) const MIN_WORKING_SLICE: Duration = Duration::from_secs(1);

/// The `Instant` at which wall-clock time `at` arrives (now, when it is past).
pub(crate) fn instant_at(at: Timestamp) -> Instant {
    let now = Timestamp::now();
    let ahead = now.duration_until(at).try_into().unwrap_or(Duration::ZERO);
    Instant::now() + ahead
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::lifecycle::test_support::ms;

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
    fn the_closing_bounds_fit_in_the_margin() {
        let default = InvocationBudget::new(Duration::from_secs(900), Duration::from_secs(30));
        assert_eq!(
            default.cutoff_at() - default.hand_over_at(),
            Duration::from_secs(1)
        );
        assert_eq!(default.closing_write_bound(), Duration::from_secs(5));
        let tight = InvocationBudget::new(Duration::from_secs(10), Duration::from_secs(2));
        assert_eq!(tight.cutoff_at() - tight.hand_over_at(), ms(200));
        assert_eq!(tight.closing_write_bound(), Duration::from_secs(1));
        let none = InvocationBudget::new(Duration::from_secs(10), Duration::ZERO);
        assert_eq!(none.cutoff_at(), none.hand_over_at());
        assert_eq!(none.closing_write_bound(), Duration::from_secs(1));
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
}
