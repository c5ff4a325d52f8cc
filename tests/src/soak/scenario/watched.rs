//! Auto Scaling as the functions see it in a soak, recording each completion with the
//! workload pods still running on the node at that instant; and the pod predicates the
//! invariants count with.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use node_manager::aws::in_memory::InMemoryAutoScaling;
use node_manager::aws::{
    AutoScaling, AwsError, CompletionOutcome, HeartbeatOutcome, LifecycleActionRef,
    LifecycleActionResult, LifecycleHook,
};

use super::{Budget, TOLERANT_APP};
use crate::fixtures::{is_daemon_set_pod, pod_is_ready};
use crate::kube::Store;

/// A successful completion: the action, its result, the workload pods still running on the
/// node at that instant, and when.
pub(super) type CompletionSeen = (
    LifecycleActionRef,
    LifecycleActionResult,
    usize,
    std::time::Instant,
);

/// Auto Scaling that remembers, for each successful completion, whether the instance's node
/// still had pods that were not on their way out (a completion before the drain finished).
#[derive(Clone)]
pub(super) struct WatchedAutoScaling {
    inner: InMemoryAutoScaling,
    store: Store,
    node_of: Arc<BTreeMap<String, String>>,
    pub(super) completions: Arc<Mutex<Vec<CompletionSeen>>>,
    calls: Arc<AtomicU64>,
}

impl WatchedAutoScaling {
    /// Watches `inner`; `node_of` names each instance's node.
    pub(super) fn new(
        inner: InMemoryAutoScaling,
        store: Store,
        node_of: Arc<BTreeMap<String, String>>,
    ) -> Self {
        Self {
            inner,
            store,
            node_of,
            completions: Arc::default(),
            calls: Arc::default(),
        }
    }
}

impl AutoScaling for WatchedAutoScaling {
    async fn complete_lifecycle_action(
        &self,
        action: &LifecycleActionRef,
        result: LifecycleActionResult,
    ) -> Result<CompletionOutcome, AwsError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.complete_lifecycle_action(action, result).await?;
        if outcome == CompletionOutcome::Completed {
            let remaining = self
                .node_of
                .get(&action.instance_id)
                .map(|node| live_workload_pods_on(&self.store, node))
                .unwrap_or(0);
            self.completions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((action.clone(), result, remaining, std::time::Instant::now()));
        }
        Ok(outcome)
    }

    async fn record_lifecycle_action_heartbeat(
        &self,
        action: &LifecycleActionRef,
    ) -> Result<HeartbeatOutcome, AwsError> {
        self.inner.record_lifecycle_action_heartbeat(action).await
    }

    async fn describe_lifecycle_hook(
        &self,
        group_name: &str,
        hook_name: &str,
    ) -> Result<Option<LifecycleHook>, AwsError> {
        self.inner
            .describe_lifecycle_hook(group_name, hook_name)
            .await
    }

    async fn group_tags(
        &self,
        group_name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, AwsError> {
        self.inner.group_tags(group_name).await
    }

    async fn retains_abandoned_instances(
        &self,
        group_name: &str,
    ) -> Result<Option<bool>, AwsError> {
        self.inner.retains_abandoned_instances(group_name).await
    }
}

/// Whether the pod belongs to the Deployment that tolerates the cordon: like a DaemonSet
/// pod, it may be on a drained node by design.
fn is_tolerant_pod(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app"))
        .is_some_and(|app| app == TOLERANT_APP)
}

/// Pods on `node` that are not DaemonSet pods, not of the app tolerating the cordon and not
/// being deleted.
fn live_workload_pods_on(store: &Store, node: &str) -> usize {
    store
        .list::<Pod>()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none() && !is_daemon_set_pod(p) && !is_tolerant_pod(p)
        })
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .count()
}

/// Ready and not being deleted: what a budget counts as healthy.
pub(super) fn pod_healthy(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && pod_is_ready(pod)
}

/// The healthy pods `budget` selects now.
pub(super) fn healthy_count(store: &Store, budget: &Budget) -> i32 {
    let count = store
        .list_in::<Pod>(&budget.namespace)
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .is_some_and(|a| a == &budget.app)
        })
        .filter(|p| pod_healthy(p))
        .count();
    i32::try_from(count).unwrap_or(i32::MAX)
}
