//! The namespace controller: a deleted namespace (`Terminating`, see the store's delete) has
//! its content deleted as a client would delete it (pods gracefully, so they end through their
//! kubelet; an object with finalizers waits for them), and is removed once nothing is left.
//! Until then the NamespaceLifecycle admission plugin refuses new content (the store's create
//! and the eviction API answer `403` with the `NamespaceTerminating` cause).

use super::{Simulation, being_deleted, resource, resources};
use crate::kube::store::{DeleteOptions, State, meta_str};

impl Simulation {
    pub(super) fn namespace_controller(&self, state: &mut State) {
        let namespaces = resource("", "namespaces");
        let terminating: Vec<String> = state
            .iter(namespaces, None)
            .filter(|namespace| being_deleted(namespace))
            .map(|namespace| meta_str(namespace, "name").to_owned())
            .collect();
        for namespace in terminating {
            if delete_content(state, &namespace) == 0 {
                state.remove(namespaces, "", &namespace);
            }
        }
    }
}

/// Deletes what is in `namespace` and not yet being deleted; returns how many objects were
/// there before (deleted or still going).
fn delete_content(state: &mut State, namespace: &str) -> usize {
    let mut found = 0;
    // Events of both API groups share one storage: each object once, through the core one.
    let stored = resources::RESOURCES
        .iter()
        .filter(|r| r.namespaced && r.group != "events.k8s.io");
    for kind in stored {
        let names: Vec<(String, bool)> = state
            .iter(kind, Some(namespace))
            .map(|object| (meta_str(object, "name").to_owned(), being_deleted(object)))
            .collect();
        found += names.len();
        for (name, deleting) in names {
            if !deleting {
                let _ = state.delete(kind, namespace, &name, &DeleteOptions::default());
            }
        }
    }
    found
}
