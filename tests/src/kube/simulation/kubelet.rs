//! The kubelet's part of a step: it confirms the deletions whose grace period has passed,
//! turns registered nodes Ready when their time comes, and starts the pods bound to Ready
//! nodes after the start delay. A dead kubelet ([`Simulation::kill_kubelet`]) does none of it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ptr;
use std::time::Instant;

use serde_json::{Value, json};

use super::scoring::pod_images;
use super::{
    Memory, Simulation, being_deleted, condition_true, resource, spec_str, status_str, update_full,
};
use crate::kube::store::{ChangeType, NOT_READY_TAINT, State, meta_str, now_rfc3339};

/// The size the test kit's kubelets report every image with: an application image's order
/// of magnitude, so kube-scheduler's ImageLocality score (which ignores images under 23 MB)
/// weighs it.
pub const REPORTED_IMAGE_BYTES: u64 = 500 * 1024 * 1024;

/// Adds the images of the pods that ran on a node to its `status.images`, as a kubelet
/// reports what it pulled (a node keeps an image after its pods are gone). Pods seeded
/// Running count as started. Only the pods changed since resource version `since` are
/// looked at (a pod's images can only be new to its node when it changed), every pod when
/// the history does not reach back that far or a node was added since (pods seeded before
/// their node).
pub(super) fn report_pulled_images(state: &mut State, since: u64) {
    let nodes = resource("", "nodes");
    let pods = resource("", "pods");
    let changes = state.changes_since(since).filter(|changes| {
        !changes
            .iter()
            .any(|c| ptr::eq(c.resource, nodes) && c.change == ChangeType::Added)
    });
    let pulled = match &changes {
        Some(changes) => new_images(
            state,
            changes
                .iter()
                .filter(|c| ptr::eq(c.resource, pods) && c.change != ChangeType::Deleted)
                .map(|c| &c.object),
        ),
        None => new_images(state, state.iter(pods, None)),
    };
    for (name, images) in pulled {
        let Ok(mut node) = state.get(nodes, "", &name) else {
            continue;
        };
        let mut listed = node["status"]["images"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        listed.extend(
            images
                .iter()
                .map(|image| json!({"names": [image], "sizeBytes": REPORTED_IMAGE_BYTES})),
        );
        node["status"]["images"] = json!(listed);
        update_full(state, nodes, node);
    }
}

/// The images of the started `pods` their node does not report yet, by node.
fn new_images<'a>(
    state: &State,
    pods: impl Iterator<Item = &'a Value>,
) -> BTreeMap<String, BTreeSet<String>> {
    let nodes = resource("", "nodes");
    let mut reported: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
    let mut pulled: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in pods {
        let phase = status_str(pod, "phase");
        if phase.is_empty() || phase == "Pending" {
            continue;
        }
        let node = spec_str(pod, "nodeName");
        let known = reported.entry(node.to_owned()).or_insert_with(|| {
            let node = state.get(nodes, "", node).ok()?;
            let names = node["status"]["images"].as_array().into_iter().flatten();
            Some(
                names
                    .filter_map(|i| i["names"][0].as_str().map(str::to_owned))
                    .collect(),
            )
        });
        let Some(known) = known else {
            continue;
        };
        for image in pod_images(pod) {
            if !known.contains(image.as_ref()) {
                pulled
                    .entry(node.to_owned())
                    .or_default()
                    .insert(image.into_owned());
            }
        }
    }
    pulled
}

impl Simulation {
    pub(super) fn kubelet_removes_terminated_pods(
        &self,
        state: &mut State,
        memory: &Memory,
        now: Instant,
    ) {
        let pods = resource("", "pods");
        let due: Vec<(String, String)> = state
            .iter(pods, None)
            .filter(|pod| being_deleted(pod))
            // A dead kubelet never confirms a deletion.
            .filter(|pod| !memory.dead_kubelets.contains(spec_str(pod, "nodeName")))
            .filter(|pod| {
                let no_finalizers = pod
                    .get("metadata")
                    .and_then(|m| m.get("finalizers"))
                    .and_then(Value::as_array)
                    .is_none_or(Vec::is_empty);
                let uid = meta_str(pod, "uid");
                no_finalizers
                    && state
                        .deletion_deadlines
                        .get(uid)
                        .is_none_or(|deadline| *deadline <= now)
            })
            .map(|pod| {
                (
                    meta_str(pod, "namespace").to_owned(),
                    meta_str(pod, "name").to_owned(),
                )
            })
            .collect();
        for (namespace, name) in due {
            state.remove(pods, &namespace, &name);
        }
    }

