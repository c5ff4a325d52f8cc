//! The node group auth function end to end over the fakes: the fixtures, forged events,
//! every authentication mode, delete semantics.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use node_manager::aws::in_memory::{InMemoryEks, InMemoryInstanceProfiles, InMemoryInstances};
use node_manager::aws::{AuthenticationMode, ClusterDescription, NodegroupDescription};
use node_manager::diagnostic::FunctionError;
use node_manager::nodegroup_auth::handler::{NodegroupAuth, NodegroupAuthError, Outcome};
use node_manager::nodegroup_auth::in_memory::InMemoryAwsAuthStore;
use node_manager::nodegroup_auth::role_mapping::MapRoles;
use node_manager::nodegroup_auth::settings::NodegroupAuthSettings;
use node_manager::retry::RetryPolicy;
use node_manager::settings::ClusterScope;
use serde_json::{Value, json};

const FUNCTION_ARN: &str = "arn:aws:lambda:eu-west-1:111111111111:function:nodegroup-auth";
const CLUSTER: &str = "ironman-2022";
const ROLE: &str = "arn:aws:iam::111111111111:role/eksctl-ironman-2022-nodegroup-demo-ng-NodeInstanceRole-454Q2XHJ5LZ0";

fn fixture(name: &str) -> Value {
    let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn settings() -> NodegroupAuthSettings {
    NodegroupAuthSettings {
        scope: ClusterScope {
            cluster_name: CLUSTER.into(),
            additional_cluster_names: vec![],
        },
        region: "eu-west-1".into(),
        account_id: None,
        aws_auth_with_access_entries: false,
        retry: RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        delete_wait: Duration::from_secs(2),
        delete_poll_interval: Duration::from_millis(10),
    }
}

struct World {
    eks: InMemoryEks,
    store: InMemoryAwsAuthStore,
    profiles: InMemoryInstanceProfiles,
    instances: InMemoryInstances,
    function: NodegroupAuth<
        InMemoryEks,
        InMemoryAwsAuthStore,
        InMemoryInstanceProfiles,
        InMemoryInstances,
    >,
}

fn world(mode: AuthenticationMode) -> World {
    world_with(mode, settings())
}

fn world_with(mode: AuthenticationMode, settings: NodegroupAuthSettings) -> World {
    let eks = InMemoryEks::default();
    eks.add_cluster(ClusterDescription {
        name: CLUSTER.into(),
        arn: format!("arn:aws:eks:eu-west-1:111111111111:cluster/{CLUSTER}"),
        endpoint: "https://127.0.0.1:1".into(),
        certificate_authority_data: String::new(),
        authentication_mode: mode,
    });
    let store = InMemoryAwsAuthStore::new();
    let profiles = InMemoryInstanceProfiles::default();
    let instances = InMemoryInstances::default();
    World {
        function: NodegroupAuth::new(
            eks.clone(),
            store.clone(),
            profiles.clone(),
            instances.clone(),
            settings,
        ),
        eks,
        store,
        profiles,
        instances,
    }
}

fn nodegroup(name: &str, role: &str, ami_type: &str, status: &str) -> NodegroupDescription {
    NodegroupDescription {
        cluster_name: CLUSTER.into(),
        nodegroup_name: name.into(),
        node_role: role.into(),
        ami_type: ami_type.into(),
        status: status.into(),
    }
}

/// A CloudTrail-via-EventBridge record of `event_name` (the shape EventBridge delivers).
fn cloudtrail(event_name: &str, cluster: &str, nodegroup: &str, role: &str) -> Value {
    json!({
        "version": "0",
        "id": "7f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0",
        "detail-type": "AWS API Call via CloudTrail",
        "source": "aws.eks",
        "account": "111111111111",
        "time": "2026-11-24T02:00:00Z",
        "region": "eu-west-1",
        "resources": [],
        "detail": {
            "eventVersion": "1.08",
            "eventTime": "2026-11-24T02:00:00Z",
            "eventSource": "eks.amazonaws.com",
            "eventName": event_name,
            "awsRegion": "eu-west-1",
            "requestParameters": {"name": cluster, "nodegroupName": nodegroup},
            "responseElements": {"nodegroup": {
                "nodegroupName": nodegroup,
                "clusterName": cluster,
                "status": if event_name == "DeleteNodegroup" { "DELETING" } else { "CREATING" },
                "amiType": "AL2_x86_64",
                "nodeRole": role
            }},
            "requestID": "2f4a6c8e-0b2d-4e6f-9a1c-5e7a9c1e3b5d",
            "eventID": "b7d9f1a3-5c7e-4a9b-8d1f-3b5d7f9a1c3e",
            "readOnly": false,
            "eventType": "AwsApiCall",
            "recipientAccountId": "111111111111"
        }
    })
}

fn map_roles(store: &InMemoryAwsAuthStore) -> MapRoles {
    MapRoles::parse(store.map_roles().as_deref()).unwrap()
}

fn aws_auth(map_roles: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("aws-auth".into()),
            namespace: Some("kube-system".into()),
            ..ObjectMeta::default()
        },
        data: Some([("mapRoles".to_owned(), map_roles.to_owned())].into()),
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn create_fixture_maps_the_role_in_config_map_mode() {
    let w = world(AuthenticationMode::ConfigMap);
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "CREATING"));
    let report = w
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Mapped));
    let map = map_roles(&w.store);
    let (_, m) = map.effective(ROLE).unwrap();
    assert_eq!(m.groups, ["system:bootstrappers", "system:nodes"]);
    let events = w.store.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, "NodeRoleMapped");
    assert!(w.eks.access_entries(CLUSTER).is_empty());

    // Second delivery: nothing written.
    let version = w.store.resource_version();
    let report = w
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::AlreadyMapped));
    assert_eq!(w.store.resource_version(), version);
    assert_eq!(w.store.writes(), 1);
}

