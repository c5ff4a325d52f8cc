//! Setting a scenario up: the fake API server with the shipped RBAC, the nodes, the
//! workloads and their budgets, the Auto Scaling group with its pending actions, the faults,
//! and a client for each function's identity. Every draw comes from the seed, in a fixed
//! order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use node_manager::aws::in_memory::{InMemoryAutoScaling, InMemoryInstances};
use node_manager::aws::{AwsErrorKind, LifecycleActionRef};
use node_manager::lifecycle::node::is_ready;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::watched::{WatchedAutoScaling, pod_healthy};
use super::{
    Budget, CLUSTER, DRAIN_USER, FORCE_DRAW, FORCE_GROUP, GROUP, LAUNCH_HOOK, ScenarioReport,
    TERMINATE_HOOK, TOLERANT_APP, TROUBLE_DRAW,
};
use crate::fixtures::{self, Workload};
use crate::identity;
use crate::kube::{FakeApiServer, FaultAction, FaultRule, SimulationTimings, Store};
use crate::soak::corpus::{self, Target};

/// The hooks' heartbeat timeout.
const HEARTBEAT: Duration = Duration::from_secs(30);

/// Cluster trouble drawn from its own generator (see [`TROUBLE_DRAW`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Trouble {
    /// The first terminating node's kubelet is dead.
    pub(super) kill_kubelet: bool,
    /// When the burst of node-write 503s starts, and how long it lasts.
    pub(super) burst_after: Duration,
    pub(super) burst_length: Duration,
    /// When a brownout of node writes starts (every PATCH throttled with `Retry-After`,
    /// which kube's client retries), and how long it lasts (#24 item 5).
    pub(super) brownout_after: Duration,
    pub(super) brownout_length: Duration,
}

/// A client per function identity (each its own Kubernetes group, as `infra/rbac.yaml`).
pub(super) struct Clients {
    pub(super) drain: kube::Client,
    pub(super) launch: kube::Client,
    pub(super) auth: kube::Client,
}

/// One scenario's world, its draws and its report so far.
pub(super) struct Soak {
    pub(super) seed: u64,
    pub(super) rng: StdRng,
    pub(super) report: ScenarioReport,
    pub(super) server: FakeApiServer,
    pub(super) store: Store,
    pub(super) instances: InMemoryInstances,
    /// Node name by instance id.
    pub(super) node_of: BTreeMap<String, String>,
    /// The instance launching (index `nodes`), if any.
    pub(super) launching: bool,
    pub(super) force: bool,
    pub(super) trouble: Trouble,
    pub(super) budgets: Vec<Budget>,
    pub(super) inner: InMemoryAutoScaling,
    pub(super) autoscaling: Option<WatchedAutoScaling>,
    pub(super) actions: Vec<(Target, LifecycleActionRef)>,
    /// The instance back from the warm pool, if any (`warm_pool_return.rs`).
    pub(super) warm_return: Option<super::warm_pool_return::WarmReturn>,
    /// Terminating-hook invocations that ran past their budget (see `deliver.rs`).
    pub(super) overruns: Vec<String>,
}

pub(super) fn instance_id(index: usize) -> String {
    format!(
        "i-0{:016x}",
        0x5a5a_0000_0000_0000_u64 + index as u64 * 0x1_0001
    )
}

pub(super) fn node_name(index: usize) -> String {
    format!(
        "ip-10-1-{}-{}.eu-west-1.compute.internal",
        index / 200,
        index % 200 + 10
    )
}

impl Soak {
    /// The fake API server (fast simulated kubelets, the shipped RBAC) for `seed`.
    pub(super) async fn start(seed: u64) -> Self {
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
        Self {
            seed,
            rng: StdRng::seed_from_u64(seed),
            report: ScenarioReport {
                seed,
                ..ScenarioReport::default()
            },
            server,
            store,
            instances: InMemoryInstances::default(),
            node_of: BTreeMap::new(),
            launching: false,
            force: false,
            trouble: Trouble {
                kill_kubelet: false,
                burst_after: Duration::ZERO,
                burst_length: Duration::ZERO,
                brownout_after: Duration::ZERO,
                brownout_length: Duration::ZERO,
            },
            budgets: Vec::new(),
            inner: InMemoryAutoScaling::new(),
            autoscaling: None,
            actions: Vec::new(),
            warm_return: None,
            overruns: Vec::new(),
        }
    }

    /// The index of the launching instance (after the seeded nodes).
    pub(super) fn launch_index(&self) -> usize {
        self.report.nodes
    }

    /// The launching instance's node, if an instance launches.
    pub(super) fn launching_node(&self) -> Option<String> {
        self.launching.then(|| node_name(self.launch_index()))
    }

