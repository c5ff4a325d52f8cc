//! The SDK adapters, checked at the request level with aws-smithy-mocks: the right fields
//! go out, and real-shaped service answers (including error bodies) come back as the
//! domain outcome they mean.
#![allow(clippy::unwrap_used)]

use aws_smithy_mocks::{RuleMode, mock, mock_client};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use node_manager::aws::sdk::{SdkAutoScaling, SdkEks, SdkInstances, SdkNotifications};
use node_manager::aws::*;

fn http_response(status: u16, body: &'static str) -> aws_smithy_runtime_api::http::Response {
    aws_smithy_runtime_api::http::Response::new(
        StatusCode::try_from(status).unwrap(),
        SdkBody::from(body),
    )
}

fn action() -> LifecycleActionRef {
    LifecycleActionRef {
        auto_scaling_group_name: "eks-demo-ng-02c1ba5d".into(),
        lifecycle_hook_name: "Terminate-LC-Hook".into(),
        instance_id: "i-07e9ea9eb19a67337".into(),
        token: "c613620e-07e2-4ed2-a9e2-ef8258911ade".into(),
    }
}

const NO_ACTIVE_ACTION_XML: &str = r#"<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
  <Error>
    <Type>Sender</Type>
    <Code>ValidationError</Code>
    <Message>No active Lifecycle Action found with instance ID i-07e9ea9eb19a67337</Message>
  </Error>
  <RequestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestId>
</ErrorResponse>"#;

const THROTTLED_XML: &str = r#"<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
  <Error><Type>Sender</Type><Code>AccessDenied</Code><Message>User is not authorized</Message></Error>
  <RequestId>1</RequestId>
</ErrorResponse>"#;

#[tokio::test]
async fn complete_sends_every_field_and_result() {
    use aws_sdk_autoscaling::operation::complete_lifecycle_action::CompleteLifecycleActionOutput;
    let rule = mock!(aws_sdk_autoscaling::Client::complete_lifecycle_action)
        .match_requests(|r| {
            r.auto_scaling_group_name() == Some("eks-demo-ng-02c1ba5d")
                && r.lifecycle_hook_name() == Some("Terminate-LC-Hook")
                && r.instance_id() == Some("i-07e9ea9eb19a67337")
                && r.lifecycle_action_token() == Some("c613620e-07e2-4ed2-a9e2-ef8258911ade")
                && r.lifecycle_action_result() == Some("CONTINUE")
        })
        .then_output(|| CompleteLifecycleActionOutput::builder().build());
    let client = mock_client!(aws_sdk_autoscaling, RuleMode::MatchAny, [&rule]);
    let outcome = SdkAutoScaling::from_client(client)
        .complete_lifecycle_action(&action(), LifecycleActionResult::Continue)
        .await
        .unwrap();
    assert_eq!(outcome, CompletionOutcome::Completed);
    assert_eq!(rule.num_calls(), 1);
}

#[tokio::test]
async fn no_active_lifecycle_action_means_already_done() {
    let complete = mock!(aws_sdk_autoscaling::Client::complete_lifecycle_action)
        .then_http_response(|| http_response(400, NO_ACTIVE_ACTION_XML));
    let heartbeat = mock!(aws_sdk_autoscaling::Client::record_lifecycle_action_heartbeat)
        .then_http_response(|| http_response(400, NO_ACTIVE_ACTION_XML));
    let client = mock_client!(
        aws_sdk_autoscaling,
        RuleMode::MatchAny,
        [&complete, &heartbeat]
    );
    let asg = SdkAutoScaling::from_client(client);
    assert_eq!(
        asg.complete_lifecycle_action(&action(), LifecycleActionResult::Continue)
            .await
            .unwrap(),
        CompletionOutcome::NoActiveAction
    );
    assert_eq!(
        asg.record_lifecycle_action_heartbeat(&action())
            .await
            .unwrap(),
        HeartbeatOutcome::NoActiveAction
    );
}

#[tokio::test]
async fn access_denied_is_not_retryable_and_keeps_the_code() {
    let complete = mock!(aws_sdk_autoscaling::Client::complete_lifecycle_action)
        .then_http_response(|| http_response(403, THROTTLED_XML));
    let client = mock_client!(aws_sdk_autoscaling, RuleMode::MatchAny, [&complete]);
    let error = SdkAutoScaling::from_client(client)
        .complete_lifecycle_action(&action(), LifecycleActionResult::Abandon)
        .await
        .unwrap_err();
    assert_eq!(error.kind, AwsErrorKind::AccessDenied);
    assert_eq!(error.code.as_deref(), Some("AccessDenied"));
    assert!(!error.is_retryable());
    assert!(error.to_string().contains("CompleteLifecycleAction"));
}

