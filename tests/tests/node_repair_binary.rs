//! The built `node-repair` binary with the built hooks, run through the local Lambda Runtime
//! API against the fake AWS endpoints and the fake API server: a node's kubelet dies, after
//! the (scaled-down) threshold the repair marks its instance unhealthy, Auto Scaling
//! terminates it through the terminate hook (which drains it at once) and launches a
//! replacement through the launch hook (completed once its node is Ready).
//!
//! Uses the binaries as built: run `cargo build --workspace --bins --tests` after changing them.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use node_manager::aws::LifecycleActionResult;
use node_manager::node_marks::shutdown::ShutdownRecord;
use node_manager::node_repair::memory::{REPAIR_ANNOTATION, RepairRecord};
use node_manager::node_repair::policy::RepairAction;
use node_manager_testkit::aws::FakeAutoScalingGroup;
use node_manager_testkit::e2e::{CLUSTER, FunctionWorld, GROUP, ROOM_NODE, Target};
use node_manager_testkit::fixtures;
use node_manager_testkit::kube::Store;
use serde_json::{Value, json};

/// What EventBridge sends on a schedule; the function needs none of it.
fn scheduled_event() -> Value {
    json!({
        "version": "0",
        "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "111111111111",
        "time": "2026-11-24T02:00:00Z",
        "region": "eu-west-1",
        "resources": ["arn:aws:events:eu-west-1:111111111111:rule/node-repair"],
        "detail": {}
    })
}

/// The seeded node's group: tagged for the cluster, one zone, no health-check grace period
/// (the node is older than it).
fn add_our_group(w: &FunctionWorld) {
    w.aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", CLUSTER)
            .availability_zones(&["eu-west-1a"])
            .health_check_grace_period(Duration::ZERO),
    );
}

/// The node's report in the function's answer.
fn report_of<'a>(answer: &'a Value, node: &str) -> &'a Value {
    answer["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == node))
        .unwrap_or_else(|| panic!("{node} missing from {answer}"))
}

