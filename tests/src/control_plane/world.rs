//! The end-to-end world on the real control plane: the function binaries under the local
//! Lambda Runtime API, against the fake AWS endpoints, with the cluster's API server a real
//! kube-apiserver (EKS tokens through the TokenReview webhook, `infra/rbac.yaml` applied as
//! shipped, the real RBAC authorizer) and kwok playing the kubelets.
//!
//! Deployed as [`crate::e2e`] deploys on the fake API server (same cluster, node group, Auto
//! Scaling group, hooks and per-function roles), so a scenario can run on either.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use node_manager::aws::LifecycleActionResult;
use serde_json::{Value, json};

use super::kubelet::FakeKubelets;
use super::webhook::WebhookSettings;
use super::{ControlPlaneError, RealControlPlane};
use crate::account::{FakeAccount, FakeCredentials};
use crate::aws::{
    FakeAutoScalingGroup, FakeAws, FakeCluster, FakeInstance, FakeLifecycleHook, FakeNodegroup,
};
use crate::binaries::function_binary;
use crate::e2e::{CLUSTER, GROUP, NODE_ROLE, RunningFunction, Target, function_group};
use crate::lambda_api::{FunctionSpec, InvocationOutcome, LambdaApiError, LambdaRuntimeApi};
use crate::soak::corpus;

const ZONE: &str = "eu-west-1a";

/// The fakes, the real plane, its kubelets and the function processes.
pub struct RealFunctionWorld {
    pub aws: FakeAws,
    pub plane: RealControlPlane,
    pub kubelets: FakeKubelets,
    /// The SNS topic both lifecycle hooks notify.
    pub topic: String,
    /// The seeded instance, in service in [`GROUP`].
    pub instance: String,
    /// Its node.
    pub node: String,
    pub functions: Vec<RunningFunction>,
    /// Functions the test kit has no [`Target`] for (e.g. `instance-refresh`), by name.
    pub named: Vec<(String, LambdaRuntimeApi)>,
}

impl RealFunctionWorld {
    pub fn builder() -> RealWorldBuilder {
        RealWorldBuilder {
            functions: vec![Target::TerminatingHook],
            named: Vec::new(),
            env: Vec::new(),
            log_level: "info",
            instance_id: "i-0b1c2d3e4f5061728".to_owned(),
            authentication_mode: "API_AND_CONFIG_MAP",
            processes: 1,
            apiserver_flags: Vec::new(),
            spot: false,
        }
    }

    /// Every process of `target` (see [`RealWorldBuilder::processes`]).
    pub fn processes_of(&self, target: Target) -> Vec<&RunningFunction> {
        self.functions
            .iter()
            .filter(|f| f.target == target)
            .collect()
    }

    /// Another instance `instance_id` in service in [`GROUP`] in `zone`, with its Ready node
    /// (cordoned when `unschedulable`); returns the node's name.
    pub async fn add_instance(
        &self,
        instance_id: &str,
        zone: &str,
        unschedulable: bool,
    ) -> Result<String, ControlPlaneError> {
        let instance = FakeInstance::new(instance_id, "eu-west-1").availability_zone(zone);
        add_instance(&self.aws, &self.kubelets, instance, unschedulable).await
    }

    /// [`Self::add_instance`] for an instance described in full (e.g. a fleet's, whose names
    /// must not collide as names derived from ids can).
    pub async fn add_described_instance(
        &self,
        instance: FakeInstance,
    ) -> Result<String, ControlPlaneError> {
        add_instance(&self.aws, &self.kubelets, instance, false).await
    }

    /// Scales `instance` in and hands its terminating notification to the terminating hook,
    /// waiting at most `bound`: how long the invocation took (notification to response). `Err`
    /// unless the hook answered with a drain that emptied the node (completed `CONTINUE`
    /// after `Drained`, not at its deadline), with the hook's output.
    pub async fn scale_in_and_drain(
        &self,
        instance: &str,
        bound: Duration,
    ) -> Result<Duration, String> {
        let (took, answers) = self.scale_in_at_once(&[instance.to_owned()], bound).await?;
        let answer = answers.first().ok_or("no invocation")?;
        match answer.summary() {
            Ok(summary) if summary.starts_with("completed CONTINUE (Drained,") => Ok(took),
            Ok(summary) => Err(format!("{summary}\n{}", answer.output)),
            Err(error) => Err(error),
        }
    }

