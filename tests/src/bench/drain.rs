//! Drain benchmarks: one node with N pods behind a slow API server, against the lower bound
//! the latency allows and against a real `kubectl drain` of the same node; and a drain whose
//! pace is set by PodDisruptionBudgets, against the ideal number of waves.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kube::{FaultAction, FaultRule};
use crate::sandbox::{Sandbox, Scenario};

/// Evictions in flight at once: the functions' default `EVICTION_CONCURRENCY`.
pub const EVICTION_CONCURRENCY: usize = 16;
/// Pods per list page the drain asks for.
const LIST_PAGE: usize = 500;

#[derive(Debug, Clone)]
pub struct DrainFigures {
    pub pods: usize,
    pub latency: Duration,
    /// Lifecycle action start (the notification) → `CompleteLifecycleAction`, settle 0.
    pub wall: Duration,
    /// The fewest sequential round trips at this latency and concurrency (see [`lower_bound`]).
    pub lower_bound: Duration,
    /// Kubernetes API requests the function made (audit log).
    pub requests: usize,
    pub peak_rss_kib: u64,
    /// `kubectl drain --ignore-daemonsets --delete-emptydir-data` of the same node, same latency.
    pub kubectl: Option<Duration>,
}

/// What the drain cannot go below: get the node, patch it (label + cordon), list its pods
/// page by page, and evict them `EVICTION_CONCURRENCY` at a time — each a round trip of at
/// least `latency`. Pod removal itself is instant here (grace periods scaled to 0).
pub fn lower_bound(pods: usize, latency: Duration) -> Duration {
    let round_trips = 2 + pods.div_ceil(LIST_PAGE).max(1) + pods.div_ceil(EVICTION_CONCURRENCY);
    latency * round_trips as u32
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
         timings: {{ settleSeconds: 0, drainTimeoutSeconds: 600, podStartSeconds: {pod_start}, gracePeriodScale: 0, functionTimeoutSeconds: 900 }}\n\
         functionEnv: {{ EVICTION_CONCURRENCY: \"{EVICTION_CONCURRENCY}\" }}\n\
         nodegroups:\n  - {{ name: ng, autoScalingGroup: asg-bench, nodeRole: bench-node-role, nodes: 3 }}\n\
         workloads:\n{workloads}  - {{ kind: DaemonSet, namespace: kube-system, name: kube-proxy }}\n\
         steps:\n  - scaleIn: {{ nodegroup: ng, node: 0 }}\n"
    )
}

async fn start(yaml: &str) -> Result<Sandbox, String> {
    let scenario = Scenario::from_yaml(yaml).map_err(|e| e.to_string())?;
    Sandbox::start(scenario, false)
        .await
        .map_err(|e| e.to_string())
}

/// Drains one node with `pods` pods through the terminating hook, every API request delayed
/// by `latency`; then, when kubectl is on PATH and `with_kubectl`, drains an identical
/// node with kubectl.
pub async fn drain_at_scale(
    pods: usize,
    latency: Duration,
    with_kubectl: bool,
) -> Result<DrainFigures, String> {
    let yaml = drain_scenario(pods, &[("app", pods, None)], 0.05);
    let sandbox = start(&yaml).await?;
    sandbox
        .server()
        .faults()
        .add(FaultRule::new(FaultAction::Latency(latency)));
    let checks = sandbox.play_step(0).await;
    if let Some((_, failed)) = checks.iter().find(|(ok, _)| !ok) {
        return Err(format!(
            "the drain of {pods} pods did not complete as expected: {failed}"
        ));
    }
    let (_, instance) = sandbox.seeded_node("ng", 0).ok_or("no node")?;
    let wall = sandbox
        .aws()
        .autoscaling()
        .completions()
        .iter()
        .find(|c| c.instance_id == instance)
        .map(|c| c.after)
        .ok_or("no completion")?;
    let requests = sandbox
        .server()
        .audit()
        .filter(|e| e.user_agent.contains("terminating-hook"))
        .len();
    let peak_rss_kib = sandbox
        .function("terminating-hook")
        .and_then(|f| f.peak_rss_kib())
        .unwrap_or_default();
    sandbox.shutdown().await;

    let kubectl = if with_kubectl && kubectl_available() {
        Some(kubectl_drain(&yaml, latency).await?)
    } else {
        None
    };
    Ok(DrainFigures {
        pods,
        latency,
        wall,
        lower_bound: lower_bound(pods, latency),
        requests,
        peak_rss_kib,
        kubectl,
    })
}

fn kubectl_available() -> bool {
    Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `kubectl drain` of seeded node 0 of the same scenario, in a fresh world.
async fn kubectl_drain(yaml: &str, latency: Duration) -> Result<Duration, String> {
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

#[derive(Debug, Clone)]
pub struct PdbFigures {
    pub deployments: usize,
    pub pods_per_deployment: usize,
    pub replacement_ready: Duration,
    pub wall: Duration,
    /// The first eviction of each Deployment is free; each later one must wait for the
    /// previous pod's replacement to be Ready: `pods_per_deployment - 1` waits.
    pub ideal: Duration,
}

/// Three Deployments with `maxUnavailable: 1`, `per_deployment` pods each on the drained
/// node, replacements Ready after `replacement_ready`: the drain can evict one pod per
/// Deployment per wave, so the ideal is `per_deployment` waves, `per_deployment - 1` of which
/// wait for a replacement.
pub async fn pdb_constrained_drain(
    per_deployment: usize,
    replacement_ready: Duration,
) -> Result<PdbFigures, String> {
    let sets = [
        ("web", per_deployment, Some(1)),
        ("api", per_deployment, Some(1)),
        ("worker", per_deployment, Some(1)),
    ];
    let yaml = drain_scenario(per_deployment * 3, &sets, replacement_ready.as_secs_f64());
    let sandbox = start(&yaml).await?;
    let checks = sandbox.play_step(0).await;
    if let Some((_, failed)) = checks.iter().find(|(ok, _)| !ok) {
        return Err(format!(
            "the PDB-constrained drain did not complete as expected: {failed}"
        ));
    }
    let (_, instance) = sandbox.seeded_node("ng", 0).ok_or("no node")?;
    let wall = sandbox
        .aws()
        .autoscaling()
        .completions()
        .iter()
        .find(|c| c.instance_id == instance)
        .map(|c| c.after)
        .ok_or("no completion")?;
    sandbox.shutdown().await;
    Ok(PdbFigures {
        deployments: sets.len(),
        pods_per_deployment: per_deployment,
        replacement_ready,
        wall,
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
