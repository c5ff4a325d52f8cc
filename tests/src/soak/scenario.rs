//! Seeded, reproducible fault-soak scenarios, in process: the real terminating-hook,
//! launching-hook and nodegroup-auth handlers against the fake API server (shipped RBAC,
//! injected 5xx / 429 with Retry-After / dropped connections / latency) and the shared
//! crate's in-memory AWS fakes (throttling and 5xx queued per operation).
//!
//! A scenario is a small cluster (2-4 nodes, 1-3 Deployments with or without a PDB, maybe a
//! DaemonSet), 1..n-1 terminating instances, maybe a launching one, maybe node groups to map.
//! Every notification is delivered at least once: duplicated, concurrently, and some
//! deliveries are killed mid-drain (their future dropped at a random moment, as a Lambda
//! environment that dies) and redelivered, until every action is complete or the scenario's
//! time is up. Hand-overs published by the functions are delivered as new invocations.
//!
//! About one scenario in six configures force (`DRAIN_FORCE=true` and the force-delete group),
//! drawn from its own generator so that the other draws of a seed do not change.
//!
//! Invariants ([`ScenarioReport::violations`]):
//! - no PDB was violated: the fake API server's disruption log records every eviction it
//!   decides with the budget's counts in the critical section of the decision; a grant that
//!   evicted a healthy pod and left fewer healthy pods than the budget's `desiredHealthy` (or
//!   the scenario's own minimum) is a violation, and so is any pod DELETE of a PDB-covered
//!   pod unless it is the terminating hook's in a scenario with force configured;
//! - a watchdog also samples every budget's healthy pods every few milliseconds, to catch a
//!   disruption by any other path (a pod turned unready or removed without an eviction or a
//!   DELETE, e.g. by garbage collection of a deleted node); dips on a budget a recorded pod
//!   DELETE touched are left to the rule above;
//! - each lifecycle action completed exactly once, by the function, after its node was
//!   drained (or its drain timed out, which only happens where a PDB cannot be satisfied);
//! - no node of a LAUNCHING instance was ever cordoned or written by the terminating hook;
//! - no pod DELETE request by the terminating hook at all unless force is configured;
//! - `aws-auth` holds every node role once and keeps the entries it had.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use node_manager::aws::in_memory::{
    InMemoryAutoScaling, InMemoryEks, InMemoryInstances, InMemoryNotifications,
};
use node_manager::aws::{
    AuthenticationMode, AutoScaling, AwsError, AwsErrorKind, ClusterDescription, CompletionOutcome,
    HeartbeatOutcome, LifecycleActionRef, LifecycleActionResult, LifecycleHook,
    NodegroupDescription,
};
use node_manager::drain::{Drainer, Invocation};
use node_manager::launch::Launcher;
use node_manager::lifecycle::budget::InvocationBudget;
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::{DrainSettings, LaunchSettings};
use node_manager::nodegroup_auth::handler::NodegroupAuth;
use node_manager::nodegroup_auth::kube_store::KubeAwsAuthStore;
use node_manager::nodegroup_auth::role_mapping::MapRoles;
use node_manager::nodegroup_auth::settings::NodegroupAuthSettings;
use node_manager::retry::RetryPolicy;
use node_manager::settings::ClusterScope;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::corpus::{self, Target};
use super::secrets::SecretScanner;
use crate::kube::{DisruptionLog, FakeApiServer, FaultAction, FaultRule, SimulationTimings, Store};

const CLUSTER: &str = "ironman-2022";
const ACCOUNT: &str = "111111111111";
const GROUP: &str = "eks-soak-ng";
const TERMINATE_HOOK: &str = "Terminate-LC-Hook";
const LAUNCH_HOOK: &str = "Launch-LC-Hook";
const TOPIC: &str = "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic";
const ADMIN_ROLE: &str = "arn:aws:iam::111111111111:role/admin";
/// The Kubernetes group `infra/rbac.yaml` grants pod deletion (force mode) to.
const FORCE_GROUP: &str = "open-node-manager:force-delete";
/// The terminating hook's Kubernetes user in the soak.
const DRAIN_USER: &str = "terminating-hook";
/// Mixed into a seed for the force draw, which must not shift the scenario's other draws.
const FORCE_DRAW: u64 = 0xF0_0CE5;
/// Seeds the draws of cluster trouble (dead kubelets, pods tolerating the cordon, eviction
/// 409s, node-write bursts longer than the lease) apart from the rest of the scenario.
const TROUBLE_DRAW: u64 = 0x7B_0B1E;
/// The app whose pods tolerate the cordon: replacements may land back on a draining node,
/// where the drain leaves them (README, "Pods that come back").
const TOLERANT_APP: &str = "tolerant";
/// The wall-clock limit of one scenario's deliveries.
const SCENARIO_LIMIT: Duration = Duration::from_secs(40);

