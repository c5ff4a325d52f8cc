//! The fake scheduler's choice between nodes that all take a pod, against kube-scheduler's
//! default profile: a `PreferNoSchedule` taint the pod does not tolerate (TaintToleration,
//! weight 3) outweighs a node that already holds the pod's image (ImageLocality, weight 1),
//! and never keeps a pod off a node that is the only one left. The instance refresh's
//! outdated mark relies on both.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};

const OUTDATED: &str = "ip-10-0-1-1.eu-west-1.compute.internal";
const NEW: &str = "ip-10-0-2-2.eu-west-1.compute.internal";

fn soft_taint() -> Taint {
    Taint {
        key: "open-node-manager.io/outdated".into(),
        value: None,
        effect: "PreferNoSchedule".into(),
        time_added: None,
    }
}

async fn server() -> FakeApiServer {
    let server = FakeApiServer::builder()
        .simulation(SimulationTimings {
            pod_start_delay: Duration::from_millis(20),
            node_ready_after: Duration::ZERO,
            ..SimulationTimings::default()
        })
        .start()
        .await
        .unwrap();
    for (node, instance) in [(OUTDATED, "i-0aaaa1111"), (NEW, "i-0bbbb2222")] {
        server
            .register_node(
                node,
                &format!("aws:///eu-west-1a/{instance}"),
                Some(Duration::ZERO),
            )
            .unwrap();
    }
    server
        .wait_for("both nodes", Duration::from_secs(5), |s| {
            s.list::<Node>().len() == 2
        })
        .await
        .unwrap();
    server
}

fn set_node(server: &FakeApiServer, name: &str, cordoned: bool, tainted: bool) {
    server
        .store()
        .modify::<Node>("", name, |n| {
            let spec = n.spec.get_or_insert_with(Default::default);
            spec.unschedulable = Some(cordoned);
            // The simulation's own taints (not-ready) are gone once Ready: only ours here.
            spec.taints = tainted.then(|| vec![soft_taint()]);
        })
        .unwrap();
}

fn scale(server: &FakeApiServer, replicas: i32) {
    server
        .store()
        .modify::<ReplicaSet>("default", "web", |rs| {
            rs.spec.as_mut().unwrap().replicas = Some(replicas);
        })
        .unwrap();
}

async fn placed(server: &FakeApiServer, count: usize) -> (usize, usize) {
    server
        .wait_for("the pods are bound", Duration::from_secs(10), move |s| {
            let pods = s.list::<Pod>();
            pods.len() == count
                && pods
                    .iter()
                    .all(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        })
        .await
        .unwrap();
    let pods = server.store().list::<Pod>();
    let on = |node: &str| {
        pods.iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .count()
    };
    (on(OUTDATED), on(NEW))
}

#[tokio::test]
async fn a_soft_taint_outweighs_the_cached_image_and_never_keeps_a_pod_pending() {
    let server = server().await;
    // The first pod lands on the outdated node (the only schedulable one): its image is
    // cached there from now on.
    set_node(&server, NEW, true, false);
    server
        .store()
        .apply_yaml(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: web, image: nginx}]\n",
        )
        .unwrap();
    assert_eq!(placed(&server, 1).await, (1, 0));

    // Both schedulable, the outdated one soft-tainted and holding the image: new pods go to
    // the new node.
    set_node(&server, NEW, false, false);
    set_node(&server, OUTDATED, false, true);
    scale(&server, 4);
    assert_eq!(placed(&server, 4).await, (1, 3));

    // The new node full (cordoned here): the soft taint does not keep a pod off the
    // outdated node.
    set_node(&server, NEW, true, false);
    scale(&server, 6);
    assert_eq!(placed(&server, 6).await, (3, 3));
}

/// The pods of `web` bound to a node, and those still Pending, once `count` exist and every
/// pod that can be bound is (the scheduler binds what fits in one pass).
async fn bound_and_pending(server: &FakeApiServer, count: usize) -> (usize, usize) {
    server
        .wait_for("the pods exist", Duration::from_secs(10), move |s| {
            s.list::<Pod>().len() == count
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pods = server.store().list::<Pod>();
    let bound = pods
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        .count();
    (bound, pods.len() - bound)
}

fn replica_set(replicas: i32, cpu: Option<&str>) -> String {
    let resources = cpu
        .map(|cpu| format!(", resources: {{requests: {{cpu: \"{cpu}\"}}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {{name: web, namespace: default}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      containers: [{{name: web, image: nginx{resources}}}]\n"
    )
}

/// kube-scheduler's NodeResourcesFit filter: a node that has used its allocatable pod slots
/// (110 here) takes no more pods; the rest stay Pending.
#[tokio::test]
async fn a_node_without_a_pod_slot_left_takes_no_more_pods() {
    let server = server().await;
    set_node(&server, OUTDATED, true, false);
    server.store().apply_yaml(&replica_set(111, None)).unwrap();
    assert_eq!(bound_and_pending(&server, 111).await, (110, 1));
}

/// The same filter for what a pod requests: a node whose pods requested all but 920m of its
/// 3920m CPU takes no pod asking for a whole CPU more.
#[tokio::test]
async fn a_node_without_the_cpu_a_pod_requests_does_not_take_it() {
    let server = server().await;
    set_node(&server, OUTDATED, true, false);
    server
        .store()
        .apply_yaml(&replica_set(2, Some("3")))
        .unwrap();
    assert_eq!(bound_and_pending(&server, 2).await, (1, 1));
}
