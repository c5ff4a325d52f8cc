//! One invocation's share of a drain: from the claimed checkpoint until the node is empty and
//! settled, the drain deadline passes, or the invocation has to hand over.
//!
//! Everything the loop waits for sits in one `select!`: the watch of the node's pods, the
//! eviction answers, the next retry, the lease renewal, the drain deadline and the hand-over
//! time. Each wake-up recomputes the [`DrainPlan`] from the watched pods and offers the
//! current tier to the [`EvictionQueue`], so the loop holds no state a restart could lose
//! beyond what the checkpoint and the cluster already say.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::time::{Instant, sleep_until};

use super::backoff::Backoff;
use super::budget_watch::{BudgetWatch, Waiting};
use super::budgets;
use super::checkpoint::DrainCheckpoint;
use super::events::{DrainEvents, reason};
use super::eviction::{self, EvictionOutcome};
use super::eviction_queue::{EvictionFuture, EvictionQueue, Recorded};
use super::lease::{self, LeaseHolder, Update};
use super::node_pods::NodePods;
use super::plan::{DrainPlan, PlanContext, PodKey};
use crate::lifecycle::budget::instant_at;
use crate::retry::backoff_delay;

/// How long after the drain deadline the session still waits for a first list of the node's
/// pods before it reports the drain failed with the list's error: a resumed invocation must
/// report the pods that are there, but a list that never succeeds (RBAC without `list pods`,
/// an API server down) must not hold the action forever.
const UNLISTED_PODS_GRACE: Duration = Duration::from_secs(5);

/// How a drain session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The node is empty and the settle period is over: complete with CONTINUE.
    Settled,
    /// The drain deadline passed with pods left (eviction kept being refused).
    DeadlinePassed(Vec<StuckPod>),
    /// The drain deadline passed and the node's pods were never listed (the list or watch
    /// kept failing): the cause, for the PodEvictionFailure report.
    PodsUnknown(String),
    /// The invocation is nearly out of time: hand the drain to a fresh one.
    HandOver,
    /// Another invocation took the drain (our lease had expired): stop quietly.
    LeaseLost,
    /// The node disappeared: the instance is gone; complete.
    NodeGone,
}

/// A pod still on the node at the deadline, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckPod {
    pub pod: PodKey,
    /// Budgets that select the pod (from the namespace's budgets or the refusal).
    pub budgets: Vec<String>,
    pub why: StuckReason,
}

/// Why a pod was still there at the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StuckReason {
    /// Its eviction was refused; the last answer.
    Refused(EvictionOutcome),
    /// It was being deleted and did not finish.
    Terminating,
    /// Its eviction request was still unanswered (a client that retries 429s itself hides
    /// the refusals until it gives up).
    InFlight,
    /// Not tried: it waited for an earlier tier (critical pods wait for the ordinary ones).
    NotReached,
}

impl std::fmt::Display for StuckPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.pod)?;
        match (&self.why, self.budgets.as_slice()) {
            (StuckReason::Terminating, _) => write!(f, " (still terminating)"),
            (StuckReason::NotReached, _) => {
                write!(f, " (not evicted yet: waits for the pods before it)")
            }
            (StuckReason::InFlight, []) => write!(f, " (eviction unanswered)"),
            (StuckReason::InFlight, budgets) => write!(
                f,
                " (eviction unanswered; PodDisruptionBudget {})",
                budgets.join(", ")
            ),
            (StuckReason::Refused(_), [one]) => write!(f, " (PodDisruptionBudget {one})"),
            (StuckReason::Refused(_), [_, _, ..]) => write!(
                f,
                " (PodDisruptionBudgets {}: more than one selects it, eviction cannot work)",
                self.budgets.join(", ")
            ),
            (StuckReason::Refused(refusal), []) => write!(f, " ({})", refusal.label()),
        }
    }
}

/// Counters for metrics and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub pods_evicted: u32,
    pub eviction_retries: u32,
}

