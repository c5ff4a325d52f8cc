//! An instance refresh: a node group of four nodes runs Deployments behind
//! PodDisruptionBudgets; the fake Auto Scaling replaces every instance, batch by batch,
//! through the group's lifecycle hooks; replacements register as Ready nodes served by kwok;
//! the built `launching-hook` completes each new node, the built
//! `terminating-hook` drains each replaced one, and the built `instance-refresh` gets the
//! refresh's and the instances' EventBridge events as the stack's rule routes them.
//! kube-scheduler places every evicted pod's replacement.
//!
//! What a user sees is expected ([`Figures::violations`]): the refresh ends `Successful`, every
//! pod of an outdated node was evicted (none deleted without an eviction), no budget was
//! broken, no mark is left, and the evictions per pod (from the plane's audit log) are no more
//! than the same refresh gives without `instance-refresh`, which runs beside it for the
//! comparison ([`compare`]). The measured variants of `real_control_plane_refresh` compare
//! other shapes and strategies (BENCHMARKS.md §12).

mod delivery;
mod figures;
mod group;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

pub use self::figures::Figures;
use self::figures::{measure, sample};
use super::Played;
use crate::aws::FakeRefreshPreferences;
use crate::control_plane::ControlPlaneError;
use crate::e2e::GROUP;

/// The group and its workload: `nodes` nodes, `deployments` Deployments of `replicas`.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub nodes: usize,
    pub deployments: usize,
    pub replicas: usize,
}

/// What CI runs: four nodes, four Deployments of four replicas.
pub const SMALL: Shape = Shape {
    nodes: 4,
    deployments: 4,
    replicas: 4,
};

/// The measured variants' larger group.
pub const LARGE: Shape = Shape {
    nodes: 10,
    deployments: 10,
    replicas: 10,
};

/// The refresh's instance warmup: the pause after a replacement is in service before the
/// next batch (on AWS the group's default instance warmup, often minutes), in which the
/// replacement's `Launch Successful` reaches `instance-refresh`.
const INSTANCE_WARMUP: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `MinHealthyPercentage` 100, `MaxHealthyPercentage` 110.
    LaunchFirst,
    /// Auto Scaling's default, 90 / 100.
    TerminateFirst,
}

impl Strategy {
    fn percentages(self) -> (u32, u32) {
        match self {
            Self::LaunchFirst => (100, 110),
            Self::TerminateFirst => (90, 100),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::LaunchFirst => "launch before terminate",
            Self::TerminateFirst => "terminate first",
        }
    }
}

/// One refresh to run.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub shape: Shape,
    pub strategy: Strategy,
    pub with_function: bool,
    /// A planted fault: the admin deletes a pod of the last outdated node as the refresh
    /// starts, without an eviction, so the checks must see a pod that was never evicted.
    pub plant_deletion: bool,
}

/// What `sandbox --real-control-plane` and CI play: terminate first on four nodes, with and
/// without `instance-refresh`.
pub async fn play(bin: &Path) -> Result<Played, ControlPlaneError> {
    compare(bin, SMALL, Strategy::TerminateFirst).await
}

/// Runs the same refresh without and with `instance-refresh` (each on a fresh plane), prints
/// both rows of BENCHMARKS.md §12 and expects what a user sees: both correct, no more
/// evictions per pod with the function, and pods moved twice only before the refresh
/// brought room.
pub async fn compare(
    bin: &Path,
    shape: Shape,
    strategy: Strategy,
) -> Result<Played, ControlPlaneError> {
    let run = Run {
        shape,
        strategy,
        with_function: false,
        plant_deletion: false,
    };
    let mut played = Played::default();
    played.line(format!(
        "{} nodes, {}: the refresh without instance-refresh",
        shape.nodes,
        strategy.name()
    ));
    let without = refresh_on_the_real_plane(bin, run).await?;
    played.line("the same refresh with instance-refresh");
    let with = refresh_on_the_real_plane(
        bin,
        Run {
            with_function: true,
            ..run
        },
    )
    .await?;
    for line in figures::TABLE_HEADER.lines() {
        played.line(line);
    }
    played.line(without.row(strategy, false));
    played.line(with.row(strategy, true));
    let what = format!("{} nodes, {}", shape.nodes, strategy.name());
    without.expect_seen_by_a_user(&mut played, &format!("{what} without the function"));
    with.expect_seen_by_a_user(&mut played, &format!("{what} with the function"));
    played.expect(
        format!("{what}: no more evictions per pod with the function"),
        with.evictions_per_pod() <= without.evictions_per_pod(),
        format!(
            "{:.2} evictions per pod with the function, {:.2} without",
            with.evictions_per_pod(),
            without.evictions_per_pod()
        ),
    );
    expect_moved_twice_only_before_room(&mut played, &with, strategy, &what);
    Ok(played)
}

