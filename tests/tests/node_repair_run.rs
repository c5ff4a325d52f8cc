//! Node repair in process, against the fake API server (real `kube::Client`, the shipped
//! RBAC's node-repair group) and the in-memory AWS fakes: which nodes are considered, the
//! safety stop with its Events, the parallel limit, reboot then replace across runs.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use node_manager::aws::InstanceCondition;
use node_manager::aws::in_memory::InMemoryInstanceHealth;
use node_manager::node_marks::shutdown::{OUT_OF_SERVICE_TAINT_KEY, ShutdownRecord};
use node_manager::node_repair::memory::{REPAIR_ANNOTATION, RepairRecord};
use node_manager::node_repair::policy::RepairAction;
use node_manager::node_repair::report::RepairReport;
use node_manager::node_repair::run::{self, RepairContext};
use node_manager::node_repair::settings::RepairSettings;
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use node_manager_testkit::soak::corpus;
use serde_json::Value;

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-ours";

fn node_name(i: usize) -> String {
    format!("ip-10-0-0-{i}.eu-west-1.compute.internal")
}

fn instance(i: usize) -> String {
    format!("i-{i:017x}")
}

struct World {
    server: FakeApiServer,
    health: InMemoryInstanceHealth,
    client: kube::Client,
}

impl World {
    /// `nodes` Ready nodes `0..nodes`, all in [`GROUP`] (tagged for the cluster, no grace).
    async fn start(nodes: usize) -> Self {
        let server = FakeApiServer::builder()
            .cluster_name(CLUSTER)
            .simulation(SimulationTimings {
                node_ready_after: Duration::ZERO,
                ..SimulationTimings::default()
            })
            .start()
            .await
            .unwrap();
        server
            .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
            .unwrap();
        let health = InMemoryInstanceHealth::new();
        health.add_group(GROUP, &[("eks:cluster-name", CLUSTER)], Duration::ZERO);
        for i in 0..nodes {
            server
                .register_node(
                    &node_name(i),
                    &format!("aws:///eu-west-1a/{}", instance(i)),
                    Some(Duration::ZERO),
                )
                .unwrap();
            health.add_instance(GROUP, &instance(i));
        }
        server
            .wait_for("nodes Ready", Duration::from_secs(10), |s| {
                let all = s.list::<Node>();
                all.len() == nodes
                    && all
                        .iter()
                        .all(|n| condition(n, "Ready") == Some("True".into()))
            })
            .await
            .unwrap();
        let token = server.add_static_token("node-repair", &["open-node-manager:node-repair"]);
        let mut config = server.config_with_token(&token).await.unwrap();
        config.default_retry = false;
        let client = kube::Client::try_from(config).unwrap();
        Self {
            server,
            health,
            client,
        }
    }

    fn context(
        &self,
        env: &[(&str, &str)],
    ) -> RepairContext<kube::Client, InMemoryInstanceHealth, InMemoryInstanceHealth> {
        let mut all: Vec<(&str, &str)> = vec![("CLUSTER_NAME", CLUSTER)];
        all.extend_from_slice(env);
        RepairContext {
            kube: self.client.clone(),
            health: self.health.clone(),
            ec2: self.health.clone(),
            settings: RepairSettings::from_source(all.as_slice()).unwrap(),
        }
    }

    /// Sets condition `type_` of node `i`, broken since `ago`.
    fn set_condition(&self, i: usize, type_: &str, status: &str, reason: &str, ago: Duration) {
        let since = Timestamp::now() - ago;
        self.server
            .store()
            .modify::<Node>("", &node_name(i), |node| {
                let conditions = node
                    .status
                    .get_or_insert_default()
                    .conditions
                    .get_or_insert_default();
                conditions.retain(|c| c.type_ != type_);
                conditions.push(NodeCondition {
                    type_: type_.into(),
                    status: status.into(),
                    reason: Some(reason.into()),
                    last_transition_time: Some(Time(since)),
                    ..NodeCondition::default()
                });
            })
            .unwrap();
    }

    fn label(&self, i: usize, key: &str, value: &str) {
        self.server
            .store()
            .modify::<Node>("", &node_name(i), |node| {
                node.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(key.into(), value.into());
            })
            .unwrap();
    }

    fn events(&self, reason: &str) -> Vec<Event> {
        self.server.store().events_with_reason(reason)
    }

    fn record(&self, i: usize) -> Option<RepairRecord> {
        let node = self.server.store().find::<Node>("", &node_name(i))?;
        RepairRecord::from_annotation(
            node.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REPAIR_ANNOTATION))
                .map(String::as_str),
        )
    }
}

