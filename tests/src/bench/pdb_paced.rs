//! Drains whose pace is set by PodDisruptionBudgets, the way a user's cluster looks: one node
//! with N pods of N/10 Deployments (10 replicas each, all on the node), a PDB
//! `maxUnavailable: 1` per Deployment, replacements Ready a fixed time after they are
//! scheduled; against `kubectl drain` of the same node in the same run and against the wave
//! bound. And many nodes at once: a mass scale-in of 20 nodes, one function process each,
//! against one API server (optionally throttling) and the same PDBs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::kube::{AuditEvent, RateLimit, StepTimes};
use crate::sandbox::Sandbox;

use super::drain::{EVICTION_CONCURRENCY, kubectl_available, kubectl_drain, scale_in, start};
use super::timeline::{Gaps, Recorder};

/// Replicas per Deployment: every Deployment needs this many waves.
pub const REPLICAS_PER_DEPLOYMENT: usize = 10;
/// The pods' declared grace period (the sandbox's seeded pods); scaled to the wanted one.
const DECLARED_GRACE_SECONDS: f64 = 30.0;

/// What a PDB-paced drain of one node measured.
#[derive(Debug, Clone)]
pub struct PacedFigures {
    pub pods: usize,
    pub deployments: usize,
    pub grace: Duration,
    pub ready: Duration,
    pub runs: usize,
    /// Lifecycle action start → `CompleteLifecycleAction` (median).
    pub wall: Duration,
    /// `waves x (grace + ready)`: each wave's evictions wait for the previous wave's pods to
    /// go and their replacements to be Ready.
    pub bound: Duration,
    /// Scale-in (the notification) → the first eviction request reaching the API server
    /// (median).
    pub first_eviction: Duration,
    /// Eviction requests answered 429 (median).
    pub refused: usize,
    /// Kubernetes API requests of the function (median).
    pub requests: usize,
    pub kubectl: Option<Duration>,
    pub kubectl_runs: usize,
    /// Where the waves' time went, over every run.
    pub gaps: Gaps,
    /// The fake's simulated controllers' steps, over every run.
    pub steps: StepTimes,
}