#[tokio::test]
async fn a_node_whose_kubelet_died_is_replaced_through_both_hooks() {
    let w = FunctionWorld::builder()
        .functions(&[
            Target::NodeRepair,
            Target::TerminatingHook,
            Target::LaunchingHook,
        ])
        // Ready not True for 1.5 s (EKS: 30 min) -> Replace.
        .env(
            "REPAIR_CONFIG",
            r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 0.025, "repairAction": "Replace"}]}"#,
        )
        .env("DRAIN_TIMEOUT_SECONDS", "60")
        // The dead kubelet never confirms a deletion: the drain stops waiting for them after
        // this long on a node that is not Ready (default 60 s, the drain deadline here).
        .env("STUCK_POD_SECONDS", "1")
        .env("LAUNCH_TIMEOUT_SECONDS", "20")
        .json_logs()
        .log_level("info")
        .start()
        .await;
    // The node is older than its group's grace period.
    add_our_group(&w);
    // One workload pod runs on the node; when the kubelet dies it can no longer confirm the
    // pod's deletion.
    w.server
        .store()
        .apply_yaml(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers: [{name: web, image: nginx}]\n",
        )
        .unwrap();
    let node_name = w.node.clone();
    w.server
        .wait_for(
            "the web pod runs on the node",
            Duration::from_secs(10),
            |store| {
                store.list::<Pod>().iter().any(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
            },
        )
        .await
        .unwrap();
    let mut topic = w.aws.sns().subscribe(&w.topic).unwrap();
    let repair = w.function(Target::NodeRepair);

    // Healthy: nothing done.
    let answer = repair.response_to(&scheduled_event()).await;
    assert_eq!(
        report_of(&answer, &w.node)["outcome"],
        "Healthy",
        "{answer}"
    );
    assert_eq!(answer["groups"][0]["group"], GROUP, "{answer}");

    // The kubelet dies: unhealthy, not yet for long enough.
    // Ready=Unknown now; its pods' deletions are never confirmed.
    w.server.kill_kubelet(&w.node).unwrap();
    let answer = repair.response_to(&scheduled_event()).await;
    let report = report_of(&answer, &w.node);
    assert_eq!(report["outcome"], "Waiting", "{answer}");
    assert_eq!(report["verdict"]["problem"]["condition"], "Ready");
    assert_eq!(report["verdict"]["problem"]["reason"], "NodeStatusUnknown");
    assert!(w.aws.requests_for("SetInstanceHealth").is_empty());

    // Past the threshold: replaced.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let answer = repair.response_to(&scheduled_event()).await;
    let report = report_of(&answer, &w.node);
    assert_eq!(report["outcome"], "Repair", "{answer}");
    assert_eq!(report["acted"], true, "{answer}");
    assert_eq!(report["verdict"]["action"], "Replace");
    assert_eq!(answer["groups"][0]["repairsStarted"], 1, "{answer}");
    let calls = w.aws.requests_for("SetInstanceHealth");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].params.get("InstanceId"), Some(&w.instance));
    assert_eq!(
        calls[0]
            .params
            .get("ShouldRespectGracePeriod")
            .map(String::as_str),
        Some("true")
    );
    // Remembered on the node, reported as an Event.
    let node = w.server.store().find::<Node>("", &w.node).unwrap();
    let record = RepairRecord::from_annotation(
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REPAIR_ANNOTATION))
            .map(String::as_str),
    )
    .unwrap();
    assert_eq!((record.action, record.attempt), (RepairAction::Replace, 1));
    let started: Vec<Event> = w
        .server
        .store()
        .list::<Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("NodeRepairStarted"))
        .collect();
    assert_eq!(started.len(), 1);
    let note = started[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("Ready=Unknown (NodeStatusUnknown)") && note.contains("Replace"),
        "{note}"
    );

    // The next run sees the repair in flight and does not ask again.
    let answer = repair.response_to(&scheduled_event()).await;
    assert_eq!(
        report_of(&answer, &w.node)["outcome"],
        "RepairInFlight",
        "{answer}"
    );
    assert_eq!(w.aws.requests_for("SetInstanceHealth").len(), 1);

    // Auto Scaling terminates it through the terminate hook and launches a replacement.
    let replacement = w
        .aws
        .autoscaling()
        .wait_for_health_replacement(&w.instance, Duration::from_secs(5))
        .await
        .unwrap();
    let mut terminating = None;
    let mut launching = None;
    for _ in 0..2 {
        let event = topic.next_event(Duration::from_secs(5)).await.unwrap();
        let message = event["Records"][0]["Sns"]["Message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if message.contains("EC2_INSTANCE_TERMINATING") {
            terminating = Some(event);
        } else if message.contains("EC2_INSTANCE_LAUNCHING") {
            launching = Some(event);
        }
    }
    let started_drain = std::time::Instant::now();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&terminating.unwrap())
        .await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    // The dead node's drain did not wait out its 60 s deadline: the pod was evicted, and its
    // deletion, which the dead kubelet never confirms, was reported stuck; the drain then put
    // the out-of-service taint on the node (its kubelet silent), and the pod garbage
    // collector deleted the pod. (EC2 shows the instance running with passing checks, so
    // node repair itself did not.)
    assert!(started_drain.elapsed() < Duration::from_secs(20));
    let node = w.server.store().find::<Node>("", &w.node).unwrap();
    let record = ShutdownRecord::of(&node).expect("the drain's out-of-service taint record");
    assert_eq!(record.by, "terminating-hook", "{record:?}");
    w.server
        .wait_for("the stuck pod deleted", Duration::from_secs(5), |store| {
            !store.list::<Pod>().iter().any(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(w.node.as_str())
            })
        })
        .await
        .unwrap();
    let completion = w
        .aws
        .autoscaling()
        .wait_for_completion(&w.instance, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(completion.result, LifecycleActionResult::Continue);

    // The replacement's node joins; its launch action completes once it is Ready.
    w.server
        .register_node(
            &replacement.replacement_node,
            &format!("aws:///eu-west-1a/{}", replacement.replacement_instance_id),
            Some(Duration::from_millis(300)),
        )
        .unwrap();
    let answer = w
        .function(Target::LaunchingHook)
        .response_to(&launching.unwrap())
        .await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(
        w.aws
            .autoscaling()
            .instance_state(GROUP, &replacement.replacement_instance_id)
            .as_deref(),
        Some("InService")
    );

    // Afterwards: the old node's instance is gone from the group, the new one is healthy.
    let answer = repair.response_to(&scheduled_event()).await;
    assert_eq!(
        report_of(&answer, &w.node)["outcome"],
        "NotOurs",
        "{answer}"
    );
    assert_eq!(
        report_of(&answer, &replacement.replacement_node)["outcome"],
        "Healthy",
        "{answer}"
    );
    assert_eq!(w.aws.requests_for("SetInstanceHealth").len(), 1);

    // One JSON log line per decision, and EMF metrics by group.
    let output = repair.runtime.output();
    let decision = output
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| {
            line.to_string().contains("node repair decision")
                && line.to_string().contains("\"Repair\"")
        })
        .unwrap_or_else(|| panic!("no JSON decision line:\n{output}"));
    let text = decision.to_string();
    for field in [
        "node",
        "instance_id",
        "asg",
        "outcome",
        "condition",
        "action",
    ] {
        assert!(text.contains(field), "{field} missing from {text}");
    }
    assert!(
        output.lines().any(|l| l.contains("\"_aws\"")
            && l.contains("RepairsStarted")
            && l.contains("\"RepairsStarted\":1.0")),
        "{output}"
    );
}

