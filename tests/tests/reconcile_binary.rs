//! The built `terminating-hook` binary's scheduled run (the sweep, the reconciler), through
//! the local Lambda Runtime API against the fake EC2 and Auto Scaling the unmodified SDK
//! clients talk to and the fake API server with the shipped RBAC: marks whose reason AWS no
//! longer reports are removed, a drain abandoned by an invocation that ran out of time is
//! resumed, and one node that fails does not stop the others.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing it.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use node_manager_testkit::aws::ScheduledEventCode;
use node_manager_testkit::e2e::{FunctionWorld, GROUP, INSTANCE, Target};
use node_manager_testkit::fixtures::{self, Workload};
use node_manager_testkit::kube::{FaultAction, FaultRule};
use node_manager_testkit::lambda_api::InvocationOutcome;
use serde_json::{Value, json};

const MARKED: &str = "open-node-manager.io/marked";
const REFRESH_LABEL: &str = "open-node-manager.io/instance-refresh";
const REFRESH_ANNOTATION: &str = "open-node-manager.io/instance-refresh";
const MAINTENANCE: &str = "open-node-manager.io/maintenance";
const EXCLUDED: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

async fn world(extra_env: &[(&str, &str)]) -> FunctionWorld {
    let mut builder = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("DRAIN_TIMEOUT_SECONDS", "60")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .env("DRAIN_LEASE_SECONDS", "2");
    for (key, value) in extra_env {
        builder = builder.env(key, value);
    }
    let w = builder.start().await;
    let store = w.server.store();
    let nginx = Workload::new("default", "nginx")
        .replicas(3)
        .container("nginx", "nginx")
        .grace_period_seconds(Some(1));
    store.create(&nginx.deployment()).unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("the pods run", Duration::from_secs(10), |store| {
            fixtures::running_on(store, &node, "") == 3
        })
        .await
        .unwrap();
    // Room for the evicted pods.
    w.add_room_node();
    w
}

fn node(w: &FunctionWorld, name: &str) -> Node {
    w.server.store().get::<Node>("", name).unwrap()
}

fn is_cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

fn labels(node: &Node) -> std::collections::BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn annotations(node: &Node) -> std::collections::BTreeMap<String, String> {
    node.metadata.annotations.clone().unwrap_or_default()
}

fn evictions(w: &FunctionWorld) -> usize {
    w.server
        .audit()
        .subresource_requests("pods", "eviction")
        .len()
}

/// The terminating hook's answer to `event` in a short invocation: with the world's five
/// seconds of hand-over margin, eight seconds leave three to work.
async fn short_invocation(w: &FunctionWorld, event: &Value) -> Value {
    let lambda = w.function(Target::TerminatingHook);
    let outcome = lambda
        .runtime
        .invoke(event, Duration::from_secs(8))
        .await
        .unwrap();
    let InvocationOutcome::Response(answer) = outcome else {
        panic!("{outcome:?}\n{}", lambda.runtime.output());
    };
    answer
}

/// The outcomes of a sweep's response, as `outcome` strings in order.
fn outcomes(answer: &Value) -> Vec<String> {
    answer["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["outcome"].as_str().unwrap().to_owned())
        .collect()
}

fn at(from_now: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + from_now).unwrap()
}

/// A maintenance plan as the terminating hook records it on a node.
fn plan(instance_id: &str, starts_at: jiff::Timestamp, drain_from: jiff::Timestamp) -> String {
    json!({
        "typeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        "instanceId": instance_id,
        "autoScalingGroupName": GROUP,
        "startsAt": starts_at.to_string(),
        "drainFrom": drain_from.to_string(),
    })
    .to_string()
}

/// Puts `labels` and `annotations` on node `name`, as an earlier invocation left them.
fn mark(
    w: &FunctionWorld,
    name: &str,
    new_labels: &[(&str, &str)],
    new_annotations: &[(&str, String)],
    cordon: bool,
) {
    w.server
        .store()
        .modify::<Node>("", name, |node| {
            let labels = node.metadata.labels.get_or_insert_default();
            for (k, v) in new_labels {
                labels.insert((*k).to_owned(), (*v).to_owned());
            }
            let annotations = node.metadata.annotations.get_or_insert_default();
            for (k, v) in new_annotations {
                annotations.insert((*k).to_owned(), v.clone());
            }
            if cordon {
                node.spec.get_or_insert_default().unschedulable = Some(true);
            }
        })
        .unwrap();
}

