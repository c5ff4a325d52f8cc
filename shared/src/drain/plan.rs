//! Which of a node's pods the drain evicts, leaves alone or waits for: a pure decision over
//! the pods the API server listed, so it is tested without a cluster.
//!
//! Unlike `kubectl drain`, nothing is refused: the instance is going away whatever happens, so
//! pods with `emptyDir` volumes or without a controller are evicted like any other (their data
//! is lost with the instance anyway). Only pods that eviction cannot or should not move stay:
//! mirror pods (the kubelet owns them; deleting the API object does nothing) and DaemonSet
//! pods (the DaemonSet controller would put them straight back, and they keep the node's
//! networking and logging alive until the very end).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// The annotation the kubelet puts on the API copy of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Priority classes whose pods keep the cluster working (DNS, CNI, metrics): evicted last,
/// after every ordinary pod is gone, so what the ordinary pods need while they shut down
/// stays up.
pub const CRITICAL_PRIORITY_CLASSES: [&str; 2] =
    ["system-cluster-critical", "system-node-critical"];

/// The lowest priority value of the built-in critical classes (`system-cluster-critical`):
/// pods with a custom class at least this high are treated as critical too.
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

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
    /// Evicted in its tier.
    Evict(EvictionTier),
}

impl PodDisposition {
    pub fn of(pod: &Pod) -> Self {
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
        if meta.deletion_timestamp.is_some() {
            Self::AwaitDeletion(tier)
        } else {
            Self::Evict(tier)
        }
    }

    /// Whether the node is not empty while this pod is on it.
    pub fn blocks_drain(self) -> bool {
        matches!(self, Self::AwaitDeletion(_) | Self::Evict(_))
    }
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
    /// Pods left on the node on purpose, with the reason.
    pub skipped: Vec<(PodKey, PodDisposition)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct TierPods {
    evict: Vec<PlannedPod>,
    terminating: Vec<PodKey>,
}

impl DrainPlan {
    /// Plans the drain of the pods listed on the node.
    pub fn new<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut plan = Self::default();
        for pod in pods {
            let Some(key) = PodKey::of(pod) else { continue };
            match PodDisposition::of(pod) {
                PodDisposition::Evict(tier) => {
                    plan.tiers.entry(tier).or_default().evict.push(PlannedPod {
                        key,
                        grace_period_seconds: pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.termination_grace_period_seconds),
                    })
                }
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
        plan.skipped.sort_by(|a, b| a.0.cmp(&b.0));
        plan
    }

    /// Whether no pod that has to go is left: the node is drained.
    pub fn is_drained(&self) -> bool {
        self.tiers
            .values()
            .all(|t| t.evict.is_empty() && t.terminating.is_empty())
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

    /// Every pod still to evict, all tiers (what force deletes at the deadline).
    pub fn all_to_evict(&self) -> impl Iterator<Item = &PlannedPod> {
        self.tiers.values().flat_map(|t| t.evict.iter())
    }

    /// Whether the pod is already being deleted.
    pub fn is_terminating(&self, pod: &PodKey) -> bool {
        self.tiers.values().any(|t| t.terminating.contains(pod))
    }

    /// Every pod that keeps the node from being drained (to evict or terminating).
    pub fn remaining(&self) -> impl Iterator<Item = &PodKey> {
        self.tiers
            .values()
            .flat_map(|t| t.evict.iter().map(|p| &p.key).chain(t.terminating.iter()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
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
}
