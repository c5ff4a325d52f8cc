//! The built `terminating-hook` binary answering instance notices through the local Lambda
//! Runtime API, against the fake EC2 (Spot requests, scheduled events, the instance's group
//! tag), Auto Scaling and SNS that the unmodified SDK clients talk to, and the fake API
//! server with the shipped RBAC: a Spot interruption with a terminating hook drains once and
//! completes the action; a warning whose lifecycle drain lost its invocation drains in its
//! stead; scheduled maintenance is planned; other clusters' instances are left.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing it.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, DrainCheckpoint};
use node_manager_testkit::aws::{FakeInstance, ScheduledEventCode, SpotInterruptionAction};
use node_manager_testkit::e2e::{FunctionWorld, RunningFunction, Target};
use node_manager_testkit::fixtures::{self, Workload};
use node_manager_testkit::lambda_api::InvocationOutcome;
use serde_json::{Value, json};

const INSTANCE: &str = "i-0b1c2d3e4f5061728";

async fn spot_world() -> FunctionWorld {
    let w = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .spot()
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("DRAIN_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .env("DRAIN_LEASE_SECONDS", "2")
        .start()
        .await;
    let store = w.server.store();
    fixtures::create_eks_system_workloads(store).unwrap();
    let nginx = Workload::new("default", "nginx")
        .replicas(4)
        .container("nginx", "nginx")
        .grace_period_seconds(Some(300));
    store.create(&nginx.deployment()).unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("the pods run", Duration::from_secs(10), |store| {
            fixtures::running_on(store, &node, "") == 7
        })
        .await
        .unwrap();
    w.add_room_node();
    w
}

/// Every eviction the function sent, by pod: how many, and the grace periods asked for.
fn evictions(w: &FunctionWorld) -> BTreeMap<String, Vec<Option<i64>>> {
    let mut by_pod: BTreeMap<String, Vec<Option<i64>>> = BTreeMap::new();
    for e in w.server.audit().subresource_requests("pods", "eviction") {
        let grace = e
            .request_object
            .as_ref()
            .and_then(|b| b["deleteOptions"]["gracePeriodSeconds"].as_i64());
        by_pod.entry(e.name().to_owned()).or_default().push(grace);
    }
    by_pod
}

fn is_cordoned(w: &FunctionWorld) -> bool {
    let node = w.server.store().get::<Node>("", &w.node).unwrap();
    node.spec.and_then(|s| s.unschedulable) == Some(true)
}

#[tokio::test]
async fn a_spot_interruption_of_a_hooked_group_drains_once_and_completes_the_action() {
    let w = spot_world().await;
    let lambda = w.function(Target::TerminatingHook);
    let mut topic = w.aws.sns().subscribe(&w.topic).unwrap();
    let interruption = w
        .aws
        .interruptions()
        .spot_interruption_carried_out(
            INSTANCE,
            SpotInterruptionAction::Terminate,
            Duration::from_secs(120),
        )
        .unwrap();
    let notification = topic.next_event(Duration::from_secs(5)).await.unwrap();

    // The warning first: drained within its two minutes, the 300 s grace periods cut.
    let answer = lambda.response_to(&interruption.warning).await;
    assert_eq!(answer["event"], "SpotInterruptionWarning", "{answer}");
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    assert!(is_cordoned(&w));
    let sent = evictions(&w);
    assert_eq!(sent.len(), 5, "{sent:?}");
    for (pod, graces) in &sent {
        assert_eq!(graces.len(), 1, "{pod} evicted more than once: {graces:?}");
        let grace = graces[0].unwrap_or_default();
        assert!((1..=115).contains(&grace), "{pod}: {grace}");
    }
    assert_eq!(
        w.aws.requests_for("DescribeSpotInstanceRequests").len(),
        1,
        "the warning was confirmed with EC2"
    );

    // Then the hook's notification: the drain is taken over, not run again, and completed.
    let answer = lambda.response_to(&notification).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(evictions(&w), sent, "no pod evicted twice");
}

#[tokio::test]
async fn scheduled_maintenance_is_planned_on_the_node_and_other_clusters_instances_are_left() {
    let w = spot_world().await;
    let lambda = w.function(Target::TerminatingHook);
    let now = jiff::Timestamp::now();
    let starts_at = jiff::Timestamp::from_second(now.as_second() + 14 * 86_400).unwrap();
    let event = w
        .aws
        .interruptions()
        .schedule_maintenance(
            INSTANCE,
            ScheduledEventCode::InstanceRetirement,
            starts_at,
            jiff::Timestamp::from_second(starts_at.as_second() + 3600).unwrap(),
        )
        .unwrap();
    let answer = lambda.response_to(&event).await;
    assert_eq!(
        answer["instances"][0]["outcome"], "MaintenancePlanned",
        "{answer}"
    );
    let node = w.server.store().get::<Node>("", &w.node).unwrap();
    assert_eq!(
        node.metadata.labels.unwrap()["open-node-manager.io/maintenance"],
        "planned"
    );
    let plan: Value = serde_json::from_str(
        &node.metadata.annotations.unwrap()["open-node-manager.io/maintenance"],
    )
    .unwrap();
    assert_eq!(
        plan["startsAt"],
        json!(starts_at.to_string()),
        "EC2's start, read back"
    );
    assert!(!is_cordoned(&w));

    // A Spot instance of no group (Karpenter's): left alone, nothing written.
    w.aws.ec2().add_instance(
        FakeInstance::new("i-0c0c0c0c0c0c0c0c0", "eu-west-1")
            .availability_zone("eu-west-1a")
            .spot(),
    );
    let patches_before = w.server.audit().filter(|e| e.verb == "patch").len();
    let rebalance = w
        .aws
        .interruptions()
        .rebalance_recommendation("i-0c0c0c0c0c0c0c0c0")
        .unwrap();
    let answer = lambda.response_to(&rebalance).await;
    assert_eq!(answer["instances"][0]["outcome"], "Foreign", "{answer}");
    assert_eq!(
        w.server.audit().filter(|e| e.verb == "patch").len(),
        patches_before
    );

    // A forged warning for the seeded instance, its Spot request not marked: refused.
    let forged = json!({
        "version": "0", "id": "f-1", "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2", "account": w.aws.account().account_id, "time": now.to_string(),
        "region": "eu-west-1", "resources": [],
        "detail": {"instance-id": INSTANCE, "instance-action": "terminate"},
    });
    let (kind, message) = lambda.error_from(&forged).await;
    assert_eq!(kind, "InstanceEventUnconfirmed", "{message}");
    assert!(!is_cordoned(&w));
}

/// Pods of the workload still on the node and not terminating.
fn workload_pods_left(w: &FunctionWorld) -> usize {
    w.server
        .store()
        .list::<Pod>()
        .iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(w.node.as_str())
                && p.metadata.deletion_timestamp.is_none()
                && p.metadata.namespace.as_deref() == Some("default")
        })
        .count()
}

