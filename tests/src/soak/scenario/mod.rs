//! Seeded, reproducible fault-soak scenarios, in process: the real terminating-hook,
//! launching-hook and nodegroup-auth handlers against the fake API server (shipped RBAC,
//! injected 5xx / 429 with Retry-After / dropped connections / latency) and the shared
//! crate's in-memory AWS fakes (throttling and 5xx queued per operation).
//!
//! A scenario is a small cluster (2-4 nodes, 1-3 Deployments with or without a PDB, maybe a
//! DaemonSet), 1..n-1 terminating instances, maybe a launching one, maybe node groups to map.
//! Every notification is delivered at least once: duplicated, concurrently, and some
//! deliveries are killed mid-drain (their future dropped at a random moment, as a Lambda
//! environment that dies) and redelivered, until every action is complete or the scenario's
//! time is up. Hand-overs published by the functions are delivered as new invocations.
//!
//! About one scenario in six configures force (`DRAIN_FORCE=true` and the force-delete group),
//! drawn from its own generator so that the other draws of a seed do not change.
//!
//! Invariants ([`ScenarioReport::violations`]):
//! - no PDB was violated: the fake API server's disruption log records every eviction it
//!   decides with the budget's counts in the critical section of the decision; a grant that
//!   evicted a healthy pod and left fewer healthy pods than the budget's `desiredHealthy` (or
//!   the scenario's own minimum) is a violation, and so is any pod DELETE of a PDB-covered
//!   pod unless it is the terminating hook's in a scenario with force configured;
//! - a watchdog also samples every budget's healthy pods every few milliseconds, to catch a
//!   disruption by any other path (a pod turned unready or removed without an eviction or a
//!   DELETE, e.g. by garbage collection of a deleted node); dips on a budget a recorded pod
//!   DELETE touched are left to the rule above;
//! - each lifecycle action completed exactly once, by the function, after its node was
//!   drained (or its drain timed out, which only happens where a PDB cannot be satisfied);
//! - no node of a LAUNCHING instance was ever cordoned or written by the terminating hook;
//! - no pod DELETE request by the terminating hook at all unless force is configured;
//! - `aws-auth` holds every node role once and keeps the entries it had.

mod aws_auth;
mod deliver;
mod functions;
mod setup;
mod verify;
mod warm_pool_return;
mod watchdog;
mod watched;

use std::time::Duration;

use self::functions::Functions;
use self::setup::Soak;
use self::watchdog::Watchdog;

const CLUSTER: &str = "ironman-2022";
const ACCOUNT: &str = "111111111111";
const GROUP: &str = "eks-soak-ng";
const TERMINATE_HOOK: &str = "Terminate-LC-Hook";
const LAUNCH_HOOK: &str = "Launch-LC-Hook";
const TOPIC: &str = "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic";
const ADMIN_ROLE: &str = "arn:aws:iam::111111111111:role/admin";
/// The Kubernetes group `infra/rbac.yaml` grants pod deletion (force mode) to.
const FORCE_GROUP: &str = "open-node-manager:force-delete";
/// The terminating hook's Kubernetes user in the soak.
const DRAIN_USER: &str = "terminating-hook";
/// Mixed into a seed for the force draw, which must not shift the scenario's other draws.
const FORCE_DRAW: u64 = 0xF0_0CE5;
/// Seeds the draws of cluster trouble (dead kubelets, pods tolerating the cordon, eviction
/// 409s, node-write bursts longer than the lease) apart from the rest of the scenario.
const TROUBLE_DRAW: u64 = 0x7B_0B1E;
/// The app whose pods tolerate the cordon: replacements may land back on a draining node,
/// where the drain leaves them (README, "Pods that come back").
const TOLERANT_APP: &str = "tolerant";
/// The wall-clock limit of one scenario's deliveries.
const SCENARIO_LIMIT: Duration = Duration::from_secs(40);

