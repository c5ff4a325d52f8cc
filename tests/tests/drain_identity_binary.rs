//! The drain's identity across invocations, with the built `terminating-hook` binary run as
//! Lambda runs it: a hand-over whose mark could not be written (a burst of 429s on Node
//! writes) is still continued; a finished drain of an instance does not stand in for a new
//! one (a notice drain's record when the instance later terminates, a failed drain's record
//! when a retained instance is finally terminated).
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing it.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, DrainCheckpoint};
use node_manager_testkit::e2e::{FunctionWorld, GROUP, Target};
use node_manager_testkit::fixtures::Workload;
use node_manager_testkit::fixtures::running_on;
use node_manager_testkit::kube::{FaultAction, FaultRule};
use node_manager_testkit::lambda_api::InvocationOutcome;
use serde_json::Value;

/// Not the terminating fixture's instance.
const INSTANCE: &str = "i-0b1c2d3e4f5061728";

/// The terminating hook (`settings` added to its environment) with 4 nginx pods on the
/// instance's node and a second node for them to move to.
async fn world(settings: &[(&str, &str)], spot: bool) -> FunctionWorld {
    let mut builder = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "0.2")
        .env("DRAIN_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
        .json_logs();
    if spot {
        builder = builder.spot();
    }
    for (key, value) in settings {
        builder = builder.env(key, value);
    }
    let w = builder.start().await;
    let store = w.server.store();
    let nginx = Workload::new("default", "nginx")
        .replicas(4)
        .container("nginx", "nginx")
        .grace_period_seconds(None);
    store.create(&nginx.deployment()).unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("the nginx pods run", Duration::from_secs(10), |store| {
            running_on(store, &node, "nginx-") == 4
        })
        .await
        .unwrap();
    w.add_room_node();
    w
}

/// A pod on the drained node whose deletion waits for a finalizer the test removes.
fn add_held_pod(w: &FunctionWorld) {
    w.server
        .store()
        .apply_yaml(
            &r#"
apiVersion: v1
kind: Pod
metadata: {name: held, namespace: default, finalizers: [example.com/hold]}
spec:
  nodeName: NODE
  containers: [{name: held, image: held}]
"#
            .replace("NODE", &w.node),
        )
        .unwrap();
}

fn release_held_pod(w: &FunctionWorld) {
    w.server
        .store()
        .modify::<Pod>("default", "held", |pod| pod.metadata.finalizers = None)
        .unwrap();
}

fn checkpoint(w: &FunctionWorld) -> Option<DrainCheckpoint> {
    let node = w.server.store().find::<Node>("", &w.node)?;
    let raw = node
        .metadata
        .annotations?
        .get(CHECKPOINT_ANNOTATION)?
        .clone();
    Some(DrainCheckpoint::parse(&raw).unwrap())
}

fn outcome_of(answer: &Value) -> String {
    answer["records"][0]["outcome"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_429_burst_through_the_hand_over_does_not_drop_the_drain() {
    let w = world(
        &[
            ("HAND_OVER_MARGIN_SECONDS", "2"),
            // Longer than an invocation's working time: a continuation cannot wait out a
            // lease its predecessor renewed just before the burst.
            ("DRAIN_LEASE_SECONDS", "15"),
            ("DRAIN_TIMEOUT_SECONDS", "300"),
        ],
        false,
    )
    .await;
    add_held_pod(&w);
    let lambda = w.function(Target::TerminatingHook);
    let (mut subscription, mut event) = w.start_termination().await;
    // One second before the first invocation's hand-over time, API Priority and Fairness
    // throttles every Node write for 20 s: the hand-over mark is not recorded, and the
    // continuation starts while the predecessor's lease is still live.
    let faults = w.server.faults().clone();
    let burst = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        faults.add(
            FaultRule::new(FaultAction::TooManyRequests {
                retry_after_seconds: 1,
            })
            .verb("patch")
            .resource("nodes")
            .lasting(Duration::from_secs(20)),
        )
    });
    // Lambda's part: a hand-over's message invokes the function again, a failed invocation
    // is retried (twice, as for any asynchronous invocation, after a pause: scaled down from
    // Lambda's minute and two), a success ends the delivery.
    let started = std::time::Instant::now();
    let mut outcomes = Vec::new();
    let mut retries = 0;
    let mut released = false;
    loop {
        if !released && started.elapsed() > Duration::from_secs(26) {
            release_held_pod(&w);
            released = true;
        }
        let outcome = lambda
            .runtime
            .invoke(&event, Duration::from_secs(8))
            .await
            .unwrap();
        let answer = match outcome {
            InvocationOutcome::Response(answer) => answer,
            other => {
                outcomes.push(format!("{other:?}"));
                retries += 1;
                assert!(
                    retries <= 2,
                    "the invocation failed three times: {outcomes:#?}\n{}",
                    lambda.runtime.output()
                );
                tokio::time::sleep(Duration::from_secs(3 * retries)).await;
                continue;
            }
        };
        let outcome = outcome_of(&answer);
        outcomes.push(outcome.clone());
        retries = 0;
        match outcome.as_str() {
            "HandedOver" => {
                event = subscription
                    .next_event(Duration::from_secs(5))
                    .await
                    .expect("the continuation");
            }
            "Completed" => break,
            _ => panic!(
                "the delivery ended with {answer} while the action is pending: {outcomes:#?}\n{}",
                lambda.runtime.output()
            ),
        }
        assert!(outcomes.len() < 20, "{outcomes:#?}");
    }
    burst.await.unwrap();
    let throttled = w
        .server
        .audit()
        .filter(|e| e.resource() == "nodes" && e.code() == 429);
    assert!(!throttled.is_empty(), "the burst hit node writes");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}\n{outcomes:#?}");
    assert!(checkpoint(&w).unwrap().completed_at.is_some());
}

