//! The watchdog: samples every budget's healthy pods and the launching node's cordon every
//! few milliseconds while the scenario runs. Evictions and pod DELETEs are checked exactly,
//! from the server's disruption log, after the scenario; the samples catch what neither
//! records (a pod turned unready or removed without an eviction or a DELETE).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use tokio::task::JoinHandle;

use super::setup::Soak;
use super::watched::healthy_count;
use crate::kube::DisruptionLog;

/// The running watchdog.
pub(super) struct Watchdog {
    stop: Arc<AtomicBool>,
    violations: Arc<Mutex<Vec<String>>>,
    samples: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

/// What the watchdog saw.
pub(super) struct WatchdogFindings {
    pub(super) violations: Vec<String>,
    pub(super) samples: u64,
}

impl Watchdog {
    pub(super) fn spawn(soak: &Soak) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(Mutex::new(Vec::<String>::new()));
        let samples = Arc::new(AtomicU64::new(0));
        let store = soak.store.clone();
        let budgets = soak.budgets.clone();
        let launching_node = soak.launching_node();
        let disruptions = soak.server.disruption_log().clone();
        let (stopped, found, sampled) = (stop.clone(), violations.clone(), samples.clone());
        let task = tokio::spawn(async move {
            while !stopped.load(Ordering::Relaxed) {
                sampled.fetch_add(1, Ordering::Relaxed);
                let mut seen = Vec::new();
                for budget in &budgets {
                    let healthy = healthy_count(&store, budget);
                    // Read after the count: a DELETE that caused the dip is logged by now.
                    if healthy < budget.min_healthy
                        && !deleted_directly(&disruptions, &budget.namespace, &budget.name)
                    {
                        seen.push(format!(
                            "PDB {}/{} needs {} healthy pods, had {healthy} (sample)",
                            budget.namespace, budget.name, budget.min_healthy
                        ));
                    }
                }
                if let Some(node) = &launching_node
                    && store
                        .find::<Node>("", node)
                        .and_then(|n| n.spec)
                        .and_then(|s| s.unschedulable)
                        == Some(true)
                {
                    seen.push(format!("node {node} of a LAUNCHING instance was cordoned"));
                }
                found.lock().unwrap_or_else(|e| e.into_inner()).extend(seen);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        });
        Self {
            stop,
            violations,
            samples,
            task,
        }
    }

    /// Stops sampling; the violations seen (consecutive repeats once) and the samples taken.
    pub(super) async fn stop(self) -> WatchdogFindings {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let mut violations = self
            .violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        violations.dedup();
        WatchdogFindings {
            violations,
            samples: self.samples.load(Ordering::Relaxed),
        }
    }
}

/// Whether a pod DELETE the server carried out touched a pod of this budget.
fn deleted_directly(log: &DisruptionLog, namespace: &str, budget: &str) -> bool {
    log.pod_deletions().iter().any(|d| {
        d.deleted()
            && d.budgets
                .iter()
                .any(|b| b.namespace == namespace && b.name == budget)
    })
}
