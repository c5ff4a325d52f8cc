//! The real AWS SDK for Rust clients against the fake AWS endpoints: every operation, the
//! error codes a function acts on, the lifecycle state machine, fault injection and the
//! request log. The clients are built from an ordinary `SdkConfig` (endpoint URL, static
//! credentials): no test-only code path.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use aws_sdk_autoscaling::config::http::HttpResponse;
use aws_sdk_autoscaling::error::{ProvideErrorMetadata, SdkError};
use aws_types::SdkConfig;
use node_manager::aws::LifecycleActionResult;
use node_manager_testkit::account::{AccessEntryLookup, FakeAccount, FakeCredentials};
use node_manager_testkit::aws::{
    AwsFault, CompletedBy, FakeAutoScalingGroup, FakeAws, FakeCluster, FakeInstance,
    FakeLifecycleHook, FakeNodegroup, InstanceState, Service, SubscriptionFilter,
};

const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
const INSTANCE: &str = "i-07e9ea9eb19a67337";

async fn start() -> (FakeAws, SdkConfig, FakeCredentials) {
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("node-manager-test");
    let aws = FakeAws::start(account).await.unwrap();
    let config = aws.sdk_config(&credentials).await;
    (aws, config, credentials)
}

/// The error code and HTTP status of a failed SDK call.
fn code_and_status<E: ProvideErrorMetadata>(error: &SdkError<E, HttpResponse>) -> (String, u16) {
    let status = error
        .raw_response()
        .map(|response| response.status().as_u16())
        .unwrap_or(0);
    (error.code().unwrap_or("<none>").to_owned(), status)
}

fn with_hooks(aws: &FakeAws, hook_timeout: Duration) -> String {
    let topic = aws.sns().create_topic("eks-asg-lifecycle-hook-topic");
    let autoscaling = aws.autoscaling();
    autoscaling.add_group(
        FakeAutoScalingGroup::new(GROUP)
            .availability_zones(&["eu-west-1a"])
            .tag("eks:cluster-name", "ironman-2022")
            .tag("eks:nodegroup-name", "demo-ng"),
    );
    autoscaling
        .add_hook(
            GROUP,
            FakeLifecycleHook::terminating("Terminate-LC-Hook")
                .heartbeat_timeout(hook_timeout)
                .default_result(LifecycleActionResult::Continue)
                .notification_target(&topic),
        )
        .unwrap();
    autoscaling
        .add_hook(
            GROUP,
            FakeLifecycleHook::launching("Launch-LC-Hook")
                .heartbeat_timeout(hook_timeout)
                .notification_target(&topic),
        )
        .unwrap();
    topic
}

