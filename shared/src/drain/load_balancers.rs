//! Waiting, once the node is empty, until no load balancer of the cluster routes to the
//! instance any more.
//!
//! The drain labels the node `node.kubernetes.io/exclude-from-external-load-balancers` when it
//! cordons it; the Kubernetes service controller and the AWS Load Balancer Controller then
//! deregister the instance from the cluster's instance-mode target groups and classic load
//! balancers, which let its connections drain for their deregistration delay (300 s by
//! default). Completing the lifecycle action before that cuts those connections; waiting a
//! fixed time after the node is empty waits too little behind a load balancer and for nothing
//! without one.
//!
//! So the drain finds the cluster's target groups (instance targets) and classic load
//! balancers by their cluster tags, asks each how it stands towards the instance, and waits
//! until none routes to it (target `unused`, classic `OutOfService`, or gone): no wait at all
//! when none does. Each one that does is waited for at most `SETTLE_SECONDS` (the time the
//! controllers are given to deregister the instance) plus its own deregistration delay,
//! counted from when the node was drained. What cannot be read (no grant, Elastic Load
//! Balancing failing) falls back to the fixed wait of `SETTLE_SECONDS` and says so.
//!
//! The checks of the load balancers still routing are paced to at most
//! [`CALLS_PER_SECOND`], so that a node behind a thousand target groups does not use up the
//! account's Elastic Load Balancing request rate.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use tokio::time::Instant;

use crate::aws::{AwsError, AwsErrorKind, InstanceRouting, LoadBalancerRef, LoadBalancers};

/// The most load balancer checks one drain makes per second while it waits.
pub const CALLS_PER_SECOND: u32 = 10;
/// The longest deregistration delay (and classic connection draining timeout) AWS allows.
pub const LONGEST_DEREGISTRATION_DELAY: Duration = Duration::from_secs(3600);
/// Checks in flight at once.
const CONCURRENCY: usize = 4;
/// How often the load balancers still routing are checked (shorter when the settle period
/// is short, so scaled-down tests poll at the same rate relative to it).
const POLL_INTERVAL: Duration = Duration::from_secs(5);
/// How long one round of checks may take before it counts as failed and is tried again.
const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// Who the drain asks, and about what.
#[derive(Clone, Copy)]
pub struct LoadBalancerTarget<'a> {
    pub client: &'a dyn LoadBalancers,
    pub cluster: &'a str,
    pub instance_id: &'a str,
}

/// One load balancer still routing to the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    pub routing: InstanceRouting,
    /// When the drain stops waiting for it.
    pub bound_at: Instant,
}

/// Where the wait stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BalancersState {
    /// Not read yet, or reading failed so far: waits until the fallback time.
    Unknown,
    /// Not asked (no client, turned off) or not readable: the fixed settle period only.
    Fixed,
    /// These still route to the instance.
    Routing(BTreeMap<LoadBalancerRef, Routing>),
    /// None routes to the instance.
    Deregistered,
}

/// One drain's wait for its instance to leave the load balancers.
pub struct LoadBalancerWait<'a> {
    target: Option<LoadBalancerTarget<'a>>,
    /// When the node was drained (the base of every bound).
    drained: Instant,
    /// The end of the settle period: the fallback, and the controllers' time to deregister.
    settled_at: Instant,
    settle: Duration,
    /// No bound goes past this (an instance notice's end).
    cut: Option<Instant>,
    poll: Duration,
    next_check: Instant,
    /// When the last round that answered started: the wait ends only after a round that
    /// started at the last bound or later, so what it reports then is what is true then.
    last_round: Option<Instant>,
    /// Whether a round was tried: the load balancers are asked at least once, however short
    /// the settle period (with none, the fallback would end the wait before the first ask).
    tried: bool,
    pub state: BalancersState,
    /// Load balancer checks made (for the log and the benchmark).
    pub calls: u32,
}