/// The seeded node marked by instance refresh `refresh_id` (cordoned, out of load
/// balancers) at `marked_at` seconds from now (negative: in the past), with `labels` too.
fn mark_refreshed(w: &FunctionWorld, refresh_id: &str, labels: &[(&str, &str)], marked_at: i64) {
    let record = json!({
        "instanceRefreshId": refresh_id, "autoScalingGroupName": GROUP, "instanceId": INSTANCE,
        "markedAt": at(marked_at).to_string(),
        "outOfService": {"labelled": true, "cordoned": true},
    })
    .to_string();
    let mut all = vec![(REFRESH_LABEL, refresh_id), (EXCLUDED, "true")];
    all.extend_from_slice(labels);
    mark(w, &w.node, &all, &[(REFRESH_ANNOTATION, record)], true);
}

/// Starts a refresh of the group, launch before terminate, and returns its id once its first
/// replacement launched: that replacement waits in its launching hook (no launching-hook
/// function here), so the refresh (or its rollback) is still running afterwards.
async fn start_refresh_that_runs_on(w: &FunctionWorld) -> String {
    let autoscaling = w.aws.autoscaling();
    let refresh_id = autoscaling
        .start_instance_refresh(
            GROUP,
            node_manager_testkit::aws::FakeRefreshPreferences::default()
                .healthy_percentage(100, 200),
        )
        .unwrap();
    let started = std::time::Instant::now();
    while autoscaling
        .instance_refresh(&refresh_id)
        .is_none_or(|r| r.launched_instance_ids.is_empty())
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no replacement launched"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    refresh_id
}

// Issue 35 item 7.
#[tokio::test]
async fn reconcile_a_cancelled_maintenance_is_not_drained_and_a_rescheduled_one_is_moved() {
    let w = world(&[]).await;
    let lambda = w.function(Target::TerminatingHook);
    // EC2 scheduled a retirement in two hours; the plan made then is due now (a margin of
    // three hours, say).
    let starts_at = at(7200);
    w.aws
        .interruptions()
        .schedule_maintenance(
            INSTANCE,
            ScheduledEventCode::InstanceRetirement,
            starts_at,
            at(9000),
        )
        .unwrap();
    let recorded = plan(INSTANCE, starts_at, at(-60));
    mark(
        &w,
        &w.node,
        &[(MAINTENANCE, "planned")],
        &[(MAINTENANCE, recorded.clone())],
        false,
    );

    // EC2 moved it two weeks later: the plan moves, nothing is drained at the old time.
    let later = at(14 * 86_400);
    w.aws
        .interruptions()
        .reschedule_events(INSTANCE, later)
        .unwrap();
    let answer = lambda.response_to(&fixtures::schedule_tick()).await;
    assert!(
        outcomes(&answer).contains(&"MaintenancePlanMoved".to_owned()),
        "{answer}"
    );
    let moved = node(&w, &w.node);
    assert!(!is_cordoned(&moved));
    assert_eq!(evictions(&w), 0);
    let kept: Value = serde_json::from_str(&annotations(&moved)[MAINTENANCE]).unwrap();
    assert_eq!(kept["startsAt"], json!(later.to_string()), "{kept}");

    // Then cancelled: the plan goes, the node was never touched.
    w.aws
        .interruptions()
        .cancel_scheduled_events(INSTANCE)
        .unwrap();
    let answer = lambda.response_to(&fixtures::schedule_tick()).await;
    assert!(
        outcomes(&answer).contains(&"MaintenancePlanDropped".to_owned()),
        "{answer}"
    );
    let dropped = node(&w, &w.node);
    assert!(!annotations(&dropped).contains_key(MAINTENANCE));
    assert!(!labels(&dropped).contains_key(MAINTENANCE));
    assert!(!is_cordoned(&dropped));
    assert_eq!(evictions(&w), 0);
    assert!(
        !labels(&dropped).contains_key(MARKED),
        "nothing of ours left: {answer}"
    );
}

