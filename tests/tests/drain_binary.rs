//! The built `terminating-hook` binary, run through the local Lambda Runtime API as Lambda runs
//! it, against the fake AWS endpoints (Auto Scaling, EC2, SNS, EKS over HTTP with SigV4
//! credentials) and the fake API server (EKS token authentication, the shipped RBAC): the
//! fixtures, then the reference drain of a live termination, and the drain's optional settings
//! (`NODE_TAINT`, `POD_GRACE_PERIOD_SECONDS`) as the process reads them from its environment.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing the function.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::LifecycleActionResult;
use node_manager_testkit::e2e::{FunctionWorld, Target};
use node_manager_testkit::fixtures::running_on;
use node_manager_testkit::fixtures::{self, Workload};
use node_manager_testkit::kube::{AuditEvent, Store};
use node_manager_testkit::soak::corpus::fixture;
use serde_json::{Value, json};

/// Not the terminating fixture's instance, so that the fixture finds no node.
const INSTANCE: &str = "i-0b1c2d3e4f5061728";
const EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// The terminating hook (JSON logs, `settings` added to its environment) with the reference
/// node running the EKS system workloads and 4 nginx pods, and a second node for the evicted pods to move to.
async fn drain_world(settings: &[(&str, &str)]) -> FunctionWorld {
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
    for (key, value) in settings {
        builder = builder.env(key, value);
    }
    let w = builder.start().await;
    let store = w.server.store();
    fixtures::create_eks_system_workloads(store).unwrap();
    let nginx = Workload::new("default", "nginx")
        .replicas(4)
        .container("nginx", "nginx")
        .grace_period_seconds(None);
    store.create(&nginx.deployment()).unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("the reference pods run", Duration::from_secs(10), |store| {
            running_on(store, &node, "nginx-") == 4
                && running_on(store, &node, "coredns-") == 1
                && running_on(store, &node, "aws-node-") == 1
                && running_on(store, &node, "kube-proxy-") == 1
        })
        .await
        .unwrap();
    w.add_room_node();
    w
}

/// The pods the drain must evict: all but the DaemonSets' (kube-system's DNS included).
fn evictable_pods(w: &FunctionWorld) -> BTreeSet<String> {
    w.server
        .store()
        .list::<Pod>()
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(w.node.as_str()))
        .filter_map(|p| p.metadata.name)
        .filter(|n| n.starts_with("nginx-") || n.starts_with("coredns-"))
        .collect()
}

/// Terminates the reference instance and delivers Auto Scaling's notification to the
/// terminating hook, which must complete the action.
async fn terminate(w: &FunctionWorld) {
    let answer = terminate_and_answer(w).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
}

/// The drain's writes as the API server logged them, in order: node patches and evictions.
fn drain_writes(w: &FunctionWorld) -> Vec<AuditEvent> {
    w.server
        .audit()
        .filter(|e| e.verb == "patch" || e.subresource() == "eviction")
}

/// The position of the first successful node patch whose body satisfies `sets`.
fn node_patch(writes: &[AuditEvent], what: &str, sets: impl Fn(&Value) -> bool) -> usize {
    writes
        .iter()
        .position(|e| {
            e.resource() == "nodes"
                && (200..300).contains(&e.code())
                && e.request_object.as_ref().is_some_and(&sets)
        })
        .unwrap_or_else(|| panic!("no {what} patch"))
}

