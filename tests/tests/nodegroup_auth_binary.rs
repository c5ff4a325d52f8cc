//! The built `nodegroup-auth` binary, run through the local Lambda Runtime API as Lambda runs
//! it, against the fake AWS endpoints (real SDK calls) and the fake API server (EKS tokens,
//! the shipped RBAC): the EventBridge fixtures, a forged event, both authentication modes.
//!
//! Uses the binary as built: run `cargo build --workspace --bins` after changing the function.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::ConfigMap;
use node_manager::nodegroup_auth::role_mapping::MapRoles;
use node_manager_testkit::aws::{AwsFault, FakeInstance, FakeNodegroup, InstanceState, Service};
use node_manager_testkit::e2e::{CLUSTER, FunctionWorld, NODE_ROLE, Target};
use node_manager_testkit::kube::FakeApiServer;
use node_manager_testkit::soak::corpus::fixture;
use serde_json::json;

fn map_roles(server: &FakeApiServer) -> MapRoles {
    let cm = server
        .store()
        .find::<ConfigMap>("kube-system", "aws-auth")
        .unwrap();
    MapRoles::parse(
        cm.data
            .as_ref()
            .and_then(|d| d.get("mapRoles"))
            .map(String::as_str),
    )
    .unwrap()
}

/// `nodegroup-auth` (info logs) on a cluster in authentication `mode`, with `settings` added
/// to its environment.
async fn nodegroup_auth_world(mode: &str, settings: &[(&str, &str)]) -> FunctionWorld {
    let mut builder = FunctionWorld::builder()
        .functions(&[Target::NodegroupAuth])
        .authentication_mode(mode)
        .log_level("info");
    for (key, value) in settings {
        builder = builder.env(key, value);
    }
    builder.start().await
}

#[tokio::test]
async fn nodegroup_auth_binary_handles_the_fixtures() {
    // In CONFIG_MAP mode the function itself is known through aws-auth.
    let w = nodegroup_auth_world(
        "CONFIG_MAP",
        &[("DELETE_WAIT_SECONDS", "5"), ("DELETE_POLL_SECONDS", "1")],
    )
    .await;
    let (aws, server) = (&w.aws, &w.server);
    let function = w.function(Target::NodegroupAuth);
    let function_role = &function.credentials.principal_arn;
    let map_users = "- userarn: arn:aws:iam::111111111111:user/cli\n  username: cli\n  groups: [system:masters]\n";
    server
        .store()
        .modify::<ConfigMap>("kube-system", "aws-auth", |cm| {
            cm.data
                .get_or_insert_default()
                .insert("mapUsers".to_owned(), map_users.to_owned());
        })
        .unwrap();

    // CreateNodegroup: mapped, the other keys untouched.
    let answer = function
        .response_to(&fixture("eventbridge-create-nodegroup.json"))
        .await;
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "mapped", "{answer}");
    let map = map_roles(server);
    assert!(map.effective(NODE_ROLE).is_some());
    assert!(
        map.effective(function_role).is_some(),
        "the function's own mapping is kept"
    );
    let cm = server
        .store()
        .find::<ConfigMap>("kube-system", "aws-auth")
        .unwrap();
    assert_eq!(cm.data.unwrap()["mapUsers"], map_users);

    // Delivered again: nothing written.
    let updates = server.audit().requests("update", "configmaps").len();
    let answer = function
        .response_to(&fixture("eventbridge-create-nodegroup.json"))
        .await;
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "already-mapped");
    assert_eq!(
        server.audit().requests("update", "configmaps").len(),
        updates
    );

    // A forged event: refused, named.
    let mut forged = fixture("eventbridge-create-nodegroup.json");
    forged["account"] = json!("222222222222");
    let (error_type, error_message) = function.error_from(&forged).await;
    assert_eq!(error_type, "NodegroupAuth.Rejected");
    assert!(error_message.contains("222222222222"), "{error_message}");

    // DeleteNodegroup while the node group is DELETING: the function waits for it to be
    // gone (polling every second), then unmaps. (Once gone, a delivery is unverifiable and
    // would keep the mapping.)
    aws.eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new("demo-ng", NODE_ROLE).status("DELETING"),
        )
        .unwrap();
    let eks = aws.eks();
    let remover = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        eks.remove_nodegroup(CLUSTER, "demo-ng")
    });
    let answer = function
        .response_to(&fixture("eventbridge-delete-nodegroup.json"))
        .await;
    assert!(remover.await.unwrap());
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "unmapped", "{answer}");
    let map = map_roles(server);
    assert!(map.effective(NODE_ROLE).is_none());
    assert!(map.effective(function_role).is_some());

    // API mode: an access entry, the ConfigMap untouched.
    aws.eks()
        .set_authentication_mode(CLUSTER, Some("API"))
        .unwrap();
    aws.eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new("win-ng", NODE_ROLE).ami_type("WINDOWS_CORE_2022_x86_64"),
        )
        .unwrap();
    let before = server
        .store()
        .find::<ConfigMap>("kube-system", "aws-auth")
        .unwrap();
    let answer = function
        .response_to(&json!({"clusterName": CLUSTER, "nodegroupName": "win-ng"}))
        .await;
    assert_eq!(answer["nodegroups"][0]["accessEntry"], "mapped", "{answer}");
    let entry = aws.eks().access_entry(CLUSTER, NODE_ROLE).unwrap();
    assert_eq!(entry.entry_type, "EC2_WINDOWS");
    assert_eq!(
        server
            .store()
            .find::<ConfigMap>("kube-system", "aws-auth")
            .unwrap(),
        before
    );

    // Logs: the write is logged with hashes, never the content; EMF lines.
    let output = function.runtime.output();
    assert!(output.contains("new_sha256"), "{output}");
    assert!(
        !output.contains("system:masters"),
        "aws-auth content leaked into the logs"
    );
    assert!(
        output
            .lines()
            .any(|l| l.contains("\"_aws\"") && l.contains("nodegroup-auth"))
    );
}

