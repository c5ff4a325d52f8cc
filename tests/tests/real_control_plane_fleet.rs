//! The real control plane at fleet scale (issue #44 item 6, BENCHMARKS.md §12): kwok serving
//! `FLEET_NODES` nodes (1,000 by default) in three zones and `FLEET_PODS` pods (20,000) of
//! Deployments of 100 replicas, each behind a PDB `maxUnavailable: 1` (kube-scheduler's default
//! topology spread places them); then the built terminating hook drains one node of that
//! cluster. Reports how long the plane took to register the nodes and to run every pod, the
//! resident memory of each process, and the drain's time and requests; fails when a node or a
//! pod does not come up within its bound, or when the drain does not end drained.
//!
//! Many minutes, so it is `#[ignore]`d (counted as skipped):
//!
//! ```sh
//! cargo nextest run -p node-manager-testkit --test real_control_plane_fleet \
//!   --run-ignored ignored-only --no-capture
//! ```
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, PostParams};
use node_manager_testkit::aws::FakeInstance;
use node_manager_testkit::control_plane::binaries_or_skip;
use node_manager_testkit::control_plane::workload::GuardedDeployment;
use node_manager_testkit::control_plane::world::RealFunctionWorld;
use node_manager_testkit::e2e::Target;
use serde_json::json;

const ZONES: [&str; 3] = ["eu-west-1a", "eu-west-1b", "eu-west-1c"];
const REPLICAS: usize = 100;
/// Nodes registered at once (each waits for kwok to make it Ready).
const REGISTERING: usize = 16;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Registers `count` nodes (instances of the node group, three zones); returns how long.
async fn register_nodes(w: &RealFunctionWorld, count: usize) -> Duration {
    let started = Instant::now();
    let registered: Vec<String> = futures::stream::iter(0..count)
        .map(|i| async move {
            // Names of their own: those EC2 derives from ids collide within a thousand.
            let instance = FakeInstance::new(&format!("i-0f{i:015x}"), "eu-west-1")
                .availability_zone(ZONES[i % ZONES.len()])
                .private_dns_name(&format!(
                    "ip-10-1-{}-{}.eu-west-1.compute.internal",
                    i / 250,
                    4 + i % 250
                ));
            w.add_described_instance(instance).await.unwrap()
        })
        .buffer_unordered(REGISTERING)
        .collect()
        .await;
    assert_eq!(registered.len(), count);
    started.elapsed()
}

/// `pods` pods in Deployments of [`REPLICAS`], each with its budget; returns how long until
/// every one is Ready, printing the progress.
async fn run_pods(admin: &kube::Client, pods: usize) -> Duration {
    let started = Instant::now();
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "fleet"}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    for d in 0..pods.div_ceil(REPLICAS) {
        let app = format!("fleet-{d}");
        GuardedDeployment {
            namespace: "fleet",
            app: &app,
            replicas: REPLICAS.min(pods - d * REPLICAS),
            grace_seconds: 1,
            labels: &[("fleet", "yes")],
            budget: true,
        }
        .create(admin)
        .await
        .unwrap();
    }
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "fleet");
    let mut last_report = Instant::now();
    loop {
        let ready: i32 = deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter_map(|d| d.status.as_ref()?.ready_replicas)
            .sum();
        if usize::try_from(ready).unwrap_or(0) >= pods {
            return started.elapsed();
        }
        if last_report.elapsed() > Duration::from_secs(30) {
            println!(
                "  {ready} of {pods} pods Ready after {:?}",
                started.elapsed()
            );
            last_report = Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "{ready} of {pods} Ready"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Resident memory of this test process (kB): the kit's node agent, webhook and fakes.
fn own_memory_kib() -> u64 {
    node_manager_testkit::lambda_api::status_kib("self", "VmRSS").unwrap_or(0)
}

/// The built terminating hook drains the seeded instance's node; returns its time and the
/// requests its user made.
async fn drain_one_node(w: &RealFunctionWorld) -> (Duration, usize) {
    let admin = w.plane.admin_client().await.unwrap();
    let on_node = ListParams::default().fields(&format!("spec.nodeName={}", w.node));
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::all(admin)
        .list(&on_node)
        .await
        .unwrap();
    println!(
        "the drained node {} holds {} pods",
        w.node,
        pods.items.len()
    );
    let from = w.plane.audit().len();
    let took = w
        .scale_in_and_drain(&w.instance, Duration::from_secs(600))
        .await
        .unwrap();
    let user = RealFunctionWorld::username(Target::TerminatingHook);
    let requests = w.plane.audit()[from..]
        .iter()
        .filter(|e| e.user.username == user)
        .count();
    (took, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures BENCHMARKS.md §12 at fleet scale (many minutes): run with --run-ignored"]
async fn the_real_plane_holds_a_fleet_and_drains_a_node_of_it() {
    let Some(bin) = binaries_or_skip("the_real_plane_holds_a_fleet_and_drains_a_node_of_it") else {
        return;
    };
    let (nodes, pods) = (setting("FLEET_NODES", 1000), setting("FLEET_PODS", 20_000));
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .start(&bin)
        .await
        .unwrap();
    let admin = w.plane.admin_client().await.unwrap();
    // The seeded node is one of the fleet: `nodes` in all.
    let registered = register_nodes(&w, nodes - 1).await;
    println!("{nodes} nodes Ready after {registered:?}");
    let ran = run_pods(&admin, pods).await;
    println!("{pods} pods Ready after {ran:?}");
    println!(
        "memory (kB): {:?}, test process {}",
        w.plane.memory_kib(),
        own_memory_kib()
    );
    let (took, requests) = drain_one_node(&w).await;
    let hook = &w.function(Target::TerminatingHook).runtime;
    println!(
        "drain of one node of {nodes}: {took:?}, {requests} requests; the hook's peak memory {:?} KiB",
        hook.peak_rss_kib()
    );
    println!(
        "memory after the drain (kB): {:?}, test process {}",
        w.plane.memory_kib(),
        own_memory_kib()
    );
}
