//! The eviction loop of a drain session: evict the node's pods tier by tier within the
//! concurrency bound, retry refusals (paced by the budgets that refused them, or by the
//! timer), and end when the node is empty or the session has to stop.
//!
//! Everything the loop waits for sits in one `select!` ([`DrainSession::evict_all`]): the
//! watch of the node's pods, the eviction answers, the budgets freeing up, the next retry,
//! the lease renewal, the drain deadline and the hand-over time. Each wake-up recomputes the
//! [`DrainPlan`] from the watched pods when they changed and offers the current tier to the
//! [`EvictionQueue`].

use std::collections::BTreeSet;
use std::time::Duration;

use kube::Api;
use tokio::time::{Instant, sleep_until};

use super::blocked;
use super::budget_watch::{BudgetWatch, Waiting};
use super::budgets;
use super::events::{DrainEvents, reason};
use super::eviction::{self, EvictionOutcome};
use super::eviction_queue::{EvictionFuture, EvictionQueue, Recorded};
use super::node_pods::NodePods;
use super::plan::{DrainPlan, PodKey};
use super::session::{DrainSession, SessionEnd};
use crate::lifecycle::budget::instant_at;

/// How long after the drain deadline the session still waits for a first list of the node's
/// pods before it reports the drain failed with the list's error: a resumed invocation must
/// report the pods that are there, but a list that never succeeds (RBAC without `list pods`,
/// an API server down) must not hold the action forever.
const UNLISTED_PODS_GRACE: Duration = Duration::from_secs(5);

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
    /// When to say next which pods the drain waits for ([`super::blocked`]), if ever.
    report_blocked_at: Option<Instant>,
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
        let mut queue = EvictionQueue::new(
            settings.backoff,
            settings.eviction_concurrency,
            settings.grace_period_seconds,
        );
        queue.cap_grace_to(session.notice_end());
        Self {
            pods,
            budget_watch: BudgetWatch::new(client, settings.backoff),
            queue,
            deadline_at,
            unlisted_deadline_at: deadline_at.max(Instant::now()) + UNLISTED_PODS_GRACE,
            renew_at: Instant::now() + session.renew_interval(),
            reported_latecomers: BTreeSet::new(),
            reported_multiple: BTreeSet::new(),
            planned: None,
            report_blocked_at: session.first_blocked_report(),
        }
    }
}

/// Whether planning again found the node drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replanned {
    Drained,
    Evicting,
}

impl DrainSession<'_> {
    /// Evicts until the node is empty (`None`) or the session has to end (`Some`).
    pub(super) async fn evict_all(
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
                let replanned = self.replan(&mut round);
                // Stuck deletions no longer hold the drain: free them, once every pod was
                // asked to leave (the taint deletes what it finds, so a pod of a later tier
                // is evicted first, through its budget).
                let all_asked = replanned == Replanned::Drained
                    || round
                        .planned
                        .as_ref()
                        .is_some_and(|(_, plan)| !plan.has_pods_to_evict());
                if self.dead_node_check_due && all_asked {
                    Box::pin(self.free_dead_node_pods()).await;
                }
                if replanned == Replanned::Drained {
                    return Ok(None);
                }
                if let Some((_, plan)) = &round.planned {
                    let now = Instant::now();
                    round.queue.offer(plan.to_evict_now(), now, evict);
                    round
                        .queue
                        .offer(plan.due_before_instance_end(), now, evict);
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
        self.report_held(&plan);
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
                // An instance notice may have joined the drain (a Spot warning during a
                // scale-in): its end is the deadline now, and caps the grace periods.
                round.deadline_at = instant_at(self.checkpoint.deadline);
                round.queue.cap_grace_to(self.notice_end());
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
            _ = sleep_until(round.report_blocked_at.unwrap_or(hand_over_at)), if round.report_blocked_at.is_some() => {
                self.report_blocked(round);
                round.report_blocked_at = Some(Instant::now() + self.settings.blocked_report);
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

    /// Says which pods the drain waits for and what holds each (log and Warning Event).
    fn report_blocked(&self, round: &EvictionRound) {
        let Some((_, plan)) = &round.planned else {
            return;
        };
        let holding = blocked::holding(plan, &round.queue, &round.budget_watch);
        if holding.is_empty() {
            return;
        }
        let running_for = jiff::Timestamp::now()
            .duration_since(self.checkpoint.started_at)
            .try_into()
            .unwrap_or_default();
        let note = blocked::note(&self.node_name, running_for, &holding);
        tracing::warn!(step = "drain_blocked", node = %self.node_name, pods = holding.len(), "{note}");
        for metric in blocked::metrics(&self.node_name, running_for, &holding) {
            metric.emit();
        }
        self.events
            .warning(&self.node_reference(), reason::DRAIN_BLOCKED, note);
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
}
