//! Instance notices on the terminating hook: the Spot interruption warning's two-minute drain,
//! exactly one drain when a lifecycle notification for the same instance comes too (either
//! order), rebalance recommendations (cordon, undone by the sweep when no termination
//! follows), scheduled maintenance (planned, drained by the sweep when due, nothing when
//! past), and the events that must change nothing (another cluster, unconfirmed, malformed).

use super::*;
use node_manager::aws::{InstanceFacts, ScheduledInstanceEvent};
use node_manager::instance_notice::{
    TerminatingHookError, TerminatingHookResponse, handle_terminating_hook_event,
};
use node_manager::node_marks::checkpoint::NoticeKind;
use node_manager::node_marks::maintenance::{MAINTENANCE_ANNOTATION, MAINTENANCE_LABEL};

const SPOT_REQUEST: &str = "sir-0a1b2c3d";

/// The reference cluster, the instance a Spot instance of the group whose request EC2 has
/// marked for termination.
async fn spot_cluster(nginx_grace: i64) -> Scenario {
    let s = reference_cluster(false, nginx_grace).await;
    set_facts(&s, "running", Some(GROUP), true);
    s.instances
        .notices
        .set_spot_status(SPOT_REQUEST, "marked-for-termination");
    s
}

/// The reference cluster, the instance a Spot instance of the group EC2 is not interrupting
/// (its request fulfilled): a rebalance recommendation or a maintenance, not an interruption.
async fn spot_cluster_kept(nginx_grace: i64) -> Scenario {
    let s = spot_cluster(nginx_grace).await;
    s.instances
        .notices
        .set_spot_status(SPOT_REQUEST, "fulfilled");
    s
}

/// What EC2 answers about the instance: its state, its group, whether it is a Spot instance
/// (with [`SPOT_REQUEST`]).
fn set_facts(s: &Scenario, state: &str, group: Option<&str>, spot: bool) {
    s.instances.notices.set_facts(
        INSTANCE,
        InstanceFacts {
            state: Some(state.into()),
            auto_scaling_group: group.map(str::to_owned),
            spot_request_id: spot.then(|| SPOT_REQUEST.to_owned()),
            ..InstanceFacts::default()
        },
    );
}

fn ec2_event(detail_type: &str, time: jiff::Timestamp, detail: Value) -> Value {
    json!({
        "version": "0", "id": "a1b2c3d4-0000-4000-8000-000000000001",
        "detail-type": detail_type, "source": "aws.ec2", "account": "111111111111",
        "time": time.to_string(), "region": "eu-west-1",
        "resources": [format!("arn:aws:ec2:eu-west-1:111111111111:instance/{INSTANCE}")],
        "detail": detail,
    })
}

/// A Spot interruption warning sent `ago` before now (the instance goes 120 s after it).
fn spot_warning(ago: Duration) -> Value {
    let time = jiff::Timestamp::now() - jiff::SignedDuration::try_from(ago).unwrap();
    let time = jiff::Timestamp::from_second(time.as_second()).unwrap();
    ec2_event(
        "EC2 Spot Instance Interruption Warning",
        time,
        json!({"instance-id": INSTANCE, "instance-action": "terminate"}),
    )
}

fn rebalance() -> Value {
    ec2_event(
        "EC2 Instance Rebalance Recommendation",
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap(),
        json!({"instance-id": INSTANCE}),
    )
}

fn sweep_event() -> Value {
    json!({"version": "0", "id": "s-1", "detail-type": "Scheduled Event", "source": "aws.events",
           "account": "111111111111", "time": "2026-11-27T10:00:00Z", "region": "eu-west-1",
           "resources": [], "detail": {}})
}

fn health_event(starts_at: jiff::Timestamp) -> Value {
    let start = jiff::fmt::rfc2822::to_string(&starts_at.to_zoned(jiff::tz::TimeZone::UTC))
        .unwrap()
        .replace("+0000", "GMT");
    json!({
        "version": "0", "id": "h-1", "detail-type": "AWS Health Event", "source": "aws.health",
        "account": "111111111111", "time": "2026-11-27T10:00:00Z", "region": "eu-west-1",
        "resources": [INSTANCE],
        "detail": {
            "eventArn": "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/x",
            "service": "EC2", "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange", "startTime": start,
            "affectedEntities": [{"entityValue": INSTANCE}],
        }
    })
}