/// What one scenario did and found.
#[derive(Debug, Default, Clone)]
pub struct ScenarioReport {
    pub seed: u64,
    pub nodes: usize,
    pub pods: usize,
    pub pdbs: usize,
    pub terminating: usize,
    pub launching: usize,
    pub nodegroups: usize,
    /// Invocations started (each delivery, duplicate or hand-over).
    pub invocations: u64,
    /// Of those, the duplicates of a delivery (extra copies, concurrent or later).
    pub duplicates: u64,
    /// Invocations dropped mid-flight (killed) and redelivered.
    pub killed: u64,
    /// Hand-overs delivered as new invocations.
    pub hand_overs: u64,
    /// Faults the fake API server injected.
    pub kube_faults: u64,
    /// AWS errors queued (each consumed by one call).
    pub aws_faults: u64,
    /// Force configured (`DRAIN_FORCE=true`, the force-delete group mapped).
    pub forced: bool,
    /// Trouble mixed in: terminating nodes whose kubelet was killed, a Deployment tolerating
    /// the cordon, 409s staged on evictions, a burst of 503s on node writes.
    pub dead_kubelets: usize,
    pub tolerant: bool,
    pub eviction_conflicts: bool,
    pub write_burst: bool,
    /// Eviction requests the fake API server decided (its disruption log).
    pub evictions_decided: u64,
    /// Of those, granted and carried out.
    pub evictions: u64,
    /// Of those, refused by a budget (429, 403).
    pub evictions_refused: u64,
    /// Budget counts checked at a granted eviction (one per covering PDB of each grant).
    pub pdb_checks_at_eviction: u64,
    /// Pod DELETEs carried out (bypassing eviction), and of those, of PDB-covered pods.
    pub pod_deletions: u64,
    pub covered_pod_deletions: u64,
    /// Terminating actions completed, with force configured, while workload pods still ran
    /// on the node (a forced deletion that failed and was not retried). Not a PDB matter, so
    /// counted rather than failed; see RELIABILITY.md.
    pub forced_completions_with_pods: u64,
    /// Healthy-count samples the watchdog took.
    pub samples: u64,
    pub violations: Vec<String>,
    pub elapsed: Duration,
}

/// A PDB's requirement, fixed at scenario start.
#[derive(Debug, Clone)]
struct Budget {
    namespace: String,
    name: String,
    app: String,
    min_healthy: i32,
}

/// A successful completion: the action, its result, the workload pods still running on the
/// node at that instant, and when.
type CompletionSeen = (
    LifecycleActionRef,
    LifecycleActionResult,
    usize,
    std::time::Instant,
);

/// Auto Scaling that remembers, for each successful completion, whether the instance's node
/// still had pods that were not on their way out (a completion before the drain finished).
#[derive(Clone)]
struct WatchedAutoScaling {
    inner: InMemoryAutoScaling,
    store: Store,
    node_of: Arc<BTreeMap<String, String>>,
    completions: Arc<Mutex<Vec<CompletionSeen>>>,
    calls: Arc<AtomicU64>,
}

impl AutoScaling for WatchedAutoScaling {
    async fn complete_lifecycle_action(
        &self,
        action: &LifecycleActionRef,
        result: LifecycleActionResult,
    ) -> Result<CompletionOutcome, AwsError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.complete_lifecycle_action(action, result).await?;
        if outcome == CompletionOutcome::Completed {
            let remaining = self
                .node_of
                .get(&action.instance_id)
                .map(|node| live_workload_pods_on(&self.store, node))
                .unwrap_or(0);
            self.completions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((action.clone(), result, remaining, std::time::Instant::now()));
        }
        Ok(outcome)
    }

    async fn record_lifecycle_action_heartbeat(
        &self,
        action: &LifecycleActionRef,
    ) -> Result<HeartbeatOutcome, AwsError> {
        self.inner.record_lifecycle_action_heartbeat(action).await
    }

    async fn describe_lifecycle_hook(
        &self,
        group_name: &str,
        hook_name: &str,
    ) -> Result<Option<LifecycleHook>, AwsError> {
        self.inner
            .describe_lifecycle_hook(group_name, hook_name)
            .await
    }

    async fn group_tags(
        &self,
        group_name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, AwsError> {
        self.inner.group_tags(group_name).await
    }
}

fn is_daemon_pod(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.kind == "DaemonSet"))
}

/// Whether the pod belongs to the Deployment that tolerates the cordon: like a DaemonSet
/// pod, it may be on a drained node by design.
fn is_tolerant_pod(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app"))
        .is_some_and(|app| app == TOLERANT_APP)
}

/// Pods on `node` that are not DaemonSet pods, not of the app tolerating the cordon and not
/// being deleted.
fn live_workload_pods_on(store: &Store, node: &str) -> usize {
    store
        .list::<Pod>()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none() && !is_daemon_pod(p) && !is_tolerant_pod(p)
        })
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .count()
}

fn pod_healthy(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn healthy_count(store: &Store, budget: &Budget) -> i32 {
    let count = store
        .list_in::<Pod>(&budget.namespace)
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .is_some_and(|a| a == &budget.app)
        })
        .filter(|p| pod_healthy(p))
        .count();
    i32::try_from(count).unwrap_or(i32::MAX)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn instance_id(index: usize) -> String {
    format!(
        "i-0{:016x}",
        0x5a5a_0000_0000_0000_u64 + index as u64 * 0x1_0001
    )
}

fn node_name(index: usize) -> String {
    format!(
        "ip-10-1-{}-{}.eu-west-1.compute.internal",
        index / 200,
        index % 200 + 10
    )
}

fn lifecycle_event(transition: Target, action: &LifecycleActionRef) -> Value {
    let base = corpus::fresh_lifecycle_event(transition);
    let mut message = corpus::message_of(&base);
    message["AutoScalingGroupName"] = json!(action.auto_scaling_group_name);
    message["LifecycleHookName"] = json!(action.lifecycle_hook_name);
    message["EC2InstanceId"] = json!(action.instance_id);
    message["LifecycleActionToken"] = json!(action.token);
    corpus::with_message(&base, &message.to_string())
}

