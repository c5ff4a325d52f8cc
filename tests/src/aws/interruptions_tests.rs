//! Spot interruptions, rebalance recommendations, scheduled maintenance and state changes:
//! what the real EC2 client reads before and after, the events on the bus, and Auto
//! Scaling's part in an interruption.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    EventCode, Filter, InstanceLifecycleType, InstanceStateName, SpotInstanceState,
    SpotInstanceType, SummaryStatus,
};
use serde_json::{Value, json};

use crate::account::FakeAccount;
use crate::aws::{
    EventPattern, EventSubscription, FakeAutoScalingGroup, FakeAws, FakeAwsError, FakeInstance,
    FakeLifecycleHook, InstanceState, ScheduledEventCode, SpotInterruptionAction,
};

const SPOT: &str = "i-0a1b2c3d4e5f60718";
const ON_DEMAND: &str = "i-07e9ea9eb19a67337";
const GROUP: &str = "spot-nodes";
const STATE_CHANGE: &str = "EC2 Instance State-change Notification";

async fn start() -> (FakeAws, aws_sdk_ec2::Client) {
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("interruptions-test");
    let aws = FakeAws::start(account).await.unwrap();
    let client = aws_sdk_ec2::Client::new(&aws.sdk_config(&credentials).await);
    (aws, client)
}

fn spot_instance(aws: &FakeAws, instance_id: &str) -> FakeInstance {
    FakeInstance::new(instance_id, &aws.account().region).spot()
}

fn rule(aws: &FakeAws, source: &str, detail_types: &[&str]) -> EventSubscription {
    aws.eventbridge().subscribe(EventPattern {
        sources: vec![source.to_owned()],
        detail_types: detail_types.iter().map(|t| (*t).to_owned()).collect(),
    })
}

/// The `state` of every waiting state-change event, in order.
fn states_announced(subscription: &mut EventSubscription) -> Vec<String> {
    std::iter::from_fn(|| subscription.try_next())
        .map(|event| event["detail"]["state"].as_str().unwrap().to_owned())
        .collect()
}

fn instance_filter(instance_id: &str) -> Filter {
    Filter::builder()
        .name("instance-id")
        .values(instance_id)
        .build()
}

