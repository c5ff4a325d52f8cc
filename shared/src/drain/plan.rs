//! Which of a node's pods the drain evicts, leaves alone or waits for: a pure decision over
//! the pods the API server listed, so it is tested without a cluster.
//!
//! Unlike `kubectl drain`, nothing is refused: the instance is going away whatever happens, so
//! pods with `emptyDir` volumes or without a controller are evicted like any other (their data
//! is lost with the instance anyway). Only pods that eviction cannot or should not move stay:
//! mirror pods (the kubelet owns them; deleting the API object does nothing) and DaemonSet
//! pods (the DaemonSet controller would put them straight back, and they keep the node's
//! networking and logging alive until the very end).
//!
//! Pods annotated `karpenter.sh/do-not-disrupt: "true"` are not evicted by a voluntary drain:
//! their owner asked that nothing disrupts them voluntarily, and a scale-in, refresh or
//! rebalancing is the operator's choice, not theirs. They hold the drain (the node is not
//! drained while one is there) without holding back the tiers, until the drain deadline,
//! where they are reported (or, with `DRAIN_FORCE`, deleted) like any pod left — what
//! Karpenter does once a node's `terminationGracePeriod` runs out. When the instance goes
//! whatever anyone asks (a Spot interruption, an instance stopping or shutting down, a
//! scheduled retirement, stop or reboot: [`PlanContext::involuntary`]) the annotation does
//! not hold them, as it does not for Karpenter's interruption handling: they are evicted in
//! their tier like the others, their grace cut to the instance's end, instead of dying with
//! the instance without SIGTERM.
//!
//! Two kinds of pods stop holding the drain (see [`PlanContext`]):
//! - a pod whose deletion is overdue (its `deletionTimestamp`, the end of its grace period,
//!   plus `STUCK_POD_SECONDS`), or any pod being deleted on a node that has not been Ready
//!   for that long: a dead kubelet never confirms a deletion, and waiting for it would hold
//!   the instance until the drain deadline. Such pods are reported, not waited for.
//! - a pod bound after the cordon that tolerates `node.kubernetes.io/unschedulable`: its
//!   owner placed it on a cordoned node on purpose (CNI and operator pods tolerate
//!   everything), and evicting it brings a replacement straight back (an emptying node scores
//!   best). Like Karpenter, the drain leaves it: it goes with the instance.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::node_marks::checkpoint::InstanceNotice;

/// The annotation the kubelet puts on the API copy of a static pod.
pub(crate) const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Karpenter's opt-out of voluntary disruption; only the value `"true"` counts.
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";

/// Priority classes whose pods keep the cluster working (DNS, CNI, metrics): evicted last,
/// after every ordinary pod is gone, so what the ordinary pods need while they shut down
/// stays up.
pub(crate) const CRITICAL_PRIORITY_CLASSES: [&str; 2] =
    ["system-cluster-critical", "system-node-critical"];

/// The lowest priority value of the built-in critical classes (`system-cluster-critical`):
/// pods with a custom class at least this high are treated as critical too.
pub(crate) const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The taint a cordoned node carries for the scheduler (`spec.unschedulable`).
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// What the plan needs to know besides the pods: the drain's start, the node's readiness,
/// the clock. [`PlanContext::default`] knows nothing and so waits for every deletion and
/// evicts every late pod (what a plan of one listed snapshot does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanContext {
    pub now: Option<Timestamp>,
    /// When the drain cordoned the node: pods bound later that tolerate the cordon stay.
    pub cordoned_at: Option<Timestamp>,
    /// Since when the node's Ready condition is False or Unknown, when it is.
    pub not_ready_since: Option<Timestamp>,
    /// The UIDs of the pods of this invocation's first complete list of the node (made after
    /// the cordon): a pod missing from it was bound later. The API's timestamps have whole
    /// seconds, so this is what tells a pod bound in the cordon's own second.
    pub first_listed: Option<std::sync::Arc<std::collections::BTreeSet<String>>>,
    /// `STUCK_POD_SECONDS`: how long past its deletion deadline (or after the node stopped
    /// being Ready) a terminating pod is still waited for.
    pub stuck_after: Duration,
    /// When the instance stops running (an instance notice): critical pods are evicted
    /// early enough to end gracefully before it, even while others are still leaving.
    pub instance_ends_at: Option<Timestamp>,
    /// The instance goes whatever anyone asks (see [`is_involuntary`]): pods annotated
    /// `karpenter.sh/do-not-disrupt` are evicted like the others.
    pub involuntary: bool,
}

