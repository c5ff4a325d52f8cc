//! A terminating-hook process killed mid-drain (`LambdaRuntimeApi::kill`, SIGKILL) and the
//! notification redelivered to a fresh process (cold start): the drain resumes from its
//! checkpoint, never breaks the PodDisruptionBudget, and the lifecycle action is completed
//! exactly once. The processes' output is scanned for secrets.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager_testkit::e2e::{FunctionWorld, GROUP, INSTANCE, NODE, RunningFunction, Target};
use node_manager_testkit::lambda_api::InvocationOutcome;
use node_manager_testkit::soak::corpus;
use node_manager_testkit::soak::secrets::SecretScanner;
use serde_json::json;

const OTHER_NODE: &str = "ip-192-168-77-8.eu-west-1.compute.internal";

fn healthy(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_killed_mid_way_resumes_and_completes_once() {
    let w = FunctionWorld::builder()
        .env("DRAIN_TIMEOUT_SECONDS", "20")
        .env("DRAIN_LEASE_SECONDS", "1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "0.2")
        .start()
        .await;
    w.server
        .register_node(
            OTHER_NODE,
            "aws:///eu-west-1b/i-0aaaabbbbccccdddd",
            Some(Duration::ZERO),
        )
        .unwrap();
    // Four replicas over the two nodes; minAvailable 3: one eviction at a time, each waiting for a
    // replacement to start (slow pods), so the drain takes long enough to be killed.
    let store = w.server.store().clone();
    store
        .apply_yaml("apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 4\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      terminationGracePeriodSeconds: 30\n      containers: [{name: web, image: nginx}]\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: default}\nspec:\n  minAvailable: 3\n  selector: {matchLabels: {app: web}}\n")
        .unwrap();
    w.server
        .wait_for("4 pods Ready", Duration::from_secs(10), |s| {
            s.list::<Pod>().iter().filter(|p| healthy(p)).count() == 4
        })
        .await
        .unwrap();
    let on_node_before = store
        .list::<Pod>()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE))
        .count();

    // Watchdog: healthy web pods never below 3.
    let stop = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let store = store.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut lowest = i32::MAX;
            while !stop.load(Ordering::Relaxed) {
                let n = store.list::<Pod>().iter().filter(|p| healthy(p)).count() as i32;
                lowest = lowest.min(n);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            lowest
        })
    };

    let notice = w
        .aws
        .autoscaling()
        .terminate_instance(GROUP, INSTANCE)
        .unwrap();
    // The real envelope SNS delivers (the fixture's), carrying the fake Auto Scaling's notice.
    let mut event = corpus::with_message(
        &corpus::fixture("sns-lifecycle-terminating.json"),
        &notice.message,
    );
    event["Records"][0]["Sns"]["Subject"] = json!(notice.subject);
    let RunningFunction {
        runtime: terminating,
        credentials: creds,
        ..
    } = w.function(Target::TerminatingHook);

    // First delivery: killed once the drain has evicted something.
    let killed = {
        let invoke = terminating.invoke(&event, Duration::from_secs(30));
        let kill = async {
            let until = tokio::time::Instant::now() + Duration::from_secs(10);
            while w
                .server
                .audit()
                .subresource_requests("pods", "eviction")
                .iter()
                .all(|e| e.code() != 201)
            {
                assert!(tokio::time::Instant::now() < until, "no eviction happened");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            terminating.kill().await
        };
        let (outcome, _) = tokio::join!(invoke, kill);
        outcome.unwrap()
    };
    assert!(
        matches!(killed, InvocationOutcome::Error { .. }),
        "the killed invocation ended {killed:?}"
    );
    assert!(
        w.aws.autoscaling().completions().is_empty(),
        "not complete yet"
    );
    let generation = terminating.generation();

    // Redelivery (an SNS retry: a new request id) to a fresh process at once, inside the
    // dead invocation's lease (DRAIN_LEASE_SECONDS=1), with a concurrent duplicate: the
    // redelivery waits the dead lease out and takes the drain over; it is never dropped.
    let (a, b) = tokio::join!(
        terminating.invoke(&event, Duration::from_secs(40)),
        terminating.invoke(&event, Duration::from_secs(40))
    );
    for outcome in [a.unwrap(), b.unwrap()] {
        assert!(
            matches!(outcome, InvocationOutcome::Response(_)),
            "{outcome:?}\n{}",
            terminating.output()
        );
    }
    assert!(
        terminating.generation() > generation,
        "a cold start after the kill"
    );
    let completion = w
        .aws
        .autoscaling()
        .wait_for_completion(INSTANCE, Duration::from_secs(10))
        .await
        .expect("completed");
    assert_eq!(completion.result.as_str(), "CONTINUE");
    assert_eq!(w.aws.autoscaling().completions().len(), 1, "exactly once");
    stop.store(true, Ordering::Relaxed);
    let lowest = watchdog.await.unwrap();
    assert!(lowest >= 3, "PDB minAvailable 3 violated: {lowest} healthy");
    let node = store.get::<Node>("", NODE).unwrap();
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true));
    let left = store
        .list::<Pod>()
        .iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE)
                && p.metadata.deletion_timestamp.is_none()
        })
        .count();
    assert_eq!(left, 0, "{on_node_before} pods were on the node");
    SecretScanner::new()
        .with_credentials(creds)
        .assert_clean("terminating-hook process output", &terminating.output());
}
