//! The built `terminating-hook` binary under an API Priority and Fairness brownout that
//! outlasts one request's time bound: kube-apiserver doubles the `Retry-After` of a priority
//! level that keeps dropping requests (1, 2, 4, 8 s ...), so a request honouring it runs past
//! its 10 s bound. The drain tries such a step again within its invocation, and hands over
//! when the invocation's hand-over time comes first; it never fails the invocation for it.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing the
//! function.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use node_manager::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, DrainCheckpoint};
use node_manager_testkit::e2e::{FunctionWorld, Target};
use node_manager_testkit::fixtures::{Workload, running_on};
use node_manager_testkit::kube::{FaultAction, FaultRule, Store};
use node_manager_testkit::lambda_api::InvocationOutcome;
use serde_json::Value;

const INSTANCE: &str = "i-0b1c2d3e4f5061728";
/// The function's user agent names it: the brownout throttles only its requests.
const HOOK: &str = "terminating-hook";

/// The terminating hook with 2 nginx pods on the instance's node and a node for them to move
/// to; `settings` added to its environment.
async fn drain_world(settings: &[(&str, &str)]) -> FunctionWorld {
    let mut builder = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "0.2")
        .env("DRAIN_TIMEOUT_SECONDS", "60")
        .env("HAND_OVER_MARGIN_SECONDS", "2")
        .log_level("info");
    for (key, value) in settings {
        builder = builder.env(key, value);
    }
    let w = builder.start().await;
    let nginx = Workload::new("default", "nginx")
        .replicas(2)
        .container("nginx", "nginx")
        .grace_period_seconds(None);
    w.server.store().create(&nginx.deployment()).unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("the pods run", Duration::from_secs(10), |store| {
            running_on(store, &node, "nginx-") == 2
        })
        .await
        .unwrap();
    w.add_room_node();
    w
}

/// kube-apiserver's answers to the function's next 4 requests of `verb` on `resource`: 429
/// with a `Retry-After` doubling from 1 s, 15 s of waits in all, past the 10 s bound of one
/// request.
fn doubling_brownout(verb: &str, resource: &str) -> Vec<FaultRule> {
    [1, 2, 4, 8]
        .map(|retry_after_seconds| {
            FaultRule::new(FaultAction::TooManyRequests {
                retry_after_seconds,
            })
            .verb(verb)
            .resource(resource)
            .user_agent(HOOK)
            .times(1)
        })
        .to_vec()
}

/// Invokes the hook with `event` and a deadline `within` from now: its response (panics with
/// the process's output on a failed invocation).
async fn answer(w: &FunctionWorld, event: &Value, within: Duration) -> Value {
    let lambda = w.function(Target::TerminatingHook);
    match lambda.runtime.invoke(event, within).await.unwrap() {
        InvocationOutcome::Response(answer) => answer,
        other => panic!("{other:?}\n{}", lambda.runtime.output()),
    }
}

/// How many of the function's requests the brownout answered with 429.
fn throttled(w: &FunctionWorld, resource: &str) -> usize {
    w.server
        .audit()
        .filter(|e| e.resource() == resource && e.code() == 429)
        .len()
}

fn drained_at_recorded(store: &Store, node: &str) -> bool {
    store
        .find::<Node>("", node)
        .and_then(|n| n.metadata.annotations?.get(CHECKPOINT_ANNOTATION).cloned())
        .and_then(|raw| DrainCheckpoint::parse(&raw).ok())
        .is_some_and(|c| c.drained_at.is_some())
}

#[tokio::test]
async fn a_node_lookup_throttled_past_its_bound_is_tried_again_and_the_drain_completes() {
    let w = drain_world(&[]).await;
    let (_, event) = w.start_termination().await;
    for rule in doubling_brownout("get", "nodes") {
        w.server.faults().add(rule);
    }
    let started = Instant::now();
    let answer = answer(&w, &event, Duration::from_secs(40)).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(
        started.elapsed() > Duration::from_secs(10),
        "the lookup was not throttled past its bound: {:?}",
        started.elapsed()
    );
    assert_eq!(throttled(&w, "nodes"), 4);
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
}

#[tokio::test]
async fn a_step_of_the_drain_throttled_past_its_bound_is_tried_again_and_the_drain_completes() {
    // A settle period long enough to plant the brownout after the drained mark: the list of
    // the node's pods before completing meets it (the fixed one: no load balancer to wait for
    // would end the wait at once).
    let w = drain_world(&[("SETTLE_SECONDS", "2"), ("LOAD_BALANCER_WAIT", "false")]).await;
    let (_, event) = w.start_termination().await;
    let planted = {
        let store = w.server.store().clone();
        let node = w.node.clone();
        let faults = w.server.faults().clone();
        let rules = doubling_brownout("list", "pods");
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !drained_at_recorded(&store, &node) {
                assert!(
                    Instant::now() < deadline,
                    "the drain never marked the node drained"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for rule in rules {
                faults.add(rule);
            }
        })
    };
    let answer = answer(&w, &event, Duration::from_secs(40)).await;
    planted.await.unwrap();
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(throttled(&w, "pods"), 4);
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
}

#[tokio::test]
async fn a_node_lookup_throttled_until_the_hand_over_time_hands_over_before_the_deadline() {
    let w = drain_world(&[]).await;
    let (mut subscription, event) = w.start_termination().await;
    // Every lookup is asked to wait 8 s: two tries fit in a request's bound, none gets
    // through before the invocation's hand-over time (12 s in).
    w.server.faults().add(
        FaultRule::new(FaultAction::TooManyRequests {
            retry_after_seconds: 8,
        })
        .verb("get")
        .resource("nodes")
        .user_agent(HOOK),
    );
    let within = Duration::from_secs(14);
    let started = Instant::now();
    let answer = answer(&w, &event, within).await;
    assert!(started.elapsed() < within, "{:?}", started.elapsed());
    assert_eq!(answer["records"][0]["outcome"], "HandedOver", "{answer}");
    subscription
        .next_event(Duration::from_secs(5))
        .await
        .expect("the notification republished for a fresh invocation");
    assert!(
        w.server.audit().filter(|e| e.verb == "patch").is_empty(),
        "nothing is written before the node is found"
    );
    assert!(w.aws.autoscaling().completions().is_empty());
}