/// The Warning Events about aws-auth with `reason`, as core/v1 Events.
fn warnings(server: &FakeApiServer, reason: &str) -> Vec<String> {
    server
        .store()
        .list::<k8s_openapi::api::core::v1::Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn nodegroup_auth_binary_never_unmaps_a_role_live_instances_run_with() {
    let w = nodegroup_auth_world("CONFIG_MAP", &[("DELETE_WAIT_SECONDS", "0")]).await;
    let (aws, server) = (&w.aws, &w.server);
    let function = w.function(Target::NodegroupAuth);
    let region = aws.account().region.clone();
    let answer = function
        .response_to(&fixture("eventbridge-create-nodegroup.json"))
        .await;
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "mapped", "{answer}");

    // A self-managed node of this cluster runs with the role (through an instance profile);
    // a terminated node of the cluster and a live node of another cluster do too.
    let role_name = NODE_ROLE.rsplit('/').next().unwrap();
    let profile = aws
        .iam()
        .add_instance_profile(role_name, "self-managed-nodes");
    let live = "i-0123456789abcdef0";
    aws.ec2().add_instance(
        FakeInstance::new(live, &region)
            .instance_profile(&profile)
            .tag(&format!("kubernetes.io/cluster/{CLUSTER}"), "owned"),
    );
    aws.ec2().add_instance(
        FakeInstance::new("i-0aaaaaaaaaaaaaaaa", &region)
            .instance_profile(&profile)
            .tag("eks:cluster-name", CLUSTER)
            .state(InstanceState::Terminated),
    );
    aws.ec2().add_instance(
        FakeInstance::new("i-0bbbbbbbbbbbbbbbb", &region)
            .instance_profile(&profile)
            .tag("eks:cluster-name", "prod")
            .tag("kubernetes.io/cluster/prod", "owned"),
    );
    aws.eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new("demo-ng", NODE_ROLE).status("DELETING"),
        )
        .unwrap();
    let delete = fixture("eventbridge-delete-nodegroup.json");
    // One IAM 500 first: tried again, as the SDK clients would.
    aws.faults().inject(AwsFault {
        times: Some(1),
        ..AwsFault::internal_error().on(Service::Iam, "ListInstanceProfilesForRole")
    });
    let answer = function.response_to(&delete).await;
    assert_eq!(
        answer["nodegroups"][0]["awsAuth"], "kept-in-use",
        "{answer}"
    );
    assert_eq!(
        answer["nodegroups"][0]["instances"],
        json!([live]),
        "{answer}"
    );
    assert!(map_roles(server).effective(NODE_ROLE).is_some());
    let events = warnings(server, "NodeRoleInUse");
    assert!(events.iter().any(|m| m.contains(live)), "{events:?}");
    // The hand-signed IAM call was accepted (signature checked by the fake) for the role.
    // The first answer was the injected 500, the retry's a 200.
    let listed = aws.requests_for("ListInstanceProfilesForRole");
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0].status, 500);
    assert_eq!(listed[1].status, 200, "{listed:?}");
    assert_eq!(listed[1].params["RoleName"], role_name);

    // IAM failing: nothing removed on an unknown.
    aws.faults()
        .inject(AwsFault::internal_error().on(Service::Iam, "ListInstanceProfilesForRole"));
    let answer = function.response_to(&delete).await;
    assert_eq!(
        answer["nodegroups"][0]["awsAuth"], "kept-unchecked",
        "{answer}"
    );
    assert!(map_roles(server).effective(NODE_ROLE).is_some());
    assert!(!warnings(server, "NodeRoleUsageUnknown").is_empty());
    aws.faults().clear();

    // The live node gone: only the terminated one and the other cluster's remain: unmapped.
    aws.ec2().set_state(live, InstanceState::Terminated);
    let answer = function.response_to(&delete).await;
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "unmapped", "{answer}");
    assert!(map_roles(server).effective(NODE_ROLE).is_none());
}