    /// Terminates `instances` at once and answers each terminating notification in its own
    /// terminating-hook process (the world needs as many, [`RealWorldBuilder::processes`]),
    /// with the function timeout `bound`. Returns how long the invocations took together and
    /// each one's outcome with its process's output.
    pub async fn scale_in_at_once(
        &self,
        instances: &[String],
        bound: Duration,
    ) -> Result<(Duration, Vec<ScaleInAnswer>), String> {
        let mut subscription = self
            .aws
            .sns()
            .subscribe(&self.topic)
            .map_err(|e| e.to_string())?;
        for instance in instances {
            let terminated = self.aws.autoscaling().terminate_instance(GROUP, instance);
            terminated.map_err(|e| e.to_string())?;
        }
        let mut events = Vec::new();
        for instance in instances {
            let event = subscription.next_event(Duration::from_secs(5)).await;
            let missing = format!("no terminating notification for {instance} within 5 s");
            events.push(event.ok_or(missing)?);
        }
        let processes = self.processes_of(Target::TerminatingHook);
        if processes.len() < instances.len() {
            return Err(format!(
                "{} processes for {} drains",
                processes.len(),
                instances.len()
            ));
        }
        let started = std::time::Instant::now();
        let invocations = processes
            .iter()
            .zip(&events)
            .map(|(f, event)| f.runtime.invoke(event, bound));
        let outcomes = futures::future::join_all(invocations).await;
        let took = started.elapsed();
        let answers = outcomes
            .into_iter()
            .zip(&processes)
            .map(|(outcome, process)| ScaleInAnswer {
                outcome,
                output: process.runtime.output(),
            })
            .collect();
        Ok((took, answers))
    }

    /// The process of `target`. Panics when the world was built without it (a test bug).
    pub fn function(&self, target: Target) -> &RunningFunction {
        self.functions
            .iter()
            .find(|f| f.target == target)
            .unwrap_or_else(|| panic!("{} was not started", target.function_name()))
    }

    /// The process of the function `name` started with [`RealWorldBuilder::function_named`].
    /// Panics when the world was built without it (a test bug).
    pub fn named(&self, name: &str) -> &LambdaRuntimeApi {
        self.named
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, runtime)| runtime)
            .unwrap_or_else(|| panic!("{name} was not started"))
    }

    /// The Kubernetes user a function runs as (its `aws-auth` username).
    pub fn username(target: Target) -> &'static str {
        target.function_name()
    }
}

/// Whether the worlds started from now on in this process run their functions under AWS's
/// Lambda Runtime Interface Emulator ([`crate::lambda_rie`]) instead of the kit's runtime API.
static FUNCTIONS_UNDER_LAMBDA_RIE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The function timeout the emulator enforces (`AWS_LAMBDA_FUNCTION_TIMEOUT`).
const RIE_FUNCTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// One terminating-hook invocation of [`RealFunctionWorld::scale_in_at_once`].
pub struct ScaleInAnswer {
    pub outcome: Result<InvocationOutcome, LambdaApiError>,
    /// Its process's output so far.
    pub output: String,
}

impl ScaleInAnswer {
    /// The summary of the drain the invocation answered with (`completed CONTINUE (Drained,
    /// ...)`); `Err` with the outcome and the output when it answered nothing.
    pub fn summary(&self) -> Result<String, String> {
        match &self.outcome {
            Ok(InvocationOutcome::Response(response)) => Ok(response["records"][0]["summary"]
                .as_str()
                .unwrap_or_default()
                .to_owned()),
            other => Err(format!("{other:?}\n{}", self.output)),
        }
    }
}

