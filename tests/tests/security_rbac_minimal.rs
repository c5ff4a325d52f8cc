//! RBAC is minimal, grant by grant and function by function: the shipped `infra/rbac.yaml`
//! is split into single grants (one role, API group, resource and verb), and for each one a
//! manifest without just that grant is loaded into fresh fake API servers and the end-to-end
//! flows of the functions that hold the role run as those functions' own identities (drain,
//! forced drain, PDB-paced drain, drain waiting for volumes, launch, aws-auth update, aws-auth creation, node repair,
//! in process with the real handlers). At least one of them must break: a 403 in the audit
//! log AND the flow's effect missing (or the function reporting an error). Another
//! function's flow never counts, so a verb one function needs cannot excuse the same verb in
//! another function's role. With the full manifest every flow succeeds without a single 403,
//! so the check has teeth in both directions.
//!
//! A grant the code does not need would survive its removal; the test then fails and names
//! it, unless it is listed in [`TOLERATED`] with the reason it is kept anyway.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use node_manager::aws::in_memory::InMemoryAutoScaling;
use node_manager::aws::in_memory::{InMemoryEks, InMemoryInstances, InMemoryNotifications};
use node_manager::aws::{
    AuthenticationMode, ClusterDescription, LifecycleActionResult, LifecycleHook,
    NodegroupDescription,
};
use node_manager::drain::{
    DeliveryOutcome, DrainEnd, DrainError, DrainReport, Drainer, Invocation,
};
use node_manager::launch::Launcher;
use node_manager::lifecycle::budget::InvocationBudget;
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::{DrainSettings, LaunchSettings};
use node_manager::nodegroup_auth::handler::NodegroupAuth;
use node_manager::nodegroup_auth::kube_store::KubeAwsAuthStore;
use node_manager::nodegroup_auth::settings::NodegroupAuthSettings;
use node_manager::retry::RetryPolicy;
use node_manager::settings::ClusterScope;
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use node_manager_testkit::soak::corpus;
use node_manager_testkit::{fixtures, identity};
use serde_json::{Value, json};

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-rbac-ng";
const INSTANCE: &str = "i-07e9ea9eb19a67337";
const NODE: &str = "ip-192-168-12-34.eu-west-1.compute.internal";
const OTHER_NODE: &str = "ip-192-168-77-8.eu-west-1.compute.internal";
const LAUNCH_INSTANCE: &str = "i-0a1b2c3d4e5f60718";
const LAUNCH_NODE: &str = "ip-10-0-7-24.eu-west-1.compute.internal";
const NODE_ROLE: &str = "arn:aws:iam::111111111111:role/demo-ng-node-role";

/// Grants (as labelled by [`grants`]) kept although no flow of their own function breaks
/// without them yet, and why: each is called on a path of that function these flows do not
/// take. A flow that takes the path replaces the entry. (Another function's need never
/// excuses a grant: that is what this list used to hide, e.g. `watch nodes` of the
/// terminating hook, which the launching hook needs and the drain never calls.)
const TOLERATED: &[(&str, &str)] = &[
    (
        "ClusterRole open-node-manager-terminating-hook: list nodes (API group \"\")",
        "find_node (lifecycle/node.rs) pages through the nodes by providerID when no node has the instance's private DNS name; the flows' nodes are named after it",
    ),
    (
        "ClusterRole open-node-manager-terminating-hook: get pods (API group \"\")",
        "budgets_of (drain/eviction_round.rs) reads a refused pod's labels to name its budgets when more than one PodDisruptionBudget selects it; no flow has such a pod",
    ),
    (
        "ClusterRole open-node-manager-terminating-hook: patch events (API group \"events.k8s.io\")",
        "the Event recorder counts a repeated Event into a series by patching it; no flow repeats an Event",
    ),
    (
        "ClusterRole open-node-manager-launching-hook: get nodes (API group \"\")",
        "the warm-pool return (launch/warm_pool.rs) re-reads the node after a conflicting undo patch; the launch flow is a plain launch",
    ),
    (
        "ClusterRole open-node-manager-launching-hook: watch nodes (API group \"\")",
        "the readiness wait (launch/readiness.rs) watches after its list; in the launch flow the node is often Ready by the list, and the watcher re-lists on a refused watch",
    ),
    (
        "ClusterRole open-node-manager-launching-hook: patch nodes (API group \"\")",
        "the warm-pool return (launch/warm_pool.rs) undoes our drain's marks with one merge patch; the launch flow is a plain launch",
    ),
    (
        "ClusterRole open-node-manager-launching-hook: patch events (API group \"events.k8s.io\")",
        "the Event recorder counts a repeated Event into a series by patching it; no flow repeats an Event",
    ),
    (
        "Role open-node-manager-nodegroup-auth: patch events (API group \"events.k8s.io\")",
        "the Event recorder counts a repeated Event into a series by patching it; no flow repeats an Event",
    ),
    (
        "ClusterRole open-node-manager-node-repair: patch events (API group \"events.k8s.io\")",
        "the Event recorder counts a repeated Event into a series by patching it; no flow repeats an Event",
    ),
];

