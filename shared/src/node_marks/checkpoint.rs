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
    pub fn serves(&self, action: &LifecycleActionRef) -> bool {
        *self == Self::from(action)
    }

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
}

impl InstanceNotice {
    /// Both notices in one: the earlier end, draining if either drains, the stronger kind.
    fn merged(&self, newer: &Self) -> Self {
        let instance_ends_at = match (self.instance_ends_at, newer.instance_ends_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let kind = if newer.cordon_only && !self.cordon_only {
            self.kind
        } else {
            newer.kind
        };
        Self {
            kind,
            received_at: self.received_at.min(newer.received_at),
            instance_ends_at,
            cordon_only: self.cordon_only && newer.cordon_only,
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
            out_of_service: None,
            to_warm_pool_at: None,
            notice: None,
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
        if !existing.action.serves(action) {
            return fresh();
        }
        if existing.completed_at.is_some() {
            return LeaseDecision::AlreadyCompleted;
        }
        let mut checkpoint = existing.clone();
        checkpoint.lease = Lease::new(holder, now, lease_duration);
        LeaseDecision::Claim {
            checkpoint,
            resumed: true,
        }
    }

    /// A lifecycle action's drain taking over the notice drain of its instance (the notice
    /// drain ended or let go of its lease): what the notice drain did stays (when it
    /// started, what it took out of service, whether the node is drained), the action is the
    /// lifecycle hook's, and the deadline stays the notice's end when it has one: the
    /// instance goes then whatever the hook's timeout says. A notice that only cordoned
    /// (nothing drained yet) starts the drain's clock now.
    fn adopted_by(
        &self,
        action: &LifecycleActionRef,
        holder: &str,
        now: Timestamp,
        drain_timeout: Duration,
        lease_duration: Duration,
    ) -> LeaseDecision {
        let own_deadline = now.checked_add(drain_timeout).unwrap_or(Timestamp::MAX);
        let mut checkpoint = self.clone();
        checkpoint.action = CheckpointAction::from(action);
        checkpoint.lease = Lease::new(holder, now, lease_duration);
        checkpoint.completed_at = None;
        checkpoint.to_warm_pool_at = None;
        let drained_before = self.notice.as_ref().is_some_and(|n| !n.cordon_only);
        if drained_before {
            checkpoint.deadline = self.deadline.min(own_deadline);
        } else {
            checkpoint.started_at = now;
            checkpoint.deadline = own_deadline;
            checkpoint.drained_at = None;
        }
        if let Some(notice) = checkpoint.notice.as_mut() {
            notice.cordon_only = false;
        }
        LeaseDecision::Claim {
            checkpoint,
            resumed: drained_before,
        }
    }

    /// Decides what an invocation answering an instance `notice` may do given the checkpoint
    /// found on the node. `action` is the instance's [`notice_action`]; `deadline` when the
    /// notice drain must be over.
    ///
    /// - No checkpoint, or a stale one (another instance under the same node name): a new
    ///   notice drain.
    /// - A lifecycle drain of the instance, not completed: [`LeaseDecision::JoinLifecycleDrain`];
    ///   completed: [`LeaseDecision::AlreadyCompleted`] (the node was emptied already).
    /// - A notice drain: busy while another invocation holds it, done once completed, else
    ///   resumed with both notices merged (a cordon-only rebalance followed by the Spot
    ///   warning becomes the Spot drain).
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
        if !existing.action.is_notice() {
            // Completed, the node is drained: also when the instance went to a warm pool
            // (which stops it, a `stopping` notice of our own doing); the launching hook
            // removes the checkpoint when the instance comes back.
            return match existing.completed_at {
                None => LeaseDecision::JoinLifecycleDrain,
                Some(_) => LeaseDecision::AlreadyCompleted,
            };
        }
        if existing.lease.held_by_other(holder, now) {
            return LeaseDecision::HeldByOther {
                holder: existing.lease.holder.clone().unwrap_or_default(),
                until: existing.lease.expires_at(),
            };
        }
        if existing.completed_at.is_some() {
            return LeaseDecision::AlreadyCompleted;
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
        }
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
        let mut done = cp.handed_over(at(60));
        done.completed_at = Some(at(60));
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
        let mut pooled = lifecycle.clone();
        pooled.completed_at = Some(at(50));
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
        let mut completed = lifecycle.clone();
        completed.completed_at = Some(at(50));
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
        let mut ended = notice.handed_over(at(40));
        ended.completed_at = Some(at(40));
        let (cp, resumed) = claimed(DrainCheckpoint::decide(
            Some(&ended),
            &action("t"),
            "req-1",
            at(41),
            TIMEOUT,
            LEASE,
        ));
        assert!(resumed);
        assert!(cp.action.serves(&action("t")));
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
}
