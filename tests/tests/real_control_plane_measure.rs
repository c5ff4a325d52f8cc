//! The figures of BENCHMARKS.md's real-control-plane section: on one real plane, the
//! terminating hook's drain of a node of 110 pods (11 Deployments of 10 replicas in 11
//! namespaces) against `kubectl drain` of another node holding the same workload, without and
//! then with a PDB `maxUnavailable: 1` per Deployment; time and requests (from the audit log).
//!
//! About two minutes, so it is `#[ignore]`d: a normal run counts it as skipped (not as a
//! pass); run it with
//!
//! ```sh
//! cargo nextest run -p node-manager-testkit --test real_control_plane_measure \
//!   --run-ignored ignored-only --no-capture
//! ```
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, PostParams};
use node_manager_testkit::control_plane::binaries_or_skip;
use node_manager_testkit::control_plane::workload::set_cordoned;
use node_manager_testkit::control_plane::world::RealFunctionWorld;
use node_manager_testkit::e2e::Target;
use node_manager_testkit::fixtures::{self, Workload};
use node_manager_testkit::kube::AuditEvent;
use serde_json::json;

const NAMESPACES: usize = 11;
const REPLICAS: usize = 10;
const PODS: usize = NAMESPACES * REPLICAS;
const ZONE: &str = "eu-west-1a";

/// What one drain cost.
#[derive(Debug)]
struct Figure {
    took: Duration,
    requests: usize,
    refused: usize,
}

/// The evictions of a drain as kube-apiserver logged them: from the first one received to
/// the last one accepted, and how long the server took over each on average.
struct EvictionPhase {
    span: Duration,
    mean_latency: Duration,
}

/// The [`EvictionPhase`] of the requests `by` chose since `from`; `None` without an eviction.
fn eviction_phase(
    audit: &[AuditEvent],
    from: usize,
    by: impl Fn(&AuditEvent) -> bool,
) -> Option<EvictionPhase> {
    let at = |stamp: &str| stamp.parse::<jiff::Timestamp>().ok();
    let timings: Vec<(jiff::Timestamp, jiff::Timestamp)> = audit[from.min(audit.len())..]
        .iter()
        .filter(|e| by(e) && e.request_uri.ends_with("/eviction"))
        .filter_map(|e| Some((at(&e.request_received_timestamp)?, at(&e.stage_timestamp)?)))
        .collect();
    let first = timings.iter().map(|(received, _)| *received).min()?;
    let last = timings.iter().map(|(_, done)| *done).max()?;
    let total: Duration = timings
        .iter()
        .filter_map(|(received, done)| Duration::try_from(*done - *received).ok())
        .sum();
    Some(EvictionPhase {
        span: Duration::try_from(last - first).ok()?,
        mean_latency: total / u32::try_from(timings.len()).ok()?,
    })
}

/// The 110 pods of run `run` on `target` (every other node cordoned meanwhile), with a PDB per
/// Deployment when `budgets`; waits until all are Ready (and the budgets allow one), then
/// opens the `spares` for the replacements.
async fn seed(
    admin: &kube::Client,
    run: &str,
    target: &str,
    (nodes, spares): (&[String], &[String]),
    budgets: bool,
) {
    for node in nodes {
        set_cordoned(admin, node, node != target).await.unwrap();
    }
    for n in 0..NAMESPACES {
        let namespace = format!("{run}-{n}");
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        wait_for_service_account(admin, &namespace).await;
        let app = Workload::new(&namespace, "web")
            .replicas(REPLICAS as i32)
            .grace_period_seconds(Some(1));
        Api::<Deployment>::namespaced(admin.clone(), &namespace)
            .create(&PostParams::default(), &app.deployment())
            .await
            .unwrap();
        if budgets {
            let budget =
                fixtures::pdb_max_unavailable(&namespace, "web", json!(1), &[("app", "web")]);
            Api::<PodDisruptionBudget>::namespaced(admin.clone(), &namespace)
                .create(&PostParams::default(), &budget)
                .await
                .unwrap();
        }
    }
    wait_seeded(admin, run, target, budgets).await;
    for node in spares {
        set_cordoned(admin, node, false).await.unwrap();
    }
}

