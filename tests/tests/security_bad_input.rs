//! Bad input: every payload of the corpus (`node_manager_testkit::soak::corpus`, generated
//! from the fixtures, plus the files under `tests/corpus/`) goes through each function's
//! handler, in process, against the fake API server (shipped RBAC) and the shared crate's
//! in-memory AWS fakes. Each must end without a panic, with a clear error or a clean
//! acknowledgement, and with no effect: no Kubernetes write by the function (audit log), no
//! lifecycle completion, heartbeat or hand-over, no access entry, no `aws-auth` change. The
//! world is seeded so that a payload that *did* get through would have something to act on
//! (a Ready node of the instance, a pending action, an unmapped node group).
//!
//! The tracing output of every handler is captured and scanned for secrets.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use node_manager::aws::in_memory::{
    InMemoryAutoScaling, InMemoryEks, InMemoryInstances, InMemoryNotifications,
};
use node_manager::aws::{
    AuthenticationMode, ClusterDescription, LifecycleActionRef, LifecycleActionResult,
    LifecycleHook, NodegroupDescription,
};
use node_manager::drain::{Drainer, Invocation};
use node_manager::launch::Launcher;
use node_manager::lifecycle::budget::InvocationBudget;
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::{DrainSettings, LaunchSettings};
use node_manager::nodegroup_auth::handler::NodegroupAuth;
use node_manager::nodegroup_auth::kube_store::KubeAwsAuthStore;
use node_manager::nodegroup_auth::settings::NodegroupAuthSettings;
use node_manager::retry::RetryPolicy;
use node_manager::settings::ClusterScope;
use node_manager_testkit::kube::FakeApiServer;
use node_manager_testkit::soak::corpus::{self, BadPayload, Target};
use node_manager_testkit::soak::secrets::{CapturedLogs, SecretScanner};
use serde_json::{Value, json};

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
const TERMINATING_INSTANCE: &str = "i-07e9ea9eb19a67337";
const TERMINATING_TOKEN: &str = "c613620e-07e2-4ed2-a9e2-ef8258911ade";
const TERMINATING_NODE: &str = "ip-192-168-12-34.eu-west-1.compute.internal";
const LAUNCHING_INSTANCE: &str = "i-0a1b2c3d4e5f60718";
const LAUNCHING_TOKEN: &str = "71514b9d-6a40-4b26-8523-05e7ee35fa40";
const LAUNCHING_NODE: &str = "ip-10-0-7-24.eu-west-1.compute.internal";
const ACCOUNT: &str = "111111111111";
const NODE_ROLE: &str = "arn:aws:iam::111111111111:role/eksctl-ironman-2022-nodegroup-demo-ng-NodeInstanceRole-454Q2XHJ5LZ0";
/// Generous: a payload that makes a handler wait this long is a finding of its own.
const PER_PAYLOAD: Duration = Duration::from_secs(20);

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

fn rbac() -> std::path::PathBuf {
    corpus::repository_root().join("infra/rbac.yaml")
}

/// What one payload did.
#[derive(Debug)]
struct Outcome {
    name: String,
    /// `Ok(text)`: the acknowledgement; `Err(text)`: the error's message.
    result: Result<String, String>,
}

/// Failures collected over the whole corpus (one assertion at the end shows them all).
#[derive(Default)]
struct Findings {
    problems: Vec<String>,
    refused: usize,
    acknowledged: usize,
}

impl Findings {
    fn judge(&mut self, outcome: &Outcome, effects: Vec<String>) {
        match &outcome.result {
            Ok(_) => self.acknowledged += 1,
            Err(message) => {
                self.refused += 1;
                if message.trim().is_empty() {
                    self.problems
                        .push(format!("{}: error without a message", outcome.name));
                }
            }
        }
        for effect in effects {
            self.problems.push(format!(
                "{}: {effect} (handler said {:?})",
                outcome.name,
                shorten(&format!("{:?}", outcome.result))
            ));
        }
    }

    fn assert_none(&self, target: Target, tried: usize) {
        println!(
            "{}: {tried} payloads, {} refused with an error, {} acknowledged without effect, {} problems",
            target.function_name(),
            self.refused,
            self.acknowledged,
            self.problems.len()
        );
        assert!(tried >= 40, "the corpus has only {tried} payloads");
        assert!(
            self.problems.is_empty(),
            "{} of {tried} bad payloads for {} had an effect or no clear error:\n{}",
            self.problems.len(),
            target.function_name(),
            self.problems.join("\n")
        );
    }
}