#[tokio::test]
async fn describe_hook_applies_documented_defaults() {
    use aws_sdk_autoscaling::operation::describe_lifecycle_hooks::DescribeLifecycleHooksOutput;
    use aws_sdk_autoscaling::types::LifecycleHook as SdkHook;
    let rule = mock!(aws_sdk_autoscaling::Client::describe_lifecycle_hooks)
        .match_requests(|r| r.lifecycle_hook_names() == ["Terminate-LC-Hook".to_owned()])
        .then_output(|| {
            DescribeLifecycleHooksOutput::builder()
                .lifecycle_hooks(
                    SdkHook::builder()
                        .lifecycle_hook_name("Terminate-LC-Hook")
                        .lifecycle_transition("autoscaling:EC2_INSTANCE_TERMINATING")
                        .heartbeat_timeout(1800)
                        .default_result("CONTINUE")
                        .build(),
                )
                .build()
        });
    let client = mock_client!(aws_sdk_autoscaling, RuleMode::MatchAny, [&rule]);
    let hook = SdkAutoScaling::from_client(client)
        .describe_lifecycle_hook("eks-demo-ng-02c1ba5d", "Terminate-LC-Hook")
        .await
        .unwrap()
        .expect("hook");
    assert_eq!(hook.heartbeat_timeout.as_secs(), 1800);
    // No GlobalTimeout in the answer: 100 x heartbeat, capped at 48 hours.
    assert_eq!(hook.global_timeout.as_secs(), 172_800);
    assert_eq!(hook.default_result, LifecycleActionResult::Continue);
}

#[tokio::test]
async fn group_tags_of_a_missing_group_are_none() {
    use aws_sdk_autoscaling::operation::describe_auto_scaling_groups::DescribeAutoScalingGroupsOutput;
    use aws_sdk_autoscaling::types::{AutoScalingGroup, TagDescription};
    let rule = mock!(aws_sdk_autoscaling::Client::describe_auto_scaling_groups)
        .match_requests(|r| r.auto_scaling_group_names() == ["present".to_owned()])
        .then_output(|| {
            DescribeAutoScalingGroupsOutput::builder()
                .auto_scaling_groups(
                    AutoScalingGroup::builder()
                        .auto_scaling_group_name("present")
                        .tags(
                            TagDescription::builder()
                                .key("eks:cluster-name")
                                .value("ironman-2022")
                                .build(),
                        )
                        .build(),
                )
                .build()
        });
    let empty = mock!(aws_sdk_autoscaling::Client::describe_auto_scaling_groups)
        .then_output(|| DescribeAutoScalingGroupsOutput::builder().build());
    let client = mock_client!(aws_sdk_autoscaling, RuleMode::MatchAny, [&rule, &empty]);
    let asg = SdkAutoScaling::from_client(client);
    let tags = asg.group_tags("present").await.unwrap().expect("group");
    assert_eq!(
        tags.get("eks:cluster-name").map(String::as_str),
        Some("ironman-2022")
    );
    assert_eq!(asg.group_tags("absent").await.unwrap(), None);
}

#[tokio::test]
async fn private_dns_name_of_unknown_instance_is_none() {
    const NOT_FOUND: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>The instance ID 'i-0000' does not exist</Message></Error></Errors><RequestID>r</RequestID></Response>"#;
    use aws_sdk_ec2::operation::describe_instances::DescribeInstancesOutput;
    use aws_sdk_ec2::types::{Instance, Reservation};
    let known = mock!(aws_sdk_ec2::Client::describe_instances)
        .match_requests(|r| r.instance_ids() == ["i-1".to_owned()])
        .then_output(|| {
            DescribeInstancesOutput::builder()
                .reservations(
                    Reservation::builder()
                        .instances(
                            Instance::builder()
                                .instance_id("i-1")
                                .private_dns_name("ip-192-168-12-34.eu-west-1.compute.internal")
                                .build(),
                        )
                        .build(),
                )
                .build()
        });
    let unknown = mock!(aws_sdk_ec2::Client::describe_instances)
        .then_http_response(|| http_response(400, NOT_FOUND));
    let client = mock_client!(aws_sdk_ec2, RuleMode::MatchAny, [&known, &unknown]);
    let ec2 = SdkInstances::from_client(client);
    assert_eq!(
        ec2.private_dns_name("i-1").await.unwrap().as_deref(),
        Some("ip-192-168-12-34.eu-west-1.compute.internal")
    );
    assert_eq!(ec2.private_dns_name("i-0000").await.unwrap(), None);
}

