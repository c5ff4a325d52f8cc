//! The evictions of one drain: which are in flight, which wait for a retry, which pods are
//! already leaving — keyed by namespace, name and UID, with a backoff per pod.
//!
//! The queue does not decide *which* pods to evict (that is [`super::plan`]); it is offered
//! the pods of the current tier each time something changes, and starts what is due within
//! the concurrency limit.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

use super::backoff::Backoff;
use super::eviction::EvictionOutcome;
use super::plan::{DEFAULT_GRACE_PERIOD_SECONDS, NOTICE_END_MARGIN, PlannedPod, PodKey};

/// An eviction in flight.
pub type EvictionFuture = Pin<Box<dyn Future<Output = (PodKey, EvictionOutcome)> + Send>>;

#[derive(Debug, Clone, Default)]
struct Entry {
    /// Refusals in a row of the same kind as the last one (the backoff exponent): a pod
    /// refused by its budget several times and then throttled by the API server starts the
    /// throttle's backoff afresh, instead of sleeping as long as its budget refusals earned.
    refusals: u32,
    not_before: Option<Instant>,
    in_flight: bool,
    /// Accepted, already gone or going with its namespace: only waited for now.
    leaving: bool,
    last_refusal: Option<EvictionOutcome>,
}

/// What the queue learnt from one eviction answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The API server accepted the eviction (the pod is being deleted).
    Evicted,
    /// The pod is gone or going for another reason.
    Leaving,
    /// Refused; retried at the given time.
    RetryAt(Instant),
}

/// The grace period a pod whose own (or configured) grace is `grace` gets when the instance
/// stops at `ends_by`: at most the whole seconds left before `ends_by` minus
/// [`NOTICE_END_MARGIN`], at least 1 (0 would ask for an immediate kill, skipping preStop
/// hooks and SIGTERM). A pod without a grace period has Kubernetes' default of 30 s.
pub fn capped_grace(grace: Option<i64>, ends_by: jiff::Timestamp, now: jiff::Timestamp) -> i64 {
    let left = ends_by.as_second()
        - now.as_second()
        - i64::try_from(NOTICE_END_MARGIN.as_secs()).unwrap_or(i64::MAX);
    grace
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS)
        .min(left)
        .max(1)
}

pub struct EvictionQueue {
    backoff: Backoff,
    concurrency: usize,
    /// Overrides each pod's own grace period when set.
    grace_period_override: Option<i64>,
    /// When the instance stops running (an instance notice's end): each grace period sent is
    /// cut so that the pod ends [`NOTICE_END_MARGIN`] before it.
    grace_ends_by: Option<jiff::Timestamp>,
    entries: HashMap<PodKey, Entry>,
    in_flight: FuturesUnordered<EvictionFuture>,
}

impl EvictionQueue {
    pub fn new(backoff: Backoff, concurrency: usize, grace_period_override: Option<i64>) -> Self {
        Self {
            backoff,
            concurrency: concurrency.max(1),
            grace_period_override,
            grace_ends_by: None,
            entries: HashMap::new(),
            in_flight: FuturesUnordered::new(),
        }
    }

    /// Caps the grace periods sent from now on to end before `ends_by` (see
    /// [`capped_grace`]); `None` lifts the cap.
    pub fn cap_grace_to(&mut self, ends_by: Option<jiff::Timestamp>) {
        self.grace_ends_by = ends_by;
    }

    /// Starts evictions for the `pods` that are due, up to the concurrency limit. `evict`
    /// makes the request (the real one is [`super::eviction::evict`]). Returns how many
    /// were started.
    pub fn offer(
        &mut self,
        pods: &[PlannedPod],
        now: Instant,
        evict: impl Fn(PodKey, Option<i64>) -> EvictionFuture,
    ) -> usize {
        let mut started = 0;
        for pod in pods {
            if self.in_flight.len() >= self.concurrency {
                break;
            }
            // Looked up before inserting: most offered pods are known already (in flight,
            // leaving, or waiting for a retry), and a key clone per pod per offer adds up
            // on a node with hundreds of pods.
            match self.entries.get_mut(&pod.key) {
                Some(entry) => {
                    let due = entry.not_before.is_none_or(|t| t <= now);
                    if entry.in_flight || entry.leaving || !due {
                        continue;
                    }
                    entry.in_flight = true;
                }
                None => {
                    self.entries.insert(
                        pod.key.clone(),
                        Entry {
                            in_flight: true,
                            ..Entry::default()
                        },
                    );
                }
            }
            let mut grace = self.grace_period_override.or(pod.grace_period_seconds);
            if let Some(ends_by) = self.grace_ends_by {
                grace = Some(capped_grace(grace, ends_by, jiff::Timestamp::now()));
            }
            self.in_flight.push(evict(pod.key.clone(), grace));
            started += 1;
        }
        started
    }