/// Whether a drain for this instance notice is involuntary for the pods: AWS takes the
/// instance (Spot interruption, stopping or shutting down, a scheduled retirement, stop,
/// reboot or power maintenance) and nothing the pod asks changes that. A rebalance
/// recommendation is only advice, and network maintenance neither stops nor restarts the
/// instance: pods that ask not to be disrupted stay for those. The kind's rule
/// ([`crate::reconcile::notice_kinds`]) decides.
pub fn is_involuntary(notice: &InstanceNotice) -> bool {
    (crate::reconcile::notice_kinds::rules(notice.kind).involuntary)(notice)
}

/// How long before an instance notice's end a pod's grace period must be over: the kubelet
/// still has to stop the containers and report the pod gone before the instance is.
pub const NOTICE_END_MARGIN: Duration = Duration::from_secs(5);

/// A pod's grace period when it has none set: Kubernetes' default.
pub const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 30;

impl PlanContext {
    /// The latest time `pod` can be evicted and still end within its own grace period before
    /// the instance's end; `None` without a notice.
    fn latest_graceful_eviction(&self, pod: &PlannedPod) -> Option<Timestamp> {
        let end = self.instance_ends_at?;
        let grace = pod
            .grace_period_seconds
            .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS)
            .max(0);
        let before = jiff::SignedDuration::from_secs(grace)
            + jiff::SignedDuration::try_from(NOTICE_END_MARGIN).unwrap_or_default();
        Some(end.checked_sub(before).unwrap_or(Timestamp::MIN))
    }

    /// When a pod being deleted since `deletion_timestamp` stops holding the drain.
    fn stuck_at(&self, deletion_timestamp: Timestamp) -> Timestamp {
        let margin =
            jiff::SignedDuration::try_from(self.stuck_after).unwrap_or(jiff::SignedDuration::MAX);
        let overdue = deletion_timestamp
            .checked_add(margin)
            .unwrap_or(Timestamp::MAX);
        let node_dead = self
            .not_ready_since
            .and_then(|since| since.checked_add(margin).ok())
            .unwrap_or(Timestamp::MAX);
        overdue.min(node_dead)
    }

    /// Whether `pod` was bound after the cordon and tolerates it.
    fn tolerating_latecomer(&self, pod: &Pod) -> bool {
        let Some(cordoned_at) = self.cordoned_at else {
            return false;
        };
        let bound_later = bound_at(pod).is_some_and(|at| at > cordoned_at);
        let listed_later = self.first_listed.as_ref().is_some_and(|listed| {
            pod.metadata
                .uid
                .as_ref()
                .is_some_and(|uid| !listed.contains(uid))
        });
        (bound_later || listed_later) && tolerates_cordon(pod)
    }
}

/// When the pod was bound to its node: its `PodScheduled` condition's transition, else its
/// creation (a DaemonSet-style pod created with `nodeName` set).
fn bound_at(pod: &Pod) -> Option<Timestamp> {
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    scheduled.or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Whether one of the pod's tolerations matches the cordon's `NoSchedule` taint (the
/// scheduler's NodeUnschedulable filter lets such a pod onto a cordoned node).
pub(crate) fn tolerates_cordon(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|tolerations| {
            tolerations.iter().any(|t| {
                let key_matches = match t.key.as_deref() {
                    None | Some("") => t.operator.as_deref() == Some("Exists"),
                    Some(key) => key == UNSCHEDULABLE_TAINT,
                };
                let effect_matches =
                    matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
                let value_matches = t.operator.as_deref() == Some("Exists")
                    || t.value.as_deref().unwrap_or_default().is_empty();
                key_matches && effect_matches && value_matches
            })
        })
}

/// The order in which pods are evicted: every pod of a tier is gone before the next starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EvictionTier {
    Ordinary,
    Critical,
}

impl EvictionTier {
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let class = spec.and_then(|s| s.priority_class_name.as_deref());
        let priority = spec.and_then(|s| s.priority);
        if class.is_some_and(|c| CRITICAL_PRIORITY_CLASSES.contains(&c))
            || priority.is_some_and(|p| p >= CRITICAL_PRIORITY)
        {
            Self::Critical
        } else {
            Self::Ordinary
        }
    }
}

/// What the drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodDisposition {
    /// A static pod's mirror: left alone.
    SkipMirror,
    /// Controlled by a DaemonSet: left alone.
    SkipDaemonSet,
    /// Already being deleted (`deletionTimestamp` set): waited for, not evicted again.
    AwaitDeletion(EvictionTier),
    /// Being deleted for longer than its grace period plus `STUCK_POD_SECONDS` (or on a node
    /// NotReady that long): reported, no longer waited for.
    StuckDeletion(EvictionTier),
    /// Bound after the cordon and tolerating it: left on the node (see the module doc).
    SkipToleratesCordon,
    /// Annotated `karpenter.sh/do-not-disrupt: "true"`: never evicted; holds the drain until
    /// its deadline (see the module doc).
    HoldDoNotDisrupt,
    /// Evicted in its tier.
    Evict(EvictionTier),
}