/// The shipped manifest's documents.
fn shipped() -> Vec<Value> {
    let text = std::fs::read_to_string(corpus::repository_root().join("infra/rbac.yaml")).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

/// One grant of a role: a single verb on a single resource of a single API group (with the
/// rule's resource names, if any).
struct Grant {
    document: usize,
    rule: usize,
    role: String,
    api_group: String,
    resource: String,
    verb: String,
    label: String,
}

/// A rule's (API group, resource, verb) triples.
fn triples(rule: &Value) -> Vec<(String, String, String)> {
    let strings = |key: &str| -> Vec<String> {
        rule[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let mut out = Vec::new();
    for group in strings("apiGroups") {
        for resource in strings("resources") {
            for verb in strings("verbs") {
                out.push((group.clone(), resource.clone(), verb));
            }
        }
    }
    out
}

/// Every single grant of every ClusterRole and Role.
fn grants(documents: &[Value]) -> Vec<Grant> {
    let mut out = Vec::new();
    for (d, doc) in documents.iter().enumerate() {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if kind != "ClusterRole" && kind != "Role" {
            continue;
        }
        let role = doc["metadata"]["name"].as_str().unwrap_or_default();
        for (r, rule) in doc["rules"].as_array().into_iter().flatten().enumerate() {
            for (api_group, resource, verb) in triples(rule) {
                out.push(Grant {
                    document: d,
                    rule: r,
                    role: role.to_owned(),
                    label: format!("{kind} {role}: {verb} {resource} (API group {api_group:?})"),
                    api_group,
                    resource,
                    verb,
                });
            }
        }
    }
    out
}

/// `documents` without `grant`: its rule is split into one rule per remaining triple (same
/// resource names), everything else as shipped.
fn without(documents: &[Value], grant: &Grant) -> Vec<Value> {
    let mut mutated = documents.to_vec();
    let rules = mutated[grant.document]["rules"].as_array_mut().unwrap();
    let rule = rules.remove(grant.rule);
    for (api_group, resource, verb) in triples(&rule) {
        if (&api_group, &resource, &verb) == (&grant.api_group, &grant.resource, &grant.verb) {
            continue;
        }
        let mut single = rule.clone();
        single["apiGroups"] = json!([api_group]);
        single["resources"] = json!([resource]);
        single["verbs"] = json!([verb]);
        rules.push(single);
    }
    mutated
}

/// The groups the manifest binds `role` to.
fn holders(documents: &[Value], role: &str) -> Vec<String> {
    documents
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ClusterRoleBinding" | "RoleBinding")
            ) && d["roleRef"]["name"].as_str() == Some(role)
        })
        .flat_map(|d| d["subjects"].as_array().cloned().unwrap_or_default())
        .filter(|s| s["kind"].as_str() == Some("Group"))
        .filter_map(|s| s["name"].as_str().map(str::to_owned))
        .collect()
}

/// The end-to-end flows, each run as one function's identity (its user and groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Drain,
    ForcedDrain,
    PacedDrain,
    VolumeDrain,
    Launch,
    AwsAuthUpdate,
    AwsAuthCreation,
    Repair,
    Refresh,
}

impl Flow {
    const ALL: [Flow; 9] = [
        Flow::Drain,
        Flow::ForcedDrain,
        Flow::PacedDrain,
        Flow::VolumeDrain,
        Flow::Launch,
        Flow::AwsAuthUpdate,
        Flow::AwsAuthCreation,
        Flow::Repair,
        Flow::Refresh,
    ];

    /// The Kubernetes groups of the identity the flow runs as.
    fn groups(self) -> &'static [&'static str] {
        match self {
            Flow::Drain | Flow::PacedDrain | Flow::VolumeDrain => {
                &["open-node-manager:terminating-hook"]
            }
            Flow::ForcedDrain => &[
                "open-node-manager:terminating-hook",
                "open-node-manager:force-delete",
            ],
            Flow::Launch => &["open-node-manager:launching-hook"],
            Flow::AwsAuthUpdate | Flow::AwsAuthCreation => &["open-node-manager:nodegroup-auth"],
            Flow::Repair => &["open-node-manager:node-repair"],
            Flow::Refresh => &["open-node-manager:instance-refresh"],
        }
    }

    /// Whether the flow's identity holds one of `groups`.
    fn runs_as_one_of(self, groups: &[String]) -> bool {
        self.groups().iter().any(|g| groups.iter().any(|h| h == g))
    }

    async fn run(self, documents: &[Value]) -> FlowResult {
        match self {
            Flow::Drain => drain_flow(documents, false).await,
            Flow::ForcedDrain => drain_flow(documents, true).await,
            Flow::PacedDrain => paced_drain_flow(documents).await,
            Flow::VolumeDrain => volume_drain_flow(documents).await,
            Flow::Launch => launch_flow(documents).await,
            Flow::AwsAuthUpdate => aws_auth_flow(documents, true).await,
            Flow::AwsAuthCreation => aws_auth_flow(documents, false).await,
            Flow::Repair => repair_flow(documents).await,
            Flow::Refresh => refresh_flow(documents).await,
        }
    }
}