fn condition(node: &Node, type_: &str) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

fn outcome(report: &RepairReport, i: usize) -> String {
    let name = node_name(i);
    report
        .nodes
        .iter()
        .find(|n| n.node == name)
        .map(|n| n.outcome.clone())
        .unwrap_or_else(|| panic!("{name} not in {report:#?}"))
}

const AN_HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn nodes_outside_our_groups_are_left_alone() {
    let w = World::start(5).await;
    w.health.add_group(
        "eks-theirs",
        &[("eks:cluster-name", "other")],
        Duration::ZERO,
    );
    // 0: ours; 1: managed node group; 2: Karpenter; 3: another cluster's group; 4: no group.
    w.label(1, "eks.amazonaws.com/nodegroup", "managed-ng");
    w.label(2, "karpenter.sh/nodepool", "default");
    w.health.add_instance("eks-theirs", &instance(3));
    let no_group = InMemoryInstanceHealth::new();
    drop(no_group);
    w.health
        .set_instance("eks-gone", &instance(4), "InService", "HEALTHY");
    for i in 0..5 {
        w.set_condition(i, "Ready", "False", "KubeletNotReady", AN_HOUR);
    }
    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "Repair");
    for i in 1..5 {
        assert_eq!(outcome(&report, i), "NotOurs", "{report:#?}");
    }
    let why = |i: usize| {
        report
            .nodes
            .iter()
            .find(|n| n.node == node_name(i))
            .unwrap()
            .why
            .clone()
    };
    assert!(why(1).contains("eks.amazonaws.com/nodegroup"), "{}", why(1));
    assert!(why(2).contains("karpenter.sh/nodepool"), "{}", why(2));
    assert!(why(3).contains("no tag naming this cluster"), "{}", why(3));
    assert!(why(4).contains("not found"), "{}", why(4));
    assert_eq!(w.health.marked_unhealthy(), vec![instance(0)]);
    // The allow-list makes a group ours without tags.
    let report = run::handle(
        &w.context(&[("AUTO_SCALING_GROUP_NAMES", "eks-theirs")]),
        Value::Null,
    )
    .await
    .unwrap();
    assert_eq!(outcome(&report, 3), "Repair");
    assert_eq!(w.health.marked_unhealthy(), vec![instance(0), instance(3)]);
}

#[tokio::test]
async fn more_than_20_percent_unhealthy_pauses_the_group_with_a_warning() {
    let w = World::start(10).await;
    for i in 0..3 {
        w.set_condition(i, "Ready", "Unknown", "NodeStatusUnknown", AN_HOUR);
    }
    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    for i in 0..3 {
        assert_eq!(outcome(&report, i), "Paused", "{report:#?}");
    }
    assert_eq!(report.groups[0].repairs_paused, 3);
    assert!(
        report.groups[0]
            .paused_by
            .as_ref()
            .unwrap()
            .contains("maxUnhealthyNodeThresholdPercentage=20")
    );
    assert!(w.health.marked_unhealthy().is_empty());
    let paused = w.events("NodeRepairPaused");
    assert_eq!(paused.len(), 3, "{paused:#?}");
    assert_eq!(paused[0].type_.as_deref(), Some("Warning"));
    assert!(
        paused[0]
            .note
            .as_deref()
            .unwrap()
            .contains("3 of 10 nodes unhealthy")
    );
    // One recovers: 2 of 10 is not more than 20%; one repair at a time by default.
    w.set_condition(2, "Ready", "True", "KubeletReady", Duration::ZERO);
    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    let repaired: Vec<usize> = (0..2)
        .filter(|i| outcome(&report, *i) == "Repair")
        .collect();
    assert_eq!(repaired.len(), 1, "{report:#?}");
    assert_eq!(w.health.marked_unhealthy().len(), 1);
    assert_eq!(w.events("NodeRepairStarted").len(), 1);
}

#[tokio::test]
async fn in_flight_repairs_count_against_the_parallel_limit() {
    let w = World::start(10).await;
    let env = [(
        "REPAIR_CONFIG",
        r#"{"maxParallelNodesRepairedCount": 2, "maxUnhealthyNodeThresholdCount": 10}"#,
    )];
    // One already terminating, three due.
    w.health
        .set_instance(GROUP, &instance(0), "Terminating:Wait", "UNHEALTHY");
    for i in 0..4 {
        w.set_condition(
            i,
            "Ready",
            "False",
            "KubeletNotReady",
            AN_HOUR + Duration::from_secs(60 * i as u64),
        );
    }
    let report = run::handle(&w.context(&env), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "RepairInFlight");
    // The longest broken of the others (3) gets the one free slot.
    assert_eq!(outcome(&report, 3), "Repair");
    assert_eq!(outcome(&report, 1), "Queued");
    assert_eq!(outcome(&report, 2), "Queued");
    assert_eq!(w.health.marked_unhealthy(), vec![instance(3)]);
    // The next run: two in flight, nothing more.
    let report = run::handle(&w.context(&env), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 3), "RepairInFlight");
    assert_eq!(report.groups[0].in_flight, 2);
    assert_eq!(w.health.marked_unhealthy(), vec![instance(3)]);
}

