//! The built `nodegroup-auth` binary, run through the local Lambda Runtime API as Lambda runs
//! it, against the fake AWS endpoints (real SDK calls) and the fake API server (EKS tokens,
//! the shipped RBAC): the EventBridge fixtures, a forged event, both authentication modes.
//!
//! Uses the binary as built: run `cargo build --workspace --bins` after changing the function.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use node_manager::nodegroup_auth::role_mapping::MapRoles;
use node_manager_testkit::account::FakeAccount;
use node_manager_testkit::aws::{FakeAws, FakeCluster, FakeNodegroup};
use node_manager_testkit::binaries::function_binary;
use node_manager_testkit::kube::FakeApiServer;
use node_manager_testkit::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};
use serde_json::{Value, json};

const CLUSTER: &str = "ironman-2022";
const NODE_ROLE: &str = "arn:aws:iam::111111111111:role/eksctl-ironman-2022-nodegroup-demo-ng-NodeInstanceRole-454Q2XHJ5LZ0";

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/../../shared/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn response(outcome: InvocationOutcome, output: &str) -> Value {
    match outcome {
        InvocationOutcome::Response(value) => value,
        other => panic!("expected a response, got {other:?}\n--- function output ---\n{output}"),
    }
}

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
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("nodegroup-auth");
    let aws = FakeAws::start(account.clone()).await.unwrap();
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .account(account.clone())
        .access_entries(Arc::new(aws.eks()))
        .start()
        .await
        .unwrap();
    server
        .apply_manifest_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/rbac.yaml"),
        )
        .unwrap();
    aws.eks().add_cluster(
        FakeCluster::new(CLUSTER, server.url(), &server.ca_data())
            .authentication_mode(Some("CONFIG_MAP")),
    );
    // In CONFIG_MAP mode the function itself is known through aws-auth.
    let function_role = &credentials.principal_arn;
    let map_users = "- userarn: arn:aws:iam::111111111111:user/cli\n  username: cli\n  groups: [system:masters]\n";
    server
        .store()
        .apply_yaml(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: aws-auth\n  namespace: kube-system\ndata:\n  mapRoles: |\n    - rolearn: {function_role}\n      username: nodegroup-auth\n      groups: [open-node-manager:functions]\n  mapUsers: |\n{}",
            map_users.lines().map(|l| format!("    {l}\n")).collect::<String>()
        ))
        .unwrap();
    aws.eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new("demo-ng", NODE_ROLE).ami_type("AL2_x86_64"),
        )
        .unwrap();

    let lambda = LambdaRuntimeApi::start_function(
        FunctionSpec::new("nodegroup-auth", function_binary("nodegroup-auth"))
            .envs(aws.environment(&credentials))
            .env("CLUSTER_NAME", CLUSTER)
            .env("DELETE_WAIT_SECONDS", "5")
            .env("DELETE_POLL_SECONDS", "1")
            .env("RUST_LOG", "info"),
    )
    .await
    .unwrap();
    let timeout = Duration::from_secs(30);

    // CreateNodegroup: mapped, the other keys untouched.
    let answer = response(
        lambda
            .invoke(&fixture("eventbridge-create-nodegroup.json"), timeout)
            .await
            .unwrap(),
        &lambda.output(),
    );
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "mapped", "{answer}");
    let map = map_roles(&server);
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
    let answer = response(
        lambda
            .invoke(&fixture("eventbridge-create-nodegroup.json"), timeout)
            .await
            .unwrap(),
        &lambda.output(),
    );
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "already-mapped");
    assert_eq!(
        server.audit().requests("update", "configmaps").len(),
        updates
    );

    // A forged event: refused, named.
    let mut forged = fixture("eventbridge-create-nodegroup.json");
    forged["account"] = json!("222222222222");
    match lambda.invoke(&forged, timeout).await.unwrap() {
        InvocationOutcome::Error {
            error_type,
            error_message,
        } => {
            assert_eq!(error_type, "NodegroupAuth.Rejected");
            assert!(error_message.contains("222222222222"), "{error_message}");
        }
        other => panic!("expected an error, got {other:?}"),
    }

    // DeleteNodegroup once the node group is gone: unmapped.
    assert!(aws.eks().remove_nodegroup(CLUSTER, "demo-ng"));
    let answer = response(
        lambda
            .invoke(&fixture("eventbridge-delete-nodegroup.json"), timeout)
            .await
            .unwrap(),
        &lambda.output(),
    );
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "unmapped", "{answer}");
    let map = map_roles(&server);
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
    let answer = response(
        lambda
            .invoke(
                &json!({"clusterName": CLUSTER, "nodegroupName": "win-ng"}),
                timeout,
            )
            .await
            .unwrap(),
        &lambda.output(),
    );
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
    let output = lambda.output();
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
