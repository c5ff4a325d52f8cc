//! The wait for volumes: a scale-in drains a node with three database pods, each using its
//! own volume, next to a DaemonSet pod using a shared one; the plane's attach/detach
//! controller detaches a volume once the node's kubelet no longer reports it in use (after
//! its last pod there is gone), the kit's CSI attacher taking some seconds, and the built
//! `terminating-hook` completes the lifecycle action only once the database volumes are
//! detached, without waiting for the shared one, which stays with the node. The nodes are
//! behind an instance-mode target group of the cluster (the kit playing the service
//! controller against the real API server): the action also waits until the target group
//! has let go of the instance, its deregistration delay after the node was labelled out of
//! load balancers.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{ListParams, PostParams};
use node_manager::aws::LifecycleActionResult;
use serde_json::{Value, json};

use super::nginx::OTHER_NODE;
use super::{Played, QUICK_DRAIN, eventually, next_notification, response};
use crate::aws::{FakeLoadBalancer, FakeTargetGroup};
use crate::control_plane::ControlPlaneError;
use crate::control_plane::attacher::{ATTACHER, DETACH_DELAY};
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::{CLUSTER, GROUP, Target};
use crate::service_controller::{NodeSource, ServiceController};

const DATABASE_VOLUMES: [&str; 3] = ["pv-db-0", "pv-db-1", "pv-db-2"];
const SHARED_VOLUME: &str = "pv-logs";
/// The wait's bound: far longer than the detach, so waiting for the shared volume shows.
const VOLUME_DETACH_SECONDS: &str = "60";

/// The target group's deregistration delay: longer than the volumes' detach, so the wait for
/// it shows.
const DEREGISTRATION_DELAY: Duration = Duration::from_secs(10);

pub async fn play(bin: &Path) -> Result<Played, ControlPlaneError> {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .envs(&QUICK_DRAIN)
        .env("VOLUME_DETACH_SECONDS", VOLUME_DETACH_SECONDS)
        .start(bin)
        .await?;
    let mut played = Played::on(&w);
    let admin = w.plane.admin_client().await?;
    let elb = w.aws.elb();
    let web = FakeLoadBalancer::TargetGroup(elb.add_target_group(
        FakeTargetGroup::of_cluster("k8s-default-web", CLUSTER).delay(DEREGISTRATION_DELAY),
    ));
    let controller =
        ServiceController::start_on(NodeSource::Cluster(admin.clone()), elb.clone(), vec![web]);
    w.kubelets
        .register_node(
            OTHER_NODE,
            "aws:///eu-west-1b/i-0fffeeeedddd11112",
            "eu-west-1b",
            false,
        )
        .await?;
    seed(&admin, &w.node).await?;
    let attached = eventually(Duration::from_secs(20), || async {
        let now = attached_to(&admin, &w.node).await;
        DATABASE_VOLUMES
            .iter()
            .chain([&SHARED_VOLUME])
            .all(|v| now.iter().any(|a| a == v))
    })
    .await;
    if !attached {
        return Err(setup(format!(
            "the volumes were never attached: {:?}",
            attached_to(&admin, &w.node).await
        )));
    }
    played.line(format!(
        "{} and {SHARED_VOLUME} (a DaemonSet's) attached to {}; detach takes {DETACH_DELAY:?}",
        DATABASE_VOLUMES.join(", "),
        w.node
    ));
    let lb = &controller.load_balancers()[0];
    if !eventually(Duration::from_secs(10), || async {
        elb.routes_to(lb, &w.instance)
    })
    .await
    {
        return Err(setup(
            "the target group never routed to the node's instance",
        ));
    }
    played.line(format!(
        "{} registered with target group k8s-default-web (deregistration delay {DEREGISTRATION_DELAY:?})",
        w.instance
    ));
    let mut topic = w.aws.sns().subscribe(&w.topic).map_err(setup)?;
    w.aws
        .autoscaling()
        .terminate_instance(GROUP, &w.instance)
        .map_err(setup)?;
    let event = next_notification(&mut topic).await?;
    let started = Instant::now();
    let answer = response(w.function(Target::TerminatingHook), &event).await?;
    let took = started.elapsed();
    let routing = elb.routes_to(lb, &w.instance);
    let left = attached_to(&admin, &w.node).await;
    played.line(format!(
        "completed after {:.1} s; attached then: {left:?}",
        took.as_secs_f64()
    ));
    expect_outcome(&mut played, &w, &answer, &left, took);
    played.expect(
        "the target group no longer routed to the instance when the action completed: the drain waited its deregistration delay",
        !routing && took >= DEREGISTRATION_DELAY,
        format!("routing {routing} after {took:?}"),
    );
    Ok(played)
}

