//! The built `terminating-hook` binary answering instance notices where AWS's and EKS's own
//! semantics decide: an event from another region or about a managed node group changes
//! nothing; a Spot interruption moves a `karpenter.sh/do-not-disrupt` pod like any other (a
//! rebalance drain, voluntary, still holds it); a
//! Health event is acted on at its own EC2 event's time, and a node drained for a reboot
//! comes back into service once the reboot is over, a cordon somebody else made staying.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing it.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::drain::plan::DO_NOT_DISRUPT_ANNOTATION;
use node_manager_testkit::aws::{
    FakeAutoScalingGroup, FakeInstance, ScheduledEventCode, SpotInterruptionAction,
};
use node_manager_testkit::e2e::{CLUSTER, FunctionWorld, Target};
use node_manager_testkit::fixtures;
use serde_json::Value;

const INSTANCE: &str = "i-0d1e2f3a4b5c6d7e8";
const LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

async fn world() -> FunctionWorld {
    let w = world_with(&[]).await;
    fixtures::create_eks_system_workloads(w.server.store()).unwrap();
    w
}

/// The terminating hook on a Spot [`INSTANCE`], with scaled-down timings and `env` on top.
async fn world_with(env: &[(&str, &str)]) -> FunctionWorld {
    let mut builder = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .spot()
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("DRAIN_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .env("DRAIN_LEASE_SECONDS", "2");
    for (key, value) in env {
        builder = builder.env(key, value);
    }
    builder.start().await
}

/// EC2 schedules `code` for [`INSTANCE`] from `in_seconds` from now, for an hour; AWS
/// Health's event announcing it.
fn schedule(w: &FunctionWorld, code: ScheduledEventCode, in_seconds: u64) -> Value {
    w.aws
        .interruptions()
        .schedule_maintenance(
            INSTANCE,
            code,
            at(Duration::from_secs(in_seconds)),
            at(Duration::from_secs(in_seconds + 3600)),
        )
        .unwrap()
}

fn node(w: &FunctionWorld, name: &str) -> Node {
    w.server.store().get::<Node>("", name).unwrap()
}

fn is_cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref()?.get(key).cloned()
}

/// Requests the terminating hook's identity made that change something.
fn writes(w: &FunctionWorld) -> usize {
    w.server
        .audit()
        .filter(|e| e.user.username == "terminating-hook" && e.verb != "get" && e.verb != "list")
        .len()
}

fn evictions_of(w: &FunctionWorld, pod: &str) -> Vec<Option<i64>> {
    w.server
        .audit()
        .subresource_requests("pods", "eviction")
        .iter()
        .filter(|e| e.name() == pod)
        .map(|e| {
            e.request_object
                .as_ref()
                .and_then(|b| b["deleteOptions"]["gracePeriodSeconds"].as_i64())
        })
        .collect()
}

fn spot_warning(w: &FunctionWorld, instance: &str) -> Value {
    w.aws
        .interruptions()
        .spot_interruption(instance, SpotInterruptionAction::Terminate)
        .unwrap()
}

#[tokio::test]
async fn an_event_from_another_region_changes_nothing() {
    let w = world().await;
    let lambda = w.function(Target::TerminatingHook);
    let mut warning = spot_warning(&w, INSTANCE);
    warning["region"] = "us-east-1".into();
    let answer = lambda.response_to(&warning).await;
    assert_eq!(answer["instances"][0]["outcome"], "Foreign", "{answer}");
    let detail = answer["instances"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("region us-east-1"), "{detail}");
    assert!(!is_cordoned(&node(&w, &w.node)));
    assert_eq!(writes(&w), 0);
    // EC2 and Auto Scaling are not even asked.
    assert!(w.aws.requests_for("DescribeInstances").is_empty());
}