#[tokio::test]
async fn auto_scaling_describes_groups_and_hooks() {
    let (aws, config, _) = start().await;
    with_hooks(&aws, Duration::from_secs(300));
    aws.autoscaling()
        .add_instance(GROUP, INSTANCE, "eu-west-1a")
        .unwrap();
    aws.autoscaling()
        .add_group(FakeAutoScalingGroup::new("other").tag("team", "x"));
    let client = aws_sdk_autoscaling::Client::new(&config);

    let groups = client
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(GROUP)
        .send()
        .await
        .unwrap();
    let group = &groups.auto_scaling_groups()[0];
    assert_eq!(groups.auto_scaling_groups().len(), 1);
    assert_eq!(group.auto_scaling_group_name(), Some(GROUP));
    let tags: Vec<(&str, &str)> = group
        .tags()
        .iter()
        .map(|t| (t.key().unwrap(), t.value().unwrap()))
        .collect();
    assert_eq!(
        tags,
        [
            ("eks:cluster-name", "ironman-2022"),
            ("eks:nodegroup-name", "demo-ng")
        ]
    );
    assert_eq!(group.instances()[0].instance_id(), Some(INSTANCE));
    assert_eq!(
        group.instances()[0].lifecycle_state().map(|s| s.as_str()),
        Some("InService")
    );

    let by_tag = client
        .describe_auto_scaling_groups()
        .filters(
            aws_sdk_autoscaling::types::Filter::builder()
                .name("tag:team")
                .values("x")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let names: Vec<_> = by_tag
        .auto_scaling_groups()
        .iter()
        .filter_map(|g| g.auto_scaling_group_name())
        .collect();
    assert_eq!(names, ["other"]);

    let hooks = client
        .describe_lifecycle_hooks()
        .auto_scaling_group_name(GROUP)
        .lifecycle_hook_names("Terminate-LC-Hook")
        .send()
        .await
        .unwrap();
    assert_eq!(hooks.lifecycle_hooks().len(), 1);
    let hook = &hooks.lifecycle_hooks()[0];
    assert_eq!(hook.heartbeat_timeout(), Some(300));
    assert_eq!(hook.global_timeout(), Some(30_000));
    assert_eq!(hook.default_result(), Some("CONTINUE"));
    assert_eq!(
        hook.lifecycle_transition(),
        Some("autoscaling:EC2_INSTANCE_TERMINATING")
    );

    let missing = client
        .describe_lifecycle_hooks()
        .auto_scaling_group_name("nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&missing),
        ("ValidationError".to_owned(), 400)
    );
}

#[tokio::test]
async fn lifecycle_actions_complete_once_and_report_no_active_action_afterwards() {
    let (aws, config, _) = start().await;
    let topic = with_hooks(&aws, Duration::from_secs(300));
    let mut subscription = aws.sns().subscribe(&topic).unwrap();
    let client = aws_sdk_autoscaling::Client::new(&config);

    let notice = aws
        .autoscaling()
        .terminate_instance(GROUP, INSTANCE)
        .unwrap();
    assert_eq!(notice.delivered_to.as_deref(), Some(topic.as_str()));
    assert_eq!(
        aws.autoscaling().instance_state(GROUP, INSTANCE).as_deref(),
        Some("Terminating:Wait")
    );
    let event = subscription
        .next_event(Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        event["Records"][0]["Sns"]["Message"],
        notice.message.as_str()
    );
    assert_eq!(
        event["Records"][0]["Sns"]["Subject"],
        notice.subject.as_str()
    );

    client
        .record_lifecycle_action_heartbeat()
        .auto_scaling_group_name(GROUP)
        .lifecycle_hook_name("Terminate-LC-Hook")
        .lifecycle_action_token(&notice.token)
        .send()
        .await
        .unwrap();
    let wrong_token = client
        .complete_lifecycle_action()
        .auto_scaling_group_name(GROUP)
        .lifecycle_hook_name("Terminate-LC-Hook")
        .lifecycle_action_token("00000000-0000-4000-8000-000000000000")
        .lifecycle_action_result("CONTINUE")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&wrong_token),
        ("ValidationError".to_owned(), 400)
    );
    assert_eq!(
        wrong_token.message(),
        Some("No active Lifecycle Action found with token 00000000-0000-4000-8000-000000000000")
    );

    client
        .complete_lifecycle_action()
        .auto_scaling_group_name(GROUP)
        .lifecycle_hook_name("Terminate-LC-Hook")
        .instance_id(INSTANCE)
        .lifecycle_action_result("CONTINUE")
        .send()
        .await
        .unwrap();
    let again = client
        .complete_lifecycle_action()
        .auto_scaling_group_name(GROUP)
        .lifecycle_hook_name("Terminate-LC-Hook")
        .instance_id(INSTANCE)
        .lifecycle_action_result("CONTINUE")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code_and_status(&again), ("ValidationError".to_owned(), 400));
    assert_eq!(
        again.message(),
        Some(format!("No active Lifecycle Action found with instance ID {INSTANCE}").as_str())
    );

    let completions = aws.autoscaling().completions();
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);
    assert_eq!(completions[0].by, CompletedBy::Call);
    assert_eq!(completions[0].heartbeats, 1);
    assert_eq!(aws.autoscaling().heartbeats().len(), 1);
    assert_eq!(aws.autoscaling().instance_state(GROUP, INSTANCE), None);
}