/// What one scenario did and found.
#[derive(Debug, Default, Clone)]
pub struct ScenarioReport {
    pub seed: u64,
    pub nodes: usize,
    pub pods: usize,
    pub pdbs: usize,
    pub terminating: usize,
    pub launching: usize,
    pub nodegroups: usize,
    /// Invocations started (each delivery, duplicate or hand-over).
    pub invocations: u64,
    /// Of those, the duplicates of a delivery (extra copies, concurrent or later).
    pub duplicates: u64,
    /// Invocations dropped mid-flight (killed) and redelivered.
    pub killed: u64,
    /// Hand-overs delivered as new invocations.
    pub hand_overs: u64,
    /// Faults the fake API server injected.
    pub kube_faults: u64,
    /// AWS errors queued (each consumed by one call).
    pub aws_faults: u64,
    /// Force configured (`DRAIN_FORCE=true`, the force-delete group mapped).
    pub forced: bool,
    /// Trouble mixed in: terminating nodes whose kubelet was killed, a Deployment tolerating
    /// the cordon, 409s staged on evictions, a burst of 503s on node writes.
    pub dead_kubelets: usize,
    pub tolerant: bool,
    pub eviction_conflicts: bool,
    pub write_burst: bool,
    /// A brownout of node writes: every PATCH answered 429 with `Retry-After` for seconds.
    pub brownout: bool,
    /// Eviction requests the fake API server decided (its disruption log).
    pub evictions_decided: u64,
    /// Of those, granted and carried out.
    pub evictions: u64,
    /// Of those, refused by a budget (429, 403).
    pub evictions_refused: u64,
    /// Budget counts checked at a granted eviction (one per covering PDB of each grant).
    pub pdb_checks_at_eviction: u64,
    /// Pod DELETEs carried out (bypassing eviction), and of those, of PDB-covered pods.
    pub pod_deletions: u64,
    pub covered_pod_deletions: u64,
    /// Terminating actions completed, with force configured, while workload pods still ran
    /// on the node (a forced deletion that failed and was not retried). Not a PDB matter, so
    /// counted rather than failed; see RELIABILITY.md.
    pub forced_completions_with_pods: u64,
    /// Healthy-count samples the watchdog took.
    pub samples: u64,
    pub violations: Vec<String>,
    pub elapsed: Duration,
}

/// A PDB's requirement, fixed at scenario start.
#[derive(Debug, Clone)]
struct Budget {
    namespace: String,
    name: String,
    app: String,
    min_healthy: i32,
}

/// Runs scenario `seed`: set up the cluster, the actions, the faults and the functions;
/// deliver every notification (duplicated, killed, handed over) until each action is done;
/// verify the invariants. Errors of the set-up (not of the code under test) panic.
///
/// The seed's draws are taken in a fixed order across these steps: reordering them changes
/// what every seed means.
pub async fn run_scenario(seed: u64) -> ScenarioReport {
    let started = std::time::Instant::now();
    let mut soak = Soak::start(seed).await;
    soak.seed_nodes().await;
    soak.seed_workloads().await;
    soak.start_actions();
    soak.start_warm_pool_return();
    soak.inject_faults();
    let clients = soak.clients().await;
    let watchdog = Watchdog::spawn(&soak);
    let functions = Functions::new(&mut soak, clients.drain, clients.launch);
    soak.register_launching_node_later();
    soak.restart_returning_node();
    let deliveries_started = soak.deliver_until_complete(&functions).await;
    soak.deliver_late_duplicates(&functions).await;
    let auth_violations = soak.soak_aws_auth(clients.auth).await;
    let mut found = watchdog.stop().await;
    soak.report.samples = found.samples;
    found.violations.extend(auth_violations);
    found
        .violations
        .extend(soak.completion_violations(deliveries_started));
    found.violations.extend(soak.budget_violations());
    found.violations.extend(soak.audit_violations());
    found.violations.extend(soak.warm_return_violations());
    found.violations.append(&mut soak.overruns);
    let mut report = soak.finish();
    report.violations = found.violations;
    report.elapsed = started.elapsed();
    report
}