/// The writes with their bodies, one a line, for a failure message.
fn trail(writes: &[AuditEvent]) -> String {
    writes
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e.line(),
                e.request_object.clone().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn first_eviction(writes: &[AuditEvent]) -> usize {
    writes
        .iter()
        .position(|e| e.subresource() == "eviction")
        .expect("evictions")
}

fn evicted(writes: &[AuditEvent]) -> BTreeSet<String> {
    writes
        .iter()
        .filter(|e| e.subresource() == "eviction" && (200..300).contains(&e.code()))
        .map(|e| e.name().to_owned())
        .collect()
}

fn sets_label(patch: &Value) -> bool {
    patch["metadata"]["labels"][EXCLUDE_FROM_LB] == "true"
}

fn sets_cordon(patch: &Value) -> bool {
    patch["spec"]["unschedulable"] == true
}

fn sets_taints(patch: &Value) -> bool {
    !patch["spec"]["taints"].is_null()
}

#[tokio::test]
async fn terminating_hook_binary_handles_the_fixtures_and_drains_a_live_termination() {
    let w = drain_world(&[]).await;
    let lambda = w.function(Target::TerminatingHook);

    // The test notification: acknowledged.
    let answer = lambda
        .response_to(&fixture("sns-test-notification.json"))
        .await;
    assert_eq!(
        answer["records"][0]["outcome"], "TestNotification",
        "{answer}"
    );

    // The terminating fixture: its instance is unknown to EC2 and has no node, so the action
    // is completed at once; Auto Scaling does not know the fixture's token ("No active
    // Lifecycle Action"), which is success.
    let answer = lambda
        .response_to(&fixture("sns-lifecycle-terminating.json"))
        .await;
    assert_eq!(answer["records"][0]["outcome"], "NoNode", "{answer}");
    assert!(w.server.audit().filter(|e| e.verb == "patch").is_empty());

    // A live termination of the reference node.
    let before = evictable_pods(&w);
    terminate(&w).await;
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);
    assert_eq!(completions[0].instance_id, INSTANCE);

    // The audit log: the label patch, the cordon patch, evictions of nginx and coredns only;
    // no taint and no grace period, as none is configured.
    let writes = drain_writes(&w);
    let label = node_patch(&writes, "label", sets_label);
    let cordon = node_patch(&writes, "cordon", sets_cordon);
    let first_eviction = first_eviction(&writes);
    // The label never after the cordon (the claim may carry both in one write), and both
    // before any eviction.
    assert!(
        label <= cordon && cordon < first_eviction,
        "{}",
        trail(&writes)
    );
    assert_eq!(evicted(&writes), before);
    for write in &writes {
        let body = write.request_object.as_ref();
        assert!(!body.is_some_and(sets_taints), "{}", write.line());
        assert!(
            body.is_none_or(|b| b["deleteOptions"].get("gracePeriodSeconds").is_none()),
            "{}",
            write.line()
        );
    }

    // One JSON log line per step with the fields an operator searches by, and EMF metrics.
    let output = lambda.runtime.output();
    let cordoned = output
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line.to_string().contains("\"cordoned\""))
        .unwrap_or_else(|| panic!("no JSON log line for the cordon step:\n{output}"));
    let text = cordoned.to_string();
    for field in ["instance_id", "asg", "hook", "request_id", "node"] {
        assert!(text.contains(field), "{field} missing from {text}");
    }
    assert!(
        output.lines().any(|l| l.contains("\"_aws\"")
            && l.contains("DrainDuration")
            && l.contains("PodsEvicted")),
        "{output}"
    );
}

#[tokio::test]
async fn node_taint_setting_taints_the_drained_node_after_the_cordon() {
    let w = drain_world(&[("NODE_TAINT", "node-manager/draining=true:NoSchedule")]).await;
    let before = evictable_pods(&w);
    terminate(&w).await;

    let node = w.server.store().get::<Node>("", &w.node).unwrap();
    assert_eq!(node.metadata.labels.unwrap()[EXCLUDE_FROM_LB], "true");
    let spec = node.spec.unwrap();
    assert_eq!(spec.unschedulable, Some(true));
    let taints = spec.taints.unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == "node-manager/draining"
            && t.value.as_deref() == Some("true")
            && t.effect == "NoSchedule"),
        "{taints:?}"
    );

    // Written by the terminating hook: label, cordon, then the taint (the claim may carry
    // them in one write), before any eviction.
    let writes = drain_writes(&w);
    let label = node_patch(&writes, "label", sets_label);
    let cordon = node_patch(&writes, "cordon", sets_cordon);
    let taint = node_patch(&writes, "taint", |patch| {
        patch["spec"]["taints"].as_array().is_some_and(|taints| {
            taints.contains(&json!({
                "key": "node-manager/draining", "value": "true", "effect": "NoSchedule"
            }))
        })
    });
    for step in [label, cordon, taint] {
        assert_eq!(
            writes[step].user.username,
            "terminating-hook",
            "{}",
            writes[step].line()
        );
    }
    let first_eviction = first_eviction(&writes);
    assert!(
        label <= cordon && cordon <= taint && taint < first_eviction,
        "{}",
        trail(&writes)
    );
    assert_eq!(evicted(&writes), before);
}