#[tokio::test]
async fn the_role_comes_from_describe_nodegroup_not_from_the_event() {
    let w = world(AuthenticationMode::ConfigMap);
    let truth = "arn:aws:iam::111111111111:role/teams/real-node-role";
    w.eks.add_nodegroup(nodegroup(
        "demo-ng",
        truth,
        "WINDOWS_CORE_2022_x86_64",
        "ACTIVE",
    ));
    let mut event = fixture("eventbridge-create-nodegroup.json");
    event["detail"]["requestParameters"]["groups"] = json!(["system:masters"]);
    event["detail"]["responseElements"]["nodegroup"]["groups"] = json!(["system:masters"]);
    w.function.handle(&event, FUNCTION_ARN).await.unwrap();
    let map = map_roles(&w.store);
    assert_eq!(map.mappings().len(), 1);
    let m = &map.mappings()[0];
    assert_eq!(
        m.role_arn, "arn:aws:iam::111111111111:role/real-node-role",
        "path stripped"
    );
    assert_eq!(
        m.groups,
        [
            "system:bootstrappers",
            "system:nodes",
            "eks:kube-proxy-windows"
        ]
    );
}

#[tokio::test]
async fn failed_calls_and_other_apis_are_ignored() {
    let w = world(AuthenticationMode::ConfigMap);
    let mut event = fixture("eventbridge-create-nodegroup.json");
    event["detail"]["errorCode"] = json!("ResourceInUseException");
    let report = w.function.handle(&event, FUNCTION_ARN).await.unwrap();
    assert!(report.ignored.is_some());
    let mut event = fixture("eventbridge-create-nodegroup.json");
    event["detail"]["eventName"] = json!("UpdateNodegroupConfig");
    assert!(
        w.function
            .handle(&event, FUNCTION_ARN)
            .await
            .unwrap()
            .ignored
            .is_some()
    );
    assert!(w.eks.calls().is_empty());
    assert_eq!(w.store.gets(), 0);
}

type Forgery = Box<dyn Fn(&mut Value)>;

#[tokio::test]
async fn forged_events_are_rejected_without_any_call() {
    let w = world(AuthenticationMode::ConfigMap);
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    let forgeries: Vec<(&str, Forgery)> = vec![
        (
            "other account",
            Box::new(|e| e["account"] = json!("222222222222")),
        ),
        (
            "other recipient",
            Box::new(|e| e["detail"]["recipientAccountId"] = json!("222222222222")),
        ),
        (
            "other region",
            Box::new(|e| e["region"] = json!("us-east-1")),
        ),
        (
            "other aws region",
            Box::new(|e| e["detail"]["awsRegion"] = json!("us-east-1")),
        ),
        (
            "disagreeing cluster names",
            Box::new(|e| e["detail"]["requestParameters"]["name"] = json!("prod")),
        ),
        ("other source", Box::new(|e| e["source"] = json!("my.app"))),
        (
            "other event source",
            Box::new(|e| e["detail"]["eventSource"] = json!("iam.amazonaws.com")),
        ),
        (
            "newline in a name",
            Box::new(|e| {
                e["detail"]["responseElements"]["nodegroup"]["nodegroupName"] =
                    json!("demo-ng\n- rolearn: x");
            }),
        ),
    ];
    for (what, forge) in forgeries {
        let mut event = fixture("eventbridge-create-nodegroup.json");
        forge(&mut event);
        let err = w.function.handle(&event, FUNCTION_ARN).await.unwrap_err();
        assert!(
            matches!(err, NodegroupAuthError::Rejected(_)),
            "{what}: {err}"
        );
    }
    let directs = [
        json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng", "groups": ["system:masters"]}),
        json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng", "nodeRole": ROLE}),
        json!({"clusterName": "prod", "nodegroupName": "demo-ng"}),
        json!({"clusterName": CLUSTER}),
        json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng", "reconcile": "all"}),
        json!({"clusterName": CLUSTER, "reconcile": "some"}),
        json!("demo-ng"),
    ];
    for payload in directs {
        let err = w.function.handle(&payload, FUNCTION_ARN).await.unwrap_err();
        assert!(
            matches!(err, NodegroupAuthError::Rejected(_)),
            "{payload}: {err}"
        );
    }
    assert!(w.eks.calls().is_empty(), "{:?}", w.eks.calls());
    assert!(w.store.current().is_none());
}