// Issue 35 item 5 (the reconciler's side).
#[tokio::test]
async fn reconcile_refresh_marks_whose_refresh_auto_scaling_no_longer_reports_are_undone() {
    let w = world(&[]).await;
    let lambda = w.function(Target::TerminatingHook);
    // A refresh marked the node; its end event was lost, and Auto Scaling no longer knows it.
    let refresh_id = "0d4a5c7e-1111-4222-8333-944445555666";
    mark_refreshed(&w, refresh_id, &[], -3600);
    let answer = lambda.response_to(&fixtures::schedule_tick()).await;
    // Marked before the common label existed: found by the load-balancer label.
    assert_eq!(outcomes(&answer), ["RefreshMarksRemoved"], "{answer}");
    let after = node(&w, &w.node);
    assert!(!is_cordoned(&after), "the refresh's cordon undone");
    assert!(!labels(&after).contains_key(EXCLUDED));
    assert!(!labels(&after).contains_key(REFRESH_LABEL));
    assert!(!annotations(&after).contains_key(REFRESH_ANNOTATION));
    assert!(!labels(&after).contains_key(MARKED));
    assert_eq!(evictions(&w), 0);
    assert_eq!(
        w.aws.requests_for("DescribeInstanceRefreshes").len(),
        1,
        "one call for the refresh named"
    );
}

// Issue 35 item 3.
#[tokio::test]
async fn reconcile_a_maintenance_drain_that_ran_out_of_time_is_resumed_by_the_next_run() {
    let w = world(&[]).await;
    let lambda = w.function(Target::TerminatingHook);
    // Nothing may leave at first: the drain runs out of its invocation's time.
    let store = w.server.store();
    store
        .create(&fixtures::pdb_min_available(
            "default",
            "nginx",
            3,
            &[("app", "nginx")],
        ))
        .unwrap();
    let event = w
        .aws
        .interruptions()
        .schedule_maintenance(
            INSTANCE,
            ScheduledEventCode::InstanceRetirement,
            at(1800),
            at(3600),
        )
        .unwrap();
    let answer = short_invocation(&w, &event).await;
    assert_eq!(answer["instances"][0]["outcome"], "OutOfTime", "{answer}");
    assert!(is_cordoned(&node(&w, &w.node)));

    // The budget frees up; the scheduled run finds the drain nobody runs and finishes it.
    store
        .delete::<PodDisruptionBudget>("default", "nginx")
        .unwrap();
    let answer = lambda.response_to(&fixtures::schedule_tick()).await;
    assert!(
        outcomes(&answer).contains(&"Drained".to_owned()),
        "{answer}"
    );
    let drained = node(&w, &w.node);
    assert!(
        is_cordoned(&drained),
        "drained for the maintenance, it stays out of service"
    );
    let left = store
        .list::<Pod>()
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&w.node))
        .filter(|p| p.metadata.namespace.as_deref() == Some("default"))
        .count();
    assert_eq!(left, 0, "the drain finished");
}

// Issue 35 item 8.
#[tokio::test]
async fn reconcile_one_node_that_cannot_be_written_does_not_stop_the_others() {
    let w = world(&[]).await;
    let lambda = w.function(Target::TerminatingHook);
    // Two nodes whose maintenance has started: both plans are to be dropped. The first one
    // (by name) refuses every write.
    let broken = "ip-10-0-0-1.eu-west-1.compute.internal";
    let broken_instance = "i-0aaaabbbbccccdddd";
    w.server
        .register_node(
            broken,
            &format!("aws:///eu-west-1a/{broken_instance}"),
            Some(Duration::ZERO),
        )
        .unwrap();
    mark(
        &w,
        broken,
        &[(MAINTENANCE, "planned")],
        &[(MAINTENANCE, plan(broken_instance, at(-600), at(-4200)))],
        false,
    );
    mark(
        &w,
        &w.node,
        &[(MAINTENANCE, "planned")],
        &[(MAINTENANCE, plan(INSTANCE, at(-600), at(-4200)))],
        false,
    );
    w.server.faults().add(
        FaultRule::new(FaultAction::InternalError)
            .verb("patch")
            .resource("nodes")
            .name(broken),
    );
    let answer = lambda.response_to(&fixtures::schedule_tick()).await;
    let instances = answer["instances"].as_array().unwrap();
    let of = |id: &str| {
        instances
            .iter()
            .find(|i| i["instanceId"] == id)
            .unwrap_or_else(|| panic!("{id} not reported: {answer}"))["outcome"]
            .clone()
    };
    assert_eq!(of(INSTANCE), "MaintenancePlanDropped", "{answer}");
    assert!(!annotations(&node(&w, &w.node)).contains_key(MAINTENANCE));
    assert_eq!(of(broken_instance), "Failed", "{answer}");
    let detail = instances
        .iter()
        .find(|i| i["instanceId"] == broken_instance)
        .unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(detail.contains("MaintenancePlanDropped failed"), "{detail}");
    assert!(
        annotations(&node(&w, broken)).contains_key(MAINTENANCE),
        "tried again next run"
    );
}