impl PodDisposition {
    pub fn of(pod: &Pod) -> Self {
        Self::in_context(pod, &PlanContext::default())
    }

    /// The disposition of `pod` given what `context` knows about the node and the drain.
    pub fn in_context(pod: &Pod, context: &PlanContext) -> Self {
        let meta = &pod.metadata;
        if meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
        {
            return Self::SkipMirror;
        }
        let daemon_set_controlled = meta.owner_references.iter().flatten().any(|owner| {
            owner.controller == Some(true)
                && owner.kind == "DaemonSet"
                && owner.api_version.starts_with("apps/")
        });
        if daemon_set_controlled {
            return Self::SkipDaemonSet;
        }
        let tier = EvictionTier::of(pod);
        match (&meta.deletion_timestamp, context.now) {
            (Some(deleting), Some(now)) if context.stuck_at(deleting.0) <= now => {
                Self::StuckDeletion(tier)
            }
            (Some(_), _) => Self::AwaitDeletion(tier),
            (None, _) if context.tolerating_latecomer(pod) => Self::SkipToleratesCordon,
            (None, _) if !context.involuntary && asks_not_to_be_disrupted(pod) => {
                Self::HoldDoNotDisrupt
            }
            (None, _) => Self::Evict(tier),
        }
    }

    /// Whether the node is not empty while this pod is on it.
    pub fn blocks_drain(self) -> bool {
        matches!(
            self,
            Self::AwaitDeletion(_) | Self::Evict(_) | Self::HoldDoNotDisrupt
        )
    }
}

/// Whether the pod carries `karpenter.sh/do-not-disrupt: "true"` (Karpenter reads no other
/// value as an opt-out).
pub fn asks_not_to_be_disrupted(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DO_NOT_DISRUPT_ANNOTATION))
        .is_some_and(|value| value == "true")
}

/// One pod, as much of it as the drain needs to act on it and report it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
    /// The UID the eviction is made for (`deleteOptions.preconditions.uid`): a replacement
    /// pod with the same name is a different pod.
    pub uid: String,
}