#[tokio::test]
async fn unacceptable_node_roles_are_rejected_without_a_write() {
    for role in [
        "arn:aws:iam::111111111111:user/cli",
        "arn:aws:iam::222222222222:role/node",
        "arn:aws:sts::111111111111:assumed-role/node/i-0abc",
        "arn:aws:iam::111111111111:role/node\n  groups:\n  - system:masters",
        "arn:aws:iam::111111111111:role/*",
    ] {
        let w = world(AuthenticationMode::ConfigMap);
        w.eks
            .add_nodegroup(nodegroup("demo-ng", role, "AL2_x86_64", "ACTIVE"));
        let err = w
            .function
            .handle(
                &json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng"}),
                FUNCTION_ARN,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, NodegroupAuthError::NodeRole { .. }),
            "{role:?}: {err}"
        );
        assert_eq!(w.store.gets(), 0);
        assert!(w.store.current().is_none());
    }
}

#[tokio::test]
async fn api_mode_creates_an_access_entry_and_leaves_aws_auth_alone() {
    let w = world(AuthenticationMode::Api);
    let role = "arn:aws:iam::111111111111:role/teams/node";
    w.eks
        .add_nodegroup(nodegroup("demo-ng", role, "AL2_x86_64", "ACTIVE"));
    let report = w
        .function
        .handle(
            &json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].access_entry, Some(Outcome::Mapped));
    assert_eq!(report.nodegroups[0].aws_auth, None);
    let entries = w.eks.access_entries(CLUSTER);
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].principal_arn, role,
        "access entries keep the path"
    );
    assert_eq!(entries[0].entry_type, "EC2_LINUX");
    assert_eq!(w.store.gets(), 0, "the ConfigMap is not even read");
    // Again: already there.
    let report = w
        .function
        .handle(
            &json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(
        report.nodegroups[0].access_entry,
        Some(Outcome::AlreadyMapped)
    );
}