async fn notice(
    drainer: &TestDrainer,
    event: Value,
    request_id: &str,
) -> Result<Value, TerminatingHookError> {
    let invocation = invocation(request_id, Duration::from_secs(120));
    let response = handle_terminating_hook_event(drainer, event, &invocation).await?;
    assert!(matches!(response, TerminatingHookResponse::Notice(_)));
    Ok(serde_json::to_value(&response).unwrap())
}

fn outcome(response: &Value) -> String {
    response["instances"][0]["outcome"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The grace periods the function sent with its evictions, by pod.
fn sent_graces(s: &Scenario) -> Vec<(String, Option<i64>)> {
    s.server
        .audit()
        .subresource_requests("pods", "eviction")
        .iter()
        .filter(|e| e.user.username == "terminating-hook")
        .map(|e| {
            let grace = e
                .request_object
                .as_ref()
                .and_then(|b| b["deleteOptions"]["gracePeriodSeconds"].as_i64());
            (e.name().to_owned(), grace)
        })
        .collect()
}

fn node(s: &Scenario) -> Node {
    s.server.store().get::<Node>("", NODE).unwrap()
}

fn is_cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

fn function_writes(s: &Scenario) -> Vec<AuditEvent> {
    s.function_requests()
        .into_iter()
        .filter(|e| matches!(e.verb.as_str(), "patch" | "create" | "update" | "delete"))
        .filter(|e| e.resource() != "events")
        .collect()
}

#[tokio::test]
async fn a_spot_warning_drains_the_node_in_time_with_grace_periods_capped_and_critical_pods_last() {
    // Right after the warning: 120 s left, so nginx's 300 s grace periods are cut to at
    // most 115 s, and coredns (30 s) is not due before the others are gone.
    let s = spot_cluster(300).await;
    let drainer = s.drainer(&[("DRAIN_TIMEOUT_SECONDS", "900")]);
    let response = notice(&drainer, spot_warning(Duration::ZERO), "req-spot")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "Drained", "{response}");
    assert_eq!(response["event"], "SpotInterruptionWarning");

    let node = node(&s);
    assert!(is_cordoned(&node));
    assert_eq!(
        node.metadata.labels.as_ref().unwrap()[EXCLUDE_FROM_LOAD_BALANCERS_LABEL],
        "true"
    );
    let graces = sent_graces(&s);
    assert_eq!(graces.len(), 5, "{graces:?}");
    for (pod, grace) in &graces {
        let grace = grace.unwrap_or_else(|| panic!("{pod}: no grace period sent"));
        if pod.starts_with("nginx-") {
            assert!((100..=115).contains(&grace), "{pod}: {grace}");
        } else {
            assert!(grace <= 30, "{pod}: {grace}");
        }
    }
    let evicted = evicted_pod_names(&s);
    assert!(
        evicted.last().is_some_and(|n| n.starts_with("coredns-")),
        "critical last: {evicted:?}"
    );
    // The notice's drain is over: recorded, lease let go, no lifecycle action touched.
    let checkpoint = s.checkpoint().unwrap();
    assert!(checkpoint.action.is_notice());
    assert!(checkpoint.completed_at.is_some());
    assert_eq!(checkpoint.lease.holder, None);
    let recorded = checkpoint.notice.unwrap();
    assert_eq!(recorded.kind, NoticeKind::SpotInterruption);
    assert!(s.autoscaling.completions().is_empty());

    // A repeated warning finds the drain done and writes nothing.
    let before = function_writes(&s).len();
    let again = notice(
        &drainer,
        spot_warning(Duration::from_secs(100)),
        "req-again",
    )
    .await
    .unwrap();
    assert_eq!(outcome(&again), "AlreadyDrained");
    assert_eq!(function_writes(&s).len(), before);
}

/// When a request reached the API server.
fn received(event: &AuditEvent) -> jiff::Timestamp {
    event.request_received_timestamp.parse().unwrap()
}

#[tokio::test]
async fn a_critical_pod_that_would_end_too_late_is_evicted_with_the_others() {
    // 100 s left: a critical pod with a 100 s grace period cannot wait for nginx (its 300 s
    // cut to 95 s, 0.95 s in the emulation) and still end before the instance.
    let s = spot_cluster(300).await;
    let mut agent = fixtures::running_pod("kube-system", "node-agent", NODE, &[("app", "agent")]);
    if let Some(spec) = agent.spec.as_mut() {
        spec.priority_class_name = Some("system-node-critical".into());
        spec.termination_grace_period_seconds = Some(100);
    }
    s.create(&agent);
    let drainer = s.drainer(&[]);
    let response = notice(&drainer, spot_warning(Duration::from_secs(20)), "req-spot")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "Drained", "{response}");
    let evictions = s.server.audit().subresource_requests("pods", "eviction");
    let first_nginx = evictions
        .iter()
        .filter(|e| e.name().starts_with("nginx-"))
        .map(received)
        .min()
        .unwrap();
    let agent = evictions.iter().find(|e| e.name() == "node-agent").unwrap();
    let waited = received(agent).duration_since(first_nginx);
    assert!(
        waited < jiff::SignedDuration::from_millis(500),
        "the agent waited {waited:?} for nginx to leave"
    );
    let grace = agent.request_object.as_ref().unwrap()["deleteOptions"]["gracePeriodSeconds"]
        .as_i64()
        .unwrap();
    assert!((90..=95).contains(&grace), "{grace}");
}