#[tokio::test]
async fn pod_grace_period_setting_reaches_every_eviction() {
    let w = drain_world(&[("POD_GRACE_PERIOD_SECONDS", "7")]).await;
    let before = evictable_pods(&w);
    terminate(&w).await;

    let writes = drain_writes(&w);
    assert_eq!(evicted(&writes), before);
    let evictions: Vec<_> = writes
        .iter()
        .filter(|e| e.subresource() == "eviction")
        .collect();
    for eviction in evictions {
        assert_eq!(eviction.user.username, "terminating-hook");
        let body = eviction.request_object.as_ref().expect("an eviction body");
        assert_eq!(
            body["deleteOptions"]["gracePeriodSeconds"],
            7,
            "{}: {body}",
            eviction.line()
        );
    }
}

// --- Drains under cluster trouble (issue #15) -------------------------------------------

/// The second node [`drain_world`] registers.
const OTHER_NODE: &str = node_manager_testkit::e2e::ROOM_NODE;

/// Terminates the reference instance and returns the terminating hook's answer to Auto
/// Scaling's notification, whatever it is.
async fn terminate_and_answer(w: &FunctionWorld) -> Value {
    let (_, event) = w.start_termination().await;
    w.function(Target::TerminatingHook)
        .response_to(&event)
        .await
}

/// Adds `rule` to the API server's faults as soon as the node is cordoned (the drain's claim
/// has been written), from a task of its own; the task answers the rule's id.
fn add_fault_once_cordoned(
    w: &FunctionWorld,
    rule: node_manager_testkit::kube::FaultRule,
) -> tokio::task::JoinHandle<node_manager_testkit::kube::FaultId> {
    let store = w.server.store().clone();
    let faults = w.server.faults().clone();
    let node = w.node.clone();
    tokio::spawn(async move {
        poll(&store, "the cordon", |store| {
            store
                .find::<Node>("", &node)
                .and_then(|n| n.spec?.unschedulable)
                == Some(true)
        })
        .await;
        faults.add(rule)
    })
}

/// A pod on the drained node whose deletion waits for a finalizer the test removes: the
/// drain outlasts as many invocations as the test wants.
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