    pub(super) fn kubelet_turns_nodes_ready(
        &self,
        state: &mut State,
        memory: &mut Memory,
        now: Instant,
    ) {
        let nodes = resource("", "nodes");
        let ready: Vec<String> = memory
            .node_ready_at
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in ready {
            memory.node_ready_at.remove(&name);
            let Ok(mut node) = state.get(nodes, "", &name) else {
                continue;
            };
            let time = now_rfc3339();
            node["status"]["conditions"] = json!([{
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": time,
                "lastTransitionTime": time,
            }]);
            // The node lifecycle controller lifts the admission's taint once it sees Ready.
            if let Some(taints) = node["spec"]["taints"].as_array_mut() {
                taints.retain(|t| t["key"] != NOT_READY_TAINT);
            }
            update_full(state, nodes, node);
        }
    }

    /// Bound Pending pods on Ready nodes become Running and Ready after the start delay,
    /// counted from when their volumes are attached.
    pub(super) fn kubelet_starts_pods(&self, state: &mut State, memory: &mut Memory, now: Instant) {
        let pods = resource("", "pods");
        let nodes = resource("", "nodes");
        let ready_nodes: HashSet<String> = state
            .iter(nodes, None)
            .filter(|n| condition_true(n, "Ready"))
            .map(|n| meta_str(n, "name").to_owned())
            .collect();
        let mut starting = Vec::new();
        let mut seen = HashSet::new();
        for pod in state.iter(pods, None) {
            let phase = status_str(pod, "phase");
            if !(phase.is_empty() || phase == "Pending") || being_deleted(pod) {
                continue;
            }
            if !ready_nodes.contains(spec_str(pod, "nodeName")) {
                continue;
            }
            // The kubelet mounts the pod's volumes before it starts it.
            if !super::attach_detach::volumes_attached(state, pod) {
                continue;
            }
            let uid = meta_str(pod, "uid").to_owned();
            seen.insert(uid.clone());
            let bound_at = *memory.pod_bound_at.entry(uid).or_insert(now);
            if now.duration_since(bound_at) >= self.timings.pod_start_delay {
                starting.push(pod.clone());
            }
        }
        memory.pod_bound_at.retain(|uid, _| seen.contains(uid));
        for mut pod in starting {
            memory.pod_bound_at.remove(meta_str(&pod, "uid"));
            let time = now_rfc3339();
            let condition = |kind: &str| json!({ "type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": time });
            let containers: Vec<Value> = pod
                .get("spec")
                .and_then(|s| s.get("containers"))
                .and_then(Value::as_array)
                .map(|containers| {
                    containers
                        .iter()
                        .map(|c| {
                            json!({
                                "name": c.get("name").cloned().unwrap_or(json!("main")),
                                "image": c.get("image").cloned().unwrap_or(json!("")),
                                "imageID": "",
                                "ready": true,
                                "started": true,
                                "restartCount": 0,
                                "state": { "running": { "startedAt": time } },
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            pod["status"] = json!({
                "phase": "Running",
                "conditions": [
                    condition("PodReadyToStartContainers"),
                    condition("Initialized"),
                    condition("Ready"),
                    condition("ContainersReady"),
                    condition("PodScheduled"),
                ],
                "hostIP": "10.0.0.1",
                "podIP": "10.0.1.1",
                "startTime": time,
                "containerStatuses": containers,
                "qosClass": "BestEffort",
            });
            update_full(state, pods, pod);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::api::core::v1::Node;

    use super::super::{Simulation, SimulationTimings};
    use crate::fixtures;
    use crate::kube::store::Store;

    const IMAGE: &str = "public.ecr.aws/nginx/nginx:latest";

    fn reported(store: &Store, node: &str) -> Vec<String> {
        let node: Node = store.get("", node).unwrap();
        let images = node.status.and_then(|s| s.images).unwrap_or_default();
        images
            .into_iter()
            .flat_map(|i| i.names.unwrap_or_default())
            .collect()
    }

    /// Each step looks only at what changed since the last report; a pod seeded before its
    /// node exists, and a pod started after the first report, are both reported.
    #[test]
    fn a_node_reports_the_images_of_the_pods_it_ran_by_default() {
        let store = Store::new();
        store.create(&fixtures::ready_node("n1")).unwrap();
        store
            .create(&fixtures::running_pod("default", "early", "n2", &[]))
            .unwrap();
        let simulation = Simulation::new(store.clone(), SimulationTimings::default());
        simulation.step();
        assert!(reported(&store, "n1").is_empty(), "n1 ran nothing yet");
        store
            .create(&fixtures::running_pod("default", "later", "n1", &[]))
            .unwrap();
        store.create(&fixtures::ready_node("n2")).unwrap();
        simulation.step();
        assert_eq!(
            reported(&store, "n1"),
            [IMAGE],
            "a pod started since the last report"
        );
        assert_eq!(
            reported(&store, "n2"),
            [IMAGE],
            "a pod seeded before its node"
        );
        simulation.step();
        assert_eq!(reported(&store, "n1"), [IMAGE], "reported once");
    }
}
