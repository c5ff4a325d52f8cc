//! The scheduler: binds unscheduled pods to Ready nodes whose taints (the cordon's
//! included) they tolerate, the emptiest first.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

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
fn tolerates(pod: &Value, (key, value, effect): &(String, String, String)) -> bool {
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
/// kube-scheduler's TaintToleration score counts (weight 3 in the default profile, above
/// ImageLocality's 1 and the resource scores': a node without such a taint wins when one
/// takes the pod).
fn avoided_taints(pod: &Value, node: &Value) -> usize {
    scheduling_taints(node)
        .iter()
        .filter(|taint| taint.2 == "PreferNoSchedule" && !tolerates(pod, taint))
        .count()
}

/// The pod's first container image.
fn first_image(pod: &Value) -> String {
    pod["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

impl Simulation {
    /// Binds unscheduled pods to the node with the fewest pods among those that take them,
    /// first among those without a `PreferNoSchedule` taint the pod does not tolerate (then,
    /// with [`super::SimulationTimings::prefer_cached_images`], first among those that hold
    /// the pod's image):
    /// Ready, and every `NoSchedule`/`NoExecute` taint tolerated, the cordon's included (a
    /// pod tolerating `node.kubernetes.io/unschedulable` may land on a cordoned node, and an
    /// emptying node is the emptiest).
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
        let candidates: Vec<Value> = state
            .iter(nodes, None)
            .filter(|n| schedulable(n))
            .cloned()
            .collect();
        if candidates.is_empty() {
            return;
        }
        let mut load: BTreeMap<String, usize> = candidates
            .iter()
            .map(|n| (meta_str(n, "name").to_owned(), 0))
            .collect();
        for pod in state.iter(pods, None) {
            if let Some(count) = load.get_mut(spec_str(pod, "nodeName")) {
                *count += 1;
            }
        }
        let mut images: BTreeSet<(String, String)> = BTreeSet::new();
        if self.timings.prefer_cached_images {
            for pod in state.iter(pods, None) {
                images.insert((spec_str(pod, "nodeName").to_owned(), first_image(pod)));
            }
        }
        for mut pod in pending {
            let image = first_image(&pod);
            let Some(node) = candidates
                .iter()
                .filter(|n| fits(&pod, n))
                .min_by_key(|n| {
                    let name = meta_str(n, "name");
                    let cached = images.contains(&(name.to_owned(), image.clone()));
                    let load = load.get(name).copied().unwrap_or(usize::MAX);
                    (avoided_taints(&pod, n), !cached, load)
                })
                .map(|n| meta_str(n, "name").to_owned())
            else {
                continue;
            };
            if self.timings.prefer_cached_images {
                images.insert((node.clone(), image));
            }
            if let Some(count) = load.get_mut(&node) {
                *count += 1;
            }
            pod["spec"]["nodeName"] = json!(node);
            update_full(state, pods, pod);
        }
    }
}