/// Polls `store` (every 10 ms, for at most 20 s) until `condition` holds.
async fn poll(store: &Store, what: &str, condition: impl Fn(&Store) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !condition(store) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn summary(answer: &Value) -> String {
    answer["records"][0]["summary"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The notes of the Events with `reason`.
fn event_notes(w: &FunctionWorld, reason: &str) -> Vec<String> {
    w.server
        .store()
        .events_with_reason(reason)
        .into_iter()
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test]
async fn a_503_burst_on_node_writes_longer_than_the_lease_does_not_drop_the_drain() {
    use node_manager_testkit::kube::{FaultAction, FaultRule};
    let w = drain_world(&[("DRAIN_LEASE_SECONDS", "1")]).await;
    // A pod that takes a while to stop keeps the drain busy through the burst.
    w.server
        .store()
        .apply_yaml(
            r#"
apiVersion: v1
kind: Pod
metadata: {name: slow, namespace: default}
spec:
  nodeName: NODE
  terminationGracePeriodSeconds: 500
  containers: [{name: slow, image: slow}]
"#
            .replace("NODE", &w.node)
            .as_str(),
        )
        .unwrap();
    let before = evictable_pods(&w);
    // Once the node is cordoned (the claim's write), every node write fails with 503 for
    // three lease durations.
    let burst = add_fault_once_cordoned(
        &w,
        FaultRule::new(FaultAction::ServiceUnavailable)
            .verb("patch")
            .resource("nodes")
            .lasting(Duration::from_secs(3)),
    );
    let answer = terminate_and_answer(&w).await;
    burst.await.unwrap();
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(summary(&answer).contains("Drained"), "{answer}");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    let refused = w
        .server
        .audit()
        .filter(|e| e.resource() == "nodes" && e.code() == 503);
    assert!(!refused.is_empty(), "the burst hit node writes");
    assert!(evicted(&drain_writes(&w)).is_superset(&before));
}

#[tokio::test]
async fn a_dead_kubelet_does_not_hold_the_drain_until_its_deadline() {
    use node_manager_testkit::kube::{FaultAction, FaultRule};
    let w = drain_world(&[("STUCK_POD_SECONDS", "1")]).await;
    let before = evictable_pods(&w);
    w.server.kill_kubelet(&w.node).unwrap();
    // Slow evictions: an out-of-service taint put on before the critical tier's eviction
    // arrived would have the taint-eviction controller delete that pod without one.
    let slow = FaultAction::Latency(Duration::from_millis(300));
    w.server
        .faults()
        .add(FaultRule::new(slow).subresource("eviction"));
    let started = std::time::Instant::now();
    let answer = terminate_and_answer(&w).await;
    let took = started.elapsed();
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(summary(&answer).contains("Drained"), "{answer}");
    // DRAIN_TIMEOUT_SECONDS is 20: finished long before it.
    assert!(took < Duration::from_secs(12), "took {took:?}");
    // Every pod was evicted (the critical tier too), none was confirmed gone, and the stuck
    // ones are named in the log and in a Warning Event on the node (the Event recorder folds
    // later reports of the same reason into the first Event's series).
    assert_eq!(evicted(&drain_writes(&w)), before);
    let output = w.function(Target::TerminatingHook).runtime.output();
    let reported: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("\"stuck_pods\""))
        .collect();
    for pod in &before {
        assert!(
            reported.iter().any(|l| l.contains(pod.as_str())),
            "{pod} not reported stuck:\n{output}"
        );
    }
    let notes = event_notes(&w, "PodDeletionStuck");
    assert!(
        notes
            .iter()
            .any(|n| before.iter().any(|pod| n.contains(pod.as_str()))),
        "{notes:?}"
    );
}

#[tokio::test]
async fn pods_that_tolerate_the_cordon_and_come_back_are_not_chased() {
    let w = drain_world(&[]).await;
    // The other node takes none of the agent's pods: a replacement can only go back to the
    // cordoned node, which its toleration lets it onto.
    w.server
        .store()
        .modify::<Node>("", OTHER_NODE, |node| {
            node.spec.get_or_insert_default().taints =
                Some(vec![k8s_openapi::api::core::v1::Taint {
                    key: "dedicated".into(),
                    value: Some("web".into()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                }]);
        })
        .unwrap();
    w.server
        .store()
        .apply_yaml(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: agent, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      tolerations: [{key: node.kubernetes.io/unschedulable, operator: Exists, effect: NoSchedule}]
      containers: [{name: agent, image: agent}]
"#,
        )
        .unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("the agent runs", Duration::from_secs(10), |store| {
            running_on(store, &node, "agent-") == 1
        })
        .await
        .unwrap();
    let before = evictable_pods(&w);
    let answer = terminate_and_answer(&w).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(summary(&answer).contains("Drained"), "{answer}");
    let writes = drain_writes(&w);
    let agent_evictions = writes
        .iter()
        .filter(|e| e.subresource() == "eviction" && e.name().starts_with("agent-"))
        .count();
    assert_eq!(agent_evictions, 1, "{}", trail(&writes));
    // The critical tier was reached: CoreDNS was evicted.
    assert!(evicted(&writes).is_superset(&before), "{}", trail(&writes));
    // And the replacement is where its owner put it.
    assert_eq!(running_on(w.server.store(), &w.node, "agent-"), 1);
}

#[tokio::test]
async fn eviction_conflicts_and_namespace_terminating_answers_are_retried() {
    use node_manager_testkit::kube::{FaultAction, FaultRule};
    let w = drain_world(&[]).await;
    let before = evictable_pods(&w);
    w.server.faults().add(
        FaultRule::new(FaultAction::Conflict)
            .subresource("eviction")
            .times(3),
    );
    w.server.faults().add(
        FaultRule::new(FaultAction::NamespaceTerminating)
            .subresource("eviction")
            .times(2),
    );
    let answer = terminate_and_answer(&w).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(summary(&answer).contains("Drained"), "{answer}");
    let writes = drain_writes(&w);
    let refused: Vec<u16> = writes
        .iter()
        .filter(|e| e.subresource() == "eviction" && !(200..300).contains(&e.code()))
        .map(|e| e.code())
        .collect();
    assert_eq!(refused, [409, 409, 409, 403, 403], "{}", trail(&writes));
    assert_eq!(evicted(&writes), before);
}

#[tokio::test]
async fn a_pod_bound_during_the_settle_period_is_evicted_before_completing() {
    // The fixed settle period (no load balancer to wait for would end the wait at once).
    let w = drain_world(&[("SETTLE_SECONDS", "2"), ("LOAD_BALANCER_WAIT", "false")]).await;
    let store = w.server.store().clone();
    let node = w.node.clone();
    // A scheduler with a stale cache binds a pod to the node while it settles.
    let late = tokio::spawn(async move {
        poll(&store, "the drained mark", |store| {
            store.find::<Node>("", &node).is_some_and(|n| {
                n.metadata
                    .annotations
                    .unwrap_or_default()
                    .values()
                    .any(|v| v.contains("drainedAt"))
            })
        })
        .await;
        store
            .apply_yaml(
                &r#"
apiVersion: v1
kind: Pod
metadata: {name: latecomer, namespace: default}
spec:
  nodeName: NODE
  containers: [{name: late, image: late}]
"#
                .replace("NODE", &node),
            )
            .unwrap();
    });
    let answer = terminate_and_answer(&w).await;
    late.await.unwrap();
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let writes = drain_writes(&w);
    assert!(evicted(&writes).contains("latecomer"), "{}", trail(&writes));
}

#[tokio::test]
async fn a_zero_grace_period_setting_is_sent_as_one_second() {
    let w = drain_world(&[("POD_GRACE_PERIOD_SECONDS", "0")]).await;
    terminate(&w).await;
    let writes = drain_writes(&w);
    let graces: BTreeSet<String> = writes
        .iter()
        .filter(|e| e.subresource() == "eviction")
        .filter_map(|e| e.request_object.as_ref())
        .map(|body| body["deleteOptions"]["gracePeriodSeconds"].to_string())
        .collect();
    assert_eq!(
        graces,
        BTreeSet::from(["1".to_owned()]),
        "{}",
        trail(&writes)
    );
}

#[tokio::test]
async fn the_drain_deadline_is_acted_on_when_the_pods_cannot_be_listed() {
    use node_manager_testkit::kube::{FaultAction, FaultRule};
    let w = drain_world(&[("DRAIN_TIMEOUT_SECONDS", "1")]).await;
    w.server.faults().add(
        FaultRule::new(FaultAction::InternalError)
            .verb("list")
            .resource("pods"),
    );
    w.server.faults().add(
        FaultRule::new(FaultAction::InternalError)
            .verb("watch")
            .resource("pods"),
    );
    let answer = terminate_and_answer(&w).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(summary(&answer).contains("PodEvictionFailure"), "{answer}");
    let notes = event_notes(&w, "PodEvictionFailure");
    assert!(
        notes.iter().any(|n| n.contains("could not be listed")),
        "{notes:?}"
    );
}

#[tokio::test]
async fn a_hand_over_margin_leaving_no_working_slice_fails_the_invocation() {
    // The margin is longer than the invocation: handing over at once would loop.
    let w = drain_world(&[("HAND_OVER_MARGIN_SECONDS", "40")]).await;
    let (mut subscription, event) = w.start_termination().await;
    let (error_type, message) = w.function(Target::TerminatingHook).error_from(&event).await;
    assert_eq!(error_type, "HandOverMarginTooLarge", "{message}");
    assert!(message.contains("HAND_OVER_MARGIN_SECONDS"), "{message}");
    // Nothing republished, nothing written to the node.
    assert!(subscription.try_next().is_none());
    assert!(w.server.audit().filter(|e| e.verb == "patch").is_empty());
}

#[tokio::test]
async fn a_drain_longer_than_sixteen_hand_overs_completes() {
    let w = drain_world(&[
        ("HAND_OVER_MARGIN_SECONDS", "0.3"),
        ("DRAIN_TIMEOUT_SECONDS", "300"),
    ])
    .await;
    // A pod whose deletion waits for a finalizer the test removes after 17 hand-overs.
    add_held_pod(&w);
    let lambda = w.function(Target::TerminatingHook);
    let (mut subscription, mut event) = w.start_termination().await;
    let mut hand_overs = 0;
    loop {
        if hand_overs == 17 {
            w.server
                .store()
                .modify::<Pod>("default", "held", |pod| pod.metadata.finalizers = None)
                .unwrap();
        }
        let outcome = lambda
            .runtime
            .invoke(&event, Duration::from_millis(2500))
            .await
            .unwrap();
        let node_manager_testkit::lambda_api::InvocationOutcome::Response(answer) = outcome else {
            panic!("{outcome:?}\n{}", lambda.runtime.output());
        };
        match answer["records"][0]["outcome"].as_str() {
            Some("HandedOver") => {
                hand_overs += 1;
                assert!(hand_overs <= 30, "the drain never finished");
                event = subscription
                    .next_event(Duration::from_secs(5))
                    .await
                    .expect("the continuation");
            }
            Some("Completed") => {
                assert!(summary(&answer).contains("Drained"), "{answer}");
                break;
            }
            _ => panic!("{answer}"),
        }
    }
    assert!(hand_overs > 16, "{hand_overs} hand-overs");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);
}

#[tokio::test]
async fn an_api_brownout_at_the_hand_over_time_still_hands_over_before_the_deadline() {
    use node_manager_testkit::kube::{FaultAction, FaultRule};
    use node_manager_testkit::lambda_api::InvocationOutcome;
    let w = drain_world(&[
        ("HAND_OVER_MARGIN_SECONDS", "2"),
        ("DRAIN_LEASE_SECONDS", "3"),
        ("DRAIN_TIMEOUT_SECONDS", "300"),
    ])
    .await;
    // A pod whose deletion waits for a finalizer: the drain outlasts the invocation.
    add_held_pod(&w);
    let lambda = w.function(Target::TerminatingHook);
    let (mut subscription, event) = w.start_termination().await;
    // Once the node is cordoned, a minute of API Priority and Fairness throttling of node
    // writes: every PATCH answered 429 with Retry-After 1 s, which kube's client retries up
    // to 15 times per call.
    let brownout = add_fault_once_cordoned(
        &w,
        FaultRule::new(FaultAction::TooManyRequests {
            retry_after_seconds: 1,
        })
        .verb("patch")
        .resource("nodes")
        .lasting(Duration::from_secs(60)),
    );
    let outcome = lambda
        .runtime
        .invoke(&event, Duration::from_secs(6))
        .await
        .unwrap();
    let rule = brownout.await.unwrap();
    let InvocationOutcome::Response(answer) = outcome else {
        panic!("{outcome:?}\n{}", lambda.runtime.output());
    };
    assert_eq!(answer["records"][0]["outcome"], "HandedOver", "{answer}");
    let throttled = w
        .server
        .audit()
        .filter(|e| e.resource() == "nodes" && e.code() == 429);
    assert!(!throttled.is_empty(), "the brownout hit node writes");
    let continuation = subscription
        .next_event(Duration::from_secs(5))
        .await
        .expect("the notification republished for a fresh invocation");

    // The brownout ends; the continuation resumes (after the unreleased lease lapses) and
    // completes once the pod is gone.
    w.server.faults().remove(rule);
    w.server
        .store()
        .modify::<Pod>("default", "held", |pod| pod.metadata.finalizers = None)
        .unwrap();
    let outcome = lambda
        .runtime
        .invoke(&continuation, Duration::from_secs(15))
        .await
        .unwrap();
    let InvocationOutcome::Response(answer) = outcome else {
        panic!("{outcome:?}\n{}", lambda.runtime.output());
    };
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
}

/// Every request and watch of an invocation share one connection: the client offers HTTP/2
/// over ALPN, as kubectl does, and the API server (like kube-apiserver) accepts it. Over
/// HTTP/1.1 the concurrent evictions and the watch of the node's pods each held a TLS
/// connection of their own.
#[tokio::test]
async fn a_drain_shares_one_connection_to_the_api_server() {
    let w = drain_world(&[]).await;
    let before = w.server.connections_accepted();
    terminate(&w).await;
    assert!(
        evicted(&drain_writes(&w)).len() >= 5,
        "{}",
        trail(&drain_writes(&w))
    );
    let opened = w.server.connections_accepted() - before;
    assert_eq!(opened, 1, "connections opened by the drain");
}

/// A drain held by a PodDisruptionBudget that allows nothing and by a do-not-disrupt pod says,
/// once it has run `DRAIN_BLOCKED_REPORT_SECONDS`, which pods it waits for and why: the
/// budget by name with the disruptions it allows, the annotation; and again after as long.
#[tokio::test]
async fn a_waiting_drain_names_the_pods_it_waits_for_and_what_holds_them() {
    let w = drain_world(&[
        ("DRAIN_BLOCKED_REPORT_SECONDS", "1"),
        ("DRAIN_TIMEOUT_SECONDS", "3.5"),
    ])
    .await;
    let store = w.server.store();
    store
        .apply_yaml(
            &r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: nginx-all, namespace: default}
spec:
  minAvailable: 4
  selector: {matchLabels: {app: nginx}}
---
apiVersion: v1
kind: Pod
metadata:
  name: ledger
  namespace: default
  annotations: {karpenter.sh/do-not-disrupt: "true"}
spec:
  nodeName: NODE
  containers: [{name: ledger, image: ledger}]
"#
            .replace("NODE", &w.node),
        )
        .unwrap();
    poll(store, "the budget allows nothing", |s| {
        s.find::<k8s_openapi::api::policy::v1::PodDisruptionBudget>("default", "nginx-all")
            .and_then(|b| b.status)
            .is_some_and(|status| {
                status.observed_generation.is_some() && status.disruptions_allowed == 0
            })
    })
    .await;
    let answer = terminate_and_answer(&w).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let notes = event_notes(&w, "DrainBlocked");
    let first = notes
        .first()
        .unwrap_or_else(|| panic!("no DrainBlocked Event: {answer}"));
    assert!(
        first.contains("(PodDisruptionBudget nginx-all allows 0 disruption(s))"),
        "{first}"
    );
    assert!(first.contains("default/nginx-"), "{first}");
    assert!(
        first.contains("default/ledger (karpenter.sh/do-not-disrupt)"),
        "{first}"
    );
    // Reported again while it waited (the recorder counts repeats of one note into a
    // series, so the log has one line per report).
    let output = w.function(Target::TerminatingHook).runtime.output();
    let reports = output.matches("\"drain_blocked\"").count();
    assert!(reports >= 2, "{reports} reports:\n{output}");
    // And its metric lines, one per reason.
    for reason in ["PodDisruptionBudget", "DoNotDisrupt"] {
        assert!(
            output.lines().any(|l| l.contains("\"DrainBlockedSeconds\"")
                && l.contains(&format!("\"Reason\":\"{reason}\""))),
            "no DrainBlockedSeconds line for {reason}:\n{output}"
        );
    }
}