#[tokio::test]
async fn a_warning_then_the_lifecycle_notification_drain_once_and_complete_the_action() {
    let s = spot_cluster(1).await;
    // The notice drain outlasts several of its leases (it settles 2 s, renewing a 0.5 s
    // lease): a lifecycle drain that took a renewed lease for a duplicate would leave its
    // action uncompleted.
    let drainer = s.drainer(&[
        ("DRAIN_TIMEOUT_SECONDS", "30"),
        ("SETTLE_SECONDS", "2"),
        ("DRAIN_LEASE_SECONDS", "0.5"),
    ]);
    // Both at once, the warning a moment earlier: the lifecycle drain waits for the notice
    // drain to end and takes it over.
    let spot = notice(&drainer, spot_warning(Duration::from_secs(60)), "req-spot");
    let lifecycle = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        drain_terminating(&drainer, "req-hook", Duration::from_secs(120)).await
    };
    let (spot, lifecycle) = tokio::join!(spot, lifecycle);
    let spot = spot.unwrap();
    assert_eq!(outcome(&spot), "Drained", "{spot}");
    let lifecycle = lifecycle.unwrap();
    assert!(
        matches!(
            lifecycle.outcomes.as_slice(),
            [DeliveryOutcome::Completed {
                result: LifecycleActionResult::Continue,
                ..
            }]
        ),
        "{:?}",
        lifecycle.outcomes
    );
    completed_once(&s, LifecycleActionResult::Continue);
    // Exactly one drain: every pod was asked to leave once.
    let requests = sent_graces(&s);
    let names: BTreeSet<&String> = requests.iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), requests.len(), "evicted twice: {requests:?}");
    assert_eq!(requests.len(), 5);
    let checkpoint = s.checkpoint().unwrap();
    assert!(
        !checkpoint.action.is_notice(),
        "the lifecycle drain took it over"
    );
    assert!(checkpoint.completed_at.is_some());
    assert_eq!(s.events_with_reason("DrainStarted").len(), 1);
}