#[tokio::test]
async fn nodegroup_auth_binary_keeps_the_access_entry_of_a_role_live_instances_run_with() {
    let w = nodegroup_auth_world("API", &[("DELETE_WAIT_SECONDS", "0")]).await;
    let aws = &w.aws;
    let function = w.function(Target::NodegroupAuth);
    let region = aws.account().region.clone();
    let answer = function
        .response_to(&fixture("eventbridge-create-nodegroup.json"))
        .await;
    assert_eq!(answer["nodegroups"][0]["accessEntry"], "mapped", "{answer}");
    let role_name = NODE_ROLE.rsplit('/').next().unwrap();
    let profile = aws.iam().add_instance_profile(role_name, "karpenter-nodes");
    let stopped = "i-0cccccccccccccccc";
    aws.ec2().add_instance(
        FakeInstance::new(stopped, &region)
            .instance_profile(&profile)
            .tag("eks:cluster-name", CLUSTER)
            .state(InstanceState::Stopped),
    );
    aws.eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new("demo-ng", NODE_ROLE).status("DELETING"),
        )
        .unwrap();
    let delete = fixture("eventbridge-delete-nodegroup.json");
    let answer = function.response_to(&delete).await;
    assert_eq!(
        answer["nodegroups"][0]["accessEntry"], "kept-in-use",
        "{answer}"
    );
    assert_eq!(answer["nodegroups"][0]["instances"], json!([stopped]));
    assert!(aws.eks().access_entry(CLUSTER, NODE_ROLE).is_some());

    // EC2 failing: kept.
    aws.faults()
        .inject(AwsFault::unavailable().on(Service::Ec2, "DescribeInstances"));
    let answer = function.response_to(&delete).await;
    assert_eq!(
        answer["nodegroups"][0]["accessEntry"], "kept-unchecked",
        "{answer}"
    );
    assert!(aws.eks().access_entry(CLUSTER, NODE_ROLE).is_some());
    aws.faults().clear();

    aws.ec2().set_state(stopped, InstanceState::Terminated);
    let answer = function.response_to(&delete).await;
    assert_eq!(
        answer["nodegroups"][0]["accessEntry"], "unmapped",
        "{answer}"
    );
    assert!(aws.eks().access_entry(CLUSTER, NODE_ROLE).is_none());
}
