//! The simulated world of a sandbox run: the fakes, the seeded cluster, the function
//! processes and the SNS deliveries between them; and the steps played on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use node_manager::aws::LifecycleActionResult;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::scenario::{
    NodegroupSpec, NodegroupStep, RepairNodeStep, ScaleInStep, ScaleOutStep, Scenario, Step,
    WarmPoolStep,
};
use super::timeline::{Source, Timeline};
use super::{SandboxError, SandboxReport};
use crate::account::{FakeAccount, FakeCredentials};
use crate::aws::{
    CompletedBy, FakeAutoScalingGroup, FakeAws, FakeCluster, FakeInstance, FakeLifecycleHook,
    FakeNodegroup, LifecycleCompletion, SubscriptionFilter, WarmPoolState,
};
use crate::binaries;
use crate::kube::{FakeApiServer, SimulationTimings};
use crate::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};

/// The function binaries the sandbox runs, by their Lambda function name.
pub const FUNCTIONS: [&str; 4] = [
    "nodegroup-auth",
    "launching-hook",
    "terminating-hook",
    "node-repair",
];

const TOPIC_NAME: &str = "eks-asg-lifecycle-hook-topic";
const LAUNCHING: &str = "autoscaling:EC2_INSTANCE_LAUNCHING";
const TERMINATING: &str = "autoscaling:EC2_INSTANCE_TERMINATING";
const EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The node annotation holding the terminating hook's drain checkpoint.
const DRAIN_CHECKPOINT: &str = "open-node-manager.io/drain";

/// A node of the simulated cluster and the instance behind it.
#[derive(Debug, Clone)]
struct SimulatedNode {
    name: String,
    instance_id: String,
    availability_zone: String,
}

impl SimulatedNode {
    fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.availability_zone, self.instance_id)
    }
}

/// The running sandbox.
pub struct Sandbox {
    scenario: Scenario,
    timeline: Timeline,
    account: FakeAccount,
    aws: Arc<FakeAws>,
    server: FakeApiServer,
    functions: BTreeMap<&'static str, Arc<LambdaRuntimeApi>>,
    /// How each function process is started (binary, environment).
    specs: BTreeMap<&'static str, FunctionSpec>,
    /// Seeded nodes per node group, in scenario order.
    nodes: BTreeMap<String, Vec<SimulatedNode>>,
    next_instance: AtomicU32,
    background: Vec<JoinHandle<()>>,
    /// Instances waiting in a warm pool, longest first.
    warm_pool: std::sync::Mutex<Vec<SimulatedNode>>,
    /// Instances in service that came out of a warm pool, most recent last.
    from_warm_pool: std::sync::Mutex<Vec<SimulatedNode>>,
    /// Probe pods created to show a node serves pods.
    probes: AtomicU32,
    /// Processes started when Lambda scaled out (`concurrentInvocations`), to stop at the end.
    scaled_out: Arc<std::sync::Mutex<Vec<Arc<LambdaRuntimeApi>>>>,
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> SandboxError + '_ {
    move |e| SandboxError::Setup(format!("{what}: {e}"))
}

