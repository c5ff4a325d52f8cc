//! `bench`: the benchmark suite behind BENCHMARKS.md.
//!
//! `cargo run --release -p node-manager-testkit --bin bench -- --full` for the figures
//! (with `NODE_MANAGER_BIN_DIR=<target>/release` so the release function binaries are the
//! ones measured); `--quick` is what CI runs so the suite cannot rot.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use node_manager_testkit::bench::{self, Mode, ms};

#[derive(Parser)]
#[command(
    about = "Measures cold start, drains at scale, PDB-paced drains, node updates by instance refresh, Spot interruptions, aws-auth concurrency and token signing"
)]
struct Args {
    /// Small sizes and few runs: checks the suite works (CI).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Every size and enough runs for the published figures.
    #[arg(long)]
    full: bool,
    /// Only these parts (comma-separated): cold-start, drain, pdb, pdb-paced, mass-scale-in,
    /// drain-defaults, aws-auth, instance-refresh, spot-interruption, notice-calls,
    /// event-soak, sweep, refresh-memory, volume-wait, load-balancer-wait, refresh-settle,
    /// token.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Drain sizes (pods on the node) instead of the mode's (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pods: Vec<usize>,
    /// kubectl drains per size (default: 3 in full mode, none in quick mode).
    #[arg(long)]
    kubectl_runs: Option<usize>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mode = if args.full { Mode::Full } else { Mode::Quick };
    let wanted = |part: &str| args.only.is_empty() || args.only.iter().any(|p| p == part);
    let mut failed = false;
    let mut report = |result: Result<(), String>| {
        if let Err(error) = result {
            eprintln!("bench: {error}");
            failed = true;
        }
    };
    println!("# open-node-manager benchmarks ({mode:?} mode)\n");
    println!(
        "machine: {} cores, binaries from {}\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::env::var("NODE_MANAGER_BIN_DIR").unwrap_or_else(|_| "the current profile".to_owned())
    );
    if wanted("token") {
        let count = if mode == Mode::Full { 10_000 } else { 200 };
        let median = bench::token_signing(count);
        println!(
            "## Token signing\n\nmedian of {count} signings: {} µs\n",
            median.as_micros()
        );
    }
    if wanted("cold-start") {
        report(cold_start(mode).await);
    }
    if wanted("drain") {
        report(drain(mode, &args.pods, args.kubectl_runs).await);
    }
    if wanted("drain-defaults") {
        report(drain_defaults(mode).await);
    }
    if wanted("pdb") {
        report(pdb(mode).await);
    }
    if wanted("pdb-paced") {
        report(pdb_paced(mode, &args.pods, args.kubectl_runs).await);
    }
    if wanted("mass-scale-in") {
        report(mass_scale_in(mode).await);
    }
    if wanted("aws-auth") {
        report(aws_auth(mode).await);
    }
    if wanted("instance-refresh") {
        report(instance_refresh(mode).await);
    }
    if wanted("spot-interruption") {
        report(spot_interruption(mode).await);
    }
    if wanted("notice-calls") {
        report(notice_calls(mode).await);
    }
    if wanted("event-soak") {
        report(event_soak(mode).await);
    }
    if wanted("sweep") {
        report(sweep(mode).await);
    }
    if wanted("refresh-memory") {
        report(refresh_memory(mode).await);
    }
    if wanted("volume-wait") {
        report(volume_wait(mode).await);
    }
    if wanted("load-balancer-wait") {
        report(load_balancer_wait(mode).await);
    }
    if wanted("refresh-settle") {
        report(refresh_settle(mode).await);
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The sweep at fleet scale (issue #43 item 10): 100, 1,000 and 5,000 nodes with 0, 100 and
/// every node marked (five plans due), 100 ms and 400 ms on every AWS call and node list;
/// quick mode runs the 1,000-node rows at 100 ms only.
async fn sweep(mode: Mode) -> Result<(), String> {
    use node_manager_testkit::bench::sweep::{SWEEP_OPERATIONS, SWEEP_PERIOD, sweep_at_scale};
    let (sizes, latencies): (&[usize], &[u64]) = match mode {
        Mode::Full => (&[100, 1000, 5000], &[100, 400]),
        Mode::Quick => (&[1000], &[100]),
    };
    println!(
        "## The sweep at fleet scale
"
    );
    println!(
        "| nodes | marked | latency | wall | AWS calls ({}) | node lists | peak RSS | unchecked | due drained |",
        SWEEP_OPERATIONS.join(", ")
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    for &latency in latencies {
        for &nodes in sizes {
            let mut counts = vec![0, 100.min(nodes), nodes];
            counts.dedup();
            for marked in counts {
                let due = 5.min(marked);
                let row = sweep_at_scale(nodes, marked, due, Duration::from_millis(latency)).await;
                let calls: Vec<String> = SWEEP_OPERATIONS
                    .iter()
                    .map(|op| row.aws_calls[op].to_string())
                    .collect();
                println!(
                    "| {nodes} | {marked} | {latency} ms | {:.1} s | {} = {} | {} | {} MiB | {} | {}/{due} |",
                    row.wall.as_secs_f64(),
                    calls.join(" + "),
                    row.aws_total(),
                    row.node_lists,
                    row.peak_rss_kib
                        .map_or("?".to_owned(), |k| (k / 1024).to_string()),
                    row.unchecked,
                    row.drained,
                );
                if row.unchecked > 0 || row.drained < due || row.wall > SWEEP_PERIOD {
                    failures.push(format!("{nodes} nodes, {marked} marked, {latency} ms"));
                }
            }
        }
    }
    println!();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the sweep left plans undecided or ran past its period: {failures:?}"
        ))
    }
}

/// The instance-refresh function's peak memory when its plan lists a big cluster's pods
/// (issue #43 item 10): 30,000 and 150,000 pods on 100 pods a node; quick mode 5,000. The
/// bound is 200 MiB at any size (the function is given 256 MB).
async fn refresh_memory(mode: Mode) -> Result<(), String> {
    use node_manager_testkit::bench::refresh_memory::refresh_plan_memory;
    const BOUND_MIB: u64 = 200;
    let sizes: &[usize] = match mode {
        Mode::Full => &[30_000, 150_000],
        Mode::Quick => &[5_000],
    };
    println!("## The instance-refresh function's memory on a big cluster\n");
    println!("| pods | nodes | pages of pods | plan | peak RSS | nodes marked |");
    println!("|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    for &pods in sizes {
        let nodes = pods / 100;
        let row = refresh_plan_memory(nodes, pods).await?;
        let peak_mib = row.peak_rss_kib.map(|k| k / 1024);
        println!(
            "| {pods} | {nodes} | {} | {:.1} s | {} MiB | {} |",
            row.pod_pages,
            row.wall.as_secs_f64(),
            peak_mib.map_or("?".to_owned(), |m| m.to_string()),
            row.marked,
        );
        if peak_mib.is_none_or(|m| m >= BOUND_MIB) {
            failures.push(format!("{pods} pods: {peak_mib:?} MiB"));
        }
    }
    println!();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the refresh function passed {BOUND_MIB} MiB: {failures:?}"
        ))
    }
}

