//! Warm pools through the built binaries, against the fake Auto Scaling's warm pool and the
//! fake API server: a launch into the pool completes without a node; a scale-in with reuse
//! drains the node and records that it went to the pool; the scale-out from the pool undoes
//! exactly that drain once the re-registered node is Ready, so the node is schedulable again.
//!
//! Uses the binaries as built: run `cargo build --workspace --bins --tests` after changing them.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Taint};
use node_manager::aws::LifecycleActionResult;
use node_manager::lifecycle::notification::FOUND_WAITING_FIELD;
use node_manager::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, DrainCheckpoint};
use node_manager::node_marks::{EXCLUDE_FROM_LOAD_BALANCERS_LABEL, MARKED_LABEL};
use node_manager_testkit::aws::{
    InstanceState, LifecycleTransition, SnsSubscription, WarmPoolState,
};
use node_manager_testkit::e2e::{FunctionWorld, GROUP, Target};
use node_manager_testkit::fixtures;
use node_manager_testkit::kube::SimulationTimings;
use node_manager_testkit::kube::simulation::SHUTDOWN_TAINT;
use node_manager_testkit::soak::corpus;
use serde_json::Value;

const POOLED: &str = "i-0b1c2d3e4f5a60719";
const DRAIN_TAINT: &str = "open-node-manager.io/draining";

fn node_of(w: &FunctionWorld) -> Node {
    w.server.store().find::<Node>("", &w.node).unwrap()
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

fn has_exclude_label(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LOAD_BALANCERS_LABEL))
}

fn checkpoint(node: &Node) -> Option<DrainCheckpoint> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CHECKPOINT_ANNOTATION))
        .map(|raw| DrainCheckpoint::parse(raw).unwrap())
}

/// Kubernetes writes (anything but reads) the functions made.
fn function_writes(w: &FunctionWorld) -> Vec<String> {
    w.server
        .audit()
        .filter(|e| {
            e.user.username.contains("hook") && !matches!(e.verb.as_str(), "get" | "list" | "watch")
        })
        .into_iter()
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect()
}

/// The functions' writes to Nodes.
fn node_writes(w: &FunctionWorld) -> Vec<String> {
    function_writes(w)
        .into_iter()
        .filter(|write| write.contains("/nodes/"))
        .collect()
}

/// Scale-out from the pool: the instance starts, its kubelet re-registers the old name (Ready
/// after `ready_after`), and the launching hook answers the notification. Returns the
/// notification and the answer.
async fn scale_out_from_pool(
    w: &FunctionWorld,
    subscription: &mut SnsSubscription,
    ready_after: Duration,
) -> (Value, Value) {
    w.aws
        .autoscaling()
        .launch_from_warm_pool(GROUP, &w.instance)
        .unwrap();
    w.server
        .restart_node(&w.node, &w.provider_id(), Some(ready_after))
        .unwrap();
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let answer = w.function(Target::LaunchingHook).response_to(&event).await;
    (event, answer)
}

#[tokio::test]
async fn a_launch_into_the_warm_pool_completes_once_the_instance_runs_without_a_node() {
    // A long launch timeout: waiting for a node here would take a minute.
    let w = FunctionWorld::builder()
        .functions(&[Target::LaunchingHook])
        .pending_instance(POOLED)
        .env("LAUNCH_TIMEOUT_SECONDS", "60")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
        .start()
        .await;
    let aws = &w.aws;
    aws.autoscaling()
        .set_warm_pool(GROUP, WarmPoolState::Stopped);
    let mut subscription = aws.sns().subscribe(&w.topic).unwrap();
    let lambda = w.function(Target::LaunchingHook);

    let started = Instant::now();
    aws.autoscaling()
        .launch_into_warm_pool(GROUP, POOLED)
        .unwrap();
    assert_eq!(
        aws.autoscaling().instance_state(GROUP, POOLED).as_deref(),
        Some("Warmed:Pending:Wait")
    );
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let message = corpus::message_of(&event);
    assert_eq!(message["Origin"], "EC2");
    assert_eq!(message["Destination"], "WarmPool");
    let answer = lambda.response_to(&event).await;
    let record = &answer["records"][0];
    assert_eq!(record["outcome"], "EnteredWarmPool", "{answer}");
    assert_eq!(record["instance_state"], "running");
    assert_eq!(record["completed"], true);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    let completions = aws.autoscaling().completions();
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);
    // The pool stops the instance; nothing was written to Kubernetes.
    assert_eq!(
        aws.autoscaling().instance_state(GROUP, POOLED).as_deref(),
        Some("Warmed:Stopped")
    );
    assert_eq!(
        aws.ec2().instance(POOLED).unwrap().state,
        InstanceState::Stopped
    );
    assert!(function_writes(&w).is_empty(), "{:?}", function_writes(&w));
    assert!(
        lambda
            .runtime
            .output()
            .contains("WARM_POOL_WAIT_FOR_NODE=false"),
        "the log says which behaviour was chosen"
    );
}