#[tokio::test]
async fn publish_sends_topic_subject_and_message() {
    use aws_sdk_sns::operation::publish::PublishOutput;
    let rule = mock!(aws_sdk_sns::Client::publish)
        .match_requests(|r| {
            r.topic_arn() == Some("arn:aws:sns:eu-west-1:111111111111:topic")
                && r.subject() == Some("continue")
                && r.message() == Some("{\"a\":1}")
        })
        .then_output(|| PublishOutput::builder().message_id("m-1").build());
    let client = mock_client!(aws_sdk_sns, RuleMode::MatchAny, [&rule]);
    SdkNotifications::from_client(client)
        .publish(
            "arn:aws:sns:eu-west-1:111111111111:topic",
            Some("continue"),
            "{\"a\":1}",
        )
        .await
        .unwrap();
    assert_eq!(rule.num_calls(), 1);
}

#[tokio::test]
async fn describe_cluster_reads_endpoint_ca_and_mode() {
    const CLUSTER: &str = r#"{"cluster":{"name":"ironman-2022","arn":"arn:aws:eks:eu-west-1:111111111111:cluster/ironman-2022","endpoint":"https://ABC.gr7.eu-west-1.eks.amazonaws.com","certificateAuthority":{"data":"LS0tLS1CRUdJTg=="},"accessConfig":{"authenticationMode":"API_AND_CONFIG_MAP"},"status":"ACTIVE"}}"#;
    const LEGACY: &str = r#"{"cluster":{"name":"old","endpoint":"https://x","certificateAuthority":{"data":"Zm9v"}}}"#;
    const MISSING: &str = r#"{"message":"No cluster found for name: nope."}"#;
    let found = mock!(aws_sdk_eks::Client::describe_cluster)
        .match_requests(|r| r.name() == Some("ironman-2022"))
        .then_http_response(|| http_response(200, CLUSTER));
    let legacy = mock!(aws_sdk_eks::Client::describe_cluster)
        .match_requests(|r| r.name() == Some("old"))
        .then_http_response(|| http_response(200, LEGACY));
    let missing = mock!(aws_sdk_eks::Client::describe_cluster).then_http_response(|| {
        let mut response = http_response(404, MISSING);
        response
            .headers_mut()
            .insert("x-amzn-errortype", "ResourceNotFoundException");
        response
    });
    let client = mock_client!(aws_sdk_eks, RuleMode::MatchAny, [&found, &legacy, &missing]);
    let eks = SdkEks::from_client(client);
    let cluster = eks
        .describe_cluster("ironman-2022")
        .await
        .unwrap()
        .expect("cluster");
    assert_eq!(
        cluster.endpoint,
        "https://ABC.gr7.eu-west-1.eks.amazonaws.com"
    );
    assert_eq!(cluster.certificate_authority_data, "LS0tLS1CRUdJTg==");
    assert_eq!(
        cluster.authentication_mode,
        AuthenticationMode::ApiAndConfigMap
    );
    let old = eks.describe_cluster("old").await.unwrap().expect("cluster");
    assert_eq!(old.authentication_mode, AuthenticationMode::ConfigMap);
    assert_eq!(eks.describe_cluster("nope").await.unwrap(), None);
}

