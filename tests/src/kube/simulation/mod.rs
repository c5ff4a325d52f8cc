//! The cluster's moving parts, emulated on a tick: a kubelet (starts scheduled pods, removes
//! pods whose grace period has passed, turns registered nodes Ready), a scheduler, the
//! Deployment/ReplicaSet/StatefulSet/DaemonSet controllers (replacements for pods that go
//! away, so a PDB-blocked drain makes progress as in a real cluster) and the disruption
//! controller (PDB status, from `kube::disruption`), and the attach/detach controller with a
//! CSI attacher (`VolumeAttachment`s of the volumes pods use).
//!
//! Each step runs under the store lock, so tests never observe half a step.
//!
//! One file per job: `nodes` (nodes registering, stopping, restarting as their instances
//! do; kubelets dying), `kubelet` (the kubelet's part of a step), `scheduler`,
//! `controllers` (the workload controllers and their status), `garbage_collector`,
//! `namespaces` (the namespace controller), `disruption_controller` and `attach_detach`. This file holds the type, its timings and memory, the helpers
//! they share, and the loop that runs a step.

mod attach_detach;
mod controllers;
mod disruption_controller;
mod garbage_collector;
mod kubelet;
mod namespaces;
mod nodes;
mod scheduler;
mod scoring;

pub use self::attach_detach::ATTACHER;
pub use self::kubelet::REPORTED_IMAGE_BYTES;
pub use self::nodes::{NODE_ALLOCATABLE, NODE_CAPACITY, NodeResources, SHUTDOWN_TAINT};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::resources::{self, ResourceType};
use super::store::{State, Store, UpdateMode, meta_str};

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
    /// The kubelets list the images they pulled in their node's `status.images` (500 MiB
    /// each), which the scheduler's ImageLocality score weighs as kube-scheduler's does: it
    /// tilts the choice toward nodes that ran the workload before. On by default, as a
    /// kubelet does; off: no node reports an image, as if every image were under
    /// ImageLocality's 23 MB floor.
    pub prefer_cached_images: bool,
    /// How long the disruption controller takes to see a change (a pod turning Ready, a
    /// replica count, a new budget): a budget's status is at least this old. The real one
    /// works from informers and a queue and lags 0.2–3 s; the default is that to the scale of
    /// the default pod start (100 ms here for ~5 s), real time in [`SimulationTimings::real_time`].
    /// An eviction meets the status as it stands, so 429s vary with it as on a real cluster.
    pub pdb_status_lag: Duration,
    /// From the last pod using a volume on a node being gone to the volume's
    /// `VolumeAttachment` being deleted (the CSI driver's detach; EBS takes seconds).
    pub volume_detach_delay: Duration,
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
            prefer_cached_images: true,
            pdb_status_lag: Duration::from_millis(50),
            volume_detach_delay: Duration::from_millis(200),
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
            prefer_cached_images: true,
            pdb_status_lag: Duration::from_secs(1),
            volume_detach_delay: Duration::from_secs(10),
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
    /// When the disruption controller first saw changes it has not synced yet.
    unsynced_since: Option<Instant>,
    /// When each budget with a pending `disruptedPods` entry must be recomputed even if
    /// nothing it depends on changes (the earliest of them is `recheck_at`).
    rechecks: HashMap<(String, String), jiff::Timestamp>,
    /// Budgets whose status the disruption controller recomputed, in total.
    budgets_synced: u64,
    steps: StepTimes,
    /// Resource version the garbage collector last looked at deletions from.
    collected_rv: u64,
    /// Resource version at which the kubelets last reported their pulled images.
    images_rv: u64,
    /// Nodes whose kubelet was stopped ([`Simulation::kill_kubelet`]).
    dead_kubelets: HashSet<String>,
    /// The disruption controller is held ([`Simulation::hold_disruption_controller`]).
    disruption_held: bool,
    /// The attachments whose volume is no longer used on their node, by name.
    detaching: HashMap<String, attach_detach::Detach>,
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

fn replicas(object: &Value) -> i64 {
    object
        .get("spec")
        .and_then(|s| s.get("replicas"))
        .and_then(Value::as_i64)
        .unwrap_or(1)
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

    /// Holds the disruption controller (`true`) until released (`false`), as a stopped
    /// kube-controller-manager would: budgets created or changed meanwhile keep the status
    /// they had, so an eviction they cover meets a status behind its budget's generation.
    pub fn hold_disruption_controller(&self, held: bool) {
        self.memory().disruption_held = held;
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
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
        self.namespace_controller(&mut state);
        self.out_of_service_nodes(&mut state);
        self.kubelet_removes_terminated_pods(&mut state, &memory, now);
        self.kubelet_turns_nodes_ready(&mut state, &mut memory, now);
        self.attach_detach(&mut state, &mut memory, now);
        self.deployments(&mut state);
        self.replica_sets(&mut state);
        self.stateful_sets(&mut state);
        self.daemon_sets(&mut state);
        self.scheduler(&mut state);
        self.kubelet_starts_pods(&mut state, &mut memory, now);
        // Only what changed can have pulled an image: a quiet store skips the pass over pods.
        if self.timings.prefer_cached_images && state.resource_version() != memory.images_rv {
            kubelet::report_pulled_images(&mut state, memory.images_rv);
            memory.images_rv = state.resource_version();
        }
        self.workload_status(&mut state);
        if self.disruption_controller_due(&state, &mut memory, now) {
            self.disruption_controller(&mut state, &mut memory);
        }
        memory.steps.record(now.elapsed());
    }
}