#[tokio::test]
async fn with_warm_pool_wait_for_node_a_launch_into_the_pool_waits_for_the_node() {
    let w = FunctionWorld::builder()
        .functions(&[Target::LaunchingHook])
        .pending_instance(POOLED)
        .env("WARM_POOL_WAIT_FOR_NODE", "true")
        .env("LAUNCH_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .simulation(SimulationTimings::real_time())
        .log_level("info")
        .start()
        .await;
    let aws = &w.aws;
    aws.autoscaling()
        .set_warm_pool(GROUP, WarmPoolState::Running);
    let mut subscription = aws.sns().subscribe(&w.topic).unwrap();
    aws.autoscaling()
        .launch_into_warm_pool(GROUP, POOLED)
        .unwrap();
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    // The node joins while pooled, Ready after a second: the hook waits for it.
    w.server
        .register_node(&w.node, &w.provider_id(), Some(Duration::from_secs(1)))
        .unwrap();
    let started = Instant::now();
    let lambda = w.function(Target::LaunchingHook);
    let answer = lambda.response_to(&event).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(answer["records"][0]["node"], w.node.as_str());
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        aws.autoscaling().instance_state(GROUP, POOLED).as_deref(),
        Some("Warmed:Running")
    );
    assert!(
        lambda
            .runtime
            .output()
            .contains("WARM_POOL_WAIT_FOR_NODE=true")
    );
}

/// Scale-in with reuse, the instance stopped in the pool, then scale-out from the pool:
/// returns the launching hook's answer and the launch notification it answered.
async fn round_trip(w: &FunctionWorld) -> (Value, Value) {
    round_trip_with(w, ScaleIn::Notified).await
}

async fn round_trip_with(w: &FunctionWorld, scale_in: ScaleIn) -> (Value, Value) {
    let mut subscription = scale_in_to_stopped_pool_with(w, scale_in).await;
    let (event, answer) =
        scale_out_from_pool(w, &mut subscription, Duration::from_millis(500)).await;
    let message = corpus::message_of(&event);
    assert_eq!(message["Origin"], "WarmPool");
    assert_eq!(message["Destination"], "AutoScalingGroup");
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(
        w.aws
            .autoscaling()
            .instance_state(GROUP, &w.instance)
            .as_deref(),
        Some("InService")
    );
    (answer, event)
}

/// How the terminating hook learns of a scale-in to the pool.
#[derive(Clone, Copy)]
enum ScaleIn {
    /// From Auto Scaling's notification.
    Notified,
    /// The notification is lost: from the scheduled run, which finds the action waiting
    /// and publishes it again.
    FoundBySweep,
}

async fn scale_in_to_stopped_pool(w: &FunctionWorld) -> SnsSubscription {
    scale_in_to_stopped_pool_with(w, ScaleIn::Notified).await
}