#[tokio::test]
async fn access_entries_already_there_and_absent() {
    const IN_USE: &str =
        r#"{"message":"The specified access entry resource is already in use on this cluster."}"#;
    let create = mock!(aws_sdk_eks::Client::create_access_entry)
        .match_requests(|r| r.r#type() == Some("EC2_WINDOWS"))
        .then_http_response(|| {
            let mut response = http_response(409, IN_USE);
            response
                .headers_mut()
                .insert("x-amzn-errortype", "ResourceInUseException");
            response
        });
    let delete = mock!(aws_sdk_eks::Client::delete_access_entry).then_http_response(|| {
        let mut response = http_response(404, r#"{"message":"not found"}"#);
        response
            .headers_mut()
            .insert("x-amzn-errortype", "ResourceNotFoundException");
        response
    });
    let client = mock_client!(aws_sdk_eks, RuleMode::MatchAny, [&create, &delete]);
    let eks = SdkEks::from_client(client);
    let arn = "arn:aws:iam::111111111111:role/win-node";
    assert_eq!(
        eks.create_access_entry("ironman-2022", arn, AccessEntryType::Ec2Windows)
            .await
            .unwrap(),
        AccessEntryCreation::AlreadyExists
    );
    assert!(!eks.delete_access_entry("ironman-2022", arn).await.unwrap());
}

#[tokio::test]
async fn list_nodegroups_follows_every_page() {
    use aws_sdk_eks::operation::list_nodegroups::ListNodegroupsOutput;
    let pages = mock!(aws_sdk_eks::Client::list_nodegroups)
        .sequence()
        .output(|| {
            ListNodegroupsOutput::builder()
                .nodegroups("a")
                .nodegroups("b")
                .next_token("page-2")
                .build()
        })
        .output(|| ListNodegroupsOutput::builder().nodegroups("c").build())
        .build();
    let client = mock_client!(aws_sdk_eks, RuleMode::Sequential, [&pages]);
    let names = SdkEks::from_client(client)
        .list_nodegroups("ironman-2022")
        .await
        .unwrap();
    assert_eq!(names, ["a", "b", "c"]);
}

/// A paged answer: the first page (no token in the request) names `page-2`; the second is
/// asked with that token. Each rule is checked to have served exactly one request.
fn first_page<I>(input: &I, next_token: impl Fn(&I) -> Option<&str>) -> bool {
    next_token(input).is_none()
}

fn second_page<I>(input: &I, next_token: impl Fn(&I) -> Option<&str>) -> bool {
    next_token(input) == Some("page-2")
}

fn filter_values<'a>(filters: &'a [aws_sdk_ec2::types::Filter], name: &str) -> &'a [String] {
    filters
        .iter()
        .find(|f| f.name() == Some(name))
        .map(|f| f.values())
        .unwrap_or_default()
}

#[tokio::test]
async fn interrupted_spot_instances_follow_every_page_with_the_same_filter() {
    use aws_sdk_ec2::operation::describe_spot_instance_requests::{
        DescribeSpotInstanceRequestsInput as In, DescribeSpotInstanceRequestsOutput as Out,
    };
    use aws_sdk_ec2::types::SpotInstanceRequest;
    let filtered = |r: &In| filter_values(r.filters(), "status-code") == SPOT_INTERRUPTION_CODES;
    let request = |id: &str| SpotInstanceRequest::builder().instance_id(id).build();
    let one = mock!(aws_sdk_ec2::Client::describe_spot_instance_requests)
        .match_requests(move |r| filtered(r) && first_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .spot_instance_requests(request("i-1"))
                .spot_instance_requests(request("i-2"))
                .next_token("page-2")
                .build()
        });
    let two = mock!(aws_sdk_ec2::Client::describe_spot_instance_requests)
        .match_requests(move |r| filtered(r) && second_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .spot_instance_requests(request("i-3"))
                .build()
        });
    let client = mock_client!(aws_sdk_ec2, RuleMode::MatchAny, [&one, &two]);
    let found = SdkInstances::from_client(client)
        .interrupted_spot_instances()
        .await
        .unwrap();
    assert_eq!(found, ["i-1", "i-2", "i-3"]);
    assert_eq!((one.num_calls(), two.num_calls()), (1, 1));
}

#[tokio::test]
async fn spot_request_statuses_follow_every_page_with_the_same_filter() {
    use aws_sdk_ec2::operation::describe_spot_instance_requests::{
        DescribeSpotInstanceRequestsInput as In, DescribeSpotInstanceRequestsOutput as Out,
    };
    use aws_sdk_ec2::types::{SpotInstanceRequest, SpotInstanceStatus};
    let ids = ["sir-1".to_owned(), "sir-2".to_owned()];
    let filtered =
        |r: &In| filter_values(r.filters(), "spot-instance-request-id") == ["sir-1", "sir-2"];
    let request = |id: &str, code: &str| {
        SpotInstanceRequest::builder()
            .spot_instance_request_id(id)
            .status(SpotInstanceStatus::builder().code(code).build())
            .build()
    };
    let one = mock!(aws_sdk_ec2::Client::describe_spot_instance_requests)
        .match_requests(move |r| filtered(r) && first_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .spot_instance_requests(request("sir-1", "fulfilled"))
                .next_token("page-2")
                .build()
        });
    let two = mock!(aws_sdk_ec2::Client::describe_spot_instance_requests)
        .match_requests(move |r| filtered(r) && second_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .spot_instance_requests(request("sir-2", "marked-for-stop"))
                .build()
        });
    let client = mock_client!(aws_sdk_ec2, RuleMode::MatchAny, [&one, &two]);
    let statuses = SdkInstances::from_client(client)
        .spot_request_statuses(&ids)
        .await
        .unwrap();
    assert_eq!(
        statuses,
        [
            ("sir-1".to_owned(), "fulfilled".to_owned()),
            ("sir-2".to_owned(), "marked-for-stop".to_owned())
        ]
        .into()
    );
    assert_eq!((one.num_calls(), two.num_calls()), (1, 1));
}

