//! The instance-refresh function's memory on a big cluster (issue #43 item 10): a refresh
//! starts on a group whose outdated nodes are still in service, so its plan lists every pod
//! placed on a node across the cluster. The built binary runs under the local Lambda Runtime
//! API against the fake Auto Scaling and API server; the figure is the function process's
//! peak resident set (`VmHWM`), next to the pods listed and the time the plan took.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use crate::aws::{
    EventPattern, FakeAutoScalingGroup, FakeAws, FakeInstance, FakeLifecycleHook,
    FakeRefreshPreferences,
};
use crate::e2e::StaticCluster;
use crate::fixtures::make_ready_by_hand;
use crate::kube::FakeApiServer;
use crate::lambda_api::{InvocationOutcome, LambdaRuntimeApi};

const CLUSTER: &str = "fleet";
const GROUP: &str = "eks-fleet-ng";
const ZONE: &str = "eu-west-1a";
const FUNCTION: &str = "instance-refresh";
/// Outdated nodes of the refreshed group (the rest of the cluster's nodes are other groups').
const OUTDATED: usize = 10;

/// The namespaces the pods are spread over.
const TEAMS: usize = 20;

/// One measured plan.
#[derive(Debug, Clone)]
pub struct RefreshMemoryRow {
    pub nodes: usize,
    pub pods: usize,
    /// The pages of the function's list of pods.
    pub pod_pages: usize,
    pub wall: Duration,
    pub peak_rss_kib: Option<u64>,
    /// Outdated nodes the plan took out of service.
    pub marked: usize,
}

/// A refresh's `Started` on a cluster of `nodes` nodes carrying `pods` pods (spread evenly),
/// ten of them the refreshed group's outdated nodes, still in service.
pub async fn refresh_plan_memory(nodes: usize, pods: usize) -> Result<RefreshMemoryRow, String> {
    let mut world = FleetWorld::start(nodes).await?;
    world.seed_pods(nodes, pods)?;
    let started_event = world.start_refresh().await?;
    world.server.audit().clear();
    let started = Instant::now();
    let answer = world
        .function
        .invoke(&started_event, Duration::from_secs(300))
        .await
        .map_err(|e| e.to_string())?;
    let wall = started.elapsed();
    let answer = match answer {
        InvocationOutcome::Response(answer) => answer,
        other => return Err(format!("{other:?}\n{}", world.function.output())),
    };
    let pod_pages = world
        .server
        .audit()
        .filter(|e| e.user.username == FUNCTION && e.verb == "list" && e.resource() == "pods")
        .len();
    Ok(RefreshMemoryRow {
        nodes,
        pods,
        pod_pages,
        wall,
        peak_rss_kib: world.function.peak_rss_kib(),
        marked: answer["marked"].as_array().map_or(0, Vec::len),
    })
}

struct FleetWorld {
    aws: FakeAws,
    server: FakeApiServer,
    function: LambdaRuntimeApi,
    events: crate::aws::EventSubscription,
    /// Every node's name, the refreshed group's first.
    node_names: Vec<String>,
}

impl FleetWorld {
    async fn start(nodes: usize) -> Result<Self, String> {
        let cluster = StaticCluster::start(CLUSTER, None).await?;
        let autoscaling = cluster.aws.autoscaling();
        autoscaling.add_group(
            FakeAutoScalingGroup::new(GROUP)
                .tag("eks:cluster-name", CLUSTER)
                .availability_zones(&[ZONE])
                .size(
                    0,
                    u32::try_from(OUTDATED).unwrap_or(u32::MAX),
                    2 * OUTDATED as u32,
                )
                .launch_template("lt-0abc", "nodes", "1"),
        );
        // No responder for the terminating hook: the refresh stays in progress.
        autoscaling
            .add_hook(
                GROUP,
                FakeLifecycleHook::terminating("terminate")
                    .heartbeat_timeout(Duration::from_secs(3600)),
            )
            .map_err(|e| e.to_string())?;
        let node_names = seed_nodes(&cluster.aws, &cluster.server, nodes)?;
        autoscaling
            .set_launch_template_version(GROUP, "2")
            .map_err(|e| e.to_string())?;
        let events = cluster.aws.eventbridge().subscribe(EventPattern {
            sources: vec!["aws.autoscaling".to_owned()],
            detail_types: vec!["EC2 Auto Scaling Instance Refresh Started".to_owned()],
        });
        let function = cluster.start_function(FUNCTION, "warn").await?;
        let StaticCluster { aws, server, .. } = cluster;
        Ok(Self {
            aws,
            server,
            function,
            events,
            node_names,
        })
    }

