//! The simulated world of a sandbox run: the fakes, the seeded cluster and the function
//! processes, and the scenario's steps played on it. Seeding, the functions' start-up and
//! deliveries, each step and the printed report live in their own modules beside this one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::Value;
use tokio::task::JoinHandle;

use super::functions::NoticeAnswer;
use super::scenario::{NodegroupSpec, Scenario, Step};
use super::timeline::{Source, Timeline};
use super::{SandboxError, SandboxReport};
use crate::account::FakeAccount;
use crate::aws::{FakeAws, WarmPoolState};
use crate::fixtures::{self, NodegroupCall};
use crate::kube::{FakeApiServer, SimulationTimings};
use crate::lambda_api::{FunctionSpec, LambdaRuntimeApi};

/// The function binaries the sandbox runs, by their Lambda function name.
pub const FUNCTIONS: [&str; 5] = [
    "nodegroup-auth",
    "launching-hook",
    "terminating-hook",
    "node-repair",
    "instance-refresh",
];

pub(super) const TOPIC_NAME: &str = "eks-asg-lifecycle-hook-topic";
pub(super) const EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The node annotation holding the terminating hook's drain checkpoint.
pub(super) const DRAIN_CHECKPOINT: &str = "open-node-manager.io/drain";

/// A node of the simulated cluster and the instance behind it.
#[derive(Debug, Clone)]
pub(super) struct SimulatedNode {
    pub(super) name: String,
    pub(super) instance_id: String,
    pub(super) availability_zone: String,
}

impl SimulatedNode {
    pub(super) fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.availability_zone, self.instance_id)
    }
}

/// The running sandbox.
pub struct Sandbox {
    pub(super) scenario: Scenario,
    pub(super) timeline: Timeline,
    pub(super) account: FakeAccount,
    pub(super) aws: Arc<FakeAws>,
    pub(super) server: FakeApiServer,
    pub(super) functions: BTreeMap<&'static str, Arc<LambdaRuntimeApi>>,
    /// How each function process is started (binary, environment).
    pub(super) specs: BTreeMap<&'static str, FunctionSpec>,
    /// Seeded nodes per node group, in scenario order.
    pub(super) nodes: BTreeMap<String, Vec<SimulatedNode>>,
    pub(super) next_instance: AtomicU32,
    pub(super) background: Vec<JoinHandle<()>>,
    /// Registers the nodes' instances with the cluster's target group (seeded by
    /// `seed_aws`) and deregisters those the drain labels out of load balancers.
    pub(super) service_controller: Option<crate::service_controller::ServiceController>,
    /// Instances waiting in a warm pool, longest first.
    pub(super) warm_pool: std::sync::Mutex<Vec<SimulatedNode>>,
    /// Instances in service that came out of a warm pool, most recent last.
    pub(super) from_warm_pool: std::sync::Mutex<Vec<SimulatedNode>>,
    /// Probe pods created to show a node serves pods.
    pub(super) probes: AtomicU32,
    /// Processes started when Lambda scaled out (`concurrentInvocations`), to stop at the end.
    pub(super) scaled_out: Arc<std::sync::Mutex<Vec<Arc<LambdaRuntimeApi>>>>,
    /// Every instance event delivered to `terminating-hook`, with its answer, in the order
    /// the invocations ended.
    pub(super) notice_answers: Arc<std::sync::Mutex<Vec<NoticeAnswer>>>,
}

/// Maps a set-up failure to a [`SandboxError::Setup`] naming `what` was being set up.
pub(super) fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> SandboxError + '_ {
    move |e| SandboxError::Setup(format!("{what}: {e}"))
}

/// The repository root (the test kit crate's parent folder).
fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

impl Sandbox {
    /// Starts the fakes and the functions, and seeds the scenario's cluster.
    pub async fn start(scenario: Scenario, echo: bool) -> Result<Self, SandboxError> {
        let timeline = Timeline::new(echo);
        timeline.record(
            Source::Step,
            format!("scenario {}: {}", scenario.name, scenario.description),
        );
        let account = FakeAccount::new(&scenario.account_id, &scenario.region);
        let aws = Arc::new(
            FakeAws::start(account.clone())
                .await
                .map_err(setup("fake AWS"))?,
        );
        let server = start_api_server(&scenario, &account, &aws).await?;
        let mut sandbox = Self {
            scenario,
            timeline,
            account,
            aws,
            server,
            functions: BTreeMap::new(),
            specs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            next_instance: AtomicU32::new(0),
            background: Vec::new(),
            service_controller: None,
            warm_pool: std::sync::Mutex::default(),
            from_warm_pool: std::sync::Mutex::default(),
            probes: AtomicU32::new(0),
            scaled_out: Arc::default(),
            notice_answers: Arc::default(),
        };
        sandbox.seed_aws()?;
        let credentials = sandbox.grant_function_identities()?;
        sandbox.seed_cluster()?;
        sandbox.start_functions(&credentials).await?;
        sandbox.deliver_lifecycle_notifications()?;
        if sandbox.scenario.refresh_events {
            sandbox.deliver_refresh_events();
        }
        if sandbox.scenario.instance_notice_events {
            sandbox.deliver_instance_notices();
        }
        sandbox.follow_instances();
        if sandbox.scenario.load_balancer {
            sandbox.start_service_controller();
        }
        let follower = sandbox
            .timeline
            .follow(&sandbox.server, sandbox.aws.clone());
        sandbox.background.push(follower);
        sandbox.wait_for_seeded_pods().await;
        sandbox.timeline.record(
            Source::Note,
            format!(
                "cluster {} seeded: {} nodes, {} pods; API server {}",
                sandbox.scenario.cluster,
                sandbox.server.store().list::<Node>().len(),
                sandbox.server.store().list::<Pod>().len(),
                sandbox.server.url()
            ),
        );
        Ok(sandbox)
    }