impl PodKey {
    /// `None` for a pod without namespace, name or UID (never from a real API server).
    pub fn of(pod: &Pod) -> Option<Self> {
        let meta = &pod.metadata;
        Some(Self {
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
        })
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A pod the drain has to see gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPod {
    pub key: PodKey,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
}

/// What to do with the pods on a node right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// Pods to evict and pods already terminating, per tier.
    tiers: BTreeMap<EvictionTier, TierPods>,
    /// Pods left on the node on purpose, with the reason (stuck deletions included).
    pub skipped: Vec<(PodKey, PodDisposition)>,
    /// Pods never evicted that still hold the drain (`karpenter.sh/do-not-disrupt`): apart
    /// from the tiers, so the critical tier does not wait for them.
    held: Vec<PlannedPod>,
    /// When the next pod still waited for becomes a stuck deletion, if any will: the plan
    /// changes then without any pod changing.
    pub next_change_at: Option<Timestamp>,
    /// Critical pods whose turn would come too late for their grace period before the
    /// instance's end (see [`PlanContext::instance_ends_at`]): evicted now, with the tier
    /// before them still leaving.
    due_before_instance_end: Vec<PlannedPod>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct TierPods {
    evict: Vec<PlannedPod>,
    terminating: Vec<PodKey>,
}

impl DrainPlan {
    /// Plans the drain of the pods listed on the node, knowing nothing else.
    pub fn new<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        Self::in_context(pods, &PlanContext::default())
    }

    /// Plans the drain of the pods listed on the node given `context`.
    pub fn in_context<'a>(pods: impl IntoIterator<Item = &'a Pod>, context: &PlanContext) -> Self {
        let mut plan = Self::default();
        for pod in pods {
            let Some(key) = PodKey::of(pod) else { continue };
            let disposition = PodDisposition::in_context(pod, context);
            if let (PodDisposition::AwaitDeletion(_), Some(deleting)) =
                (disposition, &pod.metadata.deletion_timestamp)
            {
                let at = context.stuck_at(deleting.0);
                if context.now.is_some() && at < Timestamp::MAX {
                    plan.next_change_at = Some(plan.next_change_at.map_or(at, |t| t.min(at)));
                }
            }
            let grace_period_seconds = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds);
            match disposition {
                PodDisposition::Evict(tier) => {
                    plan.tiers.entry(tier).or_default().evict.push(PlannedPod {
                        key,
                        grace_period_seconds,
                    })
                }
                PodDisposition::HoldDoNotDisrupt => plan.held.push(PlannedPod {
                    key,
                    grace_period_seconds,
                }),
                PodDisposition::AwaitDeletion(tier) => {
                    plan.tiers.entry(tier).or_default().terminating.push(key)
                }
                skip => plan.skipped.push((key, skip)),
            }
        }
        for tier in plan.tiers.values_mut() {
            tier.evict.sort_by(|a, b| a.key.cmp(&b.key));
            tier.terminating.sort();
        }
        plan.bring_forward_for_instance_end(context);
        plan.skipped.sort_by(|a, b| a.0.cmp(&b.0));
        plan.held.sort_by(|a, b| a.key.cmp(&b.key));
        plan
    }

    /// With an instance notice and the critical tier still waiting: the critical pods that
    /// must be evicted now to end within their own grace period before the instance does;
    /// the next such time becomes a plan change.
    fn bring_forward_for_instance_end(&mut self, context: &PlanContext) {
        let (Some(now), Some(_)) = (context.now, context.instance_ends_at) else {
            return;
        };
        if self.current_tier() != Some(EvictionTier::Ordinary) {
            return;
        }
        let Some(critical) = self.tiers.get(&EvictionTier::Critical) else {
            return;
        };
        for pod in &critical.evict {
            let Some(latest) = context.latest_graceful_eviction(pod) else {
                continue;
            };
            if latest <= now {
                self.due_before_instance_end.push(pod.clone());
            } else {
                self.next_change_at = Some(self.next_change_at.map_or(latest, |t| t.min(latest)));
            }
        }
    }

    /// The critical pods to evict now although the tier before them is still leaving (see
    /// [`PlanContext::instance_ends_at`]).
    pub fn due_before_instance_end(&self) -> &[PlannedPod] {
        &self.due_before_instance_end
    }

    /// Whether no pod that has to go is left: the node is drained.
    pub fn is_drained(&self) -> bool {
        self.held.is_empty()
            && self
                .tiers
                .values()
                .all(|t| t.evict.is_empty() && t.terminating.is_empty())
    }

    /// Whether any pod of any tier is still to be evicted (not yet seen terminating).
    pub fn has_pods_to_evict(&self) -> bool {
        self.tiers.values().any(|t| !t.evict.is_empty())
    }

    /// The tier being drained now: the first one with any pod left.
    pub fn current_tier(&self) -> Option<EvictionTier> {
        self.tiers
            .iter()
            .find(|(_, t)| !t.evict.is_empty() || !t.terminating.is_empty())
            .map(|(tier, _)| *tier)
    }

    /// The pods to evict now: those of the current tier that are not already terminating.
    /// Later tiers wait until the current one is empty.
    pub fn to_evict_now(&self) -> &[PlannedPod] {
        self.current_tier()
            .and_then(|tier| self.tiers.get(&tier))
            .map(|t| t.evict.as_slice())
            .unwrap_or_default()
    }

    /// Every pod force deletes at the deadline if it is still there: those still to evict,
    /// all tiers, then the held ones (no eviction moves them; force deletes every pod left).
    pub fn all_to_evict(&self) -> impl Iterator<Item = &PlannedPod> {
        self.tiers
            .values()
            .flat_map(|t| t.evict.iter())
            .chain(self.held.iter())
    }

    /// The pods never evicted that hold the drain (`karpenter.sh/do-not-disrupt`).
    pub fn held(&self) -> &[PlannedPod] {
        &self.held
    }

    /// Whether the pod is held (never evicted).
    pub fn is_held(&self, pod: &PodKey) -> bool {
        self.held.iter().any(|p| p.key == *pod)
    }

    /// The tiers in eviction order, each with its pods to evict and its pods already
    /// terminating: what a preview of the drain (the `drain-plan` tool) shows.
    pub fn tiers(&self) -> impl Iterator<Item = (EvictionTier, &[PlannedPod], &[PodKey])> {
        self.tiers
            .iter()
            .map(|(tier, pods)| (*tier, pods.evict.as_slice(), pods.terminating.as_slice()))
    }

    /// Whether the pod is already being deleted.
    pub fn is_terminating(&self, pod: &PodKey) -> bool {
        self.tiers.values().any(|t| t.terminating.contains(pod))
    }

    /// The pods whose deletion is stuck (no longer waited for).
    pub fn stuck(&self) -> impl Iterator<Item = &PodKey> {
        self.skipped
            .iter()
            .filter(|(_, d)| matches!(d, PodDisposition::StuckDeletion(_)))
            .map(|(k, _)| k)
    }

    /// The pods left because they came back after the cordon and tolerate it.
    pub fn tolerating_latecomers(&self) -> impl Iterator<Item = &PodKey> {
        self.skipped
            .iter()
            .filter(|(_, d)| *d == PodDisposition::SkipToleratesCordon)
            .map(|(k, _)| k)
    }

    /// Every pod that keeps the node from being drained (to evict, terminating, or held).
    pub fn remaining(&self) -> impl Iterator<Item = &PodKey> {
        self.tiers
            .values()
            .flat_map(|t| t.evict.iter().map(|p| &p.key).chain(t.terminating.iter()))
            .chain(self.held.iter().map(|p| &p.key))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::node_marks::checkpoint::NoticeKind;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use serde_json::json;

    fn pod(namespace: &str, name: &str, extra: serde_json::Value) -> Pod {
        let mut value = json!({
            "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{name}")},
            "spec": {"nodeName": "n1", "containers": []},
        });
        merge(&mut value, extra);
        serde_json::from_value(value).unwrap()
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    fn owned_by(kind: &str, api_version: &str, controller: bool) -> serde_json::Value {
        let owner = OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "owner".into(),
            uid: "owner-uid".into(),
            controller: Some(controller),
            block_owner_deletion: None,
        };
        json!({"metadata": {"ownerReferences": [owner]}})
    }

    fn reference_node_pods() -> Vec<Pod> {
        vec![
            pod(
                "default",
                "nginx-7c5ddbdf54-abcde",
                owned_by("ReplicaSet", "apps/v1", true),
            ),
            pod(
                "kube-system",
                "coredns-5c5677bc78-xyz12",
                merge_all([
                    owned_by("ReplicaSet", "apps/v1", true),
                    json!({"spec": {"priorityClassName": "system-cluster-critical", "priority": 2000000000}}),
                ]),
            ),
            pod(
                "kube-system",
                "aws-node-q7x2k",
                merge_all([
                    owned_by("DaemonSet", "apps/v1", true),
                    json!({"spec": {"priorityClassName": "system-node-critical"}}),
                ]),
            ),
            pod(
                "kube-system",
                "kube-proxy-8kq4d",
                owned_by("DaemonSet", "apps/v1", true),
            ),
        ]
    }

    fn merge_all<const N: usize>(values: [serde_json::Value; N]) -> serde_json::Value {
        let mut out = json!({});
        for v in values {
            merge(&mut out, v);
        }
        out
    }

    fn names(pods: &[PlannedPod]) -> Vec<&str> {
        pods.iter().map(|p| p.key.name.as_str()).collect()
    }

    #[test]
    fn reference_node_evicts_nginx_first_then_coredns_and_leaves_daemon_sets() {
        let pods = reference_node_pods();
        let plan = DrainPlan::new(&pods);
        assert_eq!(plan.current_tier(), Some(EvictionTier::Ordinary));
        assert_eq!(names(plan.to_evict_now()), ["nginx-7c5ddbdf54-abcde"]);
        let skipped: Vec<_> = plan
            .skipped
            .iter()
            .map(|(k, d)| (k.name.as_str(), *d))
            .collect();
        assert_eq!(
            skipped,
            [
                ("aws-node-q7x2k", PodDisposition::SkipDaemonSet),
                ("kube-proxy-8kq4d", PodDisposition::SkipDaemonSet)
            ]
        );
        // nginx gone: coredns is next.
        let plan = DrainPlan::new(pods.iter().skip(1));
        assert_eq!(plan.current_tier(), Some(EvictionTier::Critical));
        assert_eq!(names(plan.to_evict_now()), ["coredns-5c5677bc78-xyz12"]);
        assert!(!plan.is_drained());
        let plan = DrainPlan::new(pods.iter().skip(2));
        assert!(plan.is_drained());
        assert!(plan.to_evict_now().is_empty());
    }

    #[test]
    fn tiers_list_every_pod_to_evict_ordinary_first() {
        let pods = reference_node_pods();
        let plan = DrainPlan::new(&pods);
        let tiers: Vec<(EvictionTier, Vec<&str>)> = plan
            .tiers()
            .map(|(tier, evict, terminating)| {
                assert!(terminating.is_empty());
                (tier, names(evict))
            })
            .collect();
        assert_eq!(
            tiers,
            [
                (EvictionTier::Ordinary, vec!["nginx-7c5ddbdf54-abcde"]),
                (EvictionTier::Critical, vec!["coredns-5c5677bc78-xyz12"]),
            ]
        );
    }

    #[test]
    fn mirror_pods_are_left_and_unmanaged_and_empty_dir_pods_are_evicted() {
        let pods = vec![
            pod(
                "kube-system",
                "etcd-n1",
                json!({"metadata": {"annotations": {MIRROR_POD_ANNOTATION: "abc"}}}),
            ),
            pod("default", "bare", json!({})),
            pod(
                "default",
                "scratch",
                json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}], "terminationGracePeriodSeconds": 5}}),
            ),
        ];
        let plan = DrainPlan::new(&pods);
        assert_eq!(names(plan.to_evict_now()), ["bare", "scratch"]);
        assert_eq!(plan.to_evict_now()[1].grace_period_seconds, Some(5));
        assert_eq!(plan.skipped[0].1, PodDisposition::SkipMirror);
    }

    #[test]
    fn terminating_pods_are_waited_for_and_hold_back_the_next_tier() {
        let deleting = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let pods = vec![
            pod(
                "default",
                "leaving",
                json!({"metadata": {"deletionTimestamp": deleting}}),
            ),
            pod(
                "kube-system",
                "critical",
                json!({"spec": {"priorityClassName": "system-node-critical"}}),
            ),
        ];
        let plan = DrainPlan::new(&pods);
        assert_eq!(plan.current_tier(), Some(EvictionTier::Ordinary));
        assert!(
            plan.to_evict_now().is_empty(),
            "critical waits for the terminating pod"
        );
        let remaining: Vec<_> = plan.remaining().map(|k| k.name.as_str()).collect();
        assert_eq!(remaining, ["leaving", "critical"]);
        assert_eq!(
            names(&plan.all_to_evict().cloned().collect::<Vec<_>>()),
            ["critical"]
        );
    }

    fn do_not_disrupt(value: &str) -> serde_json::Value {
        json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: value}}})
    }

    #[test]
    fn a_do_not_disrupt_pod_is_held_apart_from_the_tiers_and_keeps_the_node_undrained() {
        let pods = vec![
            pod("default", "batch", do_not_disrupt("true")),
            pod("default", "web", json!({})),
            pod(
                "kube-system",
                "dns",
                json!({"spec": {"priorityClassName": "system-cluster-critical"}}),
            ),
        ];
        let plan = DrainPlan::new(&pods);
        assert_eq!(names(plan.to_evict_now()), ["web"]);
        assert_eq!(names(plan.held()), ["batch"]);
        assert!(plan.skipped.is_empty(), "{plan:?}");
        // web gone: the critical tier is next; the held pod does not hold it back.
        let plan = DrainPlan::new([&pods[0], &pods[2]]);
        assert_eq!(plan.current_tier(), Some(EvictionTier::Critical));
        assert_eq!(names(plan.to_evict_now()), ["dns"]);
        // Only the held pod left: nothing to evict, yet the node is not drained.
        let plan = DrainPlan::new([&pods[0]]);
        assert!(plan.to_evict_now().is_empty());
        assert_eq!(plan.current_tier(), None);
        assert!(!plan.is_drained());
        let remaining: Vec<_> = plan.remaining().map(|k| k.name.as_str()).collect();
        assert_eq!(remaining, ["batch"]);
        assert!(plan.is_held(&PodKey::of(&pods[0]).unwrap()));
        // Force deletes it at the deadline like any pod left.
        assert_eq!(
            names(&plan.all_to_evict().cloned().collect::<Vec<_>>()),
            ["batch"]
        );
        assert!(PodDisposition::HoldDoNotDisrupt.blocks_drain());
    }

    #[test]
    fn an_involuntary_drain_evicts_a_do_not_disrupt_pod_in_its_tier() {
        let pods = vec![
            pod("default", "batch", do_not_disrupt("true")),
            pod("default", "web", json!({})),
        ];
        let involuntary = PlanContext {
            involuntary: true,
            ..PlanContext::default()
        };
        let plan = DrainPlan::in_context(&pods, &involuntary);
        assert_eq!(names(plan.to_evict_now()), ["batch", "web"]);
        assert!(plan.held().is_empty(), "{plan:?}");
        for kind in [
            NoticeKind::SpotInterruption,
            NoticeKind::InstanceStopping,
            NoticeKind::ScheduledMaintenance,
        ] {
            assert!(is_involuntary(&notice_of(kind, None)), "{kind:?}");
        }
        assert!(!is_involuntary(&notice_of(
            NoticeKind::RebalanceRecommendation,
            None
        )));
    }

    fn notice_of(kind: NoticeKind, event: Option<(&str, &str)>) -> InstanceNotice {
        InstanceNotice {
            kind,
            received_at: Timestamp::UNIX_EPOCH,
            instance_ends_at: None,
            cordon_only: false,
            scheduled_event: event.map(|(code, type_code)| {
                crate::node_marks::maintenance::ScheduledEventRef {
                    id: Some("instance-event-0a1b2c3d4e5f60718".into()),
                    code: code.into(),
                    health_type_code: Some(type_code.into()),
                }
            }),
        }
    }

    // Issue #43 item 6: network maintenance neither stops nor restarts the instance, so its
    // drain is voluntary (`karpenter.sh/do-not-disrupt` pods stay); every other scheduled
    // change takes the instance down under its pods.
    #[test]
    fn only_network_maintenance_is_a_voluntary_scheduled_change() {
        let maintenance = |code, type_code| {
            is_involuntary(&notice_of(
                NoticeKind::ScheduledMaintenance,
                Some((code, type_code)),
            ))
        };
        assert!(!maintenance(
            "system-maintenance",
            "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED"
        ));
        for (code, type_code) in [
            (
                "system-maintenance",
                "AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED",
            ),
            ("system-maintenance", "AWS_EC2_SYSTEM_MAINTENANCE_SCHEDULED"),
            (
                "instance-reboot",
                "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
            ),
            (
                "system-reboot",
                "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
            ),
            (
                "instance-retirement",
                "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED",
            ),
            ("instance-stop", "AWS_EC2_INSTANCE_STOP_SCHEDULED"),
        ] {
            assert!(maintenance(code, type_code), "{type_code}");
        }
    }

    #[test]
    fn only_the_value_true_holds_a_pod_and_deletions_and_daemon_sets_come_first() {
        for value in ["false", "yes", ""] {
            let pods = vec![pod("default", "p", do_not_disrupt(value))];
            assert_eq!(
                names(DrainPlan::new(&pods).to_evict_now()),
                ["p"],
                "{value}"
            );
        }
        let deleting = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let pods = vec![
            pod(
                "default",
                "leaving",
                merge_all([
                    do_not_disrupt("true"),
                    json!({"metadata": {"deletionTimestamp": deleting}}),
                ]),
            ),
            pod(
                "kube-system",
                "agent",
                merge_all([
                    do_not_disrupt("true"),
                    owned_by("DaemonSet", "apps/v1", true),
                ]),
            ),
        ];
        let plan = DrainPlan::new(&pods);
        assert!(plan.held().is_empty(), "{plan:?}");
        assert!(plan.is_terminating(&PodKey::of(&pods[0]).unwrap()));
        assert_eq!(plan.skipped[0].1, PodDisposition::SkipDaemonSet);
    }

    #[test]
    fn only_a_controlling_daemon_set_owner_keeps_a_pod() {
        let pods = vec![
            pod(
                "default",
                "not-controller",
                owned_by("DaemonSet", "apps/v1", false),
            ),
            pod(
                "default",
                "other-group",
                owned_by("DaemonSet", "example.com/v1", true),
            ),
        ];
        let plan = DrainPlan::new(&pods);
        assert_eq!(
            names(plan.to_evict_now()),
            ["not-controller", "other-group"]
        );
        assert!(plan.skipped.is_empty());
    }

    #[test]
    fn high_custom_priority_is_critical() {
        let pods = vec![pod(
            "default",
            "p",
            json!({"spec": {"priority": 2000001000}}),
        )];
        assert_eq!(
            DrainPlan::new(&pods).current_tier(),
            Some(EvictionTier::Critical)
        );
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    #[test]
    fn before_an_instance_end_critical_pods_go_in_time_to_end_gracefully() {
        let pods = vec![
            pod(
                "default",
                "web",
                json!({"spec": {"terminationGracePeriodSeconds": 300}}),
            ),
            pod(
                "kube-system",
                "dns",
                json!({"spec": {"priorityClassName": "system-cluster-critical", "terminationGracePeriodSeconds": 30}}),
            ),
        ];
        // The instance ends at 120: dns must be evicted by 120 - 30 - 5 = 85.
        let mut ctx = context(0);
        ctx.instance_ends_at = Some(at(120));
        let early = DrainPlan::in_context(&pods, &ctx);
        assert_eq!(names(early.to_evict_now()), ["web"]);
        assert!(early.due_before_instance_end().is_empty());
        assert_eq!(early.next_change_at, Some(at(85)), "woken when dns is due");
        ctx.now = Some(at(85));
        let due = DrainPlan::in_context(&pods, &ctx);
        assert_eq!(names(due.to_evict_now()), ["web"]);
        assert_eq!(names(due.due_before_instance_end()), ["dns"]);
        // Without a notice, critical pods wait for the others whatever the time.
        ctx.instance_ends_at = None;
        assert!(
            DrainPlan::in_context(&pods, &ctx)
                .due_before_instance_end()
                .is_empty()
        );
    }

    fn context(now: i64) -> PlanContext {
        PlanContext {
            instance_ends_at: None,
            now: Some(at(now)),
            cordoned_at: Some(at(0)),
            not_ready_since: None,
            first_listed: None,
            stuck_after: Duration::from_secs(60),
            involuntary: false,
        }
    }

    #[test]
    fn an_overdue_deletion_stops_holding_the_drain_and_the_next_tier() {
        let deleting = Time(at(30));
        let pods = vec![
            pod(
                "default",
                "stuck",
                json!({"metadata": {"deletionTimestamp": deleting}}),
            ),
            pod(
                "kube-system",
                "critical",
                json!({"spec": {"priorityClassName": "system-node-critical"}}),
            ),
        ];
        // Before the grace end plus the margin: waited for, and the plan says when that ends.
        let plan = DrainPlan::in_context(&pods, &context(89));
        assert!(plan.to_evict_now().is_empty());
        assert_eq!(plan.next_change_at, Some(at(90)));
        assert_eq!(plan.stuck().count(), 0);
        // After it: reported as stuck, and the critical tier goes on.
        let plan = DrainPlan::in_context(&pods, &context(90));
        assert_eq!(
            plan.stuck().map(|k| k.name.as_str()).collect::<Vec<_>>(),
            ["stuck"]
        );
        assert_eq!(names(plan.to_evict_now()), ["critical"]);
        // Without a clock (the snapshot plan) it is waited for as before.
        assert!(DrainPlan::new(&pods).to_evict_now().is_empty());
    }

    #[test]
    fn on_a_node_not_ready_for_the_margin_every_deletion_is_stuck() {
        let pods = vec![pod(
            "default",
            "long-grace",
            json!({"metadata": {"deletionTimestamp": Time(at(3600))}}),
        )];
        let mut ctx = context(70);
        assert!(!DrainPlan::in_context(&pods, &ctx).is_drained());
        ctx.not_ready_since = Some(at(10));
        let plan = DrainPlan::in_context(&pods, &ctx);
        assert!(plan.is_drained(), "{plan:?}");
        assert_eq!(plan.stuck().count(), 1);
        ctx.not_ready_since = Some(at(20));
        let plan = DrainPlan::in_context(&pods, &ctx);
        assert!(!plan.is_drained());
        assert_eq!(plan.next_change_at, Some(at(80)));
    }

    #[test]
    fn a_tolerating_pod_bound_after_the_cordon_is_left_and_others_are_evicted() {
        let tolerate_all = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        let created = |t: i64| json!({"metadata": {"creationTimestamp": Time(at(t))}});
        let pods = vec![
            // There before the cordon: evicted even though it tolerates it.
            pod(
                "default",
                "before",
                merge_all([tolerate_all.clone(), created(-5)]),
            ),
            // Came back after the cordon and tolerates it: left.
            pod(
                "default",
                "after",
                merge_all([tolerate_all.clone(), created(5)]),
            ),
            // Tolerates only the cordon's key: left too.
            pod(
                "default",
                "keyed",
                merge_all([
                    json!({"spec": {"tolerations": [{"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]}}),
                    created(5),
                ]),
            ),
            // Bound after the cordon without tolerating it (a stale scheduler): evicted.
            pod("default", "stale", created(5)),
            // Tolerates something else only: evicted.
            pod(
                "default",
                "other",
                merge_all([
                    json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}),
                    created(5),
                ]),
            ),
        ];
        let plan = DrainPlan::in_context(&pods, &context(10));
        assert_eq!(names(plan.to_evict_now()), ["before", "other", "stale"]);
        let left: Vec<_> = plan
            .tolerating_latecomers()
            .map(|k| k.name.as_str())
            .collect();
        assert_eq!(left, ["after", "keyed"]);
        // Without the cordon time nothing is left.
        assert_eq!(DrainPlan::new(&pods).to_evict_now().len(), 5);
        // Timestamps have whole seconds: a tolerating pod bound in the cordon's own second is
        // told by its absence from the first list made after the cordon.
        let same_second = vec![pod(
            "default",
            "same",
            merge_all([tolerate_all, created(0)]),
        )];
        assert_eq!(
            DrainPlan::in_context(&same_second, &context(10))
                .to_evict_now()
                .len(),
            1
        );
        let mut listed = context(10);
        listed.first_listed = Some(std::sync::Arc::new(["uid-before".to_owned()].into()));
        let plan = DrainPlan::in_context(&same_second, &listed);
        assert!(plan.is_drained(), "{plan:?}");
    }
}
