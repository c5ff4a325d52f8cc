//! What one launch costs the API server in a cluster of many nodes: the launching hook's
//! requests (and how many list or watch every node) and the bytes the API server sends it.
//!
//! The launching hook runs in process (`Launcher` with the in-memory AWS fakes) as the
//! `launching-hook` identity with the shipped RBAC, against the fake API server over plain
//! HTTP through a counting TCP relay, so the bytes are the HTTP responses as sent (headers
//! and bodies). The cluster's other nodes carry a realistic image list; none of them changes
//! during the launch, so a watch of every node costs here only its initial list (in a real
//! cluster it also carries every other node's status updates for the whole wait).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use node_manager::aws::in_memory::{InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications};
use node_manager::launch::{LaunchOutcome, Launcher};
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::LaunchSettings;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::fixtures;
use crate::identity;
use crate::kube::{FakeApiServer, SimulationTimings};
use crate::soak::corpus::{self, Target};

const CLUSTER: &str = "bench-cluster";
const GROUP: &str = "eks-bench-ng";
const HOOK: &str = "Launch-LC-Hook";
const INSTANCE: &str = "i-0bead0000000000001";
const FUNCTION: &str = "launching-hook";
/// Container images per node in the node's status, as a busy node lists them.
const IMAGES_PER_NODE: usize = 40;

/// Where the launching instance's node registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeNaming {
    /// Under the instance's private DNS name (EKS's convention).
    DnsName,
    /// Under another name, with the instance's providerID (a custom naming).
    Other,
    /// Under its DNS name, but EC2 does not tell the function that name: the wait watches
    /// every node, which is what every launch did before issue #24 item 8 (the baseline).
    DnsNameUnknown,
}

/// One launch's cost.
#[derive(Debug, Clone)]
pub struct LaunchCost {
    pub nodes: usize,
    /// The launching hook's Kubernetes requests, all verbs.
    pub requests: usize,
    /// Of those, node lists and watches.
    pub node_lists: usize,
    pub node_watches: usize,
    /// Node lists and watches without a `metadata.name` field selector: every node.
    pub cluster_wide: usize,
    /// Bytes the API server sent the function.
    pub bytes: u64,
    /// The report's outcome.
    pub outcome: String,
    pub elapsed: Duration,
}

impl LaunchCost {
    pub fn line(&self) -> String {
        format!(
            "{} nodes: {} requests ({} node lists, {} node watches, {} of them of every node), {:.1} KiB from the API server, outcome {} in {:.2}s",
            self.nodes,
            self.requests,
            self.node_lists,
            self.node_watches,
            self.cluster_wide,
            self.bytes as f64 / 1024.0,
            self.outcome,
            self.elapsed.as_secs_f64()
        )
    }
}

/// Relays TCP connections from a local port to `target`, counting the bytes sent back.
async fn counting_relay(target: std::net::SocketAddr, received: Arc<AtomicU64>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay port");
    let address = listener.local_addr().expect("relay address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let received = received.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(target).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let upstream = async {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    let _ = server_write.shutdown().await;
                };
                let downstream =
                    async {
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            let read =
                                match tokio::io::AsyncReadExt::read(&mut server_read, &mut buffer)
                                    .await
                                {
                                    Ok(0) | Err(_) => break,
                                    Ok(read) => read,
                                };
                            received.fetch_add(read as u64, Ordering::Relaxed);
                            if client_write.write_all(&buffer[..read]).await.is_err() {
                                break;
                            }
                        }
                    };
                tokio::join!(upstream, downstream);
            });
        }
    });
    format!("http://{address}")
}

fn filler_node(index: usize) -> Node {
    let images: Vec<_> = (0..IMAGES_PER_NODE)
        .map(|i| {
            json!({
                "names": [
                    format!("602401143452.dkr.ecr.eu-west-1.amazonaws.com/team-{i}/service@sha256:{:064x}", index * 100 + i),
                    format!("602401143452.dkr.ecr.eu-west-1.amazonaws.com/team-{i}/service:v1.{index}.{i}"),
                ],
                "sizeBytes": 123_456_789 + i,
            })
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("ip-10-2-{}-{}.eu-west-1.compute.internal", index / 250, index % 250),
            "labels": {
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "m5.large",
                "topology.kubernetes.io/zone": "eu-west-1a",
            },
        },
        "spec": {"providerID": format!("aws:///eu-west-1a/i-0{:016x}", 0x7000_0000 + index)},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": images,
        },
    }))
    .expect("node")
}

