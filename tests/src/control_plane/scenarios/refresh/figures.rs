//! What one refresh came to, as a user of the cluster sees it: sampled while it runs, counted
//! from the audit log and the nodes when it ends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use node_manager::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;
use node_manager::node_marks::refresh::REFRESH_LABEL;

use super::super::Played;
use super::group::{REFRESH_FUNCTION, SEEDED};
use super::{Shape, Strategy};
use crate::control_plane::ControlPlaneError;
use crate::control_plane::workload::{accepted_evictions, count_available_by_app};
use crate::control_plane::world::RealFunctionWorld;

const HOOK_USERS: [&str; 3] = ["terminating-hook", "launching-hook", REFRESH_FUNCTION];

pub(super) const TABLE_HEADER: &str = "| nodes | strategy | instance-refresh | status | pods at start | evictions | evictions per pod | pods moved twice | Pending pod-seconds | most pods of a Deployment unavailable | nodes left marked | time to the end (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|";

/// What one refresh came to, as a user of the cluster sees it.
#[derive(Debug, Default)]
pub struct Figures {
    pub shape: Option<Shape>,
    pub status: Option<String>,
    /// Pods on the outdated nodes when the refresh started.
    pub pods_at_start: usize,
    /// Of those, the pods on the node Auto Scaling replaces first.
    pub on_the_first_node: usize,
    /// Evictions the API server accepted (the audit log), from the terminating hook.
    pub evictions: usize,
    /// Evicted pods that had been created after the start: moved once already.
    pub moved_twice: usize,
    /// Pods of the start that were never evicted.
    pub not_evicted: Vec<String>,
    /// Pod deletions by any function (there must be none: evictions only).
    pub pod_deletions: usize,
    /// The fewest pods of one Deployment Ready and not terminating at once; `None` when the
    /// sampler never listed them.
    pub fewest_available: Option<usize>,
    /// Summed over the pods created after the start, the time each had no node.
    pub pending_pod_seconds: f64,
    /// Start until the refresh ended and the function undid its marks.
    pub wall: Duration,
    /// Nodes left cordoned, excluded from load balancers or labelled by the refresh.
    pub marked_left: Vec<String>,
    /// Invocations that did not end with a response.
    pub failed_invocations: Vec<String>,
}

impl Figures {
    pub fn evictions_per_pod(&self) -> f64 {
        self.evictions as f64 / self.pods_at_start.max(1) as f64
    }

    fn replicas(&self) -> usize {
        self.shape.map_or(0, |s| s.replicas)
    }

    /// Its row of BENCHMARKS.md §12.
    pub fn row(&self, strategy: Strategy, with_function: bool) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {:.1} | {} | {} | {:.1} |",
            self.shape.map_or(0, |s| s.nodes),
            strategy.name(),
            if with_function { "on" } else { "off" },
            self.status.as_deref().unwrap_or("did not end"),
            self.pods_at_start,
            self.evictions,
            self.evictions_per_pod(),
            self.moved_twice,
            self.pending_pod_seconds,
            self.fewest_available
                .map_or("not sampled".to_owned(), |fewest| {
                    (self.replicas() - fewest.min(self.replicas())).to_string()
                }),
            self.marked_left.len(),
            self.wall.as_secs_f64(),
        )
    }

    /// What a user would call wrong, with or without the function: each line one fault.
    pub fn violations(&self) -> Vec<String> {
        let mut faults = Vec::new();
        if self.status.as_deref() != Some("Successful") {
            faults.push(format!("the refresh ended {:?}", self.status));
        }
        faults.extend(self.failed_invocations.iter().cloned());
        if !self.not_evicted.is_empty() {
            faults.push(format!(
                "pods of the outdated nodes gone without an eviction: {:?}",
                self.not_evicted
            ));
        }
        if self.pod_deletions > 0 {
            faults.push(format!(
                "{} pod deletions by a function",
                self.pod_deletions
            ));
        }
        match self.fewest_available {
            None => faults.push(
                "no availability sample was taken: nothing shows the budgets held".to_owned(),
            ),
            Some(fewest) if fewest + 1 < self.replicas() => faults.push(format!(
                "a budget was broken: only {fewest} of {} pods of a Deployment available at one point",
                self.replicas()
            )),
            Some(_) => {}
        }
        if !self.marked_left.is_empty() {
            faults.push(format!("nodes left marked: {:?}", self.marked_left));
        }
        faults
    }

    /// Expects no [`Figures::violations`].
    pub fn expect_seen_by_a_user(&self, played: &mut Played, what: &str) {
        let faults = self.violations();
        played.expect(
            format!("{what}: Successful, every pod evicted (none deleted), no budget broken, no mark left"),
            faults.is_empty(),
            format!("{faults:#?}\n{self:?}"),
        );
    }
}