#[tokio::test]
async fn a_spot_warning_runs_the_drain_of_a_crashed_lifecycle_invocation_and_its_retry_completes_it()
 {
    let w = spot_world().await;
    let RunningFunction { runtime, .. } = w.function(Target::TerminatingHook);
    let mut topic = w.aws.sns().subscribe(&w.topic).unwrap();
    let interruption = w
        .aws
        .interruptions()
        .spot_interruption_carried_out(
            INSTANCE,
            SpotInterruptionAction::Terminate,
            Duration::from_secs(120),
        )
        .unwrap();
    let notification = topic.next_event(Duration::from_secs(5)).await.unwrap();

    // The hook's invocation crashes as soon as it has taken the drain: its lease (2 s) is on
    // the node and Lambda's retry is minutes away.
    let crashed = async {
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while checkpoint_on_node(&w).is_none() {
            assert!(
                tokio::time::Instant::now() < until,
                "the drain was never taken"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        runtime.kill().await
    };
    let (_, _) = tokio::join!(
        runtime.invoke(&notification, Duration::from_secs(30)),
        crashed
    );
    assert!(w.aws.autoscaling().completions().is_empty());

    // The warning, inside the dead lease: it waits the lease out and drains in its stead.
    let started = tokio::time::Instant::now();
    let answer = match runtime
        .invoke(&interruption.warning, Duration::from_secs(60))
        .await
    {
        Ok(InvocationOutcome::Response(answer)) => answer,
        other => panic!("{other:?}\n{}", runtime.output()),
    };
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(115),
        "within the warning's time"
    );
    assert_eq!(workload_pods_left(&w), 0, "the node is empty");
    let record = checkpoint_on_node(&w).unwrap();
    assert!(
        !record.action.is_notice(),
        "the record stays the action's: {record:?}"
    );
    assert_eq!(record.completed_at, None);
    assert_eq!(record.lease.holder, None, "the stand-in let go");
    assert!(
        w.aws.autoscaling().completions().is_empty(),
        "a notice completes no lifecycle action"
    );

    // Lambda's retry of the hook's invocation: it takes the drain over and completes it, with
    // no pod evicted again.
    let sent = evictions(&w);
    let answer = match runtime.invoke(&notification, Duration::from_secs(30)).await {
        Ok(InvocationOutcome::Response(answer)) => answer,
        other => panic!("{other:?}\n{}", runtime.output()),
    };
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result.as_str(), "CONTINUE");
    assert_eq!(evictions(&w), sent, "no pod evicted again");
}

fn checkpoint_on_node(w: &FunctionWorld) -> Option<DrainCheckpoint> {
    let node = w.server.store().get::<Node>("", &w.node).ok()?;
    let annotations = node.metadata.annotations?;
    DrainCheckpoint::parse(annotations.get(CHECKPOINT_ANNOTATION)?).ok()
}
