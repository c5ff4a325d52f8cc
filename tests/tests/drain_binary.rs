//! The built `terminating-hook` binary, run through the local Lambda Runtime API as Lambda runs
//! it, against the fake AWS endpoints (Auto Scaling, EC2, SNS, EKS over HTTP with SigV4
//! credentials) and the fake API server (EKS token authentication, the shipped RBAC): the
//! fixtures, then the reference drain of a live termination.
//!
//! Uses the binary as built: run `cargo build --workspace --bins` after changing the function.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::LifecycleActionResult;
use node_manager_testkit::account::FakeAccount;
use node_manager_testkit::aws::{FakeAutoScalingGroup, FakeAws, FakeCluster, FakeLifecycleHook};
use node_manager_testkit::binaries::function_binary;
use node_manager_testkit::kube::FakeApiServer;
use node_manager_testkit::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};
use serde_json::Value;

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
const INSTANCE: &str = "i-0b1c2d3e4f5061728";

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

const WORKLOAD: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: aws-node, namespace: kube-system}
spec:
  selector: {matchLabels: {k8s-app: aws-node}}
  template:
    metadata: {labels: {k8s-app: aws-node}}
    spec:
      priorityClassName: system-node-critical
      containers: [{name: aws-node, image: amazon-k8s-cni}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-proxy, namespace: kube-system}