/// What the sampler saw while the refresh ran.
#[derive(Default)]
pub(super) struct Sampled {
    fewest_available: Option<usize>,
    /// Per pod created after the start, the time it was seen without a node.
    pending: BTreeMap<String, Duration>,
}

/// Every 50 ms until `running` is cleared: the fewest pods of one Deployment available, and
/// the time the pods not in `known_uids` spent without a node.
pub(super) fn sample(
    pods: Api<Pod>,
    known_uids: BTreeSet<String>,
    running: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Sampled> {
    tokio::spawn(async move {
        let mut sampled = Sampled::default();
        let mut last = Instant::now();
        while running.load(Ordering::Relaxed) {
            let elapsed = last.elapsed();
            last = Instant::now();
            if let Ok(list) = pods.list(&ListParams::default().labels(SEEDED.1)).await {
                for pod in &list.items {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    let unbound = pod.spec.as_ref().is_none_or(|s| s.node_name.is_none());
                    if unbound && !known_uids.contains(&uid) {
                        *sampled.pending.entry(uid).or_default() += elapsed;
                    }
                }
                let by_app = count_available_by_app(&list.items);
                if let Some(&least) = by_app.values().min() {
                    sampled.fewest_available =
                        Some(sampled.fewest_available.map_or(least, |f| f.min(least)));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        sampled
    })
}

/// The figures of the audit log, the nodes and the samples.
pub(super) async fn measure(
    w: &RealFunctionWorld,
    admin: &kube::Client,
    at_start: &BTreeMap<String, String>,
    sampled: Sampled,
) -> Result<Figures, ControlPlaneError> {
    let audit = w.plane.audit();
    let evicted = accepted_evictions(&audit, "terminating-hook");
    let evicted: Vec<&str> = evicted.iter().map(|e| e.name()).collect();
    let evicted_names: BTreeSet<&str> = evicted.iter().copied().collect();
    let pod_deletions = audit
        .iter()
        .filter(|e| HOOK_USERS.contains(&e.user.username.as_str()))
        .filter(|e| e.verb == "delete" && e.resource() == "pods")
        .count();
    let marked_left = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| ControlPlaneError::setup("listing the nodes", e))?
        .items
        .iter()
        .filter(|n| is_marked(n))
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    Ok(Figures {
        pods_at_start: at_start.len(),
        evictions: evicted.len(),
        moved_twice: evicted
            .iter()
            .filter(|p| !at_start.contains_key(**p))
            .count(),
        not_evicted: at_start
            .keys()
            .filter(|p| !evicted_names.contains(p.as_str()))
            .cloned()
            .collect(),
        pod_deletions,
        fewest_available: sampled.fewest_available,
        // A fold from +0.0: an empty `sum()` of floats is -0.0.
        pending_pod_seconds: sampled
            .pending
            .values()
            .fold(0.0, |sum, d| sum + d.as_secs_f64()),
        marked_left,
        ..Figures::default()
    })
}

fn is_marked(node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
        || labels.contains_key(REFRESH_LABEL)
        || labels.contains_key(EXCLUDE_FROM_LOAD_BALANCERS_LABEL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_the_sampler_never_saw_is_a_violation_not_a_pass() {
        let unsampled = Figures {
            status: Some("Successful".to_owned()),
            ..Figures::default()
        };
        assert!(
            unsampled
                .violations()
                .iter()
                .any(|v| v.contains("no availability sample")),
            "{:?}",
            unsampled.violations()
        );
        let sampled = Figures {
            fewest_available: Some(0),
            ..unsampled
        };
        assert!(
            sampled.violations().is_empty(),
            "{:?}",
            sampled.violations()
        );
    }
}