    /// `pods` pods of realistic size (labels, owner, requests, environment, a projected
    /// token volume, status with conditions), spread evenly over the nodes.
    fn seed_pods(&self, nodes: usize, pods: usize) -> Result<(), String> {
        let store = self.server.store();
        for team in 0..TEAMS {
            store
                .apply_value(json!({"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": format!("team-{team}")}}))
                .map_err(|e| e.to_string())?;
        }
        for i in 0..pods {
            let node = &self.node_names[i % nodes];
            store
                .apply_value(realistic_pod(i, node))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Starts a refresh (launch before terminate) and returns its `Started` event.
    async fn start_refresh(&mut self) -> Result<Value, String> {
        self.aws
            .autoscaling()
            .start_instance_refresh(
                GROUP,
                FakeRefreshPreferences::default()
                    .healthy_percentage(100, 200)
                    .instance_warmup(Duration::from_secs(3600)),
            )
            .map_err(|e| e.to_string())?;
        self.events
            .next_event(Duration::from_secs(10))
            .await
            .ok_or_else(|| "no Started event".to_owned())
    }
}

/// `nodes` Ready nodes: the first [`OUTDATED`] are the group's instances, launched a day
/// ago on the template's version 1; the others belong to no refreshed group. Returns their
/// names in that order.
fn seed_nodes(aws: &FakeAws, server: &FakeApiServer, nodes: usize) -> Result<Vec<String>, String> {
    let yesterday = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24);
    let mut names = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let id = format!("i-0f{i:015x}");
        let name = format!("ip-10-4-{}-{}.eu-west-1.compute.internal", i / 250, i % 250);
        if i < OUTDATED {
            let instance = FakeInstance::new(&id, "eu-west-1")
                .availability_zone(ZONE)
                .private_dns_name(&name)
                .launch_time(yesterday);
            aws.ec2().add_instance(instance);
            aws.autoscaling()
                .add_instance(GROUP, &id, ZONE)
                .map_err(|e| e.to_string())?;
        }
        server
            .register_node(&name, &format!("aws:///{ZONE}/{id}"), Some(Duration::ZERO))
            .map_err(|e| e.to_string())?;
        // The simulation is off: Ready and allocatable (an m5.4xlarge's) are set here.
        server
            .store()
            .modify::<Node>("", &name, |node| {
                make_ready_by_hand(node);
                let allocatable = node
                    .status
                    .get_or_insert_default()
                    .allocatable
                    .get_or_insert_default();
                for (resource, amount) in [("cpu", "15890m"), ("memory", "60Gi"), ("pods", "110")] {
                    allocatable.insert(resource.into(), Quantity(amount.into()));
                }
            })
            .map_err(|e| e.to_string())?;
        names.push(name);
    }
    Ok(names)
}

/// A pod as a Deployment's ReplicaSet makes it and the kubelet reports it (about 2.5 KB of
/// JSON): what a real cluster's list returns, so the memory figure is not flattered.
fn realistic_pod(i: usize, node: &str) -> Value {
    let app = format!("service-{}", i % 200);
    let name = format!("{app}-7d9f8c6b5-{i:06}");
    let conditions: Vec<Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .iter()
    .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": "2026-12-01T08:00:00Z"}))
    .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": format!("team-{}", i % TEAMS),
            "labels": {"app.kubernetes.io/name": app, "pod-template-hash": "7d9f8c6b5",
                       "app.kubernetes.io/part-of": "shop", "tier": "backend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z",
                            "prometheus.io/scrape": "true", "prometheus.io/port": "9102"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": format!("{app}-7d9f8c6b5"), "uid": format!("5d0c8a8e-0000-4000-8000-{i:012}"),
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": app,
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "app", "image": format!("123456789012.dkr.ecr.eu-west-1.amazonaws.com/{app}:v1.42.7"),
                "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                              "limits": {"memory": "512Mi"}},
                "env": [{"name": "SERVICE_NAME", "value": app}, {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability:4317"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
                "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
            }],
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        },
        "status": {
            "phase": "Running", "podIP": format!("10.4.{}.{}", (i / 250) % 250, i % 250),
            "conditions": conditions,
            "containerStatuses": [{"name": "app", "ready": true, "started": true, "restartCount": 0,
                                   "image": format!("123456789012.dkr.ecr.eu-west-1.amazonaws.com/{app}:v1.42.7"),
                                   "state": {"running": {"startedAt": "2026-12-01T08:00:00Z"}}}],
        },
    })
}
