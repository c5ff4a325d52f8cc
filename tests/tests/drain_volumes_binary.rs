//! The built `terminating-hook` binary waits for the drained node's volumes to detach before
//! it completes the lifecycle action (`VOLUME_DETACH_SECONDS`), on the fake API server whose
//! emulation plays the attach/detach controller and a CSI attacher: a volume's
//! `VolumeAttachment` goes a set delay after the last pod using it on the node is gone.
//!
//! Uses the binary as built: run `cargo build --workspace --bins --tests` after changing the function.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use node_manager_testkit::e2e::{FunctionWorld, Target};
use node_manager_testkit::kube::{SimulationTimings, Store};

const INSTANCE: &str = "i-0c1d2e3f405162738";
/// The database pods' volumes, one claim each.
const DATABASE_VOLUMES: [&str; 3] = ["pv-db-0", "pv-db-1", "pv-db-2"];
/// The volume every log shipper (a DaemonSet) shares: it stays with the node.
const SHARED_VOLUME: &str = "pv-logs";

/// The terminating hook with three database pods on the node, each with its own volume, and
/// a DaemonSet whose pod uses a shared one; the CSI detach takes `detach_delay`.
async fn volume_world(detach_delay: Duration, settings: &[(&str, &str)]) -> FunctionWorld {
    let mut builder = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .simulation(SimulationTimings {
            volume_detach_delay: detach_delay,
            ..SimulationTimings::default()
        })
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("DRAIN_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
        .json_logs();
    for (key, value) in settings {
        builder = builder.env(key, value);
    }
    let w = builder.start().await;
    seed_volumes(w.server.store(), &w.node);
    let node = w.node.clone();
    w.server
        .wait_for(
            "the volumes are attached",
            Duration::from_secs(10),
            |store| {
                let attached = attached_to(store, &node);
                DATABASE_VOLUMES
                    .iter()
                    .chain([&SHARED_VOLUME])
                    .all(|v| attached.iter().any(|a| a == v))
            },
        )
        .await
        .unwrap();
    w.add_room_node();
    w
}

fn seed_volumes(store: &Store, node: &str) {
    let mut yaml = String::new();
    for (ordinal, volume) in DATABASE_VOLUMES.iter().enumerate() {
        yaml.push_str(&format!(
            r#"---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data-db-{ordinal}, namespace: default}}
spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}, volumeName: {volume}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: db-{ordinal}, namespace: default, labels: {{app: db}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 30
  containers: [{{name: db, image: postgres}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data-db-{ordinal}}}}}]
"#
        ));
    }
    yaml.push_str(&format!(
        r#"---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: logs, namespace: default}}
spec: {{accessModes: [ReadWriteMany], resources: {{requests: {{storage: 1Gi}}}}, volumeName: {SHARED_VOLUME}}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: log-shipper, namespace: default}}
spec:
  selector: {{matchLabels: {{app: log-shipper}}}}
  template:
    metadata: {{labels: {{app: log-shipper}}}}
    spec:
      containers: [{{name: shipper, image: fluent-bit}}]
      volumes: [{{name: logs, persistentVolumeClaim: {{claimName: logs}}}}]
"#
    ));
    store.apply_yaml(&yaml).unwrap();
}

/// The volumes attached to `node`, as its `VolumeAttachment`s say.
fn attached_to(store: &Store, node: &str) -> Vec<String> {
    store
        .list::<VolumeAttachment>()
        .into_iter()
        .filter(|a| a.spec.node_name == node)
        .filter_map(|a| a.spec.source.persistent_volume_name)
        .collect()
}

#[tokio::test]
async fn the_action_is_completed_once_the_volumes_of_the_drained_pods_are_detached() {
    let detach = Duration::from_secs(2);
    let w = volume_world(detach, &[("VOLUME_DETACH_SECONDS", "30")]).await;
    let (answer, took) = w.terminate_timed().await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    // Completed after the detach, and without waiting for the shared volume of the pod that
    // stays (that would take the 30 s bound).
    let attached = attached_to(w.server.store(), &w.node);
    assert_eq!(attached, [SHARED_VOLUME], "{answer}");
    assert!(
        took >= detach,
        "completed after {took:?}, before the detach"
    );
    assert!(
        took < Duration::from_secs(15),
        "took {took:?}: waited for the staying volume"
    );
    let output = w.function(Target::TerminatingHook).runtime.output();
    assert!(output.contains("\"volumes_detached\""), "{output}");
    assert!(w.event_notes("VolumesStillAttached").is_empty());
}