/// One launch in a cluster of `nodes` other nodes: the launching instance's node registers
/// 300 ms after the notification (named as `naming` says) and is Ready 300 ms later.
pub async fn measure_launch(nodes: usize, naming: NodeNaming) -> LaunchCost {
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .plain_http(true)
        .simulation(SimulationTimings::real_time())
        .start()
        .await
        .expect("fake API server");
    server
        .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
        .expect("infra/rbac.yaml");
    for index in 0..nodes {
        server.store().create(&filler_node(index)).expect("node");
    }
    let received = Arc::new(AtomicU64::new(0));
    let relay = counting_relay(server.address(), received.clone()).await;
    let mut config = identity::config_as(
        &server,
        FUNCTION,
        &[identity::function_group(FUNCTION).as_str()],
    )
    .await
    .expect("config");
    config.cluster_url = relay.parse().expect("relay URL");
    let client = kube::Client::try_from(config).expect("client");

    let dns_name = "ip-10-3-0-10.eu-west-1.compute.internal";
    let instances = InMemoryInstances::default();
    if naming != NodeNaming::DnsNameUnknown {
        instances.add(INSTANCE, dns_name);
    }
    let autoscaling = InMemoryAutoScaling::new();
    autoscaling.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
    autoscaling.add_hook(
        GROUP,
        fixtures::lifecycle_hook(HOOK, fixtures::LAUNCHING, Duration::from_secs(300)),
    );
    let action = fixtures::start_action(&autoscaling, GROUP, HOOK, INSTANCE, "bench-token");
    let settings = LaunchSettings::from_source(
        [
            ("CLUSTER_NAME", CLUSTER),
            ("LAUNCH_TIMEOUT_SECONDS", "8"),
            ("HAND_OVER_MARGIN_SECONDS", "1"),
        ]
        .as_slice(),
    )
    .expect("settings");
    let launcher = Launcher::new(
        client,
        autoscaling,
        instances,
        InMemoryNotifications::default(),
        settings,
    );

    let node_name = match naming {
        NodeNaming::DnsName | NodeNaming::DnsNameUnknown => dns_name.to_owned(),
        NodeNaming::Other => "launching-node-custom-name".to_owned(),
    };
    let simulation = server.simulation().clone();
    let provider_id = format!("aws:///eu-west-1a/{INSTANCE}");
    let registration = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        simulation
            .register_node(&node_name, &provider_id, Some(Duration::from_millis(300)))
            .expect("register the launching node");
    });
    server.audit().clear();
    received.store(0, Ordering::Relaxed);

    let mut context = lambda_runtime::Context::default();
    context.request_id = "bench-launch".into();
    context.invoked_function_arn =
        format!("arn:aws:lambda:eu-west-1:111111111111:function:{FUNCTION}");
    context.deadline = u64::try_from(
        (std::time::SystemTime::now() + Duration::from_secs(60))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX);
    let started = Instant::now();
    let event = fixtures::lifecycle_notification(Target::LaunchingHook, &action);
    let outcome = match launcher.handle(event, &context).await {
        Ok(report) => match &report.records[0].outcome {
            LaunchOutcome::Completed { .. } => "Completed".to_owned(),
            other => other.name().to_owned(),
        },
        Err(error) => format!("error: {error}"),
    };
    let elapsed = started.elapsed();
    registration.await.expect("registration");
    // Let the relay count what was in flight when the watch was dropped.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mine = server.audit().filter(|e| e.user.username == FUNCTION);
    let node_reads: Vec<_> = mine
        .iter()
        .filter(|e| e.resource() == "nodes" && matches!(e.verb.as_str(), "list" | "watch"))
        .collect();
    let cluster_wide = node_reads
        .iter()
        .filter(|e| e.name().is_empty() && !selects_by_name(&e.request_uri))
        .count();
    let cost = LaunchCost {
        nodes,
        requests: mine.len(),
        node_lists: node_reads.iter().filter(|e| e.verb == "list").count(),
        node_watches: node_reads.iter().filter(|e| e.verb == "watch").count(),
        cluster_wide,
        bytes: received.load(Ordering::Relaxed),
        outcome,
        elapsed,
    };
    server.shutdown();
    cost
}

/// Whether a request URI carries a `fieldSelector` on `metadata.name`.
fn selects_by_name(uri: &str) -> bool {
    let query = uri.split_once('?').map_or("", |(_, q)| q);
    url::form_urlencoded::parse(query.as_bytes())
        .any(|(key, value)| key == "fieldSelector" && value.starts_with("metadata.name="))
}
