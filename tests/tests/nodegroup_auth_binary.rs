//! The built `nodegroup-auth` binary, run through the local Lambda Runtime API as Lambda runs
//! it, against the fake AWS endpoints (real SDK calls) and the fake API server (EKS tokens,
//! the shipped RBAC): the EventBridge fixtures, a forged event, both authentication modes.
//!
//! Uses the binary as built: run `cargo build --workspace --bins` after changing the function.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::ConfigMap;
use node_manager::nodegroup_auth::role_mapping::MapRoles;
use node_manager_testkit::aws::FakeNodegroup;
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

#[tokio::test]
async fn nodegroup_auth_binary_handles_the_fixtures() {
    // In CONFIG_MAP mode the function itself is known through aws-auth.
    let w = FunctionWorld::builder()
        .functions(&[Target::NodegroupAuth])
        .authentication_mode("CONFIG_MAP")
        .env("DELETE_WAIT_SECONDS", "5")
        .env("DELETE_POLL_SECONDS", "1")
        .log_level("info")
        .start()
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