fn hook(name: &str, transition: &str) -> LifecycleHook {
    LifecycleHook {
        name: name.into(),
        transition: transition.into(),
        heartbeat_timeout: Duration::from_secs(30),
        global_timeout: Duration::from_secs(3600),
        default_result: LifecycleActionResult::Abandon,
    }
}

/// Runs scenario `seed`. Errors of the set-up (not of the code under test) panic.
pub async fn run_scenario(seed: u64) -> ScenarioReport {
    let started = std::time::Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut report = ScenarioReport {
        seed,
        ..ScenarioReport::default()
    };

    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .fault_seed(seed)
        .simulation(SimulationTimings {
            tick: Duration::from_millis(5),
            grace_period_scale: 0.002,
            pod_start_delay: Duration::from_millis(30),
            node_ready_after: Duration::ZERO,
            ..SimulationTimings::default()
        })
        .start()
        .await
        .expect("fake API server");
    server
        .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
        .expect("infra/rbac.yaml");
    let store = server.store().clone();

    // Nodes.
    let nodes = rng.random_range(2..=4usize);
    report.nodes = nodes;
    let instances = InMemoryInstances::default();
    let mut node_of = BTreeMap::new();
    for i in 0..nodes {
        server
            .register_node(
                &node_name(i),
                &format!("aws:///eu-west-1a/{}", instance_id(i)),
                Some(Duration::ZERO),
            )
            .expect("node");
        instances.add(&instance_id(i), &node_name(i));
        node_of.insert(instance_id(i), node_name(i));
    }
    // The launching instance's node (registers now, as a kubelet would while the hook waits).
    let launching = rng.random_bool(0.5);
    let force = StdRng::seed_from_u64(seed ^ FORCE_DRAW).random_bool(1.0 / 6.0);
    report.forced = force;
    let mut trouble = StdRng::seed_from_u64(seed ^ TROUBLE_DRAW);
    report.tolerant = trouble.random_bool(0.3);
    report.eviction_conflicts = trouble.random_bool(0.3);
    report.write_burst = trouble.random_bool(0.25);
    let kill_kubelet = trouble.random_bool(0.25);
    let burst_after = Duration::from_millis(trouble.random_range(50..600));
    let burst_length = Duration::from_millis(trouble.random_range(700..1500));
    let launch_index = nodes;
    if launching {
        report.launching = 1;
        instances.add(&instance_id(launch_index), &node_name(launch_index));
        node_of.insert(instance_id(launch_index), node_name(launch_index));
    }
    server
        .wait_for("nodes Ready", Duration::from_secs(10), |s| {
            s.list::<Node>().iter().all(node_ready)
        })
        .await
        .expect("nodes Ready");

    // Workloads.
    let mut budgets = Vec::new();
    let mut yaml = String::new();
    let deployments = rng.random_range(1..=3usize);
    for d in 0..deployments {
        let replicas = rng.random_range(1..=4i32);
        let app = format!("app-{d}");
        let grace = rng.random_range(0..=30);
        yaml.push_str(&format!(
            "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {app}, namespace: default}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {app}}}}}\n  template:\n    metadata: {{labels: {{app: {app}}}}}\n    spec:\n      terminationGracePeriodSeconds: {grace}\n      containers: [{{name: c, image: nginx}}]\n"
        ));
        if rng.random_bool(0.75) {
            // Mostly satisfiable budgets; sometimes one that blocks every eviction (the drain
            // must then wait for its deadline and never violate it).
            let (spec, min_healthy) = match rng.random_range(0..4) {
                0 => ("maxUnavailable: 1".to_owned(), replicas - 1),
                1 => (format!("minAvailable: {}", replicas), replicas),
                _ => {
                    let min = rng.random_range(0..replicas.max(1));
                    (format!("minAvailable: {min}"), min)
                }
            };
            yaml.push_str(&format!(
                "---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: {app}, namespace: default}}\nspec:\n  {spec}\n  selector: {{matchLabels: {{app: {app}}}}}\n"
            ));
            budgets.push(Budget {
                namespace: "default".into(),
                name: app.clone(),
                app,
                min_healthy,
            });
        }
    }
    if rng.random_bool(0.5) {
        yaml.push_str("---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent, namespace: kube-system}\nspec:\n  selector: {matchLabels: {app: agent}}\n  template:\n    metadata: {labels: {app: agent}}\n    spec:\n      containers: [{name: agent, image: agent}]\n");
    }
    if report.tolerant {
        yaml.push_str(&format!("---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {TOLERANT_APP}, namespace: default}}\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: {TOLERANT_APP}}}}}\n  template:\n    metadata: {{labels: {{app: {TOLERANT_APP}}}}}\n    spec:\n      tolerations: [{{operator: Exists}}]\n      containers: [{{name: c, image: operator}}]\n"));
    }
    store.apply_yaml(&yaml).expect("workloads");
    report.pdbs = budgets.len();
    server
        .wait_for("pods Ready", Duration::from_secs(10), |s| {
            let pods = s.list::<Pod>();
            !pods.is_empty()
                && pods.iter().all(pod_healthy)
                && s.list::<PodDisruptionBudget>().iter().all(|p| {
                    p.status
                        .as_ref()
                        .is_some_and(|st| st.observed_generation.is_some())
                })
        })
        .await
        .expect("pods Ready");
    report.pods = store.list::<Pod>().len();

    // Auto Scaling: the group, its hooks, the actions.
    let inner = InMemoryAutoScaling::new();
    inner.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
    inner.add_hook(
        GROUP,
        hook(TERMINATE_HOOK, "autoscaling:EC2_INSTANCE_TERMINATING"),
    );
    inner.add_hook(
        GROUP,
        hook(LAUNCH_HOOK, "autoscaling:EC2_INSTANCE_LAUNCHING"),
    );
    let terminating = rng.random_range(1..nodes);
    report.terminating = terminating;
    if kill_kubelet {
        // The first terminating node's kubelet died (the usual reason an instance goes).
        server
            .kill_kubelet(&node_name(0))
            .expect("kill the kubelet");
        report.dead_kubelets = 1;
    }
    let mut actions = Vec::new();
    for i in 0..terminating {
        let action = LifecycleActionRef {
            auto_scaling_group_name: GROUP.into(),
            lifecycle_hook_name: TERMINATE_HOOK.into(),
            instance_id: instance_id(i),
            token: format!("00000000-0000-4000-8000-{:012x}", seed * 16 + i as u64),
        };
        inner.start_action(&action);
        actions.push((Target::TerminatingHook, action));
    }
    if launching {
        let action = LifecycleActionRef {
            auto_scaling_group_name: GROUP.into(),
            lifecycle_hook_name: LAUNCH_HOOK.into(),
            instance_id: instance_id(launch_index),
            token: format!("00000000-0000-4000-9000-{seed:012x}"),
        };
        inner.start_action(&action);
        actions.push((Target::LaunchingHook, action));
    }
    let autoscaling = WatchedAutoScaling {
        inner: inner.clone(),
        store: store.clone(),
        node_of: Arc::new(node_of.clone()),
        completions: Arc::default(),
        calls: Arc::default(),
    };

    // Faults.
    let faults = server.faults();
    let five_xx = [0.0, 0.05, 0.1][rng.random_range(0..3)];
    if five_xx > 0.0 {
        faults.add(FaultRule::new(FaultAction::InternalError).probability(five_xx / 2.0));
        faults.add(FaultRule::new(FaultAction::ServiceUnavailable).probability(five_xx / 2.0));
    }
    if rng.random_bool(0.5) {
        faults.add(
            FaultRule::new(FaultAction::TooManyRequests {
                retry_after_seconds: 1,
            })
            .probability(0.1),
        );
    }
    if rng.random_bool(0.5) {
        faults.add(FaultRule::new(FaultAction::DropConnection).probability(0.03));
    }
    if rng.random_bool(0.5) {
        faults.add(
            FaultRule::new(FaultAction::Latency(Duration::from_millis(
                rng.random_range(10..80),
            )))
            .probability(0.1),
        );
    }
    for operation in [
        "CompleteLifecycleAction",
        "RecordLifecycleActionHeartbeat",
        "DescribeAutoScalingGroups",
        "DescribeLifecycleHooks",
        "DescribeInstances",
        "Publish",
    ] {
        let times = rng.random_range(0..=2usize);
        report.aws_faults += times as u64;
        let kind = if rng.random_bool(0.5) {
            AwsErrorKind::Transient
        } else {
            AwsErrorKind::Transport
        };
        match operation {
            "DescribeInstances" => instances.faults.fail(operation, kind, times),
            _ => inner.faults.fail(operation, kind, times),
        }
    }

    // The functions' identities and clients.
    let client_for = |user: &str| {
        // Each function its own group (infra/rbac.yaml), named after it.
        let own = format!("open-node-manager:{user}");
        let groups: Vec<&str> = if user == DRAIN_USER && force {
            vec![own.as_str(), FORCE_GROUP]
        } else {
            vec![own.as_str()]
        };
        let token = server.add_static_token(user, &groups);
        let server = &server;
        async move {
            let mut config = server.config_with_token(&token).await.expect("config");
            config.default_retry = false;
            config.read_timeout = Some(Duration::from_secs(5));
            kube::Client::try_from(config).expect("client")
        }
    };
    let drain_client = client_for(DRAIN_USER).await;
    let launch_client = client_for("launching-hook").await;
    let auth_client = client_for("nodegroup-auth").await;

    // The watchdog: samples every budget's healthy pods and the launching node's cordon
    // every few milliseconds. Evictions and pod DELETEs are checked exactly, from the
    // server's disruption log, after the scenario; the samples catch what neither records.
    let stop = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let samples = Arc::new(AtomicU64::new(0));
    let launching_node = launching.then(|| node_name(launch_index));
    let watchdog = {
        let store = store.clone();
        let budgets = budgets.clone();
        let stop = stop.clone();
        let violations = violations.clone();
        let samples = samples.clone();
        let launching_node = launching_node.clone();
        let disruptions = server.disruption_log().clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                samples.fetch_add(1, Ordering::Relaxed);
                for budget in &budgets {
                    let healthy = healthy_count(&store, budget);
                    // Read after the count: a DELETE that caused the dip is logged by now.
                    if healthy < budget.min_healthy
                        && !deleted_directly(&disruptions, &budget.namespace, &budget.name)
                    {
                        violations
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!(
                                "PDB {}/{} needs {} healthy pods, had {healthy} (sample)",
                                budget.namespace, budget.name, budget.min_healthy
                            ));
                    }
                }
                if let Some(node) = &launching_node
                    && store
                        .find::<Node>("", node)
                        .and_then(|n| n.spec)
                        .and_then(|s| s.unschedulable)
                        == Some(true)
                {
                    violations
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("node {node} of a LAUNCHING instance was cordoned"));
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };

    // The functions.
    let drain_timeout = 4.0;
    let drain_timeout_text = format!("{drain_timeout}");
    let drain_settings = DrainSettings::from_source(
        [
            ("CLUSTER_NAME", CLUSTER),
            ("SETTLE_SECONDS", "0"),
            ("DRAIN_TIMEOUT_SECONDS", drain_timeout_text.as_str()),
            ("EVICTION_BACKOFF_SECONDS", "0.02"),
            ("EVICTION_BACKOFF_MAX_SECONDS", "0.1"),
            ("DRAIN_LEASE_SECONDS", "0.5"),
            ("STUCK_POD_SECONDS", "0.3"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
            ("CONTINUATION_TOPIC_ARN", TOPIC),
            ("DRAIN_FORCE", if force { "true" } else { "false" }),
        ]
        .as_slice(),
    )
    .expect("drain settings");
    let notifications = InMemoryNotifications::default();
    let mut drainer = Drainer::new(
        drain_client,
        autoscaling.clone(),
        instances.clone(),
        notifications.clone(),
        drain_settings,
    );
    drainer.record_events = rng.random_bool(0.5);
    let launch_settings = LaunchSettings::from_source(
        [
            ("CLUSTER_NAME", CLUSTER),
            ("LAUNCH_TIMEOUT_SECONDS", "5"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
            ("CONTINUATION_TOPIC_ARN", TOPIC),
        ]
        .as_slice(),
    )
    .expect("launch settings");
    let launcher = Launcher::new(
        launch_client,
        autoscaling.clone(),
        instances.clone(),
        notifications.clone(),
        launch_settings,
    );

    // The launching instance's kubelet registers its node a little later.
    if let Some(node) = &launching_node {
        let simulation = server.simulation().clone();
        let node = node.clone();
        let provider_id = format!("aws:///eu-west-1a/{}", instance_id(launch_index));
        let after = Duration::from_millis(rng.random_range(50..1500));
        let ready_after = Duration::from_millis(rng.random_range(0..500));
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = simulation.register_node(&node, &provider_id, Some(ready_after));
        });
    }

    // Deliveries until every action is complete.
    let mut queue: Vec<(Target, Value)> = Vec::new();
    for (target, action) in &actions {
        let event = lifecycle_event(*target, action);
        let copies = 1 + rng.random_range(0..=2u64);
        report.duplicates += copies - 1;
        for _ in 0..copies {
            queue.push((*target, event.clone()));
        }
        // A launch notification that the subscription filter let through to the
        // terminating hook: it must not touch the node.
        if *target == Target::LaunchingHook {
            queue.push((Target::TerminatingHook, event.clone()));
            report.duplicates += 1;
        }
    }
    if report.eviction_conflicts {
        faults.add(
            FaultRule::new(FaultAction::Conflict)
                .subresource("eviction")
                .probability(0.15),
        );
    }
    if report.write_burst {
        // Every node write refused for longer than the lease, starting mid-drain.
        let burst_faults = faults.clone();
        tokio::spawn(async move {
            tokio::time::sleep(burst_after).await;
            burst_faults.add(
                FaultRule::new(FaultAction::ServiceUnavailable)
                    .verb("patch")
                    .resource("nodes")
                    .lasting(burst_length),
            );
        });
    }
    let mut request = 0u64;
    let deliveries_started = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + SCENARIO_LIMIT;
    let mut round = 0u32;
    loop {
        round += 1;
        // Hand-overs become deliveries.
        for published in notifications.drain() {
            let target = if published.message.contains("EC2_INSTANCE_LAUNCHING") {
                Target::LaunchingHook
            } else {
                Target::TerminatingHook
            };
            let base = corpus::fresh_lifecycle_event(target);
            queue.push((target, corpus::with_message(&base, &published.message)));
            report.hand_overs += 1;
        }
        if queue.is_empty() {
            let pending: Vec<&LifecycleActionRef> = actions
                .iter()
                .map(|(_, a)| a)
                .filter(|a| inner.is_pending(a))
                .collect();
            if pending.is_empty() || tokio::time::Instant::now() > deadline {
                break;
            }
            // SNS / Lambda retry: redeliver what is still pending.
            for (target, action) in &actions {
                if inner.is_pending(action) {
                    queue.push((*target, lifecycle_event(*target, action)));
                    report.duplicates += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let batch: Vec<(Target, Value)> = std::mem::take(&mut queue);
        let mut runs = Vec::new();
        for (target, event) in batch {
            request += 1;
            report.invocations += 1;
            let kill_after = (round < 4 && rng.random_bool(0.2))
                .then(|| Duration::from_millis(rng.random_range(20..400)));
            let budget = Duration::from_millis(rng.random_range(400..3000));
            let request_id = format!("soak-{seed}-{request}");
            let drainer = &drainer;
            let launcher = &launcher;
            let run = async move {
                let for_work = event.clone();
                let work = async move {
                    let event = for_work;
                    match target {
                        Target::TerminatingHook => {
                            let invocation = Invocation {
                                request_id,
                                function_account: Some(ACCOUNT.into()),
                                budget: InvocationBudget::new(budget, Duration::ZERO),
                            };
                            drainer
                                .handle_invocation(event.clone(), &invocation)
                                .await
                                .is_ok()
                        }
                        _ => {
                            let mut ctx = lambda_runtime::Context::default();
                            ctx.request_id = request_id;
                            ctx.invoked_function_arn = format!(
                                "arn:aws:lambda:eu-west-1:{ACCOUNT}:function:launching-hook"
                            );
                            ctx.deadline = u64::try_from(
                                (std::time::SystemTime::now() + budget)
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .unwrap_or_default()
                                    .as_millis(),
                            )
                            .unwrap_or(u64::MAX);
                            launcher.handle(event.clone(), &ctx).await.is_ok()
                        }
                    }
                };
                match kill_after {
                    // Killed: the future is dropped wherever it is; the event comes back.
                    Some(after) => match tokio::time::timeout(after, work).await {
                        Ok(ok) => (target, event, Some(ok)),
                        Err(_) => (target, event, None),
                    },
                    None => {
                        let ok = work.await;
                        (target, event, Some(ok))
                    }
                }
            };
            runs.push(run);
        }
        for (target, event, outcome) in futures::future::join_all(runs).await {
            match outcome {
                None => {
                    report.killed += 1;
                    queue.push((target, event));
                }
                Some(false) => queue.push((target, event)), // a failed invocation is retried
                Some(true) => {}
            }
        }
        if tokio::time::Instant::now() > deadline {
            break;
        }
    }

    // Late duplicates, after everything completed: no second completion, no new cordon.
    for (target, action) in &actions {
        if *target == Target::TerminatingHook {
            let invocation = Invocation {
                request_id: format!("soak-{seed}-late"),
                function_account: Some(ACCOUNT.into()),
                budget: InvocationBudget::new(Duration::from_secs(2), Duration::ZERO),
            };
            let _ = drainer
                .handle_invocation(lifecycle_event(*target, action), &invocation)
                .await;
            report.duplicates += 1;
            report.invocations += 1;
        }
    }

    // aws-auth under the same faults: node groups created concurrently and repeatedly.
    let nodegroups = rng.random_range(0..=3usize);
    report.nodegroups = nodegroups;
    let mut auth_violations = Vec::new();
    if nodegroups > 0 {
        auth_violations =
            soak_aws_auth(&server, auth_client, nodegroups, &mut rng, &mut report).await;
    }

    stop.store(true, Ordering::Relaxed);
    let _ = watchdog.await;
    let mut found = violations.lock().unwrap_or_else(|e| e.into_inner()).clone();
    found.dedup();
    found.extend(auth_violations);

    // Exactly-once completions, after the drain.
    let completions = autoscaling
        .completions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();

    for (target, action) in &actions {
        let done: Vec<_> = completions
            .iter()
            .filter(|(a, _, _, _)| a == action)
            .collect();
        if done.len() != 1 {
            found.push(format!(
                "{} action of {} completed {} times",
                target.function_name(),
                action.instance_id,
                done.len()
            ));
            continue;
        }
        let (_, result, remaining, at) = done[0];
        // Before the drain deadline could have passed, a completion means "drained"; after
        // it (slow machine, blocking PDB) the deadline result with pods left is the setting.
        let before_deadline =
            at.duration_since(deliveries_started) < Duration::from_secs_f64(drain_timeout);
        if *result != LifecycleActionResult::Continue {
            found.push(format!(
                "{} action of {} completed {}",
                target.function_name(),
                action.instance_id,
                result.as_str()
            ));
        }
        if force && *target == Target::TerminatingHook && *remaining > 0 {
            // Force means the instance never goes with workload pods still running: each
            // one left was neither evicted nor deleted (retries exhausted, or not tried).
            report.forced_completions_with_pods += 1;
            found.push(format!(
                "forced drain of {} completed while {remaining} workload pods still ran (neither evicted nor deleted)",
                action.instance_id
            ));
        }
        if *target == Target::TerminatingHook && *remaining > 0 && before_deadline {
            found.push(format!(
                "action of {} completed before its drain deadline while {remaining} workload pods still ran on its node",
                action.instance_id
            ));
        }
    }
    // No PDB violated, from the server's own records of every eviction and pod DELETE.
    found.extend(budget_violations(
        server.disruption_log(),
        &budgets,
        force,
        &mut report,
    ));
    // Without force the terminating hook sends no pod DELETE at all (not even one that fails);
    // it never writes a launching node.
    let audit = server.audit();
    let deletes = audit
        .filter(|e| e.user.username == DRAIN_USER && e.verb == "delete" && e.resource() == "pods");
    if !force && !deletes.is_empty() {
        found.push(format!("{} pod DELETEs without force", deletes.len()));
    }
    if let Some(node) = &launching_node {
        let writes = audit.filter(|e| {
            e.user.username == DRAIN_USER
                && e.resource() == "nodes"
                && e.name() == node
                && !matches!(e.verb.as_str(), "get" | "list" | "watch")
        });
        if !writes.is_empty() {
            found.push(format!(
                "terminating hook wrote the LAUNCHING node {node}: {}",
                writes[0].line()
            ));
        }
    }
    report.kube_faults = audit.filter(|e| e.injected_fault.is_some()).len() as u64;
    report.samples = samples.load(Ordering::Relaxed);
    report.violations = found;
    report.elapsed = started.elapsed();
    server.shutdown();
    report
}

/// Whether a pod DELETE the server carried out touched a pod of this budget.
fn deleted_directly(log: &DisruptionLog, namespace: &str, budget: &str) -> bool {
    log.pod_deletions().iter().any(|d| {
        d.deleted()
            && d.budgets
                .iter()
                .any(|b| b.namespace == namespace && b.name == budget)
    })
}

/// The PDB invariant, from the fake API server's disruption log (recorded in the critical
/// section of each decision, so exact): no granted eviction took a budget below its
/// `desiredHealthy` (as its status said) or below the scenario's minimum by evicting a healthy
/// pod, and no pod of a budget was deleted directly unless the terminating hook did it with
/// force configured. Fills the report's eviction figures.
fn budget_violations(
    log: &DisruptionLog,
    budgets: &[Budget],
    force: bool,
    report: &mut ScenarioReport,
) -> Vec<String> {
    let mut found = Vec::new();
    let tally = log.eviction_tally();
    report.evictions_decided = tally.decided;
    report.evictions = tally.granted;
    report.evictions_refused = tally.refused_by_budget;
    report.pdb_checks_at_eviction = tally.budget_checks;
    for record in log.evictions().iter().filter(|r| r.granted()) {
        if !record.broken_budgets().is_empty() {
            found.push(format!(
                "eviction left a PDB below desiredHealthy: {}",
                record.line()
            ));
        }
        for counts in &record.budgets {
            let Some(after) = counts.healthy_after else {
                continue;
            };
            let minimum = budgets
                .iter()
                .find(|b| b.namespace == counts.namespace && b.name == counts.name)
                .map_or(0, |b| b.min_healthy);
            if after < minimum && after < counts.healthy_before {
                found.push(format!(
                    "eviction left PDB {}/{} with {after} healthy pods, the scenario needs {minimum}: {}",
                    counts.namespace,
                    counts.name,
                    record.line()
                ));
            }
        }
    }
    for deletion in log.pod_deletions().iter().filter(|d| d.deleted()) {
        report.pod_deletions += 1;
        if !deletion.covered_by_budget() {
            continue;
        }
        report.covered_pod_deletions += 1;
        let allowed = force && deletion.requester.username == DRAIN_USER;
        if !allowed {
            found.push(format!(
                "pod of a PDB deleted directly{}: {}",
                if force { "" } else { " without force" },
                deletion.line()
            ));
        }
    }
    found
}

/// Creates `count` node groups and delivers their CreateNodegroup events concurrently and
/// twice each (plus a reconcile-all), retrying failed invocations like Lambda; then checks
/// `aws-auth` maps each role exactly once and kept the admin entry.
async fn soak_aws_auth(
    server: &FakeApiServer,
    client: kube::Client,
    count: usize,
    rng: &mut StdRng,
    report: &mut ScenarioReport,
) -> Vec<String> {
    let store = server.store();
    if rng.random_bool(0.7) {
        store
            .apply_yaml(&format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: aws-auth, namespace: kube-system}}\ndata:\n  mapRoles: |\n    - rolearn: {ADMIN_ROLE}\n      username: admin\n      groups:\n        - system:masters\n"
            ))
            .expect("aws-auth");
    }
    let had_admin = store.find::<ConfigMap>("kube-system", "aws-auth").is_some();
    let eks = InMemoryEks::default();
    eks.add_cluster(ClusterDescription {
        name: CLUSTER.into(),
        arn: format!("arn:aws:eks:eu-west-1:{ACCOUNT}:cluster/{CLUSTER}"),
        endpoint: server.url().to_owned(),
        certificate_authority_data: server.ca_data(),
        authentication_mode: AuthenticationMode::ConfigMap,
    });
    let mut roles = Vec::new();
    for i in 0..count {
        let role = format!("arn:aws:iam::{ACCOUNT}:role/soak-node-role-{i}");
        eks.add_nodegroup(NodegroupDescription {
            cluster_name: CLUSTER.into(),
            nodegroup_name: format!("ng-{i}"),
            node_role: role.clone(),
            ami_type: "AL2023_x86_64_STANDARD".into(),
            status: "ACTIVE".into(),
        });
        roles.push(role);
    }
    let aws_failures = rng.random_range(0..=2usize);
    eks.faults
        .fail("DescribeNodegroup", AwsErrorKind::Transient, aws_failures);
    report.aws_faults += aws_failures as u64;
    let function = NodegroupAuth::new(
        eks,
        KubeAwsAuthStore::new(client),
        node_manager::aws::in_memory::InMemoryInstanceProfiles::default(),
        node_manager::aws::in_memory::InMemoryInstances::default(),
        NodegroupAuthSettings {
            scope: ClusterScope {
                cluster_name: CLUSTER.into(),
                additional_cluster_names: vec![],
            },
            region: "eu-west-1".into(),
            account_id: None,
            aws_auth_with_access_entries: false,
            retry: RetryPolicy {
                max_attempts: 8,
                base_delay: Duration::from_millis(5),
                max_delay: Duration::from_millis(50),
            },
            delete_wait: Duration::from_millis(100),
            delete_poll_interval: Duration::from_millis(10),
        },
    );
    let arn = format!("arn:aws:lambda:eu-west-1:{ACCOUNT}:function:nodegroup-auth");
    let mut queue: Vec<Value> = Vec::new();
    for i in 0..count {
        let mut event = corpus::fixture("eventbridge-create-nodegroup.json");
        event["detail"]["requestParameters"]["nodegroupName"] = json!(format!("ng-{i}"));
        event["detail"]["responseElements"]["nodegroup"]["nodegroupName"] =
            json!(format!("ng-{i}"));
        queue.push(event.clone());
        queue.push(event);
        report.duplicates += 1;
    }
    queue.push(json!({"clusterName": CLUSTER, "reconcile": "all"}));
    let mut attempts = 0;
    while !queue.is_empty() && attempts < 30 {
        attempts += 1;
        let batch = std::mem::take(&mut queue);
        report.invocations += batch.len() as u64;
        let results = futures::future::join_all(
            batch
                .iter()
                .map(|event| async { (event.clone(), function.handle(event, &arn).await) }),
        )
        .await;
        for (event, result) in results {
            if result.is_err() {
                queue.push(event);
            }
        }
    }
    let mut found = Vec::new();
    if !queue.is_empty() {
        found.push(format!(
            "nodegroup-auth still failing after {attempts} rounds of retries"
        ));
    }
    let Some(config_map) = store.find::<ConfigMap>("kube-system", "aws-auth") else {
        found.push("aws-auth missing".to_owned());
        return found;
    };
    let text = config_map
        .data
        .as_ref()
        .and_then(|d| d.get("mapRoles"))
        .cloned()
        .unwrap_or_default();
    match MapRoles::parse(Some(&text)) {
        Err(error) => found.push(format!("aws-auth mapRoles does not parse: {error}")),
        Ok(map) => {
            for role in &roles {
                let n = map
                    .mappings()
                    .iter()
                    .filter(|m| m.role_arn.eq_ignore_ascii_case(role))
                    .count();
                if n != 1 {
                    found.push(format!("aws-auth maps {role} {n} times"));
                }
            }
            if had_admin
                && !map.mappings().iter().any(|m| {
                    m.role_arn == ADMIN_ROLE && m.groups.iter().any(|g| g == "system:masters")
                })
            {
                found.push("aws-auth lost the admin entry".to_owned());
            }
        }
    }
    if !SecretScanner::new().scan(&text).is_empty() {
        found.push("aws-auth holds a secret".to_owned());
    }
    found
}

