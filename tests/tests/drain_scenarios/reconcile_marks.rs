//! The reconciler on the terminating hook's schedule, with marks of two features on one node:
//! a rebalance cordon and an instance refresh's record (issue 35, item 6).

use super::*;
use node_manager::aws::InstanceFacts;
use node_manager::instance_notice::handle_terminating_hook_event;
use node_manager::node_marks::refresh::{REFRESH_ANNOTATION, REFRESH_LABEL, refresh_marks_of};

const SPOT_REQUEST: &str = "sir-0a1b2c3d";
const REFRESH: &str = "0d4a5c7e-1111-4222-8333-944445555666";

fn event(detail_type: &str, source: &str, detail: Value) -> Value {
    json!({
        "version": "0", "id": "a1b2c3d4-0000-4000-8000-0000000000aa",
        "detail-type": detail_type, "source": source, "account": "111111111111",
        "time": jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap().to_string(),
        "region": "eu-west-1",
        "resources": [format!("arn:aws:ec2:eu-west-1:111111111111:instance/{INSTANCE}")],
        "detail": detail,
    })
}

async fn run(drainer: &TestDrainer, event: Value, request_id: &str) -> Value {
    let invocation = invocation(request_id, Duration::from_secs(120));
    let response = handle_terminating_hook_event(drainer, event, &invocation)
        .await
        .unwrap();
    serde_json::to_value(&response).unwrap()
}

fn tick() -> Value {
    event("Scheduled Event", "aws.events", json!({}))
}

fn is_cordoned(s: &Scenario) -> bool {
    let node = s.server.store().get::<Node>("", NODE).unwrap();
    node.spec.and_then(|s| s.unschedulable) == Some(true)
}

/// The node as an instance refresh's start left it: cordoned and labelled, with its record.
fn marked_by_refresh(s: &Scenario) {
    let record = json!({
        "instanceRefreshId": REFRESH, "autoScalingGroupName": GROUP, "instanceId": INSTANCE,
        "markedAt": jiff::Timestamp::now().to_string(),
        "outOfService": {"labelled": true, "cordoned": true},
    });
    s.server
        .store()
        .modify::<Node>("", NODE, |node| {
            let labels = node.metadata.labels.get_or_insert_default();
            labels.insert(REFRESH_LABEL.into(), REFRESH.into());
            labels.insert(EXCLUDE_FROM_LOAD_BALANCERS_LABEL.into(), "true".into());
            node.metadata
                .annotations
                .get_or_insert_default()
                .insert(REFRESH_ANNOTATION.into(), record.to_string());
            node.spec.get_or_insert_default().unschedulable = Some(true);
        })
        .unwrap();
}

