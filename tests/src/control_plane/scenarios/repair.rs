//! Node repair of a node whose kubelet died with its instance impaired: `node-repair` (on its
//! schedule) sees the node Healthy, then NotReady and Waiting, then past the threshold puts
//! Kubernetes' out-of-service taint on it (EC2's status checks show the instance impaired)
//! and marks its instance unhealthy. The plane's own controllers then free the dead node's
//! pods (taint eviction, pod garbage collection) and detach the database pod's volume at once,
//! and the StatefulSet's new pod runs on the other node with it; Auto Scaling replaces the
//! instance and the terminating hook drains the dead node without waiting for deletions its
//! kubelet will never confirm.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use kube::Api;
use kube::api::ListParams;
use node_manager::node_marks::shutdown::{ShutdownRecord, carries_our_taint};
use serde_json::{Value, json};

use super::nginx::{OTHER_NODE, nginx_pods, seed_nginx};
use super::volumes::{attached_to, create};
use super::{Played, eventually, next_notification, response};
use crate::aws::FakeAutoScalingGroup;
use crate::control_plane::ControlPlaneError;
use crate::control_plane::attacher::ATTACHER;
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::{CLUSTER, GROUP, RunningFunction, Target};

/// The repair threshold: `minRepairWaitTimeMins` 0.025, 1.5 s.
const REPAIR_CONFIG: &str = r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 0.025, "repairAction": "Replace"}]}"#;

pub async fn play(bin: &Path) -> Result<Played, ControlPlaneError> {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::NodeRepair, Target::TerminatingHook])
        .env("REPAIR_CONFIG", REPAIR_CONFIG)
        .env("STUCK_POD_SECONDS", "1")
        .start(bin)
        .await?;
    w.aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", CLUSTER)
            .availability_zones(&["eu-west-1a"])
            .health_check_grace_period(Duration::ZERO),
    );
    let admin = w.plane.admin_client().await?;
    seed_database(&admin, &w.node).await?;
    seed_nginx(&w, &admin, 1).await?;
    let mut played = Played::on(&w);
    played.line(format!(
        "db-0 (a StatefulSet's) runs on {} with volume {DATABASE_VOLUME} attached there",
        w.node
    ));
    let repair = w.function(Target::NodeRepair);
    expect_repair(
        &mut played,
        repair,
        &w.node,
        "Healthy",
        "while its kubelet runs",
    )
    .await?;
    played.line(format!(
        "the kubelet of {} dies; EC2's status checks show {} impaired",
        w.node, w.instance
    ));
    w.kubelets.kill(&w.node).await?;
    w.aws.ec2().set_impaired(&w.instance, true);
    expect_repair(
        &mut played,
        repair,
        &w.node,
        "Waiting",
        "before the threshold",
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let mut topic = w.aws.sns().subscribe(&w.topic).map_err(setup)?;
    expect_repair(&mut played, repair, &w.node, "Repair", "past the threshold").await?;
    let repaired = Instant::now();
    expect_freed(&mut played, &admin, &w.node, repaired).await;
    let marked = w.aws.requests_for("SetInstanceHealth").len();
    played.expect(
        "its instance marked unhealthy once",
        marked == 1,
        format!("{marked} SetInstanceHealth requests"),
    );
    w.aws
        .autoscaling()
        .wait_for_health_replacement(&w.instance, Duration::from_secs(5))
        .await
        .ok_or_else(|| setup("no replacement of the unhealthy instance within 5 s"))?;
    let terminating = loop {
        let event = next_notification(&mut topic).await?;
        if event.to_string().contains("EC2_INSTANCE_TERMINATING") {
            break event;
        }
    };
    played.line(format!("Auto Scaling replaces {}", w.instance));
    expect_dead_node_drained(&mut played, &w, &admin, &terminating).await?;
    Ok(played)
}

/// The terminating hook drains the dead node without waiting for the deletions its kubelet
/// never confirms, and the plane's taint eviction and pod garbage collection remove its pods.
async fn expect_dead_node_drained(
    played: &mut Played,
    w: &RealFunctionWorld,
    admin: &kube::Client,
    terminating: &Value,
) -> Result<(), ControlPlaneError> {
    let started = Instant::now();
    let answer = response(w.function(Target::TerminatingHook), terminating).await?;
    let took = started.elapsed();
    played.expect(
        "the terminating hook drained the dead node within 15 s",
        answer["records"][0]["outcome"] == "Completed" && took < Duration::from_secs(15),
        format!("after {took:?}: {answer}"),
    );
    let emptied = eventually(POD_GC_BOUND, || async {
        !nginx_pods(admin).await.iter().any(|p| p.node == w.node)
    })
    .await;
    played.expect(
        "no pod left on the dead node: the plane's taint eviction and pod garbage collection removed them",
        emptied,
        format!("{:#?}", nginx_pods(admin).await),
    );
    Ok(())
}