/// The wait for load balancers (issue #45 item 1): the requests one drain makes and how long
/// it takes to find the load balancers routing to the instance, by the account's size.
async fn load_balancer_wait(mode: Mode) -> Result<(), String> {
    use bench::load_balancer_wait::{DELAY, SETTLE};
    let rows = bench::load_balancer_wait(mode).await?;
    println!(
        "## Waiting for load balancers: requests per drain\n\n\
         target groups (¼ instance-mode of the cluster, ¼ of another cluster, ½ IP-mode) and a tenth as many classic load balancers (half the cluster's); the instance registered with each of the cluster's, deregistered as the wait starts, draining {} s; SETTLE_SECONDS {} s\n",
        DELAY.as_secs(),
        SETTLE.as_secs()
    );
    println!(
        "| target groups | classic | routing | DescribeTargetGroups | DescribeLoadBalancers | DescribeTags | DescribeTargetHealth | DescribeInstanceHealth | attributes | total | found after | waited |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let count = |op: &str| row.requests.get(op).copied().unwrap_or(0);
        let total: usize = row.requests.values().sum();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {total} | {:.2} s | {:.1} s |",
            row.target_groups,
            row.classics,
            row.routing,
            count("DescribeTargetGroups"),
            count("DescribeLoadBalancers"),
            count("DescribeTags"),
            count("DescribeTargetHealth"),
            count("DescribeInstanceHealth"),
            count("DescribeTargetGroupAttributes") + count("DescribeLoadBalancerAttributes"),
            row.found_after.as_secs_f64(),
            row.waited.as_secs_f64(),
        );
    }
    println!();
    Ok(())
}

