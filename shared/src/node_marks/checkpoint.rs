//! The drain's memory, kept on the Node itself: when the drain started, until when it may
//! run, which lifecycle action it serves, and who is working on it now (a lease).
//!
//! Invocations come and go (Lambda retries, SNS duplicates, hand-overs to a fresh invocation
//! before the 15-minute limit); the node is the one place they all see. Keeping the
//! checkpoint there, rather than in a table of our own, means nothing else to deploy and the
//! checkpoint disappears with the node. This module is the pure part: the record and the
//! decision whether an invocation may work on the drain. [`crate::drain::lease`] reads and writes it; the launching hook reads it to undo a
//! scale-in's marks, node repair to see a drain at work.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Taint;
use serde::{Deserialize, Serialize};

use k8s_openapi::api::core::v1::Node;

use super::maintenance::ScheduledEventRef;
use crate::aws::LifecycleActionRef;

/// The Node annotation holding the [`DrainCheckpoint`] as JSON.
pub const CHECKPOINT_ANNOTATION: &str = "open-node-manager.io/drain";

/// The lifecycle action a drain serves, as stored in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointAction {
    pub auto_scaling_group_name: String,
    pub lifecycle_hook_name: String,
    pub instance_id: String,
    /// Not a secret: it only names the pending action.
    pub token: String,
}

impl From<&LifecycleActionRef> for CheckpointAction {
    fn from(action: &LifecycleActionRef) -> Self {
        Self {
            auto_scaling_group_name: action.auto_scaling_group_name.clone(),
            lifecycle_hook_name: action.lifecycle_hook_name.clone(),
            instance_id: action.instance_id.clone(),
            token: action.token.clone(),
        }
    }
}

impl CheckpointAction {
    /// Whether this is the stand-in of a drain started by an instance notice (see
    /// [`notice_action`]): it serves no lifecycle action.
    pub fn is_notice(&self) -> bool {
        self.lifecycle_hook_name.is_empty() && self.token.is_empty()
    }
}

/// The stand-in "action" of a drain started by an instance notice (Spot interruption,
/// rebalance recommendation, scheduled maintenance, an instance stopping) rather than by a
/// lifecycle hook: the instance's group and id, no hook and no token. Every notice about one
/// instance maps to the same stand-in, so a repeated notice finds the drain already there
/// (resumed, busy or done) exactly as a repeated lifecycle notification does.
pub fn notice_action(group_name: &str, instance_id: &str) -> LifecycleActionRef {
    LifecycleActionRef {
        auto_scaling_group_name: group_name.to_owned(),
        lifecycle_hook_name: String::new(),
        instance_id: instance_id.to_owned(),
        token: String::new(),
    }
}

/// What an instance notice says is coming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoticeKind {
    /// `EC2 Spot Instance Interruption Warning`: the instance goes in two minutes.
    SpotInterruption,
    /// `EC2 Instance Rebalance Recommendation`: the instance is at elevated risk.
    RebalanceRecommendation,
    /// An AWS Health scheduled change (retirement, stop, reboot, maintenance).
    ScheduledMaintenance,
    /// `EC2 Instance State-change Notification`: stopping or shutting down now.
    InstanceStopping,
}

impl NoticeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SpotInterruption => "spot-interruption",
            Self::RebalanceRecommendation => "rebalance-recommendation",
            Self::ScheduledMaintenance => "scheduled-maintenance",
            Self::InstanceStopping => "instance-stopping",
        }
    }
}

/// The instance notice a drain answers, kept in its checkpoint: a lifecycle drain of the same
/// instance takes the notice's end time (deadline and grace cap) into account, and a notice
/// drain is taken over by the lifecycle drain instead of running twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceNotice {
    pub kind: NoticeKind,
    pub received_at: Timestamp,
    /// When the instance stops running (Spot: the notice's time plus two minutes; scheduled
    /// maintenance: its start); `None` when the notice does not say (a rebalance
    /// recommendation). Pods' grace periods are capped to end before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_ends_at: Option<Timestamp>,
    /// The node is only taken out of service, nobody drains it (`REBALANCE_ACTION=cordon`):
    /// undone when no termination follows in time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordon_only: bool,
    /// (Scheduled maintenance.) The EC2 scheduled event the drain answers: the drain's
    /// reason stands while EC2 lists that event as pending, and what it does to the instance
    /// decides whether the drain is involuntary; `None` for other notices, and in a record
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_event: Option<ScheduledEventRef>,
}

impl InstanceNotice {
    /// Both notices in one: the earlier end, draining if either drains, the stronger kind.
    fn merged(&self, newer: &Self) -> Self {
        let instance_ends_at = match (self.instance_ends_at, newer.instance_ends_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // The record names the notice the drain works to: the one that ends the instance
        // first (a Spot warning's two minutes outrank a later "stopping" without an end), and
        // never a cordon-only rebalance over a drain.
        let earlier_ends_first = match (self.instance_ends_at, newer.instance_ends_at) {
            (Some(_), None) => true,
            (Some(a), Some(b)) => a < b,
            _ => false,
        };
        let (named, other) = if (newer.cordon_only && !self.cordon_only) || earlier_ends_first {
            (self, newer)
        } else {
            (newer, self)
        };
        Self {
            kind: named.kind,
            received_at: self.received_at.min(newer.received_at),
            instance_ends_at,
            cordon_only: self.cordon_only && newer.cordon_only,
            scheduled_event: named
                .scheduled_event
                .clone()
                .or_else(|| other.scheduled_event.clone()),
        }
    }
}

/// Who works on the drain, and until when without renewing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The Lambda request id of the invocation holding it; `None` once released (handed over).
    pub holder: Option<String>,
    pub renewed_at: Timestamp,
    /// Milliseconds, so that tests can scale the lease down.
    pub duration_millis: u64,
}

impl Lease {
    pub fn new(holder: &str, now: Timestamp, duration: Duration) -> Self {
        Self {
            holder: Some(holder.to_owned()),
            renewed_at: now,
            duration_millis: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
        }
    }

    pub fn expires_at(&self) -> Timestamp {
        let duration = Duration::from_millis(self.duration_millis);
        self.renewed_at
            .checked_add(duration)
            .unwrap_or(Timestamp::MAX)
    }

    /// Whether somebody other than `holder` holds it at `now`.
    pub fn held_by_other(&self, holder: &str, now: Timestamp) -> bool {
        match &self.holder {
            Some(current) => current != holder && now < self.expires_at(),
            None => false,
        }
    }
}

/// What the drain itself changed to take the node out of service (not what it found in
/// place), so that a node coming back from a warm pool gets exactly that undone: a cordon or
/// taint somebody else put there stays.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutOfService {
    /// The drain set the exclude-from-external-load-balancers label.
    #[serde(default)]
    pub labelled: bool,
    /// The drain set `spec.unschedulable`.
    #[serde(default)]
    pub cordoned: bool,
    /// The taint the drain added; `None` when it added none, also when a taint with the
    /// same key and effect (whatever its value) was already on the node: that one is not
    /// ours, and a return from the warm pool leaves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint: Option<AddedTaint>,
}

/// A taint as the drain added it (key, value, effect: what identifies it on the node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddedTaint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