#[tokio::test]
async fn the_notification_has_the_fields_and_order_auto_scaling_sends() {
    let (aws, _, _) = start().await;
    with_hooks(&aws, Duration::from_secs(300));
    let fixture: serde_json::Value = serde_json::from_str(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/sns-lifecycle-terminating.json"
    )))
    .unwrap();
    let expected_message = fixture["Records"][0]["Sns"]["Message"].as_str().unwrap();
    let keys_of = |message: &str| -> Vec<String> {
        // Field order matters to nobody's parser, but it shows the message is AWS's shape.
        let mut keys = Vec::new();
        let mut rest = message;
        while let Some(start) = rest.find("\":") {
            let head = &rest[..start];
            if let Some(open) = head.rfind(['{', ',']) {
                keys.push(head[open + 2..].to_owned());
            }
            rest = &rest[start + 2..];
        }
        keys
    };
    let notice = aws
        .autoscaling()
        .terminate_instance(GROUP, INSTANCE)
        .unwrap();
    assert_eq!(keys_of(&notice.message), keys_of(expected_message));
    let message: serde_json::Value = serde_json::from_str(&notice.message).unwrap();
    assert_eq!(message["EC2InstanceId"], INSTANCE);
    assert_eq!(message["LifecycleActionToken"], notice.token.as_str());
    assert_eq!(message["AccountId"], "111111111111");
    assert_eq!(message["Origin"], "AutoScalingGroup");
    assert_eq!(
        notice.subject,
        format!(
            "Auto Scaling:  Lifecycle action 'TERMINATING' for instance {INSTANCE} in progress."
        )
    );
    let launch = aws
        .autoscaling()
        .launch_instance(GROUP, "i-0a1b2c3d4e5f60718")
        .unwrap();
    let message: serde_json::Value = serde_json::from_str(&launch.message).unwrap();
    assert_eq!(message["Origin"], "EC2");
    assert_eq!(
        message["LifecycleTransition"],
        "autoscaling:EC2_INSTANCE_LAUNCHING"
    );
}

#[tokio::test]
async fn heartbeats_extend_the_wait_until_the_default_result_is_applied() {
    let (aws, config, _) = start().await;
    with_hooks(&aws, Duration::from_secs(100));
    // 100 s → 400 ms: wide enough margins for a loaded 2-core machine.
    aws.autoscaling().set_time_scale(0.004);
    let client = aws_sdk_autoscaling::Client::new(&config);
    let notice = aws
        .autoscaling()
        .terminate_instance(GROUP, INSTANCE)
        .unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        client
            .record_lifecycle_action_heartbeat()
            .auto_scaling_group_name(GROUP)
            .lifecycle_hook_name("Terminate-LC-Hook")
            .lifecycle_action_token(&notice.token)
            .instance_id(INSTANCE)
            .send()
            .await
            .unwrap();
    }
    // 400 ms of heartbeats kept an action with a 400 ms heartbeat timeout alive.
    assert!(aws.autoscaling().has_active_action(INSTANCE));
    let completion = aws
        .autoscaling()
        .wait_for_completion(INSTANCE, Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(completion.by, CompletedBy::HeartbeatTimeout);
    assert_eq!(completion.result, LifecycleActionResult::Continue);
    assert_eq!(completion.heartbeats, 4);
    assert!(
        completion.after >= Duration::from_millis(790),
        "{completion:?}"
    );

    let expired = client
        .record_lifecycle_action_heartbeat()
        .auto_scaling_group_name(GROUP)
        .lifecycle_hook_name("Terminate-LC-Hook")
        .instance_id(INSTANCE)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        expired.message(),
        Some(format!("No active Lifecycle Action found with instance ID {INSTANCE}").as_str())
    );
}

