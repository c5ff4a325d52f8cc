//! The scheduler: binds unscheduled pods to Ready nodes whose taints (the cordon's
//! included) they tolerate, the best scored first ([`super::scoring`]).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::scoring::Cluster;
use super::{Simulation, being_deleted, condition_true, resource, spec_str, update_full};
use crate::kube::store::{State, meta_str};

/// The taint a cordoned node carries for the scheduler.
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// The taints the scheduler sees on a node: its own, plus the cordon's `NoSchedule` taint
/// when `spec.unschedulable` is set (what the NodeUnschedulable filter checks).
fn scheduling_taints(node: &Value) -> Vec<(String, String, String)> {
    let mut taints: Vec<(String, String, String)> = node
        .get("spec")
        .and_then(|s| s.get("taints"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| {
            let field = |name: &str| {
                t.get(name)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            (field("key"), field("value"), field("effect"))
        })
        .collect();
    let cordoned = node
        .get("spec")
        .and_then(|s| s.get("unschedulable"))
        .and_then(Value::as_bool)
        == Some(true);
    if cordoned {
        taints.push((
            UNSCHEDULABLE_TAINT.to_owned(),
            String::new(),
            "NoSchedule".to_owned(),
        ));
    }
    taints
}

/// Whether one of the pod's tolerations matches the taint (the scheduler's rules: an empty
/// key with `Exists` matches every key, `Exists` any value, an empty effect every effect).
pub(super) fn tolerates(pod: &Value, (key, value, effect): &(String, String, String)) -> bool {
    pod.get("spec")
        .and_then(|s| s.get("tolerations"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|t| {
            let field = |name: &str| t.get(name).and_then(Value::as_str).unwrap_or_default();
            let exists = field("operator") == "Exists";
            let key_matches = if field("key").is_empty() {
                exists
            } else {
                field("key") == key
            };
            let value_matches = exists || field("value") == value;
            let effect_matches = field("effect").is_empty() || field("effect") == effect;
            key_matches && value_matches && effect_matches
        })
}

/// Whether a node may take pods at all: Ready and not being deleted.
fn schedulable(node: &Value) -> bool {
    condition_true(node, "Ready") && !being_deleted(node)
}

/// Whether `pod` may be placed on `node`: the node takes pods and every `NoSchedule` and
/// `NoExecute` taint on it (the cordon's included) is tolerated.
fn fits(pod: &Value, node: &Value) -> bool {
    schedulable(node)
        && scheduling_taints(node)
            .iter()
            .filter(|(_, _, effect)| effect == "NoSchedule" || effect == "NoExecute")
            .all(|taint| tolerates(pod, taint))
}

/// How many `PreferNoSchedule` taints of the node the pod does not tolerate: what
/// kube-scheduler's TaintToleration score counts.
fn avoided_taints(pod: &Value, node: &Value) -> usize {
    scheduling_taints(node)
        .iter()
        .filter(|taint| taint.2 == "PreferNoSchedule" && !tolerates(pod, taint))
        .count()
}

impl Simulation {
    /// Binds unscheduled pods, one at a time, to the node kube-scheduler's default profile
    /// scores best ([`super::scoring`]) among those that take them: Ready, every
    /// `NoSchedule`/`NoExecute` taint tolerated, the cordon's included (a pod tolerating
    /// `node.kubernetes.io/unschedulable` may land on a cordoned node), and room for it (a
    /// pod slot, and the CPU and memory it requests). A pod no node takes stays Pending.
    pub(super) fn scheduler(&self, state: &mut State) {
        let pods = resource("", "pods");
        let nodes = resource("", "nodes");
        let pending: Vec<Value> = state
            .iter(pods, None)
            .filter(|p| spec_str(p, "nodeName").is_empty() && !being_deleted(p))
            .cloned()
            .collect();
        if pending.is_empty() {
            return;
        }
        let candidates: BTreeMap<String, Value> = state
            .iter(nodes, None)
            .filter(|n| schedulable(n))
            .map(|n| (meta_str(n, "name").to_owned(), n.clone()))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let mut cluster = Cluster::gather(state.iter(nodes, None), state.iter(pods, None));
        for mut pod in pending {
            let feasible: Vec<&str> = candidates
                .iter()
                .filter(|(name, node)| fits(&pod, node) && cluster.has_room_for(name, &pod))
                .map(|(name, _)| name.as_str())
                .collect();
            let avoided = |name: &str| candidates.get(name).map_or(0, |n| avoided_taints(&pod, n));
            let Some(node) = cluster.best(&pod, &feasible, avoided) else {
                continue;
            };
            pod["spec"]["nodeName"] = json!(node);
            cluster.bind(&node, &pod);
            update_full(state, pods, pod);
        }
    }
}
