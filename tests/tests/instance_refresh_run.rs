//! The instance refresh handler in process, against the fake API server (real
//! `kube::Client`, the shipped RBAC's instance-refresh group) and the in-memory Auto Scaling:
//! which nodes a refresh start marks, that its end undoes only our marks, that nothing is
//! written without Auto Scaling confirming the event, and that other clusters' and
//! malformed events change nothing.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use node_manager::aws::in_memory::InMemoryInstanceRefreshes;
use node_manager::aws::{
    ConfiguredInstance, GroupConfiguration, InstanceRefreshDescription, InstanceRefreshes,
    LaunchTemplateRef,
};
use node_manager::instance_refresh::handler::{self, RefreshContext, RefreshError};
use node_manager::instance_refresh::settings::RefreshSettings;
use node_manager::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;
use node_manager::node_marks::refresh::{MarkAs, REFRESH_LABEL, mark_node, refresh_marks_of};
use node_manager_testkit::fixtures::{make_ready_by_hand, running_pod};
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use node_manager_testkit::soak::corpus;
use serde_json::{Value, json};

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-ours";
const REFRESH: &str = "c613620e-07e2-4ed2-a9e2-ef8258911ade";
const ACCOUNT: &str = "123456789012";

fn node_name(i: usize) -> String {
    format!("ip-10-0-0-{i}.eu-west-1.compute.internal")
}

fn instance(i: usize) -> String {
    format!("i-{i:017x}")
}

fn template(version: &str) -> LaunchTemplateRef {
    LaunchTemplateRef {
        id: Some("lt-0123".into()),
        name: Some("nodes".into()),
        version: Some(version.into()),
    }
}

struct World {
    server: FakeApiServer,
    aws: InMemoryInstanceRefreshes,
    client: kube::Client,
}

impl World {
    /// `nodes` Ready nodes of [`GROUP`] on launch template version 1; the group is on 2.
    async fn start(nodes: usize) -> Self {
        let server = FakeApiServer::builder()
            .cluster_name(CLUSTER)
            .simulation(SimulationTimings {
                enabled: false,
                ..SimulationTimings::default()
            })
            .start()
            .await
            .unwrap();
        server
            .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
            .unwrap();
        let aws = InMemoryInstanceRefreshes::default();
        for i in 0..nodes {
            server
                .register_node(
                    &node_name(i),
                    &format!("aws:///eu-west-1a/{}", instance(i)),
                    Some(Duration::ZERO),
                )
                .unwrap();
        }
        aws.put_group(GroupConfiguration {
            name: GROUP.into(),
            tags: [("eks:cluster-name".to_owned(), CLUSTER.to_owned())].into(),
            desired_capacity: u32::try_from(nodes).unwrap(),
            launch_template: Some(template("2")),
            maintenance_min_healthy_percentage: None,
            maintenance_max_healthy_percentage: None,
            retains_abandoned_instances: false,
            instances: (0..nodes)
                .map(|i| ConfiguredInstance {
                    instance_id: instance(i),
                    lifecycle_state: "InService".into(),
                    instance_type: Some("m5.large".into()),
                    launch_template: Some(template("1")),
                    protected_from_scale_in: false,
                })
                .collect(),
            ..GroupConfiguration::default()
        });
        for i in 0..nodes {
            aws.put_launch_time(&instance(i), launched_before_the_refresh());
        }
        let token =
            server.add_static_token("instance-refresh", &["open-node-manager:instance-refresh"]);
        let mut config = server.config_with_token(&token).await.unwrap();
        config.default_retry = false;
        let client = kube::Client::try_from(config).unwrap();
        Self {
            server,
            aws,
            client,
        }
    }

    fn refresh(&self, status: &str, min: u32, max: u32) {
        self.aws.put_refresh(InstanceRefreshDescription {
            instance_refresh_id: REFRESH.into(),
            auto_scaling_group_name: GROUP.into(),
            status: status.into(),
            start_time: Some(refresh_start()),
            min_healthy_percentage: Some(min),
            max_healthy_percentage: Some(max),
            ..InstanceRefreshDescription::default()
        });
    }