#[tokio::test]
async fn instances_with_scheduled_events_follow_every_page_with_the_same_filter() {
    use aws_sdk_ec2::operation::describe_instance_status::{
        DescribeInstanceStatusInput as In, DescribeInstanceStatusOutput as Out,
    };
    use aws_sdk_ec2::types::{EventCode, InstanceStatus, InstanceStatusEvent};
    let filtered = |r: &In| filter_values(r.filters(), "event.code") == SCHEDULED_EVENT_CODES;
    let status = |id: &str, code: EventCode| {
        InstanceStatus::builder()
            .instance_id(id)
            .events(
                InstanceStatusEvent::builder()
                    .code(code)
                    .description("scheduled")
                    .build(),
            )
            .build()
    };
    let one = mock!(aws_sdk_ec2::Client::describe_instance_status)
        .match_requests(move |r| filtered(r) && first_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .instance_statuses(status("i-1", EventCode::SystemReboot))
                .next_token("page-2")
                .build()
        });
    let two = mock!(aws_sdk_ec2::Client::describe_instance_status)
        .match_requests(move |r| filtered(r) && second_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .instance_statuses(status("i-2", EventCode::InstanceRetirement))
                .build()
        });
    let client = mock_client!(aws_sdk_ec2, RuleMode::MatchAny, [&one, &two]);
    let found = SdkInstances::from_client(client)
        .instances_with_scheduled_events()
        .await
        .unwrap();
    let codes: Vec<(&str, &str)> = found
        .iter()
        .flat_map(|(id, events)| events.iter().map(move |e| (id.as_str(), e.code.as_str())))
        .collect();
    assert_eq!(
        codes,
        [("i-1", "system-reboot"), ("i-2", "instance-retirement")]
    );
    assert_eq!((one.num_calls(), two.num_calls()), (1, 1));
}

#[tokio::test]
async fn instances_facts_follow_every_page_of_the_same_filter_and_page_size() {
    use aws_sdk_ec2::operation::describe_instances::{
        DescribeInstancesInput as In, DescribeInstancesOutput as Out,
    };
    use aws_sdk_ec2::types::{Instance, Reservation};
    let ids = ["i-1".to_owned(), "i-2".to_owned()];
    let filtered = |r: &In| {
        filter_values(r.filters(), "instance-id") == ["i-1", "i-2"] && r.max_results() == Some(1000)
    };
    let reservation = |id: &str| {
        Reservation::builder()
            .instances(Instance::builder().instance_id(id).build())
            .build()
    };
    let one = mock!(aws_sdk_ec2::Client::describe_instances)
        .match_requests(move |r| filtered(r) && first_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .reservations(reservation("i-1"))
                .next_token("page-2")
                .build()
        });
    let two = mock!(aws_sdk_ec2::Client::describe_instances)
        .match_requests(move |r| filtered(r) && second_page(r, In::next_token))
        .then_output(move || Out::builder().reservations(reservation("i-2")).build());
    let client = mock_client!(aws_sdk_ec2, RuleMode::MatchAny, [&one, &two]);
    let facts = SdkInstances::from_client(client)
        .instances_facts(&ids)
        .await
        .unwrap();
    assert_eq!(facts.keys().collect::<Vec<_>>(), ["i-1", "i-2"]);
    assert_eq!((one.num_calls(), two.num_calls()), (1, 1));
}