#[tokio::test]
async fn the_sdk_reads_the_spot_request_fulfilled_then_marked_by_the_warning() {
    let (aws, client) = start().await;
    let launched = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    aws.ec2().add_instance(
        FakeInstance::new(SPOT, "eu-west-1")
            .availability_zone("eu-west-1b")
            .launch_time(launched)
            .spot(),
    );
    aws.ec2().add_running_instance(ON_DEMAND);

    let described = client.describe_instances().send().await.unwrap();
    let instances: Vec<_> = described
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .collect();
    let spot = instances
        .iter()
        .find(|i| i.instance_id() == Some(SPOT))
        .unwrap();
    assert_eq!(
        spot.instance_lifecycle(),
        Some(&InstanceLifecycleType::Spot)
    );
    let request_id = spot.spot_instance_request_id().unwrap().to_owned();
    assert!(
        request_id.starts_with("sir-") && request_id.len() == 12,
        "{request_id}"
    );
    let on_demand = instances
        .iter()
        .find(|i| i.instance_id() == Some(ON_DEMAND))
        .unwrap();
    assert_eq!(on_demand.instance_lifecycle(), None);
    assert_eq!(on_demand.spot_instance_request_id(), None);

    let before = client
        .describe_spot_instance_requests()
        .filters(instance_filter(SPOT))
        .send()
        .await
        .unwrap();
    let [request] = before.spot_instance_requests() else {
        panic!("one request: {before:?}");
    };
    assert_eq!(
        request.spot_instance_request_id(),
        Some(request_id.as_str())
    );
    assert_eq!(request.instance_id(), Some(SPOT));
    assert_eq!(request.state(), Some(&SpotInstanceState::Active));
    assert_eq!(request.r#type(), Some(&SpotInstanceType::OneTime));
    assert_eq!(request.launched_availability_zone(), Some("eu-west-1b"));
    let status = request.status().unwrap();
    assert_eq!(status.code(), Some("fulfilled"));
    assert!(status.message().is_some_and(|m| !m.is_empty()));
    assert_eq!(
        status.update_time().map(|t| t.secs()),
        Some(launched.as_second())
    );

    aws.interruptions()
        .spot_interruption(SPOT, SpotInterruptionAction::Terminate)
        .unwrap();
    let after = client
        .describe_spot_instance_requests()
        .spot_instance_request_ids(&request_id)
        .send()
        .await
        .unwrap();
    let [request] = after.spot_instance_requests() else {
        panic!("one request: {after:?}");
    };
    let status = request.status().unwrap();
    assert_eq!(status.code(), Some("marked-for-termination"));
    assert!(status.update_time().unwrap().secs() > launched.as_second());
    assert_eq!(request.state(), Some(&SpotInstanceState::Active));
    // The warning alone takes nothing away.
    assert_eq!(
        aws.ec2().instance(SPOT).unwrap().state,
        InstanceState::Running
    );

    let unknown = client
        .describe_spot_instance_requests()
        .spot_instance_request_ids("sir-00000000")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        unknown.code(),
        Some("InvalidSpotInstanceRequestID.NotFound")
    );
    let on_demand_requests = client
        .describe_spot_instance_requests()
        .filters(instance_filter(ON_DEMAND))
        .send()
        .await
        .unwrap();
    assert!(on_demand_requests.spot_instance_requests().is_empty());

    for (instance_id, action, code) in [
        (
            "i-0b1b2c3d4e5f60719",
            SpotInterruptionAction::Stop,
            "marked-for-stop",
        ),
        (
            "i-0c1b2c3d4e5f6071a",
            SpotInterruptionAction::Hibernate,
            "marked-for-hibernation",
        ),
    ] {
        aws.ec2().add_instance(spot_instance(&aws, instance_id));
        aws.interruptions()
            .spot_interruption(instance_id, action)
            .unwrap();
        let request = aws.ec2().instance(instance_id).unwrap().spot_request;
        assert_eq!(request.unwrap().status_code, code);
    }
}

/// The sweep's scan for lost AWS Health events, through the SDK adapter: one account-wide
/// `DescribeInstanceStatus` by event code lists the running instances with a scheduled
/// event, not those without one nor a stopped one.
#[tokio::test]
async fn the_sweeps_scan_lists_the_running_instances_with_scheduled_events() {
    use node_manager::aws::InstanceNoticesBatch;
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("scan-test");
    let aws = FakeAws::start(account).await.unwrap();
    let instances = node_manager::aws::sdk::SdkInstances::new(&aws.sdk_config(&credentials).await);
    const STOPPED: &str = "i-0b1b2c3d4e5f60719";
    const QUIET: &str = "i-0c1b2c3d4e5f6071a";
    aws.ec2().add_running_instance(ON_DEMAND);
    aws.ec2().add_running_instance(QUIET);
    aws.ec2()
        .add_instance(FakeInstance::new(STOPPED, "eu-west-1").state(InstanceState::Stopped));
    let not_before: jiff::Timestamp = "2030-03-14T20:00:00Z".parse().unwrap();
    let not_after: jiff::Timestamp = "2030-03-14T22:00:00Z".parse().unwrap();
    for (instance, code) in [
        (ON_DEMAND, ScheduledEventCode::SystemReboot),
        (STOPPED, ScheduledEventCode::InstanceRetirement),
    ] {
        aws.interruptions()
            .schedule_maintenance(instance, code, not_before, not_after)
            .unwrap();
    }

    let found = instances.instances_with_scheduled_events().await.unwrap();
    assert_eq!(found.keys().collect::<Vec<_>>(), [ON_DEMAND], "{found:?}");
    let [event] = found[ON_DEMAND].as_slice() else {
        panic!("one event: {found:?}");
    };
    assert_eq!(event.code, "system-reboot");
    assert_eq!(event.not_before, Some(not_before));
    assert!(event.is_pending());
}