    fn context(
        &self,
    ) -> RefreshContext<kube::Client, InMemoryInstanceRefreshes, InMemoryInstanceRefreshes> {
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", CLUSTER),
            (
                "NODE_TAINT",
                "open-node-manager.io/outdated=true:NoSchedule",
            ),
        ];
        RefreshContext {
            kube: self.client.clone(),
            autoscaling: self.aws.clone(),
            ec2: self.aws.clone(),
            settings: RefreshSettings::from_source(env).unwrap(),
        }
    }

    async fn send(&self, kind: &str) -> Result<handler::RefreshReport, RefreshError> {
        handler::handle(&self.context(), &event(kind, GROUP), Some(ACCOUNT)).await
    }

    fn group(&self) -> GroupConfiguration {
        futures_lite_block(self.aws.describe_group_configuration(GROUP))
            .unwrap()
            .unwrap()
    }

    fn node(&self, i: usize) -> Node {
        self.server.store().find::<Node>("", &node_name(i)).unwrap()
    }

    /// `count` running pods (no requests: one pod slot each) on each of nodes `0..nodes`.
    fn pods_on_each_node(&self, nodes: usize, count: usize) {
        for i in 0..nodes {
            for p in 0..count {
                let pod = running_pod("default", &format!("web-{i}-{p}"), &node_name(i), &[]);
                self.server.store().create(&pod).unwrap();
            }
        }
    }

    /// A Ready node `i` with room for `pods` more pods (its allocatable pod count).
    fn register_room_node(&self, i: usize, instance_id: &str, pods: u32) {
        self.server
            .register_node(
                &node_name(i),
                &format!("aws:///eu-west-1a/{instance_id}"),
                Some(Duration::ZERO),
            )
            .unwrap();
        self.server
            .store()
            .modify::<Node>("", &node_name(i), |n| {
                // The simulation is off here: Ready is set by hand.
                make_ready_by_hand(n);
                let status = n.status.get_or_insert_default();
                status.allocatable.get_or_insert_default().insert(
                    "pods".into(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(pods.to_string()),
                );
            })
            .unwrap();
    }

    /// The refresh's replacement `i`: in service in the group since after the start, on
    /// the desired template, its node Ready with room for `pods` pods.
    fn add_replacement(&self, i: usize, pods: u32) {
        self.register_room_node(i, &instance(i), pods);
        let mut group = self.group();
        group.instances.push(ConfiguredInstance {
            instance_id: instance(i),
            lifecycle_state: "InService".into(),
            instance_type: Some("m5.large".into()),
            launch_template: Some(template("2")),
            protected_from_scale_in: false,
        });
        self.aws.put_group(group);
        self.aws.put_launch_time(
            &instance(i),
            refresh_start() + jiff::SignedDuration::from_secs(60),
        );
    }

    /// The instance-refresh function's requests so far, as `verb resource` (`list pods`).
    fn requests(&self) -> Vec<String> {
        self.server
            .audit()
            .filter(|e| e.user.username == "instance-refresh")
            .iter()
            .map(|e| format!("{} {}", e.verb, e.resource()))
            .collect()
    }

    fn patches(&self) -> usize {
        self.server
            .audit()
            .filter(|e| e.user.username == "instance-refresh" && e.verb == "patch")
            .len()
    }
}

/// When the refreshes of these tests started.
fn refresh_start() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_790_000_000).unwrap()
}

/// When the group's first instances were launched: a day before.
fn launched_before_the_refresh() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_790_000_000 - 86_400).unwrap()
}

fn event(kind: &str, group: &str) -> Value {
    json!({
        "version": "0",
        "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718",
        "detail-type": format!("EC2 Auto Scaling Instance Refresh {kind}"),
        "source": "aws.autoscaling",
        "account": ACCOUNT,
        "time": "2026-11-27T08:00:00Z",
        "region": "eu-west-1",
        "resources": [],
        "detail": {"InstanceRefreshId": REFRESH, "AutoScalingGroupName": group},
    })
}

/// An instance event of Auto Scaling for [`GROUP`] (no refresh id in it).
fn instance_event(detail_type: &str, instance_id: &str) -> Value {
    json!({
        "version": "0",
        "id": "0c4b3f6e-4a8e-4b4a-9d3c-6f1e2a7b8c9d",
        "detail-type": detail_type,
        "source": "aws.autoscaling",
        "account": ACCOUNT,
        "time": "2026-11-28T08:00:00Z",
        "region": "eu-west-1",
        "resources": [],
        "detail": {"AutoScalingGroupName": GROUP, "EC2InstanceId": instance_id, "StatusCode": "InProgress"},
    })
}

/// The in-memory fake answers at once: its futures complete on their first poll.
fn futures_lite_block<T>(future: impl std::future::Future<Output = T>) -> T {
    let waker = std::task::Waker::noop();
    let mut context = std::task::Context::from_waker(waker);
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => panic!("the in-memory fake never waits"),
    }
}

fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn excluded(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(EXCLUDE_FROM_LOAD_BALANCERS_LABEL))
        .is_some_and(|v| v == "true")
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == "open-node-manager.io/outdated" && t.effect == "NoSchedule")
        })
}

/// The refresh's `PreferNoSchedule` mark of an outdated node it keeps schedulable.
fn soft_tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == "open-node-manager.io/outdated" && t.effect == "PreferNoSchedule")
        })
}