#[tokio::test]
async fn live_cluster_instances_page_until_the_limit_and_no_further() {
    use aws_sdk_ec2::operation::describe_instances::{
        DescribeInstancesInput as In, DescribeInstancesOutput as Out,
    };
    use aws_sdk_ec2::types::{Instance, Reservation};
    let by_cluster_tag = |r: &In| filter_values(r.filters(), "tag:eks:cluster-name") == ["demo"];
    fn reservation(ids: &[&str]) -> Reservation {
        let mut reservation = Reservation::builder();
        for id in ids {
            reservation = reservation.instances(Instance::builder().instance_id(*id).build());
        }
        reservation.build()
    }
    let one = mock!(aws_sdk_ec2::Client::describe_instances)
        .match_requests(move |r| by_cluster_tag(r) && first_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .reservations(reservation(&["i-1"]))
                .next_token("page-2")
                .build()
        });
    let two = mock!(aws_sdk_ec2::Client::describe_instances)
        .match_requests(move |r| by_cluster_tag(r) && second_page(r, In::next_token))
        .then_output(move || {
            Out::builder()
                .reservations(reservation(&["i-2", "i-3"]))
                .next_token("page-3")
                .build()
        });
    let beyond = mock!(aws_sdk_ec2::Client::describe_instances)
        .then_output(|| Out::builder().reservations(reservation(&["i-9"])).build());
    let client = mock_client!(aws_sdk_ec2, RuleMode::MatchAny, [&one, &two, &beyond]);
    let profiles = ["arn:aws:iam::111122223333:instance-profile/nodes".to_owned()];
    let found = SdkInstances::from_client(client)
        .live_cluster_instances_with_profiles("demo", &profiles, 2)
        .await
        .unwrap();
    assert_eq!(found, ["i-1", "i-2"]);
    assert_eq!(
        (one.num_calls(), two.num_calls(), beyond.num_calls()),
        (1, 1, 0),
        "no page is asked for once the limit is reached"
    );
}

#[tokio::test]
async fn group_instances_and_health_settings_follow_every_page() {
    use aws_sdk_autoscaling::operation::describe_auto_scaling_groups::{
        DescribeAutoScalingGroupsInput as GroupsIn, DescribeAutoScalingGroupsOutput as GroupsOut,
    };
    use aws_sdk_autoscaling::operation::describe_auto_scaling_instances::{
        DescribeAutoScalingInstancesInput as InstancesIn,
        DescribeAutoScalingInstancesOutput as InstancesOut,
    };
    use aws_sdk_autoscaling::types::{AutoScalingGroup, AutoScalingInstanceDetails};
    let instance = |id: &str| {
        AutoScalingInstanceDetails::builder()
            .instance_id(id)
            .auto_scaling_group_name("g")
            .lifecycle_state("InService")
            .health_status("HEALTHY")
            .build()
    };
    let asked = |r: &InstancesIn| r.instance_ids().len() == 2 && r.max_records() == Some(50);
    let instances_one = mock!(aws_sdk_autoscaling::Client::describe_auto_scaling_instances)
        .match_requests(move |r| asked(r) && first_page(r, InstancesIn::next_token))
        .then_output(move || {
            InstancesOut::builder()
                .auto_scaling_instances(instance("i-1"))
                .next_token("page-2")
                .build()
        });
    let instances_two = mock!(aws_sdk_autoscaling::Client::describe_auto_scaling_instances)
        .match_requests(move |r| asked(r) && second_page(r, InstancesIn::next_token))
        .then_output(move || {
            InstancesOut::builder()
                .auto_scaling_instances(instance("i-2"))
                .build()
        });
    let group = |name: &str| {
        AutoScalingGroup::builder()
            .auto_scaling_group_name(name)
            .build()
    };
    let groups_one = mock!(aws_sdk_autoscaling::Client::describe_auto_scaling_groups)
        .match_requests(|r| first_page(r, GroupsIn::next_token))
        .then_output(move || {
            GroupsOut::builder()
                .auto_scaling_groups(group("a"))
                .next_token("page-2")
                .build()
        });
    let groups_two = mock!(aws_sdk_autoscaling::Client::describe_auto_scaling_groups)
        .match_requests(|r| second_page(r, GroupsIn::next_token))
        .then_output(move || GroupsOut::builder().auto_scaling_groups(group("b")).build());
    let rules = [&instances_one, &instances_two, &groups_one, &groups_two];
    let client = mock_client!(aws_sdk_autoscaling, RuleMode::MatchAny, rules);
    let asg = SdkAutoScaling::from_client(client);
    let ids = ["i-1".to_owned(), "i-2".to_owned()];
    let instances = asg.describe_group_instances(&ids).await.unwrap();
    let found: Vec<&str> = instances.iter().map(|i| i.instance_id.as_str()).collect();
    assert_eq!(found, ["i-1", "i-2"]);
    let names = ["a".to_owned(), "b".to_owned()];
    let settings = asg.describe_group_health_settings(&names).await.unwrap();
    let found: Vec<&str> = settings.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(found, ["a", "b"]);
    for rule in rules {
        assert_eq!(rule.num_calls(), 1);
    }
}