#[tokio::test]
async fn without_the_wait_the_instance_goes_with_its_volumes_attached() {
    // What every drain did before the wait, and still does with it turned off.
    let w = volume_world(Duration::from_secs(3), &[("VOLUME_DETACH_SECONDS", "0")]).await;
    let (answer, _) = w.terminate_timed().await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let attached = attached_to(w.server.store(), &w.node);
    assert!(
        DATABASE_VOLUMES
            .iter()
            .any(|v| attached.iter().any(|a| a == v)),
        "{attached:?}"
    );
    let lists = w.server.audit().requests("list", "volumeattachments");
    assert!(lists.is_empty(), "{lists:?}");
}

#[tokio::test]
async fn volumes_still_attached_at_the_bound_are_named_and_the_action_completed() {
    let w = volume_world(
        Duration::from_secs(120),
        &[
            ("VOLUME_DETACH_SECONDS", "2"),
            ("DRAIN_BLOCKED_REPORT_SECONDS", "1"),
        ],
    )
    .await;
    let (answer, took) = w.terminate_timed().await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(12)).contains(&took),
        "took {took:?}"
    );
    let notes = w.event_notes("VolumesStillAttached");
    assert_eq!(notes.len(), 1, "{notes:?}");
    for volume in DATABASE_VOLUMES {
        assert!(notes[0].contains(volume), "{notes:?}");
    }
    assert!(!notes[0].contains(SHARED_VOLUME), "{notes:?}");
    // While it waited, the drain said what for.
    let blocked = w.event_notes("DrainBlocked");
    assert!(
        blocked
            .iter()
            .any(|n| n.contains("its pods are gone") && n.contains("volume(s) still attached")),
        "{blocked:?}"
    );
}

/// Issue #45 item 3: the node's kubelet dies before its drain. The evicted pods stay
/// `Terminating` (nothing confirms their deletion) and keep their volumes attached; once the
/// drain reports them stuck on a node whose kubelet is silent, it puts the out-of-service taint
/// on it, the pod garbage collector deletes them and their volumes detach at once, and the
/// action completes well before the volume bound. Without the taint
/// (`OUT_OF_SERVICE_TAINT=false`) the instance goes at the bound with the pods still
/// terminating and their volumes attached (the attach/detach controller would wait six
/// minutes more for an unmount nobody reports).
#[tokio::test]
async fn a_dead_kubelets_stuck_pods_and_their_volumes_are_freed_by_the_out_of_service_taint() {
    let bound = Duration::from_secs(8);
    for taint in [true, false] {
        let settings = [
            ("VOLUME_DETACH_SECONDS", "8"),
            ("STUCK_POD_SECONDS", "1"),
            ("OUT_OF_SERVICE_TAINT", if taint { "true" } else { "false" }),
        ];
        let w = volume_world(Duration::from_millis(500), &settings).await;
        w.server.kill_kubelet(&w.node).unwrap();
        let (answer, took) = w.terminate_timed().await;
        assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
        let store = w.server.store();
        let node = store
            .get::<k8s_openapi::api::core::v1::Node>("", &w.node)
            .unwrap();
        let tainted = node_manager::node_marks::shutdown::carries_our_taint(&node);
        let record = node_manager::node_marks::shutdown::ShutdownRecord::of(&node);
        let stuck_pods = store
            .list::<k8s_openapi::api::core::v1::Pod>()
            .into_iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("db-"))
            })
            .count();
        let attached = attached_to(store, &w.node);
        let databases_attached = DATABASE_VOLUMES
            .iter()
            .filter(|v| attached.iter().any(|a| a == *v))
            .count();
        if taint {
            assert!(tainted, "no out-of-service taint: {node:?}");
            let record = record.expect("the taint's record");
            assert_eq!(record.by, "terminating-hook");
            assert!(record.why.contains(INSTANCE), "{record:?}");
            assert_eq!(stuck_pods, 0, "the stuck pods were not deleted");
            assert_eq!(databases_attached, 0, "{attached:?}");
            assert!(took < bound, "took {took:?}: waited out the volume bound");
            assert_eq!(w.event_notes("OutOfServiceTaintAdded").len(), 1);
        } else {
            assert!(!tainted && record.is_none(), "{node:?}");
            assert_eq!(stuck_pods, 3);
            assert_eq!(databases_attached, 3, "{attached:?}");
            assert!(took >= bound, "took {took:?}");
            assert!(w.event_notes("OutOfServiceTaintAdded").is_empty());
        }
    }
}
