//! The disruption controller: keeps each PodDisruptionBudget's status (from
//! `kube::disruption`) current, recomputing only the budgets whose inputs changed.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

use super::{Memory, Simulation, controller_uid, replicas, resource, update_full};
use crate::kube::disruption::{self, ControllerScale};
use crate::kube::selectors::LabelQuery;
use crate::kube::store::{Change, ChangeType, State, meta_str};

impl Simulation {
    /// Whether the disruption controller syncs in this step: once what changed has waited
    /// [`SimulationTimings::pdb_status_lag`](super::SimulationTimings) since the controller
    /// first saw it (a `disruptedPods` recheck falling due counts as a change).
    pub(super) fn disruption_controller_due(
        &self,
        state: &State,
        memory: &mut Memory,
        now: std::time::Instant,
    ) -> bool {
        if memory.disruption_held {
            return false;
        }
        let recheck_due = memory
            .recheck_at
            .is_some_and(|at| at <= jiff::Timestamp::now());
        if state.resource_version() == memory.synced_rv && !recheck_due {
            return false;
        }
        let since = *memory.unsynced_since.get_or_insert(now);
        if now.duration_since(since) < self.timings.pdb_status_lag {
            return false;
        }
        memory.unsynced_since = None;
        true
    }

    /// Recomputes the status of every PDB whose inputs changed since the last sync: its own
    /// object, a pod its selector matches (before or after the change), or the replica
    /// count of a controller in its namespace; every PDB when an evicted pod's
    /// `disruptedPods` entry expires or the change history no longer reaches back. Like the
    /// real disruption controller, which queues the budgets of a changed pod rather than
    /// resyncing all of them: recomputing every budget from every pod of its namespace on
    /// each tick held the store lock for hundreds of milliseconds at 11 budgets and 110 pods
    /// (debug build), which delayed every request and the replacements' start.
    pub(super) fn disruption_controller(&self, state: &mut State, memory: &mut Memory) {
        let now = jiff::Timestamp::now();
        let recheck_due = memory.recheck_at.is_some_and(|at| at <= now);
        if state.resource_version() == memory.synced_rv && !recheck_due {
            return;
        }
        let pdbs_resource = resource("policy", "poddisruptionbudgets");
        let pods_resource = resource("", "pods");
        let changes = if recheck_due {
            None
        } else {
            state.changes_since(memory.synced_rv)
        };
        // Each budget's selector, read from the stored JSON: cloning and decoding every
        // budget on every step is what the dirty check spares.
        let pdbs: Vec<(String, String, LabelQuery)> = state
            .iter(pdbs_resource, None)
            .map(|pdb| {
                let selector = pdb
                    .get("spec")
                    .and_then(|s| s.get("selector"))
                    .map(|s| serde_json::from_value(s.clone()))
                    .transpose()
                    .ok()
                    .and_then(|s| LabelQuery::from_optional_label_selector(s.as_ref()).ok())
                    .unwrap_or_else(LabelQuery::nothing);
                (
                    meta_str(pdb, "namespace").to_owned(),
                    meta_str(pdb, "name").to_owned(),
                    selector,
                )
            })
            .collect();
        let timeout = jiff::SignedDuration::try_from(self.timings.disrupted_pod_timeout)
            .unwrap_or(disruption::DELETION_TIMEOUT);
        memory.rechecks.retain(|key, _| {
            pdbs.iter()
                .any(|(ns, name, _)| (ns, name) == (&key.0, &key.1))
        });
        for (namespace, name, selector) in pdbs {
            let dirty = changes.as_ref().is_none_or(|changes| {
                changes
                    .iter()
                    .any(|c| affects(c, &namespace, &name, &selector))
            });
            if !dirty {
                continue;
            }
            let Ok(pdb_value) = state.get(pdbs_resource, &namespace, &name) else {
                continue;
            };
            let Ok(pdb) = serde_json::from_value::<PodDisruptionBudget>(pdb_value.clone()) else {
                continue;
            };
            memory.budgets_synced += 1;
            // Only the pods the selector matches count (compute_pdb_status filters the
            // same way); matching the stored labels first spares deserialising the rest.
            let pods: Vec<Pod> = state
                .iter(pods_resource, Some(&namespace))
                .filter(|p| selector.matches_json_labels(labels_json(p)))
                .filter_map(|p| serde_json::from_value(p.clone()).ok())
                .collect();
            let update = disruption::compute_pdb_status_with_timeout(
                &pdb,
                &pods,
                |owner| controller_scale(state, &namespace, owner),
                now,
                timeout,
            );
            let key = (namespace, name);
            match update.recheck_at {
                Some(at) => memory.rechecks.insert(key, at),
                None => memory.rechecks.remove(&key),
            };
            if disruption::status_needs_write(&pdb, &update.status) {
                let mut object = pdb_value;
                match serde_json::to_value(&update.status) {
                    Ok(status) => object["status"] = status,
                    Err(_) => continue,
                }
                update_full(state, pdbs_resource, object);
            }
        }
        let recheck_at = memory.rechecks.values().min().copied();
        memory.recheck_at = recheck_at;
        memory.synced_rv = state.resource_version();
    }
}