/// Totals over many scenarios.
#[derive(Debug, Default, Clone)]
pub struct SoakTotals {
    pub scenarios: usize,
    pub nodes: usize,
    pub pods: usize,
    pub terminating: usize,
    pub launching: usize,
    pub nodegroups: usize,
    pub invocations: u64,
    pub duplicates: u64,
    pub killed: u64,
    pub hand_overs: u64,
    pub kube_faults: u64,
    pub aws_faults: u64,
    pub forced_scenarios: usize,
    pub dead_kubelets: usize,
    pub tolerant_scenarios: usize,
    pub conflict_scenarios: usize,
    pub burst_scenarios: usize,
    pub evictions_decided: u64,
    pub evictions: u64,
    pub evictions_refused: u64,
    pub pdb_checks_at_eviction: u64,
    pub pod_deletions: u64,
    pub covered_pod_deletions: u64,
    pub forced_completions_with_pods: u64,
    pub samples: u64,
    pub violations: Vec<String>,
    pub elapsed: Duration,
}

impl SoakTotals {
    pub fn add(&mut self, report: &ScenarioReport) {
        self.scenarios += 1;
        self.nodes += report.nodes;
        self.pods += report.pods;
        self.terminating += report.terminating;
        self.launching += report.launching;
        self.nodegroups += report.nodegroups;
        self.invocations += report.invocations;
        self.duplicates += report.duplicates;
        self.killed += report.killed;
        self.hand_overs += report.hand_overs;
        self.kube_faults += report.kube_faults;
        self.aws_faults += report.aws_faults;
        self.forced_scenarios += usize::from(report.forced);
        self.dead_kubelets += report.dead_kubelets;
        self.tolerant_scenarios += usize::from(report.tolerant);
        self.conflict_scenarios += usize::from(report.eviction_conflicts);
        self.burst_scenarios += usize::from(report.write_burst);
        self.evictions_decided += report.evictions_decided;
        self.evictions += report.evictions;
        self.evictions_refused += report.evictions_refused;
        self.pdb_checks_at_eviction += report.pdb_checks_at_eviction;
        self.pod_deletions += report.pod_deletions;
        self.covered_pod_deletions += report.covered_pod_deletions;
        self.forced_completions_with_pods += report.forced_completions_with_pods;
        self.samples += report.samples;
        self.elapsed += report.elapsed;
        for v in &report.violations {
            self.violations.push(format!("seed {}: {v}", report.seed));
        }
    }

