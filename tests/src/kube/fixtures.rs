//! Builders for the objects scenarios put in the fake cluster: Ready nodes, workloads with
//! their pods (owner references set so the emulated controllers replace them), PDBs.
//!
//! ```no_run
//! # fn demo(server: &node_manager_testkit::kube::FakeApiServer) -> Result<(), Box<dyn std::error::Error>> {
//! use node_manager_testkit::kube::fixtures;
//! let store = server.store();
//! store.create(&fixtures::ready_node("n1"))?;
//! let rs = store.create(&fixtures::replica_set("default", "web", 2, &[("app", "web")]))?;
//! store.create(&fixtures::owned_by(fixtures::running_pod("default", "web-1", "n1", &[("app", "web")]), &rs))?;
//! store.create(&fixtures::pdb_min_available("default", "web", 1, &[("app", "web")]))?;
//! # Ok(()) }
//! ```

use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Value, json};

fn labels(pairs: &[(&str, &str)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect(),
    )
}

fn decode<T: serde::de::DeserializeOwned + Default>(value: Value) -> T {
    // The JSON above is written for these types; a mismatch is a bug in this file.
    serde_json::from_value(value).unwrap_or_default()
}

/// A Ready, schedulable node with an AWS provider ID.
pub fn ready_node(name: &str) -> Node {
    let now = crate::kube::store::now_rfc3339();
    decode(json!({
        "metadata": {
            "name": name,
            "labels": { "kubernetes.io/hostname": name, "kubernetes.io/os": "linux" },
        },
        "spec": { "providerID": format!("aws:///eu-west-1a/i-{:0>17}", name.len()) },
        "status": {
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
            "nodeInfo": { "kubeletVersion": "v1.33.0-eks-fake" },
        },
    }))
}

fn pod_template(pod_labels: &[(&str, &str)]) -> Value {
    json!({
        "metadata": { "labels": labels(pod_labels) },
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "containers": [{ "name": "app", "image": "public.ecr.aws/nginx/nginx:latest" }],
        },
    })
}

/// A ReplicaSet keeping `replicas` pods with these labels.
pub fn replica_set(
    namespace: &str,
    name: &str,
    replicas: i32,
    pod_labels: &[(&str, &str)],
) -> ReplicaSet {
    decode(json!({
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": labels(pod_labels) },
            "template": pod_template(pod_labels),
        },
    }))
}

/// A StatefulSet with `replicas` pods named `<name>-<i>`.
pub fn stateful_set(
    namespace: &str,
    name: &str,
    replicas: i32,
    pod_labels: &[(&str, &str)],
) -> StatefulSet {
    decode(json!({
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": { "matchLabels": labels(pod_labels) },
            "template": pod_template(pod_labels),
        },
    }))
}

/// A DaemonSet (the emulation puts one pod on every Ready node).
pub fn daemon_set(namespace: &str, name: &str, pod_labels: &[(&str, &str)]) -> DaemonSet {
    decode(json!({
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "selector": { "matchLabels": labels(pod_labels) },
            "template": pod_template(pod_labels),
        },
    }))
}

/// A pod bound to `node`, Running and Ready.
pub fn running_pod(namespace: &str, name: &str, node: &str, pod_labels: &[(&str, &str)]) -> Pod {
    let now = crate::kube::store::now_rfc3339();
    let condition =
        |kind: &str| json!({ "type": kind, "status": "True", "lastTransitionTime": now });
    decode(json!({
        "metadata": { "name": name, "namespace": namespace, "labels": labels(pod_labels) },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 30,
            "containers": [{ "name": "app", "image": "public.ecr.aws/nginx/nginx:latest" }],
        },
        "status": {
            "phase": "Running",
            "conditions": [condition("Initialized"), condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
            "startTime": now,
        },
    }))
}

/// Adds a controller owner reference to `owner` (a stored object, so it has a uid).
pub fn owned_by<O>(mut pod: Pod, owner: &O) -> Pod
where
    O: k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta>,
{
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: O::API_VERSION.to_owned(),
        kind: O::KIND.to_owned(),
        name: owner.metadata().name.clone().unwrap_or_default(),
        uid: owner.metadata().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    pod
}

/// A pod with an `emptyDir` volume (kubectl drain refuses it without
/// `--delete-emptydir-data`).
pub fn with_empty_dir(mut pod: Pod) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = Some(vec![decode(json!({ "name": "scratch", "emptyDir": {} }))]);
    }
    pod
}

/// A PDB with `minAvailable` (an integer).
pub fn pdb_min_available(
    namespace: &str,
    name: &str,
    min_available: i32,
    pod_labels: &[(&str, &str)],
) -> PodDisruptionBudget {
    decode(json!({
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "minAvailable": min_available, "selector": { "matchLabels": labels(pod_labels) } },
    }))
}

/// A PDB with `maxUnavailable`, an integer or a percentage (`"50%"`).
pub fn pdb_max_unavailable(
    namespace: &str,
    name: &str,
    max_unavailable: Value,
    pod_labels: &[(&str, &str)],
) -> PodDisruptionBudget {
    decode(json!({
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "maxUnavailable": max_unavailable, "selector": { "matchLabels": labels(pod_labels) } },
    }))
}
