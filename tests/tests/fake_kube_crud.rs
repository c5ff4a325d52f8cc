//! The fake API server's verbs, driven by the real `kube::Client` over HTTPS.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use serde_json::json;

fn pod(name: &str, node: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default", "labels": labels },
        "spec": { "nodeName": node, "containers": [{ "name": "app", "image": "nginx" }] },
    }))
    .unwrap()
}

fn kube_error(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(response) => *response,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn server() -> FakeApiServer {
    FakeApiServer::builder()
        .simulation(SimulationTimings::disabled())
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn create_get_list_update_delete_configmap() {
    let server = server().await;
    let client = server.admin_client().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "settings", "labels": { "app": "web" } },
        "data": { "a": "1" },
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    assert!(created.metadata.creation_timestamp.is_some());
    assert!(created.metadata.resource_version.is_some());

    let again = kube_error(api.create(&PostParams::default(), &cm).await.unwrap_err());
    assert_eq!(again.code, 409);
    assert_eq!(again.reason, "AlreadyExists");
    assert_eq!(again.message, "configmaps \"settings\" already exists");

    let fetched = api.get("settings").await.unwrap();
    assert_eq!(fetched.metadata.uid.as_deref(), Some(uid.as_str()));

    // A write with the current resourceVersion succeeds; replaying it conflicts.
    let mut changed = fetched.clone();
    changed.data = Some([("a".to_owned(), "2".to_owned())].into());
    let updated = api
        .replace("settings", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        fetched.metadata.resource_version
    );
    let stale = kube_error(
        api.replace("settings", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!(stale.code, 409);
    assert_eq!(stale.reason, "Conflict");
    assert_eq!(
        stale.message,
        "Operation cannot be fulfilled on configmaps \"settings\": the object has been modified; please apply your changes to the latest version and try again"
    );

    let listed = api
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert!(listed.metadata.resource_version.is_some());
    let none = api
        .list(&ListParams::default().labels("app=db"))
        .await
        .unwrap();
    assert!(none.items.is_empty());

    // Wrong uid precondition: 409 with the real message.
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let refused = kube_error(api.delete("settings", &wrong).await.unwrap_err());
    assert_eq!(refused.code, 409);
    assert_eq!(
        refused.message,
        format!(
            "Operation cannot be fulfilled on configmaps \"settings\": Precondition failed: UID in precondition: 00000000-0000-0000-0000-000000000000, UID in object meta: {uid}"
        )
    );
    api.delete("settings", &DeleteParams::default())
        .await
        .unwrap();
    let gone = kube_error(api.get("settings").await.unwrap_err());
    assert_eq!(gone.code, 404);
    assert_eq!(gone.reason, "NotFound");
    assert_eq!(gone.message, "configmaps \"settings\" not found");
}

#[tokio::test]
async fn create_in_missing_namespace_is_not_found_and_generate_name_works() {
    let server = server().await;
    let client = server.admin_client().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": "x" } })).unwrap();
    let error = kube_error(api.create(&PostParams::default(), &cm).await.unwrap_err());
    assert_eq!(error.code, 404);
    assert_eq!(error.message, "namespaces \"nowhere\" not found");

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "nowhere" } })).unwrap(),
        )
        .await
        .unwrap();
    let generated: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "generateName": "cm-" } })).unwrap();
    let created = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let name = created.metadata.name.unwrap();
    assert!(name.starts_with("cm-") && name.len() == 8, "{name}");
}

#[tokio::test]
async fn patches_merge_strategic_and_json() {
    let server = server().await;
    server
        .store()
        .create(
            &serde_json::from_value::<Node>(
                json!({ "metadata": { "name": "n1", "labels": { "a": "1" } } }),
            )
            .unwrap(),
        )
        .unwrap();
    let client = server.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    let cordoned = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    assert_eq!(cordoned.spec.unwrap().unschedulable, Some(true));
    let labelled = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "b": "2", "a": null } } })),
        )
        .await
        .unwrap();
    let labels = labelled.metadata.labels.unwrap();
    assert_eq!(labels.get("b").map(String::as_str), Some("2"));
    assert!(!labels.contains_key("a"));
    let patch: json_patch::Patch = serde_json::from_value(
        json!([{ "op": "add", "path": "/metadata/annotations", "value": { "x": "y" } }]),
    )
    .unwrap();
    let annotated = nodes
        .patch("n1", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .unwrap();
    assert_eq!(
        annotated
            .metadata
            .annotations
            .unwrap()
            .get("x")
            .map(String::as_str),
        Some("y")
    );

    // A merge patch carrying a stale resourceVersion conflicts.
    let stale = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "resourceVersion": "1", "labels": { "c": "3" } } }),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(kube_error(stale).code, 409);
}