/// The service account controller creates `default` a moment after the namespace; pods
/// are refused until then.
async fn wait_for_service_account(admin: &kube::Client, namespace: &str) {
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(admin.clone(), namespace);
    while accounts.get_opt("default").await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_seeded(admin: &kube::Client, run: &str, target: &str, budgets: bool) {
    let pods: Api<Pod> = Api::all(admin.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::all(admin.clone());
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ready = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={target}")))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .namespace
                    .as_deref()
                    .is_some_and(|n| n.starts_with(run))
            })
            .filter(|p| fixtures::pod_is_ready(p))
            .count();
        let allowing = pdbs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|b| {
                b.metadata
                    .namespace
                    .as_deref()
                    .is_some_and(|n| n.starts_with(run))
            })
            .filter(|b| {
                b.status
                    .as_ref()
                    .is_some_and(|s| s.disruptions_allowed == 1)
            })
            .count();
        if ready == PODS && (!budgets || allowing == NAMESPACES) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{run}: {ready} pods Ready on {target}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Requests since `from` (audit events are in order) that `by` selects, and how many of them
/// were refused with 429.
fn requests_since(
    audit: &[AuditEvent],
    from: usize,
    by: impl Fn(&AuditEvent) -> bool,
) -> (usize, usize) {
    let chosen: Vec<&AuditEvent> = audit[from.min(audit.len())..]
        .iter()
        .filter(|e| by(e))
        .collect();
    let refused = chosen.iter().filter(|e| e.code() == 429).count();
    (chosen.len(), refused)
}

/// The terminating hook drains the node of `instance`: notification to response.
async fn drain_with_the_hook(w: &RealFunctionWorld, instance: &str) -> Figure {
    let from = w.plane.audit().len();
    // Drained, not ended at its deadline: the figure is a drain's.
    let took = w
        .scale_in_and_drain(instance, Duration::from_secs(120))
        .await
        .unwrap();
    let ours =
        |e: &AuditEvent| e.user.username == RealFunctionWorld::username(Target::TerminatingHook);
    let audit = w.plane.audit();
    let (requests, refused) = requests_since(&audit, from, ours);
    if let Some(phase) = eviction_phase(&audit, from, ours) {
        println!(
            "the terminating hook's evictions: accepted within {:?} of the first, {:?} each at the API server on average",
            phase.span, phase.mean_latency
        );
    }
    Figure {
        took,
        requests,
        refused,
    }
}

/// `kubectl drain` of `node`, as the admin, with the kubectl built from the plane's own module
/// (`bin`): the same version as the API server.
async fn drain_with_kubectl(w: &RealFunctionWorld, bin: &std::path::Path, node: &str) -> Figure {
    let from = w.plane.audit().len();
    let started = Instant::now();
    let output = tokio::process::Command::new(bin.join("kubectl"))
        .env("KUBECONFIG", w.plane.admin_kubeconfig())
        .args([
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=600s",
        ])
        .output()
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (requests, refused) = requests_since(&w.plane.audit(), from, |e| {
        e.user_agent.starts_with("kubectl")
    });
    Figure {
        took,
        requests,
        refused,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures BENCHMARKS.md §12 (about two minutes): run with --run-ignored"]
async fn the_110_pod_drain_against_kubectl_drain_on_the_real_plane() {
    let Some(bin) = binaries_or_skip("the_110_pod_drain_against_kubectl_drain_on_the_real_plane")
    else {
        return;
    };
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .env("DRAIN_TIMEOUT_SECONDS", "100")
        .env("SETTLE_SECONDS", "0.1")
        .log_level("warn")
        .start(&bin)
        .await
        .unwrap();
    let admin = w.plane.admin_client().await.unwrap();
    let mut nodes = vec![w.node.clone()];
    let mut instances = vec![w.instance.clone()];
    for i in 1..10 {
        let id = format!("i-0a0b0c0d0e0f001{i:02}");
        nodes.push(w.add_instance(&id, ZONE, true).await.unwrap());
        instances.push(id);
    }
    for (run, budgets) in [("plain", false), ("paced", true)] {
        let (ours, theirs) = if budgets { (2, 3) } else { (0, 1) };
        // Nodes 0-3 are the drained ones, the rest take the replacements.
        let layout = (nodes.as_slice(), &nodes[4..]);
        seed(
            &admin,
            &format!("{run}-ours"),
            &nodes[ours],
            layout,
            budgets,
        )
        .await;
        let hook = drain_with_the_hook(&w, &instances[ours]).await;
        seed(
            &admin,
            &format!("{run}-kubectl"),
            &nodes[theirs],
            layout,
            budgets,
        )
        .await;
        let kubectl = drain_with_kubectl(&w, &bin, &nodes[theirs]).await;
        println!(
            "{PODS} pods, PDBs: {budgets}: terminating hook {:?}, {} requests ({} refused); kubectl drain {:?}, {} requests ({} refused); kubectl / ours {:.1}x",
            hook.took,
            hook.requests,
            hook.refused,
            kubectl.took,
            kubectl.requests,
            kubectl.refused,
            kubectl.took.as_secs_f64() / hook.took.as_secs_f64()
        );
    }
}
