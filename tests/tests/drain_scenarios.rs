//! The terminating hook's drain, end to end against the test kit's fake API server (real
//! HTTPS, EKS token authentication, the shipped `infra/rbac.yaml`) with scaled-down timings.
//! Auto Scaling, EC2 and SNS are the shared crate's in-memory fakes, which record every
//! completion, heartbeat and publish.
#![allow(clippy::unwrap_used)]

use node_manager::lifecycle::handler::Clients;
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use node_manager::aws::in_memory::{InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications};
use node_manager::aws::{
    CompletionOutcome, LifecycleActionRef, LifecycleActionResult, LifecycleHook,
};
use node_manager::cluster::token::sign_token;
use node_manager::drain::{
    DeliveryOutcome, DrainEnd, DrainError, DrainReport, Drainer, InstanceFate, Invocation,
};
use node_manager::lifecycle::budget::InvocationBudget;
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::DrainSettings;
use node_manager::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;
use node_manager::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, DrainCheckpoint};
use node_manager_testkit::fixtures::{self, Workload};
use node_manager_testkit::kube::store::StoredKind;
use node_manager_testkit::kube::{AuditEvent, FakeApiServer, FaultAction, FaultRule};
use serde_json::{Value, json};

// The scenarios of one feature each, on this file's `Scenario` (one test binary).
#[path = "drain_scenarios/do_not_disrupt.rs"]
mod do_not_disrupt;
#[path = "drain_scenarios/instance_notices.rs"]
mod instance_notices;
#[path = "drain_scenarios/reconcile_marks.rs"]
mod reconcile_marks;
#[path = "drain_scenarios/retention.rs"]
mod retention;

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
const HOOK: &str = "Terminate-LC-Hook";
const INSTANCE: &str = "i-07e9ea9eb19a67337";
const TOKEN: &str = "c613620e-07e2-4ed2-a9e2-ef8258911ade";
const NODE: &str = "ip-192-168-12-34.eu-west-1.compute.internal";
const OTHER_NODE: &str = "ip-192-168-77-8.eu-west-1.compute.internal";
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/sns-lifecycle-terminating.json"
);
const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/rbac.yaml");

type TestDrainer =
    Drainer<Clients<kube::Client, InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications>>;

/// A fake cluster with the reference node, another node for replacements, and the
/// terminating hook's identity (mapped to the RBAC groups through aws-auth).
struct Scenario {
    server: FakeApiServer,
    autoscaling: InMemoryAutoScaling,
    instances: InMemoryInstances,
    notifications: InMemoryNotifications,
    function_client: kube::Client,
}

impl Scenario {
    async fn start(force_group: bool) -> Self {
        let server = FakeApiServer::builder()
            .cluster_name(CLUSTER)
            .start()
            .await
            .unwrap();
        server
            .apply_manifest_file(std::path::Path::new(RBAC))
            .unwrap();
        let groups = if force_group {
            "[open-node-manager:terminating-hook, open-node-manager:force-delete]"
        } else {
            "[open-node-manager:terminating-hook]"
        };
        let role = server.account().role_arn("terminating-hook");
        server
            .store()
            .apply_yaml(&format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: aws-auth\n  namespace: kube-system\ndata:\n  mapRoles: |\n    - rolearn: {role}\n      username: terminating-hook\n      groups: {groups}\n"
            ))
            .unwrap();
        let creds = server.account().add_role_credentials("terminating-hook");
        let token = sign_token(
            &Credentials::new(
                &creds.access_key_id,
                &creds.secret_access_key,
                creds.session_token.clone(),
                None,
                "test",
            ),
            &server.account().region,
            CLUSTER,
            SystemTime::now(),
        )
        .unwrap();
        // Like the function's own client: kube's built-in retry of 429s is off, so the drain
        // sees PodDisruptionBudget refusals itself (and reports them).
        let mut config = server.config_with_token(token.expose()).await.unwrap();
        config.default_retry = false;
        let function_client = kube::Client::try_from(config).unwrap();