/// The knobs a session needs (from [`crate::lifecycle::settings::DrainSettings`]).
#[derive(Debug, Clone)]
pub struct SessionSettings {
    pub settle: Duration,
    pub eviction_concurrency: usize,
    pub backoff: Backoff,
    pub grace_period_seconds: Option<i64>,
    /// `STUCK_POD_SECONDS`: see [`PlanContext::stuck_after`].
    pub stuck_pod_after: Duration,
}

/// What the eviction loop ([`DrainSession::evict_all`]) keeps between wake-ups.
struct EvictionRound {
    /// The watch of the node's pods.
    pods: NodePods,
    budget_watch: BudgetWatch,
    queue: EvictionQueue,
    deadline_at: Instant,
    /// When a drain whose pods were never listed gives up (see [`UNLISTED_PODS_GRACE`]).
    unlisted_deadline_at: Instant,
    renew_at: Instant,
    /// Pods already reported as left on the node (tolerating the cordon).
    reported_latecomers: BTreeSet<PodKey>,
    /// Pods already reported as selected by more than one budget.
    reported_multiple: BTreeSet<PodKey>,
    /// The plan of the pods as of a generation of the watch; `None` to plan again.
    planned: Option<(u64, DrainPlan)>,
}

impl EvictionRound {
    fn start(session: &mut DrainSession<'_>) -> Self {
        let client = session.client.clone();
        let pods = match session.prefetched_pods.take() {
            Some(pods) => pods,
            None => NodePods::watch(&client, &session.node_name),
        };
        let settings = session.settings;
        let deadline_at = instant_at(session.checkpoint.deadline);
        Self {
            pods,
            budget_watch: BudgetWatch::new(client, settings.backoff),
            queue: EvictionQueue::new(
                settings.backoff,
                settings.eviction_concurrency,
                settings.grace_period_seconds,
            ),
            deadline_at,
            unlisted_deadline_at: deadline_at.max(Instant::now()) + UNLISTED_PODS_GRACE,
            renew_at: Instant::now() + session.renew_interval(),
            reported_latecomers: BTreeSet::new(),
            reported_multiple: BTreeSet::new(),
            planned: None,
        }
    }
}

/// Whether planning again found the node drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replanned {
    Drained,
    Evicting,
}

/// One invocation working on one node's drain.
pub struct DrainSession<'a> {
    pub client: &'a kube::Client,
    pub node_name: String,
    pub node_uid: Option<String>,
    pub holder: &'a LeaseHolder,
    pub settings: &'a SessionSettings,
    pub events: &'a DrainEvents,
    pub checkpoint: DrainCheckpoint,
    /// The node as this invocation last wrote it: checkpoint writes go against its
    /// `resourceVersion` without reading first (see [`lease::update`]).
    pub last_written: Option<Node>,
    pub stats: SessionStats,
    /// Since when the node is not Ready, as last seen (kept when `last_written` is unknown).
    pub node_not_ready_since: Option<Timestamp>,
    /// Stuck deletions already reported (one Event per pod).
    pub reported_stuck: BTreeSet<PodKey>,
    /// Lease renewals that failed in a row: the next is tried sooner, with jitter.
    pub renew_failures: u32,
    /// The UIDs of this invocation's first complete list of the node's pods (see
    /// [`PlanContext::first_listed`]).
    pub first_listed: Option<std::sync::Arc<BTreeSet<String>>>,
    /// The watch of the node's pods when it was started before the session (concurrently
    /// with the claim); the session starts its own otherwise.
    pub prefetched_pods: Option<NodePods>,
}

