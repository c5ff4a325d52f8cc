//! The refreshed group: its instances launched an hour apart, the kubelets following Auto
//! Scaling's launches and terminations, and the workload seeded exactly one pod of each
//! Deployment per node.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::super::QUICK_DRAIN;
use super::{Run, Shape};
use crate::aws::FakeAutoScalingGroup;
use crate::control_plane::ControlPlaneError;
use crate::control_plane::workload::{GuardedDeployment, set_cordoned, wait_for_available};
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::{CLUSTER, GROUP, Target};

pub(super) const REFRESH_FUNCTION: &str = "instance-refresh";
/// The seeded pods: namespace and label selector.
pub(super) const SEEDED: (&str, &str) = ("default", "refresh=yes");
const ZONE: &str = "eu-west-1a";
const SEEDING: Duration = Duration::from_secs(60);

/// Starts the world: the group of `run.shape.nodes` instances launched an hour apart (oldest
/// first in the order Auto Scaling replaces them), the kubelets following Auto Scaling's
/// launches and terminations, the workload seeded.
pub(super) async fn start_world(
    bin: &Path,
    run: Run,
) -> Result<RealFunctionWorld, ControlPlaneError> {
    let mut builder = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook, Target::LaunchingHook])
        .envs(&QUICK_DRAIN)
        .env("LAUNCH_TIMEOUT_SECONDS", "20");
    if run.with_function {
        builder = builder.function_named(REFRESH_FUNCTION);
    }
    let count = run.shape.nodes;
    let w = builder.start(bin).await?;
    w.aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", CLUSTER)
            .availability_zones(&[ZONE])
            .launch_template("lt-0a1b2c3d4e5f60718", "nodes", "1")
            .size(0, count as u32, 2 * count as u32),
    );
    let mut nodes = BTreeMap::from([(w.instance.clone(), w.node.clone())]);
    for i in 1..count {
        let id = format!("i-0a1b2c3d4e5f607{i:02}");
        nodes.insert(id.clone(), w.add_instance(&id, ZONE, false).await?);
    }
    let now = jiff::Timestamp::now();
    let in_turn = std::iter::once(&w.instance).chain(nodes.keys().filter(|id| **id != w.instance));
    for (turn, id) in in_turn.enumerate() {
        let hours = i64::try_from(count - turn).unwrap_or(i64::MAX);
        w.aws
            .ec2()
            .set_launch_time(id, now - jiff::SignedDuration::from_hours(hours));
    }
    let node_names: Vec<String> = nodes.values().cloned().collect();
    follow_instances(&w, nodes);
    seed_workload(&w.plane.admin_client().await?, run.shape, &node_names).await?;
    Ok(w)
}

/// The Deployments (one replica per node), each behind a PDB `maxUnavailable: 1`, with
/// exactly one pod of each on every node of `nodes`: the scheduler's spread would vary from run
/// to run, and the figures compared must not. Each node in turn is the only schedulable one
/// while every Deployment gains a replica. Ends with every node schedulable, every pod Ready
/// and each budget allowing one disruption.
async fn seed_workload(
    admin: &kube::Client,
    shape: Shape,
    nodes: &[String],
) -> Result<(), ControlPlaneError> {
    if shape.replicas != shape.nodes {
        return Err(ControlPlaneError::setup(
            "the refresh's shape",
            "one replica per node",
        ));
    }
    for node in nodes {
        set_cordoned(admin, node, true).await?;
    }
    for d in 0..shape.deployments {
        GuardedDeployment {
            namespace: SEEDED.0,
            app: &format!("web-{d}"),
            replicas: 0,
            grace_seconds: 1,
            labels: &[("refresh", "yes")],
            budget: true,
        }
        .create(admin)
        .await?;
    }
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), SEEDED.0);
    for (placed, node) in nodes.iter().enumerate() {
        set_cordoned(admin, node, false).await?;
        let replicas = json!({"spec": {"replicas": placed + 1}});
        for d in 0..shape.deployments {
            deployments
                .patch(
                    &format!("web-{d}"),
                    &PatchParams::default(),
                    &Patch::Merge(&replicas),
                )
                .await
                .map_err(|e| ControlPlaneError::setup("scaling the seeded Deployments", e))?;
        }
        wait_for_available(
            admin,
            SEEDED,
            (shape.deployments, placed + 1),
            false,
            SEEDING,
        )
        .await?;
        if placed + 1 < nodes.len() {
            set_cordoned(admin, node, true).await?;
        }
    }
    for node in nodes {
        set_cordoned(admin, node, false).await?;
    }
    wait_for_available(
        admin,
        SEEDED,
        (shape.deployments, shape.replicas),
        true,
        SEEDING,
    )
    .await
}

/// Registers a Ready node for every instance Auto Scaling launches, and deletes the Node of
/// every instance that leaves the group, as the cloud node lifecycle controller does.
fn follow_instances(w: &RealFunctionWorld, nodes: BTreeMap<String, String>) {
    let nodes = Arc::new(Mutex::new(nodes));
    let kubelets = w.kubelets.handle();
    let known = nodes.clone();
    w.aws
        .autoscaling()
        .on_instance_launched(Arc::new(move |launched| {
            let (kubelets, launched) = (kubelets.clone(), launched.clone());
            known.lock().unwrap_or_else(PoisonError::into_inner).insert(
                launched.instance_id.clone(),
                launched.private_dns_name.clone(),
            );
            tokio::spawn(async move {
                let provider = format!(
                    "aws:///{}/{}",
                    launched.availability_zone, launched.instance_id
                );
                let zone = &launched.availability_zone;
                let name = &launched.private_dns_name;
                if let Err(error) = kubelets.register_node(name, &provider, zone, false).await {
                    eprintln!("registering {name}: {error}");
                }
            });
        }));
    let kubelets = w.kubelets.handle();
    w.aws
        .autoscaling()
        .on_instance_terminated(Arc::new(move |instance_id| {
            let node = nodes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(instance_id)
                .cloned();
            let Some(node) = node else {
                return;
            };
            let kubelets = kubelets.clone();
            tokio::spawn(async move {
                if let Err(error) = kubelets.remove_node(&node).await {
                    eprintln!("removing {node}: {error}");
                }
            });
        }));
}