/// The wave bound: every Deployment needs `replicas` sequential evictions, each waiting for
/// the pod's grace period and its replacement's start.
pub fn wave_bound(replicas: usize, grace: Duration, ready: Duration) -> Duration {
    (grace + ready) * u32::try_from(replicas).unwrap_or(u32::MAX)
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The scenario: `nodes` seeded nodes, `deployments` Deployments of
/// [`REPLICAS_PER_DEPLOYMENT`] pods with a PDB each, replica `r` of Deployment `d` on node
/// `place(d, r)`; the functions' default backoff (1 s doubling to 30 s).
fn scenario(
    name: &str,
    nodes: usize,
    deployments: usize,
    place: impl Fn(usize, usize) -> usize,
    grace: Duration,
    ready: Duration,
    concurrent: bool,
) -> String {
    let mut workloads = String::new();
    for d in 0..deployments {
        let placement: Vec<String> = (0..REPLICAS_PER_DEPLOYMENT)
            .map(|r| place(d, r).to_string())
            .collect();
        workloads.push_str(&format!(
            "  - {{ kind: Deployment, namespace: bench, name: {}, replicas: {REPLICAS_PER_DEPLOYMENT}, placement: [{}], pdb: {{ maxUnavailable: 1 }} }}\n",
            deployment_name(d),
            placement.join(", ")
        ));
    }
    format!(
        "name: {name}\n\
         description: PDB-paced drains\n\
         concurrentInvocations: {concurrent}\n\
         timings: {{ settleSeconds: 0, drainTimeoutSeconds: 600, podStartSeconds: {}, gracePeriodScale: {}, functionTimeoutSeconds: 900, deregistrationDelaySeconds: 0 }}\n\
         functionEnv: {{ EVICTION_CONCURRENCY: \"{EVICTION_CONCURRENCY}\", EVICTION_BACKOFF_MAX_SECONDS: \"30\" }}\n\
         nodegroups:\n  - {{ name: ng, autoScalingGroup: asg-bench, nodeRole: bench-node-role, nodes: {nodes} }}\n\
         workloads:\n{workloads}  - {{ kind: DaemonSet, namespace: kube-system, name: kube-proxy }}\n\
         steps:\n  - scaleIn: {{ nodegroup: ng, node: 0 }}\n",
        seconds(ready),
        seconds(grace) / DECLARED_GRACE_SECONDS,
    )
}

/// Deployment `d`'s name, also its PodDisruptionBudget's and its pods' name prefix.
fn deployment_name(d: usize) -> String {
    format!("app-{d:03}")
}

fn parse_time(stamp: &str) -> Option<jiff::Timestamp> {
    stamp.parse().ok()
}

fn is_eviction(e: &AuditEvent) -> bool {
    e.resource() == "pods" && e.subresource() == "eviction"
}

/// The drained node and at least two more, one per 100 of its pods: room for every
/// replacement, as a node takes 110 pods (the scheduler leaves pods Pending on a full node,
/// and a Pending replacement holds its budget's next eviction).
fn nodes_for(pods: usize) -> usize {
    1 + pods.div_ceil(100).max(2)
}

/// One node of `pods` pods (`pods / 10` Deployments), `runs` drains by the terminating hook
/// and `kubectl_runs` by kubectl, each in a fresh world.
pub async fn pdb_paced_drain(
    pods: usize,
    grace: Duration,
    ready: Duration,
    runs: usize,
    kubectl_runs: usize,
) -> Result<PacedFigures, String> {
    let deployments = pods.div_ceil(REPLICAS_PER_DEPLOYMENT).max(1);
    let yaml = scenario(
        &format!("pdb-paced-{pods}"),
        nodes_for(pods),
        deployments,
        |_, _| 0,
        grace,
        ready,
        false,
    );
    let mut walls = Vec::new();
    let mut firsts = Vec::new();
    let mut refused = Vec::new();
    let mut requests = Vec::new();
    let mut gaps = Gaps::default();
    let mut steps = StepTimes::default();
    let budgets: Vec<String> = (0..deployments).map(deployment_name).collect();
    for _ in 0..runs.max(1) {
        let sandbox = start(&yaml).await?;
        let recorder = Recorder::start(sandbox.server())?;
        let notified = jiff::Timestamp::now();
        let wall = scale_in(&sandbox, "the PDB-paced drain").await;
        let hook_requests = sandbox
            .server()
            .audit()
            .filter(|e| e.user_agent.contains("terminating-hook"));
        let evictions: Vec<AuditEvent> = hook_requests
            .iter()
            .filter(|e| is_eviction(e))
            .cloned()
            .collect();
        gaps.extend(recorder.finish(&evictions, &budgets));
        steps.merge(sandbox.server().simulation().step_times());
        sandbox.shutdown().await;
        walls.push(wall?);
        let first = hook_requests
            .iter()
            .filter(|e| is_eviction(e))
            .filter_map(|e| parse_time(&e.request_received_timestamp))
            .min()
            .ok_or("no eviction request")?;
        firsts.push(Duration::try_from(first.duration_since(notified)).unwrap_or_default());
        refused.push(
            hook_requests
                .iter()
                .filter(|e| is_eviction(e) && e.code() == 429)
                .count(),
        );
        requests.push(hook_requests.len());
    }
    let mut kubectl = Vec::new();
    if kubectl_available() {
        for _ in 0..kubectl_runs {
            kubectl.push(kubectl_drain(&yaml, Duration::ZERO).await?);
        }
    }
    refused.sort_unstable();
    requests.sort_unstable();
    Ok(PacedFigures {
        pods,
        deployments,
        grace,
        ready,
        runs: walls.len(),
        wall: super::median(&mut walls),
        bound: wave_bound(REPLICAS_PER_DEPLOYMENT, grace, ready),
        first_eviction: super::median(&mut firsts),
        refused: refused[(refused.len() - 1) / 2],
        requests: requests[(requests.len() - 1) / 2],
        kubectl_runs: kubectl.len(),
        kubectl: (!kubectl.is_empty()).then(|| super::median(&mut kubectl)),
        gaps,
        steps,
    })
}

/// The throttle of the mass scale-in's second run, like API Priority and Fairness would
/// shed load: requests above this rate get 429 with `Retry-After`. Chosen below the
/// unthrottled run's peak (full mode: about 100 req/s of the 20 drains), so it bites.
pub fn mass_throttle(mode: super::Mode) -> RateLimit {
    match mode {
        super::Mode::Quick => RateLimit {
            per_second: 20.0,
            burst: 10.0,
            retry_after_seconds: 1,
        },
        super::Mode::Full => RateLimit {
            per_second: 50.0,
            burst: 25.0,
            retry_after_seconds: 1,
        },
    }
}

/// Environment variable naming a file the mass scale-in writes the fake API server's audit
/// log to (JSON lines, one file per run: `<path>.unthrottled`, `<path>.throttled`), to see
/// where a run's time went.
pub const AUDIT_LOG_VARIABLE: &str = "BENCH_AUDIT_LOG";

/// What a mass scale-in measured.
#[derive(Debug, Clone)]
pub struct MassFigures {
    pub nodes: usize,
    pub pods_per_node: usize,
    pub deployments: usize,
    pub throttle: Option<RateLimit>,
    /// First termination → the last `CompleteLifecycleAction`.
    pub wall: Duration,
    pub bound: Duration,
    /// Kubernetes API requests of all terminating-hook processes, in total, per second over
    /// the wall time, and in the busiest second.
    pub requests: usize,
    pub mean_rps: f64,
    pub peak_rps: usize,
    /// Eviction requests answered 429 by a PodDisruptionBudget, and by the throttle.
    pub refused_by_budget: usize,
    pub throttled: usize,
    /// Requests of any kind the throttle answered 429.
    pub throttled_requests: u64,
    /// Evictions the server granted that left a budget below its minimum (the disruption
    /// log): must be 0.
    pub pdb_violations: usize,
    /// Completions per terminated instance: each must be exactly 1.
    pub completions_per_instance: BTreeMap<usize, usize>,
    /// No pod but DaemonSet pods left running on a drained node.
    pub all_drained: bool,
    /// Where the waves' time went.
    pub gaps: Gaps,
    /// The fake's simulated controllers' steps during the run.
    pub steps: StepTimes,
}

impl MassFigures {
    pub fn one_completion_each(&self) -> bool {
        self.completions_per_instance.len() == 1
            && self.completions_per_instance.get(&1) == Some(&self.nodes)
    }
}

/// `nodes` nodes of `pods_per_node` pods terminated at once, `survivors` more nodes staying;
/// Deployments of 10 replicas, each spread over 10 consecutive drained nodes, a PDB
/// `maxUnavailable: 1` each; replacements land on the surviving nodes (the drained ones are
/// cordoned). Each lifecycle notification runs in its own function process.
pub async fn mass_scale_in(
    nodes: usize,
    pods_per_node: usize,
    survivors: usize,
    grace: Duration,
    ready: Duration,
    throttle: Option<RateLimit>,
) -> Result<MassFigures, String> {
    let total = nodes * pods_per_node;
    let deployments = total.div_ceil(REPLICAS_PER_DEPLOYMENT);
    let yaml = scenario(
        "mass-scale-in",
        nodes + survivors,
        deployments,
        |d, r| (d * REPLICAS_PER_DEPLOYMENT + r) % nodes,
        grace,
        ready,
        true,
    );
    let sandbox = start(&yaml).await?;
    if let Some(limit) = throttle {
        sandbox.server().faults().set_rate_limit(Some(limit));
    }
    sandbox.server().audit().clear();
    sandbox.server().disruption_log().clear();
    let recorder = Recorder::start(sandbox.server())?;
    let steps_before = sandbox.server().simulation().step_times();
    let instances: Vec<String> = (0..nodes)
        .filter_map(|i| sandbox.seeded_node("ng", i).map(|(_, instance)| instance))
        .collect();
    let started = Instant::now();
    let autoscaling = sandbox.aws().autoscaling();
    for instance in &instances {
        autoscaling
            .terminate_instance("asg-bench", instance)
            .map_err(|e| format!("terminate {instance}: {e}"))?;
    }
    let wait = Duration::from_secs(600);
    let completed = futures::future::join_all(
        instances
            .iter()
            .map(|i| autoscaling.wait_for_completion(i, wait)),
    )
    .await;
    let wall = started.elapsed();
    let mut figures = MassFigures {
        nodes,
        pods_per_node,
        deployments,
        throttle,
        wall,
        bound: wave_bound(REPLICAS_PER_DEPLOYMENT, grace, ready),
        requests: 0,
        mean_rps: 0.0,
        peak_rps: 0,
        refused_by_budget: 0,
        throttled: 0,
        throttled_requests: 0,
        pdb_violations: 0,
        completions_per_instance: BTreeMap::new(),
        all_drained: false,
        gaps: Gaps::default(),
        steps: StepTimes::default(),
    };
    let all_completed = completed.iter().all(Option::is_some);
    if all_completed {
        measure_mass(&sandbox, &instances, &mut figures);
    }
    if let Some(path) = std::env::var_os(AUDIT_LOG_VARIABLE) {
        let path = format!(
            "{}.{}",
            path.to_string_lossy(),
            if throttle.is_some() {
                "throttled"
            } else {
                "unthrottled"
            }
        );
        std::fs::write(&path, sandbox.server().audit().json_lines())
            .map_err(|e| format!("writing the audit log to {path}: {e}"))?;
    }
    let evictions = sandbox
        .server()
        .audit()
        .filter(|e| e.user_agent.contains("terminating-hook") && is_eviction(e));
    let budgets: Vec<String> = (0..deployments).map(deployment_name).collect();
    figures.gaps = recorder.finish(&evictions, &budgets);
    let steps_after = sandbox.server().simulation().step_times();
    figures.steps = StepTimes {
        count: steps_after.count - steps_before.count,
        total: steps_after.total.saturating_sub(steps_before.total),
        longest: steps_after.longest,
    };
    sandbox.shutdown().await;
    if !all_completed {
        return Err("a terminated instance's lifecycle action was not completed".to_owned());
    }
    Ok(figures)
}

/// Fills in what the fakes saw: the functions' requests, refusals, the disruption log's
/// verdicts, the completions and what is left on the drained nodes.
fn measure_mass(sandbox: &Sandbox, instances: &[String], figures: &mut MassFigures) {
    let server = sandbox.server();
    let hook = server
        .audit()
        .filter(|e| e.user_agent.contains("terminating-hook"));
    let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
    for event in &hook {
        if let Some(at) = parse_time(&event.request_received_timestamp) {
            *per_second.entry(at.as_second()).or_default() += 1;
        }
    }
    figures.requests = hook.len();
    figures.mean_rps = hook.len() as f64 / figures.wall.as_secs_f64().max(1e-9);
    figures.peak_rps = per_second.values().copied().max().unwrap_or(0);
    let evictions: Vec<&AuditEvent> = hook.iter().filter(|e| is_eviction(e)).collect();
    figures.throttled = evictions
        .iter()
        .filter(|e| e.code() == 429 && e.injected_fault.is_some())
        .count();
    figures.refused_by_budget = evictions
        .iter()
        .filter(|e| e.code() == 429 && e.injected_fault.is_none())
        .count();
    figures.throttled_requests = server.faults().throttled();
    figures.pdb_violations = server
        .disruption_log()
        .evictions()
        .iter()
        .filter(|r| !r.broken_budgets().is_empty())
        .count();
    let completions = sandbox.aws().autoscaling().completions();
    let mut per_instance: BTreeMap<&str, usize> =
        instances.iter().map(|i| (i.as_str(), 0)).collect();
    for c in &completions {
        if let Some(n) = per_instance.get_mut(c.instance_id.as_str()) {
            *n += 1;
        }
    }
    for n in per_instance.values() {
        *figures.completions_per_instance.entry(*n).or_default() += 1;
    }
    let drained: BTreeSet<String> = (0..instances.len())
        .filter_map(|i| sandbox.seeded_node("ng", i).map(|(node, _)| node))
        .collect();
    figures.all_drained = !server
        .store()
        .list::<k8s_openapi::api::core::v1::Pod>()
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| drained.contains(n))
        })
        .any(|p| {
            p.metadata.deletion_timestamp.is_none()
                && !p
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "DaemonSet")
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wave_bound_counts_grace_and_start_per_replica() {
        assert_eq!(
            wave_bound(10, Duration::from_millis(600), Duration::from_secs(1)),
            Duration::from_secs(16)
        );
    }

    #[test]
    fn deployments_spread_over_consecutive_nodes_fill_each_node_evenly() {
        let yaml = scenario(
            "t",
            20,
            60,
            |d, r| (d * 10 + r) % 20,
            Duration::from_millis(600),
            Duration::from_secs(1),
            true,
        );
        let scenario = crate::sandbox::Scenario::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
        let mut per_node = [0usize; 20];
        for w in scenario.workloads.iter().filter(|w| w.kind == "Deployment") {
            let nodes: BTreeSet<usize> = w.placement.iter().copied().collect();
            assert_eq!(nodes.len(), 10, "one replica per node: {:?}", w.placement);
            for n in &w.placement {
                per_node[*n] += 1;
            }
        }
        assert!(per_node.iter().all(|&n| n == 30), "{per_node:?}");
    }
}