impl DrainSession<'_> {
    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Runs until the drain is done, its deadline passes or `hand_over_at` comes.
    ///
    /// After the settle period the node's pods are listed once more before the session
    /// reports it settled: a pod bound meanwhile by a scheduler whose cache still saw the
    /// node schedulable would otherwise die with the instance. Such pods are evicted like
    /// the others (settling again is not needed: the node was out of load balancers).
    pub async fn run(&mut self, hand_over_at: Instant) -> Result<SessionEnd, kube::Error> {
        let mut late_pods = false;
        loop {
            if (self.checkpoint.drained_at.is_none() || late_pods)
                && let Some(end) = self.evict_all(hand_over_at).await?
            {
                return Ok(end);
            }
            if self.checkpoint.drained_at.is_none() {
                // The drained time is what a resumed invocation counts the settle period
                // from; without a settle period there is nothing to resume, so no write on
                // the way to the completion (which records it).
                if !self.settings.settle.is_zero()
                    && let Some(end) = self.mark_drained().await?
                {
                    return Ok(end);
                }
                tracing::info!(step = "drained", node = %self.node_name, pods_evicted = self.stats.pods_evicted, "node drained");
                self.events.normal(
                    &self.node_reference(),
                    reason::DRAINED,
                    format!(
                        "All pods that had to leave node {} are gone ({} evicted by this invocation)",
                        self.node_name, self.stats.pods_evicted
                    ),
                );
            }
            match self.settle(hand_over_at).await? {
                SessionEnd::Settled => {}
                end => return Ok(end),
            }
            let left = self.pods_to_evict_now().await?;
            if left.is_empty() {
                return Ok(SessionEnd::Settled);
            }
            tracing::warn!(step = "late_pods", node = %self.node_name, pods = ?left.iter().map(ToString::to_string).collect::<Vec<_>>(), "pods were bound to the node after it was drained: evicting them before completing");
            late_pods = true;
        }
    }

    /// The pods on the node that still have to go, from one list (the re-check before
    /// completing).
    async fn pods_to_evict_now(&mut self) -> Result<Vec<PodKey>, kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::all(self.client.clone());
        let params =
            kube::api::ListParams::default().fields(&format!("spec.nodeName={}", self.node_name));
        let pods = api.list(&params).await?;
        let plan = DrainPlan::in_context(&pods.items, &self.plan_context());
        Ok(plan.remaining().cloned().collect())
    }

    /// What the plan needs besides the pods, as of now.
    fn plan_context(&mut self) -> PlanContext {
        if let Some(node) = &self.last_written {
            self.node_not_ready_since = not_ready_since(node);
        }
        PlanContext {
            now: Some(Timestamp::now()),
            cordoned_at: Some(self.checkpoint.started_at),
            not_ready_since: self.node_not_ready_since,
            first_listed: self.first_listed.clone(),
            stuck_after: self.settings.stuck_pod_after,
        }
    }

    /// Reports the stuck deletions of `plan` not reported yet: a log line and a Warning Event
    /// on the node naming them.
    fn report_stuck(&mut self, plan: &DrainPlan) {
        let new: Vec<PodKey> = plan
            .stuck()
            .filter(|k| !self.reported_stuck.contains(*k))
            .cloned()
            .collect();
        if new.is_empty() {
            return;
        }
        let names: Vec<String> = new.iter().map(ToString::to_string).collect();
        let why = match self.node_not_ready_since {
            Some(since) => format!("node not Ready since {since}"),
            None => "their deletion is overdue".to_owned(),
        };
        let note = format!(
            "No longer waiting for {} pod(s) whose deletion is stuck ({why}; STUCK_POD_SECONDS {}): {}. The drain goes on; they go with the instance.",
            new.len(),
            self.settings.stuck_pod_after.as_secs_f64(),
            names.join(", ")
        );
        tracing::warn!(step = "stuck_pods", node = %self.node_name, pods = ?names, "{note}");
        self.events
            .warning(&self.node_reference(), reason::POD_DELETION_STUCK, note);
        self.reported_stuck.extend(new);
    }

    /// Records that the node is drained (also after forced deletion), so the settle period
    /// starts now and a resumed invocation counts it from here.
    pub async fn mark_drained(&mut self) -> Result<Option<SessionEnd>, kube::Error> {
        let now = Timestamp::now();
        self.update(|c, _| {
            let mut next = c.clone();
            next.drained_at.get_or_insert(now);
            next
        })
        .await
    }

    /// Waits out the settle period, renewing the lease, unless the invocation ends first.
    pub async fn settle(&mut self, hand_over_at: Instant) -> Result<SessionEnd, kube::Error> {
        let drained_at = self.checkpoint.drained_at.unwrap_or_else(Timestamp::now);
        let settled_at = instant_at(
            drained_at
                .checked_add(self.settings.settle)
                .unwrap_or(Timestamp::MAX),
        );
        if Instant::now() < settled_at {
            tracing::info!(step = "settling", node = %self.node_name, settle_seconds = self.settings.settle.as_secs_f64(), "waiting for load balancers to let go of the node");
        }
        loop {
            let now = Instant::now();
            if now >= settled_at {
                return Ok(SessionEnd::Settled);
            }
            if now >= hand_over_at {
                return Ok(SessionEnd::HandOver);
            }
            let renew_at = now + self.renew_interval();
            let wake = settled_at.min(hand_over_at).min(renew_at);
            sleep_until(wake).await;
            if wake == renew_at
                && let Some(end) = self.renew().await
            {
                return Ok(end);
            }
        }
    }

    /// Evicts until the node is empty (`None`) or the session has to end (`Some`).
    async fn evict_all(
        &mut self,
        hand_over_at: Instant,
    ) -> Result<Option<SessionEnd>, kube::Error> {
        let client = self.client.clone();
        let mut round = EvictionRound::start(self);
        let evict = |key: PodKey, grace: Option<i64>| -> EvictionFuture {
            let client = client.clone();
            Box::pin(async move {
                let outcome = eviction::evict(&client, &key, grace).await;
                (key, outcome)
            })
        };
        loop {
            if round.pods.is_synced() {
                if self.replan(&mut round) == Replanned::Drained {
                    return Ok(None);
                }
                if let Some((_, plan)) = &round.planned {
                    round
                        .queue
                        .offer(plan.to_evict_now(), Instant::now(), evict);
                }
            }
            if let Some(end) = self.next_wake_up(&mut round, hand_over_at).await {
                return Ok(Some(end));
            }
        }
    }

    /// Plans the watched pods again when they changed since the last plan (an eviction
    /// answer alone only frees a slot), and reports what the new plan shows.
    fn replan(&mut self, round: &mut EvictionRound) -> Replanned {
        let pods = &round.pods;
        let generation = pods.generation();
        if round
            .planned
            .as_ref()
            .is_some_and(|(seen, _)| *seen == generation)
        {
            return Replanned::Evicting;
        }
        if self.first_listed.is_none() {
            let uids = pods.pods().filter_map(|p| p.metadata.uid.clone()).collect();
            self.first_listed = Some(std::sync::Arc::new(uids));
        }
        let context = self.plan_context();
        let plan = DrainPlan::in_context(pods.pods(), &context);
        self.report_stuck(&plan);
        let latecomers: Vec<PodKey> = plan
            .tolerating_latecomers()
            .filter(|k| !round.reported_latecomers.contains(*k))
            .cloned()
            .collect();
        if !latecomers.is_empty() {
            tracing::info!(step = "left_tolerating_pods", node = %self.node_name, pods = ?latecomers.iter().map(ToString::to_string).collect::<Vec<_>>(), "pods bound after the cordon that tolerate it are left on the node (evicting them would bring them straight back)");
            round.reported_latecomers.extend(latecomers);
        }
        if plan.is_drained() {
            return Replanned::Drained;
        }
        round
            .queue
            .retain_present(|k| pods.contains(&k.namespace, &k.name, &k.uid));
        round
            .budget_watch
            .retain_waiting(|k| pods.contains(&k.namespace, &k.name, &k.uid));
        round.planned = Some((generation, plan));
        Replanned::Evicting
    }

    /// Waits for the next thing the eviction loop acts on and acts on it; `Some` when the
    /// session has to end.
    async fn next_wake_up(
        &mut self,
        round: &mut EvictionRound,
        hand_over_at: Instant,
    ) -> Option<SessionEnd> {
        let retry_at = round.queue.next_retry_at();
        let replan_at = round
            .planned
            .as_ref()
            .and_then(|(_, plan)| plan.next_change_at)
            .map(instant_at);
        let synced = round.pods.is_synced();
        // Biased, in this order: the deadline and the hand-over win over everything; an
        // eviction answer is read before more watch events (a busy watch must not starve
        // the answers, whose connections would sit unread).
        tokio::select! {
            biased;
            // Only once the pods are known: an invocation resuming after the deadline
            // must report (or force) the pods that are there, not an empty view.
            _ = sleep_until(round.deadline_at), if synced => {
                let stuck = self.stuck_pods(&round.pods, &round.queue).await;
                return Some(SessionEnd::DeadlinePassed(stuck));
            }
            // The pods were never listed: the deadline still counts.
            _ = sleep_until(round.unlisted_deadline_at), if !synced => {
                let cause = round
                    .pods
                    .last_error()
                    .unwrap_or("no answer from the API server")
                    .to_owned();
                return Some(SessionEnd::PodsUnknown(cause));
            }
            _ = sleep_until(hand_over_at) => return Some(SessionEnd::HandOver),
            _ = sleep_until(round.renew_at) => {
                if let Some(end) = self.renew().await {
                    return Some(end);
                }
                round.renew_at = Instant::now() + self.renew_interval();
                // The node's readiness may have changed.
                round.planned = None;
            }
            (pod, outcome) = round.queue.next_answer() => {
                self.on_answer(&mut round.queue, &mut round.budget_watch, &pod, outcome, &mut round.reported_multiple).await;
                // Answers come in waves: take every one already here before offering
                // the freed slots.
                while let Some((pod, outcome)) = round.queue.ready_answer() {
                    self.on_answer(&mut round.queue, &mut round.budget_watch, &pod, outcome, &mut round.reported_multiple).await;
                }
            }
            released = round.budget_watch.released() => {
                for (pod, at) in &released {
                    round.queue.retry_at(pod, *at);
                }
            }
            _ = sleep_until(retry_at.unwrap_or(hand_over_at)), if retry_at.is_some() => {}
            // A waited-for deletion becomes stuck: plan again.
            _ = sleep_until(replan_at.unwrap_or(hand_over_at)), if replan_at.is_some() => {
                round.planned = None;
            }
            changed = round.pods.changed() => {
                if let Err(error) = changed {
                    tracing::warn!(%error, "restarting the watch of the node's pods");
                    round.pods = NodePods::watch(self.client, &self.node_name);
                }
            }
        }
        None
    }

    async fn on_answer(
        &mut self,
        queue: &mut EvictionQueue,
        budget_watch: &mut BudgetWatch,
        pod: &PodKey,
        outcome: EvictionOutcome,
        reported_multiple: &mut BTreeSet<PodKey>,
    ) {
        let label = outcome.label();
        let multiple = matches!(outcome, EvictionOutcome::MultipleBudgets { .. });
        let detail = match &outcome {
            EvictionOutcome::BlockedByBudget { message, .. }
            | EvictionOutcome::MultipleBudgets { message }
            | EvictionOutcome::Transient { message, .. }
            | EvictionOutcome::Conflict { message }
            | EvictionOutcome::Rejected { message, .. } => message.clone(),
            _ => String::new(),
        };
        let refusal = outcome.clone();
        match queue.record(pod, outcome, Instant::now()) {
            Recorded::Evicted => {
                self.stats.pods_evicted += 1;
                tracing::info!(step = "evicted", node = %self.node_name, pod = %pod, "pod evicted");
            }
            Recorded::Leaving => {
                tracing::info!(step = "evicted", node = %self.node_name, pod = %pod, outcome = label, "pod already leaving");
            }
            Recorded::RetryAt(at) => {
                self.stats.eviction_retries += 1;
                let now = Instant::now();
                let (at, paced_by) = match budget_watch.after_refusal(queue, pod, &refusal, now) {
                    Waiting::OnBudget(at) => (at, "budget"),
                    Waiting::OnTimer => (at, "timer"),
                };
                let retry_in = at.saturating_duration_since(now);
                tracing::info!(step = "eviction_refused", node = %self.node_name, pod = %pod, outcome = label, retry_in_ms = retry_in.as_millis() as u64, paced_by, detail = %detail, "eviction refused; will retry");
                if multiple && reported_multiple.insert(pod.clone()) {
                    let names = self.budgets_of(pod).await;
                    let note = format!(
                        "Cannot evict: more than one PodDisruptionBudget selects this pod ({}); \
                         the eviction API refuses such pods. Retrying until the drain deadline.",
                        if names.is_empty() {
                            "names unknown".to_owned()
                        } else {
                            names.join(", ")
                        }
                    );
                    tracing::warn!(step = "eviction_refused", node = %self.node_name, pod = %pod, budgets = ?names, "{note}");
                    self.events.warning(
                        &DrainEvents::pod_reference(pod),
                        reason::EVICTION_BLOCKED,
                        note,
                    );
                }
            }
        }
    }

    /// The budgets that select `pod`, from its namespace's list; empty when unknown.
    async fn budgets_of(&self, pod: &PodKey) -> Vec<String> {
        let api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace);
        let labels = match api.get_opt(&pod.name).await {
            Ok(Some(p)) => p.metadata.labels.unwrap_or_default(),
            _ => return Vec::new(),
        };
        match budgets::list(self.client, &pod.namespace).await {
            Ok(list) => budgets::covering(&list, &labels),
            Err(error) => {
                tracing::debug!(%error, "could not list PodDisruptionBudgets");
                Vec::new()
            }
        }
    }

    async fn stuck_pods(&mut self, pods: &NodePods, queue: &EvictionQueue) -> Vec<StuckPod> {
        let context = self.plan_context();
        let plan = DrainPlan::in_context(pods.pods(), &context);
        let refusals: BTreeMap<&PodKey, &EvictionOutcome> = queue.refusals().collect();
        let mut namespaces: BTreeMap<
            String,
            Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
        > = BTreeMap::new();
        let labels_of: BTreeMap<PodKey, BTreeMap<String, String>> = pods
            .pods()
            .filter_map(|p| {
                Some((
                    PodKey::of(p)?,
                    p.metadata.labels.clone().unwrap_or_default(),
                ))
            })
            .collect();
        let mut stuck = Vec::new();
        for key in plan.remaining() {
            if !namespaces.contains_key(&key.namespace) {
                let list = budgets::list(self.client, &key.namespace)
                    .await
                    .unwrap_or_else(|error| {
                        tracing::debug!(%error, "could not list PodDisruptionBudgets");
                        Vec::new()
                    });
                namespaces.insert(key.namespace.clone(), list);
            }
            let refusal = refusals.get(key).map(|r| (*r).clone());
            let terminating = queue.is_leaving(key) || plan.is_terminating(key);
            let mut names = labels_of
                .get(key)
                .map(|labels| budgets::covering(&namespaces[&key.namespace], labels))
                .unwrap_or_default();
            if names.is_empty()
                && let Some(EvictionOutcome::BlockedByBudget { budgets, .. }) = &refusal
            {
                names = budgets.clone();
            }
            let why = match refusal {
                _ if terminating => StuckReason::Terminating,
                Some(refusal) => StuckReason::Refused(refusal),
                None if queue.is_in_flight(key) => StuckReason::InFlight,
                None => StuckReason::NotReached,
            };
            stuck.push(StuckPod {
                pod: key.clone(),
                budgets: names,
                why,
            });
        }
        stuck
    }

    /// When to renew the lease next: every third of the lease; after failed renewals
    /// sooner, jittered, growing back to that interval.
    fn renew_interval(&self) -> Duration {
        let interval = (self.holder.lease_duration / 3).max(Duration::from_millis(10));
        match self.renew_failures {
            0 => interval,
            failures => backoff_delay(failures - 1, interval / 8, interval),
        }
    }

    /// Renews the lease. A renewal the API server keeps refusing (after the retries of
    /// [`lease::update`]) is logged and tried again soon; the drain goes on meanwhile. The
    /// lease may lapse by the clock during such an outage: that alone ends nothing, since
    /// only a competitor's claim (its name in the checkpoint) takes the drain away, and the
    /// next successful write renews it. Writes the drain cannot go on without (the drained
    /// mark, the hand-over) fail the invocation instead, so Lambda retries it.
    async fn renew(&mut self) -> Option<SessionEnd> {
        let holder = self.holder.clone();
        match self
            .update(move |c, now| c.renewed(&holder.id, now, holder.lease_duration))
            .await
        {
            Ok(end) => {
                self.renew_failures = 0;
                end
            }
            Err(error) => {
                self.renew_failures = self.renew_failures.saturating_add(1);
                tracing::warn!(node = %self.node_name, %error, failures = self.renew_failures, "could not renew the drain lease; the drain goes on and the renewal is tried again");
                None
            }
        }
    }

    /// Writes a checkpoint change; `Some(end)` when the session has to stop.
    async fn update(
        &mut self,
        change: impl Fn(&DrainCheckpoint, Timestamp) -> DrainCheckpoint,
    ) -> Result<Option<SessionEnd>, kube::Error> {
        let nodes = self.nodes();
        match lease::update(
            &nodes,
            &self.node_name,
            self.holder,
            &mut self.last_written,
            change,
        )
        .await?
        {
            Update::Written(checkpoint) => {
                self.checkpoint = checkpoint;
                Ok(None)
            }
            Update::LeaseLost => Ok(Some(SessionEnd::LeaseLost)),
            Update::NodeGone => Ok(Some(SessionEnd::NodeGone)),
        }
    }

    pub fn node_reference(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        DrainEvents::node_reference(&self.node_name, self.node_uid.as_deref())
    }
}

