//! The end-to-end world: the function binaries as built, run under the local Lambda Runtime
//! API as Lambda runs them, against the fake AWS endpoints (real SDK calls, SigV4) and the fake
//! API server (EKS tokens, the shipped `infra/rbac.yaml`), deployed the way the operator's
//! guide deploys them (one IAM role per function, granted the functions' Kubernetes group).
//!
//! Every suite that tests the real processes builds its world here, so they all exercise the
//! same deployment and a change to how the functions are deployed is made once:
//!
//! ```no_run
//! # async fn example() {
//! use node_manager_testkit::e2e::{FunctionWorld, Target};
//! let world = FunctionWorld::builder()
//!     .functions(&[Target::TerminatingHook])
//!     .env("NODE_TAINT", "node-manager/draining=true:NoSchedule")
//!     .start()
//!     .await;
//! let terminating = world.function(Target::TerminatingHook);
//! let answer = terminating
//!     .response_to(&node_manager_testkit::soak::corpus::fixture("sns-test-notification.json"))
//!     .await;
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use node_manager::aws::LifecycleActionResult;
use serde_json::Value;

pub use crate::soak::corpus::Target;

use crate::account::{FakeAccount, FakeCredentials};
use crate::aws::{
    FakeAutoScalingGroup, FakeAws, FakeCluster, FakeInstance, FakeLifecycleHook, FakeNodegroup,
    SnsSubscription,
};
use crate::binaries::function_binary;
use crate::kube::{FakeApiServer, SimulationTimings};
use crate::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};
use crate::soak::corpus;

/// The cluster of the event fixtures (`tests/fixtures/`).
pub const CLUSTER: &str = "ironman-2022";
/// The Auto Scaling group of node group `demo-ng`, as in the fixtures.
pub const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
/// The node role of node group `demo-ng`, as in the CreateNodegroup fixture.
pub const NODE_ROLE: &str = "arn:aws:iam::111111111111:role/eksctl-ironman-2022-nodegroup-demo-ng-NodeInstanceRole-454Q2XHJ5LZ0";
/// The default seeded instance: the one of the terminating fixture.
pub const INSTANCE: &str = "i-07e9ea9eb19a67337";
/// The default seeded instance's node.
pub const NODE: &str = "ip-192-168-12-34.eu-west-1.compute.internal";
/// The Kubernetes group a function's role is mapped to (`infra/rbac.yaml`: one per function,
/// e.g. `open-node-manager:terminating-hook`).
pub fn function_group(function: &str) -> String {
    format!("open-node-manager:{function}")
}
const ZONE: &str = "eu-west-1a";

/// A fake cluster that does nothing by itself (no kubelets, schedulers or controllers) with
/// the shipped RBAC, registered in the fake EKS: for the tests and benchmarks that seed every
/// object themselves and run one function against it.
pub struct StaticCluster {
    pub account: FakeAccount,
    pub aws: FakeAws,
    pub server: FakeApiServer,
    pub cluster: String,
}

impl StaticCluster {
    /// `authentication_mode` `None` keeps the fake EKS's default (`API_AND_CONFIG_MAP`).
    pub async fn start(cluster: &str, authentication_mode: Option<&str>) -> Result<Self, String> {
        let account = FakeAccount::reference();
        let aws = FakeAws::start(account.clone())
            .await
            .map_err(|e| e.to_string())?;
        let server = FakeApiServer::builder()
            .cluster_name(cluster)
            .account(account.clone())
            .access_entries(Arc::new(aws.eks()))
            .simulation(SimulationTimings {
                enabled: false,
                ..SimulationTimings::default()
            })
            .start()
            .await
            .map_err(|e| e.to_string())?;
        server
            .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
            .map_err(|e| e.to_string())?;
        let mut registered = FakeCluster::new(cluster, server.url(), &server.ca_data());
        if let Some(mode) = authentication_mode {
            registered = registered.authentication_mode(Some(mode));
        }
        aws.eks().add_cluster(registered);
        Ok(Self {
            account,
            aws,
            server,
            cluster: cluster.to_owned(),
        })
    }

    /// Runs the built `function` with its own role's credentials, mapped by an access entry
    /// to its group of the shipped RBAC, with `CLUSTER_NAME` and `RUST_LOG=log_level`.
    pub async fn start_function(
        &self,
        function: &str,
        log_level: &str,
    ) -> Result<LambdaRuntimeApi, String> {
        let credentials = self
            .account
            .add_role_credentials(&format!("open-node-manager-{function}"));
        self.aws
            .eks()
            .add_access_entry(
                &self.cluster,
                &credentials.principal_arn,
                "STANDARD",
                Some(function),
                &[function_group(function).as_str()],
            )
            .map_err(|e| e.to_string())?;
        LambdaRuntimeApi::start_function(
            FunctionSpec::new(function, function_binary(function))
                .envs(self.aws.environment(&credentials))
                .env("CLUSTER_NAME", &self.cluster)
                .env("RUST_LOG", log_level),
        )
        .await
        .map_err(|e| e.to_string())
    }
}