/// `flows`, concurrently (each on its own fake API server).
async fn run_flows(flows: &[Flow], documents: &[Value]) -> Vec<FlowResult> {
    futures::future::join_all(flows.iter().map(|f| f.run(documents))).await
}

fn hook(name: &str, transition: &str) -> LifecycleHook {
    fixtures::lifecycle_hook(name, transition, Duration::from_secs(300))
}

/// A fresh cluster authorizing with `documents`; two Ready nodes.
async fn cluster(documents: &[Value]) -> FakeApiServer {
    cluster_with_pod_start(documents, Duration::from_millis(20)).await
}

/// [`cluster`] whose scheduled pods are Ready after `pod_start`.
async fn cluster_with_pod_start(documents: &[Value], pod_start: Duration) -> FakeApiServer {
    cluster_with(
        documents,
        SimulationTimings {
            grace_period_scale: 0.002,
            pod_start_delay: pod_start,
            node_ready_after: Duration::ZERO,
            ..SimulationTimings::default()
        },
    )
    .await
}

/// [`cluster`] moving at `timings`.
async fn cluster_with(documents: &[Value], timings: SimulationTimings) -> FakeApiServer {
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .simulation(timings)
        .start()
        .await
        .unwrap();
    for doc in documents {
        server.store().apply_value(doc.clone()).unwrap();
    }
    for (node, instance) in [(NODE, INSTANCE), (OTHER_NODE, "i-0aaaabbbbccccdddd")] {
        server
            .register_node(
                node,
                &format!("aws:///eu-west-1a/{instance}"),
                Some(Duration::ZERO),
            )
            .unwrap();
    }
    server
        .wait_for("nodes Ready", Duration::from_secs(5), |s| {
            s.list::<Node>().len() == 2
                && s.list::<Node>().iter().all(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
        })
        .await
        .unwrap();
    server
}

async fn client(server: &FakeApiServer, user: &str, groups: &[&str]) -> kube::Client {
    identity::client_as(server, user, groups).await.unwrap()
}

fn forbidden(server: &FakeApiServer, user: &str) -> Vec<String> {
    server
        .audit()
        .filter(|e| e.user.username == user && e.code() == 403)
        .iter()
        .map(|e| e.line())
        .collect()
}

fn events_in(server: &FakeApiServer, namespace: &str) -> bool {
    server
        .store()
        .list::<k8s_openapi::api::events::v1::Event>()
        .iter()
        .any(|e| e.metadata.namespace.as_deref() == Some(namespace))
}

/// What a flow found: whether its effect happened, and the 403s it met.
struct FlowResult {
    name: &'static str,
    effect: bool,
    forbidden: Vec<String>,
}

/// One invocation of the terminating hook, as `flow`'s identity, for a fresh pending
/// terminating action (`token`) of the instance behind NODE, with `settings` (the cluster's
/// name added); the answer and the Auto Scaling the action was completed at.
async fn drain_as(
    server: &FakeApiServer,
    flow: Flow,
    token: &str,
    settings: &[(&str, &str)],
) -> (Result<DrainReport, DrainError>, InMemoryAutoScaling) {
    let client = client(server, "terminating-hook", flow.groups()).await;
    let (autoscaling, action) = fixtures::group_with_pending_action(
        CLUSTER,
        GROUP,
        hook("Terminate-LC-Hook", "autoscaling:EC2_INSTANCE_TERMINATING"),
        INSTANCE,
        token,
    );
    let instances = InMemoryInstances::default();
    instances.add(INSTANCE, NODE);
    let settings = [("CLUSTER_NAME", CLUSTER)]
        .iter()
        .chain(settings)
        .copied()
        .collect::<Vec<_>>();
    let settings = DrainSettings::from_source(settings.as_slice()).unwrap();
    let drainer = Drainer::new(
        client,
        autoscaling.clone(),
        instances,
        InMemoryNotifications::default(),
        settings,
    );
    let invocation = Invocation {
        request_id: format!("rbac-{flow:?}"),
        function_account: Some("111111111111".into()),
        budget: InvocationBudget::new(Duration::from_secs(8), Duration::ZERO),
    };
    let result = drainer
        .handle_invocation(
            fixtures::lifecycle_notification(corpus::Target::TerminatingHook, &action),
            &invocation,
        )
        .await;
    (result, autoscaling)
}

/// Drain of a node with one ReplicaSet pod (with `force`: behind a PDB that allows nothing,
/// so only the force DELETE at the deadline empties the node).
async fn drain_flow(documents: &[Value], force: bool) -> FlowResult {
    let server = cluster(documents).await;
    // Two replicas over two nodes (the scheduler spreads them): one runs on NODE.
    let mut yaml = String::from(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers: [{name: web, image: nginx}]\n",
    );
    if force {
        yaml.push_str("---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: default}\nspec:\n  minAvailable: 2\n  selector: {matchLabels: {app: web}}\n");
    }
    server.store().apply_yaml(&yaml).unwrap();
    server
        .wait_for("a pod runs on the node", Duration::from_secs(5), |s| {
            s.list::<Pod>()
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count()
                == 2
                && s.list::<Pod>()
                    .iter()
                    .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE))
        })
        .await
        .unwrap();
    let before: Vec<String> = server
        .store()
        .list::<Pod>()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let flow = if force {
        Flow::ForcedDrain
    } else {
        Flow::Drain
    };
    let force_setting = if force { "true" } else { "false" };
    let (result, autoscaling) = drain_as(
        &server,
        flow,
        "c613620e-07e2-4ed2-a9e2-ef8258911ade",
        &[
            ("SETTLE_SECONDS", "0"),
            ("DRAIN_TIMEOUT_SECONDS", if force { "0.8" } else { "1.5" }),
            ("EVICTION_BACKOFF_SECONDS", "0.05"),
            ("EVICTION_BACKOFF_MAX_SECONDS", "0.1"),
            ("DRAIN_LEASE_SECONDS", "2"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
            ("DRAIN_FORCE", force_setting),
        ],
    )
    .await;
    let node = server.store().get::<Node>("", NODE).unwrap();
    let cordoned = node.spec.and_then(|s| s.unschedulable) == Some(true);
    let emptied = server
        .wait_for("the node is empty", Duration::from_millis(1500), |s| {
            !s.list::<Pod>().iter().any(|p| {
                p.metadata.uid.as_ref().is_some_and(|u| before.contains(u))
                    && p.metadata.deletion_timestamp.is_none()
            })
        })
        .await
        .is_ok();
    let events = !server
        .store()
        .list::<k8s_openapi::api::events::v1::Event>()
        .is_empty();
    if std::env::var("RBAC_DEBUG").is_ok() {
        println!(
            "drain force={force}: {result:?} cordoned={cordoned} emptied={emptied} events={events} completions={:?}",
            autoscaling.completions()
        );
    }
    FlowResult {
        name: if force { "forced drain" } else { "drain" },
        effect: result.is_ok()
            && cordoned
            && emptied
            && events
            && autoscaling.completions().len() == 1,
        forbidden: forbidden(&server, "terminating-hook"),
    }
}