    pub(super) fn mode(&self) -> &str {
        &self.scenario.authentication_mode
    }

    pub(super) fn uses_config_map(&self) -> bool {
        self.mode() != "API"
    }

    pub(super) fn uses_access_entries(&self) -> bool {
        self.mode() != "CONFIG_MAP"
    }

    pub(super) fn topic_arn(&self) -> String {
        self.aws.sns().topic_arn(TOPIC_NAME)
    }

    pub(super) fn role_arn(&self, spec: &NodegroupSpec) -> String {
        self.account.role_arn(&spec.node_role)
    }

    pub(super) fn nodegroup(&self, name: &str) -> Option<&NodegroupSpec> {
        self.scenario.nodegroups.iter().find(|n| n.name == name)
    }

    /// The seeded node `index` of `nodegroup`, with its node group.
    pub(super) fn seeded(
        &self,
        nodegroup: &str,
        index: usize,
    ) -> Option<(&NodegroupSpec, &SimulatedNode)> {
        let node = self.nodes.get(nodegroup)?.get(index)?;
        Some((self.nodegroup(nodegroup)?, node))
    }

    /// Node `index` of the node group at `group_index` (names and ids are reproducible).
    pub(super) fn new_node(&self, group_index: usize, index: u32) -> SimulatedNode {
        let region = &self.scenario.region;
        let zones = self.scenario.nodegroups.get(group_index).map_or_else(
            || vec![format!("{region}a")],
            |g| g.availability_zones(region),
        );
        let zone = zones[index as usize % zones.len()].clone();
        SimulatedNode {
            name: format!(
                "ip-192-168-{}-{}.{}.compute.internal",
                group_index * 32 + index as usize,
                10 + index,
                self.scenario.region
            ),
            // Realistic-looking, distinct, reproducible instance ids.
            instance_id: format!(
                "i-0{:016x}",
                0x7e9e_a9eb_19a6_7337_u64
                    .wrapping_add((group_index as u64) << 40)
                    .wrapping_add((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            ),
            availability_zone: zone,
        }
    }

    /// The next instance of node group `spec` to launch.
    pub(super) fn next_node_of(&self, spec: &NodegroupSpec) -> SimulatedNode {
        let group_index = self
            .scenario
            .nodegroups
            .iter()
            .position(|n| n.name == spec.name)
            .unwrap_or_default();
        self.new_node(
            group_index,
            self.next_instance.fetch_add(1, Ordering::Relaxed),
        )
    }

    /// How long the sandbox waits for one invocation.
    pub(super) fn function_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.scenario.timings.function_timeout_seconds)
    }

    /// The fake API server (for benchmarks and tests that look inside).
    pub fn server(&self) -> &FakeApiServer {
        &self.server
    }

    /// The fake AWS endpoints.
    pub fn aws(&self) -> &FakeAws {
        &self.aws
    }

    /// The function processes, by name.
    pub fn function(&self, name: &str) -> Option<&LambdaRuntimeApi> {
        self.functions.get(name).map(|f| f.as_ref())
    }

    /// How the sandbox starts `name` (binary and environment), to start more processes of it.
    pub fn function_spec(&self, name: &str) -> Option<FunctionSpec> {
        self.specs.get(name).cloned()
    }

    /// The EventBridge CloudTrail event (`CreateNodegroup`/`DeleteNodegroup`) for a node
    /// group of the scenario, as the sandbox sends it to `nodegroup-auth`.
    pub fn nodegroup_event_payload(&self, event_name: &str, nodegroup: &str) -> Value {
        match self.nodegroup(nodegroup) {
            Some(spec) => self.cloudtrail_event(spec, &self.role_arn(spec), event_name),
            None => Value::Null,
        }
    }