/// The event the terminating hook gets for the scale-in Auto Scaling notified with
/// `notified`: that one, or (lost) what the scheduled run publishes again.
async fn scale_in_event(
    w: &FunctionWorld,
    subscription: &mut SnsSubscription,
    notified: Value,
    scale_in: ScaleIn,
) -> Value {
    if let ScaleIn::Notified = scale_in {
        return notified;
    }
    let lambda = w.function(Target::TerminatingHook);
    let tick = lambda.response_to(&fixtures::schedule_tick()).await;
    assert!(tick.to_string().contains("Redelivered"), "{tick}");
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .expect("the waiting action published again");
    let message = corpus::message_of(&event);
    assert_eq!(message[FOUND_WAITING_FIELD], true, "{message}");
    assert!(message.get("LifecycleActionToken").is_none(), "{message}");
    event
}

/// Scale-in with reuse: the terminating hook drains the node, the instance stops in the pool
/// and the cloud controller taints the node. Returns the subscription to the hook's topic.
async fn scale_in_to_stopped_pool_with(w: &FunctionWorld, scale_in: ScaleIn) -> SnsSubscription {
    let aws = &w.aws;
    aws.autoscaling()
        .set_warm_pool(GROUP, WarmPoolState::Stopped);
    let mut subscription = aws.sns().subscribe(&w.topic).unwrap();

    // Scale-in with reuse: drained like a termination, then the instance goes to the pool.
    aws.autoscaling()
        .scale_in_to_warm_pool(GROUP, &w.instance)
        .unwrap();
    assert_eq!(
        aws.autoscaling()
            .instance_state(GROUP, &w.instance)
            .as_deref(),
        Some("Warmed:Pending:Wait")
    );
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let event = scale_in_event(w, &mut subscription, event, scale_in).await;
    let message = corpus::message_of(&event);
    assert_eq!(message["Origin"], "AutoScalingGroup");
    assert_eq!(message["Destination"], "WarmPool");
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&event)
        .await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(
        aws.autoscaling()
            .instance_state(GROUP, &w.instance)
            .as_deref(),
        Some("Warmed:Stopped")
    );
    assert_eq!(
        aws.ec2().instance(&w.instance).unwrap().state,
        InstanceState::Stopped,
        "reused, not terminated"
    );
    let drained = node_of(w);
    assert!(unschedulable(&drained) && has_exclude_label(&drained));
    let record = checkpoint(&drained).expect("the drain record stays on the node");
    assert!(record.completed_at.is_some());
    assert!(
        record.to_warm_pool_at.is_some(),
        "the node records that it went to the pool"
    );

    // Stopped: the kubelet is gone, the cloud controller taints the node.
    w.server.stop_node(&w.node).unwrap();
    assert!(has_taint(&node_of(w), SHUTDOWN_TAINT));
    subscription
}

fn world() -> node_manager_testkit::e2e::FunctionWorldBuilder {
    FunctionWorld::builder()
        .functions(&[Target::TerminatingHook, Target::LaunchingHook])
        .simulation(SimulationTimings::real_time())
        .env("NODE_TAINT", &format!("{DRAIN_TAINT}=true:NoSchedule"))
        .env("LAUNCH_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
}

/// The scale-in's notification is lost: the scheduled run finds the instance waiting on
/// its way into the pool (`DescribeWarmPool`) and publishes the action again, going to the
/// pool; the drain records the pool as for the notification, and the return undoes it all,
/// the common label included.
#[tokio::test]
async fn a_scale_in_to_the_pool_whose_notification_was_lost_is_drained_and_undone_on_return() {
    let w = world().start().await;
    let (answer, _) = round_trip_with(&w, ScaleIn::FoundBySweep).await;
    let restored = &answer["records"][0]["restored"];
    assert_eq!(restored["uncordoned"], true, "{answer}");
    assert!(restored["went_to_pool_at"].is_string(), "{answer}");
    let node = node_of(&w);
    assert!(!unschedulable(&node) && !has_exclude_label(&node));
    assert!(checkpoint(&node).is_none(), "the drain record is gone");
    let labels = node.metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key(MARKED_LABEL), "{labels:?}");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(
        completions.len(),
        2,
        "the scale-in's and the return's: {completions:?}"
    );
}

