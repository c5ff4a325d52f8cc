//! Drain benchmarks: one node with N pods behind a slow API server, against the lower bound
//! the latency allows and against a real `kubectl drain` of the same node; and a drain whose
//! pace is set by PodDisruptionBudgets, against the ideal number of waves.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kube::{AuditEvent, FaultAction, FaultRule};
use crate::sandbox::{Sandbox, Scenario};

/// Evictions in flight at once: the functions' default `EVICTION_CONCURRENCY`.
pub const EVICTION_CONCURRENCY: usize = 16;
/// Pods per list page the drain asks for.
const LIST_PAGE: usize = 500;

#[derive(Debug, Clone)]
pub struct DrainFigures {
    pub pods: usize,
    pub latency: Duration,
    /// Drains measured; every figure below is their median (RSS: the highest).
    pub runs: usize,
    /// Lifecycle action start (the notification) → `CompleteLifecycleAction`, settle 0.
    pub wall: Duration,
    /// The fewest sequential round trips at this latency and concurrency (see [`lower_bound`]).
    pub lower_bound: Duration,
    /// The same round trips at the median time the fake API server really took per request
    /// in these runs (its own work under load added to the injected latency).
    pub service_bound: Duration,
    /// Kubernetes API requests the function made (audit log).
    pub requests: usize,
    pub peak_rss_kib: u64,
    /// `kubectl drain --ignore-daemonsets --delete-emptydir-data` of the same node, same
    /// latency: the median of `kubectl_runs` drains.
    pub kubectl: Option<Duration>,
    pub kubectl_runs: usize,
}

/// The most requests a drain of `pods` pods may make (the target): one eviction per
/// pod plus a fixed allowance for finding, claiming and cordoning the node, listing and
/// watching its pods, and the node's Events.
pub fn request_budget(pods: usize) -> usize {
    pods + 20
}

/// What the drain cannot go below: get the node, patch it (label + cordon), list its pods
/// page by page, and evict them `EVICTION_CONCURRENCY` at a time — each a round trip of at
/// least `latency`. Pod removal itself is instant here (grace periods scaled to 0).
pub fn lower_bound(pods: usize, latency: Duration) -> Duration {
    latency * sequential_round_trips(pods)
}

/// The round trips of [`lower_bound`].
pub fn sequential_round_trips(pods: usize) -> u32 {
    let trips = 2 + pods.div_ceil(LIST_PAGE).max(1) + pods.div_ceil(EVICTION_CONCURRENCY);
    u32::try_from(trips).unwrap_or(u32::MAX)
}

/// The median time the fake API server took to answer the function's requests (received →
/// response complete, the injected latency included; watches excluded, their stage is the
/// start of the stream): what one round trip really cost in this run.
fn median_service_time(requests: &[AuditEvent]) -> Duration {
    let mut times: Vec<Duration> = requests
        .iter()
        .filter(|e| e.verb != "watch")
        .filter_map(|e| {
            let received: jiff::Timestamp = e.request_received_timestamp.parse().ok()?;
            let done: jiff::Timestamp = e.stage_timestamp.parse().ok()?;
            Duration::try_from(done.duration_since(received)).ok()
        })
        .collect();
    super::median(&mut times)
}

fn drain_scenario(pods: usize, podsets: &[(&str, usize, Option<i32>)], pod_start: f64) -> String {
    let mut workloads = String::new();
    for (name, count, max_unavailable) in podsets {
        let placement = vec!["0"; *count].join(", ");
        workloads.push_str(&format!(
            "  - {{ kind: Deployment, namespace: bench, name: {name}, replicas: {count}, placement: [{placement}]{} }}\n",
            max_unavailable
                .map(|m| format!(", pdb: {{ maxUnavailable: {m} }}"))
                .unwrap_or_default()
        ));
    }
    format!(
        "name: drain-{pods}\n\
         description: one node with {pods} pods\n\
         timings: {{ settleSeconds: 0, drainTimeoutSeconds: 600, podStartSeconds: {pod_start}, gracePeriodScale: 0, functionTimeoutSeconds: 900, deregistrationDelaySeconds: 0 }}\n\
         functionEnv: {{ EVICTION_CONCURRENCY: \"{EVICTION_CONCURRENCY}\" }}\n\
         nodegroups:\n  - {{ name: ng, autoScalingGroup: asg-bench, nodeRole: bench-node-role, nodes: 3 }}\n\
         workloads:\n{workloads}  - {{ kind: DaemonSet, namespace: kube-system, name: kube-proxy }}\n\
         steps:\n  - scaleIn: {{ nodegroup: ng, node: 0 }}\n"
    )
}