fn labels_json(object: &Value) -> Option<&serde_json::Map<String, Value>> {
    object
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
}

/// Whether `change` can alter the status of budget `namespace/name` (selecting `selector`): a change of the
/// PDB itself, of a pod of its namespace it selects before or after the change, or of the
/// replica count of a workload in its namespace (its `expectedPods`).
fn affects(change: &Change, namespace: &str, name: &str, selector: &LabelQuery) -> bool {
    let object = &change.object;
    if meta_str(object, "namespace") != namespace {
        return false;
    }
    let previous = change.previous.as_ref();
    match (change.resource.group, change.resource.plural) {
        ("policy", "poddisruptionbudgets") => meta_str(object, "name") == name,
        ("", "pods") => {
            selector.matches_json_labels(labels_json(object))
                || previous.is_some_and(|p| selector.matches_json_labels(labels_json(p)))
        }
        ("apps", _) => {
            change.change != ChangeType::Modified
                || previous.is_none_or(|p| replicas(p) != replicas(object))
        }
        _ => false,
    }
}

/// Resolves a pod's controller to the object whose replica count the PDB expects.
fn controller_scale(
    state: &State,
    namespace: &str,
    owner: &OwnerReference,
) -> Option<ControllerScale> {
    let find_by_uid = |plural: &str, uid: &str| {
        state
            .iter(resource("apps", plural), Some(namespace))
            .find(|o| meta_str(o, "uid") == uid)
            .cloned()
    };
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let replica_set = find_by_uid("replicasets", &owner.uid)?;
            if let Some(deployment_uid) = controller_uid(&replica_set)
                && let Some(deployment) = find_by_uid("deployments", deployment_uid)
            {
                return Some(ControllerScale {
                    uid: deployment_uid.to_owned(),
                    replicas: i32::try_from(replicas(&deployment)).unwrap_or(i32::MAX),
                });
            }
            Some(ControllerScale {
                uid: owner.uid.clone(),
                replicas: i32::try_from(replicas(&replica_set)).unwrap_or(i32::MAX),
            })
        }
        "StatefulSet" => {
            let set = find_by_uid("statefulsets", &owner.uid)?;
            Some(ControllerScale {
                uid: owner.uid.clone(),
                replicas: i32::try_from(replicas(&set)).unwrap_or(i32::MAX),
            })
        }
        "Deployment" => {
            let deployment = find_by_uid("deployments", &owner.uid)?;
            Some(ControllerScale {
                uid: owner.uid.clone(),
                replicas: i32::try_from(replicas(&deployment)).unwrap_or(i32::MAX),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures;
    use crate::kube::simulation::SimulationTimings;
    use crate::kube::store::Store;
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use serde_json::json;
    use std::collections::BTreeMap;
    use std::time::Duration;

    const NS: &str = "default";

    /// `budgets` ReplicaSets `app-<i>` of two Ready pods, each with a PDB
    /// `maxUnavailable: 1`, synced once.
    fn cluster(budgets: usize, disrupted_pod_timeout: Duration) -> (Store, Simulation) {
        let store = Store::new();
        store.create(&fixtures::ready_node("n1")).unwrap();
        for i in 0..budgets {
            let app = format!("app-{i}");
            let labels = [("app", app.as_str())];
            let set = store
                .create(&fixtures::replica_set(NS, &app, 2, &labels))
                .unwrap();
            for r in 0..2 {
                let pod = fixtures::running_pod(NS, &format!("{app}-{r}"), "n1", &labels);
                store.create(&fixtures::owned_by(pod, &set)).unwrap();
            }
            store
                .create(&fixtures::pdb_max_unavailable(NS, &app, json!(1), &labels))
                .unwrap();
        }
        let simulation = Simulation::new(
            store.clone(),
            SimulationTimings {
                disrupted_pod_timeout,
                // These tests step the controller by hand and read the status at once.
                pdb_status_lag: std::time::Duration::ZERO,
                ..SimulationTimings::default()
            },
        );
        simulation.step();
        (store, simulation)
    }

    fn status(store: &Store, name: &str) -> (i32, i32, i32) {
        let pdb: PodDisruptionBudget = store.get(NS, name).unwrap();
        let status = pdb.status.unwrap();
        (
            status.disruptions_allowed,
            status.current_healthy,
            status.expected_pods,
        )
    }

    fn set_ready(store: &Store, pod: &str, ready: bool) {
        store
            .modify::<Pod>(NS, pod, |p| {
                for c in p
                    .status
                    .as_mut()
                    .and_then(|s| s.conditions.as_mut())
                    .into_iter()
                    .flatten()
                {
                    if c.type_ == "Ready" {
                        c.status = if ready { "True" } else { "False" }.to_owned();
                    }
                }
            })
            .unwrap();
    }

    #[test]
    fn a_pod_change_resyncs_only_the_budgets_that_select_it_in_the_same_step() {
        let (store, simulation) = cluster(10, Duration::from_secs(120));
        assert_eq!(simulation.budgets_synced(), 10, "the first step syncs all");
        assert_eq!(status(&store, "app-3"), (1, 2, 2));
        simulation.step();
        assert_eq!(
            simulation.budgets_synced(),
            10,
            "its own writes change nothing"
        );

        set_ready(&store, "app-3-0", false);
        simulation.step();
        assert_eq!(status(&store, "app-3"), (0, 1, 2), "within the same step");
        assert_eq!(simulation.budgets_synced(), 11, "only app-3's budget");
        assert_eq!(status(&store, "app-4"), (1, 2, 2));

        set_ready(&store, "app-3-0", true);
        simulation.step();
        assert_eq!(status(&store, "app-3"), (1, 2, 2));
        assert_eq!(simulation.budgets_synced(), 12);
    }

    #[test]
    fn a_scale_change_resyncs_the_budgets_of_its_namespace() {
        let (store, simulation) = cluster(2, Duration::from_secs(120));
        store
            .modify::<ReplicaSet>(NS, "app-1", |rs| {
                if let Some(spec) = rs.spec.as_mut() {
                    spec.replicas = Some(3);
                }
            })
            .unwrap();
        simulation.step();
        assert_eq!(
            status(&store, "app-1").2,
            3,
            "expectedPods follows the scale"
        );
        assert_eq!(status(&store, "app-0").2, 2);
    }

    #[test]
    fn an_expired_disruption_is_rechecked_while_other_budgets_change() {
        let timeout = Duration::from_millis(300);
        let (store, simulation) = cluster(2, timeout);
        // app-0-0 was evicted (the eviction handler's record) but never deleted. The time is
        // a second ahead: the API's timestamps have whole seconds, so its promise expires
        // between 0.3 s and 1.3 s from now.
        store
            .modify::<PodDisruptionBudget>(NS, "app-0", |pdb| {
                let status = pdb.status.as_mut().unwrap();
                status.disruptions_allowed = 0;
                status.disrupted_pods = Some(BTreeMap::from([(
                    "app-0-0".to_owned(),
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::now() + jiff::SignedDuration::from_secs(1),
                    ),
                )]));
            })
            .unwrap();
        simulation.step();
        assert_eq!(status(&store, "app-0"), (0, 1, 2), "promised to go");
        // Only the other budget changes meanwhile.
        set_ready(&store, "app-1-0", false);
        simulation.step();
        std::thread::sleep(Duration::from_secs(1) + timeout + Duration::from_millis(50));
        simulation.step();
        assert_eq!(
            status(&store, "app-0"),
            (1, 2, 2),
            "the promise expired: the pod counts again"
        );
    }
}
