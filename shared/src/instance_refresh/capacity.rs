//! What the cluster's Nodes and Pods say about room, for the progressive marking
//! ([`super::room`]): the free capacity of a node (allocatable minus the requests of the
//! pods bound to it) and the requests of the pods a drain would move (pure).
//!
//! Three resources are counted, as kube-scheduler's `NodeResourcesFit` counts them for
//! every pod: CPU (millicores), memory (bytes) and the pod count. A pod's request is what
//! the scheduler reserves for it: the larger of the sum of its containers' requests and
//! its largest init container's, plus the pod's `overhead`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// An amount of the three resources the rule counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pods: u64,
}

impl Resources {
    /// Whether `self` fits in `room`, resource by resource.
    pub fn fits_in(&self, room: &Self) -> bool {
        self.cpu_millis <= room.cpu_millis
            && self.memory_bytes <= room.memory_bytes
            && self.pods <= room.pods
    }

    /// `self` minus `used`, never below zero.
    pub fn minus(&self, used: &Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_sub(used.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_sub(used.memory_bytes),
            pods: self.pods.saturating_sub(used.pods),
        }
    }

    pub fn plus(&self, other: &Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
            pods: self.pods.saturating_add(other.pods),
        }
    }

    fn each_max(&self, other: &Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.max(other.cpu_millis),
            memory_bytes: self.memory_bytes.max(other.memory_bytes),
            pods: self.pods.max(other.pods),
        }
    }
}

/// A Kubernetes quantity (`4`, `3500m`, `16Gi`, `1e3`, `512M`) in its base unit times
/// `scale` (1000 for millicores), rounded up; `None` when it is not a quantity.
pub fn parse_quantity(quantity: &str, scale: f64) -> Option<u64> {
    let text = quantity.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent => {
            let power: i32 = exponent.strip_prefix(['e', 'E'])?.parse().ok()?;
            10f64.powi(power)
        }
    };
    let value = (number * multiplier * scale).ceil();
    (value.is_finite() && value >= 0.0).then(|| value.min(u64::MAX as f64) as u64)
}

/// The three resources of a `cpu`/`memory`/`pods` map. `unknown` is what a quantity that
/// does not parse counts for: nothing for room (never claim room that is not proven),
/// everything for a request (a pod we cannot size fits nowhere).
fn resources_of(map: Option<&BTreeMap<String, Quantity>>, pods: u64, unknown: u64) -> Resources {
    let amount = |name: &str, scale: f64| {
        map.and_then(|m| m.get(name))
            .map_or(0, |q| parse_quantity(&q.0, scale).unwrap_or(unknown))
    };
    Resources {
        cpu_millis: amount("cpu", 1000.0),
        memory_bytes: amount("memory", 1.0),
        pods,
    }
}

fn requests_of(resources: Option<&ResourceRequirements>) -> Resources {
    resources_of(resources.and_then(|r| r.requests.as_ref()), 0, u64::MAX)
}

/// What the scheduler reserves for `pod`: containers' requests summed, or the largest init
/// container's if larger, plus the overhead; one pod.
pub fn pod_request(pod: &Pod) -> Resources {
    let Some(spec) = pod.spec.as_ref() else {
        return Resources {
            pods: 1,
            ..Resources::default()
        };
    };
    let containers = spec.containers.iter().fold(Resources::default(), |sum, c| {
        sum.plus(&requests_of(c.resources.as_ref()))
    });
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .fold(Resources::default(), |largest, c| {
            largest.each_max(&requests_of(c.resources.as_ref()))
        });
    let overhead = resources_of(spec.overhead.as_ref(), 0, u64::MAX);
    Resources {
        pods: 1,
        ..containers.each_max(&init).plus(&overhead)
    }
}

/// Whether `pod` still holds its place on its node (not `Succeeded` nor `Failed`).
pub fn holds_a_place(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Whether a drain of the node would move `pod` somewhere else: not a DaemonSet's (its
/// controller does not reschedule it elsewhere), not a mirror pod, not finished, not being
/// deleted (its controller created its replacement already, which holds its own place; on a
/// dead node such a pod stays `Terminating` until the Node goes, and counting it would keep
/// the room short for good).
pub fn moves_on_drain(pod: &Pod) -> bool {
    let daemon = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.kind == "DaemonSet" && owner.controller == Some(true));
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let deleted = pod.metadata.deletion_timestamp.is_some();
    !daemon && !mirror && !deleted && holds_a_place(pod)
}

/// The node `pod` is bound to.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// What `node` offers to the scheduler: its allocatable (nothing when it reports none).
pub fn allocatable(node: &Node) -> Resources {
    let map = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let pods = map
        .and_then(|m| m.get("pods"))
        .and_then(|q| parse_quantity(&q.0, 1.0))
        .unwrap_or(0);
    resources_of(map, pods, 0)
}