/// Totals over many scenarios.
#[derive(Debug, Default, Clone)]
pub struct SoakTotals {
    pub scenarios: usize,
    pub nodes: usize,
    pub pods: usize,
    pub terminating: usize,
    pub launching: usize,
    pub nodegroups: usize,
    pub invocations: u64,
    pub duplicates: u64,
    pub killed: u64,
    pub hand_overs: u64,
    pub kube_faults: u64,
    pub aws_faults: u64,
    pub forced_scenarios: usize,
    pub dead_kubelets: usize,
    pub tolerant_scenarios: usize,
    pub conflict_scenarios: usize,
    pub burst_scenarios: usize,
    pub brownout_scenarios: usize,
    pub evictions_decided: u64,
    pub evictions: u64,
    pub evictions_refused: u64,
    pub pdb_checks_at_eviction: u64,
    pub pod_deletions: u64,
    pub covered_pod_deletions: u64,
    pub forced_completions_with_pods: u64,
    pub samples: u64,
    pub violations: Vec<String>,
    pub elapsed: Duration,
}

impl SoakTotals {
    pub fn add(&mut self, report: &ScenarioReport) {
        self.scenarios += 1;
        self.nodes += report.nodes;
        self.pods += report.pods;
        self.terminating += report.terminating;
        self.launching += report.launching;
        self.nodegroups += report.nodegroups;
        self.invocations += report.invocations;
        self.duplicates += report.duplicates;
        self.killed += report.killed;
        self.hand_overs += report.hand_overs;
        self.kube_faults += report.kube_faults;
        self.aws_faults += report.aws_faults;
        self.forced_scenarios += usize::from(report.forced);
        self.dead_kubelets += report.dead_kubelets;
        self.tolerant_scenarios += usize::from(report.tolerant);
        self.conflict_scenarios += usize::from(report.eviction_conflicts);
        self.burst_scenarios += usize::from(report.write_burst);
        self.brownout_scenarios += usize::from(report.brownout);
        self.evictions_decided += report.evictions_decided;
        self.evictions += report.evictions;
        self.evictions_refused += report.evictions_refused;
        self.pdb_checks_at_eviction += report.pdb_checks_at_eviction;
        self.pod_deletions += report.pod_deletions;
        self.covered_pod_deletions += report.covered_pod_deletions;
        self.forced_completions_with_pods += report.forced_completions_with_pods;
        self.samples += report.samples;
        self.elapsed += report.elapsed;
        for v in &report.violations {
            self.violations.push(format!("seed {}: {v}", report.seed));
        }
    }

    /// One line per figure, for RELIABILITY.md.
    pub fn summary(&self) -> String {
        format!(
            "scenarios {} (force configured in {}; dead kubelets {}; a Deployment tolerating the cordon in {}; eviction 409s in {}; node-write 503 bursts longer than the lease in {}; node-write brownouts (429 with Retry-After) in {}); nodes {}; pods {}; terminating actions {}; launching actions {}; node groups {}; invocations {}; duplicate deliveries {}; killed mid-flight and redelivered {}; hand-overs {}; API server faults injected {}; AWS faults injected {}; evictions decided {}, granted {}, refused by a PDB {}; PDB checks at eviction {}; pod DELETEs {} (of PDB-covered pods {}); forced completions with pods left {}; watchdog samples {}; violations {}; scenario time {:.1}s",
            self.scenarios,
            self.forced_scenarios,
            self.dead_kubelets,
            self.tolerant_scenarios,
            self.conflict_scenarios,
            self.burst_scenarios,
            self.brownout_scenarios,
            self.nodes,
            self.pods,
            self.terminating,
            self.launching,
            self.nodegroups,
            self.invocations,
            self.duplicates,
            self.killed,
            self.hand_overs,
            self.kube_faults,
            self.aws_faults,
            self.evictions_decided,
            self.evictions,
            self.evictions_refused,
            self.pdb_checks_at_eviction,
            self.pod_deletions,
            self.covered_pod_deletions,
            self.forced_completions_with_pods,
            self.samples,
            self.violations.len(),
            self.elapsed.as_secs_f64()
        )
    }
}