// Issue #43 item 5: a rollback keeps exactly the outdated instances the refresh marked and
// replaces the new ones. With its `Rollback Started` event lost, the sweep used to keep the
// refresh's cordon on those nodes for the whole rollback (it took `RollbackInProgress` for a
// refresh still running).
#[tokio::test]
async fn reconcile_a_refresh_rolling_back_leaves_its_outdated_nodes_schedulable() {
    let w = world(&[]).await;
    let autoscaling = w.aws.autoscaling();
    let refresh_id = start_refresh_that_runs_on(&w).await;
    // The refresh function marked the outdated node; then the rollback's event is lost.
    mark_refreshed(&w, &refresh_id, &[(MARKED, "true")], -60);
    let _lost = autoscaling.rollback_instance_refresh(GROUP).unwrap();
    assert_eq!(
        autoscaling
            .instance_refresh(&refresh_id)
            .unwrap()
            .status
            .as_str(),
        "RollbackInProgress"
    );

    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&fixtures::schedule_tick())
        .await;
    assert_eq!(
        outcomes(&answer),
        ["RefreshMarksRemoved", "MarkedLabelRemoved"],
        "{answer}"
    );
    let after = node(&w, &w.node);
    assert!(
        !is_cordoned(&after),
        "the node the rollback keeps is schedulable"
    );
    assert!(!labels(&after).contains_key(EXCLUDED));
    assert!(!annotations(&after).contains_key(REFRESH_ANNOTATION));
    assert_eq!(
        autoscaling
            .instance_refresh(&refresh_id)
            .unwrap()
            .status
            .as_str(),
        "RollbackInProgress",
        "decided while the rollback still ran"
    );
}

// Issue #43 item 10: a fleet-wide maintenance marks thousands of nodes. The facts used to be
// asked under one 10 s bound for all of their batches in sequence (40
// `DescribeAutoScalingInstances` calls here), so with ordinary API latency every fact was
// `Unknown`, every plan `Unchecked`, and nothing drained. Each call now has its own bound,
// eight run at once, and the nodes are listed a page at a time.
#[tokio::test]
async fn reconcile_two_thousand_marked_nodes_are_all_decided_with_slow_apis() {
    use node_manager_testkit::bench::sweep::{SWEEP_PERIOD, sweep_at_scale};
    let row = sweep_at_scale(2000, 2000, 3, Duration::from_millis(400)).await;
    println!("{row:?}");
    assert_eq!(row.unchecked, 0, "{row:?}");
    assert_eq!(row.drained, 3, "every due plan drained: {row:?}");
    assert!(row.wall < SWEEP_PERIOD, "{row:?}");
    // A call per batch of the API's size, never one per node.
    assert_eq!(
        row.aws_calls["DescribeAutoScalingInstances"],
        2000usize.div_ceil(50),
        "{row:?}"
    );
    assert!(row.aws_calls["DescribeInstances"] < 2000 / 100, "{row:?}");
    assert!(
        row.node_lists >= 4,
        "listed a page (500 nodes) at a time: {row:?}"
    );
}