/// Drain of a node with a pod whose volume detaches 600 ms after the pod is gone, next to a
/// DaemonSet pod whose shared volume stays: the action must be completed only once the
/// drained pod's volume is detached (listing the attachments), and long before the wait's
/// bound (reading the staying pod's claim to leave its volume out).
async fn volume_drain_flow(documents: &[Value]) -> FlowResult {
    let server = cluster_with(
        documents,
        SimulationTimings {
            grace_period_scale: 0.002,
            pod_start_delay: Duration::from_millis(20),
            node_ready_after: Duration::ZERO,
            volume_detach_delay: Duration::from_millis(600),
            ..SimulationTimings::default()
        },
    )
    .await;
    let yaml = format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: data, namespace: default}}\nspec: {{volumeName: pv-data}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: logs, namespace: default}}\nspec: {{volumeName: pv-logs}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: db, namespace: default}}\nspec:\n  nodeName: {NODE}\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: db, image: postgres}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}]\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: logs, namespace: default}}\nspec:\n  selector: {{matchLabels: {{app: logs}}}}\n  template:\n    metadata: {{labels: {{app: logs}}}}\n    spec:\n      containers: [{{name: logs, image: fluent-bit}}]\n      volumes: [{{name: logs, persistentVolumeClaim: {{claimName: logs}}}}]\n"
    );
    server.store().apply_yaml(&yaml).unwrap();
    let attached = |s: &node_manager_testkit::kube::Store, volume: &str| {
        s.list::<k8s_openapi::api::storage::v1::VolumeAttachment>()
            .iter()
            .any(|a| {
                a.spec.node_name == NODE
                    && a.spec.source.persistent_volume_name.as_deref() == Some(volume)
            })
    };
    server
        .wait_for("both volumes are attached", Duration::from_secs(5), |s| {
            attached(s, "pv-data") && attached(s, "pv-logs")
        })
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (result, autoscaling) = drain_as(
        &server,
        Flow::VolumeDrain,
        "5b1d0f4e-2c61-4b0a-9d7e-6f1c2a3b4d5e",
        &[
            ("SETTLE_SECONDS", "0"),
            ("VOLUME_DETACH_SECONDS", "5"),
            ("DRAIN_TIMEOUT_SECONDS", "2"),
            ("EVICTION_BACKOFF_SECONDS", "0.05"),
            ("DRAIN_LEASE_SECONDS", "2"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
        ],
    )
    .await;
    let took = started.elapsed();
    let data_detached = !attached(server.store(), "pv-data");
    if std::env::var("RBAC_DEBUG").is_ok() {
        println!(
            "volume drain: {result:?} took={took:?} data_detached={data_detached} completions={:?}",
            autoscaling.completions()
        );
    }
    FlowResult {
        name: "drain waiting for volumes",
        effect: result.is_ok()
            && data_detached
            && took < Duration::from_secs(4)
            && autoscaling.completions().len() == 1,
        forbidden: forbidden(&server, "terminating-hook"),
    }
}