#[tokio::test]
async fn the_global_timeout_ends_an_action_despite_heartbeats() {
    let (aws, config, _) = start().await;
    let topic = aws.sns().create_topic("t");
    aws.autoscaling()
        .add_group(FakeAutoScalingGroup::new(GROUP));
    aws.autoscaling()
        .add_hook(
            GROUP,
            FakeLifecycleHook::launching("Launch-LC-Hook")
                .heartbeat_timeout(Duration::from_secs(100))
                .global_timeout(Duration::from_secs(250))
                .notification_target(&topic),
        )
        .unwrap();
    aws.ec2().add_running_instance(INSTANCE);
    aws.autoscaling().set_time_scale(0.004);
    let client = aws_sdk_autoscaling::Client::new(&config);
    aws.autoscaling().launch_instance(GROUP, INSTANCE).unwrap();
    let heartbeats = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let sent = client
                .record_lifecycle_action_heartbeat()
                .auto_scaling_group_name(GROUP)
                .lifecycle_hook_name("Launch-LC-Hook")
                .instance_id(INSTANCE)
                .send()
                .await;
            if sent.is_err() {
                break;
            }
        }
    };
    let autoscaling = aws.autoscaling();
    let (completion, ()) = tokio::join!(
        autoscaling.wait_for_completion(INSTANCE, Duration::from_secs(4)),
        heartbeats
    );
    let completion = completion.unwrap();
    assert_eq!(completion.by, CompletedBy::GlobalTimeout);
    // The launch hook's default result (ABANDON) terminates the instance.
    assert_eq!(completion.result, LifecycleActionResult::Abandon);
    assert!(
        completion.after >= Duration::from_millis(990),
        "{completion:?}"
    );
    assert!(
        completion.after < Duration::from_millis(3000),
        "{completion:?}"
    );
    assert!(completion.heartbeats >= 5, "{completion:?}");
    assert_eq!(
        aws.ec2().instance(INSTANCE).unwrap().state,
        InstanceState::Terminated
    );
}

#[tokio::test]
async fn ec2_describes_instances_and_rejects_unknown_ids() {
    let (aws, config, _) = start().await;
    aws.ec2().add_instance(
        FakeInstance::new(INSTANCE, "eu-west-1")
            .private_dns_name("ip-192-168-12-34.eu-west-1.compute.internal")
            .availability_zone("eu-west-1b")
            .tag("eks:nodegroup-name", "demo-ng"),
    );
    aws.ec2().add_running_instance("i-0a1b2c3d4e5f60718");
    let client = aws_sdk_ec2::Client::new(&config);

    let output = client
        .describe_instances()
        .instance_ids(INSTANCE)
        .send()
        .await
        .unwrap();
    let instances: Vec<_> = output
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .collect();
    assert_eq!(instances.len(), 1);
    let instance = instances[0];
    assert_eq!(
        instance.private_dns_name(),
        Some("ip-192-168-12-34.eu-west-1.compute.internal")
    );
    assert_eq!(
        instance.placement().and_then(|p| p.availability_zone()),
        Some("eu-west-1b")
    );
    assert_eq!(
        instance.state().and_then(|s| s.name()).map(|n| n.as_str()),
        Some("running")
    );
    assert_eq!(instance.tags()[0].key(), Some("eks:nodegroup-name"));

    let filtered = client
        .describe_instances()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("instance-id")
                .values("i-0000000000000000f")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert!(filtered.reservations().is_empty());

    let unknown = client
        .describe_instances()
        .instance_ids("i-0000000000000000f")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&unknown),
        ("InvalidInstanceID.NotFound".to_owned(), 400)
    );
    assert_eq!(
        unknown.message(),
        Some("The instance ID 'i-0000000000000000f' does not exist")
    );
    let malformed = client
        .describe_instances()
        .instance_ids("node-1")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&malformed),
        ("InvalidInstanceID.Malformed".to_owned(), 400)
    );
}