#[tokio::test]
async fn a_warning_during_a_lifecycle_drain_joins_it_and_brings_its_deadline_forward() {
    // A budget nothing can satisfy holds the lifecycle drain (deadline 60 s) until the
    // warning's end, 115 s after a warning sent 110 s ago: about 5 s.
    let s = spot_cluster(1).await;
    s.create(&fixtures::pdb_min_available(
        "default",
        "nginx-strict",
        4,
        &[("app", "nginx")],
    ));
    let drainer = s.drainer(&[
        ("DRAIN_TIMEOUT_SECONDS", "60"),
        ("DRAIN_LEASE_SECONDS", "1"),
    ]);
    let started = tokio::time::Instant::now();
    let lifecycle = drain_terminating(&drainer, "req-hook", Duration::from_secs(120));
    let spot = async {
        s.wait_until("the lifecycle drain is on the node", || {
            s.checkpoint().is_some_and(|c| !c.action.is_notice())
        })
        .await;
        notice(&drainer, spot_warning(Duration::from_secs(110)), "req-spot").await
    };
    let (lifecycle, spot) = tokio::join!(lifecycle, spot);
    assert_eq!(outcome(&spot.unwrap()), "JoinedLifecycleDrain");
    let report = lifecycle.unwrap();
    let (result, stuck, _) = eviction_failure(&report);
    assert_eq!(result, LifecycleActionResult::Continue);
    assert!(!stuck.is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the drain kept its own 60 s deadline: {:?}",
        started.elapsed()
    );
    completed_once(&s, LifecycleActionResult::Continue);
    let checkpoint = s.checkpoint().unwrap();
    assert_eq!(
        checkpoint.notice.map(|n| n.kind),
        Some(NoticeKind::SpotInterruption)
    );
}

#[tokio::test]
async fn events_of_other_clusters_and_unconfirmed_warnings_write_nothing() {
    let s = spot_cluster(30).await;
    let drainer = s.drainer(&[]);

    // Not in any group (Karpenter's, standalone).
    set_facts(&s, "running", None, true);
    let response = notice(&drainer, spot_warning(Duration::ZERO), "req-1")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "Foreign", "{response}");

    // Another cluster's group.
    s.autoscaling
        .add_group("other-ng", &[("eks:cluster-name", "another-cluster")]);
    set_facts(&s, "running", Some("other-ng"), true);
    let response = notice(&drainer, spot_warning(Duration::ZERO), "req-2")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "Foreign", "{response}");

    // Another account.
    let mut foreign = spot_warning(Duration::ZERO);
    foreign["account"] = json!("222222222222");
    let response = notice(&drainer, foreign, "req-3").await.unwrap();
    assert_eq!(outcome(&response), "Foreign", "{response}");

    // Ours, but EC2 has not marked the Spot request: an error, nothing written.
    set_facts(&s, "running", Some(GROUP), true);
    s.instances
        .notices
        .set_spot_status(SPOT_REQUEST, "fulfilled");
    let error = notice(&drainer, spot_warning(Duration::ZERO), "req-4")
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("not marked for interruption"),
        "{error}"
    );

    // Malformed: a clear error naming the field.
    let mut malformed = spot_warning(Duration::ZERO);
    malformed["detail"]["instance-id"] = json!("i-../../etc");
    let error = notice(&drainer, malformed, "req-5").await.unwrap_err();
    assert!(error.to_string().contains("instance-id"), "{error}");

    // A warning whose two minutes are over: nothing to do.
    s.instances
        .notices
        .set_spot_status(SPOT_REQUEST, "marked-for-termination");
    let response = notice(&drainer, spot_warning(Duration::from_secs(130)), "req-6")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "Past", "{response}");

    assert!(function_writes(&s).is_empty(), "{:?}", function_writes(&s));
    assert!(!is_cordoned(&node(&s)));
}