/// A drain paced by a PodDisruptionBudget: two pods of one ReplicaSet on the node behind
/// `maxUnavailable: 1`. The second eviction is refused until the first pod's replacement is
/// Ready (600 ms after it is scheduled: longer than the budget watch takes to list, so the
/// list alone cannot release it); the timer backoff is set far beyond the drain deadline, so
/// only retrying when the watched budget allows drains the node in time.
async fn paced_drain_flow(documents: &[Value]) -> FlowResult {
    let server = cluster_with_pod_start(documents, Duration::from_millis(600)).await;
    let cordon = |unschedulable: bool| {
        server
            .store()
            .modify::<Node>("", OTHER_NODE, |n| {
                n.spec.get_or_insert_with(Default::default).unschedulable = Some(unschedulable);
            })
            .unwrap();
    };
    // Both replicas on NODE: the other node is cordoned while they are placed.
    cordon(true);
    server.store().apply_yaml(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: paced, namespace: default}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: paced}}\n  template:\n    metadata: {labels: {app: paced}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers: [{name: paced, image: nginx}]\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: paced, namespace: default}\nspec:\n  maxUnavailable: 1\n  selector: {matchLabels: {app: paced}}\n",
    ).unwrap();
    server
        .wait_for(
            "both pods run on the node, the budget allows one",
            Duration::from_secs(5),
            |s| {
                let running = s
                    .list::<Pod>()
                    .iter()
                    .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE))
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count();
                let allowed = s
                    .find::<k8s_openapi::api::policy::v1::PodDisruptionBudget>("default", "paced")
                    .and_then(|b| b.status)
                    .is_some_and(|st| st.disruptions_allowed == 1);
                running == 2 && allowed
            },
        )
        .await
        .unwrap();
    cordon(false);
    let (result, _) = drain_as(
        &server,
        Flow::PacedDrain,
        "5f0c1a2b-3d4e-4f60-8a9b-0c1d2e3f4a5b",
        &[
            ("SETTLE_SECONDS", "0"),
            ("DRAIN_TIMEOUT_SECONDS", "4"),
            ("EVICTION_BACKOFF_SECONDS", "10"),
            ("EVICTION_BACKOFF_MAX_SECONDS", "10"),
            ("DRAIN_LEASE_SECONDS", "2"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
        ],
    )
    .await;
    let drained = result.as_ref().is_ok_and(|report| {
        matches!(
            report.outcomes.as_slice(),
            [DeliveryOutcome::Completed {
                drain: DrainEnd::Drained,
                ..
            }]
        )
    });
    if std::env::var("RBAC_DEBUG").is_ok() {
        println!("paced drain: {result:?}");
    }
    FlowResult {
        name: "PDB-paced drain",
        effect: drained,
        forbidden: forbidden(&server, "terminating-hook"),
    }
}

