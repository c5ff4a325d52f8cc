//! The real control plane at fleet scale (issue #44 item 6, BENCHMARKS.md §12): kwok serving
//! `FLEET_NODES` nodes (1,000 by default) in three zones and `FLEET_PODS` pods (20,000) of
//! Deployments of 100 replicas, each behind a PDB `maxUnavailable: 1` (kube-scheduler's default
//! topology spread places them); then the built terminating hook drains one node of that
//! cluster, and `FLEET_SCALE_IN` nodes (100) are scaled in at once, each notification answered
//! in its own function process. Reports how long the plane took to register the nodes and to
//! run every pod, the resident memory of each process, the drains' time, requests and PDB
//! waves; fails when a node or a pod does not come up within its bound, when a drain does not
//! end drained or completes other than once, when a budget is broken (fewer than 99 of a
//! Deployment's pods Ready at one point, from a watch of the pods), when a pod of the scaled-in
//! nodes was not evicted exactly once, or when one is left on them.
//!
//! Many minutes, so it is `#[ignore]`d (counted as skipped):
//!
//! ```sh
//! cargo nextest run -p node-manager-testkit --test real_control_plane_fleet \
//!   --run-ignored ignored-only --no-capture
//! ```
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use node_manager_testkit::aws::FakeInstance;
use node_manager_testkit::control_plane::binaries_or_skip;
use node_manager_testkit::control_plane::workload::{
    GuardedDeployment, evictions_per_pod, is_available, live_pods_on,
};
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

/// Registers `count` nodes (instances of the node group, three zones); returns how long, and
/// the instances with their nodes.
async fn register_nodes(w: &RealFunctionWorld, count: usize) -> (Duration, Vec<(String, String)>) {
    let started = Instant::now();
    let registered: Vec<(String, String)> = futures::stream::iter(0..count)
        .map(|i| async move {
            // Names of their own: those EC2 derives from ids collide within a thousand.
            let instance = FakeInstance::new(&format!("i-0f{i:015x}"), "eu-west-1")
                .availability_zone(ZONES[i % ZONES.len()])
                .private_dns_name(&format!(
                    "ip-10-1-{}-{}.eu-west-1.compute.internal",
                    i / 250,
                    4 + i % 250
                ));
            let id = format!("i-0f{i:015x}");
            (id, w.add_described_instance(instance).await.unwrap())
        })
        .buffer_unordered(REGISTERING)
        .collect()
        .await;
    assert_eq!(registered.len(), count);
    (started.elapsed(), registered)
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
    let pods = Api::<Pod>::all(admin).list(&on_node).await.unwrap();
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

/// The fewest Ready pods any Deployment of the fleet had at once, from a watch of the fleet's
/// pods (a list of 20,000 pods per sample would load the plane more than the drains do);
/// `None` until the watch's first list is complete.
type Fewest = Arc<Mutex<Option<usize>>>;

fn watch_fewest_available(admin: &kube::Client) -> (Fewest, tokio::task::JoinHandle<()>) {
    use kube::runtime::watcher;
    let fewest: Fewest = Arc::default();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "fleet");
    let task = tokio::spawn({
        let fewest = fewest.clone();
        async move {
            let mut ready = ReadyByApp::default();
            let mut events = watcher(pods, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let changed = match event {
                    Ok(watcher::Event::Init) => {
                        ready = ReadyByApp::default();
                        None
                    }
                    Ok(watcher::Event::InitApply(pod)) => {
                        ready.set(&pod, true);
                        None
                    }
                    Ok(watcher::Event::InitDone) => {
                        ready.synced = true;
                        ready.by_app.values().min().copied()
                    }
                    Ok(watcher::Event::Apply(pod)) => ready.set(&pod, true),
                    Ok(watcher::Event::Delete(pod)) => ready.set(&pod, false),
                    Err(_) => None,
                };
                if let Some(count) = changed.filter(|_| ready.synced) {
                    let mut fewest = fewest.lock().unwrap();
                    *fewest = Some(fewest.map_or(count, |f| f.min(count)));
                }
            }
        }
    });
    (fewest, task)
}

/// Ready pods (not being deleted) per `app`, kept one event at a time.
#[derive(Default)]
struct ReadyByApp {
    /// Each pod's app and whether it counts.
    pods: BTreeMap<String, (String, bool)>,
    by_app: BTreeMap<String, usize>,
    synced: bool,
}

impl ReadyByApp {
    /// Records `pod` (gone when not `present`); the count of its app afterwards.
    fn set(&mut self, pod: &Pod, present: bool) -> Option<usize> {
        let name = pod.metadata.name.clone()?;
        let app = pod.metadata.labels.as_ref()?.get("app")?.clone();
        let counts = present && is_available(pod);
        if let Some((before, true)) = self.pods.insert(name, (app.clone(), counts)) {
            *self.by_app.entry(before).or_default() -= 1;
        }
        let count = self.by_app.entry(app).or_default();
        if counts {
            *count += 1;
        }
        Some(*count)
    }
}