/// The wait for volumes (issue #45 item 2): scale-in of a node with StatefulSet pods and their
/// volumes, without and with the wait; figures measured and scaled back to a real cluster's
/// seconds. Fails unless the wait brings the replacements up sooner where nothing else
/// waits (no settle period).
async fn volume_wait(mode: Mode) -> Result<(), String> {
    let rows = bench::volume_wait(mode).await?;
    let scale = bench::volume_wait::scale(mode);
    println!(
        "## Waiting for volumes: scale-in to replacement pods running with their volumes\n\n\
         3 StatefulSet pods with a ReadWriteOnce volume each on the node; the cluster at {scale} of real time (measured, then / {scale} in a real cluster's seconds)\n"
    );
    println!(
        "| SETTLE_SECONDS | CSI detach | VOLUME_DETACH_SECONDS | action completed after | replacements running after |"
    );
    println!("|---|---|---|---|---|");
    let real = |d: Duration| {
        format!(
            "{:.1} s ({:.0} s real)",
            d.as_secs_f64(),
            d.as_secs_f64() / scale
        )
    };
    for row in &rows {
        println!(
            "| {:.0} | {:.0} s | {:.0} | {} | {} |",
            row.settle_seconds,
            row.detach_seconds,
            row.bound_seconds,
            real(row.completed_after),
            row.replacements_running_after
                .map_or("never".to_owned(), real),
        );
    }
    println!();
    let unsettled = |bound: f64| {
        rows.iter()
            .find(|r| r.settle_seconds == 0.0 && r.bound_seconds == bound)
            .and_then(|r| r.replacements_running_after)
    };
    match (
        unsettled(0.0),
        rows.iter()
            .find(|r| r.settle_seconds == 0.0 && r.bound_seconds > 0.0)
            .and_then(|r| r.replacements_running_after),
    ) {
        (Some(without), Some(with)) if with < without => Ok(()),
        other => Err(format!(
            "without a settle period, waiting did not bring the replacements up sooner: {other:?}"
        )),
    }
}

/// The seeded event soak (issue 35) over more seeds than the test suite's fifty:
/// `EVENT_SOAK_SEEDS` (default 5 quick, 500 full) from `EVENT_SOAK_SEED` (default 1).
async fn event_soak(mode: Mode) -> Result<(), String> {
    use futures::StreamExt as _;
    use node_manager_testkit::soak::events::{SEEDS_AT_ONCE, run_seed};
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let count = number("EVENT_SOAK_SEEDS", if mode == Mode::Full { 500 } else { 5 });
    let first = number("EVENT_SOAK_SEED", 1);
    let started = std::time::Instant::now();
    let mut totals = SoakTotals::default();
    let mut failing = Vec::new();
    let mut reports = futures::stream::iter(first..first + count)
        .map(run_seed)
        .buffer_unordered(SEEDS_AT_ONCE);
    while let Some(report) = reports.next().await {
        totals.add(&report);
        for violation in &report.violations {
            eprintln!("seed {}: {violation}", report.seed);
        }
        if !report.violations.is_empty() {
            failing.push(format!("seed {} ({})", report.seed, report.rerun_hint()));
        }
    }
    let t = &totals;
    println!(
        "## Event soak\n\n{count} seeds from {first} in {:.0} s ({} with two groups refreshing at once): {} events lost, {} repeated, {} late, {} brownouts; {} invocations ({} failed, {} continued), {} evictions, {} instance-refresh node writes ({} room checks), {} warm-pool returns, {} repairs; {} seeds with violations\n",
        started.elapsed().as_secs_f64(),
        t.two_refreshing,
        t.lost,
        t.duplicated,
        t.delayed,
        t.brownouts,
        t.invocations,
        t.failed_invocations,
        t.continuations,
        t.evictions,
        t.refresh_writes,
        t.room_checks,
        t.warm_pool_returns,
        t.repairs,
        failing.len()
    );
    if failing.is_empty() {
        Ok(())
    } else {
        Err(format!("event soak: violations in {}", failing.join(", ")))
    }
}