/// One function process and the IAM role credentials it runs with.
pub struct RunningFunction {
    pub target: Target,
    pub runtime: LambdaRuntimeApi,
    pub credentials: FakeCredentials,
}

impl RunningFunction {
    /// How long [`RunningFunction::response_to`] waits: well above any scaled-down drain.
    pub const INVOKE_TIMEOUT: Duration = Duration::from_secs(30);

    /// Invokes the function with `event` and returns its response. Panics with the process's
    /// output when the invocation ends in an error or a timeout, so the failing test shows
    /// what the function logged.
    pub async fn response_to(&self, event: &Value) -> Value {
        match self.runtime.invoke(event, Self::INVOKE_TIMEOUT).await {
            Ok(InvocationOutcome::Response(value)) => value,
            other => panic!(
                "{}: expected a response, got {other:?}\n--- function output ---\n{}",
                self.target.function_name(),
                self.runtime.output()
            ),
        }
    }

    /// Invokes the function with `event`, which it must refuse: its error's type and message.
    /// Panics with the process's output on a response or a timeout.
    pub async fn error_from(&self, event: &Value) -> (String, String) {
        match self.runtime.invoke(event, Self::INVOKE_TIMEOUT).await {
            Ok(InvocationOutcome::Error {
                error_type,
                error_message,
            }) => (error_type, error_message),
            other => panic!(
                "{}: expected an error, got {other:?}\n--- function output ---\n{}",
                self.target.function_name(),
                self.runtime.output()
            ),
        }
    }
}

/// The fakes and the function processes (in the order they were asked for).
pub struct FunctionWorld {
    pub aws: FakeAws,
    pub server: FakeApiServer,
    /// The SNS topic both lifecycle hooks notify (and the functions hand over through).
    pub topic: String,
    /// The seeded instance (in [`GROUP`] unless pending).
    pub instance: String,
    /// Its node's name (for a pending instance: the name it will register with).
    pub node: String,
    pub functions: Vec<RunningFunction>,
}

impl FunctionWorld {
    pub fn builder() -> FunctionWorldBuilder {
        FunctionWorldBuilder::default()
    }

    /// The process of `target`. Panics when the world was built without it (a test bug).
    pub fn function(&self, target: Target) -> &RunningFunction {
        self.functions
            .iter()
            .find(|f| f.target == target)
            .unwrap_or_else(|| panic!("{} was not started", target.function_name()))
    }

    /// The seeded node's `spec.providerID`.
    pub fn provider_id(&self) -> String {
        format!("aws:///{ZONE}/{}", self.instance)
    }

    /// Registers [`ROOM_NODE`], Ready at once, in another zone: where the seeded node's
    /// evicted pods go (a drain's pods need a schedulable node to land on).
    pub fn add_room_node(&self) {
        self.server
            .register_node(ROOM_NODE, ROOM_NODE_PROVIDER_ID, Some(Duration::ZERO))
            .expect("the room node registers");
    }

    /// Auto Scaling starts terminating the seeded instance; returns its lifecycle
    /// notification as delivered to the topic, and the subscription that will see any
    /// republished one (a hand-over's).
    pub async fn start_termination(&self) -> (SnsSubscription, Value) {
        let mut subscription = self
            .aws
            .sns()
            .subscribe(&self.topic)
            .expect("the topic exists");
        self.aws
            .autoscaling()
            .terminate_instance(GROUP, &self.instance)
            .expect("the seeded instance terminates");
        let event = subscription
            .next_event(Duration::from_secs(5))
            .await
            .expect("the lifecycle notification within 5 s");
        (subscription, event)
    }

    /// Terminates the seeded instance and hands its notification to the terminating hook;
    /// returns the answer and how long the invocation took.
    pub async fn terminate_timed(&self) -> (Value, Duration) {
        let (_, event) = self.start_termination().await;
        let started = std::time::Instant::now();
        let answer = self
            .function(Target::TerminatingHook)
            .response_to(&event)
            .await;
        (answer, started.elapsed())
    }

    /// The notes of the Events with `reason`, oldest first.
    pub fn event_notes(&self, reason: &str) -> Vec<String> {
        self.server
            .store()
            .events_with_reason(reason)
            .into_iter()
            .filter_map(|e| e.note)
            .collect()
    }
}