/// Every world this process starts from now on runs its functions under AWS's Lambda Runtime
/// Interface Emulator: a test binary of its own calls it first (the scenarios build their
/// worlds themselves).
pub fn run_functions_under_lambda_rie() {
    FUNCTIONS_UNDER_LAMBDA_RIE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// What the world holds.
pub struct RealWorldBuilder {
    functions: Vec<Target>,
    named: Vec<&'static str>,
    env: Vec<(String, String)>,
    log_level: &'static str,
    instance_id: String,
    authentication_mode: &'static str,
    processes: usize,
    apiserver_flags: Vec<String>,
    spot: bool,
}

impl RealWorldBuilder {
    /// Starts only these functions (default: the terminating hook).
    pub fn functions(mut self, targets: &[Target]) -> Self {
        self.functions = targets.to_vec();
        self
    }

    /// Also starts the function `name` (one process), one the test kit has no [`Target`]
    /// for, e.g. `instance-refresh`.
    pub fn function_named(mut self, name: &'static str) -> Self {
        self.named.push(name);
        self
    }

    /// An environment variable for every function (overrides the world's defaults).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Environment variables for every function, as [`RealWorldBuilder::env`].
    pub fn envs(self, pairs: &[(&str, &str)]) -> Self {
        pairs
            .iter()
            .fold(self, |builder, (key, value)| builder.env(key, value))
    }

    pub fn log_level(mut self, level: &'static str) -> Self {
        self.log_level = level;
        self
    }

    /// How many processes of each function run (Lambda runs concurrent events in separate
    /// environments); default 1.
    pub fn processes(mut self, count: usize) -> Self {
        self.processes = count.max(1);
        self
    }

    /// The seeded instance is a Spot instance (a fulfilled Spot request), for interruptions.
    pub fn spot(mut self) -> Self {
        self.spot = true;
        self
    }

    /// A kube-apiserver flag beyond the plane's own.
    pub fn apiserver_flag(mut self, flag: &str) -> Self {
        self.apiserver_flags.push(flag.to_owned());
        self
    }

    /// The cluster's authentication mode, `CONFIG_MAP` or `API_AND_CONFIG_MAP` (the default);
    /// the functions' roles are mapped through `aws-auth` in both.
    pub fn authentication_mode(mut self, mode: &'static str) -> Self {
        self.authentication_mode = mode;
        self
    }

    /// Starts the fake AWS and the real plane from the binaries in `bin`, applies
    /// `infra/rbac.yaml`, seeds the cluster, node group, Auto Scaling group (both hooks
    /// notifying one topic) and the instance with its Ready node, maps each function's role
    /// through `aws-auth` `mapRoles` and starts the function processes.
    pub async fn start(
        self,
        bin: &std::path::Path,
    ) -> Result<RealFunctionWorld, ControlPlaneError> {
        // AWS's emulator reports every function's ARN in its own fixed account (and the
        // functions take their account from it): the fake AWS is that account then.
        let account = if FUNCTIONS_UNDER_LAMBDA_RIE.load(std::sync::atomic::Ordering::Relaxed) {
            FakeAccount::new(crate::lambda_rie::RIE_ACCOUNT, "eu-west-1")
        } else {
            FakeAccount::reference()
        };
        let aws = FakeAws::start(account.clone())
            .await
            .map_err(|e| setup("the fake AWS", e))?;
        let plane = RealControlPlane::start_with(
            bin,
            WebhookSettings {
                cluster_name: CLUSTER.to_owned(),
                account: account.clone(),
                access_entries: Some(Arc::new(aws.eks())),
                ec2: Some(aws.ec2()),
            },
            &self.apiserver_flags,
        )
        .await?;
        let admin = plane.admin_client().await?;
        apply_manifest(
            &admin,
            &std::fs::read_to_string(corpus::repository_root().join("infra/rbac.yaml"))
                .map_err(|e| setup("reading infra/rbac.yaml", e))?,
        )
        .await?;
        let topic = seed_aws(&aws, &plane, self.authentication_mode)?;
        let kubelets = FakeKubelets::start(plane.kubelet_client().await?);
        let mut instance =
            FakeInstance::new(&self.instance_id, "eu-west-1").availability_zone(ZONE);
        if self.spot {
            instance = instance.spot();
        }
        let node = add_instance(&aws, &kubelets, instance, false).await?;
        let (functions, named) = self.start_functions(&account, &aws, &admin, &topic).await?;
        Ok(RealFunctionWorld {
            aws,
            plane,
            kubelets,
            topic,
            instance: self.instance_id,
            node,
            functions,
            named,
        })
    }

    async fn start_functions(
        &self,
        account: &FakeAccount,
        aws: &FakeAws,
        admin: &kube::Client,
        topic: &str,
    ) -> Result<(Vec<RunningFunction>, Vec<(String, LambdaRuntimeApi)>), ControlPlaneError> {
        // Grants first, so no process ever runs without its identity.
        let names = self
            .functions
            .iter()
            .map(|t| t.function_name())
            .chain(self.named.iter().copied());
        let mut map_roles = String::new();
        let mut granted = BTreeMap::new();
        for name in names {
            let credentials = account.add_role_credentials(&format!("open-node-manager-{name}"));
            map_roles.push_str(&format!(
                "- rolearn: {}\n  username: {name}\n  groups: [{}]\n",
                credentials.principal_arn,
                function_group(name)
            ));
            granted.insert(name, credentials);
        }
        let config_map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "aws-auth", "namespace": "kube-system"},
            "data": {"mapRoles": map_roles},
        }))
        .map_err(|e| setup("aws-auth", e))?;
        Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
            .create(&PostParams::default(), &config_map)
            .await
            .map_err(|e| setup("creating aws-auth", e))?;

        let mut functions = Vec::new();
        for &target in &self.functions {
            let credentials = granted[target.function_name()].clone();
            for _ in 0..self.processes {
                let runtime = self
                    .start_process(aws, topic, target.function_name(), &credentials)
                    .await?;
                functions.push(RunningFunction {
                    target,
                    runtime,
                    credentials: credentials.clone(),
                });
            }
        }
        let mut named = Vec::new();
        for &name in &self.named {
            let runtime = self.start_process(aws, topic, name, &granted[name]).await?;
            named.push((name.to_owned(), runtime));
        }
        Ok((functions, named))
    }

    async fn start_process(
        &self,
        aws: &FakeAws,
        topic: &str,
        name: &str,
        credentials: &FakeCredentials,
    ) -> Result<LambdaRuntimeApi, ControlPlaneError> {
        let mut spec = FunctionSpec::new(name, function_binary(name))
            .envs(aws.environment(credentials))
            .env("CLUSTER_NAME", CLUSTER)
            .env("CONTINUATION_TOPIC_ARN", topic)
            .env("SETTLE_SECONDS", "0")
            .env("DRAIN_TIMEOUT_SECONDS", "20")
            .env("HAND_OVER_MARGIN_SECONDS", "5")
            .env("RUST_LOG", self.log_level)
            .env("AWS_LAMBDA_LOG_LEVEL", &self.log_level.to_uppercase())
            .envs(self.env.clone());
        if FUNCTIONS_UNDER_LAMBDA_RIE.load(std::sync::atomic::Ordering::Relaxed) {
            let binary = crate::lambda_rie::rie_binary().map_err(|e| setup(name, e))?;
            let rie = crate::lambda_rie::Rie::new(binary, RIE_FUNCTION_TIMEOUT)
                .map_err(|e| setup(name, e))?;
            spec = spec.under_rie(rie);
        }
        LambdaRuntimeApi::start_function(spec)
            .await
            .map_err(|e| setup(name, e))
    }
}