    /// The CloudTrail record of `event_name` on node group `spec` of this cluster.
    pub(super) fn cloudtrail_event(
        &self,
        spec: &NodegroupSpec,
        role_arn: &str,
        event_name: &str,
    ) -> Value {
        let call = NodegroupCall {
            account_id: &self.scenario.account_id,
            region: &self.scenario.region,
            cluster: &self.scenario.cluster,
            nodegroup: &spec.name,
            node_role_arn: role_arn,
            ami_type: &spec.ami_type,
        };
        fixtures::nodegroup_cloudtrail_event(&call, event_name)
    }

    /// The seeded node `index` of `nodegroup`: (node name, instance id).
    pub fn seeded_node(&self, nodegroup: &str, index: usize) -> Option<(String, String)> {
        self.nodes
            .get(nodegroup)
            .and_then(|nodes| nodes.get(index))
            .map(|n| (n.name.clone(), n.instance_id.clone()))
    }

    /// Plays step `index` of the scenario; returns its checks (held, description).
    pub async fn play_step(&self, index: usize) -> Vec<(bool, String)> {
        let Some(step) = self.scenario.steps.get(index) else {
            return vec![(false, format!("the scenario has a step {}", index + 1))];
        };
        match step {
            Step::CreateNodegroup(s) => self.create_nodegroup(index, s).await,
            Step::DeleteNodegroup(s) => self.delete_nodegroup(index, s).await,
            Step::ScaleOut(s) => self.scale_out(index, s).await,
            Step::ScaleIn(s) => self.scale_in(index, s).await,
            Step::LaunchIntoWarmPool(s) => self.launch_into_warm_pool(index, s).await,
            Step::ScaleOutFromWarmPool(s) => self.scale_out_from_warm_pool(index, s).await,
            Step::ScaleInToWarmPool(s) => self.scale_in_to_warm_pool(index, s).await,
            Step::RepairNode(s) => self.repair_node(index, s).await,
            Step::InstanceRefresh(s) => self.instance_refresh(index, s).await,
            Step::SpotInterruption(s) => self.spot_interruption(index, s).await,
        }
    }

    /// Plays every step and checks its effects.
    pub async fn play(&self) -> SandboxReport {
        let mut report = SandboxReport::default();
        for index in 0..self.scenario.steps.len() {
            let checks = self.play_step(index).await;
            for (ok, text) in checks {
                self.timeline.record(
                    Source::Check,
                    format!("{} {text}", if ok { "✓" } else { "✗" }),
                );
                if ok {
                    report.passed.push(text);
                } else {
                    report.failed.push(text);
                }
            }
        }
        report.elapsed = self.timeline.elapsed();
        self.timeline.record(
            Source::Step,
            format!(
                "done in {:.1}s: {} checks passed, {} failed",
                report.elapsed.as_secs_f64(),
                report.passed.len(),
                report.failed.len()
            ),
        );
        report
    }

    /// Stops the functions, the deliveries and the fakes.
    pub async fn shutdown(self) {
        for task in &self.background {
            task.abort();
        }
        for function in self.functions.values() {
            function.kill().await;
        }
        let scaled_out: Vec<_> =
            std::mem::take(&mut *self.scaled_out.lock().unwrap_or_else(|e| e.into_inner()));
        for function in scaled_out {
            function.kill().await;
        }
        self.server.shutdown();
    }

    /// The timeline so far.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }
}

/// The fake API server with the scenario's timings and the shipped RBAC.
async fn start_api_server(
    scenario: &Scenario,
    account: &FakeAccount,
    aws: &FakeAws,
) -> Result<FakeApiServer, SandboxError> {
    let timings = &scenario.timings;
    let server = FakeApiServer::builder()
        .cluster_name(&scenario.cluster)
        .account(account.clone())
        .access_entries(Arc::new(aws.eks()))
        .ec2(aws.ec2())
        .simulation(SimulationTimings {
            pod_start_delay: Duration::from_secs_f64(timings.pod_start_seconds),
            node_ready_after: Duration::from_secs_f64(timings.node_ready_seconds),
            grace_period_scale: timings.grace_period_scale,
            prefer_cached_images: scenario.prefer_cached_images,
            volume_detach_delay: Duration::from_secs_f64(timings.volume_detach_seconds),
            ..SimulationTimings::default()
        })
        .start()
        .await
        .map_err(setup("fake API server"))?;
    let rbac = repository_root().join("infra/rbac.yaml");
    server
        .apply_manifest_file(&rbac)
        .map_err(setup("loading infra/rbac.yaml"))?;
    Ok(server)
}

/// The pool state of `spec`'s warm pool (validated when the scenario was read).
pub(super) fn warm_pool_state(spec: &NodegroupSpec) -> Option<WarmPoolState> {
    match spec.warm_pool.as_deref()? {
        "Running" => Some(WarmPoolState::Running),
        "Hibernated" => Some(WarmPoolState::Hibernated),
        _ => Some(WarmPoolState::Stopped),
    }
}