    /// 2-4 Ready nodes; whether an instance launches; force and the cluster trouble.
    pub(super) async fn seed_nodes(&mut self) {
        let nodes = self.rng.random_range(2..=4usize);
        self.report.nodes = nodes;
        for i in 0..nodes {
            self.server
                .register_node(
                    &node_name(i),
                    &format!("aws:///eu-west-1a/{}", instance_id(i)),
                    Some(Duration::ZERO),
                )
                .expect("node");
            self.add_instance(i);
        }
        // The launching instance's node registers later, as a kubelet would while the hook
        // waits (see `register_launching_node_later`).
        self.launching = self.rng.random_bool(0.5);
        self.force = StdRng::seed_from_u64(self.seed ^ FORCE_DRAW).random_bool(1.0 / 6.0);
        self.report.forced = self.force;
        self.draw_trouble();
        if self.launching {
            self.report.launching = 1;
            self.add_instance(self.launch_index());
        }
        self.server
            .wait_for("nodes Ready", Duration::from_secs(10), |s| {
                s.list::<Node>().iter().all(is_ready)
            })
            .await
            .expect("nodes Ready");
    }

    fn add_instance(&mut self, index: usize) {
        self.instances.add(&instance_id(index), &node_name(index));
        self.node_of.insert(instance_id(index), node_name(index));
    }

    fn draw_trouble(&mut self) {
        let mut trouble = StdRng::seed_from_u64(self.seed ^ TROUBLE_DRAW);
        self.report.tolerant = trouble.random_bool(0.3);
        self.report.eviction_conflicts = trouble.random_bool(0.3);
        self.report.write_burst = trouble.random_bool(0.25);
        self.trouble = Trouble {
            kill_kubelet: trouble.random_bool(0.25),
            burst_after: Duration::from_millis(trouble.random_range(50..600)),
            burst_length: Duration::from_millis(trouble.random_range(700..1500)),
            brownout_after: Duration::ZERO,
            brownout_length: Duration::ZERO,
        };
        // Drawn after the others, so that every seed keeps its earlier trouble.
        self.report.brownout = trouble.random_bool(0.3);
        self.trouble.brownout_after = Duration::from_millis(trouble.random_range(100..1500));
        self.trouble.brownout_length = Duration::from_millis(trouble.random_range(1500..4000));
    }

    /// 1-3 Deployments, most with a PDB; maybe a DaemonSet; maybe a Deployment tolerating
    /// the cordon. Waits until every pod is Ready and every budget observed.
    pub(super) async fn seed_workloads(&mut self) {
        let deployments = self.rng.random_range(1..=3usize);
        for d in 0..deployments {
            self.seed_deployment(d);
        }
        if self.rng.random_bool(0.5) {
            let agent = Workload::new("kube-system", "agent")
                .container("agent", "agent")
                .grace_period_seconds(None);
            self.store.create(&agent.daemon_set()).expect("DaemonSet");
        }
        if self.report.tolerant {
            let tolerant = Workload::new("default", TOLERANT_APP)
                .container("c", "operator")
                .grace_period_seconds(None)
                .tolerating_every_taint();
            self.store
                .create(&tolerant.deployment())
                .expect("Deployment");
        }
        self.report.pdbs = self.budgets.len();
        self.server
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
        self.report.pods = self.store.list::<Pod>().len();
    }

    /// Deployment `app-<d>` with 1-4 replicas, and in three cases of four a PDB: mostly
    /// satisfiable, sometimes one that blocks every eviction (the drain must then wait for
    /// its deadline and never violate it).
    fn seed_deployment(&mut self, d: usize) {
        let replicas = self.rng.random_range(1..=4i32);
        let app = format!("app-{d}");
        let grace = self.rng.random_range(0..=30);
        let workload = Workload::new("default", &app)
            .replicas(replicas)
            .container("c", "nginx")
            .grace_period_seconds(Some(grace));
        self.store
            .create(&workload.deployment())
            .expect("Deployment");
        if !self.rng.random_bool(0.75) {
            return;
        }
        let (min_available, max_unavailable, min_healthy) = match self.rng.random_range(0..4) {
            0 => (None, Some(json!(1)), replicas - 1),
            1 => (Some(json!(replicas)), None, replicas),
            _ => {
                let min = self.rng.random_range(0..replicas.max(1));
                (Some(json!(min)), None, min)
            }
        };
        let budget = fixtures::pdb(
            "default",
            &app,
            &[("app", &app)],
            min_available,
            max_unavailable,
        );
        self.store.create(&budget).expect("PodDisruptionBudget");
        self.budgets.push(Budget {
            namespace: "default".into(),
            name: app.clone(),
            app,
            min_healthy,
        });
    }