#[tokio::test]
async fn a_node_back_from_the_warm_pool_gets_the_drain_undone_and_is_schedulable() {
    let w = world().start().await;
    let (answer, launch) = round_trip(&w).await;
    let restored = &answer["records"][0]["restored"];
    assert_eq!(restored["uncordoned"], true, "{answer}");
    assert_eq!(restored["unlabelled"], true, "{answer}");
    assert_eq!(
        restored["untainted"],
        format!("{DRAIN_TAINT}=true:NoSchedule")
    );
    assert!(restored["went_to_pool_at"].is_string(), "{answer}");

    let node = node_of(&w);
    assert!(!unschedulable(&node), "uncordoned");
    assert!(!has_exclude_label(&node));
    assert!(!has_taint(&node, DRAIN_TAINT));
    assert!(!has_taint(&node, SHUTDOWN_TAINT));
    assert!(checkpoint(&node).is_none(), "the drain record is gone");
    // The undo was one write, conditional on the node's resourceVersion.
    let patches: Vec<_> = w
        .server
        .audit()
        .filter(|e| e.verb == "patch" && e.user.username.contains("launching"))
        .into_iter()
        .filter(|e| e.request_uri.contains("/nodes/"))
        .collect();
    assert_eq!(patches.len(), 1, "{patches:?}");
    let sent = patches[0].request_object.clone().unwrap_or(Value::Null);
    assert!(sent["metadata"]["resourceVersion"].is_string(), "{sent}");
    // Said on the node.
    let events = w
        .server
        .store()
        .list::<k8s_openapi::api::events::v1::Event>();
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("WarmPoolReturn")),
        "{events:?}"
    );

    // A redelivery of the same launch changes nothing more.
    let before = node_writes(&w).len();
    let again = w.function(Target::LaunchingHook).response_to(&launch).await;
    assert_eq!(
        again["records"][0]["outcome"], "AlreadyCompleted",
        "{again}"
    );
    assert_eq!(node_writes(&w).len(), before);
}

#[tokio::test]
async fn a_cordon_someone_else_made_survives_the_return_from_the_pool() {
    let w = world().start().await;
    // An operator cordoned the node before the scale-in.
    w.server
        .store()
        .modify::<Node>("", &w.node, |node| {
            node.spec.get_or_insert_default().unschedulable = Some(true);
        })
        .unwrap();
    let (answer, _) = round_trip(&w).await;
    let restored = &answer["records"][0]["restored"];
    assert_eq!(restored["uncordoned"], false, "{answer}");
    assert_eq!(restored["unlabelled"], true, "{answer}");
    let node = node_of(&w);
    assert!(unschedulable(&node), "the operator's cordon stays");
    assert!(!has_exclude_label(&node));
    assert!(!has_taint(&node, DRAIN_TAINT));
    assert!(checkpoint(&node).is_none());
}