#[tokio::test]
async fn sns_publish_reaches_subscriptions_whose_filter_accepts_it() {
    let (aws, config, _) = start().await;
    let topic = aws.sns().create_topic("eks-asg-lifecycle-hook-topic");
    let mut terminating = aws
        .sns()
        .subscribe_filtered(
            &topic,
            Some(SubscriptionFilter::lifecycle_transition(&[
                "autoscaling:EC2_INSTANCE_TERMINATING",
            ])),
        )
        .unwrap();
    let mut everything = aws.sns().subscribe(&topic).unwrap();
    let client = aws_sdk_sns::Client::new(&config);

    let message = r#"{"LifecycleTransition":"autoscaling:EC2_INSTANCE_TERMINATING","EC2InstanceId":"i-07e9ea9eb19a67337"}"#;
    let output = client
        .publish()
        .topic_arn(&topic)
        .subject("resume drain")
        .message(message)
        .send()
        .await
        .unwrap();
    let message_id = output.message_id().unwrap().to_owned();
    client
        .publish()
        .topic_arn(&topic)
        .message(r#"{"Event":"autoscaling:TEST_NOTIFICATION"}"#)
        .send()
        .await
        .unwrap();

    let event = terminating
        .next_event(Duration::from_secs(1))
        .await
        .unwrap();
    let sns = &event["Records"][0]["Sns"];
    assert_eq!(event["Records"][0]["EventSource"], "aws:sns");
    assert_eq!(sns["Message"], message);
    assert_eq!(sns["MessageId"], message_id.as_str());
    assert_eq!(sns["TopicArn"], topic.as_str());
    assert_eq!(sns["Subject"], "resume drain");
    assert_eq!(
        terminating.try_next(),
        None,
        "the test notification is filtered out"
    );
    assert!(
        everything
            .next_event(Duration::from_secs(1))
            .await
            .is_some()
    );
    assert!(
        everything
            .next_event(Duration::from_secs(1))
            .await
            .is_some()
    );
    assert_eq!(aws.sns().published().len(), 2);

    // The event deserializes as the Lambda SNS event the functions take.
    let parsed: aws_lambda_events::event::sns::SnsEvent = serde_json::from_value(event).unwrap();
    assert_eq!(parsed.records[0].sns.message, message);

    let unknown = client
        .publish()
        .topic_arn(aws.sns().topic_arn("missing"))
        .message("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code_and_status(&unknown), ("NotFound".to_owned(), 404));
}

#[tokio::test]
async fn eks_describes_clusters_and_pages_node_groups() {
    let (aws, config, _) = start().await;
    let eks = aws.eks();
    eks.add_cluster(FakeCluster::new(
        "ironman-2022",
        "https://127.0.0.1:6443",
        "LS0tLS1CRUdJTg==",
    ));
    let role = aws
        .account()
        .role_arn("demo-ng-NodeInstanceRole-454Q2XHJ5LZ0");
    for index in 0..5 {
        eks.add_nodegroup(
            "ironman-2022",
            FakeNodegroup::new(&format!("ng-{index}"), &role).auto_scaling_group(GROUP),
        )
        .unwrap();
    }
    let client = aws_sdk_eks::Client::new(&config);

    let cluster = client
        .describe_cluster()
        .name("ironman-2022")
        .send()
        .await
        .unwrap();
    let cluster = cluster.cluster().unwrap();
    assert_eq!(cluster.endpoint(), Some("https://127.0.0.1:6443"));
    assert_eq!(
        cluster.certificate_authority().and_then(|c| c.data()),
        Some("LS0tLS1CRUdJTg==")
    );
    assert_eq!(
        cluster
            .access_config()
            .and_then(|a| a.authentication_mode())
            .map(|m| m.as_str()),
        Some("API_AND_CONFIG_MAP")
    );
    assert_eq!(
        cluster.arn(),
        Some("arn:aws:eks:eu-west-1:111111111111:cluster/ironman-2022")
    );
    assert_eq!(cluster.status().map(|s| s.as_str()), Some("ACTIVE"));

    let nodegroup = client
        .describe_nodegroup()
        .cluster_name("ironman-2022")
        .nodegroup_name("ng-3")
        .send()
        .await
        .unwrap();
    let nodegroup = nodegroup.nodegroup().unwrap();
    assert_eq!(nodegroup.node_role(), Some(role.as_str()));
    assert_eq!(
        nodegroup.ami_type().map(|a| a.as_str()),
        Some("AL2023_x86_64_STANDARD")
    );
    assert_eq!(
        nodegroup.resources().unwrap().auto_scaling_groups()[0].name(),
        Some(GROUP)
    );

    let mut pages = client
        .list_nodegroups()
        .cluster_name("ironman-2022")
        .max_results(2)
        .into_paginator()
        .send();
    let mut names = Vec::new();
    let mut page_count = 0;
    while let Some(page) = pages.next().await {
        names.extend(page.unwrap().nodegroups().to_vec());
        page_count += 1;
    }
    assert_eq!(names, ["ng-0", "ng-1", "ng-2", "ng-3", "ng-4"]);
    assert_eq!(page_count, 3);

    let missing = client
        .describe_cluster()
        .name("nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&missing),
        ("ResourceNotFoundException".to_owned(), 404)
    );
    assert!(
        missing
            .into_service_error()
            .is_resource_not_found_exception()
    );
    let missing = client
        .describe_nodegroup()
        .cluster_name("ironman-2022")
        .nodegroup_name("gone")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&missing),
        ("ResourceNotFoundException".to_owned(), 404)
    );
    assert_eq!(
        missing.message(),
        Some("No node group found for name: gone.")
    );
}

