//! `lifecycle::node::find_node` (shared by both hooks) against the fake API server: the
//! private DNS name with one GET, verified by providerID, and the paged providerID scan.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Node;
use node_manager::aws::AwsErrorKind;
use node_manager::aws::in_memory::InMemoryInstances;
use node_manager::lifecycle::node::find_node;
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use serde_json::json;

const INSTANCE: &str = "i-07e9ea9eb19a67337";
const DNS: &str = "ip-10-0-1-10.eu-west-1.compute.internal";

async fn server() -> FakeApiServer {
    FakeApiServer::builder()
        .simulation(SimulationTimings::disabled())
        .start()
        .await
        .unwrap()
}

fn add_node(server: &FakeApiServer, name: &str, instance_id: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "providerID": format!("aws:///eu-west-1a/{instance_id}") },
    }))
    .unwrap();
    server.store().create(&node).unwrap();
}

fn node_requests(server: &FakeApiServer, verb: &str) -> usize {
    server.audit().requests(verb, "nodes").len()
}

#[tokio::test]
async fn named_after_the_dns_name_one_get() {
    let server = server().await;
    add_node(&server, DNS, INSTANCE);
    add_node(
        &server,
        "ip-10-0-1-11.eu-west-1.compute.internal",
        "i-0000000000000000a",
    );
    let instances = InMemoryInstances::default();
    instances.add(INSTANCE, DNS);
    let client = server.admin_client().await.unwrap();

    let node = find_node(&client, &instances, INSTANCE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some(DNS));
    assert_eq!(node_requests(&server, "get"), 1);
    assert_eq!(node_requests(&server, "list"), 0);
}

#[tokio::test]
async fn a_reused_name_is_not_trusted() {
    let server = server().await;
    // The DNS name's node belongs to an older instance; ours registered under another name.
    add_node(&server, DNS, "i-0000000000000000b");
    add_node(&server, "custom-name", INSTANCE);
    let instances = InMemoryInstances::default();
    instances.add(INSTANCE, DNS);
    let client = server.admin_client().await.unwrap();

    let node = find_node(&client, &instances, INSTANCE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some("custom-name"));
    assert_eq!(node_requests(&server, "list"), 1);
}

#[tokio::test]
async fn ec2_failing_or_not_knowing_the_instance_falls_back_to_the_scan() {
    let server = server().await;
    add_node(&server, "custom-name", INSTANCE);
    let client = server.admin_client().await.unwrap();

    let unknown = InMemoryInstances::default();
    let node = find_node(&client, &unknown, INSTANCE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some("custom-name"));

    let denied = InMemoryInstances::default();
    denied.add(INSTANCE, DNS);
    denied
        .faults
        .fail("DescribeInstances", AwsErrorKind::AccessDenied, 1);
    let node = find_node(&client, &denied, INSTANCE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some("custom-name"));
    assert_eq!(node_requests(&server, "get"), 0);
}

#[tokio::test]
async fn no_node_is_none() {
    let server = server().await;
    add_node(&server, "other", "i-0000000000000000c");
    let instances = InMemoryInstances::default();
    instances.add(INSTANCE, DNS);
    let client = server.admin_client().await.unwrap();
    assert!(
        find_node(&client, &instances, INSTANCE)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn the_scan_pages_through_every_node() {
    let server = server().await;
    for i in 0..1100 {
        add_node(
            &server,
            &format!("node-{i:04}"),
            &format!("i-{:017x}", 0x1000 + i),
        );
    }
    add_node(&server, "node-zzzz", INSTANCE);
    let client = server.admin_client().await.unwrap();

    let node = find_node(&client, &InMemoryInstances::default(), INSTANCE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some("node-zzzz"));
    let lists = server.audit().requests("list", "nodes");
    assert_eq!(lists.len(), 3, "pages of 500");
    assert!(lists.iter().all(|e| e.request_uri.contains("limit=500")));
}