        let autoscaling = InMemoryAutoScaling::new();
        autoscaling.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
        autoscaling.add_hook(
            GROUP,
            LifecycleHook {
                name: HOOK.into(),
                transition: "autoscaling:EC2_INSTANCE_TERMINATING".into(),
                heartbeat_timeout: Duration::from_millis(400),
                global_timeout: Duration::from_secs(3600),
                default_result: LifecycleActionResult::Continue,
            },
        );
        autoscaling.start_action(&action());
        let instances = InMemoryInstances::default();
        instances.add(INSTANCE, NODE);
        Self {
            server,
            autoscaling,
            instances,
            notifications: InMemoryNotifications::default(),
            function_client,
        }
    }

    /// Both nodes registered and Ready.
    async fn with_nodes(self) -> Self {
        self.server
            .register_node(
                NODE,
                &format!("aws:///eu-west-1a/{INSTANCE}"),
                Some(Duration::ZERO),
            )
            .unwrap();
        self.wait_until("the node is Ready", || {
            self.server
                .store()
                .find::<Node>("", NODE)
                .is_some_and(|n| ready(&n))
        })
        .await;
        self
    }

    fn register_other_node(&self) {
        self.server
            .register_node(
                OTHER_NODE,
                "aws:///eu-west-1b/i-0aaaabbbbccccdddd",
                Some(Duration::ZERO),
            )
            .unwrap();
    }

    fn create<K: StoredKind>(&self, object: &K) {
        self.server.store().create(object).unwrap();
    }

    fn pods_on(&self, node: &str) -> Vec<Pod> {
        self.server
            .store()
            .list::<Pod>()
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .collect()
    }

    fn running_pods_on(&self, node: &str, prefix: &str) -> usize {
        fixtures::running_on(self.server.store(), node, prefix)
    }

    async fn wait_until(&self, what: &str, done: impl Fn() -> bool) {
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(
                tokio::time::Instant::now() < until,
                "timed out waiting until {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn drainer(&self, extra: &[(&str, &str)]) -> TestDrainer {
        let mut env: Vec<(&str, &str)> = vec![
            ("CLUSTER_NAME", CLUSTER),
            ("SETTLE_SECONDS", "0.05"),
            ("DRAIN_TIMEOUT_SECONDS", "8"),
            ("EVICTION_BACKOFF_SECONDS", "0.05"),
            ("EVICTION_BACKOFF_MAX_SECONDS", "0.2"),
            ("DRAIN_LEASE_SECONDS", "2"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
        ];
        env.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        env.extend_from_slice(extra);
        let settings = DrainSettings::from_source(env.as_slice()).unwrap();
        Drainer::new(
            self.function_client.clone(),
            self.autoscaling.clone(),
            self.instances.clone(),
            self.notifications.clone(),
            settings,
        )
    }

    fn node_events(&self) -> Vec<Event> {
        self.server
            .store()
            .list::<Event>()
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Node"))
            .collect()
    }

    fn events_with_reason(&self, reason: &str) -> Vec<Event> {
        self.server.store().events_with_reason(reason)
    }

    fn checkpoint(&self) -> Option<DrainCheckpoint> {
        let node = self.server.store().find::<Node>("", NODE)?;
        let raw = node
            .metadata
            .annotations?
            .get(CHECKPOINT_ANNOTATION)?
            .clone();
        Some(DrainCheckpoint::parse(&raw).unwrap())
    }

    /// The function's own requests, in order.
    fn function_requests(&self) -> Vec<AuditEvent> {
        self.server.audit().by_user("terminating-hook")
    }
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn action() -> LifecycleActionRef {
    LifecycleActionRef {
        auto_scaling_group_name: GROUP.into(),
        lifecycle_hook_name: HOOK.into(),
        instance_id: INSTANCE.into(),
        token: TOKEN.into(),
    }
}

/// The fixture's event, with the notification's `Time` set to now (so the hook's global
/// timeout lies ahead, as for a real pending action).
fn terminating_event() -> Value {
    let mut event: Value =
        serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let raw = event["Records"][0]["Sns"]["Message"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut message: Value = serde_json::from_str(&raw).unwrap();
    message["Time"] = json!(jiff::Timestamp::now().to_string());
    event["Records"][0]["Sns"]["Message"] = json!(message.to_string());
    event
}

/// One invocation of `drainer` for the reference node's terminating notification.
async fn drain_terminating(
    drainer: &TestDrainer,
    request_id: &str,
    budget: Duration,
) -> Result<DrainReport, DrainError> {
    drainer
        .handle_invocation(terminating_event(), &invocation(request_id, budget))
        .await
}

fn invocation(request_id: &str, budget: Duration) -> Invocation {
    Invocation {
        request_id: request_id.into(),
        function_account: Some("111111111111".into()),
        budget: InvocationBudget::new(budget, Duration::ZERO),
    }
}

/// `replicas` nginx pods behind `app=nginx`, each with `grace_seconds` to stop.
fn nginx(replicas: i32, grace_seconds: i64) -> Deployment {
    Workload::new("default", "nginx")
        .replicas(replicas)
        .container("nginx", "nginx")
        .grace_period_seconds(Some(grace_seconds))
        .deployment()
}

/// The reference workload on the node: nginx (4 replicas), coredns, aws-node, kube-proxy,
/// all Running; then a second node joins to take the replacements.
/// The reference cluster with a budget no eviction can satisfy (`minAvailable` 4 of the 4
/// nginx replicas): every drain of it reaches its deadline.
async fn blocked_cluster(force_group: bool) -> Scenario {
    let s = reference_cluster(force_group, 30).await;
    s.create(&fixtures::pdb_min_available(
        "default",
        "nginx-strict",
        4,
        &[("app", "nginx")],
    ));
    s
}

/// A 2 s drain deadline with force: the settings of the forced-drain tests.
const FORCED: [(&str, &str); 2] = [("DRAIN_TIMEOUT_SECONDS", "2"), ("DRAIN_FORCE", "true")];

async fn reference_cluster(force_group: bool, nginx_grace: i64) -> Scenario {
    let s = Scenario::start(force_group).await.with_nodes().await;
    fixtures::create_eks_system_workloads(s.server.store()).unwrap();
    s.create(&nginx(4, nginx_grace));
    s.wait_until("the reference pods run on the node", || {
        s.running_pods_on(NODE, "nginx-") == 4
            && s.running_pods_on(NODE, "coredns-") == 1
            && s.running_pods_on(NODE, "aws-node-") == 1
            && s.running_pods_on(NODE, "kube-proxy-") == 1
    })
    .await;
    s.register_other_node();
    s.wait_until("the other node is Ready", || {
        s.server
            .store()
            .find::<Node>("", OTHER_NODE)
            .is_some_and(|n| ready(&n))
    })
    .await;
    s
}

fn evicted_pod_names(s: &Scenario) -> Vec<String> {
    s.server
        .audit()
        .subresource_requests("pods", "eviction")
        .iter()
        .filter(|e| e.user.username == "terminating-hook" && (200..300).contains(&e.code()))
        .map(|e| e.name().to_owned())
        .collect()
}

fn completed_once(s: &Scenario, result: LifecycleActionResult) {
    let completions = s.autoscaling.completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result, result);
    assert_eq!(completions[0].action, action());
}

/// `report`'s one outcome is a completion after the node was drained, and the action was
/// completed once, with CONTINUE.
fn drained_and_completed_once(s: &Scenario, report: &DrainReport) {
    assert!(
        matches!(
            report.outcomes.as_slice(),
            [DeliveryOutcome::Completed {
                drain: DrainEnd::Drained,
                ..
            }]
        ),
        "{:?}",
        report.outcomes
    );
    completed_once(s, LifecycleActionResult::Continue);
}

/// The one outcome of `report`, a completion after a failed drain: its result, the pods left
/// (as reported) and the instance's fate.
fn eviction_failure(report: &DrainReport) -> (LifecycleActionResult, &[String], InstanceFate) {
    let [
        DeliveryOutcome::Completed {
            result,
            drain: DrainEnd::EvictionFailure(stuck),
            instance,
            ..
        },
    ] = report.outcomes.as_slice()
    else {
        panic!("{:?}", report.outcomes)
    };
    (*result, stuck.as_slice(), *instance)
}

#[tokio::test]
async fn reference_scenario_labels_cordons_evicts_nginx_and_coredns_then_completes_once() {
    let s = reference_cluster(false, 30).await;
    let ours: BTreeSet<String> = s
        .pods_on(NODE)
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .filter(|n| n.starts_with("nginx-") || n.starts_with("coredns-"))
        .collect();
    let drainer = s.drainer(&[]);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        matches!(
            report.outcomes.as_slice(),
            [DeliveryOutcome::Completed {
                result: LifecycleActionResult::Continue,
                outcome: CompletionOutcome::Completed,
                drain: DrainEnd::Drained,
                instance: InstanceFate::Terminates,
            }]
        ),
        "{:?}",
        report.outcomes
    );
    completed_once(&s, LifecycleActionResult::Continue);

    // The audit log: label and cordon in the write that claims the drain, before the
    // evictions, of nginx and coredns only (coredns, the critical tier, last).
    let writes: Vec<AuditEvent> = s
        .function_requests()
        .into_iter()
        .filter(|e| matches!(e.verb.as_str(), "patch" | "create" | "delete" | "update"))
        .filter(|e| e.resource() != "events")
        .collect();
    let label = writes
        .iter()
        .position(|e| {
            e.resource() == "nodes"
                && e.request_object.as_ref().is_some_and(|o| {
                    o["metadata"]["labels"][EXCLUDE_FROM_LOAD_BALANCERS_LABEL] == "true"
                })
        })
        .expect("a label patch");
    let cordon = writes
        .iter()
        .position(|e| {
            e.resource() == "nodes"
                && e.request_object
                    .as_ref()
                    .is_some_and(|o| o["spec"]["unschedulable"] == true)
        })
        .expect("a cordon patch");
    let first_eviction = writes
        .iter()
        .position(|e| e.subresource() == "eviction")
        .expect("evictions");
    assert!(label == cordon && cordon < first_eviction, "{writes:#?}");
    assert!(
        writes[label].request_object.as_ref().is_some_and(|o| {
            o["metadata"]["annotations"][CHECKPOINT_ANNOTATION].is_string()
                && o["metadata"]["resourceVersion"].is_string()
        }),
        "the claim (checkpoint, conditional on the resourceVersion) carries the cordon: {:#?}",
        writes[label]
    );
    let evicted = evicted_pod_names(&s);
    let evicted_set: BTreeSet<String> = evicted.iter().cloned().collect();
    assert_eq!(evicted_set, ours, "only nginx and coredns are evicted");
    assert_eq!(evicted.len(), ours.len(), "each once: {evicted:?}");
    assert!(
        evicted.last().unwrap().starts_with("coredns-"),
        "critical pods last: {evicted:?}"
    );
    assert!(
        writes.iter().all(|e| e.verb != "delete"),
        "no deletion without force"
    );

    // The node is excluded, cordoned, and its DaemonSet pods stay.
    let node = s.server.store().find::<Node>("", NODE).unwrap();
    assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(s.running_pods_on(NODE, "aws-node-"), 1);
    assert_eq!(s.running_pods_on(NODE, "kube-proxy-"), 1);
    let checkpoint = s.checkpoint().unwrap();
    assert!(checkpoint.completed_at.is_some());
    assert!(checkpoint.drained_at.is_some());

    // What an operator sees.
    let reasons: BTreeSet<String> = s
        .node_events()
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    for expected in [
        "DrainStarted",
        "Cordoned",
        "Drained",
        "LifecycleActionCompleted",
    ] {
        assert!(
            reasons.contains(expected),
            "{expected} missing from {reasons:?}"
        );
    }
    // One summary on the node instead of an Event per evicted pod.
    assert!(s.events_with_reason("Evicted").is_empty());
    let drained = s.events_with_reason("Drained");
    assert_eq!(drained.len(), 1, "{drained:#?}");
    let note = drained[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("({} evicted by this invocation)", ours.len())),
        "{note}"
    );

    // A late duplicate: Auto Scaling says the action is gone, so nothing is written.
    let before = s.function_requests().len();
    let again = drain_terminating(&drainer, "req-2", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(again.outcomes, [DeliveryOutcome::ActionGone]);
    let after: Vec<AuditEvent> = s.function_requests().into_iter().skip(before).collect();
    assert!(after.iter().all(|e| e.verb == "get"), "{after:#?}");
    completed_once(&s, LifecycleActionResult::Continue);
}

/// The SNS event a hand-over's published message arrives as.
fn event_with_message(message: &str) -> Value {
    let mut event: Value =
        serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    event["Records"][0]["Sns"]["Message"] = json!(message);
    event
}

fn event_with_changed_message(change: impl FnOnce(&mut Value)) -> Value {
    let event = terminating_event();
    let mut message: Value =
        serde_json::from_str(event["Records"][0]["Sns"]["Message"].as_str().unwrap()).unwrap();
    change(&mut message);
    event_with_message(&message.to_string())
}

fn refused_evictions(s: &Scenario, code: u16) -> usize {
    s.server
        .audit()
        .subresource_requests("pods", "eviction")
        .iter()
        .filter(|e| e.user.username == "terminating-hook" && e.code() == code)
        .count()
}

#[tokio::test]
async fn pdb_min_available_holds_the_drain_until_replacements_are_ready() {
    let s = reference_cluster(false, 30).await;
    s.create(&fixtures::pdb_min_available(
        "default",
        "nginx",
        3,
        &[("app", "nginx")],
    ));
    let drainer = s.drainer(&[]);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    drained_and_completed_once(&s, &report);
    assert!(
        refused_evictions(&s, 429) > 0,
        "the budget refused evictions while replacements started"
    );
    let nginx_evicted = evicted_pod_names(&s)
        .iter()
        .filter(|n| n.starts_with("nginx-"))
        .count();
    assert_eq!(nginx_evicted, 4);
    assert_eq!(
        s.running_pods_on(OTHER_NODE, "nginx-"),
        4,
        "replacements run elsewhere"
    );
}

#[tokio::test]
async fn unsatisfiable_pdb_is_reported_at_the_deadline_and_the_action_completed() {
    let s = blocked_cluster(false).await;
    let drainer = s.drainer(&[("DRAIN_TIMEOUT_SECONDS", "2")]);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    let (result, stuck, _) = eviction_failure(&report);
    assert_eq!(result, LifecycleActionResult::Continue);
    // The nginx pods, refused by the budget, and coredns, which waits for them (critical tier).
    assert_eq!(stuck.len(), 5, "{stuck:?}");
    let nginx: Vec<&String> = stuck
        .iter()
        .filter(|p| p.starts_with("default/nginx-"))
        .collect();
    assert_eq!(nginx.len(), 4, "{stuck:?}");
    assert!(
        nginx
            .iter()
            .all(|p| p.contains("(PodDisruptionBudget nginx-strict)")),
        "{stuck:?}"
    );
    assert!(
        stuck
            .iter()
            .any(|p| p.starts_with("kube-system/coredns-") && p.contains("not evicted yet"))
    );
    completed_once(&s, LifecycleActionResult::Continue);
    let failure = s.events_with_reason("PodEvictionFailure");
    assert_eq!(failure.len(), 1);
    let note = failure[0].note.clone().unwrap();
    assert!(
        note.contains("nginx-strict") && note.contains("default/nginx-"),
        "{note}"
    );
    assert_eq!(failure[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        s.running_pods_on(NODE, "nginx-"),
        4,
        "nothing deleted without force"
    );
    assert!(s.function_requests().iter().all(|e| e.verb != "delete"));
}

#[tokio::test]
async fn unsatisfiable_pdb_with_force_deletes_the_pods_at_the_deadline() {
    let s = blocked_cluster(true).await;
    let drainer = s.drainer(&FORCED);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    let [
        DeliveryOutcome::Completed {
            drain: DrainEnd::Forced(deleted),
            ..
        },
    ] = report.outcomes.as_slice()
    else {
        panic!("{:?}", report.outcomes)
    };
    // The refused nginx pods and coredns, which never got its turn.
    assert_eq!(deleted.len(), 5, "{deleted:?}");
    completed_once(&s, LifecycleActionResult::Continue);
    let deletes: Vec<AuditEvent> = s
        .function_requests()
        .into_iter()
        .filter(|e| e.verb == "delete" && e.resource() == "pods")
        .collect();
    assert_eq!(deletes.len(), 5);
    assert!(deletes.iter().all(|e| (200..300).contains(&e.code())));
    assert_eq!(
        deletes
            .iter()
            .filter(|e| e.name().starts_with("nginx-"))
            .count(),
        4
    );
    assert_eq!(s.events_with_reason("DrainForced").len(), 1);
}

#[tokio::test]
async fn forced_deletions_are_retried_and_never_given_up_on_with_pods_running() {
    let s = blocked_cluster(true).await;
    let settings = FORCED;

    // Two dropped connections: retried within the invocation.
    let flaky = s.server.faults().add(
        FaultRule::new(FaultAction::DropConnection)
            .verb("delete")
            .resource("pods")
            .times(2),
    );
    let drainer = s.drainer(&settings);
    let first = drain_terminating(&drainer, "req-1", Duration::from_secs(60)).await;
    let Ok(report) = first else {
        panic!("{first:?}")
    };
    assert!(
        matches!(
            report.outcomes.as_slice(),
            [DeliveryOutcome::Completed {
                drain: DrainEnd::Forced(deleted),
                ..
            }] if deleted.len() == 5
        ),
        "{:?}",
        report.outcomes
    );
    s.server.faults().remove(flaky);
    completed_once(&s, LifecycleActionResult::Continue);
    let dropped = s
        .function_requests()
        .into_iter()
        .filter(|e| e.verb == "delete" && e.injected_fault.is_some())
        .count();
    assert_eq!(dropped, 2, "the faults were hit");
}

#[tokio::test]
async fn a_forced_drain_whose_deletions_keep_failing_is_retried_not_completed() {
    let s = blocked_cluster(true).await;
    let settings = FORCED;
    let outage = s.server.faults().add(
        FaultRule::new(FaultAction::ServiceUnavailable)
            .verb("delete")
            .resource("pods"),
    );
    let drainer = s.drainer(&settings);
    let failed = drain_terminating(&drainer, "req-1", Duration::from_secs(60)).await;
    assert!(
        matches!(&failed, Err(DrainError::ForceIncomplete { pods, .. }) if pods.len() == 5),
        "{failed:?}"
    );
    assert!(
        s.autoscaling.completions().is_empty(),
        "not completed while the pods still run"
    );

    // The redelivery (another invocation) arrives after the deadline, finds the pods on
    // the node once its watch has listed them, and deletes them.
    s.server.faults().remove(outage);
    let report = drain_terminating(&drainer, "req-2", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        matches!(
            report.outcomes.as_slice(),
            [DeliveryOutcome::Completed {
                drain: DrainEnd::Forced(deleted),
                ..
            }] if deleted.len() == 5
        ),
        "{:?}",
        report.outcomes
    );
    completed_once(&s, LifecycleActionResult::Continue);
    assert_eq!(s.running_pods_on(NODE, "nginx-"), 0);
}

#[tokio::test]
async fn two_pdbs_on_one_pod_are_reported_not_a_crash() {
    let s = reference_cluster(false, 30).await;
    s.create(&fixtures::pdb_min_available(
        "default",
        "nginx-a",
        1,
        &[("app", "nginx")],
    ));
    s.create(&fixtures::pdb_min_available(
        "default",
        "nginx-b",
        1,
        &[("app", "nginx")],
    ));
    let drainer = s.drainer(&[("DRAIN_TIMEOUT_SECONDS", "2")]);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    let (_, stuck, _) = eviction_failure(&report);
    let nginx: Vec<&String> = stuck
        .iter()
        .filter(|p| p.starts_with("default/nginx-"))
        .collect();
    assert_eq!(nginx.len(), 4, "{stuck:?}");
    assert!(
        nginx
            .iter()
            .all(|p| p.contains("PodDisruptionBudgets nginx-a, nginx-b")),
        "{stuck:?}"
    );
    assert!(refused_evictions(&s, 500) > 0);
    let blocked = s.events_with_reason("EvictionBlocked");
    assert_eq!(blocked.len(), 4, "one report per pod, not per retry");
    assert!(
        blocked[0]
            .note
            .as_deref()
            .unwrap()
            .contains("nginx-a, nginx-b")
    );
    completed_once(&s, LifecycleActionResult::Continue);
}

#[tokio::test]
async fn a_drain_longer_than_an_invocation_is_handed_over_and_completed_once() {
    // 200 s grace periods last 2 s in the fake cluster; each invocation gets 1.3 s, just
    // over the minimum working slice (an invocation with less fails instead of working).
    let s = reference_cluster(false, 200).await;
    s.create(&fixtures::pdb_min_available(
        "default",
        "nginx",
        3,
        &[("app", "nginx")],
    ));
    let drainer = s.drainer(&[("SETTLE_SECONDS", "0.5")]);
    let mut event = terminating_event();
    let mut deadline = None;
    let mut handed_over = 0;
    let mut completed = 0;
    for i in 0..60 {
        let report = drainer
            .handle_invocation(
                event.clone(),
                &invocation(&format!("req-{i}"), Duration::from_millis(1300)),
            )
            .await
            .unwrap();
        let checkpoint = s.checkpoint().unwrap();
        match deadline {
            None => deadline = Some((checkpoint.started_at, checkpoint.deadline)),
            Some(kept) => assert_eq!(
                kept,
                (checkpoint.started_at, checkpoint.deadline),
                "original deadline kept"
            ),
        }
        match report.outcomes.as_slice() {
            [DeliveryOutcome::HandedOver { continuation }] => {
                handed_over += 1;
                assert_eq!(*continuation, handed_over);
                assert_eq!(checkpoint.continuations, handed_over);
                let published = s.notifications.drain();
                assert_eq!(published.len(), 1, "exactly one continuation published");
                assert_eq!(
                    published[0].topic_arn,
                    "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic"
                );
                event = event_with_message(&published[0].message);
            }
            [
                DeliveryOutcome::Completed {
                    drain: DrainEnd::Drained,
                    ..
                },
            ] => {
                completed += 1;
                break;
            }
            other => panic!("invocation {i}: {other:?}"),
        }
    }
    assert_eq!(completed, 1);
    assert!(
        handed_over >= 2,
        "the drain needed several invocations: {handed_over}"
    );
    completed_once(&s, LifecycleActionResult::Continue);
    assert!(
        s.autoscaling.heartbeats().len() >= handed_over as usize,
        "heartbeats kept the action alive"
    );
    assert!(s.notifications.published().is_empty());
    assert_eq!(
        s.events_with_reason("DrainStarted").len(),
        1,
        "one drain, resumed"
    );
    let nginx_evicted = evicted_pod_names(&s)
        .iter()
        .filter(|n| n.starts_with("nginx-"))
        .count();
    assert_eq!(nginx_evicted, 4, "no pod evicted twice across invocations");
}

#[tokio::test]
async fn three_concurrent_deliveries_make_one_drain_and_one_completion() {
    let s = reference_cluster(false, 30).await;
    let drainer = s.drainer(&[]);
    let event = terminating_event();
    let (ia, ib, ic) = (
        invocation("req-a", Duration::from_secs(60)),
        invocation("req-b", Duration::from_secs(60)),
        invocation("req-c", Duration::from_secs(60)),
    );
    let (a, b, c) = tokio::join!(
        drainer.handle_invocation(event.clone(), &ia),
        drainer.handle_invocation(event.clone(), &ib),
        drainer.handle_invocation(event.clone(), &ic),
    );
    let outcomes: Vec<DeliveryOutcome> = [a, b, c]
        .into_iter()
        .flat_map(|r| r.unwrap().outcomes)
        .collect();
    let completions = outcomes
        .iter()
        .filter(|o| matches!(o, DeliveryOutcome::Completed { .. }))
        .count();
    assert_eq!(completions, 1, "{outcomes:?}");
    // The others wait for the holder's lease, heartbeating meanwhile: they exit as
    // duplicates, or learn from Auto Scaling that the action was completed (ActionGone).
    assert!(
        outcomes.iter().all(|o| matches!(
            o,
            DeliveryOutcome::Completed { .. }
                | DeliveryOutcome::Duplicate { .. }
                | DeliveryOutcome::AlreadyCompleted
                | DeliveryOutcome::ActionGone
        )),
        "{outcomes:?}"
    );
    completed_once(&s, LifecycleActionResult::Continue);
    assert_eq!(s.events_with_reason("DrainStarted").len(), 1);
    let evicted = evicted_pod_names(&s);
    let unique: BTreeSet<&String> = evicted.iter().collect();
    assert_eq!(
        unique.len(),
        evicted.len(),
        "no pod evicted twice: {evicted:?}"
    );
    let evictors: BTreeSet<String> = s
        .server
        .audit()
        .subresource_requests("pods", "eviction")
        .iter()
        .map(|e| e.user_agent.clone())
        .collect();
    assert!(!evictors.is_empty());
}

#[tokio::test]
async fn missing_node_completes_at_once_without_kubernetes_writes() {
    let s = Scenario::start(false).await;
    let report = s
        .drainer(&[])
        .handle_invocation(
            terminating_event(),
            &invocation("req-1", Duration::from_secs(60)),
        )
        .await
        .unwrap();
    assert_eq!(
        report.outcomes,
        [DeliveryOutcome::NoNode(CompletionOutcome::Completed)]
    );
    completed_once(&s, LifecycleActionResult::Continue);
    assert!(
        s.function_requests()
            .iter()
            .all(|e| matches!(e.verb.as_str(), "get" | "list"))
    );
}

#[tokio::test]
async fn expired_lifecycle_action_is_not_an_error() {
    // No node: the completion finds no active action, which means done.
    let s = Scenario::start(false).await;
    let expired = InMemoryAutoScaling::new();
    expired.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
    expired.add_hook(
        GROUP,
        LifecycleHook {
            name: HOOK.into(),
            transition: "autoscaling:EC2_INSTANCE_TERMINATING".into(),
            heartbeat_timeout: Duration::from_millis(400),
            global_timeout: Duration::from_secs(3600),
            default_result: LifecycleActionResult::Continue,
        },
    );
    let mut drainer = s.drainer(&[]);
    drainer.context.autoscaling = expired.clone();
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        report.outcomes,
        [DeliveryOutcome::NoNode(CompletionOutcome::NoActiveAction)]
    );
    assert!(expired.completions().is_empty());

    // A node with pods: the first heartbeat learns the action is gone before anything is
    // written, so the node is neither claimed nor cordoned nor drained.
    let s = reference_cluster(false, 100).await;
    let mut drainer = s.drainer(&[]);
    drainer.context.autoscaling = expired.clone();
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(report.outcomes, [DeliveryOutcome::ActionGone]);
    assert!(expired.completions().is_empty());
    assert!(s.checkpoint().is_none(), "no drain checkpoint was written");
    let writes: Vec<AuditEvent> = s
        .function_requests()
        .into_iter()
        .filter(|e| !matches!(e.verb.as_str(), "get" | "list" | "watch"))
        .collect();
    assert!(writes.is_empty(), "{writes:#?}");
}

#[tokio::test]
async fn foreign_group_test_notification_unknown_transition_and_malformed_input() {
    let s = Scenario::start(false).await.with_nodes().await;
    let drainer = s.drainer(&[]);
    let run = |event: Value| {
        let drainer = &drainer;
        async move {
            drainer
                .handle_invocation(event, &invocation("req-1", Duration::from_secs(60)))
                .await
        }
    };

    let foreign = run(event_with_changed_message(|m| {
        m["AutoScalingGroupName"] = json!("other-cluster-ng")
    }))
    .await;
    s.autoscaling
        .add_group("other-cluster-ng", &[("eks:cluster-name", "someone-else")]);
    let foreign_again = run(event_with_changed_message(|m| {
        m["AutoScalingGroupName"] = json!("other-cluster-ng")
    }))
    .await;
    assert!(matches!(
        foreign.unwrap().outcomes.as_slice(),
        [DeliveryOutcome::Foreign(_)]
    ));
    assert!(matches!(
        foreign_again.unwrap().outcomes.as_slice(),
        [DeliveryOutcome::Foreign(_)]
    ));

    let test_event: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/sns-test-notification.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        run(test_event).await.unwrap().outcomes,
        [DeliveryOutcome::TestNotification]
    );

    // A launch notification (with a launch's route: a launch "from the group to EC2" is
    // refused as malformed) reaches the terminating hook: acknowledged, nothing done.
    let launch = run(event_with_changed_message(|m| {
        m["LifecycleTransition"] = json!("autoscaling:EC2_INSTANCE_LAUNCHING");
        m["Origin"] = json!("EC2");
        m["Destination"] = json!("AutoScalingGroup");
    }))
    .await
    .unwrap();
    assert!(
        matches!(launch.outcomes.as_slice(), [DeliveryOutcome::OtherTransition(t)] if t.contains("LAUNCHING"))
    );
    let unknown = run(event_with_changed_message(|m| {
        m["LifecycleTransition"] = json!("autoscaling:EC2_INSTANCE_HIBERNATING")
    }))
    .await
    .unwrap();
    assert!(matches!(
        unknown.outcomes.as_slice(),
        [DeliveryOutcome::OtherTransition(_)]
    ));

    let malformed = run(event_with_message("this is not JSON"))
        .await
        .unwrap_err();
    assert!(malformed.to_string().contains("Sns.Message"), "{malformed}");
    let missing_token = run(event_with_changed_message(|m| {
        m.as_object_mut().unwrap().remove("LifecycleActionToken");
    }))
    .await
    .unwrap_err();
    assert!(
        missing_token.to_string().contains("LifecycleActionToken"),
        "{missing_token}"
    );

    // None of it touched the cluster or Auto Scaling.
    assert!(
        s.function_requests().is_empty(),
        "{:?}",
        s.function_requests()
    );
    assert!(s.autoscaling.completions().is_empty());
    assert!(s.autoscaling.is_pending(&action()));
}