/// Every pod the function asked to evict, in order (accepted or not).
fn eviction_requests(w: &FunctionWorld) -> Vec<String> {
    w.server
        .audit()
        .subresource_requests("pods", "eviction")
        .iter()
        .map(|e| e.name().to_owned())
        .collect()
}

/// Binds a bare pod `name` to the instance's node (as the scheduler does once the node is
/// schedulable again).
fn bind_pod(w: &FunctionWorld, name: &str) {
    w.server
        .store()
        .apply_yaml(
            &r#"
apiVersion: v1
kind: Pod
metadata: {name: NAME, namespace: default}
spec:
  nodeName: NODE
  containers: [{name: web, image: web}]
"#
            .replace("NAME", name)
            .replace("NODE", &w.node),
        )
        .unwrap();
}

#[tokio::test]
async fn a_finished_maintenance_drain_does_not_disarm_the_drain_of_a_later_termination() {
    use node_manager_testkit::aws::ScheduledEventCode;
    let w = world(&[], false).await;
    let lambda = w.function(Target::TerminatingHook);
    // Maintenance 6 s from now: inside the margin, so the node is drained at once, until
    // the maintenance starts.
    let now = jiff::Timestamp::now();
    let starts_at = now.checked_add(jiff::SignedDuration::from_secs(6)).unwrap();
    let event = w
        .aws
        .interruptions()
        .schedule_maintenance(
            INSTANCE,
            ScheduledEventCode::SystemReboot,
            starts_at,
            starts_at
                .checked_add(jiff::SignedDuration::from_secs(3600))
                .unwrap(),
        )
        .unwrap();
    let answer = lambda.response_to(&event).await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    let maintenance_drain = checkpoint(&w).unwrap();

    // The reboot passes; the operator puts the node back in service and pods land on it.
    let wait = std::time::Duration::try_from(starts_at.duration_since(jiff::Timestamp::now()))
        .unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(500)).await;
    w.server
        .store()
        .modify::<Node>("", &w.node, |node| {
            node.spec.get_or_insert_with(Default::default).unschedulable = Some(false);
        })
        .unwrap();
    bind_pod(&w, "web-1");
    let before = eviction_requests(&w).len();

    // A scale-in terminates the instance: a full drain of its own, the new pod evicted.
    let (_subscription, notification) = w.start_termination().await;
    let answer = lambda.response_to(&notification).await;
    assert_eq!(outcome_of(&answer), "Completed", "{answer}");
    let summary = answer["records"][0]["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("Drained"), "{answer}");
    let sent = eviction_requests(&w);
    assert!(
        sent[before..].iter().any(|p| p == "web-1"),
        "the pod bound after the maintenance was evicted: {sent:?}"
    );
    let cp = checkpoint(&w).unwrap();
    assert!(cp.started_at > starts_at, "a new drain: {cp:?}");
    assert!(cp.left_node_drained());
    assert_eq!(w.aws.autoscaling().completions().len(), 1);
    assert!(
        maintenance_drain.left_node_drained(),
        "the maintenance drain was recorded drained: {maintenance_drain:?}"
    );
}

#[tokio::test]
async fn the_shutdown_of_an_instance_retained_after_a_failed_drain_drains_it_again() {
    use node_manager::aws::LifecycleActionResult;
    use node_manager_testkit::aws::{FakeAutoScalingGroup, InstanceState};
    let w = world(
        &[
            ("DRAIN_TIMEOUT_SECONDS", "2"),
            ("DRAIN_TIMEOUT_RESULT", "RETAIN"),
        ],
        false,
    )
    .await;
    w.aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", node_manager_testkit::e2e::CLUSTER)
            .availability_zones(&["eu-west-1a"])
            .retain_on_abandon(true),
    );
    let store = w.server.store();
    let budget = node_manager_testkit::fixtures::pdb_max_unavailable(
        "default",
        "nginx",
        serde_json::json!(0),
        &[("app", "nginx")],
    );
    store.create(&budget).unwrap();
    let lambda = w.function(Target::TerminatingHook);

    // The scale-in's drain fails (the budget allows no eviction): the instance is retained.
    let (_subscription, notification) = w.start_termination().await;
    let answer = lambda.response_to(&notification).await;
    assert_eq!(outcome_of(&answer), "Completed", "{answer}");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result, LifecycleActionResult::Abandon);
    assert_eq!(w.aws.autoscaling().retained_instances(GROUP), [INSTANCE]);
    let failed = checkpoint(&w).unwrap();
    assert_eq!(running_on(store, &w.node, "nginx-"), 4);

    // The operator fixes the budget and terminates the retained instance: its shutdown is
    // announced, and the node is drained before it goes.
    store
        .delete::<k8s_openapi::api::policy::v1::PodDisruptionBudget>("default", "nginx")
        .unwrap();
    let mut bus = w
        .aws
        .eventbridge()
        .subscribe(node_manager_testkit::aws::EventPattern {
            sources: vec!["aws.ec2".to_owned()],
            detail_types: vec!["EC2 Instance State-change Notification".to_owned()],
        });
    w.aws.ec2().set_state(INSTANCE, InstanceState::ShuttingDown);
    let shutdown = bus.next_event(Duration::from_secs(5)).await.unwrap();
    let answer = lambda.response_to(&shutdown).await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    assert_eq!(running_on(store, &w.node, "nginx-"), 0);
    assert!(failed.completed_at.is_some() && !failed.left_node_drained());
    assert_eq!(
        failed.drained_at, None,
        "not recorded as drained: {failed:?}"
    );
}