#[tokio::test]
async fn the_sdk_reads_scheduled_events_of_running_instances_unless_all_are_asked_for() {
    let (aws, client) = start().await;
    const STOPPED: &str = "i-0b1b2c3d4e5f60719";
    aws.ec2().add_running_instance(ON_DEMAND);
    aws.ec2()
        .add_instance(FakeInstance::new(STOPPED, "eu-west-1").state(InstanceState::Stopped));

    let before = client.describe_instance_status().send().await.unwrap();
    let [status] = before.instance_statuses() else {
        panic!("only the running instance: {before:?}");
    };
    assert_eq!(status.instance_id(), Some(ON_DEMAND));
    assert_eq!(status.availability_zone(), Some("eu-west-1a"));
    assert_eq!(
        status.instance_state().and_then(|s| s.name()),
        Some(&InstanceStateName::Running)
    );
    assert_eq!(
        status.instance_status().and_then(|s| s.status()),
        Some(&SummaryStatus::Ok)
    );
    assert_eq!(
        status.system_status().and_then(|s| s.status()),
        Some(&SummaryStatus::Ok)
    );
    assert!(status.events().is_empty());

    let not_before: jiff::Timestamp = "2030-03-14T20:00:00Z".parse().unwrap();
    let not_after: jiff::Timestamp = "2030-03-14T22:00:00Z".parse().unwrap();
    let interruptions = aws.interruptions();
    interruptions
        .schedule_maintenance(
            ON_DEMAND,
            ScheduledEventCode::InstanceRetirement,
            not_before,
            not_after,
        )
        .unwrap();
    interruptions
        .schedule_maintenance(
            STOPPED,
            ScheduledEventCode::SystemReboot,
            not_before,
            not_after,
        )
        .unwrap();

    let after = client
        .describe_instance_status()
        .instance_ids(ON_DEMAND)
        .send()
        .await
        .unwrap();
    let [status] = after.instance_statuses() else {
        panic!("one status: {after:?}");
    };
    let [event] = status.events() else {
        panic!("one event: {status:?}");
    };
    assert_eq!(event.code(), Some(&EventCode::InstanceRetirement));
    assert!(
        event
            .instance_event_id()
            .is_some_and(|id| id.starts_with("instance-event-") && id.len() == 32),
        "{event:?}"
    );
    assert_eq!(
        event.description(),
        Some("The instance is running on degraded hardware")
    );
    assert_eq!(
        event.not_before().map(|t| t.secs()),
        Some(not_before.as_second())
    );
    assert_eq!(
        event.not_after().map(|t| t.secs()),
        Some(not_after.as_second())
    );
    assert_eq!(
        event.not_before_deadline().map(|t| t.secs()),
        Some(not_before.as_second() + 21 * 24 * 3600)
    );

    let running_only = client
        .describe_instance_status()
        .instance_ids(STOPPED)
        .send()
        .await
        .unwrap();
    assert!(running_only.instance_statuses().is_empty());
    let all = client
        .describe_instance_status()
        .instance_ids(STOPPED)
        .include_all_instances(true)
        .send()
        .await
        .unwrap();
    let [stopped] = all.instance_statuses() else {
        panic!("the stopped instance: {all:?}");
    };
    assert_eq!(
        stopped.instance_state().and_then(|s| s.name()),
        Some(&InstanceStateName::Stopped)
    );
    assert_eq!(
        stopped.instance_status().and_then(|s| s.status()),
        Some(&SummaryStatus::NotApplicable)
    );
    assert_eq!(
        stopped
            .events()
            .iter()
            .map(|e| e.code())
            .collect::<Vec<_>>(),
        [Some(&EventCode::SystemReboot)]
    );
    let everything = client
        .describe_instance_status()
        .include_all_instances(true)
        .send()
        .await
        .unwrap();
    assert_eq!(everything.instance_statuses().len(), 2);

    let unknown = client
        .describe_instance_status()
        .instance_ids("i-0000000000000000f")
        .send()
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Some("InvalidInstanceID.NotFound"));
    assert_eq!(
        unknown.message(),
        Some("The instance ID 'i-0000000000000000f' does not exist")
    );
}