#[tokio::test]
async fn a_heartbeat_that_proves_nothing_fails_the_invocation_and_writes_nothing() {
    // Denied, then throttled past the retries: neither says the action is pending, so the
    // node must not be claimed, cordoned or drained, and the action not completed.
    let s = reference_cluster(false, 100).await;
    let drainer = s.drainer(&[]);
    for (kind, times) in [
        (node_manager::aws::AwsErrorKind::AccessDenied, 1),
        (
            node_manager::aws::AwsErrorKind::Transient,
            usize::try_from(node_manager::retry::RetryPolicy::AWS_CALL.max_attempts).unwrap(),
        ),
    ] {
        s.autoscaling
            .faults
            .fail("RecordLifecycleActionHeartbeat", kind, times);
        let failed = drainer
            .handle_invocation(
                terminating_event(),
                &invocation("req-1", Duration::from_secs(60)),
            )
            .await;
        assert!(
            matches!(&failed, Err(DrainError::ActionUnproven { source, .. }) if source.kind == kind),
            "{failed:?}"
        );
        assert!(
            failed
                .unwrap_err()
                .to_string()
                .contains("cannot prove the lifecycle action"),
        );
    }
    assert!(s.autoscaling.completions().is_empty());
    assert!(s.autoscaling.is_pending(&action()));
    assert!(s.checkpoint().is_none(), "no drain checkpoint was written");
    let writes: Vec<AuditEvent> = s
        .function_requests()
        .into_iter()
        .filter(|e| !matches!(e.verb.as_str(), "get" | "list" | "watch"))
        .collect();
    assert!(writes.is_empty(), "{writes:#?}");
    assert_eq!(s.running_pods_on(NODE, "nginx-"), 4);
}