/// `1.0` → `"1"`, `0.5` → `"0.5"`: settings read whole or fractional seconds.
fn seconds(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{}", value as u64)
    } else {
        format!("{value}")
    }
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
        let timings = &scenario.timings;
        let server = FakeApiServer::builder()
            .cluster_name(&scenario.cluster)
            .account(account.clone())
            .access_entries(Arc::new(aws.eks()))
            .simulation(SimulationTimings {
                pod_start_delay: Duration::from_secs_f64(timings.pod_start_seconds),
                node_ready_after: Duration::from_secs_f64(timings.node_ready_seconds),
                grace_period_scale: timings.grace_period_scale,
                ..SimulationTimings::default()
            })
            .start()
            .await
            .map_err(setup("fake API server"))?;
        let rbac = repository_root().join("infra/rbac.yaml");
        server
            .apply_manifest_file(&rbac)
            .map_err(setup("loading infra/rbac.yaml"))?;

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
            warm_pool: std::sync::Mutex::default(),
            from_warm_pool: std::sync::Mutex::default(),
            probes: AtomicU32::new(0),
            scaled_out: Arc::default(),
        };
        sandbox.seed_aws()?;
        let credentials = sandbox.grant_function_identities()?;
        sandbox.seed_cluster()?;
        sandbox.start_functions(&credentials).await?;
        sandbox.deliver_lifecycle_notifications()?;
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

    fn mode(&self) -> &str {
        &self.scenario.authentication_mode
    }

    fn uses_config_map(&self) -> bool {
        self.mode() != "API"
    }

    fn uses_access_entries(&self) -> bool {
        self.mode() != "CONFIG_MAP"
    }

    /// Each function has its own IAM role, mapped to the functions' Kubernetes group the way
    /// the operator's guide says: an `aws-auth` entry and/or a STANDARD access entry.
    fn grant_function_identities(
        &self,
    ) -> Result<BTreeMap<&'static str, FakeCredentials>, SandboxError> {
        let mut credentials = BTreeMap::new();
        let mut map_roles = String::new();
        for function in FUNCTIONS {
            let role = format!("open-node-manager-{function}");
            let creds = self.account.add_role_credentials(&role);
            map_roles.push_str(&format!(
                "- rolearn: {}\n  username: open-node-manager:{function}\n  groups:\n    - open-node-manager:{function}\n",
                creds.principal_arn
            ));
            if self.uses_access_entries() {
                self.aws
                    .eks()
                    .add_access_entry(
                        &self.scenario.cluster,
                        &creds.principal_arn,
                        "STANDARD",
                        Some(&format!("open-node-manager:{function}")),
                        &[format!("open-node-manager:{function}").as_str()],
                    )
                    .map_err(setup("access entry for a function role"))?;
            }
            credentials.insert(function, creds);
        }
        if self.uses_config_map() {
            self.server
                .store()
                .apply_value(json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": { "name": "aws-auth", "namespace": "kube-system" },
                    "data": { "mapRoles": map_roles, "mapUsers": "[]\n" },
                }))
                .map_err(setup("aws-auth"))?;
        }
        Ok(credentials)
    }

    fn topic_arn(&self) -> String {
        self.aws.sns().topic_arn(TOPIC_NAME)
    }

    fn role_arn(&self, spec: &NodegroupSpec) -> String {
        self.account.role_arn(&spec.node_role)
    }

    fn new_node(&self, group_index: usize, index: u32) -> SimulatedNode {
        let zone = ['a', 'b', 'c'][index as usize % 3];
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
            availability_zone: format!("{}{zone}", self.scenario.region),
        }
    }

    /// The cluster, its node groups, their Auto Scaling groups with both hooks, the lifecycle
    /// topic, and an EC2 instance per seeded node.
    fn seed_aws(&mut self) -> Result<(), SandboxError> {
        let cluster = self.scenario.cluster.clone();
        let eks = self.aws.eks();
        eks.add_cluster(
            FakeCluster::new(&cluster, self.server.url(), &self.server.ca_data())
                .authentication_mode(Some(self.mode())),
        );
        let topic = self.aws.sns().create_topic(TOPIC_NAME);
        let heartbeat = Duration::from_secs(self.scenario.timings.heartbeat_timeout_seconds);
        for (group_index, spec) in self.scenario.nodegroups.clone().iter().enumerate() {
            eks.add_nodegroup(
                &cluster,
                FakeNodegroup::new(&spec.name, &self.role_arn(spec))
                    .ami_type(&spec.ami_type)
                    .auto_scaling_group(&spec.auto_scaling_group),
            )
            .map_err(setup("node group"))?;
            let mut group = FakeAutoScalingGroup::new(&spec.auto_scaling_group)
                .tag("eks:nodegroup-name", &spec.name)
                .availability_zones(&[&format!("{}a", self.scenario.region)])
                // The seeded nodes are minutes old in the story, not seconds.
                .health_check_grace_period(Duration::ZERO);
            if spec.tagged_for_cluster {
                group = group.tag("eks:cluster-name", &cluster);
            }
            let autoscaling = self.aws.autoscaling();
            autoscaling.add_group(group);
            if let Some(state) = warm_pool_state(spec) {
                autoscaling.set_warm_pool(&spec.auto_scaling_group, state);
            }
            for hook in [
                FakeLifecycleHook::launching("Launch-LC-Hook"),
                FakeLifecycleHook::terminating("Terminate-LC-Hook"),
            ] {
                autoscaling
                    .add_hook(
                        &spec.auto_scaling_group,
                        hook.heartbeat_timeout(heartbeat)
                            .default_result(LifecycleActionResult::Continue)
                            .notification_target(&topic),
                    )
                    .map_err(setup("lifecycle hook"))?;
            }
            let mut nodes = Vec::new();
            for _ in 0..spec.nodes {
                let node = self.new_node(
                    group_index,
                    self.next_instance.fetch_add(1, Ordering::Relaxed),
                );
                self.add_instance(spec, &node)?;
                nodes.push(node);
            }
            self.nodes.insert(spec.name.clone(), nodes);
            let _ = group_index;
        }
        Ok(())
    }

    fn add_instance(&self, spec: &NodegroupSpec, node: &SimulatedNode) -> Result<(), SandboxError> {
        self.aws.ec2().add_instance(
            FakeInstance::new(&node.instance_id, &self.scenario.region)
                .private_dns_name(&node.name)
                .availability_zone(&node.availability_zone)
                .tag("eks:nodegroup-name", &spec.name),
        );
        self.aws
            .autoscaling()
            .add_instance(
                &spec.auto_scaling_group,
                &node.instance_id,
                &node.availability_zone,
            )
            .map_err(setup("Auto Scaling instance"))
    }

    fn node_object(&self, nodegroup: &str, node: &SimulatedNode, ready: bool) -> Value {
        let now = jiff::Timestamp::now().to_string();
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": {
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "eks.amazonaws.com/nodegroup": nodegroup,
                    "topology.kubernetes.io/zone": node.availability_zone,
                    "node.kubernetes.io/instance-type": "m5.large",
                },
            },
            "spec": { "providerID": node.provider_id() },
            "status": {
                "conditions": [{
                    "type": "Ready",
                    "status": if ready { "True" } else { "False" },
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }],
                "nodeInfo": { "kubeletVersion": "v1.33.0-eks-sandbox" },
            },
        })
    }

    /// Nodes, namespaces and workloads, with pods placed as the scenario says.
    fn seed_cluster(&self) -> Result<(), SandboxError> {
        let store = self.server.store();
        let seeded: Vec<&SimulatedNode> = self.nodes.values().flatten().collect();
        for (nodegroup, nodes) in &self.nodes {
            for node in nodes {
                store
                    .apply_value(self.node_object(nodegroup, node, true))
                    .map_err(setup("node"))?;
            }
        }
        for workload in &self.scenario.workloads {
            let ns = workload.namespace.as_str();
            if store.get_value("v1", "Namespace", "", ns).is_err() {
                store
                    .apply_value(
                        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                    )
                    .map_err(setup("namespace"))?;
            }
            let labels = json!({ "app": workload.name });
            let mut pod_spec = json!({
                "terminationGracePeriodSeconds": 30,
                "containers": [{ "name": workload.name, "image": format!("public.ecr.aws/sandbox/{}:latest", workload.name) }],
            });
            if let Some(priority) = &workload.priority_class_name {
                pod_spec["priorityClassName"] = json!(priority);
            }
            let template = json!({ "metadata": { "labels": labels }, "spec": pod_spec });
            if workload.kind == "DaemonSet" {
                store
                    .apply_value(json!({
                        "apiVersion": "apps/v1", "kind": "DaemonSet",
                        "metadata": { "name": workload.name, "namespace": ns },
                        "spec": { "selector": { "matchLabels": labels }, "template": template },
                    }))
                    .map_err(setup("DaemonSet"))?;
                continue;
            }
            let deployment = store
                .apply_value(json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": { "name": workload.name, "namespace": ns, "labels": labels },
                    // Zero until the pods are placed (below): the simulated controllers run
                    // meanwhile, and would otherwise create pods of their own for the
                    // replicas not seeded yet, wherever their scheduler likes.
                    "spec": { "replicas": 0, "selector": { "matchLabels": labels }, "template": template },
                }))
                .map_err(setup("Deployment"))?;
            let rs_name = format!("{}-7c5ddbdf54", workload.name);
            let replica_set = store
                .apply_value(json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {
                        "name": rs_name, "namespace": ns, "labels": labels,
                        "ownerReferences": [owner_reference(&deployment, "Deployment")],
                    },
                    "spec": { "replicas": 0, "selector": { "matchLabels": labels }, "template": template },
                }))
                .map_err(setup("ReplicaSet"))?;
            for replica in 0..workload.replicas {
                let node_index = workload
                    .placement
                    .get(replica)
                    .copied()
                    .unwrap_or(replica % seeded.len().max(1));
                let Some(node) = seeded.get(node_index) else {
                    return Err(SandboxError::Scenario(format!(
                        "workload {ns}/{} has no node to run on",
                        workload.name
                    )));
                };
                let mut spec = pod_spec.clone();
                spec["nodeName"] = json!(node.name);
                store
                    .apply_value(json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {
                            "name": format!("{rs_name}-{}", pod_suffix(&workload.name, replica)),
                            "namespace": ns, "labels": labels,
                            "ownerReferences": [owner_reference(&replica_set, "ReplicaSet")],
                        },
                        "spec": spec,
                        "status": running_status(),
                    }))
                    .map_err(setup("pod"))?;
            }
            for (owner, what) in [(replica_set, "ReplicaSet"), (deployment, "Deployment")] {
                let mut owner = owner;
                owner["spec"]["replicas"] = json!(workload.replicas);
                store.apply_value(owner).map_err(setup(what))?;
            }
            if let Some(pdb) = &workload.pdb {
                let mut spec = json!({ "selector": { "matchLabels": labels } });
                if let Some(min) = pdb.min_available {
                    spec["minAvailable"] = json!(min);
                }
                if let Some(max) = pdb.max_unavailable {
                    spec["maxUnavailable"] = json!(max);
                }
                store
                    .apply_value(json!({
                        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                        "metadata": { "name": workload.name, "namespace": ns },
                        "spec": spec,
                    }))
                    .map_err(setup("PodDisruptionBudget"))?;
            }
        }
        Ok(())
    }

    async fn start_functions(
        &mut self,
        credentials: &BTreeMap<&'static str, FakeCredentials>,
    ) -> Result<(), SandboxError> {
        let timings = self.scenario.timings.clone();
        for function in FUNCTIONS {
            let binary =
                binaries::try_function_binary(function).map_err(setup("function binary"))?;
            let creds = &credentials[function];
            let mut spec = FunctionSpec::new(function, binary)
                .region(&self.scenario.region)
                .log_format("Text")
                .envs(self.aws.environment(creds))
                .env("CLUSTER_NAME", &self.scenario.cluster)
                .env("CONTINUATION_TOPIC_ARN", &self.topic_arn())
                .env("SETTLE_SECONDS", &seconds(timings.settle_seconds))
                .env(
                    "DRAIN_TIMEOUT_SECONDS",
                    &seconds(timings.drain_timeout_seconds),
                )
                .env(
                    "LAUNCH_TIMEOUT_SECONDS",
                    &seconds(timings.launch_timeout_seconds),
                )
                .env("EVICTION_BACKOFF_MAX_SECONDS", "2")
                // nodegroup-auth: poll a DELETING node group every second, not every 15.
                .env("DELETE_POLL_SECONDS", "1")
                .env("RUST_LOG", "warn")
                .envs(self.scenario.function_env.clone());
            spec.account_id = self.scenario.account_id.clone();
            self.specs.insert(function, spec.clone());
            let runtime = LambdaRuntimeApi::start_function(spec)
                .await
                .map_err(setup("Lambda Runtime API"))?;
            self.functions.insert(function, Arc::new(runtime));
        }
        Ok(())
    }

    fn function_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.scenario.timings.function_timeout_seconds)
    }

    /// Each hook function is subscribed to the lifecycle topic with the filter the SAM
    /// template uses; every delivery (from Auto Scaling or a hand-over) becomes an invocation.
    fn deliver_lifecycle_notifications(&mut self) -> Result<(), SandboxError> {
        for (function, transition) in [
            ("launching-hook", LAUNCHING),
            ("terminating-hook", TERMINATING),
        ] {
            let mut subscription = self
                .aws
                .sns()
                .subscribe_filtered(
                    &self.topic_arn(),
                    Some(SubscriptionFilter::lifecycle_transition(&[transition])),
                )
                .map_err(setup("SNS subscription"))?;
            let runtime = self.functions[function].clone();
            let timeline = self.timeline.clone();
            let timeout = self.function_timeout();
            if self.scenario.concurrent_invocations {
                let spec = self.specs[function].clone();
                let scaled_out = self.scaled_out.clone();
                self.background.push(tokio::spawn(async move {
                    let idle = Arc::new(std::sync::Mutex::new(vec![runtime]));
                    loop {
                        let Some(event) = subscription.next_event(Duration::from_secs(3600)).await
                        else {
                            continue;
                        };
                        let (idle, scaled_out, spec, timeline) = (
                            idle.clone(),
                            scaled_out.clone(),
                            spec.clone(),
                            timeline.clone(),
                        );
                        tokio::spawn(async move {
                            let free = idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
                            let process = match free {
                                Some(process) => process,
                                None => match LambdaRuntimeApi::start_function(spec).await {
                                    Ok(process) => {
                                        let process = Arc::new(process);
                                        scaled_out
                                            .lock()
                                            .unwrap_or_else(|e| e.into_inner())
                                            .push(process.clone());
                                        process
                                    }
                                    Err(error) => {
                                        timeline.record(
                                            Source::Lambda,
                                            format!("{function} could not scale out: {error}"),
                                        );
                                        return;
                                    }
                                },
                            };
                            invoke(
                                &timeline,
                                function,
                                &process,
                                &event,
                                timeout,
                                &summarize_sns(&event),
                            )
                            .await;
                            idle.lock().unwrap_or_else(|e| e.into_inner()).push(process);
                        });
                    }
                }));
                continue;
            }
            self.background.push(tokio::spawn(async move {
                loop {
                    let Some(event) = subscription.next_event(Duration::from_secs(3600)).await
                    else {
                        continue;
                    };
                    invoke(
                        &timeline,
                        function,
                        &runtime,
                        &event,
                        timeout,
                        &summarize_sns(&event),
                    )
                    .await;
                }
            }));
        }
        Ok(())
    }

    async fn wait_for_seeded_pods(&self) {
        for _ in 0..200 {
            let pods = self.server.store().list::<Pod>();
            if !pods.is_empty() && pods.iter().all(pod_ready) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
            Some(spec) => cloudtrail_event(&self.scenario, spec, &self.role_arn(spec), event_name),
            None => Value::Null,
        }
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

    fn nodegroup(&self, name: &str) -> Option<&NodegroupSpec> {
        self.scenario.nodegroups.iter().find(|n| n.name == name)
    }

    async fn create_nodegroup(&self, index: usize, step: &NodegroupStep) -> Vec<(bool, String)> {
        self.timeline.record(
            Source::Step,
            format!(
                "{}. CreateNodegroup {} (CloudTrail via EventBridge)",
                index + 1,
                step.nodegroup
            ),
        );
        self.nodegroup_event("CreateNodegroup", step).await
    }

    async fn delete_nodegroup(&self, index: usize, step: &NodegroupStep) -> Vec<(bool, String)> {
        self.timeline.record(
            Source::Step,
            format!(
                "{}. DeleteNodegroup {} (CloudTrail via EventBridge)",
                index + 1,
                step.nodegroup
            ),
        );
        // As EKS does: the node group is DELETING when the event is sent, and gone a little
        // later (nodegroup-auth waits for that; a node group already gone when the event
        // arrives cannot be verified, and its role would stay mapped).
        let eks = self.aws.eks();
        if let Some(spec) = self.nodegroup(&step.nodegroup) {
            // Re-adding with the same name replaces the node group, status aside.
            let deleting = FakeNodegroup::new(&spec.name, &self.role_arn(spec))
                .ami_type(&spec.ami_type)
                .auto_scaling_group(&spec.auto_scaling_group)
                .status("DELETING");
            if eks.add_nodegroup(&self.scenario.cluster, deleting).is_err() {
                return vec![(false, format!("node group {} is DELETING", step.nodegroup))];
            }
        }
        let cluster = self.scenario.cluster.clone();
        let name = step.nodegroup.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            eks.remove_nodegroup(&cluster, &name);
        });
        self.nodegroup_event("DeleteNodegroup", step).await
    }

    async fn nodegroup_event(&self, event_name: &str, step: &NodegroupStep) -> Vec<(bool, String)> {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let role_arn = self.role_arn(spec);
        let event = cloudtrail_event(&self.scenario, spec, &role_arn, event_name);
        let outcome = invoke(
            &self.timeline,
            "nodegroup-auth",
            &self.functions["nodegroup-auth"],
            &event,
            self.function_timeout(),
            &format!("EventBridge {event_name} {}", spec.name),
        )
        .await;
        let mut checks = vec![(
            matches!(outcome, Some(InvocationOutcome::Response(_))),
            format!("nodegroup-auth handled {event_name} without error"),
        )];
        let verb = if step.expect_role_mapped {
            "maps"
        } else {
            "no longer maps"
        };
        if self.uses_config_map() && self.mode() == "CONFIG_MAP" {
            let mapped = self.aws_auth_maps_node_role(&role_arn);
            checks.push((
                mapped == step.expect_role_mapped,
                format!("aws-auth {verb} {role_arn} as a node"),
            ));
        }
        if self.uses_access_entries() {
            let entry = self
                .aws
                .eks()
                .access_entry(&self.scenario.cluster, &role_arn);
            checks.push((
                entry.is_some() == step.expect_role_mapped,
                format!("access entry (EC2_LINUX) {verb} {role_arn}"),
            ));
        }
        checks
    }

    /// Whether `aws-auth` maps `role_arn` with the node username and both node groups.
    fn aws_auth_maps_node_role(&self, role_arn: &str) -> bool {
        let Some(config_map) = self
            .server
            .store()
            .find::<ConfigMap>("kube-system", "aws-auth")
        else {
            return false;
        };
        let map_roles = config_map
            .data
            .as_ref()
            .and_then(|d| d.get("mapRoles"))
            .cloned()
            .unwrap_or_default();
        let Ok(entries) = serde_saphyr::from_str::<Vec<BTreeMap<String, Value>>>(&map_roles) else {
            return false;
        };
        entries.iter().any(|entry| {
            let field = |name: &str| {
                entry
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v)
            };
            let arn_matches = field("rolearn")
                .and_then(Value::as_str)
                .is_some_and(|a| a.eq_ignore_ascii_case(role_arn));
            let username = field("username").and_then(Value::as_str)
                == Some("system:node:{{EC2PrivateDNSName}}");
            let groups: Vec<&str> = field("groups")
                .and_then(Value::as_array)
                .map(|g| g.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            arn_matches
                && username
                && groups.contains(&"system:nodes")
                && groups.contains(&"system:bootstrappers")
        })
    }

    async fn scale_out(&self, index: usize, step: &ScaleOutStep) -> Vec<(bool, String)> {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let group_index = self
            .scenario
            .nodegroups
            .iter()
            .position(|n| n.name == spec.name)
            .unwrap_or_default();
        let node = self.new_node(
            group_index,
            self.next_instance.fetch_add(1, Ordering::Relaxed),
        );
        self.timeline.record(
            Source::Step,
            format!(
                "{}. scale-out of {}: instance {} launches ({})",
                index + 1,
                spec.auto_scaling_group,
                node.instance_id,
                if step.node_joins {
                    "its node will register"
                } else {
                    "its node never registers"
                }
            ),
        );
        let mut checks = Vec::new();
        if let Err(error) = self.add_instance(spec, &node) {
            return vec![(false, error.to_string())];
        }
        if let Err(error) = self
            .aws
            .autoscaling()
            .launch_instance(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(false, format!("launch lifecycle action started: {error}"))];
        }
        if step.node_joins {
            let register_after =
                Duration::from_secs_f64(self.scenario.timings.node_register_seconds);
            let ready_after = Duration::from_secs_f64(self.scenario.timings.node_ready_seconds);
            tokio::time::sleep(register_after).await;
            let registered =
                self.server
                    .register_node(&node.name, &node.provider_id(), Some(ready_after));
            self.timeline.record(
                Source::Note,
                format!(
                    "kubelet on {} registers the node (Ready in {ready_after:?})",
                    node.name
                ),
            );
            if let Err(error) = registered {
                return vec![(false, format!("node registered: {error}"))];
            }
        }
        let wait = Duration::from_secs_f64(self.scenario.timings.launch_timeout_seconds)
            + Duration::from_secs(15);
        let completion = self
            .aws
            .autoscaling()
            .wait_for_completion(&node.instance_id, wait)
            .await;
        let node_ready = self
            .server
            .store()
            .find::<Node>("", &node.name)
            .is_some_and(|n| node_ready(&n));
        match completion {
            Some(c) => {
                self.timeline.record(
                    Source::Note,
                    format!(
                        "Auto Scaling: launch action of {} ended {} by {:?}",
                        node.instance_id,
                        c.result.as_str(),
                        c.by
                    ),
                );
                checks.push((
                    c.result.as_str() == step.expect_result && c.by == CompletedBy::Call,
                    format!(
                        "launch hook completed {} by the function",
                        step.expect_result
                    ),
                ));
                if step.node_joins {
                    checks.push((
                        node_ready,
                        format!("node {} was Ready when the hook completed", node.name),
                    ));
                }
            }
            None => checks.push((
                false,
                format!("launch hook of {} completed", node.instance_id),
            )),
        }
        if step.node_joins {
            let cordoned = self
                .server
                .store()
                .find::<Node>("", &node.name)
                .and_then(|n| n.spec)
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            checks.push((
                !cordoned,
                format!("launching node {} was not cordoned", node.name),
            ));
        }
        checks
    }

    async fn repair_node(&self, index: usize, step: &RepairNodeStep) -> Vec<(bool, String)> {
        let (Some(spec), Some(node)) = (
            self.nodegroup(&step.nodegroup),
            self.nodes
                .get(&step.nodegroup)
                .and_then(|nodes| nodes.get(step.node)),
        ) else {
            return vec![(
                false,
                format!("node {} of {} exists", step.node, step.nodegroup),
            )];
        };
        self.timeline.record(
            Source::Step,
            format!(
                "{}. the kubelet of {} ({}) dies: Ready=Unknown for {} minutes",
                index + 1,
                node.name,
                node.instance_id,
                step.not_ready_minutes
            ),
        );
        let since = jiff::Timestamp::now()
            - Duration::from_secs_f64((step.not_ready_minutes * 60.0).max(0.0));
        // The sandbox labels its nodes like a managed node group's, which node repair leaves
        // to EKS; this story is about a self-managed group, whose nodes carry no such label.
        let stopped = self.server.store().modify::<Node>("", &node.name, |n| {
            if let Some(labels) = n.metadata.labels.as_mut() {
                labels.remove("eks.amazonaws.com/nodegroup");
            }
            let conditions = n
                .status
                .get_or_insert_default()
                .conditions
                .get_or_insert_default();
            conditions.retain(|c| c.type_ != "Ready");
            conditions.push(k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: "Unknown".into(),
                reason: Some("NodeStatusUnknown".into()),
                message: Some("Kubelet stopped posting node status.".into()),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    since,
                )),
                last_heartbeat_time: None,
            });
        });
        if let Err(error) = stopped {
            return vec![(false, format!("node {} went NotReady: {error}", node.name))];
        }
        let Some(runtime) = self.functions.get("node-repair") else {
            return vec![(false, "node-repair runs in the sandbox".to_owned())];
        };
        let schedule =
            json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}});
        let answer = invoke(
            &self.timeline,
            "node-repair",
            runtime,
            &schedule,
            self.function_timeout(),
            "EventBridge schedule",
        )
        .await;
        let mut checks = Vec::new();
        let report = match answer {
            Some(InvocationOutcome::Response(value)) => value["nodes"]
                .as_array()
                .and_then(|nodes| nodes.iter().find(|n| n["node"] == node.name.as_str()))
                .cloned()
                .unwrap_or_default(),
            _ => Value::Null,
        };
        checks.push((
            report["outcome"] == "Repair" && report["acted"] == true,
            format!("node-repair replaced {} ({})", node.name, report["why"]),
        ));
        let autoscaling = self.aws.autoscaling();
        let Some(replacement) = autoscaling
            .wait_for_health_replacement(&node.instance_id, Duration::from_secs(5))
            .await
        else {
            checks.push((false, format!("Auto Scaling replaced {}", node.instance_id)));
            return checks;
        };
        self.timeline.record(
            Source::Note,
            format!(
                "Auto Scaling: {} marked Unhealthy, terminating; replacement {} launching",
                node.instance_id, replacement.replacement_instance_id
            ),
        );
        let register_after = Duration::from_secs_f64(self.scenario.timings.node_register_seconds);
        let ready_after = Duration::from_secs_f64(self.scenario.timings.node_ready_seconds);
        tokio::time::sleep(register_after).await;
        let provider_id = format!(
            "aws:///{}/{}",
            node.availability_zone, replacement.replacement_instance_id
        );
        if let Err(error) = self.server.register_node(
            &replacement.replacement_node,
            &provider_id,
            Some(ready_after),
        ) {
            checks.push((false, format!("replacement node registered: {error}")));
            return checks;
        }
        self.timeline.record(
            Source::Note,
            format!(
                "kubelet on {} registers the node (Ready in {ready_after:?})",
                replacement.replacement_node
            ),
        );
        let wait = Duration::from_secs_f64(
            self.scenario.timings.drain_timeout_seconds
                + self.scenario.timings.launch_timeout_seconds,
        ) + Duration::from_secs(15);
        let terminated = autoscaling
            .wait_for_completion(&node.instance_id, wait)
            .await;
        checks.push((
            terminated.as_ref().is_some_and(|c| {
                c.by == CompletedBy::Call && c.result == LifecycleActionResult::Continue
            }),
            format!(
                "terminate hook of {} completed CONTINUE by the function (drained)",
                node.instance_id
            ),
        ));
        let launched = autoscaling
            .wait_for_completion(&replacement.replacement_instance_id, wait)
            .await;
        checks.push((
            launched.as_ref().is_some_and(|c| {
                c.by == CompletedBy::Call && c.result == LifecycleActionResult::Continue
            }),
            format!(
                "launch hook of replacement {} completed CONTINUE once its node was Ready",
                replacement.replacement_instance_id
            ),
        ));
        let started = self
            .server
            .store()
            .list::<k8s_openapi::api::events::v1::Event>()
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("NodeRepairStarted")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                        == Some(node.name.as_str())
            });
        checks.push((started, format!("Event NodeRepairStarted on {}", node.name)));
        let _ = spec;
        checks
    }

    async fn scale_in(&self, index: usize, step: &ScaleInStep) -> Vec<(bool, String)> {
        let (Some(spec), Some(node)) = (
            self.nodegroup(&step.nodegroup),
            self.nodes
                .get(&step.nodegroup)
                .and_then(|nodes| nodes.get(step.node)),
        ) else {
            return vec![(
                false,
                format!("node {} of {} exists", step.node, step.nodegroup),
            )];
        };
        let store = self.server.store();
        let before: Vec<String> = pods_on(&store.list::<Pod>(), &node.name)
            .map(pod_key)
            .collect();
        self.timeline.record(
            Source::Step,
            format!(
                "{}. scale-in of {}: instance {} (node {}) terminates; pods on it: {}",
                index + 1,
                spec.auto_scaling_group,
                node.instance_id,
                node.name,
                before.join(", ")
            ),
        );
        if let Err(error) = self
            .aws
            .autoscaling()
            .terminate_instance(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(
                false,
                format!("terminate lifecycle action started: {error}"),
            )];
        }
        let timings = &self.scenario.timings;
        let wait =
            Duration::from_secs_f64(timings.drain_timeout_seconds + timings.settle_seconds + 30.0);
        let completion = self
            .aws
            .autoscaling()
            .wait_for_completion(&node.instance_id, wait)
            .await;
        let mut checks = Vec::new();
        let Some(completion) = completion else {
            return vec![(
                false,
                format!("terminate hook of {} completed", node.instance_id),
            )];
        };
        self.timeline.record(
            Source::Note,
            format!(
                "Auto Scaling: terminate action of {} ended {} by {:?} after {:.1}s",
                node.instance_id,
                completion.result.as_str(),
                completion.by,
                completion.after.as_secs_f64()
            ),
        );
        checks.push((
            completion.result.as_str() == step.expect_result && completion.by == CompletedBy::Call,
            format!(
                "terminate hook completed {} by the function",
                step.expect_result
            ),
        ));
        let completions = self
            .aws
            .autoscaling()
            .completions()
            .into_iter()
            .filter(|c| c.instance_id == node.instance_id)
            .count();
        checks.push((
            completions == 1,
            format!("exactly one completion for {}", node.instance_id),
        ));
        let node_object = store.find::<Node>("", &node.name);
        let labelled = node_object
            .as_ref()
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(EXCLUDE_FROM_LB))
            .is_some_and(|v| v == "true");
        checks.push((labelled, format!("node labelled {EXCLUDE_FROM_LB}=true")));
        let cordoned = node_object
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        checks.push((cordoned, "node cordoned".to_owned()));
        let pods = store.list::<Pod>();
        let remaining: Vec<String> = pods_on(&pods, &node.name)
            .filter(|p| !is_daemon_set_pod(p))
            .map(pod_key)
            .collect();
        let daemons = pods_on(&pods, &node.name)
            .filter(|p| is_daemon_set_pod(p))
            .count();
        if step.expect_drained {
            checks.push((
                remaining.is_empty(),
                format!(
                    "node drained of every non-DaemonSet pod{}",
                    listing(&remaining)
                ),
            ));
        } else {
            checks.push((
                !remaining.is_empty(),
                format!(
                    "pods the PDB protects stayed on the node{}",
                    listing(&remaining)
                ),
            ));
        }
        let daemon_sets = self
            .scenario
            .workloads
            .iter()
            .filter(|w| w.kind == "DaemonSet")
            .count();
        checks.push((
            daemons == daemon_sets,
            format!("DaemonSet pods left in place ({daemons} of {daemon_sets})"),
        ));
        let evictions = self.server.audit().subresource_requests("pods", "eviction");
        let refused = evictions.iter().filter(|e| e.code() == 429).count();
        self.timeline.record(
            Source::Note,
            format!(
                "{} eviction requests, {refused} refused by a PodDisruptionBudget (429) and retried",
                evictions.len()
            ),
        );
        // The function writes its Events after it completes the action (it flushes them
        // before the invocation ends): give the expected ones that long to land.
        let _ = self
            .server
            .wait_for("the expected node Events", Duration::from_secs(5), |_| {
                let reasons = self.node_events(&node.name);
                step.expect_node_events
                    .iter()
                    .all(|expected| reasons.contains(expected))
            })
            .await;
        let reasons = self.node_events(&node.name);
        for expected in &step.expect_node_events {
            checks.push((
                reasons.contains(expected),
                format!("Event {expected} recorded on the node"),
            ));
        }
        checks
    }

    /// Waits for a lifecycle action of `instance_id` to end after the `seen` ones already
    /// recorded for it.
    async fn next_completion(
        &self,
        instance_id: &str,
        seen: usize,
        timeout: Duration,
    ) -> Option<LifecycleCompletion> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let completions: Vec<LifecycleCompletion> = self
                .aws
                .autoscaling()
                .completions()
                .into_iter()
                .filter(|c| c.instance_id == instance_id)
                .collect();
            if completions.len() > seen {
                return completions.last().cloned();
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn completions_of(&self, instance_id: &str) -> usize {
        self.aws
            .autoscaling()
            .completions()
            .iter()
            .filter(|c| c.instance_id == instance_id)
            .count()
    }

    fn node_events(&self, node: &str) -> Vec<String> {
        self.server
            .store()
            .list::<Event>()
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
            .filter_map(|e| e.reason)
            .collect()
    }

    async fn launch_into_warm_pool(
        &self,
        index: usize,
        step: &WarmPoolStep,
    ) -> Vec<(bool, String)> {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let group_index = self
            .scenario
            .nodegroups
            .iter()
            .position(|n| n.name == spec.name)
            .unwrap_or_default();
        let node = self.new_node(
            group_index,
            self.next_instance.fetch_add(1, Ordering::Relaxed),
        );
        self.timeline.record(
            Source::Step,
            format!(
                "{}. instance {} launches into the warm pool of {}",
                index + 1,
                node.instance_id,
                spec.auto_scaling_group
            ),
        );
        if let Err(error) = self.add_instance(spec, &node) {
            return vec![(false, error.to_string())];
        }
        if let Err(error) = self
            .aws
            .autoscaling()
            .launch_into_warm_pool(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(false, format!("launch into the warm pool started: {error}"))];
        }
        let timeout = Duration::from_secs_f64(self.scenario.timings.launch_timeout_seconds);
        let Some(completion) = self
            .next_completion(&node.instance_id, 0, timeout + Duration::from_secs(15))
            .await
        else {
            return vec![(
                false,
                format!("launch hook of {} completed", node.instance_id),
            )];
        };
        let pooled_state = warm_pool_state(spec).map(WarmPoolState::lifecycle_state);
        let state = self
            .aws
            .autoscaling()
            .instance_state(&spec.auto_scaling_group, &node.instance_id);
        let checks = vec![
            (
                completion.result == LifecycleActionResult::Continue
                    && completion.by == CompletedBy::Call,
                "launch into the warm pool completed CONTINUE by the function".to_owned(),
            ),
            (
                completion.after < timeout / 2,
                format!(
                    "without waiting for a node ({:.1}s, launch timeout {:.0}s)",
                    completion.after.as_secs_f64(),
                    timeout.as_secs_f64()
                ),
            ),
            (
                state.as_deref() == pooled_state,
                format!(
                    "instance waits in the pool ({})",
                    state.as_deref().unwrap_or("not in the group")
                ),
            ),
        ];
        self.warm_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(node);
        checks
    }

    async fn scale_out_from_warm_pool(
        &self,
        index: usize,
        step: &WarmPoolStep,
    ) -> Vec<(bool, String)> {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let pooled = {
            let mut pool = self.warm_pool.lock().unwrap_or_else(|e| e.into_inner());
            (!pool.is_empty()).then(|| pool.remove(0))
        };
        let Some(node) = pooled else {
            return vec![(false, "an instance waits in the warm pool".to_owned())];
        };
        let returning = self.server.store().find::<Node>("", &node.name).is_some();
        self.timeline.record(
            Source::Step,
            format!(
                "{}. scale-out of {} from the warm pool: instance {} starts; its kubelet {} node {}",
                index + 1,
                spec.auto_scaling_group,
                node.instance_id,
                if returning { "re-registers" } else { "registers" },
                node.name
            ),
        );
        let seen = self.completions_of(&node.instance_id);
        if let Err(error) = self
            .aws
            .autoscaling()
            .launch_from_warm_pool(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(false, format!("launch from the warm pool started: {error}"))];
        }
        let timings = &self.scenario.timings;
        tokio::time::sleep(Duration::from_secs_f64(timings.node_register_seconds)).await;
        if let Err(error) = self.server.restart_node(
            &node.name,
            &node.provider_id(),
            Some(Duration::from_secs_f64(timings.node_ready_seconds)),
        ) {
            return vec![(false, format!("node registered: {error}"))];
        }
        let wait =
            Duration::from_secs_f64(timings.launch_timeout_seconds) + Duration::from_secs(15);
        let completion = self.next_completion(&node.instance_id, seen, wait).await;
        let node_object = self.server.store().find::<Node>("", &node.name);
        let mut checks = Vec::new();
        match completion {
            Some(c) => checks.push((
                c.result == LifecycleActionResult::Continue && c.by == CompletedBy::Call,
                "launch from the warm pool completed CONTINUE by the function".to_owned(),
            )),
            None => {
                return vec![(
                    false,
                    format!("launch hook of {} completed", node.instance_id),
                )];
            }
        }
        checks.push((
            node_object.as_ref().is_some_and(node_ready),
            format!("node {} was Ready when the hook completed", node.name),
        ));
        let spec_of = node_object.as_ref().and_then(|n| n.spec.clone());
        checks.push((
            !spec_of
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            format!("node {} is not cordoned", node.name),
        ));
        let taints: Vec<String> = spec_of
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        checks.push((
            taints.is_empty(),
            format!("node {} carries no taint{}", node.name, listing(&taints)),
        ));
        let metadata = node_object.map(|n| n.metadata).unwrap_or_default();
        checks.push((
            !metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LB)),
            format!("node {} is not excluded from load balancers", node.name),
        ));
        checks.push((
            !metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DRAIN_CHECKPOINT)),
            format!("node {} carries no drain checkpoint", node.name),
        ));
        checks.push(self.serves_a_new_pod(&node).await);
        let events = self.node_events(&node.name);
        for expected in &step.expect_node_events {
            checks.push((
                events.contains(expected),
                format!("Event {expected} recorded on the node"),
            ));
        }
        self.from_warm_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(node);
        checks
    }

    /// Creates a pod nobody placed and checks the scheduler runs it on `node` (the least
    /// loaded node: a node back from the pool has nothing on it).
    async fn serves_a_new_pod(&self, node: &SimulatedNode) -> (bool, String) {
        let name = format!("probe-{}", self.probes.fetch_add(1, Ordering::Relaxed));
        let created = self.server.store().apply_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "probe"}},
            "spec": {"containers": [{"name": "probe", "image": "public.ecr.aws/docker/library/busybox:stable"}]},
        }));
        if let Err(error) = created {
            return (false, format!("probe pod {name} created: {error}"));
        }
        let mut placed = None;
        for _ in 0..200 {
            let pod = self.server.store().find::<Pod>("default", &name);
            if let Some(pod) = pod.filter(pod_ready) {
                placed = pod.spec.and_then(|s| s.node_name);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.timeline.record(
            Source::Note,
            format!(
                "pod default/{name} scheduled on {}",
                placed.as_deref().unwrap_or("no node")
            ),
        );
        (
            placed.as_deref() == Some(node.name.as_str()),
            format!("node {} serves a new pod ({name})", node.name),
        )
    }

    async fn scale_in_to_warm_pool(
        &self,
        index: usize,
        step: &WarmPoolStep,
    ) -> Vec<(bool, String)> {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let last = self
            .from_warm_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        let Some(node) = last else {
            return vec![(
                false,
                "an instance that came out of the warm pool is in service".to_owned(),
            )];
        };
        let store = self.server.store();
        let before: Vec<String> = pods_on(&store.list::<Pod>(), &node.name)
            .map(pod_key)
            .collect();
        self.timeline.record(
            Source::Step,
            format!(
                "{}. scale-in of {} with reuse: instance {} (node {}) goes back to the warm pool; pods on it: {}",
                index + 1,
                spec.auto_scaling_group,
                node.instance_id,
                node.name,
                before.join(", ")
            ),
        );
        let seen = self.completions_of(&node.instance_id);
        if let Err(error) = self
            .aws
            .autoscaling()
            .scale_in_to_warm_pool(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(false, format!("scale-in with reuse started: {error}"))];
        }
        let timings = &self.scenario.timings;
        let wait =
            Duration::from_secs_f64(timings.drain_timeout_seconds + timings.settle_seconds + 30.0);
        let Some(completion) = self.next_completion(&node.instance_id, seen, wait).await else {
            return vec![(
                false,
                format!("terminate hook of {} completed", node.instance_id),
            )];
        };
        let mut checks = vec![(
            completion.result == LifecycleActionResult::Continue
                && completion.by == CompletedBy::Call,
            "terminate hook completed CONTINUE by the function".to_owned(),
        )];
        let remaining: Vec<String> = pods_on(&store.list::<Pod>(), &node.name)
            .filter(|p| !is_daemon_set_pod(p))
            .map(pod_key)
            .collect();
        checks.push((
            remaining.is_empty(),
            format!(
                "node drained of every non-DaemonSet pod{}",
                listing(&remaining)
            ),
        ));
        let state = self
            .aws
            .autoscaling()
            .instance_state(&spec.auto_scaling_group, &node.instance_id);
        checks.push((
            state.as_deref() == warm_pool_state(spec).map(WarmPoolState::lifecycle_state),
            format!(
                "instance back in the warm pool ({})",
                state.as_deref().unwrap_or("not in the group")
            ),
        ));
        // The drain records the trip to the pool right after it completes the action (one
        // conditional write, retried on a conflict with the instance's stop): give it the
        // same few seconds as the Events.
        let went_to_pool = || {
            store
                .find::<Node>("", &node.name)
                .as_ref()
                .and_then(|n| n.metadata.annotations.as_ref())
                .and_then(|a| a.get(DRAIN_CHECKPOINT))
                .is_some_and(|record| record.contains("toWarmPoolAt"))
        };
        let _ = self
            .server
            .wait_for("the warm-pool record", Duration::from_secs(5), |_| {
                went_to_pool()
            })
            .await;
        let node_object = store.find::<Node>("", &node.name);
        checks.push((
            went_to_pool(),
            "node records that it went to the warm pool".to_owned(),
        ));
        checks.push((
            node_object
                .as_ref()
                .and_then(|n| n.spec.as_ref())
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            "node cordoned while pooled".to_owned(),
        ));
        let events = self.node_events(&node.name);
        for expected in &step.expect_node_events {
            checks.push((
                events.contains(expected),
                format!("Event {expected} recorded on the node"),
            ));
        }
        if warm_pool_state(spec) != Some(WarmPoolState::Running) {
            if let Err(error) = self.server.stop_node(&node.name) {
                checks.push((false, format!("node {} stopped: {error}", node.name)));
            }
            self.timeline.record(
                Source::Note,
                format!(
                    "instance {} stopped in the pool: node {} NotReady, tainted node.cloudprovider.kubernetes.io/shutdown; the Node object stays",
                    node.instance_id, node.name
                ),
            );
        }
        self.warm_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(node);
        checks
    }

    /// Prints the final `aws-auth`, nodes and pods, like `kubectl get ... -o wide`.
    pub fn print_final_state(&self) {
        let store = self.server.store();
        println!("\n--- kube-system/aws-auth (mapRoles) ---");
        match store.find::<ConfigMap>("kube-system", "aws-auth") {
            Some(cm) => println!(
                "{}",
                cm.data
                    .as_ref()
                    .and_then(|d| d.get("mapRoles"))
                    .map(String::as_str)
                    .unwrap_or("(no mapRoles)")
            ),
            None => println!("(no aws-auth ConfigMap)"),
        }
        if self.uses_access_entries() {
            println!("--- access entries ---");
            for entry in self.aws.eks().access_entries(&self.scenario.cluster) {
                println!("{entry:?}");
            }
        }
        println!("\n--- nodes ---");
        println!("{:<45} {:<28} LABELS", "NAME", "STATUS");
        for node in store.list::<Node>() {
            let mut status = if node_ready(&node) {
                "Ready"
            } else {
                "NotReady"
            }
            .to_owned();
            if node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
            {
                status.push_str(",SchedulingDisabled");
            }
            let excluded = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(EXCLUDE_FROM_LB))
                .map(|v| format!("{EXCLUDE_FROM_LB}={v}"))
                .unwrap_or_default();
            println!(
                "{:<45} {:<28} {excluded}",
                node.metadata.name.unwrap_or_default(),
                status
            );
        }
        println!("\n--- pods ---");
        println!(
            "{:<12} {:<34} {:<6} {:<12} NODE",
            "NAMESPACE", "NAME", "READY", "STATUS"
        );
        let mut pods = store.list::<Pod>();
        pods.sort_by_key(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()));
        for pod in pods {
            let status = if pod.metadata.deletion_timestamp.is_some() {
                "Terminating".to_owned()
            } else {
                pod.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default()
            };
            println!(
                "{:<12} {:<34} {:<6} {:<12} {}",
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
                if pod_ready(&pod) { "1/1" } else { "0/1" },
                status,
                pod.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default()
            );
        }
    }

    /// What a user needs to point kubectl or `cargo lambda invoke` at the running fakes.
    pub fn describe_for_serving(&self, kubeconfig: &Path) -> String {
        let mut text = format!(
            "The sandbox keeps running (Ctrl-C stops it).\n\nkubectl:\n  export KUBECONFIG={}\n  kubectl get nodes,pods -A -o wide\n\nAWS (for a function run by hand, e.g. with its binary or cargo lambda):\n",
            kubeconfig.display()
        );
        text.push_str(&format!(
            "  export AWS_ENDPOINT_URL={}\n",
            self.aws.endpoint_url()
        ));
        text.push_str(&format!("  export AWS_REGION={}\n", self.scenario.region));
        text.push_str(&format!(
            "  export CLUSTER_NAME={}\n",
            self.scenario.cluster
        ));
        text.push_str(&format!(
            "  export CONTINUATION_TOPIC_ARN={}\n",
            self.topic_arn()
        ));
        text.push_str("  (credentials: the fake account accepts only keys it issued; see the function environments below)\n");
        for (name, function) in &self.functions {
            text.push_str(&format!(
                "  {name}: Lambda Runtime API at {}\n",
                function.runtime_api()
            ));
        }
        text
    }

    /// A kubeconfig whose user signs EKS tokens with the `eks-token` exec plugin, as an
    /// administrator mapped in `aws-auth` (or an access entry), written to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), SandboxError> {
        let admin = self.account.add_role_credentials("sandbox-admin");
        if self.uses_config_map() {
            let _ = self
                .server
                .store()
                .modify::<ConfigMap>("kube-system", "aws-auth", |cm| {
                    let data = cm.data.get_or_insert_with(Default::default);
                    let roles = data.entry("mapRoles".to_owned()).or_default();
                    roles.push_str(&format!(
                    "- rolearn: {}\n  username: sandbox-admin\n  groups:\n    - system:masters\n",
                    admin.principal_arn
                ));
                });
        }
        if self.uses_access_entries() {
            let _ = self.aws.eks().add_access_entry(
                &self.scenario.cluster,
                &admin.principal_arn,
                "STANDARD",
                Some("sandbox-admin"),
                &["system:masters"],
            );
        }
        let eks_token =
            binaries::try_function_binary("eks-token").map_err(setup("eks-token binary"))?;
        let mut user = format!(
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: {}\n      args: [\"--cluster-name\", \"{}\", \"--region\", \"{}\"]\n      interactiveMode: Never\n      env:\n",
            eks_token.display(),
            self.scenario.cluster,
            self.scenario.region
        );
        for (key, value) in self.aws.environment(&admin) {
            user.push_str(&format!(
                "      - name: {key}\n        value: \"{value}\"\n"
            ));
        }
        std::fs::write(path, self.server.kubeconfig_yaml_with_user(&user))
            .map_err(setup("kubeconfig"))
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

/// Invokes `function` with `event` and records the invocation and its outcome.
async fn invoke(
    timeline: &Timeline,
    function: &str,
    runtime: &LambdaRuntimeApi,
    event: &Value,
    timeout: Duration,
    summary: &str,
) -> Option<InvocationOutcome> {
    timeline.record(Source::Lambda, format!("{function} ← {summary}"));
    match runtime.invoke(event, timeout).await {
        Ok(outcome) => {
            let text = match &outcome {
                InvocationOutcome::Response(value) => {
                    format!("{function} → {}", shorten(&value.to_string(), 240))
                }
                InvocationOutcome::Error {
                    error_type,
                    error_message,
                } => {
                    format!(
                        "{function} → ERROR {error_type}: {}",
                        shorten(error_message, 240)
                    )
                }
                InvocationOutcome::Timeout => format!("{function} → timed out after {timeout:?}"),
            };
            timeline.record(Source::Lambda, text);
            Some(outcome)
        }
        Err(error) => {
            timeline.record(
                Source::Lambda,
                format!("{function} could not be invoked: {error}"),
            );
            None
        }
    }
}

/// The pool state of `spec`'s warm pool (validated when the scenario was read).
fn warm_pool_state(spec: &NodegroupSpec) -> Option<WarmPoolState> {
    match spec.warm_pool.as_deref()? {
        "Running" => Some(WarmPoolState::Running),
        "Hibernated" => Some(WarmPoolState::Hibernated),
        _ => Some(WarmPoolState::Stopped),
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// `SNS LAUNCHING i-...` from a Lambda SNS event.
fn summarize_sns(event: &Value) -> String {
    let message = event["Records"][0]["Sns"]["Message"]
        .as_str()
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .unwrap_or_default();
    let transition = message["LifecycleTransition"]
        .as_str()
        .and_then(|t| t.rsplit('_').next())
        .unwrap_or("?");
    let continuation = if message.get("NodeManagerContinuation").is_some() {
        " (hand-over)"
    } else {
        ""
    };
    format!(
        "SNS {transition} {}{continuation}",
        message["EC2InstanceId"].as_str().unwrap_or("?")
    )
}

/// The EventBridge "AWS API Call via CloudTrail" event EKS emits for a node group call.
fn cloudtrail_event(
    scenario: &Scenario,
    spec: &NodegroupSpec,
    role_arn: &str,
    event_name: &str,
) -> Value {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    json!({
        "version": "0",
        "id": format!("sandbox-{event_name}-{}", spec.name),
        "detail-type": "AWS API Call via CloudTrail",
        "source": "aws.eks",
        "account": scenario.account_id,
        "time": now,
        "region": scenario.region,
        "resources": [],
        "detail": {
            "eventVersion": "1.08",
            "userIdentity": { "type": "IAMUser", "arn": format!("arn:aws:iam::{}:user/cli", scenario.account_id), "accountId": scenario.account_id },
            "eventTime": now,
            "eventSource": "eks.amazonaws.com",
            "eventName": event_name,
            "awsRegion": scenario.region,
            "requestParameters": { "name": scenario.cluster, "nodegroupName": spec.name },
            "responseElements": {
                "nodegroup": {
                    "nodegroupName": spec.name,
                    "clusterName": scenario.cluster,
                    "nodeRole": role_arn,
                    "amiType": spec.ami_type,
                    "status": if event_name == "CreateNodegroup" { "CREATING" } else { "DELETING" },
                }
            },
            "requestID": format!("sandbox-{}", spec.name),
            "eventID": format!("sandbox-{event_name}"),
            "readOnly": false,
            "eventType": "AwsApiCall",
            "managementEvent": true,
            "recipientAccountId": scenario.account_id,
        },
    })
}

fn owner_reference(owner: &Value, kind: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

fn running_status() -> Value {
    let now = jiff::Timestamp::now().to_string();
    let condition =
        |kind: &str| json!({ "type": kind, "status": "True", "lastTransitionTime": now });
    json!({
        "phase": "Running",
        "conditions": [condition("Initialized"), condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
        "startTime": now,
    })
}

/// A stable, pod-name-like suffix for replica `index` of `workload`.
fn pod_suffix(workload: &str, index: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let seed = workload.bytes().fold(index.wrapping_mul(31), |acc, b| {
        acc.wrapping_mul(131).wrapping_add(b as usize)
    });
    (0..5)
        .map(|i| ALPHABET[(seed >> (i * 5)) % ALPHABET.len()] as char)
        .collect()
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pods_on<'a>(pods: &'a [Pod], node: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
    pods.iter()
        .filter(move |p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
}

fn is_daemon_set_pod(pod: &Pod) -> bool {
    pod.metadata.owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.kind == "DaemonSet" && r.controller == Some(true))
    })
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn listing(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" (on it: {})", items.join(", "))
    }
}