/// The event soak's counters summed over its seeds.
#[derive(Default)]
struct SoakTotals {
    lost: usize,
    duplicated: usize,
    delayed: usize,
    brownouts: usize,
    invocations: usize,
    failed_invocations: usize,
    continuations: usize,
    evictions: usize,
    refresh_writes: usize,
    room_checks: usize,
    two_refreshing: usize,
    warm_pool_returns: usize,
    repairs: usize,
}

impl SoakTotals {
    fn add(&mut self, report: &node_manager_testkit::soak::events::SeedReport) {
        self.lost += report.lost;
        self.duplicated += report.duplicated;
        self.delayed += report.delayed;
        self.brownouts += report.brownouts;
        self.invocations += report.invocations;
        self.failed_invocations += report.failed_invocations;
        self.continuations += report.continuations;
        self.evictions += report.evictions;
        self.refresh_writes += report.refresh_writes;
        self.room_checks += report.room_checks;
        self.two_refreshing += usize::from(report.groups_refreshing == 2);
        self.warm_pool_returns += report.warm_pool_returns;
        self.repairs += report.repairs;
    }
}

async fn cold_start(mode: Mode) -> Result<(), String> {
    let rows = bench::cold_start(mode).await?;
    println!(
        "## Cold start (medians over {} rounds; each round starts every binary once, in turn; init vs bare: the median of the ratios within a round)\n",
        rows.first().map_or(0, |r| r.runs)
    );
    println!(
        "| binary | init (ms) | init vs bare | first response (ms) | peak RSS (MiB) | size (MiB) | arm64 bootstrap (MiB) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in &rows {
        let ratio = row.init_vs_bare;
        println!(
            "| {} | {} | {ratio:.2}x | {} | {:.1} | {:.1} | {} |",
            row.binary,
            ms(row.init),
            ms(row.first_response),
            row.peak_rss_kib as f64 / 1024.0,
            row.size_bytes as f64 / 1_048_576.0,
            row.arm64_size_bytes
                .map(|b| format!("{:.1}", b as f64 / 1_048_576.0))
                .unwrap_or_else(|| "not built".to_owned())
        );
    }
    println!();
    Ok(())
}

async fn drain(mode: Mode, sizes: &[usize], kubectl_runs: Option<usize>) -> Result<(), String> {
    let sizes: &[usize] = match (mode, sizes) {
        (_, [_, ..]) => sizes,
        (Mode::Quick, []) => &[30],
        (Mode::Full, []) => &[30, 110, 250, 737],
    };
    let (runs, kubectl_runs) = match mode {
        Mode::Quick => (3, kubectl_runs.unwrap_or(0)),
        Mode::Full => (5, kubectl_runs.unwrap_or(3)),
    };
    let latency = Duration::from_millis(5);
    println!(
        "## Drain at scale (API latency {latency:?} per request, grace 0, settle 0, eviction concurrency {}; medians of {runs} drains, kubectl of {kubectl_runs})\n",
        bench::drain::EVICTION_CONCURRENCY
    );
    println!(
        "| pods | wall (ms) | lower bound (ms) | vs bound | bound at measured service time (ms) | vs that | requests | within N + 20 | peak RSS (MiB) | kubectl drain (ms) | kubectl / ours |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &pods in sizes {
        let figures = bench::drain_at_scale(pods, latency, runs, kubectl_runs).await?;
        let kubectl = figures.kubectl.map(ms).unwrap_or_else(|| "-".to_owned());
        let speedup = figures
            .kubectl
            .map(|k| format!("{:.1}x", k.as_secs_f64() / figures.wall.as_secs_f64()))
            .unwrap_or_else(|| "-".to_owned());
        let within = if figures.requests <= bench::drain::request_budget(pods) {
            "yes"
        } else {
            "NO"
        };
        println!(
            "| {pods} | {} | {} | {:.2}x | {} | {:.2}x | {} | {within} | {:.1} | {kubectl} | {speedup} |",
            ms(figures.wall),
            ms(figures.lower_bound),
            figures.wall.as_secs_f64() / figures.lower_bound.as_secs_f64(),
            ms(figures.service_bound),
            figures.wall.as_secs_f64() / figures.service_bound.as_secs_f64().max(1e-9),
            figures.requests,
            figures.peak_rss_kib as f64 / 1024.0,
        );
    }
    println!();
    Ok(())
}