fn shorten(text: &str) -> String {
    if text.chars().count() > 300 {
        format!("{}…", text.chars().take(300).collect::<String>())
    } else {
        text.to_owned()
    }
}

/// The function's writes since the audit log was last cleared.
fn kube_writes(server: &FakeApiServer, user: &str) -> Vec<String> {
    server
        .audit()
        .filter(|e| e.user.username == user && WRITE_VERBS.contains(&e.verb.as_str()))
        .iter()
        .map(|e| e.line())
        .collect()
}

fn hook(name: &str, transition: &str) -> LifecycleHook {
    LifecycleHook {
        name: name.into(),
        transition: transition.into(),
        heartbeat_timeout: Duration::from_secs(300),
        global_timeout: Duration::from_secs(3600),
        default_result: LifecycleActionResult::Continue,
    }
}

/// Auto Scaling with the reference group (this cluster's), a group of another cluster and an
/// untagged group, each with both hooks and pending actions on both reference instances:
/// a forged message that reached any of them would complete or heartbeat something.
fn autoscaling_world() -> (InMemoryAutoScaling, Vec<LifecycleActionRef>) {
    let autoscaling = InMemoryAutoScaling::new();
    autoscaling.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
    autoscaling.add_group("foreign-asg", &[("eks:cluster-name", "other-cluster")]);
    autoscaling.add_group("untagged-asg", &[]);
    let mut pending = Vec::new();
    for group in [GROUP, "foreign-asg", "untagged-asg"] {
        autoscaling.add_hook(
            group,
            hook("Terminate-LC-Hook", "autoscaling:EC2_INSTANCE_TERMINATING"),
        );
        autoscaling.add_hook(
            group,
            hook("Launch-LC-Hook", "autoscaling:EC2_INSTANCE_LAUNCHING"),
        );
        for (hook_name, instance, token) in [
            ("Terminate-LC-Hook", TERMINATING_INSTANCE, TERMINATING_TOKEN),
            ("Launch-LC-Hook", LAUNCHING_INSTANCE, LAUNCHING_TOKEN),
        ] {
            let action = LifecycleActionRef {
                auto_scaling_group_name: group.into(),
                lifecycle_hook_name: hook_name.into(),
                instance_id: instance.into(),
                token: token.into(),
            };
            autoscaling.start_action(&action);
            pending.push(action);
        }
    }
    (autoscaling, pending)
}

/// The fake API server with the shipped RBAC, both reference nodes Ready, and a kube client
/// for `user` in the functions' group (kube's own 429 retries off, as in the functions).
async fn cluster_world(user: &str) -> (FakeApiServer, kube::Client) {
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .start()
        .await
        .unwrap();
    server.apply_manifest_file(&rbac()).unwrap();
    for (node, instance) in [
        (TERMINATING_NODE, TERMINATING_INSTANCE),
        (LAUNCHING_NODE, LAUNCHING_INSTANCE),
    ] {
        server
            .register_node(
                node,
                &format!("aws:///eu-west-1a/{instance}"),
                Some(Duration::ZERO),
            )
            .unwrap();
    }
    server
        .wait_for("both nodes Ready", Duration::from_secs(10), |store| {
            store.list::<Node>().iter().all(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
        })
        .await
        .unwrap();
    let token = server.add_static_token(user, &[format!("open-node-manager:{user}").as_str()]);
    let mut config = server.config_with_token(&token).await.unwrap();
    config.default_retry = false;
    (server, kube::Client::try_from(config).unwrap())
}

fn instances() -> InMemoryInstances {
    let instances = InMemoryInstances::default();
    instances.add(TERMINATING_INSTANCE, TERMINATING_NODE);
    instances.add(LAUNCHING_INSTANCE, LAUNCHING_NODE);
    instances
}

fn aws_effects(
    autoscaling: &InMemoryAutoScaling,
    notifications: &InMemoryNotifications,
    pending: &[LifecycleActionRef],
) -> Vec<String> {
    let mut effects = Vec::new();
    for completion in autoscaling.completions() {
        effects.push(format!("completed {:?}", completion.action));
    }
    for heartbeat in autoscaling.heartbeats() {
        effects.push(format!("heartbeat for {heartbeat:?}"));
    }
    for published in notifications.published() {
        effects.push(format!("published to {}", published.topic_arn));
    }
    for action in pending {
        if !autoscaling.is_pending(action) {
            effects.push(format!("action no longer pending: {action:?}"));
        }
    }
    effects
}

/// Runs `run` for one payload; a panic is caught and reported as a finding. (Not spawned:
/// the drain's future is not `Send`.)
async fn run_one<F, Fut>(payload: &BadPayload, run: F) -> Outcome
where
    F: FnOnce(Value) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    use futures::FutureExt;
    let guarded = std::panic::AssertUnwindSafe(run(payload.event.clone())).catch_unwind();
    let result = match tokio::time::timeout(PER_PAYLOAD, guarded).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(format!(
            "PANIC: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default()
        )),
        Err(_) => Err(format!("TIMEOUT: still running after {PER_PAYLOAD:?}")),
    };
    Outcome {
        name: payload.name.clone(),
        result,
    }
}