#[tokio::test]
async fn a_gpu_node_is_rebooted_then_replaced_when_the_reboot_does_not_help() {
    let w = World::start(2).await;
    // Scaled down: 10 minutes -> 0.9 s.
    let env = [(
        "REPAIR_CONFIG",
        r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "AcceleratedHardwareReady", "minRepairWaitTimeMins": 0.015, "repairAction": "Reboot"}]}"#,
    )];
    w.set_condition(
        0,
        "AcceleratedHardwareReady",
        "False",
        "NvidiaXID31Error",
        AN_HOUR,
    );
    // Memory pressure is reported, never acted on.
    w.set_condition(
        1,
        "MemoryPressure",
        "True",
        "KubeletHasInsufficientMemory",
        AN_HOUR,
    );
    let report = run::handle(&w.context(&env), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "Repair");
    assert_eq!(outcome(&report, 1), "NoAction");
    assert_eq!(w.health.rebooted(), vec![instance(0)]);
    let record = w.record(0).unwrap();
    assert_eq!((record.action, record.attempt), (RepairAction::Reboot, 1));
    // Right after: the reboot is given its time.
    let report = run::handle(&w.context(&env), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "Waiting");
    assert_eq!(w.health.rebooted().len(), 1);
    // Still failing after it: replaced.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let report = run::handle(&w.context(&env), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "Repair", "{report:#?}");
    assert_eq!(w.health.rebooted().len(), 1);
    assert_eq!(w.health.marked_unhealthy(), vec![instance(0)]);
    let record = w.record(0).unwrap();
    assert_eq!((record.action, record.attempt), (RepairAction::Replace, 2));
}

#[tokio::test]
async fn a_failed_action_is_forgotten_and_fails_the_run() {
    let w = World::start(1).await;
    w.set_condition(0, "Ready", "False", "KubeletNotReady", AN_HOUR);
    w.health.faults.fail(
        "SetInstanceHealth",
        node_manager::aws::AwsErrorKind::AccessDenied,
        1,
    );
    let error = run::handle(&w.context(&[]), Value::Null).await.unwrap_err();
    assert!(error.to_string().contains("SetInstanceHealth"), "{error}");
    assert_eq!(w.record(0), None);
    // The next run tries again.
    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "Repair");
    assert_eq!(w.health.marked_unhealthy(), vec![instance(0)]);
}

#[tokio::test]
async fn nodes_cordoned_by_our_drain_while_in_service_are_not_repaired() {
    let w = World::start(1).await;
    w.set_condition(0, "Ready", "False", "KubeletNotReady", AN_HOUR);
    w.server
        .store()
        .modify::<Node>("", &node_name(0), |node| {
            node.metadata.annotations.get_or_insert_default().insert(
                node_manager::node_marks::checkpoint::CHECKPOINT_ANNOTATION.into(),
                "{}".into(),
            );
        })
        .unwrap();
    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "Draining");
    // Broken all the same: it counts toward the group's threshold.
    assert_eq!(report.groups[0].unhealthy, 1);
    assert!(w.health.marked_unhealthy().is_empty());
}

#[tokio::test]
async fn a_500_node_cluster_is_read_in_one_page_and_ten_describe_calls() {
    let w = World::start(0).await;
    // Nodes straight into the store (no kubelet emulation needed).
    for i in 0..500 {
        w.server
            .store()
            .apply_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node_name(i)},
                "spec": {"providerID": format!("aws:///eu-west-1a/{}", instance(i))},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
            }))
            .unwrap();
        w.health.add_instance(GROUP, &instance(i));
    }
    let ctx = w.context(&[]);
    let mut runs = Vec::new();
    let mut report = None;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        report = Some(run::handle(&ctx, Value::Null).await.unwrap());
        runs.push(started.elapsed());
    }
    let report = report.unwrap();
    runs.sort();
    let requests: Vec<_> = w
        .server
        .audit()
        .filter(|e| e.user.username == "node-repair")
        .iter()
        .map(|e| e.line())
        .collect();
    // The figure BENCHMARKS.md quotes (run with --nocapture).
    println!(
        "node-repair, 500 nodes: median {:?} (min {:?}, max {:?}) per run over 5 runs; {} node page(s), {} Kubernetes requests per run, DescribeAutoScalingInstances calls per run: {}",
        runs[2],
        runs[0],
        runs[4],
        report.node_pages,
        requests.len() / 5,
        w.health.describe_calls().len() / 5
    );
    assert_eq!(report.node_pages, 1);
    assert_eq!(report.nodes.len(), 500);
    assert!(report.nodes.iter().all(|n| n.outcome == "Healthy"));
    assert_eq!(w.health.describe_calls(), vec![50; 50]);
}