async fn pdb(mode: Mode) -> Result<(), String> {
    let (per, ready, runs) = match mode {
        Mode::Quick => (2, Duration::from_millis(500), 1),
        Mode::Full => (3, Duration::from_secs(2), 3),
    };
    let figures = bench::pdb_constrained_drain(per, ready, runs).await?;
    println!("## PDB-constrained drain\n");
    println!(
        "{} Deployments with maxUnavailable 1, {} pods each on the node, replacements Ready after {:?}: wall {} ms (median of {}), ideal {} waves with {} waits for a replacement = {} ms ({:.2}x)\n",
        figures.deployments,
        figures.pods_per_deployment,
        figures.replacement_ready,
        ms(figures.wall),
        figures.runs,
        figures.pods_per_deployment,
        figures.pods_per_deployment.saturating_sub(1),
        ms(figures.ideal),
        figures.wall.as_secs_f64() / figures.ideal.as_secs_f64()
    );
    Ok(())
}

/// The PDB-paced drain's grace period and replacement start: (grace, ready).
fn paced_timings(mode: Mode) -> (Duration, Duration) {
    match mode {
        // A tenth of the published case: the same waves, in CI's time.
        Mode::Quick => (Duration::from_millis(60), Duration::from_millis(100)),
        Mode::Full => (Duration::from_millis(600), Duration::from_secs(1)),
    }
}