fn expect_outcome(
    played: &mut Played,
    w: &RealFunctionWorld,
    answer: &Value,
    left: &[String],
    took: Duration,
) {
    let completions = w.aws.autoscaling().completions();
    played.expect(
        "the lifecycle action completed once, with CONTINUE",
        answer["records"][0]["outcome"] == "Completed"
            && completions.len() == 1
            && completions[0].result == LifecycleActionResult::Continue,
        format!("{answer} {completions:?}"),
    );
    played.expect(
        "no volume of a drained pod was attached to the node when the action completed",
        !left.iter().any(|v| DATABASE_VOLUMES.contains(&v.as_str())),
        format!("{left:?}"),
    );
    played.expect(
        "the shared volume of the pod that stays was not waited for (well within the bound)",
        left == [SHARED_VOLUME] && took < Duration::from_secs(30),
        format!("{left:?} after {took:?}"),
    );
    played.expect(
        "the completion came after the detach, not before it",
        took >= DETACH_DELAY,
        format!("{took:?}"),
    );
}

/// The volumes and their claims, the database pods on `node` and the DaemonSet. The volumes
/// exist (bound to their claims by the plane's volume controller) so that kube-scheduler
/// places the DaemonSet's pods: a pod whose claim is unbound is unschedulable.
async fn seed(admin: &kube::Client, node: &str) -> Result<(), ControlPlaneError> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut pairs: Vec<(String, &str, &str)> = DATABASE_VOLUMES
        .iter()
        .enumerate()
        .map(|(ordinal, volume)| (format!("data-db-{ordinal}"), *volume, "ReadWriteOnce"))
        .collect();
    pairs.push(("logs".to_owned(), SHARED_VOLUME, "ReadWriteMany"));
    for (claim, volume, mode) in &pairs {
        create(
            &volumes,
            json!({
                "metadata": {"name": volume},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": [mode], "storageClassName": "",
                         "persistentVolumeReclaimPolicy": "Retain",
                         "csi": {"driver": ATTACHER, "volumeHandle": format!("vol-{volume}")},
                         "claimRef": {"namespace": "default", "name": claim}},
            }),
        )
        .await?;
        create(
            &claims,
            json!({
                "metadata": {"name": claim},
                "spec": {"accessModes": [mode], "storageClassName": "", "volumeName": volume,
                         "resources": {"requests": {"storage": "1Gi"}}},
            }),
        )
        .await?;
    }
    for ordinal in 0..DATABASE_VOLUMES.len() {
        create(
            &pods,
            json!({
                "metadata": {"name": format!("db-{ordinal}"), "labels": {"app": "db"}},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 2,
                         "containers": [{"name": "db", "image": "postgres"}],
                         "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-db-{ordinal}")}}]},
            }),
        )
        .await?;
    }
    let daemon_sets: Api<DaemonSet> = Api::namespaced(admin.clone(), "default");
    create(
        &daemon_sets,
        json!({
            "metadata": {"name": "log-shipper"},
            "spec": {"selector": {"matchLabels": {"app": "log-shipper"}},
                     "template": {"metadata": {"labels": {"app": "log-shipper"}},
                                  "spec": {"containers": [{"name": "shipper", "image": "fluent-bit"}],
                                           "volumes": [{"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}}]}}},
        }),
    )
    .await
}

pub(super) async fn create<K>(api: &Api<K>, object: Value) -> Result<(), ControlPlaneError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(object).map_err(setup)?;
    api.create(&PostParams::default(), &object)
        .await
        .map(drop)
        .map_err(setup)
}

/// The volumes attached to `node`, as its `VolumeAttachment`s say.
pub(super) async fn attached_to(admin: &kube::Client, node: &str) -> Vec<String> {
    let api: Api<VolumeAttachment> = Api::all(admin.clone());
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.spec.node_name == node)
        .filter_map(|a| a.spec.source.persistent_volume_name)
        .collect()
}

fn setup(error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::setup("the volumes scenario", error)
}