impl AddedTaint {
    pub fn of(taint: &Taint) -> Self {
        Self {
            key: taint.key.clone(),
            value: taint.value.clone(),
            effect: taint.effect.clone(),
        }
    }

    /// Whether `taint` on a node is this one.
    pub fn is(&self, taint: &Taint) -> bool {
        taint.key == self.key && taint.effect == self.effect && taint.value == self.value
    }
}

impl OutOfService {
    /// Everything either record says the drain changed (a resumed or repeated drain adds to
    /// what an earlier one did; it never forgets it).
    pub fn union(&self, other: &Self) -> Self {
        Self {
            labelled: self.labelled || other.labelled,
            cordoned: self.cordoned || other.cordoned,
            taint: self.taint.clone().or_else(|| other.taint.clone()),
        }
    }
}

/// How a finished drain left its node, recorded with its completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrainResult {
    /// Every pod that had to leave is gone (evicted, or deleted by `DRAIN_FORCE`).
    Drained,
    /// Pods were still there when the drain ended (its deadline, or the instance's end).
    PodsLeft,
}

/// The drain record on the Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainCheckpoint {
    pub started_at: Timestamp,
    /// Fixed when the drain starts; continuations keep it.
    pub deadline: Timestamp,
    pub action: CheckpointAction,
    pub lease: Lease,
    /// How many times the drain was handed to a fresh invocation.
    #[serde(default)]
    pub continuations: u32,
    /// When the node was first seen empty: the settle period counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_at: Option<Timestamp>,
    /// When the lifecycle action was completed: later deliveries have nothing left to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// How the drain left the node when it finished; `None` while it runs, and in a record
    /// written before this was kept (which then never counts as having drained the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<DrainResult>,
    /// What the drain changed to take the node out of service; `None` in a checkpoint
    /// written before this was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_service: Option<OutOfService>,
    /// When the drained instance went back to the group's warm pool (scale-in with instance
    /// reuse) instead of terminating: its node comes back under the same name, and the
    /// launching hook then undoes [`Self::out_of_service`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_warm_pool_at: Option<Timestamp>,
    /// The instance notice this drain answers, if any (see [`InstanceNotice`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<InstanceNotice>,
    /// The lease holder is a notice's invocation running this lifecycle drain because no
    /// invocation of the action did (one crashed and waits for Lambda's retry): it drains
    /// for the notice and stands down when done, leaving the action to complete to the
    /// action's own next invocation ([`DrainCheckpoint::decide_notice`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notice_stands_in: bool,
}

/// Whether an invocation may work on a node's drain.
// Made once per claim attempt and consumed at once, never stored in bulk: size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// Take the drain with this checkpoint (new, resumed or replacing a stale one) and write it.
    Claim {
        checkpoint: DrainCheckpoint,
        resumed: bool,
    },
    /// Another invocation is working on it: exit quietly.
    HeldByOther { holder: String, until: Timestamp },
    /// This action's drain is finished and completed.
    AlreadyCompleted,
    /// (Notices only.) A lifecycle drain of the instance is under way: the notice is added to
    /// its checkpoint ([`DrainCheckpoint::joined_by`]) instead of starting a second drain.
    JoinLifecycleDrain,
}

impl DrainCheckpoint {
    /// A new drain starting at `now`, held by `holder`.
    pub fn start(
        action: &LifecycleActionRef,
        now: Timestamp,
        drain_timeout: Duration,
        holder: &str,
        lease_duration: Duration,
    ) -> Self {
        Self {
            started_at: now,
            deadline: now.checked_add(drain_timeout).unwrap_or(Timestamp::MAX),
            action: CheckpointAction::from(action),
            lease: Lease::new(holder, now, lease_duration),
            continuations: 0,
            drained_at: None,
            completed_at: None,
            result: None,
            out_of_service: None,
            to_warm_pool_at: None,
            notice: None,
            notice_stands_in: false,
        }
    }

    /// Whether a drain of `action` is this record's drain: the same action (group, hook,
    /// instance: one pending action at a time) by the same token; or, while the drain is
    /// not completed, one of them named by its instance alone (the sweep's re-delivery of a
    /// lost notification and the notification itself are one action). A completed record
    /// serves only its own token: an instance back from a warm pool is terminated again
    /// under the same names, and that new action must be drained, not taken as completed
    /// (a fresh drain proves its action pending before it writes anything).
    pub fn serves(&self, action: &LifecycleActionRef) -> bool {
        let ours = &self.action;
        let same_names = ours.auto_scaling_group_name == action.auto_scaling_group_name
            && ours.lifecycle_hook_name == action.lifecycle_hook_name
            && ours.instance_id == action.instance_id;
        let by_instance = ours.token.is_empty() || action.by_instance_only();
        same_names
            && if by_instance {
                self.completed_at.is_none()
            } else {
                ours.token == action.token
            }
    }