#[tokio::test]
async fn reconcile_a_rebalance_cordon_neither_swallows_a_running_refresh_nor_lifts_its_cordon() {
    let s = reference_cluster(false, 1).await;
    s.instances.notices.set_facts(
        INSTANCE,
        InstanceFacts {
            state: Some("running".into()),
            auto_scaling_group: Some(GROUP.into()),
            spot_request_id: Some(SPOT_REQUEST.into()),
            private_dns_name: None,
        },
    );
    s.autoscaling.set_lifecycle_state(INSTANCE, "InService");
    s.autoscaling
        .set_refresh_status(GROUP, REFRESH, "InProgress");
    marked_by_refresh(&s);
    let drainer = s.drainer(&[("REBALANCE_UNDO_SECONDS", "1")]);

    let cordoned = run(
        &drainer,
        event(
            "EC2 Instance Rebalance Recommendation",
            "aws.ec2",
            json!({"instance-id": INSTANCE}),
        ),
        "req-rebalance",
    )
    .await;
    assert_eq!(
        cordoned["instances"][0]["outcome"], "CordonedOnly",
        "{cordoned}"
    );
    let node = s.server.store().get::<Node>("", NODE).unwrap();
    assert!(
        refresh_marks_of(&node).is_some(),
        "the refresh's record stays the refresh's"
    );

    // The rebalance cordon's time passes while the refresh runs: nothing is lifted.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let swept = run(&drainer, tick(), "req-tick-1").await;
    assert!(is_cordoned(&s), "{swept}");
    assert!(refresh_marks_of(&s.server.store().get::<Node>("", NODE).unwrap()).is_some());

    // The refresh ends (its end event lost): its marks go, and the rebalance cordon with them.
    s.autoscaling
        .set_refresh_status(GROUP, REFRESH, "Successful");
    let swept = run(&drainer, tick(), "req-tick-2").await;
    let outcomes: Vec<&str> = swept["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["outcome"].as_str().unwrap())
        .collect();
    // The record that goes last takes the common label with it, in the same write.
    assert_eq!(
        outcomes,
        ["RefreshMarksRemoved", "RebalanceCordonUndone"],
        "{swept}"
    );
    assert!(!is_cordoned(&s));
    assert!(s.checkpoint().is_none());
    let node = s.server.store().get::<Node>("", NODE).unwrap();
    let labels = node.metadata.labels.unwrap_or_default();
    assert!(
        !labels.contains_key("open-node-manager.io/marked"),
        "{labels:?}"
    );
}

/// A Health event far ahead, as AWS Health sends it.
fn health_event(starts_at: jiff::Timestamp) -> Value {
    let start = jiff::fmt::rfc2822::to_string(&starts_at.to_zoned(jiff::tz::TimeZone::UTC))
        .unwrap()
        .replace("+0000", "GMT");
    json!({
        "version": "0", "id": "h-2", "detail-type": "AWS Health Event", "source": "aws.health",
        "account": "111111111111", "time": jiff::Timestamp::now().to_string(), "region": "eu-west-1",
        "resources": [INSTANCE],
        "detail": {
            "eventArn": "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/y",
            "service": "EC2", "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange", "startTime": start,
            "affectedEntities": [{"entityValue": INSTANCE}],
        }
    })
}

/// Issue 35, reconcile after each event: a refresh's record whose end event was lost goes as
/// soon as another event about the node is handled, without waiting for the schedule.
#[tokio::test]
async fn a_stale_mark_goes_right_after_an_event_about_its_node_without_a_tick() {
    let s = reference_cluster(false, 1).await;
    s.instances.notices.set_facts(
        INSTANCE,
        InstanceFacts {
            state: Some("running".into()),
            auto_scaling_group: Some(GROUP.into()),
            ..InstanceFacts::default()
        },
    );
    s.autoscaling.set_lifecycle_state(INSTANCE, "InService");
    marked_by_refresh(&s);
    // The refresh is over; its end event was lost.
    s.autoscaling
        .set_refresh_status(GROUP, REFRESH, "Successful");
    let starts_at =
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 2 * 86_400).unwrap();
    s.instances.notices.schedule(
        INSTANCE,
        node_manager::aws::ScheduledInstanceEvent {
            id: None,
            code: "instance-retirement".into(),
            not_before: Some(starts_at),
            description: "The instance is running on degraded hardware".into(),
        },
    );
    let drainer = s.drainer(&[]);
    let planned = run(&drainer, health_event(starts_at), "req-health").await;
    assert_eq!(
        planned["instances"][0]["outcome"], "MaintenancePlanned",
        "{planned}"
    );
    let node = s.server.store().get::<Node>("", NODE).unwrap();
    assert!(
        refresh_marks_of(&node).is_none(),
        "the lost end's marks are gone with the event"
    );
    assert!(!is_cordoned(&s), "the refresh's cordon is undone");
    assert!(
        node.metadata
            .labels
            .unwrap_or_default()
            .contains_key("open-node-manager.io/maintenance"),
        "the event's own plan stays"
    );
}