// Issue #43 item 8: a drain for a reboot used to take the running refresh's record over, and
// putting the node back in service after the reboot then lifted the refresh's cordon while
// the refresh still ran: the next refresh event marked it again and its pods moved twice.
#[tokio::test]
async fn reconcile_the_end_of_a_reboot_leaves_a_running_refreshs_cordon() {
    let w = world(&[]).await;
    let lambda = w.function(Target::TerminatingHook);
    let autoscaling = w.aws.autoscaling();
    let refresh_id = start_refresh_that_runs_on(&w).await;
    mark_refreshed(&w, &refresh_id, &[(MARKED, "true")], -60);
    let interruptions = w.aws.interruptions();
    let soon = at(600);
    let reboot = interruptions
        .schedule_maintenance(
            INSTANCE,
            ScheduledEventCode::InstanceReboot,
            soon,
            soon + jiff::SignedDuration::from_hours(1),
        )
        .unwrap();
    let answer = lambda.response_to(&reboot).await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    assert!(
        annotations(&node(&w, &w.node)).contains_key(REFRESH_ANNOTATION),
        "the refresh's record stays the refresh's"
    );
    let closed = interruptions
        .complete_maintenance(INSTANCE, ScheduledEventCode::InstanceReboot)
        .unwrap();
    let answer = lambda.response_to(&closed).await;
    assert_eq!(
        answer["instances"][0]["outcome"], "RestoredAfterMaintenance",
        "{answer}"
    );
    let after = node(&w, &w.node);
    assert!(
        !annotations(&after).contains_key("open-node-manager.io/drain"),
        "the drain's record is gone"
    );
    assert!(
        is_cordoned(&after),
        "the refresh's cordon stays while it runs"
    );
    assert!(labels(&after).contains_key(EXCLUDED));
    assert!(annotations(&after).contains_key(REFRESH_ANNOTATION));
    assert_eq!(
        autoscaling
            .instance_refresh(&refresh_id)
            .unwrap()
            .status
            .as_str(),
        "InProgress"
    );
}

/// A scale-in whose lifecycle notification never reaches the hook (lost, or every retry of
/// its invocation failed): Auto Scaling keeps the action waiting until the hook's heartbeat
/// timeout, then terminates the instance with its pods on it. The scheduled run finds the
/// action waiting with no drain on its node and publishes it again to the lifecycle topic;
/// the fresh invocation proves it pending, drains the node and completes the action by its
/// instance (Auto Scaling lists no token). The next run finds nothing waiting.
#[tokio::test]
async fn reconcile_a_terminating_action_whose_notification_was_lost_is_drained_and_completed() {
    let w = world(&[]).await;
    let lambda = w.function(Target::TerminatingHook);
    let (mut subscription, _lost) = w.start_termination().await;
    let answer = lambda.response_to(&fixtures::schedule_tick()).await;
    assert_eq!(outcomes(&answer), ["Redelivered"], "{answer}");
    let redelivered = subscription
        .next_event(Duration::from_secs(5))
        .await
        .expect("the waiting action published again");
    assert_eq!(evictions(&w), 0, "the sweep itself drains nothing");
    let answer = lambda.response_to(&redelivered).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(evictions(&w), 3, "every pod of the node evicted");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].instance_id, INSTANCE);
    assert_eq!(completions[0].result.as_str(), "CONTINUE");
    let answer = lambda.response_to(&fixtures::schedule_tick()).await;
    assert!(outcomes(&answer).is_empty(), "{answer}");
}

/// An action whose drain was handed over to a fresh invocation is not published again
/// while that continuation may still land (the drain's lease, let go at the hand-over, keeps
/// its time).
#[tokio::test]
async fn reconcile_a_terminating_action_handed_over_is_not_published_again() {
    let w = world(&[("DRAIN_LEASE_SECONDS", "30")]).await;
    let lambda = w.function(Target::TerminatingHook);
    // Nothing may leave: the drain runs out of its invocation's time and hands over.
    w.server
        .store()
        .create(&fixtures::pdb_min_available(
            "default",
            "nginx",
            3,
            &[("app", "nginx")],
        ))
        .unwrap();
    let (mut subscription, event) = w.start_termination().await;
    let answer = short_invocation(&w, &event).await;
    assert_eq!(answer["records"][0]["outcome"], "HandedOver", "{answer}");
    subscription
        .next_event(Duration::from_secs(5))
        .await
        .expect("the drain's continuation");
    let answer = lambda.response_to(&fixtures::schedule_tick()).await;
    assert!(outcomes(&answer).is_empty(), "{answer}");
    let published = subscription.next_event(Duration::from_millis(500)).await;
    assert!(published.is_none(), "{published:?}");
}
