//! Which nodes have room for a pod (NodeResourcesFit's filter: a pod slot, and the CPU and
//! memory it requests) and the scheduler's choice among those that take it: kube-scheduler's
//! default profile (v1.36) scores, each 0–100 and weighted as that profile weighs them:
//!
//! | plugin | weight | here |
//! |---|---|---|
//! | TaintToleration | 3 | `PreferNoSchedule` taints the pod does not tolerate, fewest best |
//! | PodTopologySpread | 2 | the system default constraints (hostname skew 3, zone skew 5) over the pod's controller's pods |
//! | NodeResourcesFit (LeastAllocated) | 1 | CPU and memory left after the pod, non-zero requests (100m, 200 MiB for a container that names none) |
//! | NodeResourcesBalancedAllocation | 1 | how the pod changes the balance of CPU and memory requested |
//! | ImageLocality | 1 | the size of the pod's images the node reports in `status.images`, scaled by how many nodes hold them |
//!
//! NodeAffinity and InterPodAffinity (weight 2 each) score 0 on every node for pods without
//! preferred affinity terms, which is every pod the test kit seeds; they are left out. A
//! pod's controller stands for the selector kube-scheduler builds from the Services,
//! ReplicaSets and StatefulSets that select it. Where kube-scheduler picks at random among
//! the best nodes, this picks the one with the fewest pods, then the first by name, so runs
//! repeat.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use node_manager::instance_refresh::capacity::parse_quantity;
use serde_json::Value;

use super::{being_deleted, controller_uid, spec_str, status_str};
use crate::kube::store::meta_str;

/// The highest score of one plugin.
const MAX_SCORE: i64 = 100;
const TAINT_TOLERATION_WEIGHT: i64 = 3;
const TOPOLOGY_SPREAD_WEIGHT: i64 = 2;
const LEAST_ALLOCATED_WEIGHT: i64 = 1;
const BALANCED_ALLOCATION_WEIGHT: i64 = 1;
const IMAGE_LOCALITY_WEIGHT: i64 = 1;

/// What a container that requests nothing counts as, for the resource scores.
const DEFAULT_CPU_MILLIS: i64 = 100;
const DEFAULT_MEMORY_BYTES: i64 = 200 * 1024 * 1024;

/// ImageLocality's bounds: images below the first count nothing, the score is full at the
/// second per container.
const IMAGE_FLOOR_BYTES: i64 = 23 * 1024 * 1024;
const IMAGE_CEILING_BYTES: i64 = 1000 * 1024 * 1024;

const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The system default spread constraints' max skews.
const HOSTNAME_MAX_SKEW: i64 = 3;
const ZONE_MAX_SKEW: i64 = 5;

/// CPU (millicores) and memory (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Amount {
    cpu_millis: i64,
    memory_bytes: i64,
}

impl Amount {
    fn plus(self, other: Amount) -> Amount {
        Amount {
            cpu_millis: self.cpu_millis + other.cpu_millis,
            memory_bytes: self.memory_bytes + other.memory_bytes,
        }
    }
}

fn quantity(value: Option<&Value>, scale: f64) -> Option<i64> {
    let parsed = parse_quantity(value?.as_str()?, scale)?;
    i64::try_from(parsed).ok()
}

/// The pod's requests as the scores count them: `(requested, non_zero)`, where `non_zero`
/// counts a container without a request as the defaults.
fn requests(pod: &Value) -> (Amount, Amount) {
    let mut requested = Amount::default();
    let mut non_zero = Amount::default();
    let containers = pod["spec"]["containers"].as_array().into_iter().flatten();
    for container in containers {
        let asked = &container["resources"]["requests"];
        let cpu = quantity(asked.get("cpu"), 1000.0);
        let memory = quantity(asked.get("memory"), 1.0);
        requested = requested.plus(Amount {
            cpu_millis: cpu.unwrap_or(0),
            memory_bytes: memory.unwrap_or(0),
        });
        non_zero = non_zero.plus(Amount {
            cpu_millis: cpu.unwrap_or(DEFAULT_CPU_MILLIS),
            memory_bytes: memory.unwrap_or(DEFAULT_MEMORY_BYTES),
        });
    }
    (requested, non_zero)
}

/// An image's name as the container runtime reports it (`:latest` when it names no tag).
fn normalized_image(name: &str) -> Cow<'_, str> {
    let tagged = name
        .rfind(':')
        .is_some_and(|colon| name.rfind('/').is_none_or(|slash| colon > slash));
    if tagged {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(format!("{name}:latest"))
    }
}

