//! What the real-plane tests seed and read back, in one place: Deployments behind a
//! PodDisruptionBudget, cordons, the pods available per Deployment, and the audit log's
//! writes and accepted evictions of a function's user.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::ControlPlaneError;
use crate::fixtures::{self, Workload};
use crate::kube::AuditEvent;

/// A Deployment to seed: pods labelled `app=<app>` and `labels`.
#[derive(Debug, Clone)]
pub struct GuardedDeployment<'a> {
    pub namespace: &'a str,
    pub app: &'a str,
    pub replicas: usize,
    pub grace_seconds: i64,
    pub labels: &'a [(&'a str, &'a str)],
    /// With a PDB `maxUnavailable: 1` over its pods.
    pub budget: bool,
}

impl GuardedDeployment<'_> {
    /// Creates the Deployment (and its budget).
    pub async fn create(&self, admin: &kube::Client) -> Result<(), ControlPlaneError> {
        let mut labels = vec![("app", self.app)];
        labels.extend_from_slice(self.labels);
        let replicas = i32::try_from(self.replicas).map_err(|e| setup(self.app, e))?;
        let deployment = Workload::new(self.namespace, self.app)
            .labels(&labels)
            .replicas(replicas)
            .grace_period_seconds(Some(self.grace_seconds))
            .deployment();
        Api::<Deployment>::namespaced(admin.clone(), self.namespace)
            .create(&PostParams::default(), &deployment)
            .await
            .map_err(|e| setup(self.app, e))?;
        if self.budget {
            let budget = fixtures::pdb_max_unavailable(
                self.namespace,
                self.app,
                json!(1),
                &[("app", self.app)],
            );
            Api::<PodDisruptionBudget>::namespaced(admin.clone(), self.namespace)
                .create(&PostParams::default(), &budget)
                .await
                .map_err(|e| setup(self.app, e))?;
        }
        Ok(())
    }
}

/// Cordons (or opens) `node`.
pub async fn set_cordoned(
    admin: &kube::Client,
    node: &str,
    cordoned: bool,
) -> Result<(), ControlPlaneError> {
    Api::<Node>::all(admin.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": cordoned}})),
        )
        .await
        .map(|_| ())
        .map_err(|e| setup(node, e))
}

/// Pods selected by `selector`, per `app` label: how many are Ready and not terminating.
/// Empty when the list fails.
pub async fn available_by_app(pods: &Api<Pod>, selector: &str) -> BTreeMap<String, usize> {
    match pods.list(&ListParams::default().labels(selector)).await {
        Ok(list) => count_available_by_app(&list.items),
        Err(_) => BTreeMap::new(),
    }
}

/// The pods `selector` chooses (`""`: all) that run on one of `nodes` and are not being
/// deleted: what a drain of those nodes left behind.
pub async fn live_pods_on(
    pods: &Api<Pod>,
    selector: &str,
    nodes: &std::collections::BTreeSet<String>,
) -> Result<Vec<Pod>, kube::Error> {
    let listed = pods.list(&ListParams::default().labels(selector)).await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.as_ref());
            node.is_some_and(|n| nodes.contains(n))
        })
        .collect())
}

/// Whether `pod` counts as available: Ready and not being deleted.
pub fn is_available(pod: &Pod) -> bool {
    fixtures::pod_is_ready(pod) && pod.metadata.deletion_timestamp.is_none()
}

/// `pods` per `app` label: how many are Ready and not terminating.
pub fn count_available_by_app(pods: &[Pod]) -> BTreeMap<String, usize> {
    let mut available = BTreeMap::new();
    for pod in pods {
        let app = pod.metadata.labels.as_ref().and_then(|l| l.get("app"));
        let counted = available
            .entry(app.cloned().unwrap_or_default())
            .or_insert(0);
        if is_available(pod) {
            *counted += 1;
        }
    }
    available
}

/// Budgets of `namespace` whose status (the disruption controller's, 0.2-3 s behind)
/// allows exactly one disruption.
pub async fn budgets_allowing_one(admin: &kube::Client, namespace: &str) -> usize {
    Api::<PodDisruptionBudget>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .iter()
                .filter(|b| {
                    b.status
                        .as_ref()
                        .is_some_and(|s| s.disruptions_allowed == 1)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits until each of `apps` Deployments selected by `selector` in `namespace` has
/// `replicas` pods available and, with `budgets`, each budget allows one disruption.
pub async fn wait_for_available(
    admin: &kube::Client,
    (namespace, selector): (&str, &str),
    (apps, replicas): (usize, usize),
    budgets: bool,
    timeout: Duration,
) -> Result<(), ControlPlaneError> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    let deadline = Instant::now() + timeout;
    loop {
        let by_app = available_by_app(&pods, selector).await;
        let allowing = budgets_allowing_one(admin, namespace).await;
        if by_app.len() == apps
            && by_app.values().all(|n| *n == replicas)
            && (!budgets || allowing == apps)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(setup(
                selector,
                format!(
                    "not available after {timeout:?}: {by_app:?}, {allowing} budgets allowing one"
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The writes of `user` (every verb but get, list and watch), in the order logged.
pub fn writes_of(audit: &[AuditEvent], user: &str) -> Vec<AuditEvent> {
    audit
        .iter()
        .filter(|e| e.user.username == user)
        .filter(|e| !matches!(e.verb.as_str(), "get" | "list" | "watch"))
        .cloned()
        .collect()
}

/// The evictions of `user` the API server accepted, in the order logged.
pub fn accepted_evictions(audit: &[AuditEvent], user: &str) -> Vec<AuditEvent> {
    audit
        .iter()
        .filter(|e| e.user.username == user)
        .filter(|e| e.subresource() == "eviction" && (200..300).contains(&e.code()))
        .cloned()
        .collect()
}

/// [`accepted_evictions`] counted per pod name.
pub fn evictions_per_pod(audit: &[AuditEvent], user: &str) -> BTreeMap<String, usize> {
    let mut by_pod = BTreeMap::new();
    for eviction in accepted_evictions(audit, user) {
        *by_pod.entry(eviction.name().to_owned()).or_insert(0) += 1;
    }
    by_pod
}

fn setup(what: &str, error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::setup(format!("seeding {what}"), error)
}
