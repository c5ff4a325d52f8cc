//! The node-repair soak (issue #24 item 1): a seeded group whose nodes fail at random, also
//! while earlier replacements are still under way, and an Auto Scaling that takes a random
//! number of runs to drain (our terminating hook's checkpoint on the node), terminate and
//! replace each instance marked unhealthy. Node repair runs once a round, in process, against
//! the fake API server (the shipped RBAC's node-repair group) and the in-memory Auto Scaling.
//!
//! Invariants, checked after every run: no more of the group's instances being replaced at
//! once than `maxParallelNodesRepairedCount` (1, the default); no repair started in a run that
//! saw more than 20 % of the group's in-service nodes unhealthy (the group has more than 5).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use node_manager::aws::InstanceHealth;
use node_manager::aws::in_memory::InMemoryInstanceHealth;
use node_manager::lifecycle::node::is_ready;
use node_manager::node_marks::checkpoint::CHECKPOINT_ANNOTATION;
use node_manager::node_repair::run::{self, RepairContext};
use node_manager::node_repair::settings::RepairSettings;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::Value;

use super::corpus;
use crate::kube::{FakeApiServer, SimulationTimings};

const CLUSTER: &str = "soak-repair";
const GROUP: &str = "eks-soak-repair";
/// Runs per scenario: each a round of failures, Auto Scaling progress and one repair run.
const ROUNDS: usize = 14;
/// The default `maxParallelNodesRepairedCount`.
const MAX_PARALLEL: usize = 1;
/// The default `maxUnhealthyNodeThresholdPercentage`.
const MAX_UNHEALTHY_PERCENT: usize = 20;

/// What one scenario did and found.
#[derive(Debug, Default, Clone)]
pub struct RepairScenarioReport {
    pub seed: u64,
    pub nodes: usize,
    pub failures: usize,
    pub runs: usize,
    pub repairs_started: usize,
    pub paused_runs: usize,
    /// Runs that saw a node our drain was working on while its instance was being replaced.
    pub runs_during_drain: usize,
    pub max_in_flight: usize,
    pub violations: Vec<String>,
}

/// An instance Auto Scaling is replacing: drained for `drain_rounds` more runs, then gone.
struct Replacement {
    node: String,
    rounds_left: usize,
}

struct RepairSoak {
    rng: StdRng,
    server: FakeApiServer,
    health: InMemoryInstanceHealth,
    client: kube::Client,
    /// Instance id → node name, of the group's instances.
    members: BTreeMap<String, String>,
    replacing: BTreeMap<String, Replacement>,
    /// Nodes whose kubelet this soak killed (a node just launched is NotReady for a moment
    /// too, but is not unhealthy).
    failed: BTreeSet<String>,
    next_index: usize,
    report: RepairScenarioReport,
}

/// Runs repair scenario `seed`. Errors of the set-up (not of the code under test) panic.
pub async fn run_repair_scenario(seed: u64) -> RepairScenarioReport {
    let mut soak = RepairSoak::start(seed).await;
    for round in 0..ROUNDS {
        soak.fail_some_nodes(round);
        soak.advance_replacements();
        soak.run_and_check().await;
    }
    soak.report
}

impl RepairSoak {
    async fn start(seed: u64) -> Self {
        let server = FakeApiServer::builder()
            .cluster_name(CLUSTER)
            .simulation(SimulationTimings {
                node_ready_after: Duration::ZERO,
                ..SimulationTimings::default()
            })
            .start()
            .await
            .expect("fake API server");
        server
            .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
            .expect("infra/rbac.yaml");
        let token = server.add_static_token("node-repair", &["open-node-manager:node-repair"]);
        let mut config = server.config_with_token(&token).await.expect("config");
        config.default_retry = false;
        let client = kube::Client::try_from(config).expect("client");
        let health = InMemoryInstanceHealth::new();
        health.add_group(GROUP, &[("eks:cluster-name", CLUSTER)], Duration::ZERO);
        let mut rng = StdRng::seed_from_u64(seed);
        let nodes = rng.random_range(6..=12usize);
        let mut soak = Self {
            rng,
            server,
            health,
            client,
            members: BTreeMap::new(),
            replacing: BTreeMap::new(),
            failed: BTreeSet::new(),
            next_index: 0,
            report: RepairScenarioReport {
                seed,
                nodes,
                ..RepairScenarioReport::default()
            },
        };
        for _ in 0..nodes {
            soak.launch_instance();
        }
        let server = &soak.server;
        server
            .wait_for("nodes Ready", Duration::from_secs(10), |store| {
                store.list::<Node>().iter().all(is_ready) && store.list::<Node>().len() == nodes
            })
            .await
            .expect("nodes Ready");
        soak
    }

    /// A new instance in service and its node, Ready at once.
    fn launch_instance(&mut self) {
        let index = self.next_index;
        self.next_index += 1;
        let instance = format!("i-{:017x}", 0xa000 + index);
        let node = format!(
            "ip-10-2-{}-{}.eu-west-1.compute.internal",
            index / 200,
            index % 200
        );
        self.server
            .register_node(
                &node,
                &format!("aws:///eu-west-1a/{instance}"),
                Some(Duration::ZERO),
            )
            .expect("register node");
        self.health.add_instance(GROUP, &instance);
        self.members.insert(instance, node);
    }