#[tokio::test]
async fn eks_access_entries_follow_eks_rules() {
    let (aws, config, _) = start().await;
    let eks = aws.eks();
    eks.add_cluster(FakeCluster::new(
        "ironman-2022",
        "https://127.0.0.1:6443",
        "Q0E=",
    ));
    eks.add_cluster(
        FakeCluster::new("legacy", "https://127.0.0.1:6444", "Q0E=").authentication_mode(None),
    );
    let role = aws
        .account()
        .role_arn("demo-ng-NodeInstanceRole-454Q2XHJ5LZ0");
    let admin = aws.account().role_arn("admin");
    let client = aws_sdk_eks::Client::new(&config);

    let created = client
        .create_access_entry()
        .cluster_name("ironman-2022")
        .principal_arn(&role)
        .r#type("EC2_LINUX")
        .send()
        .await
        .unwrap();
    let entry = created.access_entry().unwrap();
    assert_eq!(entry.principal_arn(), Some(role.as_str()));
    assert_eq!(entry.username(), Some("system:node:{{EC2PrivateDNSName}}"));
    assert_eq!(entry.r#type(), Some("EC2_LINUX"));
    assert!(entry.access_entry_arn().unwrap().starts_with(
        "arn:aws:eks:eu-west-1:111111111111:access-entry/ironman-2022/role/111111111111/"
    ));

    let duplicate = client
        .create_access_entry()
        .cluster_name("ironman-2022")
        .principal_arn(&role)
        .r#type("EC2_LINUX")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&duplicate),
        ("ResourceInUseException".to_owned(), 409)
    );
    assert!(
        duplicate
            .into_service_error()
            .is_resource_in_use_exception()
    );

    client
        .create_access_entry()
        .cluster_name("ironman-2022")
        .principal_arn(&admin)
        .kubernetes_groups("cluster-admins")
        .send()
        .await
        .unwrap();
    let reserved = client
        .create_access_entry()
        .cluster_name("ironman-2022")
        .principal_arn(aws.account().role_arn("other"))
        .kubernetes_groups("system:masters")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&reserved),
        ("InvalidParameterException".to_owned(), 400)
    );

    let described = client
        .describe_access_entry()
        .cluster_name("ironman-2022")
        .principal_arn(&admin)
        .send()
        .await
        .unwrap();
    let described = described.access_entry().unwrap();
    assert_eq!(described.r#type(), Some("STANDARD"));
    assert_eq!(described.username(), Some(admin.as_str()));
    assert_eq!(described.kubernetes_groups(), ["cluster-admins"]);

    let listed = client
        .list_access_entries()
        .cluster_name("ironman-2022")
        .send()
        .await
        .unwrap();
    let mut expected = vec![admin.clone(), role.clone()];
    expected.sort();
    assert_eq!(listed.access_entries(), expected.as_slice());

    // The fake API server's authenticator sees the same entries.
    let node = eks.kubernetes_identity("ironman-2022", &role).unwrap();
    assert_eq!(node.username, "system:node:{{EC2PrivateDNSName}}");
    assert_eq!(node.groups, ["system:nodes"]);
    let admin_identity = eks.kubernetes_identity("ironman-2022", &admin).unwrap();
    assert_eq!(admin_identity.groups, ["cluster-admins"]);

    client
        .delete_access_entry()
        .cluster_name("ironman-2022")
        .principal_arn(&role)
        .send()
        .await
        .unwrap();
    assert_eq!(eks.kubernetes_identity("ironman-2022", &role), None);
    for result in [
        client
            .delete_access_entry()
            .cluster_name("ironman-2022")
            .principal_arn(&role)
            .send()
            .await
            .map(|_| ())
            .unwrap_err()
            .code()
            .map(str::to_owned),
        client
            .describe_access_entry()
            .cluster_name("ironman-2022")
            .principal_arn(&role)
            .send()
            .await
            .map(|_| ())
            .unwrap_err()
            .code()
            .map(str::to_owned),
    ] {
        assert_eq!(result.as_deref(), Some("ResourceNotFoundException"));
    }

    let legacy = client
        .create_access_entry()
        .cluster_name("legacy")
        .principal_arn(&role)
        .r#type("EC2_LINUX")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&legacy),
        ("InvalidRequestException".to_owned(), 400)
    );
    let legacy_cluster = client
        .describe_cluster()
        .name("legacy")
        .send()
        .await
        .unwrap();
    assert!(legacy_cluster.cluster().unwrap().access_config().is_none());
}