#[tokio::test]
async fn api_and_config_map_writes_aws_auth_only_when_asked() {
    let w = world(AuthenticationMode::ApiAndConfigMap);
    w.eks
        .add_nodegroup(nodegroup("win", ROLE, "WINDOWS_FULL_2022_x86_64", "ACTIVE"));
    w.function
        .handle(
            &json!({"clusterName": CLUSTER, "nodegroupName": "win"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(w.eks.access_entries(CLUSTER)[0].entry_type, "EC2_WINDOWS");
    assert!(w.store.current().is_none());

    let w = world_with(
        AuthenticationMode::ApiAndConfigMap,
        NodegroupAuthSettings {
            aws_auth_with_access_entries: true,
            ..settings()
        },
    );
    w.eks
        .add_nodegroup(nodegroup("win", ROLE, "WINDOWS_FULL_2022_x86_64", "ACTIVE"));
    let report = w
        .function
        .handle(
            &json!({"clusterName": CLUSTER, "nodegroupName": "win"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].access_entry, Some(Outcome::Mapped));
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Mapped));
    assert!(map_roles(&w.store).effective(ROLE).is_some());
}

#[tokio::test]
async fn shared_linux_role_gains_the_windows_group() {
    let w = world(AuthenticationMode::ConfigMap);
    w.eks
        .add_nodegroup(nodegroup("linux", ROLE, "AL2_x86_64", "ACTIVE"));
    w.eks.add_nodegroup(nodegroup(
        "windows",
        ROLE,
        "WINDOWS_CORE_2019_x86_64",
        "ACTIVE",
    ));
    let report = w
        .function
        .handle(
            &json!({"clusterName": CLUSTER, "reconcile": "all"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(report.nodegroups.len(), 2);
    let map = map_roles(&w.store);
    assert_eq!(map.mappings().len(), 1, "one entry for the shared role");
    assert_eq!(
        map.mappings()[0].groups,
        [
            "system:bootstrappers",
            "system:nodes",
            "eks:kube-proxy-windows"
        ]
    );
}

#[tokio::test]
async fn privileged_entry_is_left_alone_and_reported() {
    let w = world(AuthenticationMode::ConfigMap);
    let text = format!("- rolearn: {ROLE}\n  username: admin\n  groups:\n    - system:masters\n");
    w.store.put(aws_auth(&text));
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    let report = w
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Conflict));
    assert!(
        report.nodegroups[0]
            .note
            .as_deref()
            .unwrap()
            .contains("admin")
    );
    assert_eq!(w.store.map_roles().unwrap(), text);
    assert_eq!(w.store.writes(), 0);
    let events = w.store.events();
    assert_eq!(events[0].reason, "NodeRoleMappingConflict");
    assert!(events[0].warning);
}

#[tokio::test]
async fn delete_keeps_a_role_another_node_group_uses() {
    let w = world(AuthenticationMode::ConfigMap);
    w.eks
        .add_nodegroup(nodegroup("other-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    w.function
        .handle(
            &json!({"clusterName": CLUSTER, "reconcile": "all"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    let writes = w.store.writes();
    let report = w
        .function
        .handle(
            &cloudtrail("DeleteNodegroup", CLUSTER, "demo-ng", ROLE),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::KeptInUse));
    assert!(
        report.nodegroups[0]
            .note
            .as_deref()
            .unwrap()
            .contains("other-ng")
    );
    assert!(map_roles(&w.store).effective(ROLE).is_some());
    assert_eq!(w.store.writes(), writes);
}

#[tokio::test]
async fn delete_of_the_last_user_removes_the_mapping() {
    let w = world(AuthenticationMode::ConfigMap);
    let other =
        "- rolearn: arn:aws:iam::111111111111:role/other\n  username: other\n  groups: [team]\n";
    w.store.put(aws_auth(other));
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    w.function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    // The node group is still deleting when the event arrives; it goes away a bit later.
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    let eks = w.eks.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        eks.remove_nodegroup(CLUSTER, "demo-ng");
    });
    let report = w
        .function
        .handle(&fixture("eventbridge-delete-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Unmapped));
    assert!(map_roles(&w.store).effective(ROLE).is_none());
    assert_eq!(
        w.store.map_roles().unwrap(),
        other,
        "the other entry, as it was"
    );
    assert_eq!(w.store.events().last().unwrap().reason, "NodeRoleUnmapped");
}

#[tokio::test]
async fn delete_waits_but_not_forever() {
    let w = world_with(
        AuthenticationMode::ConfigMap,
        NodegroupAuthSettings {
            delete_wait: Duration::from_millis(50),
            ..settings()
        },
    );
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    let err = w
        .function
        .handle(&fixture("eventbridge-delete-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap_err();
    assert!(
        matches!(err, NodegroupAuthError::StillDeleting { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_delete_event_for_a_live_node_group_changes_nothing() {
    let w = world(AuthenticationMode::ConfigMap);
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    w.function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    let report = w
        .function
        .handle(&fixture("eventbridge-delete-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, None);
    assert!(map_roles(&w.store).effective(ROLE).is_some());
}

#[tokio::test]
async fn api_mode_delete_removes_the_node_access_entry_only() {
    let w = world(AuthenticationMode::Api);
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    w.function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(w.eks.access_entries(CLUSTER).len(), 1);
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    let eks = w.eks.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        eks.remove_nodegroup(CLUSTER, "demo-ng");
    });
    let report = w
        .function
        .handle(
            &cloudtrail("DeleteNodegroup", CLUSTER, "demo-ng", ROLE),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].access_entry, Some(Outcome::Unmapped));
    assert!(w.eks.access_entries(CLUSTER).is_empty());
    assert_eq!(w.store.gets(), 0);
}

#[tokio::test]
async fn retries_exhausted_fails_the_invocation() {
    let w = world(AuthenticationMode::ConfigMap);
    w.store.put(aws_auth(""));
    w.store.fail_replace(
        node_manager::nodegroup_auth::aws_auth::StoreError::Conflict,
        100,
    );
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    let err = w
        .function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "RetriesExhausted");
    assert_eq!(w.store.map_roles().unwrap(), "");
}

#[tokio::test]
async fn a_zero_delete_wait_unmaps_at_once() {
    let w = mapped_then_deleting(AuthenticationMode::ConfigMap).await;
    let report = w
        .function
        .handle(&fixture("eventbridge-delete-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::Unmapped));
    assert!(map_roles(&w.store).effective(ROLE).is_none());
}

#[tokio::test]
async fn another_clusters_events_are_ignored_not_failed() {
    let w = world(AuthenticationMode::ConfigMap);
    for name in ["CreateNodegroup", "DeleteNodegroup"] {
        let report = w
            .function
            .handle(&cloudtrail(name, "prod", "prod-ng", ROLE), FUNCTION_ARN)
            .await
            .unwrap();
        let ignored = report.ignored.unwrap();
        assert!(
            ignored.contains("prod") && ignored.contains(CLUSTER),
            "{ignored}"
        );
        assert!(report.nodegroups.is_empty());
    }
    assert!(w.eks.calls().is_empty(), "{:?}", w.eks.calls());
    // Forged-looking ones stay errors, even for another cluster.
    let mut other_account = cloudtrail("CreateNodegroup", "prod", "prod-ng", ROLE);
    other_account["account"] = json!("222222222222");
    let mut other_source = cloudtrail("CreateNodegroup", "prod", "prod-ng", ROLE);
    other_source["source"] = json!("my.app");
    let mut other_region = cloudtrail("CreateNodegroup", "prod", "prod-ng", ROLE);
    other_region["detail"]["awsRegion"] = json!("us-east-1");
    for event in [other_account, other_source, other_region] {
        let err = w.function.handle(&event, FUNCTION_ARN).await.unwrap_err();
        assert!(matches!(err, NodegroupAuthError::Rejected(_)), "{err}");
    }
}

#[tokio::test]
async fn a_late_genuine_delete_keeps_the_mapping_and_says_so() {
    let w = world(AuthenticationMode::ConfigMap);
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    w.function
        .handle(
            &cloudtrail("CreateNodegroup", CLUSTER, "demo-ng", ROLE),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    // EKS finished deleting before this (redelivered) event arrived.
    w.eks.remove_nodegroup(CLUSTER, "demo-ng");
    let writes = w.store.writes();
    let report = w
        .function
        .handle(
            &cloudtrail("DeleteNodegroup", CLUSTER, "demo-ng", ROLE),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    let ng = &report.nodegroups[0];
    assert_eq!(ng.aws_auth, Some(Outcome::KeptUnverified));
    assert!(
        ng.note.as_deref().unwrap().contains("cannot be checked"),
        "{ng:?}"
    );
    assert!(map_roles(&w.store).effective(ROLE).is_some());
    assert_eq!(w.store.writes(), writes);
}

#[tokio::test]
async fn a_forged_delete_removes_no_access() {
    // Karpenter / self-managed nodes run with this role; no managed node group uses it.
    let karpenter = "arn:aws:iam::111111111111:role/KarpenterNodeRole-ironman";
    for mode in [AuthenticationMode::ConfigMap, AuthenticationMode::Api] {
        let w = world(mode);
        w.store.put(aws_auth(&format!(
            "- rolearn: {karpenter}\n  username: system:node:{{{{EC2PrivateDNSName}}}}\n  groups: [system:bootstrappers, system:nodes]\n"
        )));
        w.eks
            .add_nodegroup(nodegroup("real-ng", karpenter, "AL2_x86_64", "ACTIVE"));
        w.function
            .handle(
                &json!({"clusterName": CLUSTER, "nodegroupName": "real-ng"}),
                FUNCTION_ARN,
            )
            .await
            .unwrap();
        w.eks.remove_nodegroup(CLUSTER, "real-ng");
        let entries = w.eks.access_entries(CLUSTER).len();
        let writes = w.store.writes();
        let report = w
            .function
            .handle(
                &cloudtrail("DeleteNodegroup", CLUSTER, "never-existed", karpenter),
                FUNCTION_ARN,
            )
            .await
            .unwrap();
        let ng = &report.nodegroups[0];
        assert!(
            ng.aws_auth == Some(Outcome::KeptUnverified)
                || ng.access_entry == Some(Outcome::KeptUnverified),
            "{mode:?}: {ng:?}"
        );
        assert_eq!(w.store.writes(), writes, "{mode:?}");
        assert!(
            map_roles(&w.store).effective(karpenter).is_some(),
            "{mode:?}"
        );
        assert_eq!(w.eks.access_entries(CLUSTER).len(), entries, "{mode:?}");
    }
}

#[tokio::test]
async fn delete_answers_at_once_when_another_node_group_uses_the_role() {
    let w = world_with(
        AuthenticationMode::ConfigMap,
        NodegroupAuthSettings {
            delete_wait: Duration::from_secs(5),
            delete_poll_interval: Duration::from_millis(50),
            ..settings()
        },
    );
    w.eks
        .add_nodegroup(nodegroup("other-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    // Stays DELETING for the whole test: waiting for it would take DELETE_WAIT_SECONDS.
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    let started = std::time::Instant::now();
    let report = w
        .function
        .handle(
            &cloudtrail("DeleteNodegroup", CLUSTER, "demo-ng", ROLE),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.nodegroups[0].aws_auth, Some(Outcome::KeptInUse));
    assert!(
        report.nodegroups[0]
            .note
            .as_deref()
            .unwrap()
            .contains("other-ng")
    );
}

#[tokio::test]
async fn api_and_config_map_does_not_create_an_entry_over_a_privileged_aws_auth_one() {
    for (what, entry) in [
        ("admin", "username: admin\n  groups: [system:masters]"),
        ("not node-shaped", "username: ci\n  groups: [deployers]"),
    ] {
        let w = world(AuthenticationMode::ApiAndConfigMap);
        w.store
            .put(aws_auth(&format!("- rolearn: {ROLE}\n  {entry}\n")));
        w.eks
            .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
        let report = w
            .function
            .handle(
                &json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng"}),
                FUNCTION_ARN,
            )
            .await
            .unwrap();
        let ng = &report.nodegroups[0];
        assert_eq!(ng.access_entry, Some(Outcome::Conflict), "{what}");
        assert!(
            ng.note.as_deref().unwrap().contains("aws-auth maps"),
            "{what}: {ng:?}"
        );
        assert!(w.eks.access_entries(CLUSTER).is_empty(), "{what}");
        let events = w.store.events();
        assert!(
            events
                .iter()
                .any(|e| e.warning && e.reason == "NodeRoleMappingConflict"),
            "{what}: {events:?}"
        );
    }
    // A node-shaped entry is no obstacle.
    let w = world(AuthenticationMode::ApiAndConfigMap);
    w.store.put(aws_auth(&format!(
        "- rolearn: {ROLE}\n  username: system:node:{{{{EC2PrivateDNSName}}}}\n  groups: [system:bootstrappers, system:nodes]\n"
    )));
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    let report = w
        .function
        .handle(
            &json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(report.nodegroups[0].access_entry, Some(Outcome::Mapped));
}

#[tokio::test]
async fn api_and_config_map_delete_reports_the_aws_auth_entry_that_remains() {
    let w = world_with(
        AuthenticationMode::ApiAndConfigMap,
        NodegroupAuthSettings {
            delete_wait: Duration::ZERO,
            ..settings()
        },
    );
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    w.function
        .handle(
            &json!({"clusterName": CLUSTER, "nodegroupName": "demo-ng"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert_eq!(w.eks.access_entries(CLUSTER).len(), 1);
    w.store.put(aws_auth(&format!(
        "- rolearn: {ROLE}\n  username: system:node:{{{{EC2PrivateDNSName}}}}\n  groups: [system:bootstrappers, system:nodes]\n"
    )));
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    let report = w
        .function
        .handle(
            &cloudtrail("DeleteNodegroup", CLUSTER, "demo-ng", ROLE),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    let ng = &report.nodegroups[0];
    assert_eq!(ng.access_entry, Some(Outcome::Unmapped));
    let note = ng.note.as_deref().unwrap();
    assert!(note.contains("aws-auth still maps"), "{note}");
    assert!(note.contains("system:nodes"), "{note}");
}

// --- Never cut off running nodes: instances whose instance profile carries the role. ---

const ROLE_NAME: &str = "eksctl-ironman-2022-nodegroup-demo-ng-NodeInstanceRole-454Q2XHJ5LZ0";
const PROFILE: &str = "arn:aws:iam::111111111111:instance-profile/self-managed-nodes";

/// The role mapped by a create, then its node group deleting (no wait: unmap at once unless
/// something else keeps it).
async fn mapped_then_deleting(mode: AuthenticationMode) -> World {
    let w = world_with(
        mode,
        NodegroupAuthSettings {
            delete_wait: Duration::ZERO,
            ..settings()
        },
    );
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "ACTIVE"));
    w.function
        .handle(&fixture("eventbridge-create-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    w
}

/// [`mapped_then_deleting`], with the role in an instance profile: the in-use check then asks
/// EC2 for the profile's live instances.
async fn mapped_then_deleting_with_profile(mode: AuthenticationMode) -> World {
    let w = mapped_then_deleting(mode).await;
    w.profiles.add(ROLE_NAME, PROFILE);
    w
}

async fn delete(w: &World) -> node_manager::nodegroup_auth::handler::NodegroupReport {
    let mut report = w
        .function
        .handle(&fixture("eventbridge-delete-nodegroup.json"), FUNCTION_ARN)
        .await
        .unwrap();
    report.nodegroups.remove(0)
}

#[tokio::test]
async fn delete_keeps_the_mapping_while_a_tagged_instance_runs_with_the_role() {
    let w = mapped_then_deleting_with_profile(AuthenticationMode::ConfigMap).await;
    w.instances.set_profile(
        "i-0selfmanaged",
        PROFILE,
        &[(&format!("kubernetes.io/cluster/{CLUSTER}"), "owned")],
    );
    w.instances
        .set_profile("i-0gone", PROFILE, &[("eks:cluster-name", CLUSTER)]);
    w.instances.set_state("i-0gone", "terminated");
    let report = delete(&w).await;
    assert_eq!(report.aws_auth, Some(Outcome::KeptInUse));
    assert_eq!(report.instances, ["i-0selfmanaged"]);
    assert!(report.note.unwrap().contains("i-0selfmanaged"));
    assert!(map_roles(&w.store).effective(ROLE).is_some());
    let event = w.store.events().last().unwrap().clone();
    assert!(event.warning);
    assert_eq!(event.reason, "NodeRoleInUse");
    assert!(event.note.contains("i-0selfmanaged"), "{}", event.note);
}

#[tokio::test]
async fn api_mode_delete_keeps_the_access_entry_while_a_stopped_instance_has_the_role() {
    let w = mapped_then_deleting_with_profile(AuthenticationMode::Api).await;
    w.instances
        .set_profile("i-0stopped", PROFILE, &[("eks:cluster-name", CLUSTER)]);
    w.instances.set_state("i-0stopped", "stopped");
    let report = delete(&w).await;
    assert_eq!(report.access_entry, Some(Outcome::KeptInUse));
    assert_eq!(report.instances, ["i-0stopped"]);
    assert_eq!(w.eks.access_entries(CLUSTER).len(), 1);
    assert_eq!(w.store.gets(), 0, "API mode never contacts the cluster");
}

#[tokio::test]
async fn terminated_and_other_cluster_instances_do_not_keep_the_role() {
    for mode in [AuthenticationMode::ConfigMap, AuthenticationMode::Api] {
        let w = mapped_then_deleting_with_profile(mode).await;
        w.instances
            .set_profile("i-0terminated", PROFILE, &[("eks:cluster-name", CLUSTER)]);
        w.instances.set_state("i-0terminated", "terminated");
        w.instances
            .set_profile("i-0shutting", PROFILE, &[("eks:cluster-name", CLUSTER)]);
        w.instances.set_state("i-0shutting", "shutting-down");
        w.instances.set_profile(
            "i-0othercluster",
            PROFILE,
            &[
                ("eks:cluster-name", "prod"),
                ("kubernetes.io/cluster/prod", "owned"),
            ],
        );
        // Another profile (of another role) on a live instance of this cluster.
        w.instances.set_profile(
            "i-0otherrole",
            "arn:aws:iam::111111111111:instance-profile/other",
            &[("eks:cluster-name", CLUSTER)],
        );
        let report = delete(&w).await;
        assert!(report.instances.is_empty(), "{mode:?}");
        if mode == AuthenticationMode::Api {
            assert_eq!(report.access_entry, Some(Outcome::Unmapped));
            assert!(w.eks.access_entries(CLUSTER).is_empty());
        } else {
            assert_eq!(report.aws_auth, Some(Outcome::Unmapped));
            assert!(map_roles(&w.store).effective(ROLE).is_none());
        }
    }
}

#[tokio::test]
async fn an_iam_or_ec2_failure_keeps_the_mapping() {
    for operation in ["ListInstanceProfilesForRole", "DescribeInstances"] {
        let w = mapped_then_deleting_with_profile(AuthenticationMode::ConfigMap).await;
        let faults = if operation == "DescribeInstances" {
            &w.instances.faults
        } else {
            &w.profiles.faults
        };
        faults.fail(operation, node_manager::aws::AwsErrorKind::AccessDenied, 1);
        let report = delete(&w).await;
        assert_eq!(report.aws_auth, Some(Outcome::KeptUnchecked), "{operation}");
        assert!(report.note.unwrap().contains(operation));
        assert!(map_roles(&w.store).effective(ROLE).is_some());
        let event = w.store.events().last().unwrap().clone();
        assert!(event.warning);
        assert_eq!(event.reason, "NodeRoleUsageUnknown");
    }
}

/// Two ACTIVE node groups with the same role, the role mapped (ConfigMap mode).
async fn two_node_groups_of_one_role() -> World {
    let w = world(AuthenticationMode::ConfigMap);
    for name in ["demo-ng", "other-ng"] {
        w.eks
            .add_nodegroup(nodegroup(name, ROLE, "AL2_x86_64", "ACTIVE"));
    }
    w.function
        .handle(
            &json!({"clusterName": CLUSTER, "reconcile": "all"}),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    assert!(map_roles(&w.store).effective(ROLE).is_some());
    w
}

async fn delete_of(
    w: &World,
    name: &str,
) -> node_manager::nodegroup_auth::handler::NodegroupReport {
    let mut report = w
        .function
        .handle(
            &cloudtrail("DeleteNodegroup", CLUSTER, name, ROLE),
            FUNCTION_ARN,
        )
        .await
        .unwrap();
    report.nodegroups.remove(0)
}

/// EKS removes the node groups a little after their delete events arrive.
fn gone_soon(w: &World, names: &[&'static str]) {
    let eks = w.eks.clone();
    let names = names.to_vec();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        for name in names {
            eks.remove_nodegroup(CLUSTER, name);
        }
    });
}

#[tokio::test]
async fn the_second_of_two_deletes_unmaps_a_role_the_first_kept_for_it() {
    let w = two_node_groups_of_one_role().await;
    // demo-ng's delete is handled while other-ng is ACTIVE: kept for other-ng.
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    let first = delete_of(&w, "demo-ng").await;
    assert_eq!(first.aws_auth, Some(Outcome::KeptInUse));
    // other-ng is deleted while demo-ng is still DELETING: demo-ng will not use the role
    // again, and its own delete was answered already, so this one must unmap it.
    w.eks
        .add_nodegroup(nodegroup("other-ng", ROLE, "AL2_x86_64", "DELETING"));
    gone_soon(&w, &["demo-ng", "other-ng"]);
    let second = delete_of(&w, "other-ng").await;
    assert_eq!(second.aws_auth, Some(Outcome::Unmapped), "{second:?}");
    assert!(map_roles(&w.store).effective(ROLE).is_none());
}

#[tokio::test]
async fn two_deletes_handled_together_unmap_the_role_whichever_ends_first() {
    for (first, second) in [("demo-ng", "other-ng"), ("other-ng", "demo-ng")] {
        let w = two_node_groups_of_one_role().await;
        for name in [first, second] {
            w.eks
                .add_nodegroup(nodegroup(name, ROLE, "AL2_x86_64", "DELETING"));
        }
        gone_soon(&w, &[first, second]);
        let (a, b) = tokio::join!(delete_of(&w, first), delete_of(&w, second));
        assert!(
            [&a, &b]
                .iter()
                .any(|r| r.aws_auth == Some(Outcome::Unmapped)),
            "{first} then {second}: {a:?} {b:?}"
        );
        assert!(
            map_roles(&w.store).effective(ROLE).is_none(),
            "{first} then {second}"
        );
    }
}

#[tokio::test]
async fn a_node_group_whose_delete_failed_keeps_the_role_until_its_own_delete() {
    let w = two_node_groups_of_one_role().await;
    // demo-ng's delete failed (it still exists, with its nodes); other-ng is being deleted.
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETE_FAILED"));
    w.eks
        .add_nodegroup(nodegroup("other-ng", ROLE, "AL2_x86_64", "DELETING"));
    let kept = delete_of(&w, "other-ng").await;
    assert_eq!(kept.aws_auth, Some(Outcome::KeptInUse));
    assert!(
        kept.note.as_deref().unwrap().contains("demo-ng"),
        "{kept:?}"
    );
    assert!(map_roles(&w.store).effective(ROLE).is_some());
    // other-ng is gone; the operator retries demo-ng's delete: that event unmaps the role.
    w.eks.remove_nodegroup(CLUSTER, "other-ng");
    w.eks
        .add_nodegroup(nodegroup("demo-ng", ROLE, "AL2_x86_64", "DELETING"));
    gone_soon(&w, &["demo-ng"]);
    let unmapped = delete_of(&w, "demo-ng").await;
    assert_eq!(unmapped.aws_auth, Some(Outcome::Unmapped), "{unmapped:?}");
    assert!(map_roles(&w.store).effective(ROLE).is_none());
}