/// The images of the pod's containers, as the runtime names them.
pub(super) fn pod_images(pod: &Value) -> impl Iterator<Item = Cow<'_, str>> {
    pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["image"].as_str())
        .map(normalized_image)
}

/// The images a node reports, with their sizes.
fn reported_images(node: &Value) -> BTreeMap<String, i64> {
    let mut images = BTreeMap::new();
    for image in node["status"]["images"].as_array().into_iter().flatten() {
        let size = image["sizeBytes"].as_i64().unwrap_or(0);
        for name in image["names"].as_array().into_iter().flatten() {
            if let Some(name) = name.as_str() {
                images.insert(name.to_owned(), size);
            }
        }
    }
    images
}

/// What the scores need of one node.
#[derive(Debug, Clone)]
pub(super) struct NodeFacts {
    pub(super) name: String,
    labels: BTreeMap<String, String>,
    allocatable: Amount,
    /// Pods it takes; `None` when it reports no `status.allocatable` at all (a node built by
    /// hand in a test, which no kubelet registers): such a node is not limited.
    allocatable_pods: Option<usize>,
    requested: Amount,
    non_zero_requested: Amount,
    /// Every pod bound to it (what the resource scores count).
    pub(super) pods: usize,
    /// Pods not being deleted, by (namespace, controller uid): what topology spread counts.
    live_by_controller: BTreeMap<(String, String), i64>,
    images: BTreeMap<String, i64>,
}

/// Every node of the cluster (schedulable or not: ImageLocality and the zone spread count
/// them all), gathered once per scheduling pass and kept current as pods are bound.
pub(super) struct Cluster {
    pub(super) nodes: BTreeMap<String, NodeFacts>,
}