#[tokio::test]
async fn unknown_credentials_are_rejected_with_each_services_error() {
    let (aws, _, _) = start().await;
    let stranger = FakeCredentials {
        access_key_id: "AKIAUNKNOWN000000000".to_owned(),
        secret_access_key: "secret".to_owned(),
        session_token: None,
        principal_arn: "arn:aws:iam::222222222222:user/stranger".to_owned(),
    };
    let config = aws.sdk_config(&stranger).await;
    let asg = aws_sdk_autoscaling::Client::new(&config)
        .describe_auto_scaling_groups()
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&asg),
        ("InvalidClientTokenId".to_owned(), 403)
    );
    let ec2 = aws_sdk_ec2::Client::new(&config)
        .describe_instances()
        .send()
        .await
        .unwrap_err();
    assert_eq!(code_and_status(&ec2), ("AuthFailure".to_owned(), 401));
    let eks = aws_sdk_eks::Client::new(&config)
        .describe_cluster()
        .name("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&eks),
        ("UnrecognizedClientException".to_owned(), 403)
    );
    let sns = aws_sdk_sns::Client::new(&config)
        .publish()
        .topic_arn("arn:aws:sns:eu-west-1:111111111111:t")
        .message("m")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&sns),
        ("InvalidClientTokenId".to_owned(), 403)
    );
    let log = aws.requests();
    assert_eq!(log.len(), 4);
    assert!(
        log.iter()
            .all(|r| r.status >= 400 && r.principal_arn.is_none())
    );
}

#[tokio::test]
async fn a_signature_made_with_another_secret_is_refused() {
    let (aws, _, credentials) = start().await;
    let forged = FakeCredentials {
        secret_access_key: "not-the-issued-secret".to_owned(),
        ..credentials
    };
    let config = aws.sdk_config(&forged).await;
    let asg = aws_sdk_autoscaling::Client::new(&config)
        .describe_auto_scaling_groups()
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&asg),
        ("SignatureDoesNotMatch".to_owned(), 403)
    );
    let eks = aws_sdk_eks::Client::new(&config)
        .list_access_entries()
        .cluster_name("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        code_and_status(&eks),
        ("InvalidSignatureException".to_owned(), 403)
    );
}