    /// A slow, spreading fault: now and then one (sometimes two) more healthy nodes' kubelets
    /// die, their nodes NotReady for longer than the repair wait already.
    fn fail_some_nodes(&mut self, round: usize) {
        if round == 0 || self.rng.random_bool(0.3) {
            let count = if self.rng.random_bool(0.15) { 2 } else { 1 };
            for _ in 0..count {
                let healthy: Vec<String> = self
                    .members
                    .iter()
                    .filter(|(id, node)| {
                        !self.replacing.contains_key(*id) && !self.failed.contains(*node)
                    })
                    .map(|(_, node)| node.clone())
                    .collect();
                if healthy.is_empty() {
                    return;
                }
                let node = healthy[self.rng.random_range(0..healthy.len())].clone();
                self.kill(&node);
                self.failed.insert(node);
                self.report.failures += 1;
            }
        }
    }

    fn kill(&self, node: &str) {
        let since = jiff::Timestamp::now() - Duration::from_secs(2 * 3600);
        self.server
            .kill_kubelet_since(node, since)
            .expect("kill kubelet");
    }

    /// Auto Scaling's side: an instance marked unhealthy is drained by the terminating hook
    /// (our checkpoint on its node) for a random number of runs, then terminated (instance out
    /// of the group, node deleted) and replaced by a fresh instance.
    fn advance_replacements(&mut self) {
        for id in self.health.marked_unhealthy() {
            if self.members.contains_key(&id) && !self.replacing.contains_key(&id) {
                let node = self.members[&id].clone();
                self.server
                    .store()
                    .modify::<Node>("", &node, |n| {
                        n.metadata
                            .annotations
                            .get_or_insert_default()
                            .insert(CHECKPOINT_ANNOTATION.to_owned(), "{}".to_owned());
                    })
                    .expect("drain checkpoint");
                let rounds_left = self.rng.random_range(1..=4usize);
                self.replacing.insert(id, Replacement { node, rounds_left });
            }
        }
        let mut gone = Vec::new();
        for (id, replacement) in &mut self.replacing {
            if replacement.rounds_left == 0 {
                gone.push(id.clone());
            } else {
                replacement.rounds_left -= 1;
            }
        }
        for id in gone {
            let Some(replacement) = self.replacing.remove(&id) else {
                continue;
            };
            self.health.remove_instance(&id);
            self.members.remove(&id);
            self.failed.remove(&replacement.node);
            let _ = self.server.store().delete::<Node>("", &replacement.node);
            self.launch_instance();
        }
    }

    async fn run_and_check(&mut self) {
        let unhealthy_in_service = self
            .members
            .iter()
            .filter(|(id, node)| !self.replacing.contains_key(*id) && self.failed.contains(*node))
            .count();
        let in_service = self.members.len() - self.replacing.len();
        let started_before = self.health.marked_unhealthy().len();
        if !self.replacing.is_empty() {
            self.report.runs_during_drain += 1;
        }
        let ctx = RepairContext {
            kube: self.client.clone(),
            health: self.health.clone(),
            ec2: self.health.clone(),
            settings: RepairSettings::from_source(&[("CLUSTER_NAME", CLUSTER)][..])
                .expect("settings"),
        };
        let run = run::handle(&ctx, Value::Null).await;
        self.report.runs += 1;
        let report = match run {
            Ok(report) => report,
            Err(error) => {
                self.report
                    .violations
                    .push(format!("run {} failed: {error}", self.report.runs));
                return;
            }
        };
        let started = self.health.marked_unhealthy().len() - started_before;
        self.report.repairs_started += started;
        if report.groups.iter().any(|g| g.repairs_paused > 0) {
            self.report.paused_runs += 1;
        }
        let ids: Vec<String> = self.members.keys().cloned().collect();
        let being_replaced = self
            .health
            .describe_group_instances(&ids)
            .await
            .expect("in-memory describe")
            .into_iter()
            .filter(|i| {
                i.lifecycle_state.starts_with("Terminating")
                    || i.health_status.eq_ignore_ascii_case("UNHEALTHY")
            })
            .count();
        self.report.max_in_flight = self.report.max_in_flight.max(being_replaced);
        if being_replaced > MAX_PARALLEL {
            self.report.violations.push(format!(
                "run {}: {being_replaced} instances of the group being replaced at once (at most {MAX_PARALLEL})",
                self.report.runs
            ));
        }
        let over_threshold =
            in_service > 5 && unhealthy_in_service * 100 > in_service * MAX_UNHEALTHY_PERCENT;
        if started > 0 && over_threshold {
            self.report.violations.push(format!(
                "run {}: a repair started with {unhealthy_in_service} of {in_service} in-service nodes unhealthy (stop above {MAX_UNHEALTHY_PERCENT} %)",
                self.report.runs
            ));
        }
    }
}