impl<'a> LoadBalancerWait<'a> {
    /// The wait of a node drained at `drained`, with settle period `settle` ending at
    /// `settled_at` (cut at an instance notice's end by the caller); `target` `None` waits out
    /// the settle period only.
    pub fn new(
        target: Option<LoadBalancerTarget<'a>>,
        drained: Instant,
        settle: Duration,
        settled_at: Instant,
    ) -> Self {
        let state = match target {
            Some(_) => BalancersState::Unknown,
            None => BalancersState::Fixed,
        };
        Self {
            target,
            drained,
            settled_at,
            settle,
            cut: None,
            poll: (settle / 12).clamp(Duration::from_millis(10), POLL_INTERVAL),
            next_check: Instant::now(),
            last_round: None,
            tried: false,
            state,
            calls: 0,
        }
    }

    /// Ends every wait for a load balancer at `at` at the latest (an instance that stops then).
    pub fn cut_at(&mut self, at: Instant) {
        self.cut = Some(at);
    }

    /// Whether the drain still waits for load balancers at `now`.
    pub fn waiting(&self, now: Instant) -> bool {
        match &self.state {
            BalancersState::Unknown => now < self.settled_at || !self.tried,
            BalancersState::Fixed => now < self.settled_at,
            BalancersState::Routing(left) => {
                let last_bound = left.values().map(|r| r.bound_at).max().unwrap_or(now);
                // Past the bound, one more round says what still routes (given up on when it
                // cannot be had).
                let checked_since = self.last_round.is_some_and(|at| at >= last_bound);
                now < last_bound || (!checked_since && now < last_bound + CHECK_TIMEOUT)
            }
            BalancersState::Deregistered => false,
        }
    }

    /// The latest bound of the load balancers still routing.
    fn last_bound(&self) -> Option<Instant> {
        match &self.state {
            BalancersState::Routing(left) => left.values().map(|r| r.bound_at).max(),
            _ => None,
        }
    }

    /// Whether some load balancer was found routing to the instance.
    pub fn routing(&self) -> bool {
        matches!(&self.state, BalancersState::Routing(left) if !left.is_empty())
    }