async fn pdb_paced(mode: Mode, sizes: &[usize], kubectl_runs: Option<usize>) -> Result<(), String> {
    let sizes: &[usize] = match (mode, sizes) {
        (_, [_, ..]) => sizes,
        (Mode::Quick, []) => &[20],
        (Mode::Full, []) => &[110, 250],
    };
    let (runs, kubectl_runs) = match mode {
        Mode::Quick => (1, kubectl_runs.unwrap_or(0)),
        Mode::Full => (3, kubectl_runs.unwrap_or(1)),
    };
    let (grace, ready) = paced_timings(mode);
    println!(
        "## PDB-paced drain (one node, N pods of N/10 Deployments with maxUnavailable 1, grace {grace:?}, replacements Ready {ready:?} after scheduling; medians of {runs} drains, kubectl of {kubectl_runs})\n"
    );
    println!(
        "| pods | wall (ms) | wave bound (ms) | vs bound | notification → first eviction (ms) | evictions refused | requests | kubectl drain (ms) | kubectl / ours |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut timelines = Vec::new();
    for &pods in sizes {
        let f = bench::pdb_paced_drain(pods, grace, ready, runs, kubectl_runs).await?;
        let kubectl = f.kubectl.map(ms).unwrap_or_else(|| "-".to_owned());
        let speedup = f
            .kubectl
            .map(|k| format!("{:.1}x", k.as_secs_f64() / f.wall.as_secs_f64()))
            .unwrap_or_else(|| "-".to_owned());
        println!(
            "| {pods} | {} | {} | {:.2}x | {} | {} | {} | {kubectl} | {speedup} |",
            ms(f.wall),
            ms(f.bound),
            f.wall.as_secs_f64() / f.bound.as_secs_f64(),
            ms(f.first_eviction),
            f.refused,
            f.requests,
        );
        timelines.push(format!(
            "- {pods} pods: {}; the fake's steps: {}",
            f.gaps.summary(),
            steps(f.steps)
        ));
    }
    println!(
        "\nWhere the waves' time went (every run):\n\n{}\n",
        timelines.join("\n")
    );
    Ok(())
}

/// The fake's simulated controllers' steps, for the "where the time went" lines.
fn steps(steps: node_manager_testkit::kube::StepTimes) -> String {
    format!(
        "{} steps, mean {} ms, longest {} ms",
        steps.count,
        ms(steps.mean()),
        ms(steps.longest)
    )
}

async fn mass_scale_in(mode: Mode) -> Result<(), String> {
    let (nodes, pods_per_node, survivors) = match mode {
        Mode::Quick => (4, 5, 2),
        // 600 pods' replacements on 6 nodes of 110 pod slots each.
        Mode::Full => (20, 30, 6),
    };
    let (grace, ready) = paced_timings(mode);
    let throttle = bench::mass_throttle(mode);
    println!(
        "## Mass scale-in ({nodes} nodes x {pods_per_node} pods terminated at once, one function process each; Deployments of 10 replicas spread over 10 nodes, PDB maxUnavailable 1 each; {survivors} surviving nodes; grace {grace:?}, replacements Ready {ready:?})\n"
    );
    println!(
        "| API server | wall (ms) | wave bound (ms) | vs bound | requests | mean req/s | peak req/s | evictions refused by a PDB | evictions throttled | requests throttled | PDB violations | one completion per instance | drained |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut failed = Vec::new();
    let mut timelines = Vec::new();
    for limit in [None, Some(throttle)] {
        let f = bench::mass_scale_in(nodes, pods_per_node, survivors, grace, ready, limit).await?;
        let server = match limit {
            None => "unthrottled".to_owned(),
            Some(l) => format!(
                "throttled: {} req/s, burst {}, Retry-After {} s",
                l.per_second, l.burst, l.retry_after_seconds
            ),
        };
        println!(
            "| {server} | {} | {} | {:.2}x | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            ms(f.wall),
            ms(f.bound),
            f.wall.as_secs_f64() / f.bound.as_secs_f64(),
            f.requests,
            f.mean_rps,
            f.peak_rps,
            f.refused_by_budget,
            f.throttled,
            f.throttled_requests,
            f.pdb_violations,
            f.one_completion_each(),
            f.all_drained,
        );
        timelines.push(format!(
            "- {server}: {}; the fake's steps: {}",
            f.gaps.summary(),
            steps(f.steps)
        ));
        if f.pdb_violations > 0 || !f.one_completion_each() || !f.all_drained {
            failed.push(server);
        }
    }
    println!(
        "\nWhere the waves' time went:\n\n{}\n",
        timelines.join("\n")
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "mass scale-in broke a budget, a completion or the drain: {}",
            failed.join("; ")
        ))
    }
}