#[tokio::test]
async fn launch_before_terminate_marks_every_outdated_node_and_the_end_undoes_only_ours() {
    let world = World::start(3).await;
    // Somebody else's cordon on node 2, before the refresh.
    world
        .server
        .store()
        .modify::<Node>("", &node_name(2), |n| {
            n.spec.get_or_insert_default().unschedulable = Some(true);
        })
        .unwrap();
    world.refresh("InProgress", 100, 200);

    let report = world.send("Started").await.unwrap();
    assert_eq!(report.outcome, "Marked", "{report:?}");
    assert_eq!(report.marked.len(), 3, "{report:?}");
    for i in 0..3 {
        let node = world.node(i);
        assert!(
            cordoned(&node) && excluded(&node) && tainted(&node),
            "node {i}"
        );
        let marks = refresh_marks_of(&node).unwrap();
        assert_eq!(marks.instance_refresh_id, REFRESH);
        assert_eq!(marks.instance_id, instance(i));
        assert_eq!(marks.out_of_service.cordoned, i != 2, "node {i}");
    }

    // A duplicate delivery writes nothing new (the marks are in place).
    let writes = world.patches();
    let again = world.send("Started").await.unwrap();
    assert_eq!(again.marked.len(), 3);
    assert!(
        refresh_marks_of(&world.node(0))
            .unwrap()
            .out_of_service
            .cordoned
    );
    assert_eq!(world.patches(), writes, "a repeated start writes nothing");

    // A Cancelled event while Auto Scaling still reports the refresh in progress runs ahead
    // of it: after a few seconds of reads the invocation fails, so Lambda retries it.
    let early = world.send("Cancelled").await.unwrap_err();
    assert!(
        matches!(early, RefreshError::NotFinalYet { ref status, .. } if status == "InProgress"),
        "{early}"
    );
    assert!(
        cordoned(&world.node(0)),
        "nothing undone on an unproven event"
    );

    world.refresh("Cancelled", 100, 200);
    let ended = world.send("Cancelled").await.unwrap();
    assert_eq!(ended.outcome, "Unmarked", "{ended:?}");
    assert_eq!(ended.unmarked.len(), 3);
    for i in 0..3 {
        let node = world.node(i);
        assert!(!excluded(&node) && !tainted(&node), "node {i}");
        assert_eq!(
            cordoned(&node),
            i == 2,
            "node {i}: only the user's cordon stays"
        );
        assert!(refresh_marks_of(&node).is_none());
        assert!(
            !node
                .metadata
                .labels
                .unwrap_or_default()
                .contains_key(REFRESH_LABEL)
        );
    }
    // And once more: nothing of ours is left to undo.
    let repeated = world.send("Cancelled").await.unwrap();
    assert!(repeated.unmarked.is_empty());
}

/// Terminate first with every node of the cluster outdated: there is no room the refresh
/// does not replace, so no node is marked, whichever Auto Scaling takes first (the old rule
/// cordoned all but one and that one could go first). A node of another group with room
/// for exactly one outdated node's pods lets exactly one be marked.
#[tokio::test]
async fn terminate_first_marks_only_as_far_as_the_room_of_nodes_that_stay() {
    let world = World::start(4).await;
    world.pods_on_each_node(4, 2);
    world.refresh("InProgress", 75, 100);
    let report = world.send("Started").await.unwrap();
    let plan = report.plan.clone().unwrap();
    assert!(!plan.launch_before_terminate);
    assert!(report.marked.is_empty(), "{report:?}");
    assert_eq!(plan.kept.len(), 4, "{report:?}");
    // Kept schedulable, each marked outdated only: the soft taint, no cordon.
    assert_eq!(report.outdated.len(), 4, "{report:?}");
    for i in 0..4 {
        let node = world.node(i);
        assert!(!cordoned(&node) && !excluded(&node), "node {i}");
        assert!(soft_tainted(&node), "node {i}");
        assert!(refresh_marks_of(&node).unwrap().outdated_only, "node {i}");
    }
    assert_eq!(world.patches(), 4);

    // A node of another group, Ready, with room for two pods.
    world.register_room_node(10, "i-0other0000000000a", 2);
    let report = world.send("Started").await.unwrap();
    assert_eq!(report.marked, vec![node_name(0)], "{report:?}");
    assert_eq!((0..4).filter(|i| cordoned(&world.node(*i))).count(), 1);
    assert!(
        !soft_tainted(&world.node(0)),
        "out of service: the soft taint went"
    );
    assert_eq!((1..4).filter(|i| soft_tainted(&world.node(*i))).count(), 3);

    // The refresh ends: every mark of it goes, the soft ones too.
    world.refresh("Cancelled", 75, 100);
    let ended = world.send("Cancelled").await.unwrap();
    assert_eq!(ended.unmarked.len(), 4, "{ended:?}");
    for i in 0..4 {
        let node = world.node(i);
        assert!(!cordoned(&node) && !soft_tainted(&node), "node {i}");
        assert!(refresh_marks_of(&node).is_none(), "node {i}");
    }
}

/// Launch before terminate: nothing is marked before a replacement is Ready; each
/// replacement that comes in service (`EC2 Instance Launch Successful`) marks as many
/// outdated nodes as its room takes, and the nodes marked before stay marked.
#[tokio::test]
async fn replacements_coming_in_service_mark_outdated_nodes_as_far_as_their_room_reaches() {
    let world = World::start(3).await;
    world.pods_on_each_node(3, 2);
    world.refresh("InProgress", 100, 200);
    let started = world.send("Started").await.unwrap();
    assert!(started.marked.is_empty(), "{started:?}");

    for (step, replacement) in [3usize, 4].into_iter().enumerate() {
        world.add_replacement(replacement, 2);
        let report = handler::handle(
            &world.context(),
            &instance_event("EC2 Instance Launch Successful", &instance(replacement)),
            Some(ACCOUNT),
        )
        .await
        .unwrap();
        assert_eq!(report.outcome, "Marked", "{report:?}");
        assert_eq!(report.instance_refresh_id, REFRESH);
        assert_eq!(report.marked.len(), step + 1, "{report:?}");
        assert!(cordoned(&world.node(0)), "the first marked stays marked");
        assert!(!cordoned(&world.node(replacement)));
    }
    assert!(!cordoned(&world.node(2)), "no room for node 2's pods yet");
    assert!(
        soft_tainted(&world.node(2)),
        "but pods go elsewhere when they can"
    );
}