#[tokio::test]
async fn a_dry_run_decides_and_reports_without_acting() {
    let w = FunctionWorld::builder()
        .functions(&[Target::NodeRepair])
        .env("REPAIR_DRY_RUN", "true")
        .env(
            "REPAIR_CONFIG",
            r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 0, "repairAction": "Replace"}]}"#,
        )
        .log_level("info")
        .start()
        .await;
    w.aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", CLUSTER)
            .health_check_grace_period(Duration::ZERO),
    );
    // Ready=Unknown now; its pods' deletions are never confirmed.
    w.server.kill_kubelet(&w.node).unwrap();
    let answer = w
        .function(Target::NodeRepair)
        .response_to(&scheduled_event())
        .await;
    assert_eq!(answer["dryRun"], true);
    let report = report_of(&answer, &w.node);
    assert_eq!(report["outcome"], "Repair", "{answer}");
    assert_eq!(report["acted"], false, "{answer}");
    assert!(
        report["why"].as_str().unwrap().contains("dry run"),
        "{answer}"
    );
    assert!(w.aws.requests_for("SetInstanceHealth").is_empty());
    let node = w.server.store().find::<Node>("", &w.node).unwrap();
    assert!(
        !node
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(REPAIR_ANNOTATION)
    );
    assert!(w.server.store().list::<Event>().is_empty());
}

#[tokio::test]
async fn malformed_settings_stop_the_function_with_a_clear_error() {
    let w = FunctionWorld::builder()
        .functions(&[Target::NodeRepair])
        .env(
            "REPAIR_CONFIG",
            r#"{"maxUnhealthyNodeThresholdCount": 2, "maxUnhealthyNodeThresholdPercentage": 20}"#,
        )
        .log_level("info")
        .start()
        .await;
    let repair = w.function(Target::NodeRepair);
    let outcome = repair
        .runtime
        .invoke(&scheduled_event(), Duration::from_secs(10))
        .await;
    assert!(
        !matches!(
            outcome,
            Ok(node_manager_testkit::lambda_api::InvocationOutcome::Response(_))
        ),
        "{outcome:?}"
    );
    let output = repair.runtime.output();
    assert!(output.contains("cannot both be set"), "{output}");
    assert!(
        w.aws
            .requests()
            .iter()
            .all(|r| r.operation != "SetInstanceHealth")
    );
}