    /// The Auto Scaling group with both hooks; 1..n-1 terminating actions (maybe on a node
    /// whose kubelet died) and maybe a launching one.
    pub(super) fn start_actions(&mut self) {
        let inner = &self.inner;
        inner.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
        inner.add_hook(
            GROUP,
            fixtures::lifecycle_hook(TERMINATE_HOOK, fixtures::TERMINATING, HEARTBEAT),
        );
        inner.add_hook(
            GROUP,
            fixtures::lifecycle_hook(LAUNCH_HOOK, fixtures::LAUNCHING, HEARTBEAT),
        );
        let terminating = self.rng.random_range(1..self.report.nodes);
        self.report.terminating = terminating;
        if self.trouble.kill_kubelet {
            // The first terminating node's kubelet died (the usual reason an instance goes).
            self.server
                .kill_kubelet(&node_name(0))
                .expect("kill the kubelet");
            self.report.dead_kubelets = 1;
        }
        for i in 0..terminating {
            let token = format!("00000000-0000-4000-8000-{:012x}", self.seed * 16 + i as u64);
            let action =
                fixtures::start_action(&self.inner, GROUP, TERMINATE_HOOK, &instance_id(i), &token);
            self.actions.push((Target::TerminatingHook, action));
        }
        if self.launching {
            let token = format!("00000000-0000-4000-9000-{:012x}", self.seed);
            let action = fixtures::start_action(
                &self.inner,
                GROUP,
                LAUNCH_HOOK,
                &instance_id(self.launch_index()),
                &token,
            );
            self.actions.push((Target::LaunchingHook, action));
        }
        self.autoscaling = Some(WatchedAutoScaling::new(
            self.inner.clone(),
            self.store.clone(),
            Arc::new(self.node_of.clone()),
        ));
    }

    /// The Auto Scaling group the functions see (recording each completion).
    pub(super) fn autoscaling(&self) -> WatchedAutoScaling {
        self.autoscaling
            .clone()
            .expect("the actions start before anything completes them")
    }

    /// API server faults (5xx, 429 with Retry-After, dropped connections, latency) and AWS
    /// errors queued per operation.
    pub(super) fn inject_faults(&mut self) {
        let faults = self.server.faults();
        let five_xx = [0.0, 0.05, 0.1][self.rng.random_range(0..3)];
        if five_xx > 0.0 {
            faults.add(FaultRule::new(FaultAction::InternalError).probability(five_xx / 2.0));
            faults.add(FaultRule::new(FaultAction::ServiceUnavailable).probability(five_xx / 2.0));
        }
        if self.rng.random_bool(0.5) {
            faults.add(
                FaultRule::new(FaultAction::TooManyRequests {
                    retry_after_seconds: 1,
                })
                .probability(0.1),
            );
        }
        if self.rng.random_bool(0.5) {
            faults.add(FaultRule::new(FaultAction::DropConnection).probability(0.03));
        }
        if self.rng.random_bool(0.5) {
            faults.add(
                FaultRule::new(FaultAction::Latency(Duration::from_millis(
                    self.rng.random_range(10..80),
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
            let times = self.rng.random_range(0..=2usize);
            self.report.aws_faults += times as u64;
            let kind = if self.rng.random_bool(0.5) {
                AwsErrorKind::Transient
            } else {
                AwsErrorKind::Transport
            };
            match operation {
                "DescribeInstances" => self.instances.faults.fail(operation, kind, times),
                _ => self.inner.faults.fail(operation, kind, times),
            }
        }
    }

    /// A client per function, each with its own group (the terminating hook also with the
    /// force-delete group when force is configured).
    pub(super) async fn clients(&self) -> Clients {
        Clients {
            drain: self.client_for(DRAIN_USER).await,
            launch: self.client_for("launching-hook").await,
            auth: self.client_for("nodegroup-auth").await,
        }
    }

    async fn client_for(&self, user: &str) -> kube::Client {
        let own = identity::function_group(user);
        let groups: Vec<&str> = if user == DRAIN_USER && self.force {
            vec![own.as_str(), FORCE_GROUP]
        } else {
            vec![own.as_str()]
        };
        let mut config = identity::config_as(&self.server, user, &groups)
            .await
            .expect("config");
        config.read_timeout = Some(Duration::from_secs(5));
        kube::Client::try_from(config).expect("client")
    }

    /// The launching instance's kubelet registers its node a little later.
    pub(super) fn register_launching_node_later(&mut self) {
        let Some(node) = self.launching_node() else {
            return;
        };
        let simulation = self.server.simulation().clone();
        let provider_id = format!("aws:///eu-west-1a/{}", instance_id(self.launch_index()));
        let after = Duration::from_millis(self.rng.random_range(50..1500));
        let ready_after = Duration::from_millis(self.rng.random_range(0..500));
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = simulation.register_node(&node, &provider_id, Some(ready_after));
        });
    }

    /// The report, with the faults the server injected, once the server is shut down.
    pub(super) fn finish(mut self) -> ScenarioReport {
        self.report.kube_faults = self
            .server
            .audit()
            .filter(|e| e.injected_fault.is_some())
            .len() as u64;
        self.server.shutdown();
        self.report
    }
}