/// A node of the group whose instance is leaving (`Terminating:Wait`: a scale-in whose drain
/// has not begun yet, so the node is still schedulable) is no room: its pods are about to
/// move too, and outdated nodes marked on its room leave the drain nowhere to put them (event
/// soak seeds 147 and 246: the drain of a scale-in reached its timeout with pods left, every
/// other node cordoned by a refresh that had counted the leaving node as room).
#[tokio::test]
async fn a_node_whose_instance_is_leaving_is_no_room() {
    let world = World::start(3).await;
    world.pods_on_each_node(3, 2);
    world.refresh("InProgress", 100, 200);
    world.add_replacement(3, 4);
    let mut group = world.group();
    for instance in group
        .instances
        .iter_mut()
        .filter(|i| i.instance_id == instance(3))
    {
        instance.lifecycle_state = "Terminating:Wait".into();
    }
    world.aws.put_group(group);
    let report = world.send("Started").await.unwrap();
    assert!(report.marked.is_empty(), "{report:?}");
    assert!((0..4).all(|i| !cordoned(&world.node(i))));

    // Once it is in service again (say the action was abandoned and the instance kept), its
    // room counts.
    let mut group = world.group();
    for instance in group
        .instances
        .iter_mut()
        .filter(|i| i.instance_id == instance(3))
    {
        instance.lifecycle_state = "InService".into();
    }
    world.aws.put_group(group);
    let report = world.send("Started").await.unwrap();
    assert_eq!(report.marked.len(), 2, "{report:?}");
}

/// The pods of a leaving node move too: they claim the room first, as those of an outdated
/// node already out of service do, and the leaving node itself is not the refresh's to mark.
#[tokio::test]
async fn a_leaving_nodes_pods_claim_room_before_outdated_nodes_are_marked() {
    let world = World::start(3).await;
    world.pods_on_each_node(3, 2);
    world.refresh("InProgress", 100, 200);
    world.add_replacement(3, 4);
    for p in 0..2 {
        let pod = running_pod("default", &format!("new-3-{p}"), &node_name(3), &[]);
        world.server.store().create(&pod).unwrap();
    }
    let mut group = world.group();
    for instance in group
        .instances
        .iter_mut()
        .filter(|i| i.instance_id == instance(3))
    {
        instance.lifecycle_state = "Terminating:Wait".into();
    }
    world.aws.put_group(group);
    // Another group's node with room for two outdated nodes' pods: the leaving node's two
    // pods claim half of it, so one outdated node is marked, not two.
    world.register_room_node(10, "i-0other0000000000a", 4);
    let report = world.send("Started").await.unwrap();
    assert_eq!(report.marked.len(), 1, "{report:?}");
    assert!(!cordoned(&world.node(3)), "not the refresh's to mark");
    assert!(refresh_marks_of(&world.node(3)).is_none());
}

/// Two groups refreshing at once count the room once (issue #43 item 9): a node another
/// group's refresh marked outdated is no room (it goes too), and the pods of a node it took
/// out of service claim room first. Before, the other group's kept node counted as room
/// and its leaving node's pods as needing none: both refreshes marked on the same room, and
/// with both terminate first, pods went Pending.
#[tokio::test]
async fn two_groups_refreshing_at_once_count_the_same_room_once() {
    let world = World::start(3).await;
    world.pods_on_each_node(3, 2);
    world.refresh("InProgress", 75, 100);
    // A stable group's node with room for one outdated node's pods.
    world.register_room_node(10, "i-0stable00000000a", 2);
    // Another group's outdated node, marked outdated only by its own refresh, with room for
    // four pods: not room for ours.
    world.register_room_node(11, "i-0other0000000000b", 6);
    for p in 0..2 {
        let pod = running_pod("default", &format!("b-{p}"), &node_name(11), &[]);
        world.server.store().create(&pod).unwrap();
    }
    let nodes: kube::Api<Node> = kube::Api::all(world.client.clone());
    let other = |mark_as| {
        mark_node(
            &nodes,
            world
                .server
                .store()
                .find::<Node>("", &node_name(11))
                .unwrap(),
            "0d1e2f30-4a5b-4c6d-8e9f-a0b1c2d3e4f5",
            "eks-theirs",
            "i-0other0000000000b",
            mark_as,
        )
    };
    other(MarkAs::Outdated).await.unwrap();
    let report = world.send("Started").await.unwrap();
    assert_eq!(
        report.marked,
        vec![node_name(0)],
        "only the stable room counts: {report:?}"
    );

    // Undo ours; the other refresh now takes its node out of service: its two pods claim
    // the stable node's room before any of ours.
    world.refresh("Cancelled", 75, 100);
    world.send("Cancelled").await.unwrap();
    assert!((0..3).all(|i| !cordoned(&world.node(i))));
    other(MarkAs::OutOfService { taint: None }).await.unwrap();
    world.refresh("InProgress", 75, 100);
    let report = world.send("Started").await.unwrap();
    assert!(
        report.marked.is_empty(),
        "the other group's pods hold the room: {report:?}"
    );
    assert!((0..3).all(|i| !cordoned(&world.node(i))));
    assert!(
        cordoned(&world.node(11)),
        "the other refresh's mark is not ours to touch"
    );
}

