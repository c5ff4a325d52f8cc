//! The `instance-refresh` binary as built, run under the local Lambda Runtime API against
//! the fake Auto Scaling's instance refreshes (real SDK calls) and the fake API server (the
//! shipped RBAC), across invocations: a Started delivered again after the first
//! replacements came in service, an end event that runs ahead of Auto Scaling's status, and
//! the marking that follows the replacements as they come in service.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing it.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use node_manager::node_marks::refresh::refresh_marks_of;
use node_manager_testkit::aws::{
    EventPattern, EventSubscription, FakeAutoScalingGroup, FakeAws, FakeEc2LaunchTemplate,
    FakeInstance, FakeLifecycleHook, FakeRefreshPreferences,
};
use node_manager_testkit::e2e::StaticCluster;
use node_manager_testkit::fixtures::{make_ready_by_hand, running_pod};
use node_manager_testkit::kube::FakeApiServer;
use node_manager_testkit::lambda_api::{InvocationOutcome, LambdaRuntimeApi};
use serde_json::Value;

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-refresh-ng";
const ZONE: &str = "eu-west-1a";
const FUNCTION: &str = "instance-refresh";
const LAUNCH_SUCCESSFUL: &str = "EC2 Instance Launch Successful";
/// The refresh's instance warmup: how long it waits after the first replacements are in
/// service before it terminates outdated instances. Much longer than an invocation, so the
/// first Started is handled while every outdated instance is still in service.
const WARMUP: Duration = Duration::from_secs(2);

struct RefreshWorld {
    aws: FakeAws,
    server: FakeApiServer,
    function: LambdaRuntimeApi,
    events: EventSubscription,
    old: Vec<String>,
}

fn old_instance(i: usize) -> String {
    format!("i-0a{i:015x}")
}

impl RefreshWorld {
    /// `count` Ready nodes of [`GROUP`], launched a day ago on launch template version 1; the
    /// group now launches version 2. Its terminating hook has no responder, so a refresh's
    /// terminations wait and the refresh stays in progress.
    async fn start(count: usize) -> Self {
        let cluster = StaticCluster::start(CLUSTER, Some("API_AND_CONFIG_MAP"))
            .await
            .unwrap();
        let autoscaling = cluster.aws.autoscaling();
        autoscaling.add_group(
            FakeAutoScalingGroup::new(GROUP)
                .tag("eks:cluster-name", CLUSTER)
                .availability_zones(&[ZONE])
                .size(0, u32::try_from(count).unwrap(), 10)
                .launch_template("lt-0abc", "nodes", "1"),
        );
        autoscaling
            .add_hook(
                GROUP,
                FakeLifecycleHook::terminating("terminate")
                    .heartbeat_timeout(Duration::from_secs(3600)),
            )
            .unwrap();
        let old: Vec<String> = (0..count).map(old_instance).collect();
        for id in &old {
            add_instance_launched_yesterday(&cluster.aws, &cluster.server, id);
        }
        autoscaling.set_launch_template_version(GROUP, "2").unwrap();
        let events = cluster.aws.eventbridge().subscribe(EventPattern {
            sources: vec!["aws.autoscaling".to_owned()],
            detail_types: ["Started", "Succeeded", "Failed", "Cancelled"]
                .iter()
                .map(|kind| format!("EC2 Auto Scaling Instance Refresh {kind}"))
                .chain([LAUNCH_SUCCESSFUL.to_owned()])
                .collect(),
        });
        let function = cluster.start_function(FUNCTION, "info").await.unwrap();
        let StaticCluster { aws, server, .. } = cluster;
        Self {
            aws,
            server,
            function,
            events,
            old,
        }
    }

    async fn invoke(&self, event: &Value) -> InvocationOutcome {
        self.function
            .invoke(event, Duration::from_secs(30))
            .await
            .unwrap()
    }

    async fn response_to(&self, event: &Value) -> Value {
        match self.invoke(event).await {
            InvocationOutcome::Response(value) => value,
            other => panic!(
                "expected a response, got {other:?}\n--- function output ---\n{}",
                self.function.output()
            ),
        }
    }