    pub fn parse(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    pub fn to_json(&self) -> String {
        // Serialising plain strings, numbers and timestamps cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Decides what invocation `holder` may do given the checkpoint found on the node.
    ///
    /// A checkpoint for another lifecycle action (an older token of the same node name) whose
    /// lease is not live is stale: replaced with a fresh drain. One with a live lease is
    /// treated as busy, since two drains of one node at once is what the lease prevents.
    pub fn decide(
        existing: Option<&Self>,
        action: &LifecycleActionRef,
        holder: &str,
        now: Timestamp,
        drain_timeout: Duration,
        lease_duration: Duration,
    ) -> LeaseDecision {
        let fresh = || LeaseDecision::Claim {
            checkpoint: Self::start(action, now, drain_timeout, holder, lease_duration),
            resumed: false,
        };
        let Some(existing) = existing else {
            return fresh();
        };
        if existing.lease.held_by_other(holder, now) {
            return LeaseDecision::HeldByOther {
                holder: existing.lease.holder.clone().unwrap_or_default(),
                until: existing.lease.expires_at(),
            };
        }
        if existing.action.is_notice() && existing.action.instance_id == action.instance_id {
            return existing.adopted_by(action, holder, now, drain_timeout, lease_duration);
        }
        if !existing.serves(action) {
            return fresh();
        }
        if existing.completed_at.is_some() {
            return LeaseDecision::AlreadyCompleted;
        }
        let mut checkpoint = existing.clone();
        checkpoint.lease = Lease::new(holder, now, lease_duration);
        checkpoint.notice_stands_in = false;
        LeaseDecision::Claim {
            checkpoint,
            resumed: true,
        }
    }

    /// A lifecycle action's drain taking over the notice drain of its instance.
    ///
    /// The notice's drain goes on as this one when it is the same episode: it has not
    /// finished (it still runs, or let go of its lease), or it finished with the node drained
    /// and still cordoned, and its deadline (the instance's end) is still ahead. What it did
    /// stays (when it started, whether the node is drained) and the deadline stays the
    /// instance's end when that comes first. Otherwise the record is history (the instance
    /// outlived the notice, the node was put back in service, or pods were left): a new
    /// drain starts now with the hook's timeout, keeping only the notice's end if it is still
    /// ahead. A notice that only cordoned starts the drain's clock now too.
    fn adopted_by(
        &self,
        action: &LifecycleActionRef,
        holder: &str,
        now: Timestamp,
        drain_timeout: Duration,
        lease_duration: Duration,
    ) -> LeaseDecision {
        let own_deadline = now.checked_add(drain_timeout).unwrap_or(Timestamp::MAX);
        let drained_before = self.notice.as_ref().is_some_and(|n| !n.cordon_only);
        let same_episode = drained_before
            && (self.completed_at.is_none() || self.left_node_drained())
            && now < self.deadline;
        let mut checkpoint = self.clone();
        checkpoint.action = CheckpointAction::from(action);
        checkpoint.lease = Lease::new(holder, now, lease_duration);
        checkpoint.completed_at = None;
        checkpoint.result = None;
        checkpoint.to_warm_pool_at = None;
        if same_episode {
            checkpoint.deadline = self.deadline.min(own_deadline);
        } else {
            checkpoint.started_at = now;
            checkpoint.deadline = own_deadline;
            checkpoint.drained_at = None;
            if self.completed_at.is_some() {
                // History: only an end still ahead is kept (it caps grace periods).
                checkpoint.continuations = 0;
                checkpoint.notice = self
                    .notice
                    .clone()
                    .filter(|n| n.instance_ends_at.is_some_and(|end| now < end));
            }
            let end = checkpoint.notice.as_ref().and_then(|n| n.instance_ends_at);
            if let Some(end) = end.filter(|end| now < *end) {
                checkpoint.deadline = own_deadline.min(end);
            }
        }
        if let Some(notice) = checkpoint.notice.as_mut() {
            notice.cordon_only = false;
        }
        LeaseDecision::Claim {
            checkpoint,
            resumed: same_episode,
        }
    }

    /// Decides what an invocation answering an instance `notice` may do given the checkpoint
    /// found on the node. `action` is the instance's [`notice_action`]; `deadline` when the
    /// notice drain must be over.
    ///
    /// - No checkpoint, or a stale one (another instance under the same node name): a new
    ///   notice drain.
    /// - A lifecycle drain of the instance, not completed: [`LeaseDecision::JoinLifecycleDrain`]
    ///   while an invocation of the action holds it; when none does (it crashed and waits
    ///   for Lambda's retry, or its retries ran out), a draining notice stands in
    ///   ([`Self::stood_in_for_by`]): it runs the drain until its end, then stands down.
    /// - A notice drain: busy while another invocation holds it, else resumed with both
    ///   notices merged (a cordon-only rebalance followed by the Spot warning becomes the
    ///   Spot drain).
    /// - A finished drain (either kind): [`LeaseDecision::AlreadyCompleted`] when it left the
    ///   node drained and the node is still cordoned (see [`Self::as_found_on`]), or its
    ///   instance went to a warm pool (stopping it is our own doing); otherwise (pods were
    ///   left, or the node was put back in service since) a new notice drain.
    pub fn decide_notice(
        existing: Option<&Self>,
        action: &LifecycleActionRef,
        notice: &InstanceNotice,
        holder: &str,
        now: Timestamp,
        deadline: Timestamp,
        lease_duration: Duration,
    ) -> LeaseDecision {
        let fresh = || {
            let mut checkpoint = Self::start(action, now, Duration::ZERO, holder, lease_duration);
            checkpoint.deadline = deadline;
            checkpoint.notice = Some(notice.clone());
            if notice.cordon_only {
                checkpoint.lease.holder = None;
            }
            LeaseDecision::Claim {
                checkpoint,
                resumed: false,
            }
        };
        let Some(existing) = existing else {
            return fresh();
        };
        if existing.action.instance_id != action.instance_id {
            return fresh();
        }
        if existing.completed_at.is_some() {
            // The launching hook removes a warm-pool trip's record when the instance comes back.
            let done = existing.left_node_drained() || existing.to_warm_pool_at.is_some();
            return if done {
                LeaseDecision::AlreadyCompleted
            } else {
                fresh()
            };
        }
        if !existing.action.is_notice() {
            return existing.stood_in_for_by(notice, holder, now, deadline, lease_duration);
        }
        if existing.lease.held_by_other(holder, now) {
            return LeaseDecision::HeldByOther {
                holder: existing.lease.holder.clone().unwrap_or_default(),
                until: existing.lease.expires_at(),
            };
        }
        let mut checkpoint = existing.clone();
        let earlier = existing.notice.clone().unwrap_or_else(|| notice.clone());
        let merged = earlier.merged(notice);
        let was_cordon_only = earlier.cordon_only;
        if was_cordon_only && !merged.cordon_only {
            checkpoint.started_at = now;
            checkpoint.deadline = deadline;
        } else {
            checkpoint.deadline = existing.deadline.min(deadline);
        }
        checkpoint.lease = Lease::new(holder, now, lease_duration);
        if merged.cordon_only {
            checkpoint.lease.holder = None;
        }
        checkpoint.notice = Some(merged);
        LeaseDecision::Claim {
            checkpoint,
            resumed: !was_cordon_only,
        }
    }

    /// What a `notice` may do about this lifecycle drain, not completed: join it while an
    /// invocation of its action runs it (or another notice already stands in: a duplicate);
    /// when nobody runs it and the notice drains (not cordon-only), run it as a stand-in, with
    /// the notice added and the earlier of both deadlines. The record stays the action's, so
    /// the action's next invocation waits for the stand-in as for a notice drain and takes the
    /// drain over where it stopped.
    fn stood_in_for_by(
        &self,
        notice: &InstanceNotice,
        holder: &str,
        now: Timestamp,
        deadline: Timestamp,
        lease_duration: Duration,
    ) -> LeaseDecision {
        let nobody_runs_it = !self.lease.held_by_other(holder, now);
        if self.notice_stands_in && !nobody_runs_it {
            return LeaseDecision::HeldByOther {
                holder: self.lease.holder.clone().unwrap_or_default(),
                until: self.lease.expires_at(),
            };
        }
        if !nobody_runs_it || notice.cordon_only {
            return LeaseDecision::JoinLifecycleDrain;
        }
        let mut checkpoint = self.joined_by(notice).unwrap_or_else(|| self.clone());
        checkpoint.deadline = checkpoint.deadline.min(deadline);
        checkpoint.lease = Lease::new(holder, now, lease_duration);
        checkpoint.notice_stands_in = true;
        LeaseDecision::Claim {
            checkpoint,
            resumed: true,
        }
    }

    /// A stand-in's drain is over ([`Self::stood_in_for_by`]): the lease let go and the record
    /// the action's again, not completed, so the action's next invocation completes it (with
    /// the node's drained time kept: it only settles what is left).
    pub fn stood_down(&self, now: Timestamp) -> Self {
        let mut next = self.released(now);
        next.notice_stands_in = false;
        next
    }

    /// A lifecycle drain's checkpoint with a notice about its instance added: the deadline
    /// comes forward to the notice's end, and the drain caps grace periods to it from its
    /// next checkpoint write on. `None` when the notice changes nothing (already recorded).
    pub fn joined_by(&self, notice: &InstanceNotice) -> Option<Self> {
        let merged = match &self.notice {
            Some(earlier) => earlier.merged(notice),
            None => InstanceNotice {
                cordon_only: false,
                ..notice.clone()
            },
        };
        let mut next = self.clone();
        if let Some(ends_at) = merged.instance_ends_at {
            next.deadline = next.deadline.min(ends_at);
        }
        next.notice = Some(merged);
        (next != *self).then_some(next)
    }

    /// Whether this drain takes an instance refresh's marks on its node over: only a drain
    /// whose node goes with its instance (a lifecycle drain, a Spot interruption, a scheduled
    /// retirement or stop). A drain the reconciler undoes when the instance stays (a reboot or
    /// maintenance, a stopped instance started again, a rebalance recommendation) leaves the
    /// refresh's record the refresh's: undoing the drain never lifts the refresh's cordon
    /// while the refresh runs (its pods would move twice).
    pub fn takes_over_refresh(&self) -> bool {
        let Some(notice) = self.notice.as_ref().filter(|_| self.action.is_notice()) else {
            return true;
        };
        match notice.kind {
            NoticeKind::SpotInterruption => true,
            NoticeKind::ScheduledMaintenance => notice
                .scheduled_event
                .as_ref()
                .is_none_or(|event| !event.effect().comes_back()),
            NoticeKind::InstanceStopping | NoticeKind::RebalanceRecommendation => false,
        }
    }

    /// The same checkpoint with the lease renewed by `holder`.
    pub fn renewed(&self, holder: &str, now: Timestamp, lease_duration: Duration) -> Self {
        let mut next = self.clone();
        next.lease = Lease::new(holder, now, lease_duration);
        next
    }

    /// The checkpoint as left for the next invocation: lease released, one more continuation.
    pub fn handed_over(&self, now: Timestamp) -> Self {
        let mut next = self.clone();
        next.lease.holder = None;
        next.lease.renewed_at = now;
        next.continuations = next.continuations.saturating_add(1);
        next
    }

    /// The checkpoint with the lease let go at `now`, not as a hand-over (the continuation
    /// count stays): the drain ended, or its holder stops without handing over.
    pub fn released(&self, now: Timestamp) -> Self {
        let mut next = self.handed_over(now);
        next.continuations = self.continuations;
        next
    }

    /// Whether `holder` still holds the lease at `now` (it may have expired and been taken).
    pub fn is_held_by(&self, holder: &str, now: Timestamp) -> bool {
        self.names_holder(holder) && now < self.lease.expires_at()
    }

    /// Whether the lease names `holder`, expired or not. For the holder itself this is what
    /// counts: an expired lease that still names it was taken by nobody (a competitor's claim
    /// would have replaced the name), so its next conditional write may renew it.
    pub fn names_holder(&self, holder: &str) -> bool {
        self.lease.holder.as_deref() == Some(holder)
    }

    /// Whether the drain finished with every pod that had to leave gone.
    pub fn left_node_drained(&self) -> bool {
        self.completed_at.is_some() && self.result == Some(DrainResult::Drained)
    }

    /// The checkpoint as left when the drain finished at `now` with `result`: lease let go,
    /// completion and result recorded, and the drained time when the node was drained
    /// (without a settle period it was not written yet). A drain that left pods is not
    /// recorded as drained: a later termination or notice drains the node again.
    pub fn finished(&self, now: Timestamp, result: DrainResult) -> Self {
        let mut next = self.released(now);
        next.completed_at.get_or_insert(now);
        next.result = Some(result);
        if result == DrainResult::Drained {
            next.drained_at = self.drained_at.or(Some(now));
        }
        next
    }

    /// The checkpoint read against `node` as it is now: a finished drain whose node is
    /// schedulable again (uncordoned since, so pods may have come back) no longer counts as
    /// having left it drained. Only the decisions read this; it is never written back.
    pub fn as_found_on(mut self, node: &Node) -> Self {
        if self.left_node_drained() && !is_unschedulable(node) {
            self.result = None;
        }
        self
    }

    /// The checkpoint with the lease of `predecessor` treated as let go: the invocation that
    /// handed this action's drain over to the caller names itself in the message it
    /// published, and it stopped working before publishing, even when it could not record
    /// the hand-over on the node. Any other holder, or another action's drain, is kept.
    pub fn handed_over_by(mut self, predecessor: &str, action: &LifecycleActionRef) -> Self {
        if self.serves(action) && self.names_holder(predecessor) {
            self.lease.holder = None;
        }
        self
    }
}

fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Whether a drain of ours holds `node`: one at work or paused between invocations, or a
/// finished one whose node is still cordoned (its instance leaving, or kept for inspection).
/// A finished drain whose node is schedulable again (put back in service after a reboot),
/// or whose instance went to a warm pool, holds nothing: instance refresh may mark the node
/// and node repair may repair it. A record that cannot be read holds the node (a drain may
/// be at work; its next write replaces the record).
pub fn drain_holds(node: &Node) -> bool {
    let annotated = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CHECKPOINT_ANNOTATION));
    match checkpoint_of(node) {
        None => annotated,
        Some(checkpoint) if checkpoint.completed_at.is_none() => true,
        Some(checkpoint) => checkpoint.to_warm_pool_at.is_none() && is_unschedulable(node),
    }
}