/// The database's volume, a CSI volume of [`ATTACHER`].
const DATABASE_VOLUME: &str = "pv-data-db-0";
/// How long the pod garbage collector may take to see a terminating pod on an out-of-service
/// node (it runs every 20 s) plus the detach: far less than the attach/detach controller's
/// six-minute wait for an unmount without the taint.
const POD_GC_BOUND: Duration = Duration::from_secs(60);

/// A one-replica StatefulSet on `node` whose pod uses a claim from its template, bound by the
/// plane's volume controller to a CSI volume created for it; waits until the pod runs there
/// with the volume attached (by the plane's attach/detach controller).
async fn seed_database(admin: &kube::Client, node: &str) -> Result<(), ControlPlaneError> {
    create(
        &Api::<PersistentVolume>::all(admin.clone()),
        json!({
            "metadata": {"name": DATABASE_VOLUME},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain",
                     "csi": {"driver": ATTACHER, "volumeHandle": "vol-0db0"},
                     "claimRef": {"namespace": "default", "name": "data-db-0"}},
        }),
    )
    .await?;
    create(
        &Api::<StatefulSet>::namespaced(admin.clone(), "default"),
        json!({
            "metadata": {"name": "db"},
            "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                     "template": {"metadata": {"labels": {"app": "db"}},
                                  "spec": {"terminationGracePeriodSeconds": 30,
                                           "containers": [{"name": "db", "image": "postgres"}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"},
                        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                                 "resources": {"requests": {"storage": "1Gi"}}}}]},
        }),
    )
    .await?;
    let running = eventually(Duration::from_secs(30), || async {
        database_runs_on(admin).await.as_deref() == Some(node)
            && attached_to(admin, node).await == [DATABASE_VOLUME]
    })
    .await;
    if running {
        Ok(())
    } else {
        Err(setup(format!(
            "db-0 never ran on {node} with its volume: on {:?}, attached {:?}",
            database_runs_on(admin).await,
            attached_to(admin, node).await
        )))
    }
}

/// The node db-0 runs on (Running, not being deleted).
async fn database_runs_on(admin: &kube::Client) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let list = pods
        .list(&ListParams::default().labels("app=db"))
        .await
        .ok()?;
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .find_map(|p| p.spec?.node_name)
}

/// After the repair: node repair's taint and record on the dead node; the plane's
/// controllers delete db-0 there and detach its volume, and the new db-0 runs on the other
/// node with the volume attached there, all well within the six-minute unmount wait.
async fn expect_freed(played: &mut Played, admin: &kube::Client, node: &str, repaired: Instant) {
    let tainted = Api::<Node>::all(admin.clone())
        .get_opt(node)
        .await
        .ok()
        .flatten();
    let has_taint = tainted.as_ref().is_some_and(carries_our_taint);
    let record = tainted.as_ref().and_then(ShutdownRecord::of);
    played.expect(
        "node repair put node.kubernetes.io/out-of-service=nodeshutdown:NoExecute on the dead node, with its record",
        has_taint && record.as_ref().is_some_and(|r| r.by == "node-repair"),
        format!("{record:?}"),
    );
    let moved = eventually(POD_GC_BOUND, || async {
        database_runs_on(admin).await.as_deref() == Some(OTHER_NODE)
            && attached_to(admin, OTHER_NODE).await == [DATABASE_VOLUME]
            && attached_to(admin, node).await.is_empty()
    })
    .await;
    let took = repaired.elapsed();
    played.line(format!(
        "db-0 on {:?} after {:.1} s; attached to the dead node: {:?}",
        database_runs_on(admin).await,
        took.as_secs_f64(),
        attached_to(admin, node).await
    ));
    played.expect(
        "the plane deleted db-0 from the dead node and detached its volume; db-0 runs on the other node with it, within 60 s",
        moved,
        format!("after {took:?}"),
    );
}

/// Invokes `node-repair` as its schedule does and expects `outcome` for `node`.
async fn expect_repair(
    played: &mut Played,
    repair: &RunningFunction,
    node: &str,
    outcome: &str,
    when: &str,
) -> Result<(), ControlPlaneError> {
    let answer = response(repair, &scheduled_event()).await?;
    let seen = answer["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == node))
        .map(|n| n["outcome"].clone());
    played.expect(
        format!("node-repair finds the node {outcome} {when}"),
        seen.as_ref().is_some_and(|o| o == outcome),
        &answer,
    );
    Ok(())
}

/// What EventBridge sends on a schedule; node-repair needs none of it.
fn scheduled_event() -> Value {
    json!({
        "version": "0", "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event", "source": "aws.events", "account": "111111111111",
        "time": "2026-11-24T02:00:00Z", "region": "eu-west-1",
        "resources": ["arn:aws:events:eu-west-1:111111111111:rule/node-repair"], "detail": {}
    })
}

fn setup(error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::setup("the repair scenario", error)
}