#[tokio::test]
async fn injected_faults_use_each_services_throttling_and_5xx_errors() {
    let (aws, config, _) = start().await;
    with_hooks(&aws, Duration::from_secs(300));
    aws.eks()
        .add_cluster(FakeCluster::new("c", "https://127.0.0.1:6443", "Q0E="));
    aws.faults().inject(
        AwsFault::throttle()
            .on(Service::AutoScaling, "DescribeLifecycleHooks")
            .times(1),
    );
    aws.faults()
        .inject(AwsFault::throttle().on_service(Service::Eks).times(1));
    aws.faults()
        .inject(AwsFault::unavailable().on_service(Service::Eks).times(1));
    aws.faults().inject(
        AwsFault::internal_error()
            .on(Service::Ec2, "DescribeInstances")
            .times(1),
    );
    let asg = aws_sdk_autoscaling::Client::new(&config);
    let describe_hooks = || {
        asg.describe_lifecycle_hooks()
            .auto_scaling_group_name(GROUP)
            .send()
    };
    let throttled = describe_hooks().await.unwrap_err();
    assert_eq!(code_and_status(&throttled), ("Throttling".to_owned(), 400));
    describe_hooks().await.unwrap();

    let eks = aws_sdk_eks::Client::new(&config);
    let throttled = eks.describe_cluster().name("c").send().await.unwrap_err();
    assert_eq!(
        code_and_status(&throttled),
        ("ThrottlingException".to_owned(), 429)
    );
    let unavailable = eks.describe_cluster().name("c").send().await.unwrap_err();
    assert_eq!(
        code_and_status(&unavailable),
        ("ServiceUnavailableException".to_owned(), 503)
    );
    eks.describe_cluster().name("c").send().await.unwrap();

    let ec2 = aws_sdk_ec2::Client::new(&config);
    let failed = ec2.describe_instances().send().await.unwrap_err();
    assert_eq!(code_and_status(&failed), ("InternalError".to_owned(), 500));
    assert_eq!(aws.faults().injected(), 4);

    // With the SDK's standard retries, a throttled call succeeds on a later attempt.
    aws.faults().inject(
        AwsFault::throttle()
            .on(Service::AutoScaling, "DescribeLifecycleHooks")
            .times(2),
    );
    let retrying = aws_sdk_autoscaling::Client::from_conf(
        aws_sdk_autoscaling::config::Builder::from(&config)
            .retry_config(
                aws_sdk_autoscaling::config::retry::RetryConfig::standard()
                    .with_max_attempts(3)
                    .with_initial_backoff(Duration::from_millis(1)),
            )
            .build(),
    );
    retrying
        .describe_lifecycle_hooks()
        .auto_scaling_group_name(GROUP)
        .send()
        .await
        .unwrap();
    let attempts = aws.requests_for("DescribeLifecycleHooks");
    let codes: Vec<_> = attempts
        .iter()
        .map(|r| (r.status, r.error_code.clone()))
        .collect();
    assert_eq!(
        codes[2..],
        [
            (400, Some("Throttling".to_owned())),
            (400, Some("Throttling".to_owned())),
            (200, None)
        ]
    );
}

#[tokio::test]
async fn the_request_log_names_operation_principal_and_parameters() {
    let (aws, config, credentials) = start().await;
    with_hooks(&aws, Duration::from_secs(300));
    let notice = aws
        .autoscaling()
        .terminate_instance(GROUP, INSTANCE)
        .unwrap();
    aws_sdk_autoscaling::Client::new(&config)
        .complete_lifecycle_action()
        .auto_scaling_group_name(GROUP)
        .lifecycle_hook_name("Terminate-LC-Hook")
        .lifecycle_action_token(&notice.token)
        .lifecycle_action_result("ABANDON")
        .send()
        .await
        .unwrap();
    let records = aws.requests_for("CompleteLifecycleAction");
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.service, Some(Service::AutoScaling));
    assert_eq!(record.status, 200);
    assert_eq!(
        record.principal_arn.as_deref(),
        Some(credentials.principal_arn.as_str())
    );
    assert_eq!(record.params["LifecycleActionResult"], "ABANDON");
    assert_eq!(record.params["LifecycleActionToken"], notice.token);
    assert!(
        record
            .user_agent
            .as_deref()
            .is_some_and(|ua| ua.contains("aws-sdk-rust"))
    );
    assert_eq!(
        aws.autoscaling().completions()[0].result,
        LifecycleActionResult::Abandon
    );
}

#[tokio::test]
async fn probabilistic_faults_repeat_under_the_same_seed() {
    async fn pattern(seed: u64) -> Vec<bool> {
        let (aws, config, _) = start().await;
        aws.ec2().add_running_instance(INSTANCE);
        aws.faults().seed(seed);
        aws.faults().inject(
            AwsFault::throttle()
                .on(Service::Ec2, "DescribeInstances")
                .probability(0.5),
        );
        let client = aws_sdk_ec2::Client::new(&config);
        let mut outcomes = Vec::new();
        for _ in 0..24 {
            outcomes.push(client.describe_instances().send().await.is_ok());
        }
        outcomes
    }
    let first = pattern(7).await;
    assert_eq!(first, pattern(7).await);
    assert!(first.contains(&true) && first.contains(&false), "{first:?}");
    assert_ne!(first, pattern(8).await);
}