/// The hook of `group` with `heartbeat_timeout`.
fn terminating_hook(heartbeat_timeout: Duration) -> LifecycleHook {
    LifecycleHook {
        name: HOOK.into(),
        transition: "autoscaling:EC2_INSTANCE_TERMINATING".into(),
        heartbeat_timeout,
        global_timeout: Duration::from_secs(3600),
        default_result: LifecycleActionResult::Continue,
    }
}

#[tokio::test]
async fn hook_timings_and_group_scope_are_read_again_for_a_new_action() {
    const LATE_GROUP: &str = "late-tagged-ng";
    const NODELESS: &str = "i-0000000000000dead";
    let s = Scenario::start(false).await.with_nodes().await;
    s.autoscaling
        .add_hook(GROUP, terminating_hook(Duration::from_secs(4)));
    s.autoscaling.add_group(LATE_GROUP, &[("team", "a")]);
    s.autoscaling
        .add_hook(LATE_GROUP, terminating_hook(Duration::from_secs(4)));
    // One execution environment for every action below.
    let drainer = s.drainer(&[("SETTLE_SECONDS", "1")]);
    let run = |event: Value| {
        let drainer = &drainer;
        async move {
            drainer
                .handle_invocation(event, &invocation("req-1", Duration::from_secs(60)))
                .await
                .unwrap()
                .outcomes
        }
    };
    let nodeless_action = |group: &str, token: &str| {
        let action = LifecycleActionRef {
            auto_scaling_group_name: group.into(),
            lifecycle_hook_name: HOOK.into(),
            instance_id: NODELESS.into(),
            token: token.into(),
        };
        s.autoscaling.start_action(&action);
        let (group, token) = (group.to_owned(), token.to_owned());
        event_with_changed_message(move |m| {
            m["AutoScalingGroupName"] = json!(group);
            m["EC2InstanceId"] = json!(NODELESS);
            m["LifecycleActionToken"] = json!(token);
        })
    };

    // First actions: the hook's timings (4 s) are read; the untagged group is foreign.
    assert!(matches!(
        run(nodeless_action(GROUP, "token-first")).await.as_slice(),
        [DeliveryOutcome::NoNode(CompletionOutcome::Completed)]
    ));
    assert!(matches!(
        run(nodeless_action(LATE_GROUP, "token-late-first"))
            .await
            .as_slice(),
        [DeliveryOutcome::Foreign(_)]
    ));

    // The operator lowers the heartbeat timeout and tags the group.
    s.autoscaling
        .add_hook(GROUP, terminating_hook(Duration::from_millis(200)));
    s.autoscaling
        .add_group(LATE_GROUP, &[("eks:cluster-name", CLUSTER)]);

    // The next action is paced by the new timeout: a drain of about a second (the settle
    // period) heartbeats every 100 ms, not once every 2 s.
    let outcomes = run(terminating_event()).await;
    assert!(
        matches!(outcomes.as_slice(), [DeliveryOutcome::Completed { .. }]),
        "{outcomes:?}"
    );
    let beats = s
        .autoscaling
        .heartbeats()
        .iter()
        .filter(|a| a.token == TOKEN)
        .count();
    assert!(beats >= 5, "{beats} heartbeat(s) in a 1 s drain");
    // The group's next action is in scope.
    let outcomes = run(nodeless_action(LATE_GROUP, "token-late-second")).await;
    assert!(
        matches!(
            outcomes.as_slice(),
            [DeliveryOutcome::NoNode(CompletionOutcome::Completed)]
        ),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn a_forced_drain_says_which_deletions_were_refused() {
    // The role lacks the force-delete group: every DELETE is refused (403).
    let s = blocked_cluster(false).await;
    let drainer = s.drainer(&FORCED);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    let [
        DeliveryOutcome::Completed {
            drain: DrainEnd::ForceRefused { deleted, refused },
            ..
        },
    ] = report.outcomes.as_slice()
    else {
        panic!("{:?}", report.outcomes)
    };
    assert!(deleted.is_empty(), "{deleted:?}");
    assert_eq!(refused.len(), 5, "{refused:?}");
    assert_eq!(report.records[0].outcome, "Completed");
    assert!(report.records[0].summary.contains("ForceRefused"));
    assert_eq!(s.running_pods_on(NODE, "nginx-"), 4, "they still run");
    completed_once(&s, LifecycleActionResult::Continue);
}

#[tokio::test]
async fn a_forced_drain_waits_for_its_deletions_and_says_which_still_terminate() {
    let s = blocked_cluster(true).await;
    // A 30 s grace period (scaled to 0.3 s) fits the invocation: waited for, then Forced.
    let drainer = s.drainer(&FORCED);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        matches!(
            report.outcomes.as_slice(),
            [DeliveryOutcome::Completed { drain: DrainEnd::Forced(deleted), .. }] if deleted.len() == 5
        ),
        "{:?}",
        report.outcomes
    );
    assert!(
        s.pods_on(NODE).iter().all(|p| !p
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .starts_with("nginx-")),
        "completed only once the forced pods were gone"
    );

    // A 3000 s grace period (30 s scaled) does not fit a 4 s invocation: still terminating.
    let s = blocked_cluster(true).await;
    let drainer = s.drainer(&[FORCED[0], FORCED[1], ("POD_GRACE_PERIOD_SECONDS", "3000")]);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(4))
        .await
        .unwrap();
    let [
        DeliveryOutcome::Completed {
            drain:
                DrainEnd::ForcedStillTerminating {
                    deleted,
                    terminating,
                },
            ..
        },
    ] = report.outcomes.as_slice()
    else {
        panic!("{:?}", report.outcomes)
    };
    assert_eq!(deleted.len(), 5, "{deleted:?}");
    assert_eq!(terminating, deleted);
    completed_once(&s, LifecycleActionResult::Continue);
}
