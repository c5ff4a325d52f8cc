//! Retrying evictions a PodDisruptionBudget refused when the budget frees up, not on a timer.
//!
//! A budget with `maxUnavailable: 1` lets one pod go per wave: the next eviction can only
//! succeed once the previous pod's replacement is Ready, which the disruption controller
//! publishes as a new `status.disruptionsAllowed`. Blind exponential backoff either hammers
//! the API server with refusals or, after a few of them, sleeps far past that moment, so each
//! wave waits for the slowest backoff instead of the replacement.
//!
//! So the 429's `DisruptionBudget` cause names the budget, and the drain watches the budgets
//! of that namespace (one watch per namespace, `list` + `watch` on poddisruptionbudgets).
//! Each status the watch delivers (a new `resourceVersion`) allows `disruptionsAllowed` more
//! evictions — 0 while `observedGeneration` lags `metadata.generation`, which the eviction
//! handler refuses anyway — and that many of the budget's blocked pods are retried at once,
//! in the order they were refused (the drain offers pods in its tier order). A pod refused
//! again waits for the next status: evictions by another drain, or a status the watch
//! had not delivered yet, use the allowance up, and either shows up as a new status.
//!
//! Without a way to watch (RBAC without `watch poddisruptionbudgets`, or a 429 that names no
//! budget), refused pods keep the timer backoff; the missing permission is logged once.
//! Throttling (429 without a budget cause) and 5xx never come here: they keep the jittered
//! backoff and `Retry-After` ([`super::backoff`]).

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::time::Duration;

use futures::stream::SelectAll;
use futures::{Stream, StreamExt};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::time::Instant;

use super::backoff::Backoff;
use super::eviction::EvictionOutcome;
use super::eviction_queue::EvictionQueue;
use super::plan::PodKey;

/// How long a pod waiting on a watched budget waits at most before it is retried anyway:
/// a safety net should a status update never arrive (the timer backoff's ceiling when that
/// is longer).
pub(crate) const WATCHED_RETRY_SAFETY_NET: Duration = Duration::from_secs(30);

type BudgetEvents = Pin<
    Box<
        dyn Stream<
                Item = (
                    String,
                    Result<watcher::Event<PodDisruptionBudget>, watcher::Error>,
                ),
            > + Send,
    >,
>;

/// A budget: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BudgetKey {
    pub namespace: String,
    pub name: String,
}

/// What the watch knows of one budget, and who waits for it.
#[derive(Debug, Default)]
struct BudgetState {
    /// The `resourceVersion` of the status `allowed` comes from; `None` until seen.
    version: Option<String>,
    /// Evictions the last status allows (0 while the status lags the spec).
    allowed: u32,
    /// Pods retried against that status so far.
    released: u32,
    /// Pods refused by this budget, oldest refusal first.
    waiting: Vec<PodKey>,
}

impl BudgetState {
    /// Takes the pods the current status still allows, oldest first.
    fn take_allowed(&mut self) -> Vec<PodKey> {
        let free = self.allowed.saturating_sub(self.released) as usize;
        let count = free.min(self.waiting.len());
        self.released += count as u32;
        self.waiting.drain(..count).collect()
    }

    /// Applies a status; `false` when it is the one already known.
    fn observe(&mut self, budget: &PodDisruptionBudget) -> bool {
        let version = budget.metadata.resource_version.clone();
        if version.is_some() && version == self.version {
            return false;
        }
        self.version = version;
        self.released = 0;
        self.allowed = allowed_by(budget);
        true
    }
}

/// Evictions the budget's status allows: `disruptionsAllowed`, or 0 while the disruption
/// controller has not observed the current spec (the eviction handler refuses then).
pub(crate) fn allowed_by(budget: &PodDisruptionBudget) -> u32 {
    let Some(status) = &budget.status else {
        return 0;
    };
    let observed = status.observed_generation.unwrap_or(0);
    if budget.metadata.generation.is_some_and(|g| observed < g) {
        return 0;
    }
    u32::try_from(status.disruptions_allowed.max(0)).unwrap_or(0)
}

/// What became of a refused pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Its budgets are watched: retry at the given time (now when the last status still
    /// allows an eviction, else at the safety net).
    OnBudget(Instant),
    /// Not watched: the timer backoff decides.
    OnTimer,
}

/// The budgets that refused this drain's evictions, watched per namespace.
pub struct BudgetWatch {
    client: kube::Client,
    /// `false` once a watch was refused (RBAC): every refusal goes to the timer.
    possible: bool,
    streams: SelectAll<BudgetEvents>,
    namespaces: HashSet<String>,
    /// Namespaces whose watch failed and has not listed again since: there the timer paces
    /// refusals, so a failing watch costs nothing over the timer.
    failing: HashSet<String>,
    budgets: HashMap<BudgetKey, BudgetState>,
    safety_net: Duration,
    /// The timer that paces refusals when the watch cannot.
    backoff: Backoff,
}