/// Plays the scenario's scale-in of node 0 and returns the time from the lifecycle action's
/// start to its completion; `what` names the drain in the error when it went wrong.
pub(super) async fn scale_in(sandbox: &Sandbox, what: &str) -> Result<Duration, String> {
    let checks = sandbox.play_step(0).await;
    if let Some((_, failed)) = checks.iter().find(|(ok, _)| !ok) {
        return Err(format!("{what} did not complete as expected: {failed}"));
    }
    let (_, instance) = sandbox.seeded_node("ng", 0).ok_or("no node")?;
    sandbox
        .aws()
        .autoscaling()
        .completions()
        .iter()
        .find(|c| c.instance_id == instance)
        .map(|c| c.after)
        .ok_or_else(|| format!("{what}: no completion"))
}

pub(super) async fn start(yaml: &str) -> Result<Sandbox, String> {
    let scenario = Scenario::from_yaml(yaml).map_err(|e| e.to_string())?;
    Sandbox::start(scenario, false)
        .await
        .map_err(|e| e.to_string())
}

/// Drains one node with `pods` pods through the terminating hook `runs` times (a fresh
/// world each), every API request delayed by `latency`; then, when kubectl is on PATH,
/// drains an identical node with kubectl `kubectl_runs` times.
pub async fn drain_at_scale(
    pods: usize,
    latency: Duration,
    runs: usize,
    kubectl_runs: usize,
) -> Result<DrainFigures, String> {
    let yaml = drain_scenario(pods, &[("app", pods, None)], 0.05);
    let mut walls = Vec::new();
    let mut requests = Vec::new();
    let mut service_times = Vec::new();
    let mut peak_rss_kib = 0;
    for _ in 0..runs.max(1) {
        let run = drain_once(&yaml, pods, latency).await?;
        walls.push(run.wall);
        requests.push(run.requests);
        service_times.push(run.service_time);
        peak_rss_kib = peak_rss_kib.max(run.peak_rss_kib);
    }
    requests.sort_unstable();
    let mut kubectl = Vec::new();
    if kubectl_available() {
        for _ in 0..kubectl_runs {
            kubectl.push(kubectl_drain(&yaml, latency).await?);
        }
    }
    Ok(DrainFigures {
        pods,
        latency,
        runs: walls.len(),
        wall: super::median(&mut walls),
        lower_bound: lower_bound(pods, latency),
        service_bound: super::median(&mut service_times) * sequential_round_trips(pods),
        requests: requests[(requests.len() - 1) / 2],
        peak_rss_kib,
        kubectl_runs: kubectl.len(),
        kubectl: (!kubectl.is_empty()).then(|| super::median(&mut kubectl)),
    })
}

struct DrainRun {
    wall: Duration,
    requests: usize,
    service_time: Duration,
    peak_rss_kib: u64,
}