/// Issue 24, item 1: with 2 of 10 nodes broken, the first repair's node is drained by the
/// terminating hook (its checkpoint on the node, the instance `Terminating:Wait`) for a
/// while; a repair run meanwhile must count it as the group's one repair in flight and not
/// replace the second node.
#[tokio::test]
async fn a_node_being_drained_for_its_replacement_holds_the_next_repair() {
    let w = FunctionWorld::builder()
        .functions(&[Target::NodeRepair, Target::TerminatingHook])
        .env(
            "REPAIR_CONFIG",
            r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 0.01, "repairAction": "Replace"}]}"#,
        )
        .env("DRAIN_TIMEOUT_SECONDS", "120")
        // The dead kubelet never confirms its pod's deletion: the drain waits this long.
        .env("STUCK_POD_SECONDS", "60")
        .log_level("info")
        .start()
        .await;
    add_our_group(&w);
    // Nine more nodes in the group.
    let mut nodes = vec![(w.instance.clone(), w.node.clone())];
    for i in 1..10 {
        let id = format!("i-0a{i:015x}");
        let instance = w.aws.ec2().add_running_instance(&id);
        w.aws
            .autoscaling()
            .add_instance(GROUP, &id, "eu-west-1a")
            .unwrap();
        w.server
            .register_node(
                &instance.private_dns_name,
                &format!("aws:///eu-west-1a/{id}"),
                Some(Duration::ZERO),
            )
            .unwrap();
        nodes.push((id, instance.private_dns_name));
    }
    // A pod on the first node, whose deletion its dead kubelet will never confirm.
    w.server
        .store()
        .apply_yaml(&format!(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {{name: web, namespace: default}}\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      nodeName: {}\n      terminationGracePeriodSeconds: 1\n      containers: [{{name: web, image: nginx}}]\n",
            w.node
        ))
        .unwrap();
    let first = w.node.clone();
    w.server
        .wait_for(
            "10 nodes Ready, web running",
            Duration::from_secs(10),
            |store| {
                let ready = store
                    .list::<Node>()
                    .iter()
                    .filter(|n| {
                        n.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    })
                    .count();
                ready == 10
                    && store.list::<Pod>().iter().any(|p| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(first.as_str())
                            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
            },
        )
        .await
        .unwrap();
    let mut topic = w.aws.sns().subscribe(&w.topic).unwrap();
    // Two kubelets die, the first one first (it is repaired first). Condition times have
    // whole seconds: more than a second apart, or the two would tie and the node name decide.
    w.server.kill_kubelet(&nodes[0].1).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    w.server.kill_kubelet(&nodes[1].1).unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let repair = w.function(Target::NodeRepair);
    let answer = repair.response_to(&scheduled_event()).await;
    assert_eq!(
        report_of(&answer, &nodes[0].1)["outcome"],
        "Repair",
        "{answer}"
    );
    assert_eq!(
        report_of(&answer, &nodes[1].1)["outcome"],
        "Queued",
        "{answer}"
    );
    assert_eq!(w.aws.requests_for("SetInstanceHealth").len(), 1);

    // Auto Scaling terminates the first through the terminating hook, which starts draining
    // its node and waits for the pod its dead kubelet never lets go.
    let terminating = loop {
        let event = topic.next_event(Duration::from_secs(5)).await.unwrap();
        if event.to_string().contains("EC2_INSTANCE_TERMINATING") {
            break event;
        }
    };
    let hook = w.function(Target::TerminatingHook);
    let drain = hook.response_to(&terminating);
    tokio::pin!(drain);
    let first = nodes[0].1.clone();
    let checkpointed = w.server.wait_for(
        "our drain's checkpoint on the first node",
        Duration::from_secs(20),
        |store| {
            store.find::<Node>("", &first).is_some_and(|n| {
                n.metadata.annotations.is_some_and(|a| {
                    a.contains_key(node_manager::node_marks::checkpoint::CHECKPOINT_ANNOTATION)
                })
            })
        },
    );
    tokio::select! {
        answer = &mut drain => panic!("the drain ended before it was seen: {answer}"),
        seen = checkpointed => seen.unwrap(),
    }
    assert_eq!(
        w.aws
            .autoscaling()
            .instance_state(GROUP, &nodes[0].0)
            .as_deref(),
        Some("Terminating:Wait")
    );

    // While it drains: the group's one repair is in flight, the second node waits.
    let event = scheduled_event();
    let run = repair.response_to(&event);
    let answer = tokio::select! {
        answer = &mut drain => panic!("the drain ended during the repair run: {answer}"),
        answer = run => answer,
    };
    let report = report_of(&answer, &nodes[0].1);
    assert_eq!(report["outcome"], "RepairInFlight", "{answer}");
    assert!(
        report["why"]
            .as_str()
            .unwrap()
            .contains("our drain is working on its node"),
        "{answer}"
    );
    assert_eq!(
        report_of(&answer, &nodes[1].1)["outcome"],
        "Queued",
        "{answer}"
    );
    assert_eq!(answer["groups"][0]["inFlight"], 1, "{answer}");
    assert_eq!(answer["groups"][0]["unhealthy"], 2, "{answer}");
    assert_eq!(w.aws.requests_for("SetInstanceHealth").len(), 1, "{answer}");
}

