//! The wait for volumes (issue #45 item 2): a node running StatefulSet pods, each with its
//! own `ReadWriteOnce` volume, is scaled in; how long until the lifecycle action completes,
//! and until every replacement pod runs on the other node with its volume, with
//! `VOLUME_DETACH_SECONDS` 0 (no wait, as before) and 300: without a settle period (nodes
//! behind no load balancer, `SETTLE_SECONDS=0`) and with EKS's 60 s, a detach of 10 s and a
//! slow one of 90 s. The emulation's kubelet reports a volume unmounted 10 s after its pod is
//! gone; an instance that goes before that leaves the attach/detach controller waiting six
//! minutes before it detaches (what a real cluster does). The settle period is the fixed
//! wait (`LOAD_BALANCER_WAIT=false`), standing for a load balancer's deregistration, so the
//! rows stay comparable with those measured before the load-balancer wait.
//!
//! The whole cluster runs at a fixed fraction of real time ([`SCALE`]): the settle period,
//! the bound, the CSI detach, the pods' grace periods, the attach/detach controller's
//! six-minute wait for a node that can no longer confirm an unmount, the removal of a
//! terminated instance's Node. Figures are reported as measured and scaled back to a real
//! cluster's seconds (the fixed costs, API round trips and process start, do not scale).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};

use super::Mode;
use super::drain::start;
use crate::kube::Store;

/// One run's figures.
#[derive(Debug, Clone)]
pub struct VolumeWaitRow {
    /// `SETTLE_SECONDS`, in a real cluster's seconds.
    pub settle_seconds: f64,
    /// The CSI detach, in a real cluster's seconds.
    pub detach_seconds: f64,
    /// `VOLUME_DETACH_SECONDS`, in a real cluster's seconds.
    pub bound_seconds: f64,
    /// Scale-in → the lifecycle action completed (measured).
    pub completed_after: Duration,
    /// Scale-in → the last replacement pod Running with its volume (measured).
    pub replacements_running_after: Option<Duration>,
    /// The fraction of real time the run moved at.
    pub scale: f64,
}

/// The StatefulSets on the scaled-in node, one replica each.
const SETS: usize = 3;
/// The bound of the wait, in a real cluster's seconds (the default).
const BOUND_SECONDS: f64 = 300.0;

/// The fraction of real time a mode's runs move at.
pub fn scale(mode: Mode) -> f64 {
    match mode {
        Mode::Full => 0.05,
        Mode::Quick => 0.02,
    }
}

/// The runs: (settle, detach) of (0, 10), (60, 10) and (60, 90) seconds, each without and
/// with the wait.
pub async fn volume_wait(mode: Mode) -> Result<Vec<VolumeWaitRow>, String> {
    let mut rows = Vec::new();
    for (settle_seconds, detach_seconds) in [(0.0, 10.0), (60.0, 10.0), (60.0, 90.0)] {
        for bound_seconds in [0.0, BOUND_SECONDS] {
            let times = Times {
                settle_seconds,
                detach_seconds,
                bound_seconds,
            };
            rows.push(run(mode, times).await?);
        }
    }
    Ok(rows)
}

/// One run's settings, in a real cluster's seconds.
#[derive(Debug, Clone, Copy)]
struct Times {
    settle_seconds: f64,
    detach_seconds: f64,
    bound_seconds: f64,
}

fn scenario(scale: f64, times: Times) -> String {
    format!(
        "name: volume-wait\n\
         description: a node with {SETS} StatefulSet pods and their volumes is scaled in\n\
         instanceNoticeEvents: false\n\
         refreshEvents: false\n\
         timings: {{ settleSeconds: {settle}, drainTimeoutSeconds: 600, podStartSeconds: 0.05, gracePeriodScale: {scale}, nodeRegisterSeconds: {register}, volumeDetachSeconds: {detach}, functionTimeoutSeconds: 900, deregistrationDelaySeconds: 0 }}\n\
         functionEnv: {{ VOLUME_DETACH_SECONDS: \"{bound}\", LOAD_BALANCER_WAIT: \"false\" }}\n\
         nodegroups:\n  - {{ name: ng, autoScalingGroup: asg-volumes, nodeRole: volumes-node-role, nodes: 2, selfManaged: true }}\n\
         workloads: []\n\
         steps:\n  - scaleIn: {{ nodegroup: ng, node: 0 }}\n",
        settle = times.settle_seconds * scale,
        // The cloud node lifecycle controller removes a terminated instance's Node about
        // 30 s later.
        register = 30.0 * scale,
        detach = times.detach_seconds * scale,
        bound = times.bound_seconds * scale,
    )
}

async fn run(mode: Mode, times: Times) -> Result<VolumeWaitRow, String> {
    let scale = scale(mode);
    let sandbox = start(&scenario(scale, times)).await?;
    let (node, _) = sandbox.seeded_node("ng", 0).ok_or("no node")?;
    let (other, _) = sandbox.seeded_node("ng", 1).ok_or("no second node")?;
    let store = sandbox.server().store().clone();
    seed_on(&store, &node, &other).await?;
    let started = Instant::now();
    let watch = async {
        let mut running_at = None;
        while started.elapsed() < Duration::from_secs_f64(1200.0 * scale) {
            if replacements_running(&store, &other) {
                running_at = Some(started.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        running_at
    };
    let (completed, running_at) =
        tokio::join!(super::drain::scale_in(&sandbox, "volume wait"), watch);
    let completed_after = completed?;
    Ok(VolumeWaitRow {
        settle_seconds: times.settle_seconds,
        detach_seconds: times.detach_seconds,
        bound_seconds: times.bound_seconds,
        completed_after,
        replacements_running_after: running_at,
        scale,
    })
}

/// `SETS` StatefulSets with a volume each, their pods placed on `node` (the other node
/// cordoned meanwhile), then the other node opened for their replacements.
async fn seed_on(store: &Store, node: &str, other: &str) -> Result<(), String> {
    set_cordoned(store, other, true)?;
    let mut yaml = String::new();
    for set in 0..SETS {
        yaml.push_str(&format!(
            "---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: db{set}, namespace: default}}\n\
             spec:\n  replicas: 1\n  selector: {{matchLabels: {{app: db{set}}}}}\n\
             \x20 template:\n    metadata: {{labels: {{app: db{set}}}}}\n\
             \x20   spec:\n      terminationGracePeriodSeconds: 30\n      containers: [{{name: db, image: postgres}}]\n\
             \x20 volumeClaimTemplates:\n  - metadata: {{name: data}}\n    spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 10Gi}}}}}}\n"
        ));
    }
    store.apply_yaml(&yaml).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while running_on(store, node) < SETS {
        if Instant::now() > deadline {
            return Err(format!("the StatefulSet pods never ran on {node}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    set_cordoned(store, other, false)
}

fn set_cordoned(store: &Store, node: &str, cordoned: bool) -> Result<(), String> {
    store
        .modify::<Node>("", node, |n| {
            n.spec.get_or_insert_default().unschedulable = Some(cordoned);
        })
        .map(drop)
        .map_err(|e| e.to_string())
}

fn db_pods_running_on(store: &Store, node: &str) -> Vec<Pod> {
    store
        .list::<Pod>()
        .into_iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("db"))
        })
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

fn running_on(store: &Store, node: &str) -> usize {
    db_pods_running_on(store, node).len()
}

fn replacements_running(store: &Store, other: &str) -> bool {
    running_on(store, other) == SETS
}