/// An instance in service in [`GROUP`] and its Ready node; returns the node's name.
async fn add_instance(
    aws: &FakeAws,
    kubelets: &FakeKubelets,
    instance: FakeInstance,
    unschedulable: bool,
) -> Result<String, ControlPlaneError> {
    let node = instance.private_dns_name.clone();
    let (id, zone) = (
        instance.instance_id.clone(),
        instance.availability_zone.clone(),
    );
    aws.ec2().add_instance(instance);
    aws.autoscaling()
        .add_instance(GROUP, &id, &zone)
        .map_err(|e| setup("the instance", e))?;
    kubelets
        .register_node(&node, &format!("aws:///{zone}/{id}"), &zone, unschedulable)
        .await?;
    Ok(node)
}

/// The cluster (endpoint and CA of the real plane), node group, topic, Auto Scaling group and
/// its two hooks; returns the topic.
fn seed_aws(
    aws: &FakeAws,
    plane: &RealControlPlane,
    authentication_mode: &str,
) -> Result<String, ControlPlaneError> {
    aws.eks().add_cluster(
        FakeCluster::new(CLUSTER, plane.url(), &plane.ca_data())
            .authentication_mode(Some(authentication_mode)),
    );
    aws.eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new("demo-ng", &node_role_in(aws.account()))
                .ami_type("AL2_x86_64")
                .auto_scaling_group(GROUP),
        )
        .map_err(|e| setup("the node group", e))?;
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
            .map_err(|e| setup("the lifecycle hooks", e))?;
    }
    Ok(topic)
}

/// Applies every document of a multi-document manifest (server-side apply, as
/// `kubectl apply --server-side` does), resolving each kind through discovery.
pub async fn apply_manifest(client: &kube::Client, yaml: &str) -> Result<usize, ControlPlaneError> {
    let mut applied = 0;
    for document in yaml.split("\n---") {
        let value: Value = serde_saphyr::from_str(document).map_err(|e| setup("manifest", e))?;
        if value.is_null() {
            continue;
        }
        let object: DynamicObject =
            serde_json::from_value(value.clone()).map_err(|e| setup("manifest", e))?;
        let types = object.types.clone().unwrap_or_default();
        let gvk =
            kube::api::GroupVersionKind::try_from(&types).map_err(|e| setup("manifest", e))?;
        let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| setup(&format!("discovering {}", types.kind), e))?;
        let name = object.metadata.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = match (&object.metadata.namespace, capabilities.scope) {
            (Some(namespace), kube::discovery::Scope::Namespaced) => {
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            &name,
            &PatchParams::apply("open-node-manager-tests").force(),
            &Patch::Apply(&value),
        )
        .await
        .map_err(|e| setup(&format!("applying {} {name}", types.kind), e))?;
        applied += 1;
    }
    Ok(applied)
}

fn setup(what: &str, error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::setup(what, error)
}

/// [`NODE_ROLE`] in `account` (the world's account is another under AWS's Lambda emulator).
pub fn node_role_in(account: &FakeAccount) -> String {
    let name = NODE_ROLE.rsplit('/').next().unwrap_or(NODE_ROLE);
    account.role_arn(name)
}
