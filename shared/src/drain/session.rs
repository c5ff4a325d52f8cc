//! One invocation's share of a drain: from the claimed checkpoint until the node is empty and
//! settled, the drain deadline passes, or the invocation has to hand over.
//!
//! [`DrainSession::run`] evicts (the loop is in `eviction_round.rs`), marks the node drained,
//! settles and checks once more for pods bound meanwhile; the lease on the node is renewed
//! throughout. The session holds no state a restart could lose beyond what the checkpoint
//! and the cluster already say. Pods it cannot get off the node: [`super::stuck`].

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::time::{Instant, sleep_until};

use super::backoff::Backoff;
use super::blocked::{self, AfterPods};
use super::events::{DrainEvents, reason};
use super::lease::{self, LeaseHolder, Update};
use super::load_balancers::{LONGEST_DEREGISTRATION_DELAY, LoadBalancerTarget, LoadBalancerWait};
use super::node_pods::NodePods;
use super::plan::{DrainPlan, PlanContext, PodKey};
use super::stuck::StuckPod;
use super::volumes::VolumeWait;
use crate::lifecycle::budget::instant_at;
use crate::node_marks::checkpoint::DrainCheckpoint;
use crate::retry::backoff_delay;

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
    /// `VOLUME_DETACH_SECONDS`: the bound of the wait for the node's volumes ([`super::volumes`]).
    pub volume_detach: Duration,
    /// `DRAIN_BLOCKED_REPORT_SECONDS`: when and how often a waiting drain says why
    /// ([`super::blocked`]); zero: never.
    pub blocked_report: Duration,
    /// `OUT_OF_SERVICE_TAINT`: free a dead kubelet's stuck pods ([`super::dead_node`]).
    pub out_of_service_taint: bool,
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
    /// Stuck deletions were reported and the out-of-service taint not tried yet
    /// ([`super::dead_node`]).
    pub dead_node_check_due: bool,
    /// Pods held by `karpenter.sh/do-not-disrupt` already reported (one Event per pod).
    pub reported_held: BTreeSet<PodKey>,
    /// Lease renewals that failed in a row: the next is tried sooner, with jitter.
    pub renew_failures: u32,
    /// The UIDs of this invocation's first complete list of the node's pods (see
    /// [`PlanContext::first_listed`]).
    pub first_listed: Option<std::sync::Arc<BTreeSet<String>>>,
    /// The watch of the node's pods when it was started before the session (concurrently
    /// with the claim); the session starts its own otherwise.
    pub prefetched_pods: Option<NodePods>,
    /// The load balancers to wait for once the node is empty ([`super::load_balancers`]);
    /// `None`: the settle period only.
    pub load_balancers: Option<LoadBalancerTarget<'a>>,
}

impl<'a> DrainSession<'a> {
    /// A session on the drain `holder` just claimed: `node` as the claim wrote it, with
    /// `checkpoint`; the pods' watch given when it was started already.
    pub fn start(
        client: &'a kube::Client,
        node: Node,
        checkpoint: DrainCheckpoint,
        holder: &'a LeaseHolder,
        settings: &'a SessionSettings,
        events: &'a DrainEvents,
        prefetched_pods: Option<NodePods>,
    ) -> Self {
        Self {
            client,
            node_name: node.metadata.name.clone().unwrap_or_default(),
            node_uid: node.metadata.uid.clone(),
            holder,
            settings,
            events,
            checkpoint,
            last_written: Some(node),
            stats: SessionStats::default(),
            node_not_ready_since: None,
            reported_stuck: Default::default(),
            dead_node_check_due: false,
            reported_held: Default::default(),
            renew_failures: 0,
            first_listed: None,
            prefetched_pods,
            load_balancers: None,
        }
    }
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
                // the way to the completion (which records it); the wait for volumes writes
                // it when it finds some attached.
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