#[tokio::test]
async fn a_rebalance_cordon_is_undone_by_the_sweep_when_no_termination_follows() {
    let s = spot_cluster_kept(1).await;
    let drainer = s.drainer(&[("REBALANCE_UNDO_SECONDS", "1")]);
    let response = notice(&drainer, rebalance(), "req-1").await.unwrap();
    assert_eq!(outcome(&response), "CordonedOnly", "{response}");
    assert!(is_cordoned(&node(&s)));
    assert!(
        evicted_pod_names(&s).is_empty(),
        "cordon only: nothing evicted"
    );

    // Not yet due: the sweep leaves it.
    let swept = notice(&drainer, sweep_event(), "req-sweep-1")
        .await
        .unwrap();
    assert_eq!(swept["instances"], json!([]), "{swept}");
    assert!(is_cordoned(&node(&s)));

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let swept = notice(&drainer, sweep_event(), "req-sweep-2")
        .await
        .unwrap();
    assert_eq!(outcome(&swept), "RebalanceCordonUndone", "{swept}");
    let node = node(&s);
    assert!(!is_cordoned(&node));
    assert!(
        !node
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(EXCLUDE_FROM_LOAD_BALANCERS_LABEL)
    );
    assert!(s.checkpoint().is_none());
}

#[tokio::test]
async fn a_rebalance_cordon_taken_over_by_the_termination_is_not_undone_and_someone_elses_cordon_stays()
 {
    let s = spot_cluster_kept(1).await;
    let drainer = s.drainer(&[("REBALANCE_UNDO_SECONDS", "1")]);
    assert_eq!(
        outcome(&notice(&drainer, rebalance(), "req-1").await.unwrap()),
        "CordonedOnly"
    );
    // Capacity Rebalancing's replacement is up: the group terminates the instance.
    let report = drain_terminating(&drainer, "req-hook", Duration::from_secs(60))
        .await
        .unwrap();
    drained_and_completed_once(&s, &report);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let swept = notice(&drainer, sweep_event(), "req-sweep").await.unwrap();
    assert_eq!(swept["instances"], json!([]), "{swept}");
    assert!(
        is_cordoned(&node(&s)),
        "the drained node stays out of service"
    );
}

#[tokio::test]
async fn rebalance_none_leaves_the_node_and_drain_drains_it() {
    let s = spot_cluster(1).await;
    let nothing = s.drainer(&[("REBALANCE_ACTION", "none")]);
    assert_eq!(
        outcome(&notice(&nothing, rebalance(), "req-1").await.unwrap()),
        "Ignored"
    );
    assert!(function_writes(&s).is_empty());
    let drain = s.drainer(&[("REBALANCE_ACTION", "drain")]);
    assert_eq!(
        outcome(&notice(&drain, rebalance(), "req-2").await.unwrap()),
        "Drained"
    );
    assert_eq!(evicted_pod_names(&s).len(), 5);
}

#[tokio::test]
async fn scheduled_maintenance_is_planned_then_drained_by_the_sweep_and_a_past_one_is_ignored() {
    let s = spot_cluster_kept(1).await;
    let drainer = s.drainer(&[("MAINTENANCE_DRAIN_MARGIN_SECONDS", "3600")]);
    // EC2 confirms a retirement in two hours: planned, node left in service.
    let starts_at =
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 7200).unwrap();
    s.instances.notices.schedule(
        INSTANCE,
        ScheduledInstanceEvent {
            id: None,
            code: "instance-retirement".into(),
            not_before: Some(starts_at),
            description: "The instance is running on degraded hardware".into(),
        },
    );
    let response = notice(&drainer, health_event(starts_at), "req-1")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "MaintenancePlanned", "{response}");
    let planned = node(&s);
    assert!(!is_cordoned(&planned));
    assert_eq!(
        planned.metadata.labels.as_ref().unwrap()[MAINTENANCE_LABEL],
        "planned"
    );
    assert!(
        planned
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(MAINTENANCE_ANNOTATION)
    );
    // Not due: the sweep leaves it.
    let swept = notice(&drainer, sweep_event(), "req-sweep-1")
        .await
        .unwrap();
    assert_eq!(swept["instances"], json!([]), "{swept}");
    assert!(evicted_pod_names(&s).is_empty());

    // With a three-hour margin the same plan is due: the sweep drains the node.
    let due = s.drainer(&[("MAINTENANCE_DRAIN_MARGIN_SECONDS", "10800")]);
    let response = notice(&due, health_event(starts_at), "req-2")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "Drained", "{response}");
    assert_eq!(evicted_pod_names(&s).len(), 5);
    let drained = node(&s);
    assert!(is_cordoned(&drained));
    let checkpoint = s.checkpoint().unwrap();
    assert_eq!(
        checkpoint.notice.map(|n| (n.kind, n.instance_ends_at)),
        Some((NoticeKind::ScheduledMaintenance, Some(starts_at)))
    );
}