/// Found by the event soak: a Spot interruption warning lost, on a node with no mark of ours;
/// the next scheduled run finds the request EC2 marks for interruption and drains the node.
#[tokio::test]
async fn a_lost_spot_warning_is_drained_by_the_next_scheduled_run() {
    let s = reference_cluster(false, 1).await;
    s.instances.notices.set_facts(
        INSTANCE,
        InstanceFacts {
            state: Some("running".into()),
            auto_scaling_group: Some(GROUP.into()),
            spot_request_id: Some(SPOT_REQUEST.into()),
            private_dns_name: None,
        },
    );
    s.instances
        .notices
        .set_spot_status(SPOT_REQUEST, "marked-for-termination");
    s.autoscaling.set_lifecycle_state(INSTANCE, "InService");
    let drainer = s.drainer(&[]);
    let swept = run(&drainer, tick(), "req-tick").await;
    assert_eq!(swept["instances"][0]["instanceId"], INSTANCE, "{swept}");
    assert_eq!(swept["instances"][0]["outcome"], "Drained", "{swept}");
    assert_eq!(s.running_pods_on(NODE, "nginx-"), 0);
    assert!(is_cordoned(&s));
    // The request no longer marked (the instance is gone or kept): nothing more to drain.
    s.instances
        .notices
        .set_spot_status(SPOT_REQUEST, "fulfilled");
    let again = run(&drainer, tick(), "req-tick-2").await;
    assert!(
        again["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["outcome"] != "Drained"),
        "{again}"
    );
}

/// Found by the event soak (seeds 255, 288, 388, 423): an AWS Health event lost, on a node
/// with no mark of ours; the next scheduled run finds the pending event in EC2's schedule and
/// plans the maintenance as the Health event would have, or drains the node when it is due.
#[tokio::test]
async fn a_lost_health_event_is_planned_or_drained_by_the_next_scheduled_run() {
    let s = reference_cluster(false, 1).await;
    s.instances.notices.set_facts(
        INSTANCE,
        InstanceFacts {
            state: Some("running".into()),
            auto_scaling_group: Some(GROUP.into()),
            ..InstanceFacts::default()
        },
    );
    s.autoscaling.set_lifecycle_state(INSTANCE, "InService");
    let in_seconds =
        |s: i64| jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + s).unwrap();
    let reboot = |starts_at| node_manager::aws::ScheduledInstanceEvent {
        id: None,
        code: "system-reboot".into(),
        not_before: Some(starts_at),
        description: "scheduled reboot".into(),
    };
    // Two days ahead: planned for the margin before its start, the node left in service.
    let far = in_seconds(2 * 86_400);
    s.instances
        .notices
        .set_schedule(INSTANCE, vec![reboot(far)]);
    let drainer = s.drainer(&[]);
    let swept = run(&drainer, tick(), "req-tick").await;
    assert_eq!(swept["instances"][0]["instanceId"], INSTANCE, "{swept}");
    assert_eq!(
        swept["instances"][0]["outcome"], "MaintenancePlanned",
        "{swept}"
    );
    let node = s.server.store().get::<Node>("", NODE).unwrap();
    let record = node_manager::node_marks::maintenance::MaintenanceRecord::of(&node).unwrap();
    assert_eq!(
        record.type_code,
        "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED"
    );
    assert_eq!(record.starts_at, far);
    assert_eq!(
        record.drain_from,
        far - jiff::SignedDuration::from_secs(3600)
    );
    assert!(!is_cordoned(&s));
    // Planned already: the next run leaves it to the reconciler.
    let again = run(&drainer, tick(), "req-tick-2").await;
    assert_eq!(again["instances"], json!([]), "{again}");
    // EC2 moved it to within the margin and the plan is gone with its node's marks: drained.
    s.server
        .store()
        .modify::<Node>("", NODE, |node| {
            let labels = node.metadata.labels.get_or_insert_default();
            labels.remove("open-node-manager.io/maintenance");
            labels.remove("open-node-manager.io/marked");
            let annotations = node.metadata.annotations.get_or_insert_default();
            annotations.remove("open-node-manager.io/maintenance");
        })
        .unwrap();
    s.instances
        .notices
        .set_schedule(INSTANCE, vec![reboot(in_seconds(600))]);
    let due = run(&drainer, tick(), "req-tick-3").await;
    assert_eq!(due["instances"][0]["outcome"], "Drained", "{due}");
    assert_eq!(s.running_pods_on(NODE, "nginx-"), 0);
    assert!(is_cordoned(&s));
}