#[tokio::test]
async fn the_interruption_warning_and_the_rebalance_recommendation_reach_an_aws_ec2_rule() {
    let (aws, _) = start().await;
    aws.ec2().add_instance(spot_instance(&aws, SPOT));
    aws.ec2().add_running_instance(ON_DEMAND);
    let mut ec2_rule = rule(&aws, "aws.ec2", &[]);
    let mut health_rule = rule(&aws, "aws.health", &[]);
    let interruptions = aws.interruptions();

    let warning = interruptions
        .spot_interruption(SPOT, SpotInterruptionAction::Terminate)
        .unwrap();
    assert_eq!(ec2_rule.try_next().as_ref(), Some(&warning));
    assert_eq!(warning["version"], "0");
    assert_eq!(
        warning["detail-type"],
        "EC2 Spot Instance Interruption Warning"
    );
    assert_eq!(warning["source"], "aws.ec2");
    assert_eq!(warning["account"], "111111111111");
    assert_eq!(warning["region"], "eu-west-1");
    assert_eq!(
        warning["resources"],
        json!([format!(
            "arn:aws:ec2:eu-west-1:111111111111:instance/{SPOT}"
        )])
    );
    assert_eq!(
        warning["detail"],
        json!({"instance-id": SPOT, "instance-action": "terminate"})
    );
    let time = warning["time"].as_str().unwrap();
    assert!(time.ends_with('Z') && !time.contains('.'), "{time}");

    let rebalance = interruptions.rebalance_recommendation(SPOT).unwrap();
    assert_eq!(ec2_rule.try_next().as_ref(), Some(&rebalance));
    assert_eq!(
        rebalance["detail-type"],
        "EC2 Instance Rebalance Recommendation"
    );
    assert_eq!(rebalance["source"], "aws.ec2");
    assert_eq!(rebalance["resources"], warning["resources"]);
    assert_eq!(rebalance["detail"], json!({"instance-id": SPOT}));
    assert!(health_rule.try_next().is_none());

    assert!(matches!(
        interruptions.spot_interruption(ON_DEMAND, SpotInterruptionAction::Stop),
        Err(FakeAwsError::NotSpot(id)) if id == ON_DEMAND
    ));
    assert!(matches!(
        interruptions.rebalance_recommendation(ON_DEMAND),
        Err(FakeAwsError::NotSpot(_))
    ));
    assert!(matches!(
        interruptions.spot_interruption("i-0000000000000000f", SpotInterruptionAction::Terminate),
        Err(FakeAwsError::UnknownInstance(_))
    ));
    assert!(
        ec2_rule.try_next().is_none(),
        "a refused call emits nothing"
    );
}