/// An instance event of a group with no refresh in progress plans nothing and writes
/// nothing; one of another cluster's group is not ours.
#[tokio::test]
async fn an_instance_event_without_a_refresh_in_progress_writes_nothing() {
    let world = World::start(2).await;
    let launched = instance_event("EC2 Instance Launch Successful", &instance(5));
    let report = handler::handle(&world.context(), &launched, Some(ACCOUNT))
        .await
        .unwrap();
    assert_eq!(report.outcome, "NoRefresh", "{report:?}");
    world.refresh("Successful", 100, 200);
    let report = handler::handle(&world.context(), &launched, Some(ACCOUNT))
        .await
        .unwrap();
    assert_eq!(report.outcome, "NoRefresh", "{report:?}");
    assert_eq!(world.patches(), 0);
}

#[tokio::test]
async fn foreign_unconfirmed_and_malformed_events_write_nothing() {
    let world = World::start(2).await;
    world.refresh("InProgress", 100, 200);
    world.aws.put_group(GroupConfiguration {
        name: "other-cluster-ng".into(),
        tags: [("eks:cluster-name".to_owned(), "someone-else".to_owned())].into(),
        ..GroupConfiguration::default()
    });
    let ctx = world.context();

    let foreign = handler::handle(&ctx, &event("Started", "other-cluster-ng"), Some(ACCOUNT))
        .await
        .unwrap();
    assert_eq!(foreign.outcome, "NotOurs");
    let unknown_group = handler::handle(&ctx, &event("Started", "no-such-group"), Some(ACCOUNT))
        .await
        .unwrap();
    assert_eq!(unknown_group.outcome, "NotOurs");
    let other_account = handler::handle(&ctx, &event("Started", GROUP), Some("210987654321"))
        .await
        .unwrap();
    assert_eq!(other_account.outcome, "NotOurs");

    let mut forged = event("Started", GROUP);
    forged["detail"]["InstanceRefreshId"] = json!("0b7e2b7e-0000-4000-8000-000000000000");
    assert!(matches!(
        handler::handle(&ctx, &forged, Some(ACCOUNT)).await,
        Err(RefreshError::RefreshUnknown { .. })
    ));
    for bad in [
        json!({"detail-type": "EC2 Auto Scaling Instance Refresh Started"}),
        json!("not an event"),
        {
            let mut e = event("Started", GROUP);
            e["source"] = json!("my.app");
            e
        },
        {
            let mut e = event("Started", GROUP);
            e["detail"]["InstanceRefreshId"] = json!("x\ny");
            e
        },
    ] {
        assert!(matches!(
            handler::handle(&ctx, &bad, Some(ACCOUNT)).await,
            Err(RefreshError::BadEvent(_))
        ));
    }
    assert_eq!(world.patches(), 0, "no event above may write");
    assert!(!cordoned(&world.node(0)) && !cordoned(&world.node(1)));
}

/// The end of refresh A was never delivered; refresh B of the same group starts. B takes over
/// A's marks on the nodes it replaces too, and undoes A's on the nodes it leaves.
#[tokio::test]
async fn a_refresh_whose_end_was_missed_is_cleaned_up_by_the_next_one() {
    const NEXT: &str = "0f9d9a4e-5c1b-4f5e-9a31-2b7c8d6e1f00";
    let world = World::start(2).await;
    world.refresh("InProgress", 100, 200);
    assert_eq!(world.send("Started").await.unwrap().marked.len(), 2);
    // A ended (its Succeeded event lost); node 1's instance is now on the desired template.
    world.refresh("Successful", 100, 200);
    let mut group = GroupConfiguration {
        name: GROUP.into(),
        tags: [("eks:cluster-name".to_owned(), CLUSTER.to_owned())].into(),
        desired_capacity: 2,
        launch_template: Some(template("2")),
        ..GroupConfiguration::default()
    };
    for (i, version) in [(0, "1"), (1, "2")] {
        group.instances.push(ConfiguredInstance {
            instance_id: instance(i),
            lifecycle_state: "InService".into(),
            instance_type: Some("m5.large".into()),
            launch_template: Some(template(version)),
            protected_from_scale_in: false,
        });
    }
    world.aws.put_group(group);
    world.aws.put_refresh(InstanceRefreshDescription {
        instance_refresh_id: NEXT.into(),
        auto_scaling_group_name: GROUP.into(),
        status: "InProgress".into(),
        start_time: Some(refresh_start()),
        min_healthy_percentage: Some(100),
        max_healthy_percentage: Some(200),
        skip_matching: true,
        ..InstanceRefreshDescription::default()
    });
    let mut started = event("Started", GROUP);
    started["detail"]["InstanceRefreshId"] = json!(NEXT);
    let report = handler::handle(&world.context(), &started, Some(ACCOUNT))
        .await
        .unwrap();
    assert_eq!(report.marked, vec![node_name(0)], "{report:?}");
    let kept = world.node(0);
    let marks = refresh_marks_of(&kept).unwrap();
    assert_eq!(marks.instance_refresh_id, NEXT);
    assert!(
        marks.out_of_service.cordoned,
        "A's cordon is carried over as ours"
    );
    assert!(cordoned(&kept));
    let skipped = world.node(1);
    assert!(
        !cordoned(&skipped) && !excluded(&skipped) && refresh_marks_of(&skipped).is_none(),
        "A's marks undone on the node B does not replace"
    );
    assert_eq!(report.unmarked.len(), 1, "{report:?}");
}

