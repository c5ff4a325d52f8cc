//! The cluster's moving parts, emulated on a tick: a kubelet (starts scheduled pods, removes
//! pods whose grace period has passed, turns registered nodes Ready), a scheduler, the
//! Deployment/ReplicaSet/StatefulSet/DaemonSet controllers (replacements for pods that go
//! away, so a PDB-blocked drain makes progress as in a real cluster) and the disruption
//! controller (PDB status, from `kube::disruption`).
//!
//! Each step runs under the store lock, so tests never observe half a step.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

use super::disruption::{self, ControllerScale};
use super::resources::{self, ResourceType};
use super::selectors::LabelQuery;
use super::store::{
    Change, ChangeType, DeleteOptions, Origin, State, Store, UpdateMode, meta_str, name_suffix,
    now_rfc3339,
};

/// How fast the emulated cluster moves. Tests scale everything down.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulationTimings {
    /// How often the emulation runs.
    pub tick: Duration,
    /// Grace periods (seconds in the API) last this many real seconds per second: `0.01`
    /// makes a 30 s grace period 300 ms.
    pub grace_period_scale: f64,
    /// From a pod bound to a Ready node to the pod Running and Ready.
    pub pod_start_delay: Duration,
    /// Default for nodes registered without an explicit delay.
    pub node_ready_after: Duration,
    /// How long the disruption controller keeps an evicted pod in `disruptedPods` before it
    /// counts it again (120 s in Kubernetes).
    pub disrupted_pod_timeout: Duration,
    /// Turns the whole emulation off (a static cluster).
    pub enabled: bool,
}

impl Default for SimulationTimings {
    /// Scaled down for tests: pods start in 100 ms, a 30 s grace period lasts 300 ms.
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(10),
            grace_period_scale: 0.01,
            pod_start_delay: Duration::from_millis(100),
            node_ready_after: Duration::from_millis(200),
            disrupted_pod_timeout: Duration::from_secs(120),
            enabled: true,
        }
    }
}

impl SimulationTimings {
    /// Real-cluster speeds (for the interactive sandbox).
    pub fn real_time() -> Self {
        Self {
            tick: Duration::from_millis(100),
            grace_period_scale: 1.0,
            pod_start_delay: Duration::from_secs(5),
            node_ready_after: Duration::from_secs(30),
            disrupted_pod_timeout: Duration::from_secs(120),
            enabled: true,
        }
    }

    /// No emulation at all.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }
}

#[derive(Default)]
struct Memory {
    /// Nodes registered through [`Simulation::register_node`] and when they turn Ready.
    node_ready_at: HashMap<String, Instant>,
    /// When a bound pod was first seen Pending (by uid).
    pod_bound_at: HashMap<String, Instant>,
    /// Resource version the disruption controller last synced at, and when to resync anyway.
    synced_rv: u64,
    recheck_at: Option<jiff::Timestamp>,
    /// When each budget with a pending `disruptedPods` entry must be recomputed even if
    /// nothing it depends on changes (the earliest of them is `recheck_at`).
    rechecks: HashMap<(String, String), jiff::Timestamp>,
    /// Budgets whose status the disruption controller recomputed, in total.
    budgets_synced: u64,
    steps: StepTimes,
    /// Resource version the garbage collector last looked at deletions from.
    collected_rv: u64,
    /// Nodes whose kubelet was stopped ([`Simulation::kill_kubelet`]).
    dead_kubelets: HashSet<String>,
}

/// How long the steps took (each holds the store lock, so every request waits for it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    pub count: u64,
    pub total: Duration,
    pub longest: Duration,
}

impl StepTimes {
    /// Adds another run's steps.
    pub fn merge(&mut self, other: StepTimes) {
        self.count += other.count;
        self.total += other.total;
        self.longest = self.longest.max(other.longest);
    }

    fn record(&mut self, took: Duration) {
        self.count += 1;
        self.total += took;
        self.longest = self.longest.max(took);
    }

    pub fn mean(&self) -> Duration {
        self.total
            .checked_div(u32::try_from(self.count).unwrap_or(u32::MAX))
            .unwrap_or_default()
    }
}

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

/// The emulated kubelet and controllers of one fake cluster.
#[derive(Clone)]
pub struct Simulation {
    store: Store,
    timings: SimulationTimings,
    memory: Arc<Mutex<Memory>>,
}

fn resource(group: &str, plural: &str) -> &'static ResourceType {
    resources::RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)
        .unwrap_or(&resources::RESOURCES[0])
}