    /// The next refresh event, past any instance event (a test that does not follow the
    /// launches leaves them to the handler's other deliveries).
    async fn next_event(&mut self, detail_type: &str) -> Value {
        loop {
            let event = self
                .events
                .next_event(Duration::from_secs(10))
                .await
                .unwrap();
            if event["detail-type"] != LAUNCH_SUCCESSFUL {
                let wanted = format!("EC2 Auto Scaling Instance Refresh {detail_type}");
                assert_eq!(event["detail-type"], wanted.as_str(), "{event}");
                return event;
            }
        }
    }

    /// The next event on the bus, which must be of `detail_type`.
    async fn next_event_of(&mut self, detail_type: &str) -> Value {
        let event = self
            .events
            .next_event(Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(event["detail-type"], detail_type, "{event}");
        event
    }

    /// `count` running pods on the node of each outdated instance.
    fn pods_on_old_nodes(&self, count: usize) {
        for id in &self.old {
            let node = self.node_of(id).metadata.name.unwrap();
            for p in 0..count {
                let pod = running_pod("default", &format!("web-{id}-{p}"), &node, &[]);
                self.server.store().create(&pod).unwrap();
            }
        }
    }

    /// What the launching hook waits for: the instance's node registers and is Ready (here
    /// with room for `pods` pods); then the hook completes the launch.
    async fn node_ready_then_launch_completed(&self, instance_id: &str, pods: u32) {
        let instance = self.aws.ec2().instance(instance_id).unwrap();
        let name = instance.private_dns_name.clone();
        self.server
            .register_node(&name, &format!("aws:///{ZONE}/{instance_id}"), None)
            .unwrap();
        self.server
            .store()
            .modify::<Node>("", &name, |n| {
                // The simulation is off: Ready and allocatable are set here.
                make_ready_by_hand(n);
                n.status
                    .get_or_insert_default()
                    .allocatable
                    .get_or_insert_default()
                    .insert("pods".into(), Quantity(pods.to_string()));
            })
            .unwrap();
        let operator = self.aws.account().add_role_credentials("launching-hook");
        let client = aws_sdk_autoscaling::Client::new(&self.aws.sdk_config(&operator).await);
        client
            .complete_lifecycle_action()
            .auto_scaling_group_name(GROUP)
            .lifecycle_hook_name("launch")
            .instance_id(instance_id)
            .lifecycle_action_result("CONTINUE")
            .send()
            .await
            .unwrap();
    }

    /// The instances the refresh launched, once `count` wait in `Pending:Wait`.
    async fn launched_waiting(&self, refresh_id: &str, count: usize) -> Vec<String> {
        let autoscaling = self.aws.autoscaling();
        for _ in 0..500 {
            let launched = autoscaling
                .instance_refresh(refresh_id)
                .map(|r| r.launched_instance_ids)
                .unwrap_or_default();
            let waiting = launched
                .iter()
                .filter(|id| autoscaling.has_active_action(id))
                .count();
            if waiting == count {
                return launched;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the refresh did not launch {count} instances");
    }

    fn node_of(&self, instance_id: &str) -> Node {
        let name = self
            .aws
            .ec2()
            .instance(instance_id)
            .unwrap()
            .private_dns_name;
        self.server.store().find::<Node>("", &name).unwrap()
    }

    /// The first replacement the refresh launched, once in service, with its Node
    /// registered (Ready).
    async fn first_replacement_in_service(&self, refresh_id: &str) -> String {
        let autoscaling = self.aws.autoscaling();
        for _ in 0..500 {
            let launched = autoscaling
                .instance_refresh(refresh_id)
                .and_then(|r| r.launched_instance_ids.first().cloned());
            if let Some(id) = launched
                && autoscaling.instance_state(GROUP, &id).as_deref() == Some("InService")
            {
                let instance = self.aws.ec2().instance(&id).unwrap();
                self.server
                    .register_node(
                        &instance.private_dns_name,
                        &format!("aws:///{ZONE}/{id}"),
                        Some(Duration::ZERO),
                    )
                    .unwrap();
                return id;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the refresh launched no replacement");
    }
}

/// Launch before terminate, the replacements' launching hook held until each node is
/// Ready (as the launching hook does): at `Started` no replacement is Ready, so no outdated
/// node is marked (before, all were cordoned at once); each `EC2 Instance Launch
/// Successful` then marks as many outdated nodes as that replacement's room takes.
#[tokio::test]
async fn launch_before_terminate_marks_outdated_nodes_only_as_replacements_come_ready() {
    let mut world = RefreshWorld::start(3).await;
    world
        .aws
        .autoscaling()
        .add_hook(
            GROUP,
            FakeLifecycleHook::launching("launch").heartbeat_timeout(Duration::from_secs(3600)),
        )
        .unwrap();
    world.pods_on_old_nodes(2);
    let refresh_id = world
        .aws
        .autoscaling()
        .start_instance_refresh(
            GROUP,
            FakeRefreshPreferences::default()
                .healthy_percentage(100, 200)
                .instance_warmup(WARMUP),
        )
        .unwrap();
    let started = world.next_event("Started").await;
    let at_start = world.response_to(&started).await;
    assert_eq!(at_start["outcome"], "Marked", "{at_start}");
    assert!(
        at_start.get("marked").is_none(),
        "nothing Ready yet: {at_start}"
    );
    assert!(world.old.iter().all(|id| !cordoned(&world.node_of(id))));

    let launched = world.launched_waiting(&refresh_id, 3).await;
    for (ready, instance_id) in launched.iter().enumerate() {
        world.node_ready_then_launch_completed(instance_id, 2).await;
        let event = world.next_event_of(LAUNCH_SUCCESSFUL).await;
        assert_eq!(event["detail"]["EC2InstanceId"], instance_id.as_str());
        let answer = world.response_to(&event).await;
        assert_eq!(answer["instanceRefreshId"], refresh_id.as_str(), "{answer}");
        let marked = world
            .old
            .iter()
            .filter(|id| cordoned(&world.node_of(id)))
            .count();
        assert_eq!(
            marked,
            ready + 1,
            "one more per replacement Ready: {answer}"
        );
    }
}

/// An instance of [`GROUP`] launched a day ago with the group's current configuration,
/// with its Ready node.
fn add_instance_launched_yesterday(aws: &FakeAws, server: &FakeApiServer, id: &str) {
    let yesterday = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24);
    let instance = FakeInstance::new(id, "eu-west-1")
        .availability_zone(ZONE)
        .launch_time(yesterday);
    aws.ec2().add_instance(instance.clone());
    aws.autoscaling().add_instance(GROUP, id, ZONE).unwrap();
    server
        .register_node(
            &instance.private_dns_name,
            &format!("aws:///{ZONE}/{id}"),
            Some(Duration::ZERO),
        )
        .unwrap();
}

fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Lambda retries a failed Started (or EventBridge delivers it twice, late) after Auto
/// Scaling brought the first replacement in service: the replacement, which the refresh
/// never replaces, is not marked; the outdated nodes still are.
#[tokio::test]
async fn a_started_delivered_again_after_a_replacement_came_in_service_leaves_it_schedulable() {
    let mut world = RefreshWorld::start(3).await;
    let refresh_id = world
        .aws
        .autoscaling()
        .start_instance_refresh(
            GROUP,
            FakeRefreshPreferences::default()
                .healthy_percentage(100, 150)
                .instance_warmup(WARMUP),
        )
        .unwrap();
    let started = world.next_event("Started").await;
    let first = world.response_to(&started).await;
    assert_eq!(first["outcome"], "Marked", "{first}");
    assert_eq!(first["marked"].as_array().unwrap().len(), 3, "{first}");

    let replacement = world.first_replacement_in_service(&refresh_id).await;
    let again = world.response_to(&started).await;
    assert_eq!(again["outcome"], "Marked", "{again}");
    let new_node = world.node_of(&replacement);
    assert!(
        !cordoned(&new_node) && refresh_marks_of(&new_node).is_none(),
        "the replacement {replacement} was marked: {again}"
    );
    for id in &world.old {
        assert!(cordoned(&world.node_of(id)), "{id} stays out of service");
    }
}

/// An end event that comes before `DescribeInstanceRefreshes` reports the end: the
/// invocation fails (Lambda retries it) instead of answering `Stale`, and nothing is undone
/// yet; once Auto Scaling reports the end, the same event undoes the marks.
#[tokio::test]
async fn an_end_event_ahead_of_auto_scaling_fails_for_a_retry_and_then_undoes_the_marks() {
    let mut world = RefreshWorld::start(2).await;
    world
        .aws
        .autoscaling()
        .start_instance_refresh(
            GROUP,
            FakeRefreshPreferences::default()
                .healthy_percentage(100, 200)
                .instance_warmup(WARMUP),
        )
        .unwrap();
    let started = world.next_event("Started").await;
    let marked = world.response_to(&started).await;
    assert_eq!(marked["marked"].as_array().unwrap().len(), 2, "{marked}");

    let mut early = started.clone();
    early["detail-type"] = "EC2 Auto Scaling Instance Refresh Cancelled".into();
    match world.invoke(&early).await {
        InvocationOutcome::Error { error_type, .. } => {
            assert_eq!(error_type, "InstanceRefreshNotFinal");
        }
        other => panic!("an early end must fail for a retry, got {other:?}"),
    }
    for id in &world.old {
        assert!(cordoned(&world.node_of(id)), "nothing undone yet on {id}");
    }

    // The operator cancels; the terminations in flight end (answered here by hand), and
    // Auto Scaling reports the refresh Cancelled and sends its own event.
    let autoscaling = world.aws.autoscaling();
    for id in &world.old {
        for _ in 0..500 {
            if autoscaling.has_active_action(id) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            autoscaling.has_active_action(id),
            "{id} waits in Terminating:Wait"
        );
    }
    autoscaling.cancel_instance_refresh(GROUP).unwrap();
    let operator = world.aws.account().add_role_credentials("operator");
    let client = aws_sdk_autoscaling::Client::new(&world.aws.sdk_config(&operator).await);
    for id in &world.old {
        client
            .complete_lifecycle_action()
            .auto_scaling_group_name(GROUP)
            .lifecycle_hook_name("terminate")
            .instance_id(id)
            .lifecycle_action_result("CONTINUE")
            .send()
            .await
            .unwrap();
    }
    let cancelled = world.next_event("Cancelled").await;
    let ended = world.response_to(&cancelled).await;
    assert_eq!(ended["outcome"], "Unmarked", "{ended}");
    assert_eq!(ended["unmarked"].as_array().unwrap().len(), 2, "{ended}");
    let retried = world.response_to(&early).await;
    assert_eq!(
        retried["outcome"], "Unmarked",
        "a retry of the early event finds nothing left: {retried}"
    );
    assert!(retried.get("unmarked").is_none(), "{retried}");
}

/// `SkipMatching` with the group on `$Latest`: Auto Scaling resolves it (to version 2 here)
/// and keeps the instance already on 2; only the one on version 1 is marked.
#[tokio::test]
async fn skip_matching_resolves_latest_and_leaves_the_instance_already_on_it() {
    let mut world = RefreshWorld::start(1).await;
    let current = "i-0b0000000000000c2";
    // Launched yesterday too, after the group moved to version 2.
    add_instance_launched_yesterday(&world.aws, &world.server, current);
    world
        .aws
        .ec2()
        .add_launch_template(FakeEc2LaunchTemplate::new("lt-0abc", "nodes", 1, 2));
    let autoscaling = world.aws.autoscaling();
    autoscaling
        .set_launch_template_version(GROUP, "$Latest")
        .unwrap();
    autoscaling
        .start_instance_refresh(
            GROUP,
            FakeRefreshPreferences::default()
                .healthy_percentage(100, 200)
                .instance_warmup(WARMUP)
                .skip_matching(true),
        )
        .unwrap();
    let started = world.next_event("Started").await;
    let answer = world.response_to(&started).await;
    assert_eq!(
        answer["plan"]["outdated"],
        serde_json::json!([world.old[0]]),
        "{answer}"
    );
    assert!(cordoned(&world.node_of(&world.old[0])));
    assert!(
        !cordoned(&world.node_of(current)),
        "the instance already on $Latest stays schedulable: {answer}"
    );
}
