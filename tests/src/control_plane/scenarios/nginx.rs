//! The workload the drain scenarios (drain, Spot, repair) seed and watch: the `nginx`
//! Deployment of [`REPLICAS`] behind a PDB `maxUnavailable: 1`, on the world's node, with
//! [`OTHER_NODE`] to move to.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::super::ControlPlaneError;
use super::super::workload::{
    GuardedDeployment, available_by_app, set_cordoned, wait_for_available,
};
use super::super::world::RealFunctionWorld;
use super::{Played, eventually};
use crate::fixtures;

/// The node the evicted pods move to.
pub const OTHER_NODE: &str = "ip-10-0-9-9.eu-west-1.compute.internal";
/// The Deployment's replicas; the budget lets one of them be unavailable.
pub const REPLICAS: usize = 4;
const NAMESPACE: &str = "default";
const SELECTOR: &str = "app=nginx";

/// An `nginx` pod as the scenarios look at it.
#[derive(Debug, Clone)]
pub struct NginxPod {
    pub name: String,
    pub node: String,
    pub ready: bool,
    pub terminating: bool,
}

/// The pods of the `nginx` Deployment; empty when the list fails.
pub async fn nginx_pods(client: &kube::Client) -> Vec<NginxPod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let Ok(list) = pods.list(&ListParams::default().labels(SELECTOR)).await else {
        return Vec::new();
    };
    list.items
        .iter()
        .map(|p| NginxPod {
            name: p.metadata.name.clone().unwrap_or_default(),
            node: p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            ready: fixtures::pod_is_ready(p),
            terminating: p.metadata.deletion_timestamp.is_some(),
        })
        .collect()
}

/// Seeds `nginx` (pods with grace `grace`) on the world's node while [`OTHER_NODE`] is
/// registered cordoned, waits until every replica is available and the budget allows one
/// disruption, then opens [`OTHER_NODE`]; returns the pods' names.
pub async fn seed_nginx(
    w: &RealFunctionWorld,
    admin: &kube::Client,
    grace: i64,
) -> Result<BTreeSet<String>, ControlPlaneError> {
    w.kubelets
        .register_node(
            OTHER_NODE,
            "aws:///eu-west-1b/i-0fffeeeedddd11112",
            "eu-west-1b",
            true,
        )
        .await?;
    GuardedDeployment {
        namespace: NAMESPACE,
        app: "nginx",
        replicas: REPLICAS,
        grace_seconds: grace,
        labels: &[],
        budget: true,
    }
    .create(admin)
    .await?;
    // Available and the budget allowing one: the disruption controller computes the
    // budget's status asynchronously, and allowing one means all four are healthy.
    let selected = (NAMESPACE, SELECTOR);
    wait_for_available(
        admin,
        selected,
        (1, REPLICAS),
        true,
        Duration::from_secs(20),
    )
    .await?;
    set_cordoned(admin, OTHER_NODE, false).await?;
    Ok(nginx_pods(admin)
        .await
        .into_iter()
        .map(|p| p.name)
        .collect())
}

/// Waits (at most `timeout`) until the `nginx` pods satisfy `condition`; the error names
/// `what` and lists the pods.
pub async fn wait_for_pods(
    admin: &kube::Client,
    what: &str,
    timeout: Duration,
    condition: impl Fn(&[NginxPod]) -> bool,
) -> Result<(), ControlPlaneError> {
    let condition = &condition;
    let met = eventually(
        timeout,
        || async move { condition(&nginx_pods(admin).await) },
    )
    .await;
    if met {
        return Ok(());
    }
    let pods = nginx_pods(admin).await;
    Err(ControlPlaneError::setup(
        format!("waiting for {what}"),
        format!("not within {timeout:?}; nginx pods: {pods:#?}"),
    ))
}

/// Samples, every 20 ms until stopped, the fewest `nginx` pods Ready and not terminating
/// (a failed list counts as none).
pub struct AvailabilityWatch {
    /// The fewest seen; `None` until the first sample.
    fewest: Arc<Mutex<Option<usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl AvailabilityWatch {
    pub fn start(client: kube::Client) -> Self {
        let fewest = Arc::new(Mutex::new(None));
        let task = tokio::spawn({
            let fewest = fewest.clone();
            let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
            async move {
                loop {
                    let by_app = available_by_app(&pods, SELECTOR).await;
                    let available = by_app.get("nginx").copied().unwrap_or(0);
                    {
                        let mut fewest = fewest.lock().unwrap_or_else(PoisonError::into_inner);
                        *fewest = Some(fewest.map_or(available, |f: usize| f.min(available)));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Self { fewest, task }
    }

    /// Stops sampling; the fewest seen, `None` when no sample was taken.
    pub fn stop(self) -> Option<usize> {
        self.task.abort();
        *self.fewest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops sampling and expects the budget to have held throughout: never fewer than
    /// `REPLICAS - maxUnavailable` available.
    pub fn expect_budget_held(self, played: &mut Played) {
        let fewest = self.stop();
        played.expect(
            format!(
                "the budget held: never fewer than {} of {REPLICAS} replicas available",
                REPLICAS - 1
            ),
            fewest.is_some_and(|f| f >= REPLICAS - 1),
            match fewest {
                Some(f) => format!("only {f} replicas were available at one point"),
                None => {
                    "no availability sample was taken: nothing shows the budget held".to_owned()
                }
            },
        );
    }
}
