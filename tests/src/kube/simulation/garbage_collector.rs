//! The garbage collector: cascading deletion of the dependents of deleted workloads, and
//! the pod garbage collector's removal of pods bound to a deleted node.

use std::collections::HashSet;

use super::{Memory, Simulation, controller_uid, resource, spec_str};
use crate::kube::store::{DeleteOptions, State, meta_str};

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