/// The node [`FunctionWorld::add_room_node`] registers.
pub const ROOM_NODE: &str = "ip-10-0-9-9.eu-west-1.compute.internal";
/// Its `spec.providerID`: an instance outside every seeded group.
const ROOM_NODE_PROVIDER_ID: &str = "aws:///eu-west-1b/i-0fffeeeedddd11112";

/// How the seeded instance starts out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InstanceStage {
    /// `InService` in [`GROUP`] with a Ready node: ready to be terminated.
    InService,
    /// Running in EC2 only, not yet in the group and without a node: ready to be launched.
    Pending,
}

/// What the world holds; every option has the default the security suite runs with.
pub struct FunctionWorldBuilder {
    functions: Vec<Target>,
    env: Vec<(String, String)>,
    log_level: &'static str,
    json_logs: bool,
    simulation: SimulationTimings,
    authentication_mode: String,
    instance: FakeInstance,
    stage: InstanceStage,
}

impl Default for FunctionWorldBuilder {
    /// All three functions; `API_AND_CONFIG_MAP`; instance [`INSTANCE`] in service on node
    /// [`NODE`]; the test-scaled cluster emulation; the most verbose logging a function can be
    /// configured with (nothing it logs may hold a credential).
    fn default() -> Self {
        Self {
            functions: vec![
                Target::TerminatingHook,
                Target::LaunchingHook,
                Target::NodegroupAuth,
            ],
            env: Vec::new(),
            log_level: "trace",
            json_logs: false,
            simulation: SimulationTimings::default(),
            authentication_mode: "API_AND_CONFIG_MAP".to_owned(),
            instance: FakeInstance::new(INSTANCE, "eu-west-1")
                .private_dns_name(NODE)
                .availability_zone(ZONE),
            stage: InstanceStage::InService,
        }
    }
}

impl FunctionWorldBuilder {
    /// Starts only these functions (each still gets its own role and grant).
    pub fn functions(mut self, targets: &[Target]) -> Self {
        self.functions = targets.to_vec();
        self
    }

    /// An environment variable for every function; it overrides the world's defaults
    /// (scaled-down timeouts, see [`FunctionWorldBuilder::start`]).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The functions' log level (`RUST_LOG` and `AWS_LAMBDA_LOG_LEVEL`), e.g. `info`.
    pub fn log_level(mut self, level: &'static str) -> Self {
        self.log_level = level;
        self
    }

    /// The functions log JSON (the function's log format set to JSON).
    pub fn json_logs(mut self) -> Self {
        self.json_logs = true;
        self
    }

    pub fn simulation(mut self, timings: SimulationTimings) -> Self {
        self.simulation = timings;
        self
    }

    /// `CONFIG_MAP`, `API_AND_CONFIG_MAP` or `API`. The functions' roles are granted through
    /// access entries where the mode allows them, else through `aws-auth` `mapRoles`.
    pub fn authentication_mode(mut self, mode: &str) -> Self {
        self.authentication_mode = mode.to_owned();
        self
    }

    /// Seeds `instance_id` (name derived by EC2's rule) in service with a Ready node, in
    /// place of [`INSTANCE`].
    pub fn instance(mut self, instance_id: &str) -> Self {
        self.instance = FakeInstance::new(instance_id, "eu-west-1").availability_zone(ZONE);
        self.stage = InstanceStage::InService;
        self
    }

    /// Makes the seeded instance a Spot instance (its Spot request fulfilled).
    pub fn spot(mut self) -> Self {
        self.instance = self.instance.spot();
        self
    }

    /// Seeds `instance_id` running in EC2 but not yet in the group and without a node, for a
    /// launch (`aws.autoscaling().launch_instance`) to start.
    pub fn pending_instance(mut self, instance_id: &str) -> Self {
        self.instance = FakeInstance::new(instance_id, "eu-west-1").availability_zone(ZONE);
        self.stage = InstanceStage::Pending;
        self
    }