#[tokio::test]
async fn field_selectors_and_pagination() {
    let server = server().await;
    for index in 0..7 {
        let node = if index % 2 == 0 { "n1" } else { "n2" };
        server
            .store()
            .create(&pod(
                &format!("p{index}"),
                node,
                json!({ "i": index.to_string() }),
            ))
            .unwrap();
    }
    let client = server.admin_client().await.unwrap();
    let all: Api<Pod> = Api::all(client.clone());
    let on_n1 = all
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(on_n1.items.len(), 4);
    let unsupported = kube_error(
        all.list(&ListParams::default().fields("spec.bogus=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(unsupported.code, 400);
    assert_eq!(unsupported.message, "field label not supported: spec.bogus");

    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut names = Vec::new();
    let mut params = ListParams::default().limit(3);
    loop {
        let page = pods.list(&params).await.unwrap();
        assert!(page.items.len() <= 3);
        names.extend(page.items.into_iter().map(|p| p.metadata.name.unwrap()));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]);
}

#[tokio::test]
async fn pod_deletion_is_graceful_until_the_kubelet_removes_it() {
    let server = FakeApiServer::builder()
        .simulation(SimulationTimings {
            grace_period_scale: 0.01,
            ..SimulationTimings::default()
        })
        .start()
        .await
        .unwrap();
    server.store().create(&pod("web", "n1", json!({}))).unwrap();
    let client = server.admin_client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let deleted = pods.delete("web", &DeleteParams::default()).await.unwrap();
    let pending = deleted.left().expect("a graceful delete answers the pod");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(30));
    // Still there during the (scaled) 30 s grace period ...
    assert!(pods.get("web").await.is_ok());
    // ... and gone after it (300 ms scaled).
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(kube_error(pods.get("web").await.unwrap_err()).code, 404);

    // gracePeriodSeconds=0 removes at once.
    server.store().create(&pod("now", "n1", json!({}))).unwrap();
    pods.delete("now", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert_eq!(kube_error(pods.get("now").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn discovery_serves_the_groups_clients_need() {
    let server = server().await;
    let client = server.admin_client().await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let discovery = kube::Discovery::new(client).run().await.unwrap();
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_owned()).collect();
    for wanted in [
        "",
        "apps",
        "policy",
        "events.k8s.io",
        "rbac.authorization.k8s.io",
    ] {
        assert!(
            groups.iter().any(|g| g == wanted),
            "{wanted} missing from {groups:?}"
        );
    }
}

#[tokio::test]
async fn events_k8s_io_events_are_core_events_seen_differently() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let server = server().await;
    let client = server.admin_client().await.unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let event: Event = serde_json::from_value(json!({
        "metadata": { "name": "n1.drain" },
        "regarding": { "kind": "Node", "name": "n1", "apiVersion": "v1" },
        "note": "Draining node n1", "reason": "Drain", "type": "Normal", "action": "Drain",
        "reportingController": "open-node-manager/terminating-hook", "reportingInstance": "i-1",
        "eventTime": "2025-01-01T00:00:00.000000Z",
    }))
    .unwrap();
    events.create(&PostParams::default(), &event).await.unwrap();
    let core: Api<CoreEvent> = Api::namespaced(client, "default");
    let listed = core
        .list(&ListParams::default().fields("involvedObject.name=n1,reason=Drain"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].message.as_deref(), Some("Draining node n1"));
    let same = events
        .list(&ListParams::default().fields("involvedObject.kind=Node"))
        .await
        .unwrap();
    assert_eq!(same.items[0].note.as_deref(), Some("Draining node n1"));
    assert_eq!(server.store().list::<Event>().len(), 1);
    assert_eq!(server.store().list::<CoreEvent>().len(), 1);
}