#[tokio::test]
async fn managed_node_groups_are_left_to_eks() {
    let w = world().await;
    let lambda = w.function(Target::TerminatingHook);
    // An instance of a managed node group's Auto Scaling group (EKS tags it
    // eks:nodegroup-name), of this cluster.
    let managed_group = "eks-managed-ng-12c1ba5d";
    let managed = "i-0a0a0a0a0a0a0a0a1";
    w.aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(managed_group)
            .tag("eks:cluster-name", CLUSTER)
            .tag("eks:nodegroup-name", "managed-ng")
            .availability_zones(&["eu-west-1a"]),
    );
    let instance = FakeInstance::new(managed, "eu-west-1")
        .availability_zone("eu-west-1a")
        .spot();
    let managed_node = instance.private_dns_name.clone();
    w.aws.ec2().add_instance(instance);
    w.aws
        .autoscaling()
        .add_instance(managed_group, managed, "eu-west-1a")
        .unwrap();
    w.server
        .register_node(
            &managed_node,
            &format!("aws:///eu-west-1a/{managed}"),
            Some(Duration::ZERO),
        )
        .unwrap();
    let answer = lambda.response_to(&spot_warning(&w, managed)).await;
    assert_eq!(
        answer["instances"][0]["outcome"], "ManagedNodeGroup",
        "{answer}"
    );
    assert!(
        answer["instances"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("managed-ng")
    );

    // A node EKS labels as a managed node group's, whatever its group's tags say.
    w.server
        .store()
        .modify::<Node>("", &w.node, |node| {
            node.metadata
                .labels
                .get_or_insert_default()
                .insert("eks.amazonaws.com/nodegroup".into(), "managed-ng".into());
        })
        .unwrap();
    let answer = lambda.response_to(&spot_warning(&w, INSTANCE)).await;
    assert_eq!(
        answer["instances"][0]["outcome"], "ManagedNodeGroup",
        "{answer}"
    );
    assert!(!is_cordoned(&node(&w, &w.node)));
    assert!(!is_cordoned(&node(&w, &managed_node)));
    assert_eq!(writes(&w), 0);
}

fn create_do_not_disrupt_pod(w: &FunctionWorld) {
    let mut pod = fixtures::running_pod("default", "batch-0", &w.node, &[("app", "batch")]);
    pod.metadata.annotations =
        Some([(DO_NOT_DISRUPT_ANNOTATION.to_owned(), "true".to_owned())].into());
    if let Some(spec) = pod.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(300);
    }
    w.server.store().create(&pod).unwrap();
}

#[tokio::test]
async fn a_rebalance_drain_still_holds_a_do_not_disrupt_pod() {
    let w = world_with(&[
        ("REBALANCE_ACTION", "drain"),
        ("DRAIN_TIMEOUT_SECONDS", "3"),
    ])
    .await;
    create_do_not_disrupt_pod(&w);
    let rebalance = w
        .aws
        .interruptions()
        .rebalance_recommendation(INSTANCE)
        .unwrap();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&rebalance)
        .await;
    assert_eq!(answer["instances"][0]["outcome"], "PodsLeft", "{answer}");
    assert!(evictions_of(&w, "batch-0").is_empty());
}

#[tokio::test]
async fn a_spot_interruption_evicts_a_do_not_disrupt_pod_with_its_grace_cut() {
    let w = world().await;
    let lambda = w.function(Target::TerminatingHook);
    create_do_not_disrupt_pod(&w);
    let answer = lambda.response_to(&spot_warning(&w, INSTANCE)).await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    let sent = evictions_of(&w, "batch-0");
    assert_eq!(sent.len(), 1, "{sent:?}");
    let grace = sent[0].unwrap_or_default();
    assert!((1..=115).contains(&grace), "grace {grace}");
    assert!(
        w.server
            .store()
            .find::<Pod>("default", "batch-0")
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    );
}

fn at(from_now: Duration) -> jiff::Timestamp {
    let now = jiff::Timestamp::now().as_second();
    jiff::Timestamp::from_second(now + i64::try_from(from_now.as_secs()).unwrap()).unwrap()
}

#[tokio::test]
async fn a_health_event_is_acted_on_at_its_own_ec2_events_time() {
    let w = world().await;
    let lambda = w.function(Target::TerminatingHook);
    let interruptions = w.aws.interruptions();
    // A reboot in 30 minutes (within the default one-hour margin) and a retirement in two
    // weeks: the retirement's Health event plans the retirement, it does not drain now.
    let soon = at(Duration::from_secs(1800));
    interruptions
        .schedule_maintenance(
            INSTANCE,
            ScheduledEventCode::InstanceReboot,
            soon,
            at(Duration::from_secs(3600)),
        )
        .unwrap();
    let retirement_at = at(Duration::from_secs(14 * 86_400));
    let retirement = interruptions
        .schedule_maintenance(
            INSTANCE,
            ScheduledEventCode::InstanceRetirement,
            retirement_at,
            at(Duration::from_secs(14 * 86_400 + 3600)),
        )
        .unwrap();
    let answer = lambda.response_to(&retirement).await;
    assert_eq!(
        answer["instances"][0]["outcome"], "MaintenancePlanned",
        "{answer}"
    );
    let planned = node(&w, &w.node);
    assert!(!is_cordoned(&planned));
    let record: Value = serde_json::from_str(
        &planned.metadata.annotations.unwrap()["open-node-manager.io/maintenance"],
    )
    .unwrap();
    assert_eq!(record["startsAt"], retirement_at.to_string());
    assert_eq!(record["typeCode"], "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED");
}