#[tokio::test]
async fn a_node_that_returns_without_our_drain_is_left_alone() {
    // The terminating hook is not attached: the scale-in's action times out into the pool.
    let w = FunctionWorld::builder()
        .functions(&[Target::LaunchingHook])
        .simulation(SimulationTimings::real_time())
        .env("LAUNCH_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
        .start()
        .await;
    let aws = &w.aws;
    aws.autoscaling()
        .set_warm_pool(GROUP, WarmPoolState::Stopped);
    aws.autoscaling().set_time_scale(0.001);
    let mut subscription = aws.sns().subscribe(&w.topic).unwrap();
    aws.autoscaling()
        .scale_in_to_warm_pool(GROUP, &w.instance)
        .unwrap();
    let _ignored = subscription.next_event(Duration::from_secs(5)).await;
    aws.autoscaling()
        .wait_for_completion(&w.instance, Duration::from_secs(5))
        .await
        .unwrap();
    w.server
        .store()
        .modify::<Node>("", &w.node, |node| {
            node.spec.get_or_insert_default().unschedulable = Some(true);
        })
        .unwrap();
    w.server.stop_node(&w.node).unwrap();
    aws.autoscaling().set_time_scale(1.0);
    let (_, answer) = scale_out_from_pool(&w, &mut subscription, Duration::from_millis(300)).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(answer["records"][0].get("restored").is_none(), "{answer}");
    assert!(unschedulable(&node_of(&w)), "not ours to uncordon");
    let node_writes = node_writes(&w);
    assert!(node_writes.is_empty(), "{node_writes:?}");
}

#[tokio::test]
async fn a_node_ready_only_after_the_launch_timeout_still_gets_the_drain_undone() {
    // Issue #24 item 3: the returning node turns Ready 6 s after the scale-out, the launch
    // timeout is 2 s: the action completes with CONTINUE (the instance goes into service), so
    // our drain's marks must go too, though the node was not Ready in time.
    let w = world().env("LAUNCH_TIMEOUT_SECONDS", "2").start().await;
    let mut subscription = scale_in_to_stopped_pool(&w).await;
    let (_, answer) = scale_out_from_pool(&w, &mut subscription, Duration::from_secs(6)).await;
    let record = &answer["records"][0];
    assert_eq!(record["outcome"], "TimedOut", "{answer}");
    assert_eq!(record["result"], "CONTINUE", "{answer}");
    assert_eq!(record["restored"]["uncordoned"], true, "{answer}");
    assert_eq!(record["restored"]["unlabelled"], true, "{answer}");
    assert_eq!(
        w.aws
            .autoscaling()
            .instance_state(GROUP, &w.instance)
            .as_deref(),
        Some("InService")
    );
    let node = node_of(&w);
    assert!(!unschedulable(&node), "uncordoned");
    assert!(!has_exclude_label(&node));
    assert!(!has_taint(&node, DRAIN_TAINT));
    assert!(checkpoint(&node).is_none(), "the drain record is gone");
}

// Issue #43 item 1: the launch of an instance back from the warm pool is lost (or every
// launching-hook attempt failed): its action times out with CONTINUE and the instance is
// InService, running and Ready with our drain's cordon, label and record on it. The
// terminating hook's schedule (the reconciler) used to leave it so for good.
#[tokio::test]
async fn a_node_back_from_the_warm_pool_whose_launch_was_lost_is_restored_by_the_sweep() {
    sweep_after_a_lost_launch(Some(Duration::from_millis(200))).await;
}

// The same with a node that never turns Ready again: the launching hook undoes the drain at
// its launch timeout, Ready or not (the instance goes into service either way), and the
// sweep now ends the record by that same rule. Before, it required the node Ready and left
// this one cordoned, labelled out of load balancers and recorded for good.
#[tokio::test]
async fn a_node_back_from_the_warm_pool_whose_launch_was_lost_is_restored_ready_or_not() {
    sweep_after_a_lost_launch(None).await;
}

/// Waits (10 s at most) for the launch action nobody answers to time out with `CONTINUE`,
/// putting the instance in service.
async fn launch_times_out_into_service(w: &FunctionWorld) {
    let launch_timed_out =
        || {
            w.aws.autoscaling().completions().into_iter().find(|c| {
                c.instance_id == w.instance && c.transition == LifecycleTransition::Launching
            })
        };
    let started = Instant::now();
    while launch_timed_out().is_none() && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let timed_out = launch_timed_out().expect("the launch action times out");
    assert_eq!(timed_out.result, LifecycleActionResult::Continue);
    assert_eq!(
        w.aws
            .autoscaling()
            .instance_state(GROUP, &w.instance)
            .as_deref(),
        Some("InService")
    );
}

/// Scales the instance in to a stopped pool, back out with nobody answering its launch (the
/// node turning Ready `ready_after` the start, or never), waits for the launch action to time
/// out into service, then runs the sweep: it must undo exactly the drain, once.
async fn sweep_after_a_lost_launch(ready_after: Option<Duration>) {
    let w = world().functions(&[Target::TerminatingHook]).start().await;
    let mut subscription = scale_in_to_stopped_pool(&w).await;
    let aws = &w.aws;
    // Nobody answers the launch: its hook times out (at this scale, in well under a second).
    aws.autoscaling().set_time_scale(0.001);
    aws.autoscaling()
        .launch_from_warm_pool(GROUP, &w.instance)
        .unwrap();
    w.server
        .restart_node(
            &w.node,
            &w.provider_id(),
            // An hour: longer than the test, so never Ready in it.
            Some(ready_after.unwrap_or(Duration::from_secs(3600))),
        )
        .unwrap();
    let lost = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(corpus::message_of(&lost)["Origin"], "WarmPool");
    launch_times_out_into_service(&w).await;
    let ready = |store: &node_manager_testkit::kube::Store| {
        store
            .find::<Node>("", &w.node)
            .is_some_and(|n| node_manager::lifecycle::node::is_ready(&n))
    };
    if ready_after.is_some() {
        w.server
            .wait_for("the node Ready again", Duration::from_secs(10), ready)
            .await
            .unwrap();
    }
    assert!(unschedulable(&node_of(&w)), "left as the drain left it");

    let sweep = w
        .function(Target::TerminatingHook)
        .response_to(&fixtures::schedule_tick())
        .await;
    let outcomes: Vec<&str> = sweep["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["outcome"].as_str())
        .collect();
    assert!(outcomes.contains(&"LifecycleDrainUndone"), "{sweep}");
    let node = node_of(&w);
    assert!(!unschedulable(&node), "uncordoned");
    assert!(!has_exclude_label(&node));
    assert!(!has_taint(&node, DRAIN_TAINT));
    assert!(checkpoint(&node).is_none(), "the drain record is gone");
    assert_eq!(ready(w.server.store()), ready_after.is_some());
    // A second run finds nothing of ours left.
    let before = node_writes(&w).len();
    w.function(Target::TerminatingHook)
        .response_to(&fixtures::schedule_tick())
        .await;
    assert_eq!(node_writes(&w).len(), before);
}

#[tokio::test]
async fn with_abandon_after_the_timeout_the_marks_stay_on_the_replaced_node() {
    // ABANDON: Auto Scaling terminates the instance; the node is not put back into service.
    let w = world()
        .env("LAUNCH_TIMEOUT_SECONDS", "2")
        .env("LAUNCH_TIMEOUT_RESULT", "ABANDON")
        .start()
        .await;
    let mut subscription = scale_in_to_stopped_pool(&w).await;
    let (_, answer) = scale_out_from_pool(&w, &mut subscription, Duration::from_secs(6)).await;
    let record = &answer["records"][0];
    assert_eq!(record["outcome"], "TimedOut", "{answer}");
    assert_eq!(record["result"], "ABANDON", "{answer}");
    assert!(record.get("restored").is_none(), "{answer}");
    assert!(unschedulable(&node_of(&w)), "not put back into service");
    let launching_writes = w.server.audit().filter(|e| {
        e.user.username.contains("launching")
            && e.resource() == "nodes"
            && !matches!(e.verb.as_str(), "get" | "list" | "watch")
    });
    assert!(launching_writes.is_empty(), "{launching_writes:?}");
}

#[tokio::test]
async fn a_users_taint_with_the_drain_taints_key_and_effect_is_never_ours() {
    // Issue #24 item 9: the user's own taint has NODE_TAINT's key and effect (another value).
    // The drain must not take it over, record it as ours, or have the return from the pool
    // delete it.
    let w = world().start().await;
    w.server
        .store()
        .modify::<Node>("", &w.node, |node| {
            node.spec
                .get_or_insert_default()
                .taints
                .get_or_insert_default()
                .push(Taint {
                    key: DRAIN_TAINT.into(),
                    value: Some("user".into()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
        })
        .unwrap();
    let (answer, _) = round_trip(&w).await;
    let restored = &answer["records"][0]["restored"];
    assert!(restored.get("untainted").is_none(), "{answer}");
    assert_eq!(restored["uncordoned"], true, "{answer}");
    let node = node_of(&w);
    let drain_taints: Vec<_> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key == DRAIN_TAINT)
        .collect();
    assert_eq!(drain_taints.len(), 1, "{drain_taints:?}");
    assert_eq!(
        drain_taints[0].value.as_deref(),
        Some("user"),
        "the user's taint stays"
    );
    assert!(!unschedulable(&node));
}