async fn instance_refresh(mode: Mode) -> Result<(), String> {
    // (nodes, zones): groups over three zones, and §12's real-plane shapes in one zone.
    let sizes: &[(usize, usize)] = match mode {
        Mode::Quick => &[(3, 3)],
        Mode::Full => &[(3, 3), (10, 3), (30, 3), (4, 1), (10, 1)],
    };
    println!(
        "## Node update by instance refresh (N nodes, N Deployments of N replicas, one pod of each per node, PDB maxUnavailable 1 each; launch before terminate = MinHealthy 100 / MaxHealthy 110, terminate first = Auto Scaling's defaults 90 / 100; instance warmup 1 s)\n"
    );
    println!(
        "| nodes | zones | strategy | instance-refresh | status | pods at start | evictions | evictions per pod | pods scheduled onto an outdated node after the start | pods moved twice | Pending pod-seconds | longest Pending (s) | PDB violations | marks left | time to the end (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut broken = Vec::new();
    for &(nodes, zones) in sizes {
        for launch_first in [true, false] {
            for with in [true, false] {
                let row = bench::instance_refresh(nodes, zones, launch_first, with).await?;
                print_refresh_row(&row);
                let f = &row.figures;
                if f.status.as_deref() != Some("Successful")
                    || f.pdb_violations > 0
                    || f.marks_left > 0
                {
                    broken.push(format!(
                        "{nodes} nodes in {zones} zones, launch first {launch_first}, instance-refresh {with}"
                    ));
                }
            }
        }
    }
    println!();
    if broken.is_empty() {
        Ok(())
    } else {
        Err(format!("instance refresh: {}", broken.join("; ")))
    }
}

fn print_refresh_row(row: &bench::RefreshRow) {
    let f = &row.figures;
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {:.1} | {:.1} | {} | {} | {:.1} |",
        row.nodes,
        row.zones,
        if row.launch_before_terminate {
            "launch before terminate"
        } else {
            "terminate first"
        },
        if row.with_instance_refresh {
            "on"
        } else {
            "off"
        },
        f.status.as_deref().unwrap_or("did not end"),
        f.pods_at_start,
        f.evictions,
        f.evictions as f64 / f.pods_at_start.max(1) as f64,
        f.scheduled_onto_outdated,
        f.pods_moved_twice,
        f.pending_pod_seconds,
        f.longest_pending.as_secs_f64(),
        f.pdb_violations,
        f.marks_left,
        f.wall.as_secs_f64(),
    );
}

async fn drain_defaults(mode: Mode) -> Result<(), String> {
    let (pods, runs) = match mode {
        Mode::Quick => (30, 1),
        Mode::Full => (110, 5),
    };
    let f = bench::drain_with_default_timings(pods, runs).await?;
    println!(
        "## Drain with the default timings ({pods} pods of one Deployment, no PodDisruptionBudget, 30 s grace periods lasting 0.6 s, settle 1 s, no injected latency; medians of {} drains)\n",
        f.runs
    );
    println!(
        "| pods | notification → first eviction (ms) | → node empty (ms) | bound: one grace period (ms) | empty vs bound | → completed, load-balancer wait included (ms) | requests |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {pods} | {} | {} | {} | {:.2}x | {} | {} |\n",
        ms(f.first_eviction),
        ms(f.empty),
        ms(f.bound),
        f.empty.as_secs_f64() / f.bound.as_secs_f64(),
        ms(f.completed),
        f.requests
    );
    Ok(())
}

async fn notice_calls(mode: Mode) -> Result<(), String> {
    let sizes: &[usize] = match mode {
        Mode::Quick => &[100],
        Mode::Full => &[100, 1000, 5000],
    };
    println!(
        "## Instance notices: calls per event (three rebalance recommendations per kind of instance, REBALANCE_ACTION=cordon; averages per event)\n"
    );
    println!(
        "| nodes | the instance's node | DescribeInstances | DescribeAutoScalingGroups | Kubernetes requests | of them node lists | outcome |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &nodes in sizes {
        let f = bench::notice_calls(nodes).await?;
        for (kind, cost) in [
            ("named after its DNS name", &f.named),
            ("named otherwise", &f.renamed),
            ("none", &f.nodeless),
        ] {
            println!("| {nodes} | {kind} | {} |", cost.cells());
        }
    }
    println!();
    Ok(())
}