async fn drain_once(yaml: &str, pods: usize, latency: Duration) -> Result<DrainRun, String> {
    let sandbox = start(yaml).await?;
    sandbox
        .server()
        .faults()
        .add(FaultRule::new(FaultAction::Latency(latency)));
    let hook = sandbox
        .function("terminating-hook")
        .ok_or("no terminating-hook")?;
    let invocations_before = hook.invocations().len();
    if std::env::var_os("BENCH_AUDIT").is_some() {
        let (node, _) = sandbox.seeded_node("ng", 0).ok_or("no node")?;
        let on_node = sandbox
            .server()
            .store()
            .list::<k8s_openapi::api::core::v1::Pod>()
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
            .count();
        eprintln!("pods on {node} before the drain: {on_node}");
    }
    let wall = scale_in(&sandbox, &format!("the drain of {pods} pods")).await?;
    // The invocation goes on after the completion (its Events, the checkpoint's completed
    // time): count its requests once it has returned.
    let returned_by = Instant::now() + Duration::from_secs(30);
    while hook.invocations().len() <= invocations_before && Instant::now() < returned_by {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hook_requests = sandbox
        .server()
        .audit()
        .filter(|e| e.user_agent.contains("terminating-hook"));
    if std::env::var_os("BENCH_AUDIT").is_some() {
        // Where the time goes: every request of the function, in arrival order.
        for event in &hook_requests {
            eprintln!("{} done {}", event.line(), event.stage_timestamp);
        }
    }
    let peak_rss_kib = hook.peak_rss_kib().unwrap_or_default();
    sandbox.shutdown().await;
    Ok(DrainRun {
        wall,
        requests: hook_requests.len(),
        service_time: median_service_time(&hook_requests),
        peak_rss_kib,
    })
}

pub(super) fn kubectl_available() -> bool {
    Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `kubectl drain` of seeded node 0 of the same scenario, in a fresh world.
pub(super) async fn kubectl_drain(yaml: &str, latency: Duration) -> Result<Duration, String> {
    let sandbox = start(yaml).await?;
    let kubeconfig: PathBuf =
        std::env::temp_dir().join(format!("bench-kubectl-{}.kubeconfig", std::process::id()));
    sandbox
        .server()
        .write_kubeconfig(&kubeconfig)
        .map_err(|e| e.to_string())?;
    sandbox
        .server()
        .faults()
        .add(FaultRule::new(FaultAction::Latency(latency)));
    let (node, _) = sandbox.seeded_node("ng", 0).ok_or("no node")?;
    let started = Instant::now();
    let output = tokio::process::Command::new("kubectl")
        .env("KUBECONFIG", &kubeconfig)
        .args([
            "drain",
            &node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=600s",
        ])
        .output()
        .await
        .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    sandbox.shutdown().await;
    let _ = std::fs::remove_file(&kubeconfig);
    if !output.status.success() {
        return Err(format!(
            "kubectl drain failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(elapsed)
}

/// A drain with the sandbox's default timings: grace periods of 30 s lasting 0.6 s, settle
/// 1 s, no injected latency.
#[derive(Debug, Clone)]
pub struct DefaultDrainFigures {
    pub pods: usize,
    pub runs: usize,
    /// Medians: notification → first eviction at the API server, → no pod left on the node,
    /// → `CompleteLifecycleAction` (the wait for the sandbox's load balancer included).
    pub first_eviction: Duration,
    pub empty: Duration,
    pub completed: Duration,
    /// One grace period: the drain cannot empty the node faster (every eviction in flight
    /// at once, each pod taking its grace period).
    pub bound: Duration,
    pub requests: usize,
}

/// The grace period of the scenario's pods (Kubernetes' default) and the sandbox's scale.
const DEFAULT_GRACE_SECONDS: f64 = 30.0;
const DEFAULT_GRACE_SCALE: f64 = 0.02;

/// Drains one node with `pods` pods of one Deployment (no PodDisruptionBudget) `runs` times
/// with the sandbox's default timings, timing the notification to the first eviction, to the
/// empty node and to the completion.
pub async fn drain_with_default_timings(
    pods: usize,
    runs: usize,
) -> Result<DefaultDrainFigures, String> {
    let placement = vec!["0"; pods].join(", ");
    let yaml = format!(
        "name: drain-defaults-{pods}\n\
         description: one node with {pods} pods, default timings\n\
         timings: {{ gracePeriodScale: {DEFAULT_GRACE_SCALE} }}\n\
         nodegroups:\n  - {{ name: ng, autoScalingGroup: asg-bench, nodeRole: bench-node-role, nodes: 3 }}\n\
         workloads:\n  - {{ kind: Deployment, namespace: bench, name: app, replicas: {pods}, placement: [{placement}] }}\n  - {{ kind: DaemonSet, namespace: kube-system, name: kube-proxy }}\n\
         steps:\n  - scaleIn: {{ nodegroup: ng, node: 0 }}\n"
    );
    let (mut firsts, mut empties, mut completions, mut requests) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let sandbox = start(&yaml).await?;
        let (node, _) = sandbox.seeded_node("ng", 0).ok_or("no node")?;
        let store = sandbox.server().store().clone();
        let hook = sandbox
            .function("terminating-hook")
            .ok_or("no terminating-hook")?;
        let invocations_before = hook.invocations().len();
        let started_wall = jiff::Timestamp::now();
        let started = Instant::now();
        let on_node = |store: &crate::kube::Store| {
            store
                .list::<k8s_openapi::api::core::v1::Pod>()
                .iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
                })
                .filter(|p| p.metadata.namespace.as_deref() == Some("bench"))
                .count()
        };
        let watch = async {
            loop {
                if on_node(&store) == 0 {
                    return started.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        let (completed, empty) =
            tokio::join!(scale_in(&sandbox, "the default-timings drain"), watch);
        let completed = completed?;
        let returned_by = Instant::now() + Duration::from_secs(30);
        while hook.invocations().len() <= invocations_before && Instant::now() < returned_by {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let function_requests = sandbox
            .server()
            .audit()
            .filter(|e| e.user_agent.contains("terminating-hook"));
        let first = function_requests
            .iter()
            .filter(|e| e.subresource() == "eviction")
            .filter_map(|e| e.request_received_timestamp.parse::<jiff::Timestamp>().ok())
            .min()
            .and_then(|at| Duration::try_from(at.duration_since(started_wall)).ok())
            .ok_or("no eviction")?;
        firsts.push(first);
        empties.push(empty);
        completions.push(completed);
        requests.push(function_requests.len());
        sandbox.shutdown().await;
    }
    requests.sort_unstable();
    Ok(DefaultDrainFigures {
        pods,
        runs: firsts.len(),
        first_eviction: super::median(&mut firsts),
        empty: super::median(&mut empties),
        completed: super::median(&mut completions),
        bound: Duration::from_secs_f64(DEFAULT_GRACE_SECONDS * DEFAULT_GRACE_SCALE),
        requests: requests[(requests.len() - 1) / 2],
    })
}

#[derive(Debug, Clone)]
pub struct PdbFigures {
    pub deployments: usize,
    pub pods_per_deployment: usize,
    pub replacement_ready: Duration,
    pub runs: usize,
    pub wall: Duration,
    /// The first eviction of each Deployment is free; each later one must wait for the
    /// previous pod's replacement to be Ready: `pods_per_deployment - 1` waits.
    pub ideal: Duration,
}

/// Three Deployments with `maxUnavailable: 1`, `per_deployment` pods each on the drained
/// node, replacements Ready after `replacement_ready`: the drain can evict one pod per
/// Deployment per wave, so the ideal is `per_deployment` waves, `per_deployment - 1` of which
/// wait for a replacement. The wall time is the median of `runs` drains.
pub async fn pdb_constrained_drain(
    per_deployment: usize,
    replacement_ready: Duration,
    runs: usize,
) -> Result<PdbFigures, String> {
    let sets = [
        ("web", per_deployment, Some(1)),
        ("api", per_deployment, Some(1)),
        ("worker", per_deployment, Some(1)),
    ];
    let yaml = drain_scenario(per_deployment * 3, &sets, replacement_ready.as_secs_f64());
    let mut walls = Vec::new();
    for _ in 0..runs.max(1) {
        let sandbox = start(&yaml).await?;
        let wall = scale_in(&sandbox, "the PDB-constrained drain").await;
        sandbox.shutdown().await;
        let wall = wall?;
        walls.push(wall);
    }
    Ok(PdbFigures {
        deployments: sets.len(),
        pods_per_deployment: per_deployment,
        replacement_ready,
        runs: walls.len(),
        wall: super::median(&mut walls),
        ideal: replacement_ready * per_deployment.saturating_sub(1) as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_bound_counts_round_trips() {
        let latency = Duration::from_millis(5);
        // get + patch + 1 list page + 110/16 = 7 eviction waves.
        assert_eq!(lower_bound(110, latency), Duration::from_millis(5 * 10));
        assert_eq!(
            lower_bound(737, latency),
            Duration::from_millis(5 * (2 + 2 + 47))
        );
    }
}