/// Puts our drain's checkpoint on node `i`, as the terminating hook does when it starts.
fn start_drain(w: &World, i: usize) {
    w.server
        .store()
        .modify::<Node>("", &node_name(i), |node| {
            node.metadata.annotations.get_or_insert_default().insert(
                node_manager::node_marks::checkpoint::CHECKPOINT_ANNOTATION.into(),
                "{}".into(),
            );
        })
        .unwrap();
}

#[tokio::test]
async fn a_node_drained_for_its_replacement_holds_the_next_repair_until_its_instance_leaves() {
    let w = World::start(10).await;
    w.set_condition(0, "Ready", "Unknown", "NodeStatusUnknown", AN_HOUR * 2);
    w.set_condition(1, "Ready", "Unknown", "NodeStatusUnknown", AN_HOUR);
    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "Repair");
    assert_eq!(outcome(&report, 1), "Queued");
    // Its instance is Terminating:Wait and our terminating hook drains its node.
    start_drain(&w, 0);
    for _ in 0..2 {
        let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
        assert_eq!(outcome(&report, 0), "RepairInFlight", "{report:#?}");
        assert_eq!(outcome(&report, 1), "Queued", "{report:#?}");
        assert_eq!(report.groups[0].in_flight, 1);
        assert_eq!(w.health.marked_unhealthy(), vec![instance(0)]);
    }
    // The instance has left the group: the next repair starts.
    w.health.remove_instance(&instance(0));
    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "NotOurs");
    assert_eq!(outcome(&report, 1), "Repair");
    assert_eq!(w.health.marked_unhealthy(), vec![instance(0), instance(1)]);
}

#[tokio::test]
async fn warm_pool_instances_are_neither_repaired_nor_counted() {
    let w = World::start(13).await;
    // Three stopped in the warm pool; their Nodes registered before and are NotReady since.
    for i in 10..13 {
        w.health
            .set_instance(GROUP, &instance(i), "Warmed:Stopped", "HEALTHY");
        w.set_condition(i, "Ready", "Unknown", "NodeStatusUnknown", AN_HOUR * 5);
    }
    w.set_condition(0, "Ready", "False", "KubeletNotReady", AN_HOUR * 2);
    w.set_condition(1, "Ready", "False", "KubeletNotReady", AN_HOUR);
    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    for i in 10..13 {
        assert_eq!(outcome(&report, i), "OutOfService", "{report:#?}");
    }
    // 2 of the 10 in service: not paused.
    assert_eq!(report.groups[0].paused_by, None, "{report:#?}");
    assert_eq!(
        (report.groups[0].unhealthy, report.groups[0].out_of_service),
        (2, 3)
    );
    assert_eq!(outcome(&report, 0), "Repair");
    assert_eq!(w.health.marked_unhealthy(), vec![instance(0)]);
}

#[tokio::test]
async fn a_node_back_from_a_stopped_warm_pool_waits_from_its_instances_launch() {
    // (Its grace period from the launch is decided by the same field: decision.rs tests it
    // with Node creation times the API server would not let a test set.)
    let w = World::start(10).await;
    // Node 0 went NotReady five hours ago when its instance was stopped in the pool; the
    // instance started again a minute ago and its kubelet is not back yet.
    w.set_condition(0, "Ready", "Unknown", "NodeStatusUnknown", AN_HOUR * 5);
    let launched = Timestamp::now() - Duration::from_secs(60);
    w.health.set_launch_time(&instance(0), launched);
    // Node 1 has been NotReady for two hours on an instance running for a day: repaired.
    w.set_condition(1, "Ready", "False", "KubeletNotReady", AN_HOUR * 2);
    w.health
        .set_launch_time(&instance(1), Timestamp::now() - AN_HOUR * 24);

    let report = run::handle(&w.context(&[]), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 0), "Waiting", "{report:#?}");
    let verdict = &report
        .nodes
        .iter()
        .find(|n| n.node == node_name(0))
        .unwrap()
        .verdict;
    let verdict = serde_json::to_value(verdict).unwrap();
    assert_eq!(
        verdict["problem"]["since"],
        serde_json::to_value(launched).unwrap(),
        "the 30 minute wait counts from the launch: {verdict}"
    );
    assert_eq!(outcome(&report, 1), "Repair", "{report:#?}");
    assert_eq!(w.health.marked_unhealthy(), vec![instance(1)]);
    // Only the two nodes with a bad condition were looked up, in one call.
    assert_eq!(w.health.launch_time_calls(), vec![2]);

    // A healthy run looks nothing up.
    let w = World::start(3).await;
    run::handle(&w.context(&[]), Value::Null).await.unwrap();
    assert!(w.health.launch_time_calls().is_empty());
}