    /// One line per figure, for RELIABILITY.md.
    pub fn summary(&self) -> String {
        format!(
            "scenarios {} (force configured in {}; dead kubelets {}; a Deployment tolerating the cordon in {}; eviction 409s in {}; node-write 503 bursts longer than the lease in {}); nodes {}; pods {}; terminating actions {}; launching actions {}; node groups {}; invocations {}; duplicate deliveries {}; killed mid-flight and redelivered {}; hand-overs {}; API server faults injected {}; AWS faults injected {}; evictions decided {}, granted {}, refused by a PDB {}; PDB checks at eviction {}; pod DELETEs {} (of PDB-covered pods {}); forced completions with pods left {}; watchdog samples {}; violations {}; scenario time {:.1}s",
            self.scenarios,
            self.forced_scenarios,
            self.dead_kubelets,
            self.tolerant_scenarios,
            self.conflict_scenarios,
            self.burst_scenarios,
            self.nodes,
            self.pods,
            self.terminating,
            self.launching,
            self.nodegroups,
            self.invocations,
            self.duplicates,
            self.killed,
            self.hand_overs,
            self.kube_faults,
            self.aws_faults,
            self.evictions_decided,
            self.evictions,
            self.evictions_refused,
            self.pdb_checks_at_eviction,
            self.pod_deletions,
            self.covered_pod_deletions,
            self.forced_completions_with_pods,
            self.samples,
            self.violations.len(),
            self.elapsed.as_secs_f64()
        )
    }
}