impl Cluster {
    /// `nodes` and the pods bound to them (finished pods hold nothing, as kube-scheduler's
    /// cache leaves them out).
    pub(super) fn gather<'a>(
        nodes: impl Iterator<Item = &'a Value>,
        pods: impl Iterator<Item = &'a Value>,
    ) -> Self {
        let mut facts: BTreeMap<String, NodeFacts> = nodes
            .map(|node| {
                let allocatable = &node["status"]["allocatable"];
                let facts = NodeFacts {
                    name: meta_str(node, "name").to_owned(),
                    labels: serde_json::from_value(node["metadata"]["labels"].clone())
                        .unwrap_or_default(),
                    allocatable: Amount {
                        cpu_millis: quantity(allocatable.get("cpu"), 1000.0).unwrap_or(0),
                        memory_bytes: quantity(allocatable.get("memory"), 1.0).unwrap_or(0),
                    },
                    allocatable_pods: allocatable.is_object().then(|| {
                        quantity(allocatable.get("pods"), 1.0)
                            .and_then(|pods| usize::try_from(pods).ok())
                            .unwrap_or(0)
                    }),
                    requested: Amount::default(),
                    non_zero_requested: Amount::default(),
                    pods: 0,
                    live_by_controller: BTreeMap::new(),
                    images: reported_images(node),
                };
                (facts.name.clone(), facts)
            })
            .collect();
        for pod in pods {
            let phase = status_str(pod, "phase");
            if phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            if let Some(node) = facts.get_mut(spec_str(pod, "nodeName")) {
                node.add(pod);
            }
        }
        Self { nodes: facts }
    }

    /// NodeResourcesFit's filter: whether `node` has a pod slot left and, for what the pod
    /// requests, the CPU and memory its pods have not requested yet.
    pub(super) fn has_room_for(&self, node: &str, pod: &Value) -> bool {
        let Some(facts) = self.nodes.get(node) else {
            return false;
        };
        let Some(slots) = facts.allocatable_pods else {
            return true;
        };
        let (asked, _) = requests(pod);
        let fits = |asked: i64, requested: i64, allocatable: i64| {
            asked == 0 || asked <= allocatable - requested
        };
        facts.pods < slots
            && fits(
                asked.cpu_millis,
                facts.requested.cpu_millis,
                facts.allocatable.cpu_millis,
            )
            && fits(
                asked.memory_bytes,
                facts.requested.memory_bytes,
                facts.allocatable.memory_bytes,
            )
    }

    /// Records `pod` bound to `node`.
    pub(super) fn bind(&mut self, node: &str, pod: &Value) {
        if let Some(facts) = self.nodes.get_mut(node) {
            facts.add(pod);
        }
    }

    /// The best of `feasible` for `pod`, by the weighted scores; `avoided` counts the
    /// `PreferNoSchedule` taints of a node the pod does not tolerate.
    pub(super) fn best(
        &self,
        pod: &Value,
        feasible: &[&str],
        avoided: impl Fn(&str) -> usize,
    ) -> Option<String> {
        let candidates: Vec<&NodeFacts> =
            feasible.iter().filter_map(|n| self.nodes.get(*n)).collect();
        let taints: Vec<i64> = candidates
            .iter()
            .map(|n| i64::try_from(avoided(&n.name)).unwrap_or(i64::MAX))
            .collect();
        let taint_scores = normalized_reversed(&taints);
        let spread_scores = self.topology_spread(pod, &candidates);
        let (requested, non_zero) = requests(pod);
        let images = self.image_scores(pod, &candidates);
        candidates
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let total = TAINT_TOLERATION_WEIGHT * taint_scores[i]
                    + TOPOLOGY_SPREAD_WEIGHT * spread_scores[i]
                    + LEAST_ALLOCATED_WEIGHT * node.least_allocated(non_zero)
                    + BALANCED_ALLOCATION_WEIGHT * node.balanced_allocation(requested)
                    + IMAGE_LOCALITY_WEIGHT * images[i];
                (node, total)
            })
            .max_by(|(a, a_total), (b, b_total)| {
                a_total
                    .cmp(b_total)
                    .then_with(|| b.pods.cmp(&a.pods))
                    .then_with(|| b.name.cmp(&a.name))
            })
            .map(|(node, _)| node.name.clone())
    }

    /// PodTopologySpread with the system default constraints, normalized over `candidates`
    /// (0 everywhere for a pod without a controller: it has no selector to spread by).
    fn topology_spread(&self, pod: &Value, candidates: &[&NodeFacts]) -> Vec<i64> {
        let Some(owner) = controller_uid(pod) else {
            return vec![0; candidates.len()];
        };
        let key = (meta_str(pod, "namespace").to_owned(), owner.to_owned());
        let live = |node: &NodeFacts| node.live_by_controller.get(&key).copied().unwrap_or(0);
        // A hostname domain is the node itself; a zone's counts every node in it, schedulable
        // or not. Each constraint weighs its counts by how many domains the candidates span.
        let host_weight = ((candidates.len() + 2) as f64).ln();
        let zones: BTreeSet<&str> = candidates
            .iter()
            .map(|n| n.labels.get(ZONE_LABEL).map_or("", String::as_str))
            .collect();
        let zone_weight = ((zones.len() + 2) as f64).ln();
        let mut in_zone: BTreeMap<&str, i64> = BTreeMap::new();
        for node in self.nodes.values() {
            if let Some(zone) = node.labels.get(ZONE_LABEL) {
                *in_zone.entry(zone).or_insert(0) += live(node);
            }
        }
        let raw: Vec<i64> = candidates
            .iter()
            .map(|node| {
                let host = node
                    .labels
                    .contains_key(HOSTNAME_LABEL)
                    .then(|| live(node) as f64 * host_weight + (HOSTNAME_MAX_SKEW - 1) as f64);
                let zone = node.labels.get(ZONE_LABEL).map(|zone| {
                    in_zone.get(zone.as_str()).copied().unwrap_or(0) as f64 * zone_weight
                        + (ZONE_MAX_SKEW - 1) as f64
                });
                (host.unwrap_or(0.0) + zone.unwrap_or(0.0)).round() as i64
            })
            .collect();
        let max = raw.iter().copied().max().unwrap_or(0);
        let min = raw.iter().copied().min().unwrap_or(0);
        raw.iter()
            .map(|score| {
                if max == 0 {
                    MAX_SCORE
                } else {
                    MAX_SCORE * (max + min - score) / max
                }
            })
            .collect()
    }

    /// ImageLocality for each candidate: the sizes of the pod's images it holds, each scaled
    /// by the share of all nodes holding it, between the floor and the ceiling.
    fn image_scores(&self, pod: &Value, candidates: &[&NodeFacts]) -> Vec<i64> {
        let total_nodes = self.nodes.len().max(1) as f64;
        // Each image with the share of nodes holding it, found once for every candidate.
        let images: Vec<(Cow<'_, str>, f64)> = pod_images(pod)
            .map(|image| {
                let holders = self
                    .nodes
                    .values()
                    .filter(|n| n.images.contains_key(image.as_ref()))
                    .count();
                (image, holders as f64 / total_nodes)
            })
            .collect();
        let ceiling = IMAGE_CEILING_BYTES * i64::try_from(images.len()).unwrap_or(1).max(1);
        candidates
            .iter()
            .map(|node| {
                let sum: i64 = images
                    .iter()
                    .filter_map(|(image, share)| {
                        let size = *node.images.get(image.as_ref())?;
                        Some((size as f64 * share) as i64)
                    })
                    .sum();
                let clamped = sum.clamp(IMAGE_FLOOR_BYTES, ceiling);
                MAX_SCORE * (clamped - IMAGE_FLOOR_BYTES) / (ceiling - IMAGE_FLOOR_BYTES)
            })
            .collect()
    }
}