    /// Starts the fakes, seeds the cluster, node group, Auto Scaling group (both lifecycle
    /// hooks notifying one SNS topic) and instance, grants each function's role, and starts
    /// the function processes. Panics on a set-up failure (a test bug or a broken fake).
    pub async fn start(self) -> FunctionWorld {
        let account = FakeAccount::reference();
        let aws = FakeAws::start(account.clone())
            .await
            .expect("function world set-up");
        let server = FakeApiServer::builder()
            .cluster_name(CLUSTER)
            .account(account.clone())
            .access_entries(Arc::new(aws.eks()))
            .ec2(aws.ec2())
            .simulation(self.simulation.clone())
            .start()
            .await
            .expect("function world set-up");
        server
            .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
            .expect("function world set-up");
        aws.eks().add_cluster(
            FakeCluster::new(CLUSTER, server.url(), &server.ca_data())
                .authentication_mode(Some(&self.authentication_mode)),
        );
        aws.eks()
            .add_nodegroup(
                CLUSTER,
                FakeNodegroup::new("demo-ng", NODE_ROLE)
                    .ami_type("AL2_x86_64")
                    .auto_scaling_group(GROUP),
            )
            .expect("function world set-up");
        let topic = aws.sns().create_topic("eks-asg-lifecycle-hook-topic");
        aws.autoscaling().add_group(
            FakeAutoScalingGroup::new(GROUP)
                .tag("eks:cluster-name", CLUSTER)
                .availability_zones(&[ZONE]),
        );
        for hook in [
            FakeLifecycleHook::terminating("Terminate-LC-Hook"),
            FakeLifecycleHook::launching("Launch-LC-Hook"),
        ] {
            aws.autoscaling()
                .add_hook(
                    GROUP,
                    hook.heartbeat_timeout(Duration::from_secs(300))
                        .default_result(LifecycleActionResult::Continue)
                        .notification_target(&topic),
                )
                .expect("function world set-up");
        }
        let instance = self.instance.instance_id.clone();
        let node = self.instance.private_dns_name.clone();
        aws.ec2().add_instance(self.instance.clone());
        if self.stage == InstanceStage::InService {
            aws.autoscaling()
                .add_instance(GROUP, &instance, ZONE)
                .expect("function world set-up");
            server
                .register_node(
                    &node,
                    &format!("aws:///{ZONE}/{instance}"),
                    Some(Duration::ZERO),
                )
                .expect("function world set-up");
            server
                .wait_for("the seeded node Ready", Duration::from_secs(10), |store| {
                    store.find::<Node>("", &node).is_some_and(|n| {
                        n.status.and_then(|s| s.conditions).is_some_and(|c| {
                            c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                    })
                })
                .await
                .expect("function world set-up");
        }

        let functions = self.start_functions(&account, &aws, &server, &topic).await;
        FunctionWorld {
            aws,
            server,
            topic,
            instance,
            node,
            functions,
        }
    }

    async fn start_functions(
        &self,
        account: &FakeAccount,
        aws: &FakeAws,
        server: &FakeApiServer,
        topic: &str,
    ) -> Vec<RunningFunction> {
        // Grants first, so no process ever runs without its identity.
        let access_entries = self.authentication_mode != "CONFIG_MAP";
        let mut map_roles = String::new();
        let mut granted = Vec::new();
        for &target in &self.functions {
            let name = target.function_name();
            let credentials = account.add_role_credentials(&format!("open-node-manager-{name}"));
            if access_entries {
                aws.eks()
                    .add_access_entry(
                        CLUSTER,
                        &credentials.principal_arn,
                        "STANDARD",
                        Some(name),
                        &[function_group(name).as_str()],
                    )
                    .expect("function world set-up");
            } else {
                map_roles.push_str(&format!(
                    "- rolearn: {}\n  username: {name}\n  groups: [{}]\n",
                    credentials.principal_arn,
                    function_group(name)
                ));
            }
            granted.push((target, credentials));
        }
        if !map_roles.is_empty() {
            server
                .store()
                .apply_value(serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "aws-auth", "namespace": "kube-system"},
                    "data": {"mapRoles": map_roles},
                }))
                .expect("function world set-up");
        }

        let mut functions = Vec::new();
        for (target, credentials) in granted {
            let name = target.function_name();
            let mut spec = FunctionSpec::new(name, function_binary(name))
                .envs(aws.environment(&credentials))
                .env("CLUSTER_NAME", CLUSTER)
                .env("CONTINUATION_TOPIC_ARN", topic)
                .env("SETTLE_SECONDS", "0")
                .env("DRAIN_TIMEOUT_SECONDS", "5")
                .env("LAUNCH_TIMEOUT_SECONDS", "2")
                .env("DELETE_WAIT_SECONDS", "1")
                .env("DELETE_POLL_SECONDS", "1")
                .env("HAND_OVER_MARGIN_SECONDS", "1")
                .env("RUST_LOG", self.log_level)
                .env("AWS_LAMBDA_LOG_LEVEL", &self.log_level.to_uppercase())
                .envs(self.env.clone());
            if self.json_logs {
                spec = spec.log_format("JSON");
            }
            let runtime = LambdaRuntimeApi::start_function(spec)
                .await
                .expect("function world set-up");
            functions.push(RunningFunction {
                target,
                runtime,
                credentials,
            });
        }
        functions
    }
}