fn is_hard_failure(outcome: &Outcome) -> Option<String> {
    match &outcome.result {
        Err(message) if message.starts_with("PANIC") || message.starts_with("TIMEOUT") => {
            Some(message.clone())
        }
        _ => None,
    }
}

#[tokio::test]
async fn terminating_hook_refuses_every_bad_payload_without_effect() {
    // Includes payloads that name the reference instance and group correctly but an action
    // Auto Scaling does not have (another token or hook name): they must not drain anything.
    terminating_hook_corpus(corpus::lifecycle_corpus(Target::TerminatingHook)).await;
}

async fn terminating_hook_corpus(payloads: Vec<BadPayload>) {
    let (logs, _guard) = CapturedLogs::install();
    let (server, client) = cluster_world("terminating-hook").await;
    let settings = DrainSettings::from_source(
        [
            ("CLUSTER_NAME", CLUSTER),
            ("SETTLE_SECONDS", "0"),
            ("DRAIN_TIMEOUT_SECONDS", "2"),
            ("EVICTION_BACKOFF_SECONDS", "0.05"),
            ("EVICTION_BACKOFF_MAX_SECONDS", "0.1"),
            ("DRAIN_LEASE_SECONDS", "2"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
            (
                "CONTINUATION_TOPIC_ARN",
                "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic",
            ),
        ]
        .as_slice(),
    )
    .unwrap();
    let mut findings = Findings::default();
    for payload in &payloads {
        let (autoscaling, pending) = autoscaling_world();
        let notifications = InMemoryNotifications::default();
        let mut drainer = Drainer::new(
            client.clone(),
            autoscaling.clone(),
            instances(),
            notifications.clone(),
            settings.clone(),
        );
        drainer.record_events = true;
        let drainer = Arc::new(drainer);
        server.audit().clear();
        let outcome = run_one(payload, move |event| async move {
            let invocation = Invocation {
                request_id: "corpus".into(),
                function_account: Some(ACCOUNT.into()),
                budget: InvocationBudget::new(Duration::from_secs(10), Duration::ZERO),
            };
            drainer
                .handle_invocation(event, &invocation)
                .await
                .map(|report| format!("{report:?}"))
                .map_err(|error| error.to_string())
        })
        .await;
        let mut effects = aws_effects(&autoscaling, &notifications, &pending);
        effects.extend(
            kube_writes(&server, "terminating-hook")
                .into_iter()
                .map(|w| format!("Kubernetes write: {w}")),
        );
        effects.extend(is_hard_failure(&outcome));
        findings.judge(&outcome, effects);
    }
    SecretScanner::new().assert_clean("terminating-hook tracing output", &logs.text());
    findings.assert_none(Target::TerminatingHook, payloads.len());
    let node = server.store().get::<Node>("", TERMINATING_NODE).unwrap();
    assert_ne!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "the node was cordoned"
    );
}