impl NodeFacts {
    fn add(&mut self, pod: &Value) {
        let (requested, non_zero) = requests(pod);
        self.requested = self.requested.plus(requested);
        self.non_zero_requested = self.non_zero_requested.plus(non_zero);
        self.pods += 1;
        if let Some(owner) = controller_uid(pod).filter(|_| !being_deleted(pod)) {
            let key = (meta_str(pod, "namespace").to_owned(), owner.to_owned());
            *self.live_by_controller.entry(key).or_insert(0) += 1;
        }
    }

    /// NodeResourcesFit's LeastAllocated: the share of CPU and memory left with the pod
    /// placed, averaged.
    fn least_allocated(&self, pod: Amount) -> i64 {
        let after = self.non_zero_requested.plus(pod);
        let left = |requested: i64, capacity: i64| {
            if capacity == 0 || requested > capacity {
                0
            } else {
                (capacity - requested) * MAX_SCORE / capacity
            }
        };
        let counted = [self.allocatable.cpu_millis, self.allocatable.memory_bytes]
            .iter()
            .filter(|c| **c > 0)
            .count() as i64;
        let sum = left(after.cpu_millis, self.allocatable.cpu_millis)
            + left(after.memory_bytes, self.allocatable.memory_bytes);
        if counted == 0 { 0 } else { sum / counted }
    }

    /// NodeResourcesBalancedAllocation: half the score, plus half of how much the pod
    /// improves the balance of the requested shares of CPU and memory.
    fn balanced_allocation(&self, pod: Amount) -> i64 {
        let with_pod = self.balance(self.requested.plus(pod));
        let without_pod = self.balance(self.requested);
        MAX_SCORE / 2 + (MAX_SCORE / 2 + with_pod - without_pod) / 2
    }

    fn balance(&self, requested: Amount) -> i64 {
        let share = |used: i64, capacity: i64| (used as f64 / capacity as f64).min(1.0);
        let shares: Vec<f64> = [
            (requested.cpu_millis, self.allocatable.cpu_millis),
            (requested.memory_bytes, self.allocatable.memory_bytes),
        ]
        .iter()
        .filter(|(_, capacity)| *capacity > 0)
        .map(|(used, capacity)| share(*used, *capacity))
        .collect();
        let deviation = match shares.as_slice() {
            [a, b] => ((a - b) / 2.0).abs(),
            _ => 0.0,
        };
        ((1.0 - deviation) * MAX_SCORE as f64) as i64
    }
}

/// Scores where fewer is better, scaled to 0–100 against the highest (all 100 when none
/// has any).
fn normalized_reversed(raw: &[i64]) -> Vec<i64> {
    let max = raw.iter().copied().max().unwrap_or(0);
    raw.iter()
        .map(|score| {
            if max == 0 {
                MAX_SCORE
            } else {
                MAX_SCORE - MAX_SCORE * score / max
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_untagged_image_is_latest() {
        assert_eq!(normalized_image("nginx"), "nginx:latest");
        assert_eq!(normalized_image("nginx:1.27"), "nginx:1.27");
        assert_eq!(
            normalized_image("localhost:5000/web"),
            "localhost:5000/web:latest"
        );
    }

    #[test]
    fn a_container_without_requests_counts_the_defaults_for_the_resource_scores() {
        let pod = json!({"spec": {"containers": [
            {"name": "a", "image": "x"},
            {"name": "b", "image": "y", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
        ]}});
        let (requested, non_zero) = requests(&pod);
        assert_eq!(requested.cpu_millis, 250);
        assert_eq!(requested.memory_bytes, 1024 * 1024 * 1024);
        assert_eq!(non_zero.cpu_millis, 350);
        assert_eq!(
            non_zero.memory_bytes,
            1024 * 1024 * 1024 + DEFAULT_MEMORY_BYTES
        );
    }

    #[test]
    fn fewer_avoided_taints_score_higher() {
        assert_eq!(normalized_reversed(&[0, 1, 2]), vec![100, 50, 0]);
        assert_eq!(normalized_reversed(&[0, 0]), vec![100, 100]);
    }
}
