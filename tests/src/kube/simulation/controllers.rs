//! The workload controllers: a Deployment gets a ReplicaSet, ReplicaSets and StatefulSets
//! replace pods that go away (so a PDB-blocked drain makes progress as in a real cluster),
//! DaemonSets put a pod on every Ready node, and each workload's `status` follows its pods.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use super::{
    Simulation, being_deleted, condition_true, controller_uid, replicas, resource, spec_str,
    status_str, update_full,
};
use crate::kube::store::{Origin, State, meta_str, name_suffix};

fn owner_reference(owner: &Value, kind: &str, api_version: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "name": meta_str(owner, "name"),
        "uid": meta_str(owner, "uid"),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

impl Simulation {
    /// `status` of ReplicaSets, Deployments, StatefulSets and DaemonSets from their pods.
    pub(super) fn workload_status(&self, state: &mut State) {
        let pods = resource("", "pods");
        let mut live: HashMap<String, (i64, i64)> = HashMap::new();
        for pod in state.iter(pods, None) {
            if being_deleted(pod) || matches!(status_str(pod, "phase"), "Succeeded" | "Failed") {
                continue;
            }
            if let Some(uid) = controller_uid(pod) {
                let entry = live.entry(uid.to_owned()).or_default();
                entry.0 += 1;
                if condition_true(pod, "Ready") {
                    entry.1 += 1;
                }
            }
        }
        let replica_sets = resource("apps", "replicasets");
        // A Deployment counts the pods of its ReplicaSets.
        let mut by_deployment: HashMap<String, (i64, i64)> = HashMap::new();
        for rs in state.iter(replica_sets, None) {
            if let Some(deployment) = controller_uid(rs) {
                let (total, ready) = live.get(meta_str(rs, "uid")).copied().unwrap_or_default();
                let entry = by_deployment.entry(deployment.to_owned()).or_default();
                entry.0 += total;
                entry.1 += ready;
            }
        }
        let ready_nodes = state
            .iter(resource("", "nodes"), None)
            .filter(|n| condition_true(n, "Ready"))
            .count() as i64;
        for plural in ["replicasets", "deployments", "statefulsets", "daemonsets"] {
            let workloads = resource("apps", plural);
            let updates: Vec<Value> = state
                .iter(workloads, None)
                .filter_map(|workload| {
                    let uid = meta_str(workload, "uid");
                    let counts = if plural == "deployments" {
                        &by_deployment
                    } else {
                        &live
                    };
                    let (total, ready) = counts.get(uid).copied().unwrap_or_default();
                    let generation = workload
                        .get("metadata")
                        .and_then(|m| m.get("generation"))
                        .cloned()
                        .unwrap_or(json!(1));
                    let status = if plural == "daemonsets" {
                        json!({
                            "currentNumberScheduled": total,
                            "desiredNumberScheduled": ready_nodes,
                            "numberAvailable": ready,
                            "numberMisscheduled": 0,
                            "numberReady": ready,
                            "updatedNumberScheduled": total,
                            "observedGeneration": generation,
                        })
                    } else {
                        json!({
                            "replicas": total,
                            "readyReplicas": ready,
                            "availableReplicas": ready,
                            "updatedReplicas": total,
                            "observedGeneration": generation,
                        })
                    };
                    (workload.get("status") != Some(&status)).then(|| {
                        let mut updated = workload.clone();
                        updated["status"] = status;
                        updated
                    })
                })
                .collect();
            for updated in updates {
                update_full(state, workloads, updated);
            }
        }
    }

    /// A Deployment gets one ReplicaSet with its template and replica count, and its
    /// ReplicaSet follows the Deployment's replica count when it is scaled (a changed template,
    /// a rollout, is not emulated).
    pub(super) fn deployments(&self, state: &mut State) {
        let deployments = resource("apps", "deployments");
        let replica_sets = resource("apps", "replicasets");
        Self::scale_replica_sets(state);
        let owned: HashSet<String> = state
            .iter(replica_sets, None)
            .filter_map(controller_uid)
            .map(str::to_owned)
            .collect();
        let missing: Vec<Value> = state
            .iter(deployments, None)
            .filter(|d| !being_deleted(d) && !owned.contains(meta_str(d, "uid")))
            .cloned()
            .collect();
        for deployment in missing {
            let namespace = meta_str(&deployment, "namespace").to_owned();
            let template = deployment["spec"]["template"].clone();
            let replica_set = json!({
                "metadata": {
                    "name": format!("{}-{}", meta_str(&deployment, "name"), name_suffix()),
                    "namespace": namespace,
                    "labels": template.get("metadata").and_then(|m| m.get("labels")).cloned().unwrap_or(json!({})),
                    "ownerReferences": [owner_reference(&deployment, "Deployment", "apps/v1")],
                },
                "spec": {
                    "replicas": replicas(&deployment),
                    "selector": deployment["spec"]["selector"].clone(),
                    "template": template,
                },
            });
            if let Err(error) = state.create(replica_sets, &namespace, replica_set, Origin::Setup) {
                tracing::debug!(%error, "simulated deployment controller could not create a ReplicaSet");
            }
        }
    }

    /// Sets each Deployment's one ReplicaSet to the Deployment's replica count.
    fn scale_replica_sets(state: &mut State) {
        let replica_sets = resource("apps", "replicasets");
        let wanted: HashMap<String, i64> = state
            .iter(resource("apps", "deployments"), None)
            .filter(|d| !being_deleted(d))
            .map(|d| (meta_str(d, "uid").to_owned(), replicas(d)))
            .collect();
        let mut owned: HashMap<&str, usize> = HashMap::new();
        for owner in state.iter(replica_sets, None).filter_map(controller_uid) {
            *owned.entry(owner).or_default() += 1;
        }
        let scaled: Vec<Value> = state
            .iter(replica_sets, None)
            .filter_map(|rs| {
                let owner = controller_uid(rs)?;
                // Several ReplicaSets are a rollout's: not emulated, left alone.
                if owned.get(owner) != Some(&1) {
                    return None;
                }
                let count = *wanted.get(owner)?;
                (replicas(rs) != count).then(|| {
                    let mut rs = rs.clone();
                    rs["spec"]["replicas"] = json!(count);
                    rs
                })
            })
            .collect();
        for replica_set in scaled {
            update_full(state, replica_sets, replica_set);
        }
    }

    /// How many live pods (not terminal, not being deleted) each controller uid has. Counts,
    /// not copies: this runs every tick over every pod.
    fn live_pods_by_owner(state: &State) -> HashMap<&str, usize> {
        let mut by_owner: HashMap<&str, usize> = HashMap::new();
        for pod in state.iter(resource("", "pods"), None) {
            let phase = status_str(pod, "phase");
            if being_deleted(pod) || phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            if let Some(uid) = controller_uid(pod) {
                *by_owner.entry(uid).or_default() += 1;
            }
        }
        by_owner
    }

    fn pod_from_template(owner: &Value, kind: &str, name: Option<String>) -> Value {
        let template = owner
            .get("spec")
            .and_then(|s| s.get("template"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        let mut metadata = template
            .get("metadata")
            .cloned()
            .unwrap_or_else(|| json!({}));
        match name {
            Some(name) => metadata["name"] = json!(name),
            None => metadata["generateName"] = json!(format!("{}-", meta_str(owner, "name"))),
        }
        metadata["namespace"] = json!(meta_str(owner, "namespace"));
        metadata["ownerReferences"] = json!([owner_reference(owner, kind, "apps/v1")]);
        json!({
            "metadata": metadata,
            "spec": template.get("spec").cloned().unwrap_or_else(|| json!({ "containers": [] })),
            "status": { "phase": "Pending" },
        })
    }

    /// A ReplicaSet with fewer live pods than replicas gets new ones (left for the scheduler).
    pub(super) fn replica_sets(&self, state: &mut State) {
        let replica_sets = resource("apps", "replicasets");
        let pods = resource("", "pods");
        let by_owner = Self::live_pods_by_owner(state);
        let short: Vec<(Value, i64)> = state
            .iter(replica_sets, None)
            .filter(|rs| !being_deleted(rs))
            .filter_map(|rs| {
                let live = by_owner.get(meta_str(rs, "uid")).copied().unwrap_or(0) as i64;
                let missing = replicas(rs) - live;
                (missing > 0).then(|| (rs.clone(), missing))
            })
            .collect();
        for (replica_set, missing) in short {
            let namespace = meta_str(&replica_set, "namespace").to_owned();
            for _ in 0..missing {
                let pod = Self::pod_from_template(&replica_set, "ReplicaSet", None);
                if let Err(error) = state.create(pods, &namespace, pod, Origin::Setup) {
                    tracing::debug!(%error, "simulated ReplicaSet controller could not create a pod");
                }
            }
        }
    }

    /// A StatefulSet's pod `<name>-<ordinal>` is recreated once the old one is fully gone.
    pub(super) fn stateful_sets(&self, state: &mut State) {
        let stateful_sets = resource("apps", "statefulsets");
        let pods = resource("", "pods");
        let mut wanted = Vec::new();
        for set in state
            .iter(stateful_sets, None)
            .filter(|s| !being_deleted(s))
        {
            let namespace = meta_str(set, "namespace");
            for ordinal in 0..replicas(set) {
                let name = format!("{}-{ordinal}", meta_str(set, "name"));
                if state.get(pods, namespace, &name).is_err() {
                    wanted.push((set.clone(), name));
                }
            }
        }
        for (set, name) in wanted {
            let namespace = meta_str(&set, "namespace").to_owned();
            let mut pod = Self::pod_from_template(&set, "StatefulSet", Some(name.clone()));
            claim_volumes(state, &set, &name, &mut pod);
            if let Err(error) = state.create(pods, &namespace, pod, Origin::Setup) {
                tracing::debug!(%error, "simulated StatefulSet controller could not create a pod");
            }
        }
    }

    /// Every Ready node gets one pod of each DaemonSet (cordoned nodes too: DaemonSet pods
    /// tolerate `unschedulable`). A drain leaves them alone.
    pub(super) fn daemon_sets(&self, state: &mut State) {
        let daemon_sets = resource("apps", "daemonsets");
        let pods = resource("", "pods");
        let nodes = resource("", "nodes");
        let ready_nodes: Vec<String> = state
            .iter(nodes, None)
            .filter(|n| condition_true(n, "Ready") && !being_deleted(n))
            .map(|n| meta_str(n, "name").to_owned())
            .collect();
        if ready_nodes.is_empty() {
            return;
        }
        let mut placed: HashSet<(String, String)> = HashSet::new();
        for pod in state.iter(pods, None) {
            if let Some(uid) = controller_uid(pod) {
                placed.insert((uid.to_owned(), spec_str(pod, "nodeName").to_owned()));
            }
        }
        let mut wanted = Vec::new();
        for set in state.iter(daemon_sets, None).filter(|s| !being_deleted(s)) {
            for node in &ready_nodes {
                if !placed.contains(&(meta_str(set, "uid").to_owned(), node.clone())) {
                    wanted.push((set.clone(), node.clone()));
                }
            }
        }
        for (set, node) in wanted {
            let namespace = meta_str(&set, "namespace").to_owned();
            let mut pod = Self::pod_from_template(&set, "DaemonSet", None);
            pod["spec"]["nodeName"] = json!(node);
            if let Err(error) = state.create(pods, &namespace, pod, Origin::Setup) {
                tracing::debug!(%error, "simulated DaemonSet controller could not create a pod");
            }
        }
    }
}

/// The claims of a StatefulSet pod from the set's `volumeClaimTemplates`: each named
/// `<template>-<pod>`, created when missing (bound at once to a volume `pv-<claim>`, standing
/// in for the provisioner) and mounted into `pod` as a volume named after the template.
fn claim_volumes(state: &mut State, set: &Value, pod_name: &str, pod: &mut Value) {
    let claims = resource("", "persistentvolumeclaims");
    let namespace = meta_str(set, "namespace").to_owned();
    let templates = set["spec"]["volumeClaimTemplates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for template in templates {
        let volume = meta_str(&template, "name").to_owned();
        let claim_name = format!("{volume}-{pod_name}");
        if state.get(claims, &namespace, &claim_name).is_err() {
            let mut spec = template["spec"].clone();
            spec["volumeName"] = Value::from(format!("pv-{claim_name}"));
            let claim = serde_json::json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim_name, "namespace": namespace},
                "spec": spec,
                "status": {"phase": "Bound"},
            });
            if let Err(error) = state.create(claims, &namespace, claim, Origin::Setup) {
                tracing::debug!(%error, "simulated StatefulSet controller could not create a claim");
            }
        }
        if let Some(volumes) = pod["spec"]
            .as_object_mut()
            .map(|spec| {
                spec.entry("volumes")
                    .or_insert_with(|| Value::Array(Vec::new()))
            })
            .and_then(Value::as_array_mut)
        {
            volumes.push(serde_json::json!({"name": volume, "persistentVolumeClaim": {"claimName": claim_name}}));
        }
    }
}