fn status_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("status")
        .and_then(|s| s.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn spec_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("spec")
        .and_then(|s| s.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn being_deleted(object: &Value) -> bool {
    object
        .get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some()
}

fn condition_true(object: &Value, kind: &str) -> bool {
    object
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(kind)
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// The uid of the object's controller (ownerReference with `controller: true`).
fn controller_uid(object: &Value) -> Option<&str> {
    object
        .get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|r| r.get("uid"))
        .and_then(Value::as_str)
}

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

fn replicas(object: &Value) -> i64 {
    object
        .get("spec")
        .and_then(|s| s.get("replicas"))
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

/// The taint a cordoned node carries for the scheduler.
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// The taints the scheduler sees on a node: its own, plus the cordon's `NoSchedule` taint
/// when `spec.unschedulable` is set (what the NodeUnschedulable filter checks).
fn scheduling_taints(node: &Value) -> Vec<(String, String, String)> {
    let mut taints: Vec<(String, String, String)> = node
        .get("spec")
        .and_then(|s| s.get("taints"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| {
            let field = |name: &str| {
                t.get(name)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            (field("key"), field("value"), field("effect"))
        })
        .collect();
    let cordoned = node
        .get("spec")
        .and_then(|s| s.get("unschedulable"))
        .and_then(Value::as_bool)
        == Some(true);
    if cordoned {
        taints.push((
            UNSCHEDULABLE_TAINT.to_owned(),
            String::new(),
            "NoSchedule".to_owned(),
        ));
    }
    taints
}

/// Whether one of the pod's tolerations matches the taint (the scheduler's rules: an empty
/// key with `Exists` matches every key, `Exists` any value, an empty effect every effect).
fn tolerates(pod: &Value, (key, value, effect): &(String, String, String)) -> bool {
    pod.get("spec")
        .and_then(|s| s.get("tolerations"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|t| {
            let field = |name: &str| t.get(name).and_then(Value::as_str).unwrap_or_default();
            let exists = field("operator") == "Exists";
            let key_matches = if field("key").is_empty() {
                exists
            } else {
                field("key") == key
            };
            let value_matches = exists || field("value") == value;
            let effect_matches = field("effect").is_empty() || field("effect") == effect;
            key_matches && value_matches && effect_matches
        })
}

/// Whether a node may take pods at all: Ready and not being deleted.
fn schedulable(node: &Value) -> bool {
    condition_true(node, "Ready") && !being_deleted(node)
}

/// Whether `pod` may be placed on `node`: the node takes pods and every `NoSchedule` and
/// `NoExecute` taint on it (the cordon's included) is tolerated.
fn fits(pod: &Value, node: &Value) -> bool {
    schedulable(node)
        && scheduling_taints(node)
            .iter()
            .filter(|(_, _, effect)| effect == "NoSchedule" || effect == "NoExecute")
            .all(|taint| tolerates(pod, taint))
}

fn update_full(state: &mut State, resource: &'static ResourceType, mut object: Value) {
    let namespace = meta_str(&object, "namespace").to_owned();
    let name = meta_str(&object, "name").to_owned();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
    }
    if let Err(error) = state.update(resource, &namespace, &name, object, UpdateMode::Full) {
        tracing::debug!(%error, "simulation update failed");
    }
}

impl Simulation {
    pub(crate) fn new(store: Store, timings: SimulationTimings) -> Self {
        store.set_grace_scale(timings.grace_period_scale);
        Self {
            store,
            timings,
            memory: Arc::default(),
        }
    }

    pub fn timings(&self) -> &SimulationTimings {
        &self.timings
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a node as a kubelet would after an instance launches: `NotReady` now,
    /// `Ready` after `ready_after` (`None`: the scenario's default).
    pub fn register_node(
        &self,
        name: &str,
        provider_id: &str,
        ready_after: Option<Duration>,
    ) -> Result<Value, super::status::ApiError> {
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
            },
        });
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
    pub fn stop_node(&self, name: &str) -> Result<(), super::status::ApiError> {
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
    ) -> Result<(), super::status::ApiError> {
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
    pub fn kill_kubelet(&self, node: &str) -> Result<(), super::status::ApiError> {
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

    /// How many budget statuses the disruption controller has recomputed so far: one per
    /// budget whose pods, controllers or own object changed in a step.
    pub fn budgets_synced(&self) -> u64 {
        self.memory().budgets_synced
    }

    /// How long the steps so far took.
    pub fn step_times(&self) -> StepTimes {
        self.memory().steps
    }

    /// Whether the kubelet of `node` was stopped with [`Simulation::kill_kubelet`].
    pub fn is_kubelet_dead(&self, node: &str) -> bool {
        self.memory().dead_kubelets.contains(node)
    }

    /// Runs the emulation until `shutdown` flips.
    pub(crate) async fn run(self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        if !self.timings.enabled {
            return;
        }
        let mut ticker = tokio::time::interval(self.timings.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = ticker.tick() => self.step(),
            }
        }
    }

    /// One pass of every emulated component.
    pub fn step(&self) {
        let mut memory = self.memory();
        let mut state = self.store.lock();
        let now = Instant::now();
        self.garbage_collector(&mut state, &mut memory);
        self.kubelet_removes_terminated_pods(&mut state, &memory, now);
        self.kubelet_turns_nodes_ready(&mut state, &mut memory, now);
        self.deployments(&mut state);
        self.replica_sets(&mut state);
        self.stateful_sets(&mut state);
        self.daemon_sets(&mut state);
        self.scheduler(&mut state);
        self.kubelet_starts_pods(&mut state, &mut memory, now);
        self.workload_status(&mut state);
        self.disruption_controller(&mut state, &mut memory);
        memory.steps.record(now.elapsed());
    }

    /// Cascading deletion (background propagation): objects whose controller was deleted go
    /// too; pods bound to a deleted node are removed (the pod garbage collector). Only owners
    /// and nodes deleted while the server runs count, so a scenario's hand-made owner
    /// references to objects it never created are left alone.
    fn garbage_collector(&self, state: &mut State, memory: &mut Memory) {
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

    /// `status` of ReplicaSets, Deployments, StatefulSets and DaemonSets from their pods.
    fn workload_status(&self, state: &mut State) {
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

    fn kubelet_removes_terminated_pods(&self, state: &mut State, memory: &Memory, now: Instant) {
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

    fn kubelet_turns_nodes_ready(&self, state: &mut State, memory: &mut Memory, now: Instant) {
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
            update_full(state, nodes, node);
        }
    }

    /// A Deployment gets one ReplicaSet with its template and replica count.
    fn deployments(&self, state: &mut State) {
        let deployments = resource("apps", "deployments");
        let replica_sets = resource("apps", "replicasets");
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
    fn replica_sets(&self, state: &mut State) {
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
    fn stateful_sets(&self, state: &mut State) {
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
            let pod = Self::pod_from_template(&set, "StatefulSet", Some(name));
            if let Err(error) = state.create(pods, &namespace, pod, Origin::Setup) {
                tracing::debug!(%error, "simulated StatefulSet controller could not create a pod");
            }
        }
    }

    /// Every Ready node gets one pod of each DaemonSet (cordoned nodes too: DaemonSet pods
    /// tolerate `unschedulable`). A drain leaves them alone.
    fn daemon_sets(&self, state: &mut State) {
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

    /// Binds unscheduled pods to the node with the fewest pods among those that take them:
    /// Ready, and every `NoSchedule`/`NoExecute` taint tolerated, the cordon's included (a
    /// pod tolerating `node.kubernetes.io/unschedulable` may land on a cordoned node, and an
    /// emptying node is the emptiest).
    fn scheduler(&self, state: &mut State) {
        let pods = resource("", "pods");
        let nodes = resource("", "nodes");
        let pending: Vec<Value> = state
            .iter(pods, None)
            .filter(|p| spec_str(p, "nodeName").is_empty() && !being_deleted(p))
            .cloned()
            .collect();
        if pending.is_empty() {
            return;
        }
        let candidates: Vec<Value> = state
            .iter(nodes, None)
            .filter(|n| schedulable(n))
            .cloned()
            .collect();
        if candidates.is_empty() {
            return;
        }
        let mut load: BTreeMap<String, usize> = candidates
            .iter()
            .map(|n| (meta_str(n, "name").to_owned(), 0))
            .collect();
        for pod in state.iter(pods, None) {
            if let Some(count) = load.get_mut(spec_str(pod, "nodeName")) {
                *count += 1;
            }
        }
        for mut pod in pending {
            let Some(node) = candidates
                .iter()
                .filter(|n| fits(&pod, n))
                .map(|n| meta_str(n, "name"))
                .min_by_key(|name| load.get(*name).copied().unwrap_or(usize::MAX))
                .map(str::to_owned)
            else {
                continue;
            };
            if let Some(count) = load.get_mut(&node) {
                *count += 1;
            }
            pod["spec"]["nodeName"] = json!(node);
            update_full(state, pods, pod);
        }
    }

    /// Bound Pending pods on Ready nodes become Running and Ready after the start delay.
    fn kubelet_starts_pods(&self, state: &mut State, memory: &mut Memory, now: Instant) {
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

    /// Recomputes the status of every PDB whose inputs changed since the last sync: its own
    /// object, a pod its selector matches (before or after the change), or the replica
    /// count of a controller in its namespace; every PDB when an evicted pod's
    /// `disruptedPods` entry expires or the change history no longer reaches back. Like the
    /// real disruption controller, which queues the budgets of a changed pod rather than
    /// resyncing all of them: recomputing every budget from every pod of its namespace on
    /// each tick held the store lock for hundreds of milliseconds at 11 budgets and 110 pods
    /// (debug build), which delayed every request and the replacements' start.
    fn disruption_controller(&self, state: &mut State, memory: &mut Memory) {
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
    use k8s_openapi::api::apps::v1::ReplicaSet;

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