async fn launch_flow(documents: &[Value]) -> FlowResult {
    let server = cluster(documents).await;
    server
        .register_node(
            LAUNCH_NODE,
            &format!("aws:///eu-west-1a/{LAUNCH_INSTANCE}"),
            Some(Duration::from_millis(100)),
        )
        .unwrap();
    let client = client(&server, "launching-hook", Flow::Launch.groups()).await;
    let (autoscaling, action) = fixtures::group_with_pending_action(
        CLUSTER,
        GROUP,
        hook("Launch-LC-Hook", "autoscaling:EC2_INSTANCE_LAUNCHING"),
        LAUNCH_INSTANCE,
        "71514b9d-6a40-4b26-8523-05e7ee35fa40",
    );
    let instances = InMemoryInstances::default();
    instances.add(LAUNCH_INSTANCE, LAUNCH_NODE);
    let settings = LaunchSettings::from_source(
        [
            ("CLUSTER_NAME", CLUSTER),
            ("LAUNCH_TIMEOUT_SECONDS", "1.5"),
            ("LAUNCH_TIMEOUT_RESULT", "ABANDON"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
        ]
        .as_slice(),
    )
    .unwrap();
    let ctx = Launcher::new(
        client,
        autoscaling.clone(),
        instances,
        InMemoryNotifications::default(),
        settings,
    );
    let mut lambda = lambda_runtime::Context::default();
    lambda.request_id = "rbac".into();
    lambda.invoked_function_arn =
        "arn:aws:lambda:eu-west-1:111111111111:function:launching-hook".into();
    lambda.deadline = u64::try_from(
        (std::time::SystemTime::now() + Duration::from_secs(10))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let result = ctx
        .handle(
            fixtures::lifecycle_notification(corpus::Target::LaunchingHook, &action),
            &lambda,
        )
        .await;
    let completions = autoscaling.completions();
    FlowResult {
        name: "launch",
        // The launch outcome is also reported as an Event on the node.
        effect: result.is_ok()
            && completions.len() == 1
            && completions[0].result == LifecycleActionResult::Continue
            && !server
                .store()
                .list::<k8s_openapi::api::events::v1::Event>()
                .is_empty(),
        forbidden: forbidden(&server, "launching-hook"),
    }
}

async fn aws_auth_flow(documents: &[Value], exists: bool) -> FlowResult {
    let server = cluster(documents).await;
    if exists {
        server
            .store()
            .apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: aws-auth, namespace: kube-system}\ndata:\n  mapRoles: |\n    - rolearn: arn:aws:iam::111111111111:role/admin\n      username: admin\n      groups: [system:masters]\n")
            .unwrap();
    }
    let client = client(&server, "nodegroup-auth", Flow::AwsAuthUpdate.groups()).await;
    let eks = InMemoryEks::default();
    eks.add_cluster(ClusterDescription {
        name: CLUSTER.into(),
        arn: format!("arn:aws:eks:eu-west-1:111111111111:cluster/{CLUSTER}"),
        endpoint: server.url().to_owned(),
        certificate_authority_data: server.ca_data(),
        authentication_mode: AuthenticationMode::ConfigMap,
    });
    eks.add_nodegroup(NodegroupDescription {
        cluster_name: CLUSTER.into(),
        nodegroup_name: "demo-ng".into(),
        node_role: NODE_ROLE.into(),
        ami_type: "AL2_x86_64".into(),
        status: "ACTIVE".into(),
    });
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
                max_attempts: 3,
                base_delay: Duration::from_millis(5),
                max_delay: Duration::from_millis(20),
            },
            delete_wait: Duration::from_millis(100),
            delete_poll_interval: Duration::from_millis(10),
        },
    );
    let result = function
        .handle(
            &json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng"}),
            "arn:aws:lambda:eu-west-1:111111111111:function:nodegroup-auth",
        )
        .await;
    let mapped = server
        .store()
        .find::<ConfigMap>("kube-system", "aws-auth")
        .and_then(|c| c.data)
        .and_then(|d| d.get("mapRoles").cloned())
        .is_some_and(|m| m.contains(NODE_ROLE));
    FlowResult {
        name: if exists {
            "aws-auth update"
        } else {
            "aws-auth creation"
        },
        // The change is also reported as an Event on aws-auth (kube-system).
        effect: result.is_ok() && mapped && events_in(&server, "kube-system"),
        forbidden: forbidden(&server, "nodegroup-auth"),
    }
}

/// Node repair (its own group): a node NotReady for an hour is replaced; the effect is the
/// instance marked unhealthy, the repair record on the node and the NodeRepairStarted Event.
async fn repair_flow(documents: &[Value]) -> FlowResult {
    use node_manager::aws::in_memory::InMemoryInstanceHealth;
    use node_manager::node_repair::memory::REPAIR_ANNOTATION;
    use node_manager::node_repair::run::{self, RepairContext};
    use node_manager::node_repair::settings::RepairSettings;

    let server = cluster(documents).await;
    let an_hour_ago = k8s_openapi::jiff::Timestamp::now() - Duration::from_secs(3600);
    server
        .store()
        .modify::<Node>("", NODE, |node| {
            let conditions = node
                .status
                .get_or_insert_default()
                .conditions
                .get_or_insert_default();
            conditions.retain(|c| c.type_ != "Ready");
            conditions.push(k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: Some("KubeletNotReady".into()),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    an_hour_ago,
                )),
                ..Default::default()
            });
        })
        .unwrap();
    let health = InMemoryInstanceHealth::new();
    health.add_group(GROUP, &[("eks:cluster-name", CLUSTER)], Duration::ZERO);
    health.add_instance(GROUP, INSTANCE);
    let env: &[(&str, &str)] = &[("CLUSTER_NAME", CLUSTER)];
    let ctx = RepairContext {
        kube: client(&server, "node-repair", Flow::Repair.groups()).await,
        health: health.clone(),
        ec2: health.clone(),
        settings: RepairSettings::from_source(env).unwrap(),
    };
    let answered = run::handle(&ctx, Value::Null).await.is_ok();
    let recorded = server
        .store()
        .find::<Node>("", NODE)
        .and_then(|n| n.metadata.annotations)
        .is_some_and(|a| a.contains_key(REPAIR_ANNOTATION));
    let reported = server
        .store()
        .list::<k8s_openapi::api::events::v1::Event>()
        .iter()
        .any(|e| e.reason.as_deref() == Some("NodeRepairStarted"));
    FlowResult {
        name: "node repair",
        effect: answered
            && recorded
            && reported
            && health.marked_unhealthy() == vec![INSTANCE.to_owned()],
        forbidden: forbidden(&server, "node-repair"),
    }
}

