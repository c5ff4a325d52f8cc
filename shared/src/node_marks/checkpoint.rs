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