impl BudgetWatch {
    /// `backoff`: the timer that paces refusals the watch cannot; a watched pod is retried
    /// at least every `max(backoff.max, WATCHED_RETRY_SAFETY_NET)` as a safety net.
    pub fn new(client: kube::Client, backoff: Backoff) -> Self {
        Self {
            client,
            possible: true,
            streams: SelectAll::new(),
            namespaces: HashSet::new(),
            failing: HashSet::new(),
            budgets: HashMap::new(),
            safety_net: backoff.max.max(WATCHED_RETRY_SAFETY_NET),
            backoff,
        }
    }

    /// Whether refusals are still paced by the watch (false after RBAC refused it).
    /// The evictions the last watched status of `budget` allows; `None` when not watched.
    pub fn allowed(&self, budget: &BudgetKey) -> Option<u32> {
        self.budgets
            .get(budget)
            .filter(|state| state.version.is_some())
            .map(|state| state.allowed)
    }

    pub fn is_watching(&self) -> bool {
        self.possible
    }

    /// After `queue` recorded a refusal of `pod`: a refusal by named budgets waits for
    /// them (the queue's retry time is moved accordingly); anything else keeps the timer.
    pub fn after_refusal(
        &mut self,
        queue: &mut EvictionQueue,
        pod: &PodKey,
        outcome: &EvictionOutcome,
        now: Instant,
    ) -> Waiting {
        let EvictionOutcome::BlockedByBudget { budgets, .. } = outcome else {
            return Waiting::OnTimer;
        };
        let waiting = self.blocked(pod, budgets, now);
        if let Waiting::OnBudget(at) = waiting {
            queue.retry_at(pod, at);
        }
        waiting
    }

    /// Registers `pod` as refused by `budgets` (names in the pod's namespace).
    pub fn blocked(&mut self, pod: &PodKey, budgets: &[String], now: Instant) -> Waiting {
        if !self.possible || budgets.is_empty() {
            return Waiting::OnTimer;
        }
        self.watch_namespace(&pod.namespace);
        if self.failing.contains(&pod.namespace) {
            return Waiting::OnTimer;
        }
        let mut retry_now = false;
        for name in budgets {
            let key = BudgetKey {
                namespace: pod.namespace.clone(),
                name: name.clone(),
            };
            let state = self.budgets.entry(key).or_default();
            // The status already seen may still allow one: it came after the refusal was
            // decided. (Pods waiting before it were released when it came, so none is
            // passed over.)
            if !retry_now && state.version.is_some() && state.allowed > state.released {
                state.released += 1;
                retry_now = true;
            } else if !state.waiting.contains(pod) {
                state.waiting.push(pod.clone());
            }
        }
        if retry_now {
            self.unwait(pod);
            return Waiting::OnBudget(now);
        }
        Waiting::OnBudget(now + self.safety_net)
    }

    /// Forgets waiting pods that are no longer on the node.
    pub fn retain_waiting(&mut self, present: impl Fn(&PodKey) -> bool) {
        for state in self.budgets.values_mut() {
            state.waiting.retain(&present);
        }
    }

    /// The next pods to retry, and when: now for pods a budget allows; on the timer's first
    /// step for pods whose watch failed or turned out impossible. Never resolves while
    /// nothing is watched; cancel-safe (state lives in `self`), so it sits in the drain's
    /// `select!`.
    pub async fn released(&mut self) -> Vec<(PodKey, Instant)> {
        loop {
            let Some((namespace, event)) = self.streams.next().await else {
                return std::future::pending().await;
            };
            let was_failing = !self.possible || self.failing.contains(&namespace);
            let released = self.apply(&namespace, event);
            let now = Instant::now();
            let failed = !self.possible || self.failing.contains(&namespace);
            let at = if failed && !was_failing {
                now + self.backoff.delay(0, None)
            } else {
                now
            };
            if !released.is_empty() {
                return released.into_iter().map(|pod| (pod, at)).collect();
            }
        }
    }

    fn watch_namespace(&mut self, namespace: &str) {
        if !self.namespaces.insert(namespace.to_owned()) {
            return;
        }
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
        let namespace = namespace.to_owned();
        let events = watcher(api, watcher::Config::default())
            .default_backoff()
            .map(move |event| (namespace.clone(), event))
            .boxed();
        self.streams.push(events);
    }