async fn spot_interruption(mode: Mode) -> Result<(), String> {
    let sizes: &[usize] = match mode {
        Mode::Quick => &[30],
        Mode::Full => &[30, 110],
    };
    let mix = match mode {
        Mode::Quick => {
            "grace periods scaled down for CI: 60% 1 s, 20% 2 s, 10% 3 s, 10% critical 1 s"
        }
        Mode::Full => {
            "60% of the pods with a 30 s grace period, 20% 60 s, 10% 300 s (more than the notice allows), 10% system-cluster-critical 30 s"
        }
    };
    println!(
        "## Spot interruption: notice to empty (one node, bare pods, {mix}; grace periods in real time; the instance ends 120 s after the warning, every pod's grace period is cut to end 5 s before it)
"
    );
    println!(
        "| pods | outcome | notice → first eviction (ms) | notice → node empty (ms) | pods gone before the end | with their own grace | with a cut grace (smallest, s) | critical pods gone at (ms) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut broken = Vec::new();
    for &pods in sizes {
        let f = bench::spot_interruption(pods, mode).await?;
        println!(
            "| {pods} | {} | {} | {} | {} of {pods} | {} | {}{} | {} |",
            f.outcome,
            f.notice_to_first_eviction.map_or("-".to_owned(), ms),
            f.notice_to_empty.map_or("not empty".to_owned(), ms),
            f.ended_before_end,
            f.with_own_grace,
            f.with_cut_grace,
            f.smallest_cut_grace
                .map(|g| format!(" ({g})"))
                .unwrap_or_default(),
            f.critical_gone_at.map_or("-".to_owned(), ms),
        );
        if f.ended_before_end != pods || f.outcome != "Drained" {
            broken.push(format!(
                "{pods} pods: {} of them ended in time",
                f.ended_before_end
            ));
        }
        if f.critical_pods > 0 && f.critical_gone_at.is_none() {
            broken.push(format!("{pods} pods: a critical pod outlived the instance"));
        }
    }
    println!();
    if broken.is_empty() {
        Ok(())
    } else {
        Err(format!("spot interruption: {}", broken.join("; ")))
    }
}

async fn aws_auth(mode: Mode) -> Result<(), String> {
    let (existing, concurrent) = match mode {
        Mode::Quick => (100, 5),
        Mode::Full => (1000, 50),
    };
    let figures = bench::aws_auth_concurrency(existing, concurrent).await?;
    println!("## aws-auth under concurrency\n");
    println!(
        "{} concurrent CreateNodegroup events (one function process each, cold) against a mapRoles of {} entries: wall {} ms, {} writes, {} conflicts retried, every role present once: {}; a redelivered event made {:?}\n",
        figures.concurrent_events,
        figures.existing_entries,
        ms(figures.wall),
        figures.writes,
        figures.conflicts,
        figures.all_present_once,
        figures.redelivery_requests
    );
    if !figures.all_present_once {
        return Err("aws-auth lost or duplicated an entry".to_owned());
    }
    Ok(())
}

/// A refresh's total time with the fixed settle period and with the measured waits (issue
/// #45): EKS's 60 s settle and a target group with a 30 s deregistration delay in full mode
/// (one node, 2 s and 1 s in quick mode).
async fn refresh_settle(mode: Mode) -> Result<(), String> {
    use bench::SettleCase;
    let (nodes, settle, delay) = match mode {
        Mode::Full => (4, 60.0, 30.0),
        Mode::Quick => (1, 2.0, 1.0),
    };
    println!(
        "## A refresh's total time: fixed settle or measured waits ({nodes} nodes, launch before terminate, SETTLE_SECONDS {settle}, target group deregistration delay {delay} s)\n"
    );
    println!(
        "| drains wait | load balancer | status | evictions | PDB violations | time to the end (s) | per node (s) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut broken = Vec::new();
    for case in [
        SettleCase::FixedSettle,
        SettleCase::NoLoadBalancer,
        SettleCase::TargetGroup,
    ] {
        let row = bench::refresh_with_waits(nodes, case, settle, delay).await?;
        let f = &row.figures;
        let (waits, behind) = match case {
            SettleCase::FixedSettle => (
                "SETTLE_SECONDS (LOAD_BALANCER_WAIT=false)",
                "instance target group",
            ),
            SettleCase::NoLoadBalancer => ("for the load balancers", "none"),
            SettleCase::TargetGroup => ("for the load balancers", "instance target group"),
        };
        let wall = f.wall.as_secs_f64();
        println!(
            "| {waits} | {behind} | {} | {} | {} | {wall:.1} | {:.1} |",
            f.status.as_deref().unwrap_or("did not end"),
            f.evictions,
            f.pdb_violations,
            wall / nodes as f64
        );
        if f.status.as_deref() != Some("Successful") || f.pdb_violations > 0 {
            broken.push(format!("{case:?}"));
        }
    }
    println!();
    if broken.is_empty() {
        Ok(())
    } else {
        Err(format!("refresh-settle: {}", broken.join("; ")))
    }
}