/// Since when `node`'s Ready condition is False or Unknown (its last transition), when it is.
pub fn not_ready_since(node: &Node) -> Option<Timestamp> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if ready.status == "True" {
        return None;
    }
    Some(
        ready
            .last_transition_time
            .as_ref()
            .map_or_else(Timestamp::now, |t| t.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        PodKey {
            namespace: "default".into(),
            name: name.into(),
            uid: "u".into(),
        }
    }

    #[test]
    fn stuck_pods_say_why() {
        let refused = EvictionOutcome::BlockedByBudget {
            budgets: vec!["web".into()],
            retry_after: None,
            message: String::new(),
        };
        let one = StuckPod {
            pod: key("a"),
            budgets: vec!["web".into()],
            why: StuckReason::Refused(refused),
        };
        assert_eq!(one.to_string(), "default/a (PodDisruptionBudget web)");
        let two = StuckPod {
            pod: key("b"),
            budgets: vec!["x".into(), "y".into()],
            why: StuckReason::Refused(EvictionOutcome::MultipleBudgets {
                message: String::new(),
            }),
        };
        assert!(two.to_string().contains("PodDisruptionBudgets x, y"));
        let terminating = StuckPod {
            pod: key("c"),
            budgets: vec![],
            why: StuckReason::Terminating,
        };
        assert_eq!(terminating.to_string(), "default/c (still terminating)");
        let later = StuckPod {
            pod: key("d"),
            budgets: vec![],
            why: StuckReason::NotReached,
        };
        assert!(later.to_string().contains("not evicted yet"));
    }
}