fn lambda_context(function: &str, timeout: Duration) -> lambda_runtime::Context {
    let mut context = lambda_runtime::Context::default();
    context.request_id = "corpus".into();
    context.invoked_function_arn =
        format!("arn:aws:lambda:eu-west-1:{ACCOUNT}:function:{function}");
    let deadline = SystemTime::now() + timeout;
    context.deadline = u64::try_from(
        deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    context
}

#[tokio::test]
async fn launching_hook_refuses_every_bad_payload_without_effect() {
    let (logs, _guard) = CapturedLogs::install();
    let (server, client) = cluster_world("launching-hook").await;
    let payloads = corpus::lifecycle_corpus(Target::LaunchingHook);
    let settings = LaunchSettings::from_source(
        [
            ("CLUSTER_NAME", CLUSTER),
            ("LAUNCH_TIMEOUT_SECONDS", "1"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
            (
                "CONTINUATION_TOPIC_ARN",
                "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic",
            ),
        ]
        .as_slice(),
    )
    .unwrap();
    let mut findings = Findings::default();
    for payload in &payloads {
        let (autoscaling, pending) = autoscaling_world();
        let notifications = InMemoryNotifications::default();
        let ctx = Arc::new(Launcher::new(
            client.clone(),
            autoscaling.clone(),
            instances(),
            notifications.clone(),
            settings.clone(),
        ));
        server.audit().clear();
        let outcome = run_one(payload, move |event| async move {
            let lambda = lambda_context("launching-hook", Duration::from_secs(10));
            ctx.handle(event, &lambda)
                .await
                .map(|report| serde_json::to_string(&report).unwrap_or_default())
                .map_err(|error| error.to_string())
        })
        .await;
        let mut effects = aws_effects(&autoscaling, &notifications, &pending);
        effects.extend(
            kube_writes(&server, "launching-hook")
                .into_iter()
                .map(|w| format!("Kubernetes write: {w}")),
        );
        effects.extend(is_hard_failure(&outcome));
        findings.judge(&outcome, effects);
    }
    SecretScanner::new().assert_clean("launching-hook tracing output", &logs.text());
    findings.assert_none(Target::LaunchingHook, payloads.len());
}

const AWS_AUTH: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: aws-auth
  namespace: kube-system
data:
  mapRoles: |
    - rolearn: arn:aws:iam::111111111111:role/admin
      username: admin
      groups:
        - system:masters
    - rolearn: arn:aws:iam::111111111111:role/ghost-node-role
      username: system:node:{{EC2PrivateDNSName}}
      groups:
        - system:bootstrappers
        - system:nodes
  mapUsers: |
    []
"#;

/// Node groups whose `DescribeNodegroup` answer carries a hostile node role (as if EKS, or
/// whoever can create node groups, handed one over).
fn hostile_nodegroups() -> Vec<(String, String)> {
    corpus::hostile_role_arns()
        .into_iter()
        .filter(|(name, _)| name != "empty" && name != "admin-role")
        .map(|(name, role)| (format!("evil-{name}"), role))
        .collect()
}

async fn nodegroup_auth_corpus_against(mode: AuthenticationMode) {
    let (logs, _guard) = CapturedLogs::install();
    let (server, client) = cluster_world("nodegroup-auth").await;
    server.store().apply_yaml(AWS_AUTH).unwrap();
    let before = server
        .store()
        .get::<ConfigMap>("kube-system", "aws-auth")
        .unwrap();
    let mut payloads = corpus::nodegroup_auth_corpus();
    for (nodegroup, _) in hostile_nodegroups() {
        payloads.push(BadPayload {
            name: format!("direct/describe-returns/{nodegroup}"),
            event: json!({"clusterName": CLUSTER, "nodegroupName": nodegroup}),
        });
        let mut create = corpus::fixture("eventbridge-create-nodegroup.json");
        create["detail"]["requestParameters"]["nodegroupName"] = json!(nodegroup);
        create["detail"]["responseElements"]["nodegroup"]["nodegroupName"] = json!(nodegroup);
        payloads.push(BadPayload {
            name: format!("create/describe-returns/{nodegroup}"),
            event: create,
        });
    }
    let settings = NodegroupAuthSettings {
        scope: ClusterScope {
            cluster_name: CLUSTER.into(),
            additional_cluster_names: vec![],
        },
        region: "eu-west-1".into(),
        account_id: None,
        aws_auth_with_access_entries: true,
        retry: RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(20),
        },
        delete_wait: Duration::from_millis(100),
        delete_poll_interval: Duration::from_millis(20),
    };
    let mut findings = Findings::default();
    for payload in &payloads {
        let eks = InMemoryEks::default();
        eks.add_cluster(ClusterDescription {
            name: CLUSTER.into(),
            arn: format!("arn:aws:eks:eu-west-1:{ACCOUNT}:cluster/{CLUSTER}"),
            endpoint: server.url().to_owned(),
            certificate_authority_data: server.ca_data(),
            authentication_mode: mode,
        });
        // demo-ng exists and is NOT mapped yet: a payload read as a valid request for it
        // would write, and the test would see it.
        eks.add_nodegroup(NodegroupDescription {
            cluster_name: CLUSTER.into(),
            nodegroup_name: "demo-ng".into(),
            node_role: NODE_ROLE.into(),
            ami_type: "AL2_x86_64".into(),
            status: "ACTIVE".into(),
        });
        for (nodegroup, role) in hostile_nodegroups() {
            eks.add_nodegroup(NodegroupDescription {
                cluster_name: CLUSTER.into(),
                nodegroup_name: nodegroup,
                node_role: role,
                ami_type: "AL2_x86_64".into(),
                status: "ACTIVE".into(),
            });
        }
        let function = Arc::new(NodegroupAuth::new(
            eks.clone(),
            KubeAwsAuthStore::new(client.clone()),
            node_manager::aws::in_memory::InMemoryInstanceProfiles::default(),
            node_manager::aws::in_memory::InMemoryInstances::default(),
            settings.clone(),
        ));
        server.audit().clear();
        let outcome = run_one(payload, move |event| async move {
            function
                .handle(
                    &event,
                    &format!("arn:aws:lambda:eu-west-1:{ACCOUNT}:function:nodegroup-auth"),
                )
                .await
                .map(|report| serde_json::to_string(&report).unwrap_or_default())
                .map_err(|error| error.to_string())
        })
        .await;
        let mut effects: Vec<String> = kube_writes(&server, "nodegroup-auth")
            .into_iter()
            .filter(|w| !w.contains(" events"))
            .map(|w| format!("Kubernetes write: {w}"))
            .collect();
        for call in eks.calls() {
            if call.contains("AccessEntry")
                && !call.starts_with("Describe")
                && !call.starts_with("List")
            {
                effects.push(format!("EKS call {call}"));
            }
        }
        if !eks.access_entries(CLUSTER).is_empty() {
            effects.push(format!(
                "access entries now exist: {:?}",
                eks.access_entries(CLUSTER)
            ));
        }
        let now = server
            .store()
            .get::<ConfigMap>("kube-system", "aws-auth")
            .unwrap();
        if now.data != before.data {
            effects.push(format!("aws-auth changed: {:?}", now.data));
            server.store().apply_yaml(AWS_AUTH).unwrap();
        }
        effects.extend(is_hard_failure(&outcome));
        findings.judge(&outcome, effects);
    }
    SecretScanner::new().assert_clean("nodegroup-auth tracing output", &logs.text());
    findings.assert_none(Target::NodegroupAuth, payloads.len());
}

#[tokio::test]
async fn nodegroup_auth_refuses_every_bad_payload_config_map_mode() {
    nodegroup_auth_corpus_against(AuthenticationMode::ConfigMap).await;
}

#[tokio::test]
async fn nodegroup_auth_refuses_every_bad_payload_access_entry_mode() {
    nodegroup_auth_corpus_against(AuthenticationMode::ApiAndConfigMap).await;
}

#[test]
fn the_corpus_is_large_and_its_names_are_unique() {
    for (target, payloads) in [
        (
            Target::TerminatingHook,
            corpus::lifecycle_corpus(Target::TerminatingHook),
        ),
        (
            Target::LaunchingHook,
            corpus::lifecycle_corpus(Target::LaunchingHook),
        ),
        (Target::NodegroupAuth, corpus::nodegroup_auth_corpus()),
    ] {
        assert!(payloads.len() >= 200, "{target:?}: {}", payloads.len());
        let mut seen = BTreeMap::new();
        for p in &payloads {
            *seen.entry(p.name.clone()).or_insert(0) += 1;
        }
        let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(duplicates.is_empty(), "{target:?}: {duplicates:?}");
        let files = payloads
            .iter()
            .filter(|p| p.name.starts_with("file/"))
            .count();
        assert!(files >= 5, "{target:?}: only {files} hand-written files");
    }
    assert!(Path::new(&corpus::fixtures_dir()).is_dir());
}