/// Drains the node for a system reboot starting within the margin, then carries the reboot
/// out: the Health event's answer once it is closed.
async fn drained_then_rebooted(w: &FunctionWorld) -> Value {
    let lambda = w.function(Target::TerminatingHook);
    let interruptions = w.aws.interruptions();
    let scheduled = schedule(w, ScheduledEventCode::SystemReboot, 600);
    let answer = lambda.response_to(&scheduled).await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    assert!(is_cordoned(&node(w, &w.node)));
    let closed = interruptions
        .complete_maintenance(INSTANCE, ScheduledEventCode::SystemReboot)
        .unwrap();
    lambda.response_to(&closed).await
}

#[tokio::test]
async fn after_a_completed_reboot_our_cordon_is_undone() {
    let w = world().await;
    let answer = drained_then_rebooted(&w).await;
    assert_eq!(
        answer["instances"][0]["outcome"], "RestoredAfterMaintenance",
        "{answer}"
    );
    let back = node(&w, &w.node);
    assert!(!is_cordoned(&back));
    assert_eq!(label(&back, LB_LABEL), None);
    assert!(
        !back
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("open-node-manager.io/drain")
    );
}

#[tokio::test]
async fn after_a_completed_reboot_a_cordon_somebody_else_made_stays() {
    let w = world().await;
    w.server
        .store()
        .modify::<Node>("", &w.node, |node| {
            node.spec.get_or_insert_default().unschedulable = Some(true);
        })
        .unwrap();
    let answer = drained_then_rebooted(&w).await;
    assert_eq!(
        answer["instances"][0]["outcome"], "RestoredAfterMaintenance",
        "{answer}"
    );
    let back = node(&w, &w.node);
    assert!(is_cordoned(&back), "the operator's cordon stays");
    assert_eq!(label(&back, LB_LABEL), None, "our label is undone");
}

/// The sweep's outcomes, by name.
async fn sweep(w: &FunctionWorld) -> Vec<String> {
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&fixtures::schedule_tick())
        .await;
    answer["instances"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter_map(|o| o["outcome"].as_str().map(str::to_owned))
        .collect()
}

// Issue #43 item 2: AWS documents that a rebalance recommendation may never be followed by
// an interruption. A rebalance drain used to stand for good: the node stayed cordoned and
// out of load balancers while its instance ran on, billed and unused.
#[tokio::test]
async fn a_rebalance_drain_no_interruption_followed_is_undone_by_the_sweep() {
    let w = world_with(&[
        ("REBALANCE_ACTION", "drain"),
        ("REBALANCE_UNDO_SECONDS", "3"),
    ])
    .await;
    let rebalance = w
        .aws
        .interruptions()
        .rebalance_recommendation(INSTANCE)
        .unwrap();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&rebalance)
        .await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    let drained_at = std::time::Instant::now();
    assert!(is_cordoned(&node(&w, &w.node)));

    let early = sweep(&w).await;
    assert!(
        !early.contains(&"RebalanceDrainUndone".to_owned()),
        "{early:?}"
    );
    assert!(
        is_cordoned(&node(&w, &w.node)),
        "within REBALANCE_UNDO_SECONDS"
    );

    tokio::time::sleep(Duration::from_secs(3).saturating_sub(drained_at.elapsed())).await;
    let late = sweep(&w).await;
    assert!(
        late.contains(&"RebalanceDrainUndone".to_owned()),
        "{late:?}"
    );
    let back = node(&w, &w.node);
    assert!(!is_cordoned(&back));
    assert_eq!(label(&back, LB_LABEL), None);
}

