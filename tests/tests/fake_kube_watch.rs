//! Watches, as kube-runtime's watcher and raw `watch` calls use them.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use node_manager_testkit::fixtures;
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use serde_json::json;

async fn server() -> FakeApiServer {
    FakeApiServer::builder()
        .simulation(SimulationTimings::disabled())
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn watch_from_a_resource_version_sees_later_changes_with_selectors() {
    let server = server().await;
    let store = server.store();
    store
        .create(&fixtures::running_pod(
            "default",
            "a",
            "n1",
            &[("app", "web")],
        ))
        .unwrap();
    let client = server.admin_client().await.unwrap();
    let pods: Api<Pod> = Api::all(client);
    let from = store.resource_version().to_string();
    let params = WatchParams::default().fields("spec.nodeName=n1").timeout(5);
    let mut stream = pods.watch(&params, &from).await.unwrap().boxed();

    store
        .create(&fixtures::running_pod("default", "b", "n1", &[]))
        .unwrap();
    store
        .create(&fixtures::running_pod("default", "c", "n2", &[]))
        .unwrap();
    store.remove::<Pod>("default", "a");

    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(2), stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(pod)) => {
                seen.push(format!("ADDED {}", pod.metadata.name.unwrap()))
            }
            Some(WatchEvent::Deleted(pod)) => {
                seen.push(format!("DELETED {}", pod.metadata.name.unwrap()))
            }
            Some(WatchEvent::Bookmark(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED b", "DELETED a"]);
}

#[tokio::test]
async fn too_old_resource_version_is_410_gone() {
    let server = server().await;
    let store = server.store();
    for index in 0..20_100 {
        store
            .create(&fixtures::ready_node(&format!("n{index}")))
            .unwrap();
    }
    let nodes: Api<Node> = Api::all(server.admin_client().await.unwrap());
    let mut stream = nodes
        .watch(&WatchParams::default(), "2")
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(error)) => {
            assert_eq!(error.code, 410);
            assert!(
                error.message.starts_with("too old resource version: 2"),
                "{}",
                error.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn kube_runtime_watcher_sees_a_node_cordon() {
    let server = server().await;
    server.store().create(&fixtures::ready_node("n1")).unwrap();
    let client = server.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let events = watcher(
        nodes.clone(),
        watcher::Config::default().fields("metadata.name=n1"),
    );
    let mut objects = Box::pin(kube::runtime::WatchStreamExt::applied_objects(events));
    let first = tokio::time::timeout(Duration::from_secs(2), objects.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.spec.unwrap().unschedulable, None);
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(2), objects.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(second.spec.unwrap().unschedulable, Some(true));
    assert!(!server.audit().requests("watch", "nodes").is_empty());
}
