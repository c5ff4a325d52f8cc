//! The built `nodegroup-auth` binary, run through the local Lambda Runtime API as Lambda runs
//! it, against the fake AWS endpoints (real SDK calls) and the fake API server (EKS tokens,
//! the shipped RBAC): the EventBridge fixtures, a forged event, both authentication modes.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing the function.
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

/// The delete event of node group `name` (the fixture's, renamed).
fn delete_event(name: &str) -> serde_json::Value {
    let mut event = fixture("eventbridge-delete-nodegroup.json");
    event["detail"]["requestParameters"]["nodegroupName"] = json!(name);
    event["detail"]["responseElements"]["nodegroup"]["nodegroupName"] = json!(name);
    event
}

/// Two node groups of one role, each with a live instance (through the role's instance
/// profile), the role mapped by demo-ng's create; the delete wait polls every second.
async fn two_node_groups_of_one_role() -> FunctionWorld {
    let w = nodegroup_auth_world(
        "CONFIG_MAP",
        &[("DELETE_WAIT_SECONDS", "10"), ("DELETE_POLL_SECONDS", "1")],
    )
    .await;
    let aws = &w.aws;
    let answer = w
        .function(Target::NodegroupAuth)
        .response_to(&fixture("eventbridge-create-nodegroup.json"))
        .await;
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "mapped", "{answer}");
    aws.eks()
        .add_nodegroup(CLUSTER, FakeNodegroup::new("other-ng", NODE_ROLE))
        .unwrap();
    let role_name = NODE_ROLE.rsplit('/').next().unwrap();
    let profile = aws
        .iam()
        .add_instance_profile(role_name, "node-group-nodes");
    let region = aws.account().region.clone();
    for group in ["demo-ng", "other-ng"] {
        aws.ec2().add_instance(
            FakeInstance::new(&instance_of(group), &region)
                .instance_profile(&profile)
                .tag("eks:cluster-name", CLUSTER)
                .tag("eks:nodegroup-name", group),
        );
    }
    w
}

/// The live instance of node group `group` in [`two_node_groups_of_one_role`].
fn instance_of(group: &str) -> String {
    if group == "demo-ng" {
        "i-0d0d0d0d0d0d0d0d0".to_owned()
    } else {
        "i-0e0e0e0e0e0e0e0e0".to_owned()
    }
}

fn mark_deleting(w: &FunctionWorld, group: &str) {
    w.aws
        .eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new(group, NODE_ROLE).status("DELETING"),
        )
        .unwrap();
}

/// As EKS does a little after the delete event: `groups` gone with their instances.
fn gone_soon(w: &FunctionWorld, groups: &[&'static str]) -> tokio::task::JoinHandle<()> {
    let (eks, ec2) = (w.aws.eks(), w.aws.ec2());
    let groups = groups.to_vec();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        for group in groups {
            ec2.set_state(&instance_of(group), InstanceState::Terminated);
            eks.remove_nodegroup(CLUSTER, group);
        }
    })
}

#[tokio::test]
async fn nodegroup_auth_binary_unmaps_a_shared_role_when_the_second_of_two_deleted_groups_goes() {
    for (first, second) in [("demo-ng", "other-ng"), ("other-ng", "demo-ng")] {
        let w = two_node_groups_of_one_role().await;
        let function = w.function(Target::NodegroupAuth);
        // The first delete is handled while the other node group is ACTIVE: kept for it.
        mark_deleting(&w, first);
        let answer = function.response_to(&delete_event(first)).await;
        assert_eq!(
            answer["nodegroups"][0]["awsAuth"], "kept-in-use",
            "{first}: {answer}"
        );
        assert!(answer.to_string().contains(second), "{answer}");
        // The second is deleted while the first is still DELETING: the first is no future
        // user of the role, and its own delete was answered already; once both are gone
        // with their instances, the second delete removes the entry.
        mark_deleting(&w, second);
        let removal = gone_soon(&w, &[first, second]);
        let answer = function.response_to(&delete_event(second)).await;
        removal.await.unwrap();
        assert_eq!(
            answer["nodegroups"][0]["awsAuth"], "unmapped",
            "{first} then {second}: {answer}"
        );
        assert!(map_roles(&w.server).effective(NODE_ROLE).is_none());
    }
}

#[tokio::test]
async fn nodegroup_auth_binary_keeps_a_shared_role_for_the_live_nodes_of_a_deleting_group() {
    let w = two_node_groups_of_one_role().await;
    let function = w.function(Target::NodegroupAuth);
    // Both node groups are being deleted before either event is handled.
    mark_deleting(&w, "demo-ng");
    mark_deleting(&w, "other-ng");
    // demo-ng goes first; other-ng's node still runs with the role: kept for that instance.
    let removal = gone_soon(&w, &["demo-ng"]);
    let answer = function.response_to(&delete_event("demo-ng")).await;
    removal.await.unwrap();
    assert_eq!(
        answer["nodegroups"][0]["awsAuth"], "kept-in-use",
        "{answer}"
    );
    assert_eq!(
        answer["nodegroups"][0]["instances"],
        json!([instance_of("other-ng")]),
        "{answer}"
    );
    assert!(map_roles(&w.server).effective(NODE_ROLE).is_some());
    // other-ng goes with its node: its delete removes the entry.
    let removal = gone_soon(&w, &["other-ng"]);
    let answer = function.response_to(&delete_event("other-ng")).await;
    removal.await.unwrap();
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "unmapped", "{answer}");
    assert!(map_roles(&w.server).effective(NODE_ROLE).is_none());
}