    /// The UIDs of the pods bound to the node now, from one list.
    pub(super) async fn pod_uids_on_node(&self) -> Result<BTreeSet<String>, kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::all(self.client.clone());
        let params =
            kube::api::ListParams::default().fields(&format!("spec.nodeName={}", self.node_name));
        let pods = api.list(&params).await?;
        Ok(pods
            .items
            .into_iter()
            .filter_map(|p| p.metadata.uid)
            .collect())
    }

    /// What the plan needs besides the pods, as of now.
    pub(super) fn plan_context(&mut self) -> PlanContext {
        if let Some(node) = &self.last_written {
            self.node_not_ready_since = not_ready_since(node);
        }
        PlanContext {
            now: Some(Timestamp::now()),
            cordoned_at: Some(self.checkpoint.started_at),
            not_ready_since: self.node_not_ready_since,
            first_listed: self.first_listed.clone(),
            stuck_after: self.settings.stuck_pod_after,
            instance_ends_at: self.notice_end(),
            involuntary: self
                .checkpoint
                .notice
                .as_ref()
                .is_some_and(super::plan::is_involuntary),
        }
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

    /// Waits until the load balancers let go of the instance (or the settle period passes,
    /// when they cannot be read) and for the node's volumes to detach, all counted from when
    /// the node was drained, renewing the lease, unless the invocation ends first.
    pub async fn settle(&mut self, hand_over_at: Instant) -> Result<SessionEnd, kube::Error> {
        let drained_at = self.checkpoint.drained_at.unwrap_or_else(Timestamp::now);
        let settled_at = instant_at(self.cut_at_notice_end(drained_at, self.settings.settle));
        let volumes_bound = self.cut_at_notice_end(drained_at, self.settings.volume_detach);
        let mut volumes = VolumeWait::until(instant_at(volumes_bound), self.settings.volume_detach);
        let mut balancers = LoadBalancerWait::new(
            self.load_balancers,
            instant_at(drained_at),
            self.settings.settle,
            settled_at,
        );
        if self.notice_end().is_some() {
            let longest = self.settings.settle + LONGEST_DEREGISTRATION_DELAY;
            let last_useful = self.cut_at_notice_end(drained_at, longest);
            balancers.cut_at(instant_at(last_useful));
        }
        let mut report_at = self.first_blocked_report();
        if Instant::now() < settled_at {
            tracing::info!(step = "settling", node = %self.node_name, settle_seconds = self.settings.settle.as_secs_f64(), "waiting for load balancers to let go of the node");
        }
        loop {
            let context = self.plan_context();
            volumes
                .check_if_due(self.client, &self.node_name, &context, hand_over_at)
                .await;
            balancers.check_if_due(&self.node_name, hand_over_at).await;
            self.report_waiting_if_due(&mut report_at, &volumes, &balancers);
            // A wait that a resumed invocation must count from the same time.
            if (volumes.attached() || balancers.routing())
                && self.checkpoint.drained_at.is_none()
                && let Some(end) = self.mark_drained().await?
            {
                return Ok(end);
            }
            let now = Instant::now();
            if !balancers.waiting(now) && !volumes.waiting(now) {
                self.report_volumes_left(&volumes, now);
                self.report_balancers_left(&balancers, now);
                return Ok(SessionEnd::Settled);
            }
            if now >= hand_over_at {
                return Ok(SessionEnd::HandOver);
            }
            let renew_at = now + self.renew_interval();
            let wake = [
                Some(hand_over_at),
                Some(renew_at),
                volumes.next_wake(now),
                balancers.next_wake(now),
                report_at,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(renew_at);
            sleep_until(wake).await;
            if wake == renew_at
                && let Some(end) = self.renew().await
            {
                return Ok(end);
            }
        }
    }

    /// `drained_at` plus `wait`, cut so that an instance that stops soon (an instance
    /// notice) is not waited for past its end: the node is reported drained then.
    fn cut_at_notice_end(&self, drained_at: Timestamp, wait: Duration) -> Timestamp {
        let until = drained_at.checked_add(wait).unwrap_or(Timestamp::MAX);
        match self.notice_end() {
            Some(end) => {
                let last_useful = end
                    .checked_sub(super::plan::NOTICE_END_MARGIN)
                    .unwrap_or(end);
                until.min(last_useful.max(drained_at))
            }
            None => until,
        }
    }

    /// When a drain that started at the checkpoint's start first says what it waits for
    /// ([`super::blocked`]; counted from the drain's start, so an invocation resuming a long
    /// drain says it at once); `None` when `DRAIN_BLOCKED_REPORT_SECONDS` is 0.
    pub(super) fn first_blocked_report(&self) -> Option<Instant> {
        let every = self.settings.blocked_report;
        if every.is_zero() {
            return None;
        }
        let at = self
            .checkpoint
            .started_at
            .checked_add(every)
            .unwrap_or(Timestamp::MAX);
        Some(instant_at(at))
    }

    /// Once the report is due, says what the drain whose pods are gone still waits for
    /// (log, Warning Event `DrainBlocked`, metrics), then again at most that often.
    fn report_waiting_if_due(
        &self,
        report_at: &mut Option<Instant>,
        volumes: &VolumeWait,
        balancers: &LoadBalancerWait<'_>,
    ) {
        let now = Instant::now();
        if report_at.is_none_or(|at| now < at) {
            return;
        }
        *report_at = Some(now + self.settings.blocked_report);
        let routing = balancers.still_routing();
        let waits: Vec<AfterPods> = [
            (!volumes.still_attached().is_empty())
                .then(|| AfterPods::Volumes(volumes.still_attached().to_vec())),
            (!routing.is_empty()).then_some(AfterPods::LoadBalancers(routing)),
        ]
        .into_iter()
        .flatten()
        .collect();
        if waits.is_empty() {
            return;
        }
        let running_for = Timestamp::now()
            .duration_since(self.checkpoint.started_at)
            .try_into()
            .unwrap_or_default();
        let note = blocked::after_pods(&self.node_name, running_for, &waits);
        tracing::warn!(step = "drain_blocked", node = %self.node_name, "{note}");
        for metric in blocked::after_pods_metrics(&self.node_name, running_for, &waits) {
            metric.emit();
        }
        self.events
            .warning(&self.node_reference(), reason::DRAIN_BLOCKED, note);
    }

    /// Says which volumes were still attached when the wait for them reached its bound.
    fn report_volumes_left(&self, volumes: &VolumeWait, now: Instant) {
        let Some(left) = volumes.left_at_bound(now) else {
            return;
        };
        tracing::warn!(step = "volumes_still_attached", node = %self.node_name, volumes = ?left, bound_seconds = self.settings.volume_detach.as_secs_f64(), "volumes are still attached to the node at the bound of the wait; completing anyway");
        self.events.warning(
            &self.node_reference(),
            reason::VOLUMES_STILL_ATTACHED,
            format!(
                "{} volume(s) still attached to node {} when the wait for them ended (VOLUME_DETACH_SECONDS {} s from the drain's end): {}; their new pods may wait for the volumes to be released",
                left.len(),
                self.node_name,
                self.settings.volume_detach.as_secs_f64(),
                left.join(", ")
            ),
        );
    }

    /// Says which load balancers still routed to the instance when the wait for them ended.
    fn report_balancers_left(&self, balancers: &LoadBalancerWait<'_>, now: Instant) {
        let left = balancers.left_at_bound(now);
        if left.is_empty() {
            return;
        }
        tracing::warn!(step = "load_balancers_still_routing", node = %self.node_name, load_balancers = ?left, "load balancers still route to the instance at the bound of the wait (SETTLE_SECONDS plus their deregistration delay); completing anyway");
        self.events.warning(
            &self.node_reference(),
            reason::LOAD_BALANCERS_STILL_ROUTING,
            format!(
                "{} load balancer(s) still routed to the instance of node {} when the wait for them ended (SETTLE_SECONDS plus each one's deregistration delay from the drain's end): {}; their open connections may be cut",
                left.len(),
                self.node_name,
                left.join(", ")
            ),
        );
    }

    /// When to renew the lease next: every third of the lease; after failed renewals
    /// sooner, jittered, growing back to that interval.
    pub(super) fn renew_interval(&self) -> Duration {
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
    pub(super) async fn renew(&mut self) -> Option<SessionEnd> {
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

    /// When the instance stops running, if an instance notice on the drain says so.
    pub fn notice_end(&self) -> Option<Timestamp> {
        self.checkpoint
            .notice
            .as_ref()
            .and_then(|n| n.instance_ends_at)
    }

    pub fn node_reference(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        DrainEvents::node_reference(&self.node_name, self.node_uid.as_deref())
    }
}

/// Since when `node`'s Ready condition is False or Unknown (its last transition), when it is.
pub fn not_ready_since(node: &Node) -> Option<Timestamp> {
    let ready = crate::lifecycle::node::ready_condition(node)?;
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