/// Instance refresh (its own group): a refresh starts, the outdated node is cordoned with
/// the refresh's record; the refresh is cancelled, the cordon is undone.
async fn refresh_flow(documents: &[Value]) -> FlowResult {
    use node_manager::aws::in_memory::InMemoryInstanceRefreshes;
    use node_manager::aws::{ConfiguredInstance, GroupConfiguration, InstanceRefreshDescription};
    use node_manager::instance_refresh::handler::{self, RefreshContext};
    use node_manager::instance_refresh::settings::RefreshSettings;

    const REFRESH: &str = "5d2ed4c6-3c7f-4c59-9d5e-3f6f4a1e2b7d";
    let server = cluster(documents).await;
    let aws = InMemoryInstanceRefreshes::default();
    aws.put_group(GroupConfiguration {
        name: GROUP.into(),
        tags: [("eks:cluster-name".to_owned(), CLUSTER.to_owned())].into(),
        desired_capacity: 1,
        instances: vec![ConfiguredInstance {
            instance_id: INSTANCE.into(),
            lifecycle_state: "InService".into(),
            ..ConfiguredInstance::default()
        }],
        ..GroupConfiguration::default()
    });
    let refresh = |status: &str| InstanceRefreshDescription {
        instance_refresh_id: REFRESH.into(),
        auto_scaling_group_name: GROUP.into(),
        status: status.into(),
        min_healthy_percentage: Some(100),
        max_healthy_percentage: Some(200),
        ..InstanceRefreshDescription::default()
    };
    let event = |kind: &str| {
        json!({
            "version": "0", "id": "e", "detail-type": format!("EC2 Auto Scaling Instance Refresh {kind}"),
            "source": "aws.autoscaling", "account": "111111111111", "time": "2026-11-27T08:00:00Z",
            "region": "eu-west-1", "resources": [],
            "detail": {"InstanceRefreshId": REFRESH, "AutoScalingGroupName": GROUP},
        })
    };
    let env: &[(&str, &str)] = &[("CLUSTER_NAME", CLUSTER)];
    let ctx = RefreshContext {
        kube: client(&server, "instance-refresh", Flow::Refresh.groups()).await,
        autoscaling: aws.clone(),
        ec2: aws.clone(),
        settings: RefreshSettings::from_source(env).unwrap(),
    };
    let cordoned = || {
        server
            .store()
            .find::<Node>("", NODE)
            .and_then(|n| n.spec)
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
    };
    aws.put_refresh(refresh("InProgress"));
    let started = handler::handle(&ctx, &event("Started"), None).await.is_ok();
    let marked = cordoned();
    aws.put_refresh(refresh("Cancelled"));
    let ended = handler::handle(&ctx, &event("Cancelled"), None)
        .await
        .is_ok();
    FlowResult {
        name: "instance refresh",
        effect: started && marked && ended && !cordoned(),
        forbidden: forbidden(&server, "instance-refresh"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_of_the_shipped_rbac_is_needed_by_its_own_function() {
    let documents = shipped();
    // The full manifest: every flow works, no 403 anywhere.
    for flow in run_flows(&Flow::ALL, &documents).await {
        assert!(flow.effect, "{} fails with the shipped RBAC", flow.name);
        assert!(
            flow.forbidden.is_empty(),
            "{} meets 403s with the shipped RBAC: {:?}",
            flow.name,
            flow.forbidden
        );
    }
    let all_grants = grants(&documents);
    assert!(all_grants.len() >= 20, "{}", all_grants.len());
    let mut not_needed = Vec::new();
    let mut report = Vec::new();
    for grant in &all_grants {
        let holders = holders(&documents, &grant.role);
        let own: Vec<Flow> = Flow::ALL
            .into_iter()
            .filter(|f| f.runs_as_one_of(&holders))
            .collect();
        let tolerated = TOLERATED.iter().any(|(label, _)| *label == grant.label);
        if own.is_empty() {
            if !tolerated {
                not_needed.push(format!("{} (no flow runs as {holders:?})", grant.label));
            }
            continue;
        }
        let flows = run_flows(&own, &without(&documents, grant)).await;
        let broken: Vec<&str> = flows
            .iter()
            .filter(|f| !f.effect && !f.forbidden.is_empty())
            .map(|f| f.name)
            .collect();
        let denied: Vec<&str> = flows
            .iter()
            .filter(|f| !f.forbidden.is_empty())
            .map(|f| f.name)
            .collect();
        report.push(format!(
            "{}: own flows {own:?}; broken {broken:?}; 403 in {denied:?}",
            grant.label
        ));
        if broken.is_empty() && !tolerated {
            not_needed.push(grant.label.clone());
        }
        // The PDB grants are best effort, but they must still be asked for (else unused).
        if grant.resource == "poddisruptionbudgets" && denied.is_empty() {
            not_needed.push(format!("{} (never even requested)", grant.label));
        }
    }
    println!("{}", report.join("\n"));
    assert!(
        not_needed.is_empty(),
        "no flow of the function holding these grants breaks without them (remove them from infra/rbac.yaml, or list them in TOLERATED with the reason):\n{}\n\nall:\n{}",
        not_needed.join("\n"),
        report.join("\n")
    );
}

/// Each function's identity, used as an attacker who runs code with that role would: the hooks
/// and node-repair cannot read or rewrite aws-auth (no way to cluster-admin), nodegroup-auth
/// cannot evict pods, patch nodes or read pods, node-repair cannot read, evict or delete pods. Live requests against the shipped RBAC, each must be a 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_function_identity_reaches_another_functions_access() {
    use kube::Api;
    use kube::api::{EvictParams, Patch, PatchParams, PostParams};

    let documents = shipped();
    let server = cluster(&documents).await;
    server
        .store()
        .apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: aws-auth, namespace: kube-system}\ndata:\n  mapRoles: \"\"\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: victim, namespace: default}\nspec:\n  containers: [{name: c, image: nginx}]\n")
        .unwrap();
    let is_forbidden = |result: Result<(), kube::Error>| matches!(result, Err(kube::Error::Api(ref e)) if e.code == 403);
    for (user, group) in [
        ("terminating-hook", "open-node-manager:terminating-hook"),
        ("launching-hook", "open-node-manager:launching-hook"),
        ("node-repair", "open-node-manager:node-repair"),
    ] {
        let client = client(&server, user, &[group]).await;
        let config_maps: Api<ConfigMap> = Api::namespaced(client, "kube-system");
        assert!(
            is_forbidden(config_maps.get("aws-auth").await.map(|_| ())),
            "{user} reads aws-auth"
        );
        let mut forged = server
            .store()
            .find::<ConfigMap>("kube-system", "aws-auth")
            .unwrap();
        forged.data = Some(
            [(
                "mapRoles".to_owned(),
                "- rolearn: arn:aws:iam::111111111111:role/attacker\n  username: a\n  groups: [system:masters]\n".to_owned(),
            )]
            .into(),
        );
        assert!(
            is_forbidden(
                config_maps
                    .replace("aws-auth", &PostParams::default(), &forged)
                    .await
                    .map(|_| ())
            ),
            "{user} rewrites aws-auth"
        );
        assert!(
            is_forbidden(
                config_maps
                    .patch(
                        "aws-auth",
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({"data": {"mapRoles": ""}}))
                    )
                    .await
                    .map(|_| ())
            ),
            "{user} patches aws-auth"
        );
    }
    let auth = client(
        &server,
        "nodegroup-auth",
        &["open-node-manager:nodegroup-auth"],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(auth.clone(), "default");
    assert!(
        is_forbidden(
            pods.evict("victim", &EvictParams::default())
                .await
                .map(|_| ())
        ),
        "nodegroup-auth evicts"
    );
    assert!(
        is_forbidden(pods.list(&Default::default()).await.map(|_| ())),
        "nodegroup-auth lists pods"
    );
    let nodes: Api<Node> = Api::all(auth);
    assert!(
        is_forbidden(
            nodes
                .patch(
                    NODE,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}}))
                )
                .await
                .map(|_| ())
        ),
        "nodegroup-auth patches nodes"
    );
    let repair = client(&server, "node-repair", &["open-node-manager:node-repair"]).await;
    let pods: Api<Pod> = Api::namespaced(repair, "default");
    assert!(
        is_forbidden(
            pods.evict("victim", &EvictParams::default())
                .await
                .map(|_| ())
        ),
        "node-repair evicts"
    );
    assert!(
        is_forbidden(pods.list(&Default::default()).await.map(|_| ())),
        "node-repair lists pods"
    );
    assert!(
        is_forbidden(pods.delete("victim", &Default::default()).await.map(|_| ())),
        "node-repair deletes pods"
    );
    // What the attacker tried changed nothing.
    let node = server.store().get::<Node>("", NODE).unwrap();
    assert_ne!(node.spec.and_then(|s| s.unschedulable), Some(true));
    assert!(server.store().find::<Pod>("default", "victim").is_some());
}