#[tokio::test]
async fn scheduled_maintenance_is_an_aws_health_event_with_rfc_2822_times() {
    let (aws, _) = start().await;
    aws.ec2().add_running_instance(ON_DEMAND);
    let mut health_rule = rule(&aws, "aws.health", &["AWS Health Event"]);
    let not_before: jiff::Timestamp = "2030-06-05T15:10:09.500Z".parse().unwrap();
    let not_after: jiff::Timestamp = "2030-06-05T17:00:00Z".parse().unwrap();

    for (code, type_code) in [
        (
            ScheduledEventCode::InstanceRetirement,
            "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        ),
        (
            ScheduledEventCode::InstanceStop,
            "AWS_EC2_INSTANCE_STOP_SCHEDULED",
        ),
        (
            ScheduledEventCode::InstanceReboot,
            "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
        ),
        (
            ScheduledEventCode::SystemReboot,
            "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
        ),
        (
            ScheduledEventCode::SystemMaintenance,
            "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED",
        ),
    ] {
        let event = aws
            .interruptions()
            .schedule_maintenance(ON_DEMAND, code, not_before, not_after)
            .unwrap();
        assert_eq!(health_rule.try_next().as_ref(), Some(&event));
        assert_eq!(event["source"], "aws.health");
        assert_eq!(event["detail-type"], "AWS Health Event");
        assert_eq!(event["resources"], json!([ON_DEMAND]));
        let detail = &event["detail"];
        assert_eq!(detail["eventTypeCode"], type_code);
        assert!(
            detail["eventArn"]
                .as_str()
                .is_some_and(|arn| arn
                    .starts_with(&format!("arn:aws:health:eu-west-1::event/EC2/{type_code}/"))),
            "{detail}"
        );
        assert_eq!(detail["service"], "EC2");
        assert_eq!(detail["eventTypeCategory"], "scheduledChange");
        assert_eq!(detail["startTime"], "Wed, 05 Jun 2030 15:10:09 GMT");
        assert_eq!(detail["endTime"], "Wed, 05 Jun 2030 17:00:00 GMT");
        let start = jiff::fmt::rfc2822::parse(detail["startTime"].as_str().unwrap()).unwrap();
        assert_eq!(start.timestamp().as_second(), not_before.as_second());
        assert_eq!(detail["eventDescription"][0]["language"], "en_US");
        assert!(
            detail["eventDescription"][0]["latestDescription"]
                .as_str()
                .is_some_and(|text| text.contains(code.as_str())),
            "{detail}"
        );
        assert_eq!(
            detail["affectedEntities"],
            json!([{"entityValue": ON_DEMAND}])
        );
    }
    let scheduled = aws.ec2().instance(ON_DEMAND).unwrap().scheduled_events;
    assert_eq!(scheduled.len(), 5);

    assert!(matches!(
        aws.interruptions().schedule_maintenance(
            "i-0000000000000000f",
            ScheduledEventCode::InstanceReboot,
            not_before,
            not_after
        ),
        Err(FakeAwsError::UnknownInstance(_))
    ));
    assert!(health_rule.try_next().is_none());
}

#[tokio::test]
async fn set_state_announces_each_change_of_state_once() {
    let (aws, _) = start().await;
    let mut state_changes = rule(&aws, "aws.ec2", &[STATE_CHANGE]);
    let ec2 = aws.ec2();
    ec2.add_running_instance(ON_DEMAND);

    for state in [
        InstanceState::Stopping,
        InstanceState::Stopping,
        InstanceState::Stopped,
        InstanceState::Running,
    ] {
        ec2.set_state(ON_DEMAND, state);
    }
    ec2.set_state("i-0000000000000000f", InstanceState::Stopped);

    let events: Vec<Value> = std::iter::from_fn(|| state_changes.try_next()).collect();
    let states: Vec<&str> = events
        .iter()
        .map(|e| e["detail"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["stopping", "stopped", "running"]);
    for event in &events {
        assert_eq!(event["source"], "aws.ec2");
        assert_eq!(event["detail"]["instance-id"], ON_DEMAND);
        assert_eq!(
            event["resources"],
            json!([format!(
                "arn:aws:ec2:eu-west-1:111111111111:instance/{ON_DEMAND}"
            )])
        );
    }
}

#[tokio::test]
async fn a_spot_instance_in_a_group_is_notified_at_the_warning_and_terminated_after_the_notice() {
    let (aws, client) = start().await;
    const SCALED_IN: &str = "i-0b1b2c3d4e5f60719";
    let topic = aws.sns().create_topic("spot-lifecycle");
    let mut notifications = aws.sns().subscribe(&topic).unwrap();
    let autoscaling = aws.autoscaling();
    // The two-minute notice runs in 1.2 s (time enough to look before it runs out); the
    // hour-long hook stays waiting throughout.
    autoscaling.set_time_scale(0.01);
    autoscaling.add_group(FakeAutoScalingGroup::new(GROUP).size(0, 2, 3));
    autoscaling
        .add_hook(
            GROUP,
            FakeLifecycleHook::terminating("drain")
                .heartbeat_timeout(Duration::from_secs(3600))
                .notification_target(&topic),
        )
        .unwrap();
    for id in [SPOT, SCALED_IN] {
        aws.ec2().add_instance(spot_instance(&aws, id));
        autoscaling.add_instance(GROUP, id, "eu-west-1a").unwrap();
    }
    let mut state_changes = rule(&aws, "aws.ec2", &[STATE_CHANGE]);
    let started = tokio::time::Instant::now();

    let interruption = aws
        .interruptions()
        .spot_interruption_carried_out(
            SPOT,
            SpotInterruptionAction::Terminate,
            Duration::from_secs(120),
        )
        .unwrap();

    assert_eq!(interruption.carried_out_after, Duration::from_millis(1200));
    assert_eq!(interruption.group_name.as_deref(), Some(GROUP));
    assert_eq!(
        interruption.warning["detail-type"],
        "EC2 Spot Instance Interruption Warning"
    );
    let notice = interruption.lifecycle_notice.unwrap();
    let delivered = notifications.try_next().expect("the hook's notification");
    let message: Value =
        serde_json::from_str(delivered["Records"][0]["Sns"]["Message"].as_str().unwrap()).unwrap();
    assert_eq!(
        message["LifecycleTransition"],
        "autoscaling:EC2_INSTANCE_TERMINATING"
    );
    assert_eq!(message["EC2InstanceId"], SPOT);
    assert_eq!(message["AutoScalingGroupName"], GROUP);
    assert_eq!(message["LifecycleHookName"], "drain");
    assert_eq!(message["LifecycleActionToken"], notice.token.as_str());
    assert_eq!(
        autoscaling.instance_state(GROUP, SPOT).as_deref(),
        Some("Terminating:Wait")
    );
    // The same notification a scale-in sends, field for field but the ids and times.
    autoscaling.terminate_instance(GROUP, SCALED_IN).unwrap();
    let scale_in: Value = serde_json::from_str(
        notifications.try_next().unwrap()["Records"][0]["Sns"]["Message"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let keys =
        |message: &Value| -> Vec<String> { message.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&message), keys(&scale_in));
    for same in ["Origin", "Destination", "Service", "LifecycleTransition"] {
        assert_eq!(message[same], scale_in[same], "{same}");
    }
    // EC2 still runs the instance until the notice runs out.
    assert_eq!(
        aws.ec2().instance(SPOT).unwrap().state,
        InstanceState::Running
    );
    assert!(state_changes.try_next().is_none());

    let mut announced = Vec::new();
    while announced.len() < 2 {
        let event = state_changes
            .next_event(Duration::from_secs(5))
            .await
            .expect("EC2 reclaims the instance after the notice");
        assert_eq!(event["detail"]["instance-id"], SPOT);
        announced.push(event["detail"]["state"].as_str().unwrap().to_owned());
    }
    assert!(started.elapsed() >= Duration::from_millis(1200));
    assert_eq!(announced, ["shutting-down", "terminated"]);

    let described = client
        .describe_instances()
        .instance_ids(SPOT)
        .send()
        .await
        .unwrap();
    let instance = &described.reservations()[0].instances()[0];
    assert_eq!(
        instance.state().and_then(|s| s.name()),
        Some(&InstanceStateName::Terminated)
    );
    let requests = client
        .describe_spot_instance_requests()
        .filters(instance_filter(SPOT))
        .send()
        .await
        .unwrap();
    let request = &requests.spot_instance_requests()[0];
    assert_eq!(request.state(), Some(&SpotInstanceState::Closed));
    assert_eq!(
        request.status().and_then(|s| s.code()),
        Some("instance-terminated-no-capacity")
    );
    // Auto Scaling's action goes on until completed or timed out, as on AWS.
    assert!(autoscaling.has_active_action(SPOT));
}

#[tokio::test]
async fn a_group_without_a_terminating_hook_lets_the_interrupted_instance_go_at_the_warning() {
    let (aws, _) = start().await;
    let autoscaling = aws.autoscaling();
    autoscaling.add_group(FakeAutoScalingGroup::new(GROUP).size(0, 1, 2));
    aws.ec2().add_instance(spot_instance(&aws, SPOT));
    autoscaling.add_instance(GROUP, SPOT, "eu-west-1a").unwrap();
    let departed = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&departed);
    autoscaling.on_instance_terminated(Arc::new(move |id: &str| {
        record.lock().unwrap().push(id.to_owned());
    }));
    let mut state_changes = rule(&aws, "aws.ec2", &[STATE_CHANGE]);
    let interruptions = aws.interruptions();

    assert!(matches!(
        interruptions.spot_interruption_carried_out(
            SPOT,
            SpotInterruptionAction::Stop,
            Duration::ZERO
        ),
        Err(FakeAwsError::GroupOnlyTerminates { group, .. }) if group == GROUP
    ));
    assert_eq!(
        aws.ec2()
            .instance(SPOT)
            .unwrap()
            .spot_request
            .unwrap()
            .status_code,
        "fulfilled",
        "a refused interruption leaves the request alone"
    );

    let interruption = interruptions
        .spot_interruption_carried_out(
            SPOT,
            SpotInterruptionAction::Terminate,
            Duration::from_millis(50),
        )
        .unwrap();
    assert_eq!(interruption.lifecycle_notice, None);
    assert_eq!(autoscaling.instance_state(GROUP, SPOT), None);
    assert_eq!(*departed.lock().unwrap(), [SPOT]);
    assert_eq!(
        states_announced(&mut state_changes),
        ["shutting-down", "terminated"]
    );
    // Already gone when the notice runs out: EC2 has nothing left to reclaim.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(state_changes.try_next().is_none());
    assert_eq!(
        aws.ec2()
            .instance(SPOT)
            .unwrap()
            .spot_request
            .unwrap()
            .status_code,
        "marked-for-termination"
    );
}

#[tokio::test]
async fn a_stop_interruption_outside_a_group_stops_the_instance_after_the_notice() {
    let (aws, client) = start().await;
    aws.ec2().add_instance(spot_instance(&aws, SPOT));
    let mut state_changes = rule(&aws, "aws.ec2", &[STATE_CHANGE]);

    let interruption = aws
        .interruptions()
        .spot_interruption_carried_out(
            SPOT,
            SpotInterruptionAction::Stop,
            Duration::from_millis(500),
        )
        .unwrap();
    assert_eq!(interruption.group_name, None);
    assert_eq!(interruption.warning["detail"]["instance-action"], "stop");
    assert!(state_changes.try_next().is_none());

    let stopping = state_changes.next_event(Duration::from_secs(5)).await;
    assert_eq!(stopping.unwrap()["detail"]["state"], "stopping");
    assert_eq!(states_announced(&mut state_changes), ["stopped"]);
    let requests = client
        .describe_spot_instance_requests()
        .filters(instance_filter(SPOT))
        .send()
        .await
        .unwrap();
    let request = &requests.spot_instance_requests()[0];
    assert_eq!(request.state(), Some(&SpotInstanceState::Disabled));
    assert_eq!(
        request.status().and_then(|s| s.code()),
        Some("instance-stopped-no-capacity")
    );
}

/// A stop and a start move `LaunchTime` forward (node repair's grace counts from it) but not
/// the first launch the instance refresh reads (its primary network interface's attach
/// time): Auto Scaling still replaces an instance launched before the refresh started.
#[tokio::test]
async fn a_stop_and_start_moves_the_launch_time_but_not_the_first_launch() {
    use node_manager::aws::{RefreshInstances, RepairInstances};
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("launch-times-test");
    let aws = FakeAws::start(account).await.unwrap();
    let instances = node_manager::aws::sdk::SdkInstances::new(&aws.sdk_config(&credentials).await);
    const RESTARTED: &str = "i-0d1b2c3d4e5f6071b";
    let hour_ago: jiff::Timestamp =
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() - 3600).unwrap();
    aws.ec2()
        .add_instance(FakeInstance::new(RESTARTED, "eu-west-1").launch_time(hour_ago));
    aws.ec2().set_state(RESTARTED, InstanceState::Stopped);
    aws.ec2().set_state(RESTARTED, InstanceState::Running);
    let ids = [RESTARTED.to_owned()];

    let first = RefreshInstances::launch_times(&instances, &ids)
        .await
        .unwrap();
    let last = RepairInstances::launch_times(&instances, &ids)
        .await
        .unwrap();
    assert_eq!(first.get(RESTARTED), Some(&hour_ago), "{first:?}");
    assert!(
        last.get(RESTARTED).is_some_and(|at| *at > hour_ago),
        "LaunchTime moved on the start: {last:?}"
    );
}