/// A Started delivered again (Lambda's retry of a failed invocation, or a late duplicate)
/// after the first replacement came in service: the replacement is not marked, the plan is
/// the same as at the start.
#[tokio::test]
async fn a_repeated_start_after_replacements_came_in_service_leaves_them_alone() {
    let world = World::start(3).await;
    world.refresh("InProgress", 100, 150);
    let first = world.send("Started").await.unwrap();
    assert_eq!(first.marked.len(), 3, "{first:?}");
    // Auto Scaling launched the replacement of node 0 (on version 2), which registered.
    let replacement = 3;
    world
        .server
        .register_node(
            &node_name(replacement),
            &format!("aws:///eu-west-1a/{}", instance(replacement)),
            Some(Duration::ZERO),
        )
        .unwrap();
    let mut group = world.group();
    group.instances.push(ConfiguredInstance {
        instance_id: instance(replacement),
        lifecycle_state: "InService".into(),
        instance_type: Some("m5.large".into()),
        launch_template: Some(template("2")),
        protected_from_scale_in: false,
    });
    world.aws.put_group(group);
    world.aws.put_launch_time(
        &instance(replacement),
        refresh_start() + jiff::SignedDuration::from_secs(90),
    );

    let again = world.send("Started").await.unwrap();
    assert_eq!(again.marked.len(), 3, "{again:?}");
    assert!(
        !cordoned(&world.node(replacement)) && refresh_marks_of(&world.node(replacement)).is_none(),
        "the replacement stays schedulable"
    );
}

/// The end event comes while Auto Scaling still reports the refresh `Cancelling`; it turns
/// `Cancelled` within the handler's reads: the marks are undone by that same invocation.
#[tokio::test]
async fn an_end_that_runs_ahead_of_auto_scaling_waits_for_its_status() {
    let world = World::start(2).await;
    world.refresh("InProgress", 100, 200);
    assert_eq!(world.send("Started").await.unwrap().marked.len(), 2);
    world.refresh("Cancelling", 100, 200);
    let aws = world.aws.clone();
    let later = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let mut refresh = aws_refresh(&aws);
        refresh.status = "Cancelled".into();
        aws.put_refresh(refresh);
    });
    let ended = world.send("Cancelled").await.unwrap();
    later.await.unwrap();
    assert_eq!(ended.outcome, "Unmarked", "{ended:?}");
    assert_eq!(ended.unmarked.len(), 2);
    assert!(!cordoned(&world.node(0)) && !cordoned(&world.node(1)));
}

/// A refresh that failed and rolls back keeps exactly the outdated instances, which must be
/// schedulable: its `Failed` event read while Auto Scaling reports `RollbackInProgress` undoes
/// the marks at once, as the reconciler would (before, the event waited for a final status,
/// failed, and the marks stayed until the sweep; one rule now decides both).
#[tokio::test]
async fn an_end_read_during_the_rollback_undoes_the_marks_at_once() {
    let world = World::start(2).await;
    world.refresh("InProgress", 100, 200);
    assert_eq!(world.send("Started").await.unwrap().marked.len(), 2);
    world.refresh("RollbackInProgress", 100, 200);
    let ended = world.send("Failed").await.unwrap();
    assert_eq!(ended.outcome, "Unmarked", "{ended:?}");
    assert_eq!(ended.unmarked.len(), 2, "{ended:?}");
    for i in 0..2 {
        let node = world.node(i);
        assert!(
            !cordoned(&node) && refresh_marks_of(&node).is_none(),
            "node {i}"
        );
    }
}

fn aws_refresh(aws: &InMemoryInstanceRefreshes) -> InstanceRefreshDescription {
    futures_lite_block(aws.describe_instance_refresh(GROUP, REFRESH))
        .unwrap()
        .unwrap()
}

