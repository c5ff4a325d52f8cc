//! Nodes coming and going as their instances do: a kubelet registering a new node, an
//! instance stopped into a warm pool and started again, a kubelet that dies and comes back.
//! Tests and the fake AWS call these between steps; the step's kubelet then acts on them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Simulation, resource, update_full};
use crate::kube::status::ApiError;
use crate::kube::store::{Origin, add_not_ready_taint, now_rfc3339};

/// The taint the cloud node lifecycle controller puts on a node whose instance is stopped.
pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// What the node lifecycle controller shows for a node whose kubelet stopped posting status
/// (a stopped instance, a dead kubelet): `Ready=Unknown` since now.
fn mark_status_unknown(node: &mut Value) {
    let time = now_rfc3339();
    node["status"]["conditions"] = json!([{
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": time,
        "lastTransitionTime": time,
    }]);
}

/// CPU, memory and pod slots of an emulated node.
#[derive(Debug, Clone, Copy)]
pub struct NodeResources {
    pub cpu: &'static str,
    pub memory: &'static str,
    pub pods: &'static str,
}

impl NodeResources {
    /// As a Node's `status.capacity` or `status.allocatable`.
    pub fn to_value(self) -> Value {
        json!({ "cpu": self.cpu, "memory": self.memory, "pods": self.pods })
    }
}

/// What an emulated node's kubelet reports (an m5.xlarge's): its capacity, and what is left
/// for pods after the system reserve, which the scheduler's resource scores and the instance
/// refresh's room rule count.
pub const NODE_CAPACITY: NodeResources = NodeResources {
    cpu: "4",
    memory: "16Gi",
    pods: "110",
};
pub const NODE_ALLOCATABLE: NodeResources = NodeResources {
    cpu: "3920m",
    memory: "15Gi",
    pods: "110",
};

impl Simulation {
    /// Registers a node as a kubelet would after an instance launches: `NotReady` now,
    /// `Ready` after `ready_after` (`None`: the scenario's default).
    pub fn register_node(
        &self,
        name: &str,
        provider_id: &str,
        ready_after: Option<Duration>,
    ) -> Result<Value, ApiError> {
        let now = now_rfc3339();
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "spec": { "providerID": provider_id },
            "status": {
                "conditions": [{
                    "type": "Ready",
                    "status": "False",
                    "reason": "KubeletNotReady",
                    "message": "container runtime network not ready",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }],
                "addresses": [
                    { "type": "InternalIP", "address": "10.0.0.1" },
                    { "type": "Hostname", "address": name },
                ],
                "nodeInfo": { "kubeletVersion": "v1.33.0-eks-fake", "osImage": "Amazon Linux 2023" },
                "capacity": NODE_CAPACITY.to_value(),
                "allocatable": NODE_ALLOCATABLE.to_value(),
            },
        });
        // A kubelet registers through the API, so the admission taint applies.
        let mut node = node;
        add_not_ready_taint(&mut node);
        let created = self
            .store
            .lock()
            .create(resource("", "nodes"), "", node, Origin::Setup)?;
        let ready_after = ready_after.unwrap_or(self.timings.node_ready_after);
        self.memory()
            .node_ready_at
            .insert(name.to_owned(), Instant::now() + ready_after);
        Ok(created)
    }

    /// The node's instance was stopped (sent to a warm pool): the kubelet stops posting
    /// status, so the node turns `Ready=Unknown`, and the cloud node lifecycle controller
    /// taints it `node.cloudprovider.kubernetes.io/shutdown:NoSchedule`. The Node object
    /// stays, with everything else on it (labels, cordon, annotations).
    pub fn stop_node(&self, name: &str) -> Result<(), ApiError> {
        let nodes = resource("", "nodes");
        // The same lock order as `step`: memory, then the store.
        let mut memory = self.memory();
        let mut state = self.store.lock();
        let mut node = state.get(nodes, "", name)?;
        memory.node_ready_at.remove(name);
        mark_status_unknown(&mut node);
        let mut taints = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !taints.iter().any(|t| t["key"] == json!(SHUTDOWN_TAINT)) {
            taints.push(json!({"key": SHUTDOWN_TAINT, "effect": "NoSchedule"}));
        }
        node["spec"]["taints"] = json!(taints);
        update_full(&mut state, nodes, node);
        Ok(())
    }

    /// The node's instance started again (out of a warm pool): its kubelet re-registers
    /// under the node's old name. An existing Node object is kept as it is (the kubelet
    /// does not touch `spec.unschedulable`, labels it did not set, or annotations); the
    /// shutdown taint goes (the instance runs again) and the node turns Ready after
    /// `ready_after`. A Node deleted meanwhile is registered afresh.
    pub fn restart_node(
        &self,
        name: &str,
        provider_id: &str,
        ready_after: Option<Duration>,
    ) -> Result<(), ApiError> {
        let nodes = resource("", "nodes");
        let ready_after = ready_after.unwrap_or(self.timings.node_ready_after);
        {
            let mut memory = self.memory();
            let mut state = self.store.lock();
            if let Ok(mut node) = state.get(nodes, "", name) {
                let time = now_rfc3339();
                node["status"]["conditions"] = json!([{
                    "type": "Ready",
                    "status": "False",
                    "reason": "KubeletNotReady",
                    "message": "container runtime network not ready",
                    "lastHeartbeatTime": time,
                    "lastTransitionTime": time,
                }]);
                if let Some(taints) = node["spec"]["taints"].as_array_mut() {
                    taints.retain(|t| t["key"] != json!(SHUTDOWN_TAINT));
                }
                update_full(&mut state, nodes, node);
                memory
                    .node_ready_at
                    .insert(name.to_owned(), Instant::now() + ready_after);
                return Ok(());
            }
        }
        self.register_node(name, provider_id, Some(ready_after))
            .map(|_| ())
    }

    /// Stops the kubelet of `node`, as when its instance hangs or loses its network: the node
    /// turns `Ready=Unknown` now (as the node lifecycle controller marks a node whose kubelet
    /// stopped posting status), its pods are never started, and deletions of its pods are
    /// never confirmed (they keep their `deletionTimestamp` until a grace-0 deletion or the
    /// node's deletion removes them). [`Simulation::revive_kubelet`] undoes it.
    pub fn kill_kubelet(&self, node: &str) -> Result<(), ApiError> {
        let mut memory = self.memory();
        let mut state = self.store.lock();
        let nodes = resource("", "nodes");
        let mut object = state.get(nodes, "", node)?;
        memory.node_ready_at.remove(node);
        memory.dead_kubelets.insert(node.to_owned());
        mark_status_unknown(&mut object);
        update_full(&mut state, nodes, object);
        Ok(())
    }

    /// Starts the kubelet of `node` again: it turns Ready on the next step and confirms the
    /// deletions that are due.
    pub fn revive_kubelet(&self, node: &str) {
        let mut memory = self.memory();
        memory.dead_kubelets.remove(node);
        memory.node_ready_at.insert(node.to_owned(), Instant::now());
    }

    /// Whether the kubelet of `node` was stopped with [`Simulation::kill_kubelet`].
    pub fn is_kubelet_dead(&self, node: &str) -> bool {
        self.memory().dead_kubelets.contains(node)
    }
}