/// What one reconcile run costs in calls, for a cluster of `nodes` nodes of which `marked`
/// carry a maintenance plan: (Kubernetes requests, AWS calls, wall time).
async fn cost_of_a_run(nodes: usize, marked: usize) -> (usize, u32, Duration) {
    use node_manager::reconcile::Policy;
    use node_manager::reconcile::run::reconcile_marks;
    let s = reference_cluster(false, 1).await;
    let store = s.server.store();
    let plan_from = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24 * 7);
    for i in 0..nodes.saturating_sub(2) {
        let instance = format!("i-{i:017x}");
        let mut node = fixtures::node(
            &format!("ip-10-1-{}-{}.eu-west-1.compute.internal", i / 250, i % 250),
            &format!("aws:///eu-west-1a/{instance}"),
        );
        if i < marked {
            node_manager_testkit::bench::sweep::mark_planned(&mut node, &instance, None, plan_from);
            s.instances.notices.set_facts(
                &instance,
                InstanceFacts {
                    state: Some("running".into()),
                    auto_scaling_group: Some(GROUP.into()),
                    spot_request_id: None,
                    private_dns_name: None,
                },
            );
            s.instances.notices.schedule(
                &instance,
                node_manager::aws::ScheduledInstanceEvent {
                    id: None,
                    code: "instance-retirement".into(),
                    not_before: Some(plan_from),
                    description: "The instance is running on degraded hardware".into(),
                },
            );
        }
        store.create(&node).unwrap();
    }
    let before = s.function_requests().len();
    let policy = Policy {
        maintenance_margin: Duration::from_secs(3600),
        rebalance_undo: Duration::from_secs(1800),
    };
    let started = std::time::Instant::now();
    let reconciled = reconcile_marks(&s.function_client, &s.instances, &s.autoscaling, policy)
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        reconciled.nodes, marked,
        "only the marked nodes are looked at"
    );
    assert!(reconciled.outcomes.is_empty(), "{:?}", reconciled.outcomes);
    let kube = s.function_requests().len() - before;
    (kube, reconciled.aws_calls.values().sum(), took)
}

/// Calls per run grow with the marked nodes, not with the cluster (the figures are printed
/// for BENCHMARKS.md: `cargo nextest run -p node-manager-testkit --test drain_scenarios
/// reconcile_calls --no-capture`).
#[tokio::test]
async fn reconcile_calls_grow_with_the_marked_nodes_not_with_the_cluster() {
    let mut sizes = vec![(100, 0), (100, 10), (1000, 0), (1000, 10), (1000, 100)];
    // The 5,000-node rows of BENCHMARKS.md: `RECONCILE_CALLS_FULL=1`.
    if std::env::var_os("RECONCILE_CALLS_FULL").is_some() {
        sizes.extend([(5000, 0), (5000, 10), (5000, 100)]);
    }
    let mut rows = Vec::new();
    for (nodes, marked) in sizes {
        let (kube, aws, took) = cost_of_a_run(nodes, marked).await;
        println!(
            "reconcile run: {nodes} nodes, {marked} marked: {kube} Kubernetes requests, {aws} AWS calls, {took:?}"
        );
        rows.push((nodes, marked, kube, aws));
    }
    let of = |nodes, marked| {
        rows.iter()
            .find(|r| r.0 == nodes && r.1 == marked)
            .map(|r| (r.2, r.3))
            .unwrap()
    };
    assert_eq!(
        of(100, 0),
        of(1000, 0),
        "nothing marked: the same cost at any size"
    );
    assert_eq!(
        of(100, 10),
        of(1000, 10),
        "ten marked: the same cost at any size"
    );
    assert_eq!(
        of(1000, 0),
        (3, 0),
        "three label-selected lists, no AWS call"
    );
    if rows.iter().any(|r| r.0 == 5000) {
        assert_eq!(
            of(5000, 10),
            of(100, 10),
            "ten marked: the same cost at 5,000 nodes"
        );
        assert_eq!(of(5000, 100), of(1000, 100));
    }
}