/// Scales in `fleet` at once, each notification answered in its own function process; every
/// lifecycle action must be completed once with `CONTINUE`. Returns how long the drains took
/// together and how many ended drained (the others at their deadline, which the caller
/// reports before it fails).
async fn scale_in_at_once(w: &RealFunctionWorld, fleet: &[(String, String)]) -> (Duration, usize) {
    let instances: Vec<String> = fleet.iter().map(|(instance, _)| instance.clone()).collect();
    let (took, answers) = w
        .scale_in_at_once(&instances, Duration::from_secs(900))
        .await
        .unwrap();
    let mut drained = 0;
    for answer in answers {
        let summary = answer.summary().unwrap();
        assert!(summary.starts_with("completed CONTINUE ("), "{summary}");
        drained += usize::from(summary.starts_with("completed CONTINUE (Drained,"));
    }
    let completions = w.aws.autoscaling().completions();
    let completed: BTreeSet<&str> = completions.iter().map(|c| c.instance_id.as_str()).collect();
    for (instance, _) in fleet {
        assert!(
            completed.contains(instance.as_str()),
            "{instance} not completed"
        );
    }
    let of_these = completions
        .iter()
        .filter(|c| fleet.iter().any(|(i, _)| *i == c.instance_id));
    assert_eq!(of_these.count(), fleet.len(), "every drain completed once");
    (took, drained)
}

/// The pods on `nodes` (not being deleted), by name, with their `app`.
async fn pods_on(admin: &kube::Client, nodes: &BTreeSet<String>) -> BTreeMap<String, String> {
    let pods = Api::<Pod>::namespaced(admin.clone(), "fleet");
    let left = live_pods_on(&pods, "", nodes).await.unwrap();
    left.into_iter()
        .filter_map(|p| {
            let app = p.metadata.labels.as_ref()?.get("app")?.clone();
            Some((p.metadata.name?, app))
        })
        .collect()
}

/// The PDB waves a drain of those pods needs at least: a budget `maxUnavailable: 1` lets one
/// pod of its Deployment go at a time, so the Deployment with the most pods there sets it.
fn waves(pods: &BTreeMap<String, String>) -> usize {
    let mut per_app: BTreeMap<&str, usize> = BTreeMap::new();
    for app in pods.values() {
        *per_app.entry(app).or_default() += 1;
    }
    per_app.into_values().max().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures BENCHMARKS.md §12 at fleet scale (many minutes): run with --run-ignored"]
async fn the_real_plane_holds_a_fleet_and_drains_a_node_of_it() {
    let Some(bin) = binaries_or_skip("the_real_plane_holds_a_fleet_and_drains_a_node_of_it") else {
        return;
    };
    let (nodes, pods) = (setting("FLEET_NODES", 1000), setting("FLEET_PODS", 20_000));
    let scale_in = setting("FLEET_SCALE_IN", 100).min(nodes - 1);
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .processes(scale_in.max(1))
        // A hundred drains at once wait through many budget waves: the world's 20 s is for one.
        .env("DRAIN_TIMEOUT_SECONDS", "600")
        .start(&bin)
        .await
        .unwrap();
    let admin = w.plane.admin_client().await.unwrap();
    // The seeded node is one of the fleet: `nodes` in all.
    let (registered, fleet) = register_nodes(&w, nodes - 1).await;
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
    if scale_in > 0 {
        scale_in_many(&w, &admin, &fleet[..scale_in]).await;
    }
    println!(
        "memory after the drains (kB): {:?}, test process {}",
        w.plane.memory_kib(),
        own_memory_kib()
    );
}

/// `fleet` scaled in at once: every action completed once, no budget broken (the fewest Ready
/// pods of any Deployment never under [`REPLICAS`] - 1), no pod evicted twice; then, after the
/// figures are printed, every drain must have ended drained, every pod on those nodes evicted
/// exactly once, and the nodes empty.
async fn scale_in_many(w: &RealFunctionWorld, admin: &kube::Client, fleet: &[(String, String)]) {
    let nodes: BTreeSet<String> = fleet.iter().map(|(_, node)| node.clone()).collect();
    let seeded = pods_on(admin, &nodes).await;
    let (fewest, watch) = watch_fewest_available(admin);
    let from = w.plane.audit().len();
    let (took, drained) = scale_in_at_once(w, fleet).await;
    watch.abort();
    let fewest = fewest
        .lock()
        .unwrap()
        .expect("the availability watch never synced: nothing was checked");
    let user = RealFunctionWorld::username(Target::TerminatingHook);
    let audit = w.plane.audit();
    let evicted = evictions_per_pod(&audit[from..], user);
    let twice: Vec<&String> = evicted
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(p, _)| p)
        .collect();
    let not_evicted = seeded.keys().filter(|p| !evicted.contains_key(*p)).count();
    let left = pods_on(admin, &nodes).await;
    let requests = audit[from..]
        .iter()
        .filter(|e| e.user.username == user)
        .count();
    let refused = audit[from..]
        .iter()
        .filter(|e| e.user.username == user && e.code() == 429)
        .count();
    let peak = w
        .processes_of(Target::TerminatingHook)
        .iter()
        .filter_map(|f| f.runtime.peak_rss_kib())
        .max();
    let waves = waves(&seeded);
    println!(
        "{} nodes scaled in at once: {took:?}, {drained} drained (the others at their deadline), {} of {} pods evicted, {waves} PDB waves at least ({:?} a wave), {requests} requests ({refused} refused), fewest Ready pods of a Deployment {fewest} of {REPLICAS}, left on the nodes {}, the hooks' largest peak memory {peak:?} KiB",
        fleet.len(),
        seeded.len() - not_evicted,
        seeded.len(),
        took / u32::try_from(waves.max(1)).unwrap_or(1),
        left.len()
    );
    assert!(
        fewest >= REPLICAS - 1,
        "a budget was broken: {fewest} of {REPLICAS} Ready at one point"
    );
    assert!(twice.is_empty(), "evicted more than once: {twice:?}");
    assert_eq!(drained, fleet.len(), "drains that ended at their deadline");
    assert_eq!(not_evicted, 0, "pods of the scaled-in nodes never evicted");
    assert!(left.is_empty(), "still on the drained nodes: {left:?}");
}