    fn apply(
        &mut self,
        namespace: &str,
        event: Result<watcher::Event<PodDisruptionBudget>, watcher::Error>,
    ) -> Vec<PodKey> {
        let key = |budget: &PodDisruptionBudget| BudgetKey {
            namespace: namespace.to_owned(),
            name: budget.metadata.name.clone().unwrap_or_default(),
        };
        match event {
            Ok(watcher::Event::Apply(budget) | watcher::Event::InitApply(budget)) => {
                let state = self.budgets.entry(key(&budget)).or_default();
                if state.observe(&budget) {
                    let released = state.take_allowed();
                    for pod in &released {
                        self.unwait(pod);
                    }
                    released
                } else {
                    Vec::new()
                }
            }
            Ok(watcher::Event::Delete(budget)) => {
                // Gone: nothing of this budget holds its pods any more.
                let released = self
                    .budgets
                    .remove(&key(&budget))
                    .map(|s| s.waiting)
                    .unwrap_or_default();
                for pod in &released {
                    self.unwait(pod);
                }
                released
            }
            Ok(watcher::Event::Init) => Vec::new(),
            Ok(watcher::Event::InitDone) => {
                self.failing.remove(namespace);
                Vec::new()
            }
            Err(error) if forbidden(&error) => {
                tracing::warn!(%error, "cannot watch PodDisruptionBudgets (RBAC needs list and watch on policy/poddisruptionbudgets): evictions refused by a budget are retried on the timer backoff instead of when the budget allows");
                self.possible = false;
                self.streams = SelectAll::new();
                self.namespaces.clear();
                let released: Vec<PodKey> = self
                    .budgets
                    .drain()
                    .flat_map(|(_, s)| s.waiting)
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
                released
            }
            Err(error) => {
                // The watcher's backoff retries (and lists again); until then its budgets'
                // pods go back to the timer.
                tracing::debug!(%error, "watch of PodDisruptionBudgets failed; retrying");
                self.failing.insert(namespace.to_owned());
                let mut released = Vec::new();
                for (key, state) in &mut self.budgets {
                    if key.namespace == namespace {
                        released.append(&mut state.waiting);
                    }
                }
                released.sort();
                released.dedup();
                released
            }
        }
    }

    /// Removes `pod` from every budget's waiting list (it is being retried).
    fn unwait(&mut self, pod: &PodKey) {
        for state in self.budgets.values_mut() {
            state.waiting.retain(|p| p != pod);
        }
    }
}

fn forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 403,
        watcher::Error::WatchError(status) => status.code == 403,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn budget(version: &str, allowed: i32, generation: i64, observed: i64) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": version, "generation": generation},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 3, "desiredHealthy": 2,
                       "expectedPods": 3, "observedGeneration": observed},
        }))
        .unwrap()
    }

    fn pod(name: &str) -> PodKey {
        PodKey {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn state_with(waiting: &[&str]) -> BudgetState {
        BudgetState {
            waiting: waiting.iter().map(|n| pod(n)).collect(),
            ..BudgetState::default()
        }
    }

    #[test]
    fn a_status_releases_at_most_what_it_allows_oldest_first() {
        let mut state = state_with(&["a", "b", "c"]);
        assert!(state.observe(&budget("1", 0, 1, 1)));
        assert!(state.take_allowed().is_empty(), "nothing allowed");
        assert!(state.observe(&budget("2", 2, 1, 1)));
        assert_eq!(state.take_allowed(), [pod("a"), pod("b")]);
        assert!(state.take_allowed().is_empty(), "the status is spent");
        assert!(
            !state.observe(&budget("2", 2, 1, 1)),
            "the same status again allows nothing more"
        );
        assert!(state.take_allowed().is_empty());
        assert!(state.observe(&budget("3", 1, 1, 1)));
        assert_eq!(state.take_allowed(), [pod("c")]);
    }

    #[test]
    fn a_status_behind_the_spec_allows_nothing() {
        assert_eq!(allowed_by(&budget("1", 3, 2, 1)), 0);
        assert_eq!(allowed_by(&budget("1", 3, 2, 2)), 3);
        assert_eq!(allowed_by(&budget("1", -1, 1, 1)), 0);
        let mut no_status = budget("1", 1, 1, 1);
        no_status.status = None;
        assert_eq!(allowed_by(&no_status), 0);
    }

    #[test]
    fn watch_errors_are_told_apart() {
        let status = |code| {
            Box::new(kube::core::Status {
                code,
                ..kube::core::Status::default()
            })
        };
        assert!(forbidden(&watcher::Error::WatchStartFailed(
            kube::Error::Api(status(403))
        )));
        assert!(forbidden(&watcher::Error::WatchError(status(403))));
        assert!(!forbidden(&watcher::Error::WatchError(status(410))));
        assert!(!forbidden(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(500))
        )));
    }
}