/// The merge patch that writes `record` on the node as `read` (conditional on its
/// `resourceVersion`); on a claim, `steps` take the node out of service in the same write,
/// with the common label, and a drain whose node goes with its instance takes a refresh's
/// record over (removes it: the refresh's end must not undo the drain's cordon).
pub(crate) fn record_patch(
    read: &Node,
    record: &DrainCheckpoint,
    steps: Option<&super::out_of_service::CordonSteps>,
) -> serde_json::Value {
    let mut patch = serde_json::json!({"metadata": {
        "resourceVersion": read.metadata.resource_version,
        "annotations": {CHECKPOINT_ANNOTATION: record.to_json()},
    }});
    if let Some(steps) = steps {
        steps.add_to_patch(&mut patch, read);
        patch["metadata"]["labels"][super::MARKED_LABEL] = serde_json::json!("true");
        if super::refresh::refresh_marks_of(read).is_some() && record.takes_over_refresh() {
            super::refresh::add_record_removal_to_patch(&mut patch, read);
        }
    }
    patch
}

/// The merge patch that removes `record` from `node` and undoes what it says the drain
/// changed, each only where still in place (one rule for the launching hook's undo on a
/// return from the warm pool and the reconciler's); with the common label when the record is
/// the node's last mark of ours. The patch carries the node's `resourceVersion`. What was
/// undone is `None` when the record does not say what the drain changed (written by an early
/// release): then only the record goes, and a cordon stays for a person to lift.
pub(crate) fn undo_record_patch(
    node: &Node,
    record: &DrainCheckpoint,
) -> (serde_json::Value, Option<super::out_of_service::Undone>) {
    let mut patch = serde_json::json!({"metadata": {
        "resourceVersion": node.metadata.resource_version,
        "annotations": {CHECKPOINT_ANNOTATION: null},
    }});
    let others = super::marks::NodeMarks {
        checkpoint: None,
        ..super::marks::NodeMarks::of(node)
    };
    if others.labelled && !others.any() {
        patch["metadata"]["labels"][super::MARKED_LABEL] = serde_json::Value::Null;
    }
    let undone = record
        .out_of_service
        .as_ref()
        .map(|ours| super::out_of_service::add_undo_to_patch(ours, node, &mut patch));
    (patch, undone)
}

