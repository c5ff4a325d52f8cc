//! The seeded event soak (issue 35): every kind of event the terminating hook gets (lifecycle
//! notifications and the drain's own continuations, Spot warnings, rebalance
//! recommendations, stopping notifications, AWS Health scheduled changes, schedule ticks) and
//! every event the instance refresh function gets (the refresh's start, checkpoint and end,
//! its replacements' `EC2 Instance Launch Successful` and its terminations' `Terminate
//! Successful`, through the function's own handler; in half the seeds two groups refresh at
//! once), each lost, repeated (at once: concurrently) or late, failed invocations retried as
//! Lambda does, and API brownouts (429 and 5xx on the fake API server, failures of the AWS
//! fakes). The shared crate's handlers
//! run in process over the test kit's fake API server and the in-memory AWS, so fifty seeds
//! fit in the test suite.
//!
//! After the events, one schedule tick with nothing else going on (one reconcile period;
//! another while the one before started something, at most three), then the invariants of
//! [`check`]. A seed is reproducible: `EVENT_SOAK_SEED=N
//! EVENT_SOAK_SEEDS=1` reruns it alone.

pub mod check;
pub mod deliver;
pub mod plan;
pub mod world;

use std::time::{Duration, Instant};

use check::Violation;
use deliver::{Player, final_tick};
use plan::{Fate, plan};
use world::{EventWorld, LEASE, REBALANCE_UNDO};

/// Seeds played at once (each in its own world): a seed mostly waits (leases, drains held by
/// a budget until room or the instance's end), so several share the cores.
pub const SEEDS_AT_ONCE: usize = 6;

/// What one seed did and found.
#[derive(Debug)]
pub struct SeedReport {
    pub seed: u64,
    pub fates: Vec<Fate>,
    pub steps: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub delayed: usize,
    pub invocations: usize,
    pub failed_invocations: usize,
    pub continuations: usize,
    /// Terminating actions found waiting by the sweep and published again.
    pub redeliveries: usize,
    pub brownouts: usize,
    /// Groups whose instance refresh ran in the seed (two: at once).
    pub groups_refreshing: usize,
    /// Times a refresh took a node that accepted pods out of service (invariant 9 checked).
    pub room_checks: usize,
    pub evictions: usize,
    /// Node patches the instance refresh function made (marks and their undo).
    pub refresh_writes: usize,
    /// Launches out of the warm pool the launching hook completed.
    pub warm_pool_returns: usize,
    /// Instances node repair marked unhealthy.
    pub repairs: usize,
    pub violations: Vec<Violation>,
    pub elapsed: Duration,
}

impl SeedReport {
    /// How to run this seed alone.
    pub fn rerun_hint(&self) -> String {
        format!(
            "EVENT_SOAK_SEED={} EVENT_SOAK_SEEDS=1 cargo test -p node-manager-testkit --test reliability_event_soak event_soak -- --nocapture",
            self.seed
        )
    }
}

