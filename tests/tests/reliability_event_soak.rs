//! The seeded event soak (`node_manager_testkit::soak::events`, issue 35): lost, repeated,
//! late and reordered events of every kind, failed invocations retried, API brownouts; after
//! one quiet reconcile period every invariant holds. Fifty seeds by default:
//!
//! ```sh
//! EVENT_SOAK_SEEDS=500 cargo test -p node-manager-testkit --release --test reliability_event_soak event_soak -- --nocapture
//! ```
//! (`EVENT_SOAK_SEED=N` starts at another seed; a failing seed prints how to rerun it alone.)
//! The checker's own test plants one violation of each invariant and sees it reported.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use node_manager::aws::InstanceFacts;
use node_manager::node_marks::checkpoint::CHECKPOINT_ANNOTATION;
use node_manager_testkit::soak::events::check::{
    self, CORDON_WITHOUT_LEAVING, DRAIN_NOT_RUNNING, EVICTION_FROM_KEPT_NODE,
    LIFECYCLE_NOT_DRAINED, MARK_AFTER_WARM_POOL, MARK_WITHOUT_REASON, REFRESH_MARK_ON_KEPT_NODE,
    REFRESH_MARKS_WITHOUT_ROOM, REPAIR_BEYOND_LIMITS,
};
use node_manager_testkit::soak::events::plan::{Fate, Member};
use node_manager_testkit::soak::events::world::{EventWorld, GROUPS, REFRESH_IDS};
use node_manager_testkit::soak::events::{SEEDS_AT_ONCE, SeedReport, run_seed};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn print(report: &SeedReport) {
    println!(
        "seed {}: {:?}; {} groups refreshing; {} steps ({} lost, {} duplicated, {} late), {} invocations ({} failed), {} continuations ({} re-deliveries), {} brownouts, {} evictions, {} refresh writes ({} room checks), {} warm-pool returns, {} repairs; {} violations; {:.1}s",
        report.seed,
        report.fates,
        report.groups_refreshing,
        report.steps,
        report.lost,
        report.duplicated,
        report.delayed,
        report.invocations,
        report.failed_invocations,
        report.continuations,
        report.redeliveries,
        report.brownouts,
        report.evictions,
        report.refresh_writes,
        report.room_checks,
        report.warm_pool_returns,
        report.repairs,
        report.violations.len(),
        report.elapsed.as_secs_f64()
    );
    for violation in &report.violations {
        println!("  VIOLATION seed {}: {violation}", report.seed);
    }
    if !report.violations.is_empty() {
        println!("  rerun alone: {}", report.rerun_hint());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_soak_keeps_every_invariant() {
    let count = env_number("EVENT_SOAK_SEEDS", 50);
    let first = env_number("EVENT_SOAK_SEED", 1);
    // A few seeds at a time (each is its own world), each printed as it ends.
    let mut reports = futures::stream::iter(first..first + count)
        .map(run_seed)
        .buffer_unordered(SEEDS_AT_ONCE);
    let mut failing = Vec::new();
    let (mut lost, mut duplicated, mut late, mut brownouts, mut evictions) = (0, 0, 0, 0, 0);
    let (mut refresh_writes, mut warm_pool_returns, mut repairs) = (0, 0, 0);
    let (mut redeliveries, mut two_refreshing, mut room_checks) = (0, 0, 0);
    while let Some(report) = reports.next().await {
        let report = &report;
        print(report);
        lost += report.lost;
        duplicated += report.duplicated;
        late += report.delayed;
        brownouts += report.brownouts;
        evictions += report.evictions;
        refresh_writes += report.refresh_writes;
        warm_pool_returns += report.warm_pool_returns;
        repairs += report.repairs;
        redeliveries += report.redeliveries;
        two_refreshing += usize::from(report.groups_refreshing == 2);
        room_checks += report.room_checks;
        if !report.violations.is_empty() {
            failing.push(format!(
                "seed {}: {:?}\n  rerun alone: {}",
                report.seed,
                report.violations,
                report.rerun_hint()
            ));
        }
    }
    println!(
        "EVENT SOAK: {count} seeds ({two_refreshing} with two groups refreshing at once), {lost} lost, {duplicated} duplicated, {late} late, {brownouts} brownouts, {evictions} evictions, {refresh_writes} refresh writes ({room_checks} room checks), {warm_pool_returns} warm-pool returns, {repairs} repairs, {redeliveries} re-deliveries, {} failing seeds",
        failing.len()
    );
    if count >= 20 {
        assert!(
            lost > 0
                && duplicated > 0
                && late > 0
                && brownouts > 0
                && evictions > 0
                && refresh_writes > 0
                && warm_pool_returns > 0
                && repairs > 0
                && redeliveries > 0
                && two_refreshing > 0
                && room_checks > 0,
            "the soak exercised too little"
        );
    }
    assert!(failing.is_empty(), "{}", failing.join("\n"));
}

fn member(i: u32, fate: Fate) -> Member {
    Member {
        instance_id: format!("i-0feed000000000{i:02}"),
        node: format!("ip-10-99-0-{i}.eu-west-1.compute.internal"),
        fate,
        group: 0,
    }
}

/// A rebalance cordon's record, past its time, as a lost or failed sweep leaves it.
fn stale_rebalance_cordon(instance: &str) -> String {
    use node_manager::node_marks::checkpoint::{
        DrainCheckpoint, InstanceNotice, NoticeKind, OutOfService, notice_action,
    };
    let past = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600);
    let mut record = DrainCheckpoint::start(
        &notice_action(GROUPS[0], instance),
        past,
        Duration::ZERO,
        "req-planted",
        Duration::from_secs(60),
    )
    .released(past);
    record.notice = Some(InstanceNotice {
        kind: NoticeKind::RebalanceRecommendation,
        received_at: past,
        instance_ends_at: None,
        cordon_only: true,
        scheduled_event: None,
    });
    record.out_of_service = Some(OutOfService {
        cordoned: true,
        ..OutOfService::default()
    });
    serde_json::to_string(&record).unwrap()
}

/// Each invariant can fail: with the reconciler never run, one planted violation of each is
/// reported by the checker.
#[tokio::test]
async fn the_checker_reports_a_planted_violation_of_each_invariant() {
    let kept = member(1, Fate::Stays);
    let spot = member(2, Fate::SpotInterrupted { terminated: false });
    let scaled = member(3, Fate::ScaleIn);
    let pooled = member(4, Fate::WarmPoolReturn { launch_lost: false });
    let world = EventWorld::start(vec![
        kept.clone(),
        spot.clone(),
        scaled.clone(),
        pooled.clone(),
    ])
    .await;
    let store = world.server.store();

    // 1 and 2: a stale rebalance cordon on a node that stays.
    store
        .modify::<Node>("", &kept.node, |node| {
            node.metadata.annotations.get_or_insert_default().insert(
                CHECKPOINT_ANNOTATION.into(),
                stale_rebalance_cordon(&kept.instance_id),
            );
            node.spec.get_or_insert_default().unschedulable = Some(true);
        })
        .unwrap();
    let planted = store.get::<Node>("", &kept.node).unwrap();
    assert!(
        node_manager::reconcile::NodeMarks::of(&planted)
            .checkpoint
            .is_some(),
        "the planted record parses"
    );
    // 3: EC2 marks a Spot request for termination, nobody drains.
    world.instances.notices.set_facts(
        &spot.instance_id,
        InstanceFacts {
            state: Some("running".into()),
            auto_scaling_group: Some(GROUPS[0].into()),
            spot_request_id: spot.spot_request(),
            private_dns_name: None,
        },
    );
    world
        .instances
        .notices
        .set_spot_status(&spot.spot_request().unwrap(), "marked-for-termination");
    // 4: a lifecycle action nobody completes.
    world.autoscaling.start_action(&scaled.action());
    // 6: the refresh's mark on nodes it does not replace; 9: taken out of service while they
    // accepted pods, with no room left for their pods (the other nodes are cordoned by the
    // plants of 1 and 7).
    let before_marks = check::RoomView::of(&store.list::<Node>(), &store.list::<Pod>());
    let nodes: kube::Api<Node> = kube::Api::all(world.client.clone());
    for marked in [&scaled, &spot] {
        let node = store.get::<Node>("", &marked.node).unwrap();
        node_manager::node_marks::refresh::mark_node(
            &nodes,
            node,
            REFRESH_IDS[0],
            GROUPS[0],
            &marked.instance_id,
            node_manager::node_marks::refresh::MarkAs::OutOfService { taint: None },
        )
        .await
        .unwrap();
    }
    // 7: back from the warm pool (its launch completed), still cordoned by its drain.
    world.autoscaling.start_action(&pooled.launch_action());
    node_manager::aws::AutoScaling::complete_lifecycle_action(
        &world.autoscaling,
        &pooled.launch_action(),
        node_manager::aws::LifecycleActionResult::Continue,
    )
    .await
    .unwrap();
    store
        .modify::<Node>("", &pooled.node, |node| {
            node.spec.get_or_insert_default().unschedulable = Some(true);
        })
        .unwrap();
    // 8: node repair replaces a node that is not broken.
    node_manager::aws::InstanceHealth::set_instance_unhealthy(&world.health, &kept.instance_id)
        .await
        .unwrap();
    // 5: a pod evicted, as the terminating hook, from the node that stays.
    let pod = store
        .list::<Pod>()
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&kept.node))
        .unwrap();
    let name = pod.metadata.name.clone().unwrap();
    let pods: kube::Api<Pod> = kube::Api::namespaced(world.client.clone(), "default");
    // The disruption controller computes a budget's status a moment after its pods change,
    // as kube-controller-manager does: evict once every budget allows it.
    let budgets_observed = || {
        store
            .list::<PodDisruptionBudget>()
            .iter()
            .all(|b| b.status.as_ref().is_some_and(|s| s.disruptions_allowed > 0))
    };
    let waiting_since = std::time::Instant::now();
    while !budgets_observed() {
        assert!(
            waiting_since.elapsed() < std::time::Duration::from_secs(10),
            "the budgets' status never allowed a disruption"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    pods.evict(&name, &Default::default()).await.unwrap();
    let seen = BTreeMap::from([(name, kept.node.clone())]);

    let mut found = check::check(&world, &seen, &[]).await;
    let now = check::RoomView::of(&store.list::<Node>(), &store.list::<Pod>());
    let newly_taken = now.newly_taken(&before_marks);
    assert_eq!(newly_taken.len(), 2, "{newly_taken:?}");
    found.extend(check::refresh_marks_have_room(
        &before_marks,
        &now,
        &newly_taken,
    ));
    let invariants: std::collections::BTreeSet<&str> = found.iter().map(|v| v.invariant).collect();
    for expected in [
        MARK_WITHOUT_REASON,
        CORDON_WITHOUT_LEAVING,
        DRAIN_NOT_RUNNING,
        LIFECYCLE_NOT_DRAINED,
        EVICTION_FROM_KEPT_NODE,
        REFRESH_MARK_ON_KEPT_NODE,
        MARK_AFTER_WARM_POOL,
        REPAIR_BEYOND_LIMITS,
        REFRESH_MARKS_WITHOUT_ROOM,
    ] {
        assert!(
            invariants.contains(expected),
            "{expected} not reported: {found:#?}"
        );
    }
}

/// A clean world breaks no invariant (the checker does not cry wolf).
#[tokio::test]
async fn the_checker_reports_nothing_on_a_world_where_nothing_happened() {
    let world = EventWorld::start(vec![member(1, Fate::Stays), member(2, Fate::Rebalanced)]).await;
    let found = check::check(&world, &BTreeMap::new(), &[]).await;
    assert!(found.is_empty(), "{found:#?}");
}