/// Issue #45 item 3, with the built binaries: a node's kubelet goes silent and EC2's status
/// checks show its instance impaired. Node repair reboots it, and first puts Kubernetes'
/// out-of-service taint on it: the pod garbage collector deletes its database pod, which
/// nothing else would (the kubelet is gone), the attach/detach controller detaches the pod's
/// volume at once instead of after its six-minute unmount wait, and the StatefulSet's new
/// pod runs on the other node with its volume. The reboot done, the node is Ready again and
/// the terminating hook's scheduled run lifts exactly the taint it recorded.
#[tokio::test]
async fn a_rebooted_impaired_node_frees_its_stateful_pod_at_once_and_is_untainted_when_back() {
    let w = FunctionWorld::builder()
        .functions(&[Target::NodeRepair, Target::TerminatingHook])
        .env(
            "REPAIR_CONFIG",
            r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 0, "repairAction": "Reboot"}]}"#,
        )
        .log_level("info")
        .start()
        .await;
    add_our_group(&w);
    w.server
        .store()
        .apply_yaml(
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db, namespace: default}\nspec:\n  replicas: 1\n  serviceName: db\n  selector: {matchLabels: {app: db}}\n  template:\n    metadata: {labels: {app: db}}\n    spec:\n      terminationGracePeriodSeconds: 30\n      containers: [{name: db, image: postgres}]\n  volumeClaimTemplates:\n  - metadata: {name: data}\n    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n",
        )
        .unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("db-0 runs with its volume", Duration::from_secs(10), |s| {
            running_on(s, &node) && attached_to(s, &node)
        })
        .await
        .unwrap();
    w.add_room_node();
    w.server.kill_kubelet(&w.node).unwrap();
    w.aws.ec2().set_impaired(&w.instance, true);

    let repair = w.function(Target::NodeRepair);
    let answer = repair.response_to(&scheduled_event()).await;
    let repaired = std::time::Instant::now();
    let report = report_of(&answer, &w.node);
    assert_eq!(report["verdict"]["action"], "Reboot", "{answer}");
    assert_eq!(report["acted"], true, "{answer}");
    assert_eq!(w.aws.ec2().reboots(), vec![w.instance.clone()]);
    let tainted = w.server.store().find::<Node>("", &w.node).unwrap();
    let record = ShutdownRecord::of(&tainted).expect("node repair's taint record");
    assert_eq!(record.by, "node-repair");
    assert!(record.why.contains("impaired"), "{record:?}");
    assert_eq!(
        tainted.metadata.labels.as_ref().unwrap()["open-node-manager.io/marked"],
        "true"
    );

    // Freed at once: the replacement runs on the room node with the volume, long before the
    // attach/detach controller's unmount wait (six minutes, 3.6 s at this scale) would end.
    w.server
        .wait_for(
            "db-0 runs on the room node with its volume",
            Duration::from_secs(10),
            |s| running_on(s, ROOM_NODE) && attached_to(s, ROOM_NODE) && !attached_to(s, &node),
        )
        .await
        .unwrap();
    let freed_after = repaired.elapsed();
    assert!(freed_after < Duration::from_secs(3), "{freed_after:?}");

    expect_lifted_once_ready(&w).await;
}

/// A pod (not being deleted) runs on `node`.
fn running_on(store: &Store, node: &str) -> bool {
    store.list::<Pod>().iter().any(|p| {
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            && p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
}

/// A volume is attached to `node`.
fn attached_to(store: &Store, node: &str) -> bool {
    store
        .list::<k8s_openapi::api::storage::v1::VolumeAttachment>()
        .iter()
        .any(|a| a.spec.node_name == node)
}

/// A sweep while the kubelet is still silent leaves node repair's taint; once the reboot is
/// done and the node Ready, the next lifts it with its record and the marked label.
async fn expect_lifted_once_ready(w: &FunctionWorld) {
    let node = w.node.clone();
    let sweep = w.function(Target::TerminatingHook);
    sweep.response_to(&fixtures::schedule_tick()).await;
    let still = w.server.store().find::<Node>("", &w.node).unwrap();
    assert!(ShutdownRecord::of(&still).is_some());
    w.aws.ec2().set_impaired(&w.instance, false);
    w.server.revive_kubelet(&w.node);
    w.server
        .wait_for("the node Ready again", Duration::from_secs(5), |s| {
            s.find::<Node>("", &node)
                .is_some_and(|n| node_manager::lifecycle::node::is_ready(&n))
        })
        .await
        .unwrap();
    let answer = sweep.response_to(&fixtures::schedule_tick()).await;
    assert!(
        answer.to_string().contains("OutOfServiceTaintLifted"),
        "{answer}"
    );
    let back = w.server.store().find::<Node>("", &w.node).unwrap();
    let taints = back.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        !taints
            .iter()
            .any(|t| t.key == "node.kubernetes.io/out-of-service"),
        "{taints:?}"
    );
    let annotations = back.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key("open-node-manager.io/out-of-service"));
    let labels = back.metadata.labels.unwrap_or_default();
    assert!(
        !labels.contains_key("open-node-manager.io/marked"),
        "{labels:?}"
    );
}
