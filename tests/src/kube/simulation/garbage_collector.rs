//! The garbage collector: cascading deletion of the dependents of deleted workloads, and
//! the pod garbage collector's removal of pods bound to a deleted node; with the
//! taint-eviction controller, Kubernetes' non-graceful node shutdown
//! ([`Simulation::out_of_service_nodes`]).

use std::collections::HashSet;

use serde_json::Value;

use super::{
    Memory, Simulation, being_deleted, condition_true, controller_uid, resource, spec_str,
};
use crate::kube::store::{DeleteOptions, State, meta_str};

/// The taint of Kubernetes' non-graceful node shutdown.
const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

impl Simulation {
    /// Cascading deletion (background propagation): objects whose controller was deleted go
    /// too; pods bound to a deleted node are removed (the pod garbage collector). Only owners
    /// and nodes deleted while the server runs count, so a scenario's hand-made owner
    /// references to objects it never created are left alone.
    pub(super) fn garbage_collector(&self, state: &mut State, memory: &mut Memory) {
        let deletions = state.deletions_since(memory.collected_rv);
        memory.collected_rv = state.resource_version();
        if deletions.is_empty() {
            return;
        }
        let gone_owners: HashSet<String> = deletions
            .iter()
            .filter(|c| c.resource.group == "apps")
            .map(|c| meta_str(&c.object, "uid").to_owned())
            .collect();
        let gone_nodes: HashSet<String> = deletions
            .iter()
            .filter(|c| c.resource.group.is_empty() && c.resource.plural == "nodes")
            .map(|c| meta_str(&c.object, "name").to_owned())
            .collect();
        let pods = resource("", "pods");
        for dependent_kind in [resource("apps", "replicasets"), pods] {
            let orphans: Vec<(String, String, bool)> = state
                .iter(dependent_kind, None)
                .filter_map(|object| {
                    let owner_gone =
                        controller_uid(object).is_some_and(|uid| gone_owners.contains(uid));
                    let node_gone = dependent_kind.plural == "pods"
                        && gone_nodes.contains(spec_str(object, "nodeName"));
                    (owner_gone || node_gone).then(|| {
                        (
                            meta_str(object, "namespace").to_owned(),
                            meta_str(object, "name").to_owned(),
                            node_gone,
                        )
                    })
                })
                .collect();
            for (namespace, name, node_gone) in orphans {
                if node_gone {
                    state.remove(dependent_kind, &namespace, &name);
                } else if let Err(error) =
                    state.delete(dependent_kind, &namespace, &name, &DeleteOptions::default())
                {
                    tracing::debug!(%error, "simulated garbage collector could not delete a dependent");
                }
            }
        }
    }
}

impl Simulation {
    /// Non-graceful node shutdown, as the controllers do it for a node carrying the
    /// out-of-service taint: the taint-eviction controller deletes the pods that do not
    /// tolerate it when it is `NoExecute` (gracefully: a live kubelet still stops them), and,
    /// when the node is not Ready, the pod garbage collector force-deletes its pods being deleted
    /// (the attach/detach controller then detaches their volumes at once,
    /// [`super::attach_detach`]). Only this taint: no other `NoExecute` taint is evicted by.
    pub(super) fn out_of_service_nodes(&self, state: &mut State) {
        let tainted: Vec<(String, bool, Taint)> = state
            .iter(resource("", "nodes"), None)
            .filter_map(|node| {
                let taint = out_of_service_taint(node)?;
                Some((
                    meta_str(node, "name").to_owned(),
                    condition_true(node, "Ready"),
                    taint,
                ))
            })
            .collect();
        let pods = resource("", "pods");
        for (node, ready, taint) in tainted {
            let on_node: Vec<Value> = state
                .iter(pods, None)
                .filter(|pod| spec_str(pod, "nodeName") == node)
                .cloned()
                .collect();
            for pod in on_node {
                let (namespace, name) = (meta_str(&pod, "namespace"), meta_str(&pod, "name"));
                if being_deleted(&pod) {
                    if !ready {
                        state.remove(pods, namespace, name);
                    }
                } else if taint.2 == "NoExecute"
                    && !super::scheduler::tolerates(&pod, &taint)
                    && let Err(error) =
                        state.delete(pods, namespace, name, &DeleteOptions::default())
                {
                    tracing::debug!(%error, "simulated taint-eviction controller could not delete a pod");
                }
            }
        }
    }
}

/// (key, value, effect) as the scheduler's toleration check reads a taint.
type Taint = (String, String, String);

/// The node's out-of-service taint, if it carries one (the controllers look for the key,
/// whatever its value).
pub(super) fn out_of_service_taint(node: &Value) -> Option<Taint> {
    let taint = node["spec"]["taints"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == OUT_OF_SERVICE_TAINT)?;
    let field = |name: &str| taint[name].as_str().unwrap_or_default().to_owned();
    Some((
        OUT_OF_SERVICE_TAINT.to_owned(),
        field("value"),
        field("effect"),
    ))
}