/// The checkpoint stored on `node`, if any. An unreadable one is ignored (and replaced by the
/// next write) with a warning, since it cannot be resumed from anyway.
pub(crate) fn checkpoint_of(node: &Node) -> Option<DrainCheckpoint> {
    let raw = node
        .metadata
        .annotations
        .as_ref()?
        .get(CHECKPOINT_ANNOTATION)?;
    match DrainCheckpoint::parse(raw) {
        Ok(checkpoint) => Some(checkpoint),
        Err(error) => {
            tracing::warn!(
                annotation = CHECKPOINT_ANNOTATION,
                %error,
                "ignoring an unreadable drain checkpoint; it will be replaced"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(900);
    const LEASE: Duration = Duration::from_secs(60);

    fn action(token: &str) -> LifecycleActionRef {
        LifecycleActionRef {
            auto_scaling_group_name: "eks-demo-ng".into(),
            lifecycle_hook_name: "Terminate-LC-Hook".into(),
            instance_id: "i-07e9ea9eb19a67337".into(),
            token: token.into(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn claimed(decision: LeaseDecision) -> (DrainCheckpoint, bool) {
        match decision {
            LeaseDecision::Claim {
                checkpoint,
                resumed,
            } => (checkpoint, resumed),
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    #[test]
    fn first_invocation_starts_a_drain_with_the_deadline_from_now() {
        let (cp, resumed) = claimed(DrainCheckpoint::decide(
            None,
            &action("t"),
            "req-1",
            at(0),
            TIMEOUT,
            LEASE,
        ));
        assert!(!resumed);
        assert_eq!(cp.started_at, at(0));
        assert_eq!(cp.deadline, at(900));
        assert!(cp.is_held_by("req-1", at(59)));
        assert!(!cp.is_held_by("req-1", at(60)));
        let round_trip = DrainCheckpoint::parse(&cp.to_json()).unwrap();
        assert_eq!(round_trip, cp);
    }

    #[test]
    fn duplicate_while_the_lease_is_live_is_turned_away() {
        let cp = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        let decision =
            DrainCheckpoint::decide(Some(&cp), &action("t"), "req-2", at(30), TIMEOUT, LEASE);
        assert_eq!(
            decision,
            LeaseDecision::HeldByOther {
                holder: "req-1".into(),
                until: at(60)
            }
        );
    }

    #[test]
    fn a_retry_of_the_same_request_and_an_expired_lease_resume_the_same_drain() {
        let cp = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        let (same, resumed) = claimed(DrainCheckpoint::decide(
            Some(&cp),
            &action("t"),
            "req-1",
            at(30),
            TIMEOUT,
            LEASE,
        ));
        assert!(resumed);
        assert_eq!(same.deadline, at(900));
        let (taken, resumed) = claimed(DrainCheckpoint::decide(
            Some(&cp),
            &action("t"),
            "req-2",
            at(61),
            TIMEOUT,
            LEASE,
        ));
        assert!(resumed);
        assert_eq!(taken.started_at, at(0));
        assert_eq!(taken.deadline, at(900), "the original deadline is kept");
        assert!(taken.is_held_by("req-2", at(62)));
    }

    #[test]
    fn hand_over_releases_the_lease_for_the_next_invocation() {
        let cp = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        let left = cp.handed_over(at(800));
        assert_eq!(left.continuations, 1);
        assert!(!left.is_held_by("req-1", at(801)));
        let (next, resumed) = claimed(DrainCheckpoint::decide(
            Some(&left),
            &action("t"),
            "req-2",
            at(801),
            TIMEOUT,
            LEASE,
        ));
        assert!(resumed);
        assert_eq!(next.continuations, 1);
        assert_eq!(next.deadline, at(900));
    }

    #[test]
    fn completed_drain_and_stale_checkpoint_of_another_action() {
        let mut cp = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        cp.completed_at = Some(at(100));
        let released = cp.handed_over(at(100));
        assert_eq!(
            DrainCheckpoint::decide(
                Some(&released),
                &action("t"),
                "req-2",
                at(101),
                TIMEOUT,
                LEASE
            ),
            LeaseDecision::AlreadyCompleted
        );
        let (fresh, resumed) = claimed(DrainCheckpoint::decide(
            Some(&released),
            &action("new-token"),
            "req-3",
            at(5000),
            TIMEOUT,
            LEASE,
        ));
        assert!(!resumed);
        assert_eq!(fresh.started_at, at(5000));
        assert_eq!(fresh.action.token, "new-token");
        assert_eq!(fresh.completed_at, None);
    }

    fn spot_notice(received: i64, ends: i64) -> InstanceNotice {
        InstanceNotice {
            kind: NoticeKind::SpotInterruption,
            received_at: at(received),
            instance_ends_at: Some(at(ends)),
            cordon_only: false,
            scheduled_event: None,
        }
    }

    #[test]
    fn a_later_notice_without_an_end_keeps_the_spot_warning_the_drain_works_to() {
        let lifecycle = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        let spot = lifecycle.joined_by(&spot_notice(10, 130)).unwrap();
        let stopping = InstanceNotice {
            kind: NoticeKind::InstanceStopping,
            received_at: at(120),
            instance_ends_at: None,
            cordon_only: false,
            scheduled_event: None,
        };
        let joined = spot.joined_by(&stopping).unwrap_or(spot.clone());
        let notice = joined.notice.as_ref().unwrap();
        assert_eq!(notice.kind, NoticeKind::SpotInterruption);
        assert_eq!(notice.instance_ends_at, Some(at(130)));
        assert_eq!(joined.deadline, at(130));
    }

    fn notice_of_instance() -> LifecycleActionRef {
        notice_action("eks-demo-ng", "i-07e9ea9eb19a67337")
    }

    #[test]
    fn a_notice_starts_its_own_drain_until_the_instance_ends() {
        let action = notice_of_instance();
        let (cp, resumed) = claimed(DrainCheckpoint::decide_notice(
            None,
            &action,
            &spot_notice(0, 120),
            "req-n",
            at(0),
            at(120),
            LEASE,
        ));
        assert!(!resumed);
        assert!(cp.action.is_notice());
        assert_eq!(cp.deadline, at(120));
        assert!(cp.is_held_by("req-n", at(1)));
        let round_trip = DrainCheckpoint::parse(&cp.to_json()).unwrap();
        assert_eq!(round_trip, cp);
        // A duplicate while it runs is turned away; once completed, nothing to do.
        assert!(matches!(
            DrainCheckpoint::decide_notice(
                Some(&cp),
                &action,
                &spot_notice(0, 120),
                "req-m",
                at(5),
                at(120),
                LEASE
            ),
            LeaseDecision::HeldByOther { .. }
        ));
        let done = cp.finished(at(60), DrainResult::Drained);
        assert_eq!(
            DrainCheckpoint::decide_notice(
                Some(&done),
                &action,
                &spot_notice(0, 120),
                "req-m",
                at(61),
                at(120),
                LEASE
            ),
            LeaseDecision::AlreadyCompleted
        );
    }

    #[test]
    fn a_notice_joins_a_running_lifecycle_drain_and_brings_its_deadline_forward() {
        let lifecycle = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        assert_eq!(
            DrainCheckpoint::decide_notice(
                Some(&lifecycle),
                &notice_of_instance(),
                &spot_notice(10, 130),
                "req-n",
                at(10),
                at(130),
                LEASE
            ),
            LeaseDecision::JoinLifecycleDrain
        );
        let joined = lifecycle.joined_by(&spot_notice(10, 130)).unwrap();
        assert_eq!(joined.deadline, at(130));
        assert_eq!(joined.lease, lifecycle.lease, "the lease stays the drain's");
        assert_eq!(joined.action, lifecycle.action);
        // A repeated notice with a later end changes nothing: no write.
        assert_eq!(joined.joined_by(&spot_notice(11, 131)), None);
        // A drain that already completed needs nothing, also when the instance went to a
        // warm pool (stopping it is our own doing).
        let mut pooled = lifecycle.finished(at(50), DrainResult::PodsLeft);
        pooled.to_warm_pool_at = Some(at(50));
        assert_eq!(
            DrainCheckpoint::decide_notice(
                Some(&pooled),
                &notice_of_instance(),
                &spot_notice(60, 180),
                "req-n",
                at(60),
                at(180),
                LEASE
            ),
            LeaseDecision::AlreadyCompleted
        );
        let completed = lifecycle.finished(at(50), DrainResult::Drained);
        assert_eq!(
            DrainCheckpoint::decide_notice(
                Some(&completed),
                &notice_of_instance(),
                &spot_notice(60, 180),
                "req-n",
                at(60),
                at(180),
                LEASE
            ),
            LeaseDecision::AlreadyCompleted
        );
    }

    #[test]
    fn a_notice_stands_in_for_a_lifecycle_drain_nobody_runs_and_hands_it_back() {
        // The action's invocation crashed at 5 s; its lease lapsed at 65 s.
        let lifecycle = DrainCheckpoint::start(&action("t"), at(5), TIMEOUT, "req-1", LEASE);
        let spot = |holder: &str, now: i64| {
            DrainCheckpoint::decide_notice(
                Some(&lifecycle),
                &notice_of_instance(),
                &spot_notice(now, now + 120),
                holder,
                at(now),
                at(now + 115),
                LEASE,
            )
        };
        assert_eq!(spot("req-n", 64), LeaseDecision::JoinLifecycleDrain);
        let (standing_in, resumed) = claimed(spot("req-n", 66));
        assert!(resumed, "the drain goes on where it was");
        assert!(standing_in.notice_stands_in);
        assert_eq!(
            standing_in.action, lifecycle.action,
            "the record stays the action's"
        );
        assert_eq!(
            standing_in.deadline,
            at(181),
            "the notice's deadline comes first"
        );
        assert_eq!(standing_in.started_at, at(5));
        assert!(standing_in.is_held_by("req-n", at(67)));
        // A cordon-only notice never runs a drain.
        let mut rebalance = spot_notice(66, 0);
        rebalance.cordon_only = true;
        rebalance.instance_ends_at = None;
        assert_eq!(
            DrainCheckpoint::decide_notice(
                Some(&lifecycle),
                &notice_of_instance(),
                &rebalance,
                "req-r",
                at(66),
                at(400),
                LEASE
            ),
            LeaseDecision::JoinLifecycleDrain
        );
        // A duplicate of the notice meanwhile is turned away, and the action's own next
        // invocation waits for the stand-in (the drainer sees a notice drain's holder).
        for decision in [
            DrainCheckpoint::decide_notice(
                Some(&standing_in),
                &notice_of_instance(),
                &spot_notice(70, 190),
                "req-n2",
                at(70),
                at(185),
                LEASE,
            ),
            DrainCheckpoint::decide(
                Some(&standing_in),
                &action("t"),
                "req-2",
                at(70),
                TIMEOUT,
                LEASE,
            ),
        ] {
            assert!(
                matches!(&decision, LeaseDecision::HeldByOther { holder, .. } if holder == "req-n"),
                "{decision:?}"
            );
        }
        // Stood down with the node drained: the action's next invocation resumes the drain,
        // keeps when the node was drained (it only settles what is left) and completes it.
        let mut drained = standing_in.clone();
        drained.drained_at = Some(at(90));
        let stood_down = drained.stood_down(at(92));
        assert!(!stood_down.notice_stands_in);
        assert_eq!(stood_down.completed_at, None, "the action is not completed");
        let (resumed_drain, resumed) = claimed(DrainCheckpoint::decide(
            Some(&stood_down),
            &action("t"),
            "req-2",
            at(93),
            TIMEOUT,
            LEASE,
        ));
        assert!(resumed);
        assert_eq!(resumed_drain.drained_at, Some(at(90)));
        assert!(resumed_drain.is_held_by("req-2", at(94)));
        // Taken over while the stand-in still ran (its lease lapsed): the flag goes too.
        let (taken, _) = claimed(DrainCheckpoint::decide(
            Some(&standing_in),
            &action("t"),
            "req-2",
            at(127),
            TIMEOUT,
            LEASE,
        ));
        assert!(!taken.notice_stands_in);
        let round_trip = DrainCheckpoint::parse(&standing_in.to_json()).unwrap();
        assert_eq!(round_trip, standing_in);
    }

    #[test]
    fn a_lifecycle_drain_takes_over_a_finished_notice_drain_keeping_what_it_did() {
        let mut notice =
            DrainCheckpoint::start(&notice_of_instance(), at(0), Duration::ZERO, "req-n", LEASE);
        notice.deadline = at(120);
        notice.notice = Some(spot_notice(0, 120));
        notice.drained_at = Some(at(30));
        notice.out_of_service = Some(OutOfService {
            labelled: true,
            cordoned: true,
            taint: None,
        });
        // While the notice drain holds its lease, the lifecycle drain waits.
        assert!(matches!(
            DrainCheckpoint::decide(Some(&notice), &action("t"), "req-1", at(10), TIMEOUT, LEASE),
            LeaseDecision::HeldByOther { .. }
        ));
        let ended = notice.finished(at(40), DrainResult::Drained);
        let (cp, resumed) = claimed(DrainCheckpoint::decide(
            Some(&ended),
            &action("t"),
            "req-1",
            at(41),
            TIMEOUT,
            LEASE,
        ));
        assert!(resumed);
        assert!(cp.serves(&action("t")));
        assert_eq!(cp.started_at, at(0));
        assert_eq!(
            cp.deadline,
            at(120),
            "the instance's end, not the hook's timeout"
        );
        assert_eq!(cp.drained_at, Some(at(30)));
        assert_eq!(
            cp.completed_at, None,
            "the lifecycle action is still to complete"
        );
        assert_eq!(cp.out_of_service, ended.out_of_service);
        assert!(cp.is_held_by("req-1", at(42)));
    }

    #[test]
    fn a_rebalance_cordon_becomes_the_spot_drain_or_the_termination_drain() {
        let stand_in = notice_of_instance();
        let rebalance = InstanceNotice {
            kind: NoticeKind::RebalanceRecommendation,
            received_at: at(0),
            instance_ends_at: None,
            cordon_only: true,
            scheduled_event: None,
        };
        let (cordon, _) = claimed(DrainCheckpoint::decide_notice(
            None,
            &stand_in,
            &rebalance,
            "req-r",
            at(0),
            at(1800),
            LEASE,
        ));
        assert_eq!(
            cordon.lease.holder, None,
            "nobody drains a cordon-only notice"
        );
        // The Spot warning follows: a drain until the instance's end, started now.
        let (spot, resumed) = claimed(DrainCheckpoint::decide_notice(
            Some(&cordon),
            &stand_in,
            &spot_notice(100, 220),
            "req-s",
            at(100),
            at(220),
            LEASE,
        ));
        assert!(!resumed);
        assert_eq!((spot.started_at, spot.deadline), (at(100), at(220)));
        let merged = spot.notice.unwrap();
        assert_eq!(merged.kind, NoticeKind::SpotInterruption);
        assert!(!merged.cordon_only);
        // Or the termination comes: the hook's drain from now, with its own timeout.
        let (hooked, resumed) = claimed(DrainCheckpoint::decide(
            Some(&cordon),
            &action("t"),
            "req-1",
            at(300),
            TIMEOUT,
            LEASE,
        ));
        assert!(!resumed);
        assert_eq!((hooked.started_at, hooked.deadline), (at(300), at(1200)));
        assert!(!hooked.notice.unwrap().cordon_only);
    }

    fn node_cordoned(cordoned: bool) -> Node {
        Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: Some(cordoned),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A notice drain that ended at 40 with `result`, its deadline (the instance's end) at
    /// 120.
    fn finished_notice_drain(result: DrainResult) -> DrainCheckpoint {
        let mut notice =
            DrainCheckpoint::start(&notice_of_instance(), at(0), Duration::ZERO, "req-n", LEASE);
        notice.deadline = at(120);
        notice.notice = Some(spot_notice(0, 120));
        notice.out_of_service = Some(OutOfService {
            labelled: true,
            cordoned: true,
            taint: None,
        });
        notice.finished(at(40), result)
    }

    #[test]
    fn a_finished_notice_drain_is_history_once_its_time_is_over_or_its_node_is_back() {
        let ended = finished_notice_drain(DrainResult::Drained);
        assert_eq!(ended.drained_at, Some(at(40)));
        assert!(ended.left_node_drained());
        // Months later (the instance outlived the notice), a scale-in: a new drain, with
        // the hook's timeout from now, nothing taken from the old record but its marks.
        let (cp, resumed) = claimed(DrainCheckpoint::decide(
            Some(&ended),
            &action("t"),
            "req-1",
            at(10_000),
            TIMEOUT,
            LEASE,
        ));
        assert!(!resumed);
        assert_eq!((cp.started_at, cp.deadline), (at(10_000), at(10_900)));
        assert_eq!(
            (cp.drained_at, cp.completed_at, cp.result),
            (None, None, None)
        );
        assert_eq!(cp.notice, None, "the notice's end is past: no grace cap");
        assert_eq!(cp.out_of_service, ended.out_of_service);
        // Within the notice's time, but the node was uncordoned since: a new drain too,
        // keeping the instance's end (still ahead) as its deadline and grace cap.
        let uncordoned = ended.clone().as_found_on(&node_cordoned(false));
        let (cp, resumed) = claimed(DrainCheckpoint::decide(
            Some(&uncordoned),
            &action("t"),
            "req-1",
            at(50),
            TIMEOUT,
            LEASE,
        ));
        assert!(!resumed);
        assert_eq!(
            (cp.started_at, cp.deadline, cp.drained_at),
            (at(50), at(120), None)
        );
        assert_eq!(cp.notice, ended.notice);
        // Still cordoned: the same episode, taken over as before.
        let cordoned = ended.clone().as_found_on(&node_cordoned(true));
        let (cp, resumed) = claimed(DrainCheckpoint::decide(
            Some(&cordoned),
            &action("t"),
            "req-1",
            at(50),
            TIMEOUT,
            LEASE,
        ));
        assert!(resumed);
        assert_eq!((cp.started_at, cp.drained_at), (at(0), Some(at(40))));
    }

    #[test]
    fn a_later_notice_drains_again_unless_the_node_is_still_drained() {
        let stand_in = notice_of_instance();
        let decide = |existing: &DrainCheckpoint| {
            DrainCheckpoint::decide_notice(
                Some(existing),
                &stand_in,
                &spot_notice(9_000, 9_120),
                "req-s",
                at(9_000),
                at(9_120),
                LEASE,
            )
        };
        let drained = finished_notice_drain(DrainResult::Drained);
        assert_eq!(
            decide(&drained.clone().as_found_on(&node_cordoned(true))),
            LeaseDecision::AlreadyCompleted
        );
        for history in [
            drained.as_found_on(&node_cordoned(false)),
            finished_notice_drain(DrainResult::PodsLeft),
        ] {
            let (cp, resumed) = claimed(decide(&history));
            assert!(!resumed);
            assert_eq!((cp.started_at, cp.deadline), (at(9_000), at(9_120)));
            assert_eq!((cp.completed_at, cp.result), (None, None));
        }
    }

    #[test]
    fn a_failed_lifecycle_drain_is_not_recorded_as_drained() {
        let lifecycle = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        let failed = lifecycle.finished(at(900), DrainResult::PodsLeft);
        assert_eq!(
            (failed.drained_at, failed.completed_at),
            (None, Some(at(900)))
        );
        assert!(!failed.left_node_drained());
        assert_eq!(failed.lease.holder, None);
        // A duplicate of the same action: done (exactly one completion).
        assert_eq!(
            DrainCheckpoint::decide(
                Some(&failed),
                &action("t"),
                "req-2",
                at(901),
                TIMEOUT,
                LEASE
            ),
            LeaseDecision::AlreadyCompleted
        );
        // The retained instance's final termination: a new action, a full drain.
        let (cp, resumed) = claimed(DrainCheckpoint::decide(
            Some(&failed),
            &action("final"),
            "req-3",
            at(5_000),
            TIMEOUT,
            LEASE,
        ));
        assert!(!resumed);
        assert_eq!((cp.started_at, cp.deadline), (at(5_000), at(5_900)));
        // Its instance shutting down: the notice drains it.
        let (cp, _) = claimed(DrainCheckpoint::decide_notice(
            Some(&failed),
            &notice_of_instance(),
            &spot_notice(5_000, 5_120),
            "req-n",
            at(5_000),
            at(5_120),
            LEASE,
        ));
        assert!(cp.action.is_notice());
        assert_eq!(cp.started_at, at(5_000));
        // A drained one stays done for notices while its node is cordoned.
        let drained = lifecycle.finished(at(100), DrainResult::Drained);
        assert_eq!(drained.drained_at, Some(at(100)));
        assert_eq!(
            DrainCheckpoint::decide_notice(
                Some(&drained.as_found_on(&node_cordoned(true))),
                &notice_of_instance(),
                &spot_notice(150, 270),
                "req-n",
                at(150),
                at(270),
                LEASE,
            ),
            LeaseDecision::AlreadyCompleted
        );
    }

    #[test]
    fn a_record_of_the_previous_release_is_read_and_never_counts_as_drained() {
        // As the previous release wrote a completed drain: no result.
        let json = r#"{"startedAt":"2023-11-14T22:13:20Z","deadline":"2023-11-14T22:28:20Z","action":{"autoScalingGroupName":"eks-demo-ng","lifecycleHookName":"Terminate-LC-Hook","instanceId":"i-07e9ea9eb19a67337","token":"t"},"lease":{"holder":null,"renewedAt":"2023-11-14T22:15:00Z","durationMillis":60000},"continuations":1,"drainedAt":"2023-11-14T22:14:00Z","completedAt":"2023-11-14T22:15:00Z","outOfService":{"labelled":true,"cordoned":true}}"#;
        let old = DrainCheckpoint::parse(json).unwrap();
        assert_eq!(old.result, None);
        assert_eq!(old.completed_at, Some(at(100)));
        assert!(!old.left_node_drained());
        // The same action is still done; a notice drains the node again (it may have been
        // a failed drain); a new action drains it fully.
        assert_eq!(
            DrainCheckpoint::decide(Some(&old), &action("t"), "req-2", at(200), TIMEOUT, LEASE),
            LeaseDecision::AlreadyCompleted
        );
        assert!(matches!(
            DrainCheckpoint::decide_notice(
                Some(&old.clone().as_found_on(&node_cordoned(true))),
                &notice_of_instance(),
                &spot_notice(200, 320),
                "req-n",
                at(200),
                at(320),
                LEASE,
            ),
            LeaseDecision::Claim { resumed: false, .. }
        ));
        let (cp, resumed) = claimed(DrainCheckpoint::decide(
            Some(&old),
            &action("new"),
            "req-3",
            at(300),
            TIMEOUT,
            LEASE,
        ));
        assert!(!resumed);
        assert_eq!(cp.started_at, at(300));
        // Written again, the new field is there; absent, it is not written.
        assert!(!old.to_json().contains("result"));
        let finished = old.finished(at(400), DrainResult::Drained);
        assert!(finished.to_json().contains(r#""result":"drained""#));
    }

    #[test]
    fn a_continuation_takes_over_the_lease_its_predecessor_names_itself_in() {
        let cp = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        // The predecessor's lease is live (its hand-over mark was not written).
        assert!(matches!(
            DrainCheckpoint::decide(Some(&cp), &action("t"), "req-2", at(30), TIMEOUT, LEASE),
            LeaseDecision::HeldByOther { .. }
        ));
        let let_go = cp.clone().handed_over_by("req-1", &action("t"));
        let (next, resumed) = claimed(DrainCheckpoint::decide(
            Some(&let_go),
            &action("t"),
            "req-2",
            at(30),
            TIMEOUT,
            LEASE,
        ));
        assert!(resumed);
        assert_eq!(next.deadline, at(900));
        assert!(next.is_held_by("req-2", at(31)));
        // Another holder, or another action's drain, is not the predecessor's to give.
        assert_eq!(cp.clone().handed_over_by("req-9", &action("t")), cp);
        assert_eq!(cp.clone().handed_over_by("req-1", &action("other")), cp);
    }

    #[test]
    fn a_drain_holds_its_node_while_it_runs_or_while_the_node_stays_cordoned() {
        let with = |checkpoint: &DrainCheckpoint, cordoned: bool| {
            let mut node = node_cordoned(cordoned);
            node.metadata.annotations =
                Some([(CHECKPOINT_ANNOTATION.to_owned(), checkpoint.to_json())].into());
            node
        };
        let running = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        assert!(drain_holds(&with(&running, true)));
        assert!(drain_holds(&with(&running, false)));
        let notice = finished_notice_drain(DrainResult::Drained);
        assert!(drain_holds(&with(&notice, true)));
        assert!(!drain_holds(&with(&notice, false)), "put back in service");
        let mut pooled = running.finished(at(50), DrainResult::Drained);
        pooled.to_warm_pool_at = Some(at(50));
        assert!(!drain_holds(&with(&pooled, true)));
        assert!(!drain_holds(&node_cordoned(true)));
        let mut unreadable = node_cordoned(false);
        unreadable.metadata.annotations =
            Some([(CHECKPOINT_ANNOTATION.to_owned(), "{}".to_owned())].into());
        assert!(drain_holds(&unreadable));
    }

    #[test]
    fn lease_duration_survives_in_millis() {
        let cp = DrainCheckpoint::start(
            &action("t"),
            at(0),
            TIMEOUT,
            "req-1",
            Duration::from_millis(250),
        );
        let json = cp.to_json();
        assert!(json.contains("\"durationMillis\":250"), "{json}");
        assert!(json.contains("\"token\":\"t\""), "{json}");
    }

    // Issue #43 item 8: only a drain whose node goes with its instance takes a running
    // refresh's record over; one undone when the instance stays leaves it the refresh's.
    #[test]
    fn only_a_drain_whose_node_goes_takes_a_refresh_over() {
        let lifecycle = DrainCheckpoint::start(&action("t"), at(0), TIMEOUT, "req-1", LEASE);
        assert!(lifecycle.takes_over_refresh());
        let notice_drain = |kind, code: Option<&str>| {
            let mut drain =
                DrainCheckpoint::start(&notice_of_instance(), at(0), TIMEOUT, "req-n", LEASE);
            drain.notice = Some(InstanceNotice {
                kind,
                received_at: at(0),
                instance_ends_at: None,
                cordon_only: false,
                scheduled_event: code.map(|code| ScheduledEventRef {
                    id: Some("instance-event-1".into()),
                    code: code.into(),
                    health_type_code: None,
                }),
            });
            drain
        };
        assert!(notice_drain(NoticeKind::SpotInterruption, None).takes_over_refresh());
        let retirement = Some("instance-retirement");
        assert!(notice_drain(NoticeKind::ScheduledMaintenance, retirement).takes_over_refresh());
        for (kind, code) in [
            (NoticeKind::ScheduledMaintenance, Some("instance-reboot")),
            (NoticeKind::ScheduledMaintenance, Some("system-maintenance")),
            (NoticeKind::InstanceStopping, None),
            (NoticeKind::RebalanceRecommendation, None),
        ] {
            assert!(
                !notice_drain(kind, code).takes_over_refresh(),
                "{kind:?} {code:?}"
            );
        }
    }

    /// The sweep re-delivers a lost notification by instance (no token): its drain and the
    /// notification's own, if that arrives after all, are one drain, whichever started it.
    #[test]
    fn a_drain_by_instance_and_one_by_token_of_the_same_action_are_one_drain() {
        for (first, second) in [("", "t"), ("t", "")] {
            let cp = DrainCheckpoint::start(&action(first), at(0), TIMEOUT, "req-1", LEASE);
            let (same, resumed) = claimed(DrainCheckpoint::decide(
                Some(&cp),
                &action(second),
                "req-2",
                at(61),
                TIMEOUT,
                LEASE,
            ));
            assert!(resumed, "{first:?} then {second:?}");
            assert_eq!(same.started_at, at(0));
        }
    }

    /// A completed record serves only its own token: the same instance terminated again
    /// (back from a warm pool) under the same names is a new action, drained afresh, never
    /// taken as completed already.
    #[test]
    fn a_completed_record_is_not_taken_for_a_new_action_named_by_instance() {
        for (first, second) in [("", "t"), ("t", ""), ("", "")] {
            let mut cp = DrainCheckpoint::start(&action(first), at(0), TIMEOUT, "req-1", LEASE);
            cp.completed_at = Some(at(100));
            cp.lease.holder = None;
            let decision = DrainCheckpoint::decide(
                Some(&cp),
                &action(second),
                "req-2",
                at(200),
                TIMEOUT,
                LEASE,
            );
            let (fresh, resumed) = claimed(decision);
            assert!(!resumed, "{first:?} then {second:?}");
            assert_eq!(fresh.started_at, at(200));
        }
    }
}