/// Plays seed `seed` and checks the invariants after one quiet reconcile period.
pub async fn run_seed(seed: u64) -> SeedReport {
    let started = Instant::now();
    let plan = plan(seed);
    if std::env::var_os("EVENT_SOAK_TRACE").is_some() {
        eprintln!(
            "seed {seed}: skip matching {}, steps {:#?}",
            plan.skip_matching, plan.steps
        );
    }
    // Odd seeds drain on a rebalance recommendation, even ones cordon (the default).
    let mut world = EventWorld::start_with(plan.fleet.clone(), seed % 2 == 1).await;
    world.skip_matching = plan.skip_matching;
    let watcher = PodWatcher::start(world.server.store().clone());
    let mut player = Player::new(&world, seed);
    player.play(&plan.steps).await;
    terminate_completed(&world, &mut player).await;
    let mut violations = Vec::new();
    // Quiet: leases lapse and rebalance cordons reach their time; then one reconcile period.
    // What that run started (a lifecycle action found waiting, published again and drained,
    // an instance back from the warm pool after it) is left to the next period, as the
    // schedule would: at most three.
    for _ in 0..3 {
        tokio::time::sleep(LEASE.max(REBALANCE_UNDO) + Duration::from_millis(300)).await;
        if let Err(error) = final_tick(&world).await {
            violations.push(Violation {
                invariant: "final-tick",
                detail: format!("the quiet schedule tick failed: {error}"),
            });
        }
        let before = player.played.invocations;
        player.settle().await;
        terminate_completed(&world, &mut player).await;
        if player.played.invocations == before {
            break;
        }
    }
    let mut played = player.played;
    played.pods.extend(watcher.stop().await);
    violations.extend(check::check(&world, &played.pods, &played.violations).await);
    let counted = Counted::of(&world);
    world.server.shutdown();
    SeedReport {
        seed,
        fates: plan.fleet.iter().map(|m| m.fate.clone()).collect(),
        steps: plan.steps.len(),
        lost: plan.lost,
        duplicated: plan.duplicated,
        delayed: plan.delayed,
        invocations: played.invocations,
        failed_invocations: played.failed_invocations,
        continuations: played.continuations,
        redeliveries: played.redeliveries,
        brownouts: played.brownouts,
        groups_refreshing: groups_refreshing(&plan.fleet),
        room_checks: played.room_checks,
        evictions: counted.evictions,
        refresh_writes: counted.refresh_writes,
        warm_pool_returns: counted.warm_pool_returns,
        repairs: counted.repairs,
        violations,
        elapsed: started.elapsed(),
    }
}

/// What the functions did in a seed, from the API server's audit log and the fakes.
struct Counted {
    evictions: usize,
    refresh_writes: usize,
    warm_pool_returns: usize,
    repairs: usize,
}

impl Counted {
    fn of(world: &EventWorld) -> Self {
        let audit = world.server.audit();
        let by = |user: &str, e: &crate::kube::AuditEvent| {
            e.user.username == user && (200..300).contains(&e.code())
        };
        Self {
            evictions: audit
                .subresource_requests("pods", "eviction")
                .iter()
                .filter(|e| by("terminating-hook", e))
                .count(),
            refresh_writes: audit
                .requests("patch", "nodes")
                .iter()
                .filter(|e| by("instance-refresh", e))
                .count(),
            warm_pool_returns: world
                .autoscaling
                .completions()
                .iter()
                .filter(|c| c.action.lifecycle_hook_name == world::LAUNCH_HOOK)
                .count(),
            repairs: world.health.marked_unhealthy().len(),
        }
    }
}

/// How many groups of `fleet` run an instance refresh.
fn groups_refreshing(fleet: &[plan::Member]) -> usize {
    let groups: std::collections::BTreeSet<usize> = fleet
        .iter()
        .filter(|m| m.fate.is_refreshed())
        .map(|m| m.group)
        .collect();
    groups.len()
}

/// Auto Scaling terminates what it completed the terminating action of (an instance back
/// to the warm pool stays; one terminated already is left).
async fn terminate_completed(world: &EventWorld, player: &mut Player<'_>) {
    for member in world.fleet.iter().filter(|m| !m.fate.is_warm_pool_return()) {
        let done = world
            .autoscaling
            .completions()
            .iter()
            .any(|c| c.action.instance_id == member.instance_id);
        if done {
            player.terminate(member).await;
        }
    }
}

/// Every pod's node, noted every few milliseconds while a seed plays: a replacement pod can
/// be created, scheduled and evicted again between two steps.
struct PodWatcher {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::collections::BTreeMap<String, String>>,
}

impl PodWatcher {
    fn start(store: crate::kube::Store) -> Self {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut seen = std::collections::BTreeMap::new();
            loop {
                for pod in store.list::<k8s_openapi::api::core::v1::Pod>() {
                    if let (Some(name), Some(node)) =
                        (pod.metadata.name, pod.spec.and_then(|s| s.node_name))
                    {
                        seen.insert(name, node);
                    }
                }
                tokio::select! {
                    _ = &mut stopped => return seen,
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
        });
        Self { stop, task }
    }

    async fn stop(self) -> std::collections::BTreeMap<String, String> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}