#[tokio::test]
async fn a_plan_that_comes_due_is_drained_by_the_sweep_and_cleared() {
    let s = spot_cluster_kept(1).await;
    // Due one second from now, starting eight seconds from now.
    let starts_at = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 8).unwrap();
    s.instances.notices.schedule(
        INSTANCE,
        ScheduledInstanceEvent {
            id: None,
            // The EC2 event the (retirement) Health event announces: of its own code.
            code: "instance-retirement".into(),
            not_before: Some(starts_at),
            description: "scheduled retirement".into(),
        },
    );
    let drainer = s.drainer(&[("MAINTENANCE_DRAIN_MARGIN_SECONDS", "6.5")]);
    assert_eq!(
        outcome(
            &notice(&drainer, health_event(starts_at), "req-1")
                .await
                .unwrap()
        ),
        "MaintenancePlanned"
    );
    assert!(!is_cordoned(&node(&s)));
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let swept = notice(&drainer, sweep_event(), "req-sweep").await.unwrap();
    assert_eq!(outcome(&swept), "Drained", "{swept}");
    assert_eq!(evicted_pod_names(&s).len(), 5);
    let node = node(&s);
    assert!(is_cordoned(&node));
    assert!(
        !node
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(MAINTENANCE_LABEL),
        "the plan is cleared"
    );
}

#[tokio::test]
async fn a_maintenance_already_started_or_cancelled_changes_nothing() {
    let s = spot_cluster(1).await;
    let drainer = s.drainer(&[]);
    let started = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() - 60).unwrap();
    // Cancelled (EC2 keeps it, marked): not pending, so nothing is scheduled.
    s.instances.notices.schedule(
        INSTANCE,
        ScheduledInstanceEvent {
            id: None,
            code: "instance-retirement".into(),
            not_before: Some(started + jiff::SignedDuration::from_secs(7200)),
            description: "[Canceled] retirement".into(),
        },
    );
    let response = notice(&drainer, health_event(started), "req-1")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "NotScheduled", "{response}");
    s.instances.notices.schedule(
        INSTANCE,
        ScheduledInstanceEvent {
            id: None,
            code: "instance-retirement".into(),
            not_before: Some(started),
            description: "retirement".into(),
        },
    );
    let response = notice(&drainer, health_event(started), "req-2")
        .await
        .unwrap();
    assert_eq!(outcome(&response), "Past", "{response}");
    assert!(function_writes(&s).is_empty(), "{:?}", function_writes(&s));
}

#[tokio::test]
async fn a_stopping_instance_whose_termination_was_drained_needs_nothing_more() {
    let s = spot_cluster(1).await;
    let drainer = s.drainer(&[]);
    drain_terminating(&drainer, "req-hook", Duration::from_secs(60))
        .await
        .unwrap();
    set_facts(&s, "shutting-down", Some(GROUP), false);
    let before = function_writes(&s).len();
    let event = ec2_event(
        "EC2 Instance State-change Notification",
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap(),
        json!({"instance-id": INSTANCE, "state": "shutting-down"}),
    );
    let response = notice(&drainer, event.clone(), "req-1").await.unwrap();
    assert_eq!(outcome(&response), "AlreadyDrained", "{response}");
    assert_eq!(function_writes(&s).len(), before);

    // A state change EC2 contradicts (still running) is refused.
    set_facts(&s, "running", Some(GROUP), false);
    let error = notice(&drainer, event, "req-2").await.unwrap_err();
    assert!(error.to_string().contains("EC2 says running"), "{error}");
}