    /// The next answer of an eviction in flight; never resolves while none is in flight
    /// (so it can sit in a `select!` next to the pod watch and timers).
    pub async fn next_answer(&mut self) -> (PodKey, EvictionOutcome) {
        match self.in_flight.next().await {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }

    /// An answer that has already arrived, without waiting.
    pub fn ready_answer(&mut self) -> Option<(PodKey, EvictionOutcome)> {
        self.in_flight.next().now_or_never().flatten()
    }

    pub fn has_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Records an eviction answer and, for a refusal, when to try again.
    pub fn record(&mut self, pod: &PodKey, outcome: EvictionOutcome, now: Instant) -> Recorded {
        let entry = self.entries.entry(pod.clone()).or_default();
        entry.in_flight = false;
        if outcome.is_leaving() {
            entry.leaving = true;
            return if outcome == EvictionOutcome::Accepted {
                Recorded::Evicted
            } else {
                Recorded::Leaving
            };
        }
        if entry
            .last_refusal
            .as_ref()
            .is_some_and(|last| std::mem::discriminant(last) != std::mem::discriminant(&outcome))
        {
            entry.refusals = 0;
        }
        // An operator has to act on a rejection (RBAC, admission): retry at the slowest pace.
        let attempt = if matches!(outcome, EvictionOutcome::Rejected { .. }) {
            u32::MAX
        } else {
            entry.refusals
        };
        let at = now + self.backoff.delay(attempt, outcome.retry_after());
        entry.refusals = entry.refusals.saturating_add(1);
        entry.not_before = Some(at);
        entry.last_refusal = Some(outcome);
        Recorded::RetryAt(at)
    }

    /// Moves the retry of a refused pod to `at` (a budget allows it now, or it waits for
    /// the budget instead of the timer); `false` when the pod is not waiting for a retry.
    pub fn retry_at(&mut self, pod: &PodKey, at: Instant) -> bool {
        match self.entries.get_mut(pod) {
            Some(entry) if !entry.in_flight && !entry.leaving => {
                entry.not_before = Some(at);
                true
            }
            _ => false,
        }
    }

    /// When the earliest waiting retry is due, if any.
    pub fn next_retry_at(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter(|e| !e.in_flight && !e.leaving)
            .filter_map(|e| e.not_before)
            .min()
    }

    /// Forgets pods that are no longer on the node.
    pub fn retain_present(&mut self, present: impl Fn(&PodKey) -> bool) {
        self.entries
            .retain(|key, entry| entry.in_flight || present(key));
    }

    /// The last refusal of each pod still refused, for the PodEvictionFailure report.
    pub fn refusals(&self) -> impl Iterator<Item = (&PodKey, &EvictionOutcome)> {
        self.entries
            .iter()
            .filter(|(_, e)| !e.leaving)
            .filter_map(|(k, e)| e.last_refusal.as_ref().map(|r| (k, r)))
    }

    /// Whether an eviction of the pod awaits its answer.
    pub fn is_in_flight(&self, pod: &PodKey) -> bool {
        self.entries.get(pod).is_some_and(|e| e.in_flight)
    }

    /// Whether the pod's eviction was accepted or it is otherwise on its way out.
    pub fn is_leaving(&self, pod: &PodKey) -> bool {
        self.entries.get(pod).is_some_and(|e| e.leaving)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn grace_periods_are_cut_to_end_before_the_instance_and_never_to_zero() {
        let end = jiff::Timestamp::from_second(1_700_000_120).unwrap();
        let at = |second: i64| jiff::Timestamp::from_second(1_700_000_000 + second).unwrap();
        // 60 s left, 5 s margin: at most 55.
        assert_eq!(capped_grace(Some(300), end, at(60)), 55);
        assert_eq!(
            capped_grace(Some(20), end, at(60)),
            20,
            "a shorter one is kept"
        );
        assert_eq!(capped_grace(None, end, at(60)), 30, "Kubernetes' default");
        assert_eq!(capped_grace(Some(30), end, at(118)), 1, "never 0");
        assert_eq!(capped_grace(Some(30), end, at(500)), 1, "past the end");
    }
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn pod(name: &str) -> PlannedPod {
        PlannedPod {
            key: PodKey {
                namespace: "default".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            grace_period_seconds: Some(30),
        }
    }

    fn queue(concurrency: usize, grace: Option<i64>) -> EvictionQueue {
        EvictionQueue::new(
            Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(8),
            },
            concurrency,
            grace,
        )
    }

    type Calls = Arc<Mutex<Vec<(String, Option<i64>)>>>;

    fn answering(
        outcome: EvictionOutcome,
        calls: Calls,
    ) -> impl Fn(PodKey, Option<i64>) -> EvictionFuture {
        move |key, grace| {
            calls.lock().unwrap().push((key.name.clone(), grace));
            let outcome = outcome.clone();
            Box::pin(async move { (key, outcome) })
        }
    }

    #[tokio::test]
    async fn concurrency_is_bounded_and_accepted_pods_are_not_evicted_again() {
        let calls = Calls::default();
        let pods = [pod("a"), pod("b"), pod("c")];
        let mut q = queue(2, None);
        let now = Instant::now();
        let evict = answering(EvictionOutcome::Accepted, calls.clone());
        assert_eq!(q.offer(&pods, now, &evict), 2);
        assert_eq!(q.offer(&pods, now, &evict), 0, "limit reached");
        let (key, outcome) = q.next_answer().await;
        assert_eq!(q.record(&key, outcome, now), Recorded::Evicted);
        assert_eq!(q.offer(&pods, now, &evict), 1);
        let (key, outcome) = q.next_answer().await;
        q.record(&key, outcome, now);
        let (key, outcome) = q.next_answer().await;
        q.record(&key, outcome, now);
        assert_eq!(q.offer(&pods, now, &evict), 0, "all leaving");
        assert!(!q.has_in_flight());
        let names: Vec<_> = calls.lock().unwrap().iter().map(|c| c.0.clone()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(
            calls.lock().unwrap()[0].1,
            Some(30),
            "pod's own grace period"
        );
    }

    #[tokio::test]
    async fn refused_pods_wait_for_their_backoff_and_are_reported() {
        let calls = Calls::default();
        let pods = [pod("a")];
        let mut q = queue(4, Some(0));
        let now = Instant::now();
        let refused = EvictionOutcome::BlockedByBudget {
            budgets: vec!["web".into()],
            retry_after: Some(Duration::from_secs(5)),
            message: "disruption budget".into(),
        };
        let evict = answering(refused.clone(), calls.clone());
        q.offer(&pods, now, &evict);
        let (key, outcome) = q.next_answer().await;
        let Recorded::RetryAt(at) = q.record(&key, outcome, now) else {
            panic!("expected a retry")
        };
        assert!(at >= now + Duration::from_secs(5), "Retry-After honoured");
        assert_eq!(q.next_retry_at(), Some(at));
        assert_eq!(q.offer(&pods, now + Duration::from_secs(1), &evict), 0);
        assert_eq!(q.offer(&pods, at, &evict), 1);
        assert_eq!(calls.lock().unwrap()[0].1, Some(0), "override wins");
        let refusals: Vec<_> = q
            .refusals()
            .map(|(k, r)| (k.name.clone(), r.clone()))
            .collect();
        assert_eq!(refusals, [("a".to_owned(), refused)]);
        q.retain_present(|_| false);
        assert_eq!(q.refusals().count(), 1, "in flight entries are kept");
    }

    #[tokio::test]
    async fn a_throttled_pod_backs_off_afresh_after_budget_refusals() {
        let pods = [pod("a")];
        let mut q = queue(4, None);
        let now = Instant::now();
        let by_budget = EvictionOutcome::BlockedByBudget {
            budgets: vec!["web".into()],
            retry_after: None,
            message: "disruption budget".into(),
        };
        let throttled = EvictionOutcome::Transient {
            retry_after: None,
            message: "too many requests".into(),
        };
        let answer = |q: &mut EvictionQueue, outcome: &EvictionOutcome| {
            let calls = Calls::default();
            q.retry_at(&pods[0].key, now);
            q.offer(&pods, now, answering(outcome.clone(), calls));
            let Recorded::RetryAt(at) = q.record(&pods[0].key, outcome.clone(), now) else {
                panic!("expected a retry")
            };
            at - now
        };
        for _ in 0..4 {
            answer(&mut q, &by_budget);
        }
        // The fifth budget refusal in a row would wait 4-8 s (capped at 8); the first
        // throttle waits as a first retry does: 0.5-1 s.
        let first_throttle = answer(&mut q, &throttled);
        assert!(
            first_throttle <= Duration::from_secs(1),
            "{first_throttle:?}"
        );
        let second_throttle = answer(&mut q, &throttled);
        assert!(
            second_throttle >= Duration::from_secs(1),
            "throttles in a row back off: {second_throttle:?}"
        );
        let back_to_budget = answer(&mut q, &by_budget);
        assert!(
            back_to_budget <= Duration::from_secs(1),
            "{back_to_budget:?}"
        );
    }
}
