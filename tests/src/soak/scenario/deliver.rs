//! Delivering a scenario's notifications as SNS and Lambda would, only worse: each at least
//! once and up to three times, a launch notification also to the terminating hook (a filter
//! that let it through), some invocations killed mid-flight and redelivered, failed ones
//! retried, hand-overs delivered as new invocations, pending actions redelivered; then late
//! duplicates after everything completed.

use std::time::{Duration, Instant};

use node_manager::aws::LifecycleActionRef;
use rand::Rng;
use serde_json::Value;

use super::SCENARIO_LIMIT;
use super::functions::Functions;
use super::setup::Soak;
use crate::fixtures::lifecycle_notification;
use crate::kube::{FaultAction, FaultRule};
use crate::soak::corpus::{self, Target};

/// What one delivery came to: `None` killed mid-flight, else whether it succeeded; and how
/// long it took of how long it had.
type Delivered = (Target, Value, Option<bool>, Duration, Duration);

/// How far past its budget a terminating-hook invocation may end: the closing write's floor
/// (`InvocationBudget::closing_write_bound`, the soak runs without a margin) plus slack for a
/// busy machine. Beyond it, a real invocation would have been killed by Lambda mid-hand-over.
const OVERRUN_ALLOWANCE: Duration = Duration::from_millis(2500);

impl Soak {
    /// Delivers until every action is complete or the scenario's time is up; returns when
    /// the deliveries started.
    pub(super) async fn deliver_until_complete(&mut self, functions: &Functions) -> Instant {
        let mut queue = self.first_deliveries();
        self.schedule_trouble();
        let mut request = 0u64;
        let deliveries_started = Instant::now();
        let deadline = tokio::time::Instant::now() + SCENARIO_LIMIT;
        let mut round = 0u32;
        loop {
            round += 1;
            self.queue_hand_overs(functions, &mut queue);
            if queue.is_empty() {
                if self.pending_actions() == 0 || tokio::time::Instant::now() > deadline {
                    break;
                }
                // SNS / Lambda retry: redeliver what is still pending.
                for (target, action) in &self.actions {
                    if self.inner.is_pending(action) {
                        queue.push((*target, self.notification_of(*target, action)));
                        self.report.duplicates += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let batch = std::mem::take(&mut queue);
            let mut runs = Vec::new();
            for (target, event) in batch {
                request += 1;
                self.report.invocations += 1;
                let kill_after = (round < 4 && self.rng.random_bool(0.2))
                    .then(|| Duration::from_millis(self.rng.random_range(20..400)));
                let budget = Duration::from_millis(self.rng.random_range(400..3000));
                let request_id = format!("soak-{}-{request}", self.seed);
                runs.push(deliver(
                    functions, target, event, request_id, budget, kill_after,
                ));
            }
            for (target, event, outcome, took, budget) in futures::future::join_all(runs).await {
                if target == Target::TerminatingHook
                    && outcome.is_some()
                    && took > budget + OVERRUN_ALLOWANCE
                {
                    self.overruns.push(format!(
                        "a terminating-hook invocation took {took:?} of a {budget:?} budget"
                    ));
                }
                match outcome {
                    None => {
                        self.report.killed += 1;
                        queue.push((target, event));
                    }
                    Some(false) => queue.push((target, event)), // a failed invocation is retried
                    Some(true) => {}
                }
            }
            if tokio::time::Instant::now() > deadline {
                break;
            }
        }
        deliveries_started
    }

    /// Each action's notification, one to three times; a launch notification also to the
    /// terminating hook, which must not touch the node.
    fn first_deliveries(&mut self) -> Vec<(Target, Value)> {
        let mut queue = Vec::new();
        for (target, action) in &self.actions {
            let event = self.notification_of(*target, action);
            let copies = 1 + self.rng.random_range(0..=2u64);
            self.report.duplicates += copies - 1;
            for _ in 0..copies {
                queue.push((*target, event.clone()));
            }
            if *target == Target::LaunchingHook {
                queue.push((Target::TerminatingHook, event.clone()));
                self.report.duplicates += 1;
            }
        }
        queue
    }

    /// The drawn trouble during the deliveries: 409s on evictions, and a burst of refused
    /// node writes longer than the lease, starting mid-drain.
    fn schedule_trouble(&self) {
        let faults = self.server.faults();
        if self.report.eviction_conflicts {
            faults.add(
                FaultRule::new(FaultAction::Conflict)
                    .subresource("eviction")
                    .probability(0.15),
            );
        }
        if self.report.brownout {
            let (after, length) = (self.trouble.brownout_after, self.trouble.brownout_length);
            let brownout_faults = faults.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                brownout_faults.add(
                    FaultRule::new(FaultAction::TooManyRequests {
                        retry_after_seconds: 1,
                    })
                    .verb("patch")
                    .resource("nodes")
                    .lasting(length),
                );
            });
        }
        if self.report.write_burst {
            let (after, length) = (self.trouble.burst_after, self.trouble.burst_length);
            let burst_faults = faults.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                burst_faults.add(
                    FaultRule::new(FaultAction::ServiceUnavailable)
                        .verb("patch")
                        .resource("nodes")
                        .lasting(length),
                );
            });
        }
    }

    /// Hand-overs the functions published become deliveries.
    fn queue_hand_overs(&mut self, functions: &Functions, queue: &mut Vec<(Target, Value)>) {
        for published in functions.notifications.drain() {
            let target = if published.message.contains("EC2_INSTANCE_LAUNCHING") {
                Target::LaunchingHook
            } else {
                Target::TerminatingHook
            };
            let base = corpus::fresh_lifecycle_event(target);
            queue.push((target, corpus::with_message(&base, &published.message)));
            self.report.hand_overs += 1;
        }
    }

    fn pending_actions(&self) -> usize {
        let pending: Vec<&LifecycleActionRef> = self
            .actions
            .iter()
            .map(|(_, a)| a)
            .filter(|a| self.inner.is_pending(a))
            .collect();
        pending.len()
    }

    /// Late duplicates of the terminations, after everything completed: no second
    /// completion, no new cordon.
    pub(super) async fn deliver_late_duplicates(&mut self, functions: &Functions) {
        for (target, action) in &self.actions {
            if *target == Target::TerminatingHook {
                let _ = functions
                    .invoke(
                        *target,
                        lifecycle_notification(*target, action),
                        format!("soak-{}-late", self.seed),
                        Duration::from_secs(2),
                    )
                    .await;
                self.report.duplicates += 1;
                self.report.invocations += 1;
            }
        }
    }
}

/// One delivery; killed after `kill_after` if set (the future dropped wherever it is, as a
/// Lambda environment that dies: the event comes back).
async fn deliver(
    functions: &Functions,
    target: Target,
    event: Value,
    request_id: String,
    budget: Duration,
    kill_after: Option<Duration>,
) -> Delivered {
    let started = Instant::now();
    let work = functions.invoke(target, event.clone(), request_id, budget);
    let outcome = match kill_after {
        Some(after) => tokio::time::timeout(after, work).await.ok(),
        None => Some(work.await),
    };
    (target, event, outcome, started.elapsed(), budget)
}