/// The out-of-service taint of a node (`None`: none), and our record of it.
fn out_of_service(w: &World, i: usize) -> (Option<String>, Option<ShutdownRecord>) {
    let node = w.server.store().find::<Node>("", &node_name(i)).unwrap();
    let taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|taints| taints.iter().find(|t| t.key == OUT_OF_SERVICE_TAINT_KEY))
        .map(|t| format!("{}:{}", t.value.clone().unwrap_or_default(), t.effect));
    (taint, ShutdownRecord::of(&node))
}

/// Issue #45 item 3: a node repaired while its kubelet is silent and EC2 shows its instance
/// down gets Kubernetes' out-of-service taint first (so its pods and volumes are freed now),
/// with our record; a node whose kubelet answers, or whose instance runs with passing status
/// checks, never does; `OUT_OF_SERVICE_TAINT=false` turns it off.
#[tokio::test]
async fn a_silent_node_whose_instance_is_down_is_tainted_out_of_service_before_its_repair() {
    let w = World::start(10).await;
    let env = [(
        "REPAIR_CONFIG",
        r#"{"maxParallelNodesRepairedCount": 5, "maxUnhealthyNodeThresholdCount": 10}"#,
    )];
    let down = |state: &str, impaired: bool| InstanceCondition {
        state: state.into(),
        system_status: Some(
            if impaired {
                "impaired"
            } else {
                "not-applicable"
            }
            .into(),
        ),
        instance_status: Some("not-applicable".into()),
    };
    // 0: silent, stopped. 1: silent, running with an impaired status check. 2: silent,
    // running and passing its checks. 3: Ready=False (the kubelet answers), instance stopped.
    w.health.set_condition(&instance(0), down("stopped", false));
    w.health.set_condition(&instance(1), down("running", true));
    w.health.set_condition(&instance(3), down("stopped", false));
    for i in 0..3 {
        w.set_condition(i, "Ready", "Unknown", "NodeStatusUnknown", AN_HOUR);
    }
    w.set_condition(3, "Ready", "False", "KubeletNotReady", AN_HOUR);
    let report = run::handle(&w.context(&env), Value::Null).await.unwrap();
    for i in 0..4 {
        assert_eq!(outcome(&report, i), "Repair", "{report:#?}");
    }
    for i in [0, 1] {
        let (taint, record) = out_of_service(&w, i);
        assert_eq!(taint.as_deref(), Some("nodeshutdown:NoExecute"), "node {i}");
        let record = record.unwrap_or_else(|| panic!("node {i} has no record"));
        assert_eq!(record.by, "node-repair");
        assert!(record.why.contains(&instance(i)), "{record:?}");
    }
    assert!(out_of_service(&w, 0).1.unwrap().why.contains("stopped"));
    assert!(out_of_service(&w, 1).1.unwrap().why.contains("impaired"));
    for i in [2, 3] {
        assert_eq!(out_of_service(&w, i), (None, None), "node {i}");
    }
    let added = w.events("OutOfServiceTaintAdded");
    assert_eq!(added.len(), 2, "{added:#?}");
    // The repairs themselves went ahead, tainted or not.
    assert_eq!(w.health.marked_unhealthy().len(), 4);

    // Opted out: a fresh silent node with a stopped instance is repaired untainted.
    w.health.set_condition(&instance(4), down("stopped", false));
    w.set_condition(4, "Ready", "Unknown", "NodeStatusUnknown", AN_HOUR);
    let off = [env[0], ("OUT_OF_SERVICE_TAINT", "false")];
    let report = run::handle(&w.context(&off), Value::Null).await.unwrap();
    assert_eq!(outcome(&report, 4), "Repair", "{report:#?}");
    assert_eq!(out_of_service(&w, 4), (None, None));
}