spec:
  selector: {matchLabels: {k8s-app: kube-proxy}}
  template:
    metadata: {labels: {k8s-app: kube-proxy}}
    spec:
      priorityClassName: system-node-critical
      containers: [{name: kube-proxy, image: kube-proxy}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      priorityClassName: system-cluster-critical
      containers: [{name: coredns, image: coredns}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: nginx, namespace: default}
spec:
  replicas: 4
  selector: {matchLabels: {app: nginx}}
  template:
    metadata: {labels: {app: nginx}}
    spec:
      containers: [{name: nginx, image: nginx}]
"#;

fn running_on(server: &FakeApiServer, node: &str, prefix: &str) -> usize {
    server
        .store()
        .list::<Pod>()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .starts_with(prefix)
        })
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn terminating_hook_binary_handles_the_fixtures_and_drains_a_live_termination() {
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("terminating-hook");
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
    aws.eks()
        .add_cluster(FakeCluster::new(CLUSTER, server.url(), &server.ca_data()));
    aws.eks()
        .add_access_entry(
            CLUSTER,
            &credentials.principal_arn,
            "STANDARD",
            None,
            &["open-node-manager:functions"],
        )
        .unwrap();
    let topic = aws.sns().create_topic("eks-asg-lifecycle-hook-topic");
    let mut subscription = aws.sns().subscribe(&topic).unwrap();
    aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .availability_zones(&["eu-west-1a"])
            .tag("eks:cluster-name", CLUSTER),
    );
    aws.autoscaling()
        .add_hook(
            GROUP,
            FakeLifecycleHook::terminating("Terminate-LC-Hook").notification_target(&topic),
        )
        .unwrap();
    aws.autoscaling()
        .add_instance(GROUP, INSTANCE, "eu-west-1a")
        .unwrap();
    let node = aws.ec2().add_running_instance(INSTANCE).private_dns_name;
    server
        .register_node(
            &node,
            &format!("aws:///eu-west-1a/{INSTANCE}"),
            Some(Duration::ZERO),
        )
        .unwrap();
    wait_until("the node is Ready", || {
        server.store().find::<Node>("", &node).is_some_and(|n| {
            n.status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    })
    .await;
    server.store().apply_yaml(WORKLOAD).unwrap();
    wait_until("the reference pods run", || {
        running_on(&server, &node, "nginx-") == 4
            && running_on(&server, &node, "coredns-") == 1
            && running_on(&server, &node, "aws-node-") == 1
            && running_on(&server, &node, "kube-proxy-") == 1
    })
    .await;
    server
        .register_node(
            "ip-10-0-9-9.eu-west-1.compute.internal",
            "aws:///eu-west-1b/i-0fffeeeedddd11112",
            Some(Duration::ZERO),
        )
        .unwrap();

    let lambda = LambdaRuntimeApi::start_function(
        FunctionSpec::new("terminating-hook", function_binary("terminating-hook"))
            .envs(aws.environment(&credentials))
            .env("CLUSTER_NAME", CLUSTER)
            .env("SETTLE_SECONDS", "0.1")
            .env("EVICTION_BACKOFF_SECONDS", "0.05")
            .env("EVICTION_BACKOFF_MAX_SECONDS", "0.2")
            .env("HAND_OVER_MARGIN_SECONDS", "5")
            .env("RUST_LOG", "info")
            .log_format("JSON"),
    )
    .await
    .unwrap();
    let timeout = Duration::from_secs(30);

    // The test notification: acknowledged.
    let answer = response(
        lambda
            .invoke(&fixture("sns-test-notification.json"), timeout)
            .await
            .unwrap(),
        &lambda.output(),
    );
    assert_eq!(
        answer["records"][0]["outcome"], "TestNotification",
        "{answer}"
    );

    // The terminating fixture: its instance is unknown to EC2 and has no node, so the action
    // is completed at once; Auto Scaling does not know the fixture's token ("No active
    // Lifecycle Action"), which is success.
    let answer = response(
        lambda
            .invoke(&fixture("sns-lifecycle-terminating.json"), timeout)
            .await
            .unwrap(),
        &lambda.output(),
    );
    assert_eq!(answer["records"][0]["outcome"], "NoNode", "{answer}");
    assert!(server.audit().filter(|e| e.verb == "patch").is_empty());

    // A live termination of the reference node.
    let before: BTreeSet<String> = server
        .store()
        .list::<Pod>()
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
        .filter_map(|p| p.metadata.name)
        .filter(|n| n.starts_with("nginx-") || n.starts_with("coredns-"))
        .collect();
    aws.autoscaling()
        .terminate_instance(GROUP, INSTANCE)
        .unwrap();
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let answer = response(
        lambda.invoke(&event, timeout).await.unwrap(),
        &lambda.output(),
    );
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let completions = aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);
    assert_eq!(completions[0].instance_id, INSTANCE);

    // The audit log: the label patch, the cordon patch, evictions of nginx and coredns only.
    let writes: Vec<_> = server
        .audit()
        .filter(|e| e.verb == "patch" || e.subresource() == "eviction");
    let label = writes
        .iter()
        .position(|e| {
            e.resource() == "nodes" && e.request_object.as_ref().is_some_and(|o| {
                o["metadata"]["labels"]["node.kubernetes.io/exclude-from-external-load-balancers"]
                    == "true"
            })
        })
        .expect("label patch");
    let cordon = writes
        .iter()
        .position(|e| {
            e.resource() == "nodes"
                && e.request_object
                    .as_ref()
                    .is_some_and(|o| o["spec"]["unschedulable"] == true)
        })
        .expect("cordon patch");
    let first_eviction = writes
        .iter()
        .position(|e| e.subresource() == "eviction")
        .expect("evictions");
    assert!(label < cordon && cordon < first_eviction);
    let evicted: BTreeSet<String> = writes
        .iter()
        .filter(|e| e.subresource() == "eviction" && (200..300).contains(&e.code()))
        .map(|e| e.name().to_owned())
        .collect();
    assert_eq!(evicted, before);

    // One JSON log line per step with the fields an operator searches by, and EMF metrics.
    let output = lambda.output();
    let cordoned = output
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line.to_string().contains("\"cordoned\""))
        .unwrap_or_else(|| panic!("no JSON log line for the cordon step:\n{output}"));
    let text = cordoned.to_string();
    for field in ["instance_id", "asg", "hook", "request_id", "node"] {
        assert!(text.contains(field), "{field} missing from {text}");
    }
    assert!(
        output.lines().any(|l| l.contains("\"_aws\"")
            && l.contains("DrainDuration")
            && l.contains("PodsEvicted")),
        "{output}"
    );
}