/// With the function, a pod moves twice only when it was evicted before the refresh brought
/// any room: in terminate first, the pods of the first node replaced (nothing can be marked
/// while every node is outdated); in launch before terminate, none. Without the function,
/// the scheduler may put any evicted pod on a node replaced later.
fn expect_moved_twice_only_before_room(
    played: &mut Played,
    with: &Figures,
    strategy: Strategy,
    what: &str,
) {
    let allowed = match strategy {
        Strategy::LaunchFirst => 0,
        Strategy::TerminateFirst => with.on_the_first_node,
    };
    played.expect(
        format!("{what}: with the function, pods moved twice only before the refresh brought room (at most {allowed})"),
        with.moved_twice <= allowed,
        format!("{} pods moved twice: {with:?}", with.moved_twice),
    );
}

/// Runs one refresh of the whole group on a fresh real plane and measures it.
pub async fn refresh_on_the_real_plane(bin: &Path, run: Run) -> Result<Figures, ControlPlaneError> {
    let w = group::start_world(bin, run).await?;
    let admin = w.plane.admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let seeded = pods
        .list(&ListParams::default().labels(group::SEEDED.1))
        .await
        .map_err(|e| ControlPlaneError::setup("listing the seeded pods", e))?
        .items;
    let at_start: BTreeMap<String, String> = seeded
        .iter()
        .map(|p| (name_of(p), p.metadata.uid.clone().unwrap_or_default()))
        .collect();
    let on_the_first_node: Vec<String> = seeded
        .iter()
        .filter(|p| node_of(p).as_deref() == Some(w.node.as_str()))
        .map(name_of)
        .collect();
    let running = Arc::new(AtomicBool::new(true));
    let sampler = sample(
        pods.clone(),
        at_start.values().cloned().collect(),
        running.clone(),
    );
    let subscriptions = delivery::Subscriptions::new(&w)?;

    let autoscaling = w.aws.autoscaling();
    autoscaling
        .set_launch_template_version(GROUP, "2")
        .map_err(|e| ControlPlaneError::setup("the new launch template version", e))?;
    let (min, max) = run.strategy.percentages();
    let started = Instant::now();
    let preferences = FakeRefreshPreferences::default()
        .healthy_percentage(min, max)
        .instance_warmup(INSTANCE_WARMUP);
    let id = autoscaling
        .start_instance_refresh(GROUP, preferences)
        .map_err(|e| ControlPlaneError::setup("starting the refresh", e))?;
    if run.plant_deletion {
        plant_deletion(&pods, &seeded, &on_the_first_node).await?;
    }
    let (status, failures) =
        delivery::deliver_until_the_end(&w, &admin, run, subscriptions, &id).await;
    let wall = started.elapsed();
    running.store(false, Ordering::Relaxed);
    let sampled = sampler
        .await
        .map_err(|e| ControlPlaneError::setup("sampling the pods", e))?;
    let mut figures = measure(&w, &admin, &at_start, sampled).await?;
    figures.shape = Some(run.shape);
    figures.on_the_first_node = on_the_first_node.len();
    figures.status = status.map(|s| s.as_str().to_owned());
    figures.wall = wall;
    figures.failed_invocations = failures;
    Ok(figures)
}

/// Deletes (without an eviction) the last seeded pod not on the node replaced first.
async fn plant_deletion(
    pods: &Api<Pod>,
    seeded: &[Pod],
    on_the_first_node: &[String],
) -> Result<(), ControlPlaneError> {
    let planted = seeded
        .iter()
        .rev()
        .map(name_of)
        .find(|p| !on_the_first_node.contains(p))
        .ok_or_else(|| ControlPlaneError::setup("planting a deletion", "no pod to delete"))?;
    pods.delete(&planted, &Default::default())
        .await
        .map(|_| ())
        .map_err(|e| ControlPlaneError::setup("planting a deletion", e))
}

fn name_of(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}