// Issue #43 item 3 (a): the reboot is done (EC2 lists it `[Completed]`), its Health
// `closed` event is lost, and another reboot is pending ten days later: the node used to stay
// cordoned until that one completed too (any pending event kept the drain).
#[tokio::test]
async fn after_a_completed_reboot_an_unrelated_pending_event_keeps_no_cordon() {
    let w = world().await;
    let lambda = w.function(Target::TerminatingHook);
    let interruptions = w.aws.interruptions();
    let reboot = schedule(&w, ScheduledEventCode::InstanceReboot, 600);
    let answer = lambda.response_to(&reboot).await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    let _lost = interruptions
        .complete_maintenance(INSTANCE, ScheduledEventCode::InstanceReboot)
        .unwrap();
    let ten_days = Duration::from_secs(10 * 86_400);
    interruptions
        .schedule_maintenance(
            INSTANCE,
            ScheduledEventCode::InstanceReboot,
            at(ten_days),
            at(ten_days * 2),
        )
        .unwrap();
    let outcomes = sweep(&w).await;
    assert!(
        outcomes.contains(&"RestoredAfterMaintenance".to_owned()),
        "{outcomes:?}"
    );
    assert!(!is_cordoned(&node(&w, &w.node)));
    // The later reboot is planned by the next sweep, not drained now.
    let outcomes = sweep(&w).await;
    assert!(
        outcomes.contains(&"MaintenancePlanned".to_owned()),
        "{outcomes:?}"
    );
    assert!(!is_cordoned(&node(&w, &w.node)));
}

// Issue #43 item 3 (b): a node drained for a pending retirement used to be put back in
// service by the Health `closed` event of another, completed event, and drained again by
// the sweep: its pods moved twice.
#[tokio::test]
async fn another_events_end_does_not_put_a_node_drained_for_a_retirement_back() {
    let w = world().await;
    let lambda = w.function(Target::TerminatingHook);
    let interruptions = w.aws.interruptions();
    let retirement = schedule(&w, ScheduledEventCode::InstanceRetirement, 600);
    let answer = lambda.response_to(&retirement).await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    schedule(&w, ScheduledEventCode::SystemReboot, 300);
    let closed = interruptions
        .complete_maintenance(INSTANCE, ScheduledEventCode::SystemReboot)
        .unwrap();
    let answer = lambda.response_to(&closed).await;
    assert_eq!(
        answer["instances"][0]["outcome"], "NothingToRestore",
        "{answer}"
    );
    assert!(
        is_cordoned(&node(&w, &w.node)),
        "the retirement still comes"
    );
    let outcomes = sweep(&w).await;
    assert!(
        !outcomes
            .iter()
            .any(|o| o.contains("Undone") || o.contains("Restored")),
        "{outcomes:?}"
    );
    assert!(is_cordoned(&node(&w, &w.node)));
}

// Issue #43 item 4: AWS Health announces an EBS-backed instance's retirement with
// AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED (and power maintenance, expedited
// retirements with their own codes). Outside the old closed list the event was answered
// "EC2 lists no pending scheduled event", and the instance stopped with its pods on it.
#[tokio::test]
async fn every_documented_health_type_code_is_matched_to_ec2s_schedule() {
    for type_code in [
        "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED",
        "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_EXPEDITED",
        "AWS_EC2_INSTANCE_RETIREMENT_EXPEDITED",
    ] {
        let w = world().await;
        let mut event = schedule(&w, ScheduledEventCode::InstanceRetirement, 600);
        event["detail"]["eventTypeCode"] = type_code.into();
        let answer = w
            .function(Target::TerminatingHook)
            .response_to(&event)
            .await;
        assert_eq!(
            answer["instances"][0]["outcome"], "Drained",
            "{type_code}: {answer}"
        );
        assert!(is_cordoned(&node(&w, &w.node)), "{type_code}");
    }
}

// Issue #43 item 6: network maintenance neither stops nor reboots the instance: its drain is
// voluntary, and a `karpenter.sh/do-not-disrupt` pod stays (it used to be evicted).
#[tokio::test]
async fn network_maintenance_leaves_a_do_not_disrupt_pod_in_place() {
    let w = world_with(&[("DRAIN_TIMEOUT_SECONDS", "3")]).await;
    create_do_not_disrupt_pod(&w);
    let network = schedule(&w, ScheduledEventCode::SystemMaintenance, 600);
    assert_eq!(
        network["detail"]["eventTypeCode"],
        "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED"
    );
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&network)
        .await;
    assert_eq!(answer["instances"][0]["outcome"], "PodsLeft", "{answer}");
    assert!(evictions_of(&w, "batch-0").is_empty());

    // Power maintenance reboots the instance: the same pod is evicted.
    let w = world().await;
    create_do_not_disrupt_pod(&w);
    let mut power = schedule(&w, ScheduledEventCode::SystemMaintenance, 600);
    power["detail"]["eventTypeCode"] = "AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED".into();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&power)
        .await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    assert_eq!(evictions_of(&w, "batch-0").len(), 1);
}