    /// When to wake next while the drain waits: the next check, or the end of the wait.
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        if !self.waiting(now) {
            return None;
        }
        let end = match &self.state {
            BalancersState::Routing(_) => self.last_bound(),
            _ => Some(self.settled_at),
        };
        let check =
            (!matches!(self.state, BalancersState::Fixed)).then_some(self.next_check.max(now));
        [check, end].into_iter().flatten().min()
    }

    /// The load balancers the last round found routing to the instance, with how.
    pub fn still_routing(&self) -> Vec<String> {
        match &self.state {
            BalancersState::Routing(left) => left
                .iter()
                .map(|(lb, r)| format!("{lb} ({})", describe(r.routing)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The load balancers still routing when the wait ended at their bound.
    pub fn left_at_bound(&self, now: Instant) -> Vec<String> {
        match &self.state {
            BalancersState::Routing(left) => left
                .iter()
                .filter(|(_, r)| now >= r.bound_at)
                .map(|(lb, r)| format!("{lb} ({})", describe(r.routing)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Reads the load balancers when a check is due, giving up on it at `deadline` at the
    /// latest; a failed check is logged and tried again at the next poll.
    pub async fn check_if_due(&mut self, node: &str, deadline: Instant) {
        let now = Instant::now();
        let Some(target) = self.target else { return };
        if self.state == BalancersState::Fixed
            || !self.waiting(now)
            || now < self.next_check
            || now >= deadline
        {
            return;
        }
        let give_up_at = deadline.min(now + CHECK_TIMEOUT);
        self.tried = true;
        let checked = tokio::time::timeout_at(give_up_at, self.check(target)).await;
        let next = match checked {
            Ok(Ok(next)) => {
                self.last_round = Some(now);
                next
            }
            Ok(Err(error)) if error.kind == AwsErrorKind::AccessDenied => {
                tracing::warn!(node, %error, settle_seconds = self.settle.as_secs_f64(), "cannot read the cluster's load balancers: waiting SETTLE_SECONDS instead (grant the elasticloadbalancing Describe calls)");
                BalancersState::Fixed
            }
            Ok(Err(error)) => {
                tracing::warn!(node, %error, "could not check the load balancers; trying again (SETTLE_SECONDS is the wait if they stay unreadable)");
                self.state.clone()
            }
            Err(_) => {
                tracing::warn!(
                    node,
                    timeout_seconds = CHECK_TIMEOUT.as_secs(),
                    "checking the load balancers took too long; trying again"
                );
                self.state.clone()
            }
        };
        self.log_change(node, &next);
        self.state = next;
        let paced = Instant::now() + self.pace();
        self.next_check = match self.last_bound() {
            // The round at the last bound comes on time however many remain.
            Some(bound) if bound > now => paced.min(bound),
            _ => paced,
        };
    }

    /// The time to the next round: the poll interval, longer when many remain.
    fn pace(&self) -> Duration {
        let remaining = match &self.state {
            BalancersState::Routing(left) => u32::try_from(left.len()).unwrap_or(u32::MAX),
            _ => 0,
        };
        self.poll
            .max(Duration::from_secs(1) * remaining / CALLS_PER_SECOND)
    }

    /// One round: the first finds the cluster's load balancers routing to the instance and
    /// their bounds; the next ones ask only those still routing.
    async fn check(&mut self, target: LoadBalancerTarget<'_>) -> Result<BalancersState, AwsError> {
        let (candidates, first) = match &self.state {
            BalancersState::Routing(left) => (left.keys().cloned().collect(), false),
            _ => {
                self.calls += 1;
                (
                    target.client.cluster_load_balancers(target.cluster).await?,
                    true,
                )
            }
        };
        let routed = self.ask_routing(target, candidates).await?;
        let mut left = BTreeMap::new();
        for (lb, routing) in routed {
            let bound_at = match &self.state {
                BalancersState::Routing(known) if !first => known.get(&lb).map(|r| r.bound_at),
                _ => None,
            };
            let bound_at = match bound_at {
                Some(bound_at) => bound_at,
                None => self.bound_of(target, &lb).await?,
            };
            left.insert(lb, Routing { routing, bound_at });
        }
        Ok(if left.is_empty() {
            BalancersState::Deregistered
        } else {
            BalancersState::Routing(left)
        })
    }

    /// Those of `candidates` that still route to the instance, with how.
    async fn ask_routing(
        &mut self,
        target: LoadBalancerTarget<'_>,
        candidates: Vec<LoadBalancerRef>,
    ) -> Result<Vec<(LoadBalancerRef, InstanceRouting)>, AwsError> {
        self.calls += u32::try_from(candidates.len()).unwrap_or(u32::MAX);
        let answers: Vec<_> = futures::stream::iter(candidates)
            .map(|lb| async move {
                let routing = target.client.routing(&lb, target.instance_id).await?;
                Ok::<_, AwsError>((lb, routing))
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect()
            .await?;
        Ok(answers
            .into_iter()
            .filter(|(_, routing)| *routing != InstanceRouting::NotRouted)
            .collect())
    }

    /// The end of the wait for `lb`: the settle period plus its deregistration delay.
    async fn bound_of(
        &mut self,
        target: LoadBalancerTarget<'_>,
        lb: &LoadBalancerRef,
    ) -> Result<Instant, AwsError> {
        self.calls += 1;
        let delay = target.client.deregistration_delay(lb).await?;
        let bound = self.drained + self.settle + delay.min(LONGEST_DEREGISTRATION_DELAY);
        Ok(self.cut.map_or(bound, |cut| bound.min(cut)))
    }

    fn log_change(&self, node: &str, next: &BalancersState) {
        if *next == self.state {
            return;
        }
        match next {
            BalancersState::Routing(left) => {
                let names: Vec<String> = left
                    .iter()
                    .map(|(lb, r)| format!("{lb} ({})", describe(r.routing)))
                    .collect();
                if !matches!(self.state, BalancersState::Routing(_)) {
                    tracing::info!(step = "awaiting_load_balancers", node, load_balancers = ?names, "waiting for the load balancers that route to the instance to deregister it");
                }
            }
            BalancersState::Deregistered => {
                tracing::info!(
                    step = "load_balancers_deregistered",
                    node,
                    calls = self.calls,
                    "no load balancer of the cluster routes to the instance"
                );
            }
            BalancersState::Unknown | BalancersState::Fixed => {}
        }
    }
}

fn describe(routing: InstanceRouting) -> &'static str {
    match routing {
        InstanceRouting::Registered => "registered",
        InstanceRouting::Draining => "draining",
        InstanceRouting::NotRouted => "not routed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::in_memory::InMemoryLoadBalancers;

    const INSTANCE: &str = "i-0123456789abcdef0";

    fn target_group(name: &str) -> LoadBalancerRef {
        LoadBalancerRef::TargetGroup(format!(
            "arn:aws:elasticloadbalancing:eu-west-1:111122223333:targetgroup/{name}/0123456789abcdef"
        ))
    }

    fn wait(client: &InMemoryLoadBalancers, settle: Duration) -> LoadBalancerWait<'_> {
        let now = Instant::now();
        let target = LoadBalancerTarget {
            client,
            cluster: "prod",
            instance_id: INSTANCE,
        };
        LoadBalancerWait::new(Some(target), now, settle, now + settle)
    }

    #[tokio::test]
    async fn no_load_balancer_routing_to_the_instance_means_no_wait_at_all() {
        let client = InMemoryLoadBalancers::default();
        client.add(target_group("other-nodes"), Duration::from_secs(300));
        let mut wait = wait(&client, Duration::from_secs(60));
        assert!(wait.waiting(Instant::now()), "unknown until read");
        wait.check_if_due("node", Instant::now() + Duration::from_secs(600))
            .await;
        assert_eq!(wait.state, BalancersState::Deregistered);
        assert!(!wait.waiting(Instant::now()));
        assert_eq!(client.calls(), ["ClusterLoadBalancers", "Routing"]);
    }

    #[tokio::test]
    async fn a_draining_target_is_waited_for_until_unused_and_bounded_by_settle_plus_its_delay() {
        let client = InMemoryLoadBalancers::default();
        let lb = target_group("web");
        client.add(lb.clone(), Duration::from_millis(300));
        client.set_routing(&lb, INSTANCE, InstanceRouting::Draining);
        let settle = Duration::from_millis(600);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut wait = wait(&client, settle);
        wait.check_if_due("node", deadline).await;
        assert!(wait.routing());
        // Paced: one load balancer is asked at most CALLS_PER_SECOND times a second.
        tokio::time::sleep(Duration::from_millis(110)).await;
        wait.check_if_due("node", deadline).await;
        assert!(wait.routing(), "still draining");
        client.set_routing(&lb, INSTANCE, InstanceRouting::NotRouted);
        tokio::time::sleep(Duration::from_millis(110)).await;
        wait.check_if_due("node", deadline).await;
        assert_eq!(wait.state, BalancersState::Deregistered);
        assert!(!wait.waiting(Instant::now()));

        // One that never lets go: waited for 600 ms settle + 300 ms delay from the drain's
        // end, then asked once more, and named.
        client.set_routing(&lb, INSTANCE, InstanceRouting::Registered);
        let before = Instant::now();
        let mut stuck = self::wait(&client, settle);
        let after = Instant::now();
        stuck.check_if_due("node", deadline).await;
        assert!(stuck.waiting(before + Duration::from_millis(899)));
        let bound = stuck.next_wake(Instant::now()).expect("waiting");
        assert!(bound <= after + Duration::from_millis(900));
        let calls = client.calls().len();
        tokio::time::sleep_until(after + Duration::from_millis(900)).await;
        assert!(stuck.waiting(Instant::now()), "not before one more round");
        stuck.check_if_due("node", deadline).await;
        assert_eq!(client.calls().len(), calls + 1, "the round at the bound");
        assert!(!stuck.waiting(Instant::now()));
        let left = stuck.left_at_bound(Instant::now());
        assert_eq!(left.len(), 1);
        assert!(left[0].contains("targetgroup/web/") && left[0].contains("registered"));
        assert!(stuck.left_at_bound(before).is_empty());
    }

    #[tokio::test]
    async fn without_a_settle_period_the_load_balancers_are_still_asked_and_waited_for() {
        let client = InMemoryLoadBalancers::default();
        let lb = target_group("web");
        client.add(lb.clone(), Duration::from_secs(300));
        client.set_routing(&lb, INSTANCE, InstanceRouting::Draining);
        let mut wait = wait(&client, Duration::ZERO);
        assert!(wait.waiting(Instant::now()), "asked once at least");
        wait.check_if_due("node", Instant::now() + Duration::from_secs(60))
            .await;
        assert!(wait.routing());
        assert!(wait.waiting(Instant::now() + Duration::from_secs(299)));
        // Unreadable with no settle period: one try, then no wait.
        client
            .faults
            .fail("ClusterLoadBalancers", AwsErrorKind::Transient, 1);
        let mut failing = self::wait(&client, Duration::ZERO);
        failing
            .check_if_due("node", Instant::now() + Duration::from_secs(60))
            .await;
        assert_eq!(failing.state, BalancersState::Unknown);
        assert!(!failing.waiting(Instant::now()));
    }

    #[tokio::test]
    async fn unreadable_load_balancers_fall_back_to_the_settle_period() {
        let client = InMemoryLoadBalancers::default();
        client.add(target_group("web"), Duration::from_secs(300));
        client
            .faults
            .fail("ClusterLoadBalancers", AwsErrorKind::Transient, 1);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut wait = wait(&client, Duration::from_secs(60));
        wait.check_if_due("node", deadline).await;
        assert_eq!(wait.state, BalancersState::Unknown);
        assert!(wait.waiting(Instant::now() + Duration::from_secs(59)));
        assert!(!wait.waiting(Instant::now() + Duration::from_secs(61)));

        client
            .faults
            .fail("ClusterLoadBalancers", AwsErrorKind::AccessDenied, 1);
        let mut denied = self::wait(&client, Duration::from_millis(1200));
        denied.check_if_due("node", deadline).await;
        assert_eq!(denied.state, BalancersState::Fixed);
        let calls = client.calls().len();
        tokio::time::sleep(Duration::from_millis(150)).await;
        denied.check_if_due("node", deadline).await;
        assert_eq!(client.calls().len(), calls, "not asked again");
        assert!(
            denied.waiting(Instant::now()),
            "the settle period still runs"
        );
    }

    #[tokio::test]
    async fn many_load_balancers_are_checked_at_a_bounded_rate() {
        let client = InMemoryLoadBalancers::default();
        for i in 0..1000 {
            let lb = target_group(&format!("tg-{i}"));
            client.add(lb.clone(), Duration::from_secs(300));
            client.set_routing(&lb, INSTANCE, InstanceRouting::Draining);
        }
        let mut wait = wait(&client, Duration::from_secs(60));
        wait.check_if_due("node", Instant::now() + Duration::from_secs(3600))
            .await;
        assert_eq!(wait.calls, 1 + 1000 + 1000);
        // 1,000 still routing: the next round comes after 100 s, not after the 5 s poll.
        let next = wait.next_wake(Instant::now()).expect("waiting");
        assert!(next > Instant::now() + Duration::from_secs(99));
        assert!(next <= Instant::now() + Duration::from_secs(100));
    }
}
