//! Evictions against PDBs, with the emulated controllers replacing evicted pods.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, Patch, PatchParams};
use node_manager_testkit::fixtures;
use node_manager_testkit::kube::FakeApiServer;
use serde_json::json;

const WEB: &[(&str, &str)] = &[("app", "web")];

/// Two nodes, a ReplicaSet of 2 pods on n1, a PDB with minAvailable 1.
async fn cluster() -> FakeApiServer {
    let server = FakeApiServer::builder().start().await.unwrap();
    let store = server.store();
    store.create(&fixtures::ready_node("n1")).unwrap();
    store.create(&fixtures::ready_node("n2")).unwrap();
    let rs: ReplicaSet = store
        .create(&fixtures::replica_set("default", "web", 2, WEB))
        .unwrap();
    for name in ["web-a", "web-b"] {
        store
            .create(&fixtures::owned_by(
                fixtures::running_pod("default", name, "n1", WEB),
                &rs,
            ))
            .unwrap();
    }
    store
        .create(&fixtures::pdb_min_available("default", "web", 1, WEB))
        .unwrap();
    server
        .wait_for(
            "the PDB to allow one disruption",
            Duration::from_secs(2),
            |s| {
                s.get::<PodDisruptionBudget>("default", "web")
                    .ok()
                    .and_then(|p| p.status)
                    .is_some_and(|st| st.disruptions_allowed == 1 && st.current_healthy == 2)
            },
        )
        .await
        .unwrap();
    server
}

fn status_of(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn eviction_is_refused_with_429_until_the_replacement_is_ready() {
    let server = cluster().await;
    let client = server.admin_client_without_retries().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");

    pods.evict("web-a", &EvictParams::default()).await.unwrap();
    let refused = status_of(
        pods.evict("web-b", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 429);
    assert_eq!(refused.reason, "TooManyRequests");
    assert_eq!(
        refused.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let cause = &refused.details.unwrap().causes[0];
    assert_eq!(cause.reason, "DisruptionBudget");

    // The ReplicaSet controller replaces web-a on n2 (n1 is cordoned); once Ready, the budget
    // allows the second eviction.
    let started = std::time::Instant::now();
    loop {
        match pods.evict("web-b", &EvictParams::default()).await {
            Ok(_) => break,
            Err(error) => assert_eq!(status_of(error).code, 429),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "eviction never allowed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let replacements: Vec<Pod> = server.store().list_in("default");
    assert!(
        replacements
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .all(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some("n2")),
        "replacements must land on the schedulable node"
    );
    let evictions = server.audit().subresource_requests("pods", "eviction");
    assert!(evictions.iter().any(|e| e.code() == 429));
    assert_eq!(evictions.iter().filter(|e| e.code() == 201).count(), 2);
}

#[tokio::test]
async fn racing_evictions_cannot_both_spend_the_last_unit() {
    let server = cluster().await;
    let client = server.admin_client_without_retries().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let params = EvictParams::default();
    let (a, b) = tokio::join!(pods.evict("web-a", &params), pods.evict("web-b", &params));
    let allowed = [a.is_ok(), b.is_ok()].iter().filter(|ok| **ok).count();
    assert_eq!(
        allowed, 1,
        "exactly one of two racing evictions may pass: {a:?} {b:?}"
    );
}

#[tokio::test]
async fn eviction_errors_have_the_real_shapes() {
    let server = cluster().await;
    let client = server.admin_client_without_retries().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let missing = status_of(
        pods.evict("nope", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(missing.code, 404);
    assert_eq!(missing.message, "pods \"nope\" not found");

    server
        .store()
        .create(&fixtures::pdb_max_unavailable(
            "default",
            "web-too",
            json!("50%"),
            WEB,
        ))
        .unwrap();
    let twice = status_of(
        pods.evict("web-a", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(twice.code, 500);
    assert_eq!(
        twice.message,
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
}

#[tokio::test]
async fn deleting_a_workload_or_a_node_collects_its_pods_and_status_is_kept() {
    let server = cluster().await;
    let store = server.store();
    server
        .wait_for("ReplicaSet status", Duration::from_secs(2), |s| {
            s.get::<ReplicaSet>("default", "web")
                .ok()
                .and_then(|rs| rs.status)
                .is_some_and(|st| st.replicas == 2 && st.ready_replicas == Some(2))
        })
        .await
        .unwrap();
    store
        .create(&fixtures::running_pod("default", "lonely", "n2", &[]))
        .unwrap();
    let client = server.admin_client_without_retries().await.unwrap();
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    replica_sets
        .delete("web", &Default::default())
        .await
        .unwrap();
    server
        .wait_for(
            "the ReplicaSet's pods to be collected",
            Duration::from_secs(3),
            |s| {
                s.list_in::<Pod>("default")
                    .iter()
                    .all(|p| p.metadata.name.as_deref() == Some("lonely"))
            },
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client);
    nodes.delete("n2", &Default::default()).await.unwrap();
    server
        .wait_for(
            "the pods of the deleted node to go",
            Duration::from_secs(2),
            |s| s.list_in::<Pod>("default").is_empty(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn dry_run_evictions_and_patches_write_nothing() {
    let server = cluster().await;
    let client = server.admin_client_without_retries().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.evict(
        "web-a",
        &EvictParams {
            delete_options: None,
            post_options: kube::api::PostParams {
                dry_run: true,
                field_manager: None,
            },
        },
    )
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(client);
    let patched = nodes
        .patch(
            "n1",
            &PatchParams {
                dry_run: true,
                ..PatchParams::default()
            },
            &Patch::Merge(json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().unschedulable, Some(true));
    let node: Node = server.store().get("", "n1").unwrap();
    assert_eq!(
        node.spec.unwrap().unschedulable,
        None,
        "a dry-run patch must not write"
    );
    let pdb: PodDisruptionBudget = server.store().get("default", "web").unwrap();
    assert_eq!(
        pdb.status.unwrap().disruptions_allowed,
        1,
        "a dry-run eviction spends nothing"
    );
    assert!(
        server
            .store()
            .get::<Pod>("default", "web-a")
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
}