/// Whether new pods can be scheduled onto `node` at all: Ready, not cordoned, and no
/// `NoSchedule` or `NoExecute` taint (the pods to move may not tolerate it).
pub fn accepts_new_pods(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let repelling = spec.and_then(|s| s.taints.as_ref()).is_some_and(|taints| {
        taints
            .iter()
            .any(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
    });
    crate::lifecycle::node::is_ready(node) && !cordoned && !repelling
}

/// Whether `node` is out of service already (cordoned by this refresh, a drain, or anyone):
/// the room rule keeps it marked whatever its pods.
fn out_of_service(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// Whether the room rule needs the pods to decide: some `outdated` node is still in
/// service. When every outdated node is out of service already (or has no Node), the rule
/// marks them all, whatever their pods and the room: the pods need not be listed.
pub fn decision_needs_pods(
    nodes: &[Node],
    outdated: &BTreeMap<&str, Option<jiff::Timestamp>>,
) -> bool {
    nodes.iter().any(|node| {
        crate::lifecycle::node::node_instance_id(node)
            .is_some_and(|id| outdated.contains_key(id) && !out_of_service(node))
    })
}

/// What the pods placed on each node use and what its drain would move, tallied pod by pod
/// as the pages of a list come in: a cluster's pods are never held at once (150,000 of
/// them, as objects, would not fit the function's memory; their tallies take a few MB).
#[derive(Debug, Default)]
pub struct PodTally {
    by_node: BTreeMap<String, NodeTally>,
}

#[derive(Debug, Default)]
struct NodeTally {
    /// The requests of every pod that holds a place on the node.
    used: Resources,
    /// The requests of the pods its drain would move.
    to_move: Vec<Resources>,
}

impl PodTally {
    /// The tally of `pods`.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut tally = Self::default();
        pods.into_iter().for_each(|pod| tally.add(pod));
        tally
    }

    /// Counts `pod` on its node (a pod bound to no node, or finished, counts nowhere).
    pub fn add(&mut self, pod: &Pod) {
        let Some(node) = node_of(pod).filter(|_| holds_a_place(pod)) else {
            return;
        };
        let request = pod_request(pod);
        let tally = match self.by_node.get_mut(node) {
            Some(tally) => tally,
            None => self.by_node.entry(node.to_owned()).or_default(),
        };
        tally.used = tally.used.plus(&request);
        if moves_on_drain(pod) {
            tally.to_move.push(request);
        }
    }

    fn on(&self, node: &str) -> Option<&NodeTally> {
        self.by_node.get(node)
    }
}

/// The room rule's inputs from the cluster: the free capacity of every node that accepts
/// new pods and is not `outdated` (instance id → launch time), and each outdated node with
/// a Node, whether it is out of service and the requests of the pods its drain would move.
pub fn survey(
    nodes: &[Node],
    pods: &PodTally,
    outdated: &BTreeMap<&str, Option<jiff::Timestamp>>,
) -> (Vec<Resources>, Vec<super::room::OutdatedNode>) {
    let mut room = Vec::new();
    let mut outdated_nodes = Vec::new();
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let tally = pods.on(name);
        let instance = crate::lifecycle::node::node_instance_id(node);
        match instance.and_then(|id| Some((id, outdated.get(id)?))) {
            Some((instance_id, launched)) => outdated_nodes.push(super::room::OutdatedNode {
                instance_id: instance_id.to_owned(),
                launched: *launched,
                out_of_service: out_of_service(node),
                pods_to_move: tally.map(|t| t.to_move.clone()).unwrap_or_default(),
            }),
            None if accepts_new_pods(node) => {
                let used = tally.map(|t| t.used).unwrap_or_default();
                room.push(allocatable(node).minus(&used));
            }
            None => {}
        }
    }
    (room, outdated_nodes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_in_every_suffix() {
        assert_eq!(parse_quantity("4", 1000.0), Some(4000));
        assert_eq!(parse_quantity("3500m", 1000.0), Some(3500));
        assert_eq!(parse_quantity("0.5", 1000.0), Some(500));
        assert_eq!(parse_quantity("16Gi", 1.0), Some(16 << 30));
        assert_eq!(parse_quantity("512M", 1.0), Some(512_000_000));
        assert_eq!(parse_quantity("1e3", 1.0), Some(1000));
        assert_eq!(parse_quantity("1k", 1.0), Some(1000));
        assert_eq!(parse_quantity("110", 1.0), Some(110));
        for bad in ["", "lots", "4Zi", "-1"] {
            assert_eq!(parse_quantity(bad, 1.0), None, "{bad}");
        }
    }

    #[test]
    fn a_pods_request_is_what_the_scheduler_reserves() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "250m"}}},
                ],
                "initContainers": [
                    {"name": "i", "resources": {"requests": {"cpu": "2", "memory": "64Mi"}}},
                ],
                "overhead": {"cpu": "100m"},
            },
        }))
        .unwrap();
        assert_eq!(
            pod_request(&pod),
            Resources {
                cpu_millis: 2100,
                memory_bytes: 1 << 30,
                pods: 1
            }
        );
    }

    #[test]
    fn room_needs_ready_schedulable_untainted_nodes_and_counts_nothing_unproven() {
        let node = |spec: serde_json::Value, ready: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": "n"},
                "spec": spec,
                "status": {
                    "conditions": [{"type": "Ready", "status": ready}],
                    "allocatable": {"cpu": "2", "memory": "lots", "pods": "10"},
                },
            }))
            .unwrap()
        };
        let ready = node(json!({}), "True");
        assert!(accepts_new_pods(&ready));
        assert_eq!(
            allocatable(&ready),
            Resources {
                cpu_millis: 2000,
                memory_bytes: 0,
                pods: 10
            },
            "an unreadable quantity is no room"
        );
        assert!(!accepts_new_pods(&node(json!({}), "False")));
        assert!(!accepts_new_pods(&node(
            json!({"unschedulable": true}),
            "True"
        )));
        assert!(!accepts_new_pods(&node(
            json!({"taints": [{"key": "k", "effect": "NoSchedule"}]}),
            "True"
        )));
        assert!(accepts_new_pods(&node(
            json!({"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}),
            "True"
        )));
    }

    #[test]
    fn the_pods_are_needed_only_while_an_outdated_node_is_in_service() {
        let node = |instance: &str, cordoned: bool| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": instance},
                "spec": {
                    "providerID": format!("aws:///eu-west-1a/{instance}"),
                    "unschedulable": cordoned,
                },
            }))
            .unwrap()
        };
        let outdated =
            BTreeMap::from([("i-0000000000000000a", None), ("i-0000000000000000b", None)]);
        let marked = node("i-0000000000000000a", true);
        let in_service = node("i-0000000000000000b", false);
        let other = node("i-0000000000000000c", false);
        assert!(decision_needs_pods(
            &[marked.clone(), in_service, other.clone()],
            &outdated
        ));
        assert!(
            !decision_needs_pods(&[marked, other.clone()], &outdated),
            "every outdated node with a Node is out of service; another group's node is room"
        );
        assert!(
            !decision_needs_pods(&[other], &BTreeMap::new()),
            "nothing outdated"
        );
    }

    #[test]
    fn the_survey_counts_room_on_nodes_that_stay_and_the_pods_a_drain_moves() {
        let node = |name: &str, instance: &str, spec: serde_json::Value| -> Node {
            let mut spec = spec;
            spec["providerID"] = json!(format!("aws:///eu-west-1a/{instance}"));
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": spec,
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "10"},
                },
            }))
            .unwrap()
        };
        let pod = |name: &str, node: &str, extra: serde_json::Value| -> Pod {
            let mut value = json!({
                "metadata": {"name": name, "namespace": "app"},
                "spec": {"nodeName": node, "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
                ]},
                "status": {"phase": "Running"},
            });
            if let Some(object) = extra.as_object() {
                for (key, part) in object {
                    for (field, v) in part.as_object().unwrap() {
                        value[key][field] = v.clone();
                    }
                }
            }
            serde_json::from_value(value).unwrap()
        };
        let daemon = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u", "controller": true}
        ]}});
        let nodes = vec![
            node("old", "i-0000000000000000a", json!({})),
            node("new", "i-0000000000000000b", json!({})),
            node(
                "cordoned",
                "i-0000000000000000c",
                json!({"unschedulable": true}),
            ),
        ];
        let pods = vec![
            pod("web", "old", json!({})),
            pod("ds-old", "old", daemon.clone()),
            pod("done", "old", json!({"status": {"phase": "Succeeded"}})),
            pod(
                "leaving",
                "old",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            ),
            pod("ds-new", "new", daemon),
            pod("busy", "cordoned", json!({})),
        ];
        let outdated = BTreeMap::from([("i-0000000000000000a", None)]);
        let (room, outdated_nodes) = survey(&nodes, &PodTally::of(&pods), &outdated);
        assert_eq!(
            room,
            vec![Resources {
                cpu_millis: 1500,
                memory_bytes: 3 << 30,
                pods: 9
            }],
            "only the new node is room, less its DaemonSet pod"
        );
        assert_eq!(outdated_nodes.len(), 1);
        assert!(!outdated_nodes[0].out_of_service);
        assert_eq!(
            outdated_nodes[0].pods_to_move,
            vec![Resources {
                cpu_millis: 500,
                memory_bytes: 1 << 30,
                pods: 1
            }],
            "the DaemonSet's, the finished and the deleted pod do not move"
        );
    }
}