/// Auto Scaling as seen by a start that overlaps the refresh's end: the refresh is in
/// progress when the start reads it first, and ended (its end already handled) on every
/// later read.
#[derive(Clone)]
struct EndsAfterFirstRead {
    aws: InMemoryInstanceRefreshes,
    reads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl InstanceRefreshes for EndsAfterFirstRead {
    async fn describe_instance_refresh(
        &self,
        group_name: &str,
        instance_refresh_id: &str,
    ) -> Result<Option<InstanceRefreshDescription>, node_manager::aws::AwsError> {
        let read = self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut refresh = self
            .aws
            .describe_instance_refresh(group_name, instance_refresh_id)
            .await?;
        if read > 0
            && let Some(refresh) = refresh.as_mut()
        {
            refresh.status = "Cancelled".into();
        }
        Ok(refresh)
    }

    async fn active_instance_refresh(
        &self,
        group_name: &str,
    ) -> Result<Option<InstanceRefreshDescription>, node_manager::aws::AwsError> {
        self.aws.active_instance_refresh(group_name).await
    }

    async fn describe_group_configuration(
        &self,
        group_name: &str,
    ) -> Result<Option<GroupConfiguration>, node_manager::aws::AwsError> {
        self.aws.describe_group_configuration(group_name).await
    }
}

/// The refresh is cancelled, and its end handled (finding no labelled node), while the
/// start is still writing: the start sees the end when it reads the refresh after its
/// writes and undoes its own marks, so no node stays cordoned for a refresh that is over.
#[tokio::test]
async fn a_start_that_overlaps_the_refreshs_end_undoes_its_own_marks() {
    let world = World::start(2).await;
    world.refresh("InProgress", 100, 200);
    let context = world.context();
    let overlapping = RefreshContext {
        kube: context.kube,
        autoscaling: EndsAfterFirstRead {
            aws: world.aws.clone(),
            reads: Default::default(),
        },
        ec2: context.ec2,
        settings: context.settings,
    };
    let report = handler::handle(&overlapping, &event("Started", GROUP), Some(ACCOUNT))
        .await
        .unwrap();
    assert_eq!(report.outcome, "Unmarked", "{report:?}");
    assert_eq!(report.unmarked.len(), 2, "{report:?}");
    for i in 0..2 {
        let node = world.node(i);
        assert!(
            !cordoned(&node) && !excluded(&node) && refresh_marks_of(&node).is_none(),
            "node {i}"
        );
    }
}

/// Instances Auto Scaling never replaces with the refresh's default preferences (protected
/// from scale-in, `ScaleInProtectedInstances: Ignore`; `Standby`, `StandbyInstances:
/// Ignore`) stay schedulable; with `Refresh` and `Terminate` they are outdated.
#[tokio::test]
async fn protected_and_standby_instances_are_marked_only_when_the_refresh_replaces_them() {
    let world = World::start(3).await;
    let mut group = world.group();
    group.instances[1].protected_from_scale_in = true;
    group.instances[2].lifecycle_state = "Standby".into();
    world.aws.put_group(group);
    world.aws.put_refresh(InstanceRefreshDescription {
        instance_refresh_id: REFRESH.into(),
        auto_scaling_group_name: GROUP.into(),
        status: "InProgress".into(),
        start_time: Some(refresh_start()),
        min_healthy_percentage: Some(100),
        max_healthy_percentage: Some(200),
        scale_in_protected_instances: Some("Ignore".into()),
        ..InstanceRefreshDescription::default()
    });
    let report = world.send("Started").await.unwrap();
    assert_eq!(report.marked, vec![node_name(0)], "{report:?}");
    assert!(!cordoned(&world.node(1)) && !cordoned(&world.node(2)));

    world.aws.put_refresh(InstanceRefreshDescription {
        instance_refresh_id: REFRESH.into(),
        auto_scaling_group_name: GROUP.into(),
        status: "InProgress".into(),
        start_time: Some(refresh_start()),
        min_healthy_percentage: Some(100),
        max_healthy_percentage: Some(200),
        scale_in_protected_instances: Some("Refresh".into()),
        standby_instances: Some("Terminate".into()),
        ..InstanceRefreshDescription::default()
    });
    let report = world.send("Started").await.unwrap();
    assert_eq!(report.marked.len(), 3, "{report:?}");
}

/// `SkipMatching` with a desired mixed instances policy: the instance on the policy's
/// template and one of its types is left alone; the group's own (older) template does not
/// decide; an instance of a type no override names is outdated.
#[tokio::test]
async fn skip_matching_compares_a_desired_mixed_instances_policy() {
    use node_manager::aws::{MixedInstancesPolicyRef, TemplateOverride};
    let world = World::start(3).await;
    let mut group = world.group();
    // The group still launches version 2; the refresh wants version 1 (a rollback of the AMI)
    // on m5.large or m6i.large.
    group.instances[2].instance_type = Some("c5.large".into());
    world.aws.put_group(group);
    world.aws.put_refresh(InstanceRefreshDescription {
        instance_refresh_id: REFRESH.into(),
        auto_scaling_group_name: GROUP.into(),
        status: "InProgress".into(),
        start_time: Some(refresh_start()),
        min_healthy_percentage: Some(100),
        max_healthy_percentage: Some(200),
        skip_matching: true,
        desired_mixed_instances_policy: Some(MixedInstancesPolicyRef {
            launch_template: Some(template("1")),
            overrides: ["m5.large", "m6i.large"]
                .map(|t| TemplateOverride {
                    instance_type: Some(t.into()),
                    launch_template: None,
                })
                .to_vec(),
        }),
        ..InstanceRefreshDescription::default()
    });
    let report = world.send("Started").await.unwrap();
    assert_eq!(report.marked, vec![node_name(2)], "{report:?}");
}

/// An outdated instance whose node had not registered at `Started` is listed without a node;
/// the refresh's next `Checkpoint Reached` plans again and marks it once it has registered,
/// leaving the nodes already marked as they are.
#[tokio::test]
async fn a_node_that_registers_after_the_start_is_marked_at_the_next_checkpoint() {
    let world = World::start(2).await;
    let late = 2;
    let mut group = world.group();
    group.instances.push(ConfiguredInstance {
        instance_id: instance(late),
        lifecycle_state: "InService".into(),
        instance_type: Some("m5.large".into()),
        launch_template: Some(template("1")),
        protected_from_scale_in: false,
    });
    world.aws.put_group(group);
    world
        .aws
        .put_launch_time(&instance(late), launched_before_the_refresh());
    world.refresh("InProgress", 100, 200);
    let started = world.send("Started").await.unwrap();
    assert_eq!(started.marked.len(), 2, "{started:?}");
    assert_eq!(started.without_node, vec![instance(late)], "{started:?}");

    world
        .server
        .register_node(
            &node_name(late),
            &format!("aws:///eu-west-1a/{}", instance(late)),
            Some(Duration::ZERO),
        )
        .unwrap();
    let writes = world.patches();
    let checkpoint = world.send("Checkpoint Reached").await.unwrap();
    assert_eq!(checkpoint.outcome, "Marked", "{checkpoint:?}");
    assert_eq!(checkpoint.marked.len(), 3, "{checkpoint:?}");
    assert!(cordoned(&world.node(late)));
    assert_eq!(world.patches(), writes + 1, "only the late node is written");
}

/// What one plan costs the API server (the room rule's cost, docs/instance-refresh.md): once
/// every outdated node is marked, an instance event of the refresh (each replacement that
/// comes in service, each old instance that leaves) lists the nodes and nothing else, at any
/// number of pods: no pod list, no write.
#[tokio::test]
async fn a_plan_with_every_outdated_node_marked_lists_no_pods_and_writes_nothing() {
    let world = World::start(3).await;
    world.pods_on_each_node(3, 2);
    world.register_room_node(10, "i-0other0000000000a", 110);
    world.refresh("InProgress", 100, 200);
    let started = world.send("Started").await.unwrap();
    assert_eq!(started.marked.len(), 3, "{started:?}");
    let start_requests = world.requests();
    assert_eq!(
        start_requests.iter().filter(|r| *r == "list pods").count(),
        1,
        "marking needs the pods once: {start_requests:?}"
    );

    world.add_replacement(3, 110);
    let before = world.requests().len();
    let report = handler::handle(
        &world.context(),
        &instance_event("EC2 Instance Launch Successful", &instance(3)),
        Some(ACCOUNT),
    )
    .await
    .unwrap();
    assert_eq!(report.outcome, "Marked", "{report:?}");
    assert_eq!(report.marked.len(), 3, "{report:?}");
    let plan_requests = world.requests().split_off(before);
    assert_eq!(
        plan_requests,
        ["list nodes"],
        "a plan with nothing left to mark lists the nodes only"
    );
}

/// When a plan needs the pods, it lists only those that hold a place on a node: not the
/// finished ones (`Succeeded`, `Failed`: a big cluster's Jobs leave many) nor those not
/// bound yet, which the room rule does not count. 600 of those, a page and more of the list
/// before, cost nothing now.
#[tokio::test]
async fn a_plan_lists_only_the_pods_bound_to_a_node_and_not_finished() {
    let world = World::start(2).await;
    world.pods_on_each_node(2, 2);
    for p in 0..300 {
        let mut done = running_pod("default", &format!("done-{p}"), &node_name(0), &[]);
        let status = done.status.get_or_insert_default();
        status.phase = Some(if p % 2 == 0 { "Succeeded" } else { "Failed" }.into());
        world.server.store().create(&done).unwrap();
        let mut waiting = running_pod("default", &format!("waiting-{p}"), &node_name(0), &[]);
        waiting.spec.get_or_insert_default().node_name = None;
        waiting.status.get_or_insert_default().phase = Some("Pending".into());
        world.server.store().create(&waiting).unwrap();
    }
    // Room for node 0's two running pods only: they decide, the 600 others do not count.
    world.register_room_node(10, "i-0other0000000000a", 2);
    world.refresh("InProgress", 100, 200);
    let started = world.send("Started").await.unwrap();
    assert_eq!(started.marked, vec![node_name(0)], "{started:?}");
    let pod_lists = world
        .requests()
        .iter()
        .filter(|r| *r == "list pods")
        .count();
    assert_eq!(pod_lists, 1, "one page: the 4 running pods");
}
