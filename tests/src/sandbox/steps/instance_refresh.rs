//! `instanceRefresh`: a node update. The group's launch template gets version 2 and an
//! instance refresh replaces every instance: Auto Scaling launches and terminates through
//! the lifecycle hooks (the launching hook completes each new node once Ready, the
//! terminating hook drains each old one), and `instance-refresh` takes all outdated nodes out
//! of service when the refresh starts, so no pod lands on a node that is about to go.
//!
//! The step measures what the fakes saw (the benchmark reads the same figures): accepted
//! evictions, pods evicted that had been scheduled after the start (moved twice), pods
//! scheduled onto an outdated node after the start, how long the pods created after the
//! start (the evicted pods' replacements) waited unscheduled, PDB violations, and the marks
//! left.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::node_marks::refresh::REFRESH_LABEL;

use super::{Checks, is_cordoned};
use crate::aws::FakeRefreshPreferences;
use crate::fixtures::{is_daemon_set_pod, pod_key};
use crate::kube::AuditEvent;
use crate::sandbox::scenario::InstanceRefreshStep;
use crate::sandbox::timeline::Source;
use crate::sandbox::world::Sandbox;

/// What one refresh came to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RefreshFigures {
    /// The refresh's final status (`Successful`, `Failed`, ...), `None` if it did not end.
    pub status: Option<String>,
    pub outdated_nodes: usize,
    /// Pods (DaemonSet pods aside) on the outdated nodes when the refresh started.
    pub pods_at_start: usize,
    /// Evictions the API server accepted (201), from the terminating hook.
    pub evictions: usize,
    /// Of those, evictions of pods created after the refresh started: pods that had
    /// already moved once and moved again.
    pub pods_moved_twice: usize,
    /// Pods created after the start that were bound to an outdated node.
    pub scheduled_onto_outdated: usize,
    /// Pending pod-seconds: summed over the pods created after the start (the evicted pods'
    /// replacements), the time each spent without a node, sampled every 20 ms.
    pub pending_pod_seconds: f64,
    /// The longest time one such pod spent without a node.
    pub longest_pending: Duration,
    /// Evictions that broke a PodDisruptionBudget (the fake's disruption log).
    pub pdb_violations: usize,
    /// Start to refresh end, and until our marks were undone.
    pub wall: Duration,
    /// Nodes still carrying the refresh's label at the end.
    pub marks_left: usize,
    /// Instances Auto Scaling retained (terminating action abandoned).
    pub retained: Vec<String>,
    /// Nodes of instances still in the group at the end that are cordoned.
    pub cordoned_left: Vec<String>,
}

fn node_group_of(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get("eks.amazonaws.com/nodegroup")
        .map(String::as_str)
}

fn is_accepted_eviction(event: &AuditEvent, since: &str) -> bool {
    event.user_agent.contains("terminating-hook")
        && event.resource() == "pods"
        && event.subresource() == "eviction"
        && event.code() == 201
        && event.request_received_timestamp.as_str() >= since
}

impl Sandbox {
    pub(in crate::sandbox) async fn instance_refresh(
        &self,
        index: usize,
        step: &InstanceRefreshStep,
    ) -> Checks {
        self.timeline.record(
            Source::Step,
            format!(
                "{}. node update of {}: launch template version 2, instance refresh (min {}%, max {}%)",
                index + 1,
                step.nodegroup,
                step.min_healthy_percentage,
                step.max_healthy_percentage
            ),
        );
        let figures = match self.run_instance_refresh(step).await {
            Ok(figures) => figures,
            Err(error) => return vec![(false, error)],
        };
        self.timeline.record(Source::Note, format!("{figures:?}"));
        let mut checks = vec![(
            figures.status.as_deref() == Some(step.expect_status.as_str()),
            format!(
                "the refresh ended {} (it ended {:?})",
                step.expect_status, figures.status
            ),
        )];
        if step.expect_no_pod_moved_twice {
            checks.push((
                figures.pods_moved_twice == 0 && figures.scheduled_onto_outdated == 0,
                format!(
                    "no pod was scheduled onto an outdated node after the start ({}) nor moved twice ({})",
                    figures.scheduled_onto_outdated, figures.pods_moved_twice
                ),
            ));
        }
        checks.push((
            figures.pdb_violations == 0,
            format!(
                "no eviction broke a PodDisruptionBudget ({})",
                figures.pdb_violations
            ),
        ));
        if self.scenario.refresh_events {
            checks.push((
                figures.marks_left == 0,
                format!(
                    "no node carries the refresh's marks at the end ({})",
                    figures.marks_left
                ),
            ));
        }
        if step.expect_status == "Successful" {
            checks.push((
                figures.cordoned_left.is_empty(),
                format!(
                    "every node left is schedulable (cordoned: {:?})",
                    figures.cordoned_left
                ),
            ));
        } else {
            checks.push((
                !figures.retained.is_empty(),
                format!(
                    "the instance whose drain failed was retained ({:?})",
                    figures.retained
                ),
            ));
            checks.push((
                figures.cordoned_left.len() == figures.retained.len(),
                format!(
                    "only the retained instances' nodes stay cordoned ({:?})",
                    figures.cordoned_left
                ),
            ));
        }
        checks
    }

    /// Plays one refresh of `step`'s node group and measures it.
    pub async fn run_instance_refresh(
        &self,
        step: &InstanceRefreshStep,
    ) -> Result<RefreshFigures, String> {
        let spec = self
            .nodegroup(&step.nodegroup)
            .ok_or_else(|| format!("node group {} is defined", step.nodegroup))?;
        let group = spec.auto_scaling_group.clone();
        let store = self.server.store().clone();
        let outdated: BTreeSet<String> = store
            .list::<Node>()
            .iter()
            .filter(|n| node_group_of(n) == Some(spec.name.as_str()))
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let at_start: BTreeSet<String> = store
            .list::<Pod>()
            .iter()
            .filter(|p| !is_daemon_set_pod(p))
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some_and(|n| outdated.contains(n))
            })
            .map(pod_key)
            .collect();
        let known_uids: BTreeSet<String> = store
            .list::<Pod>()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let violations_before = self.pdb_violations();
        let since = jiff::Timestamp::now().to_string();
        let started = Instant::now();

        let sampling = Arc::new(AtomicBool::new(true));
        let landed: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let pending: Arc<Mutex<BTreeMap<String, Duration>>> = Arc::default();
        let sampler = tokio::spawn(sample(
            Sampled {
                sampling: sampling.clone(),
                landed: landed.clone(),
                pending: pending.clone(),
            },
            store.clone(),
            outdated.clone(),
            known_uids,
        ));

        let autoscaling = self.aws.autoscaling();
        autoscaling
            .set_launch_template_version(&group, "2")
            .map_err(|e| format!("new launch template version: {e}"))?;
        let preferences = FakeRefreshPreferences::default()
            .healthy_percentage(step.min_healthy_percentage, step.max_healthy_percentage)
            .instance_warmup(Duration::from_secs_f64(step.instance_warmup_seconds));
        let id = autoscaling
            .start_instance_refresh(&group, preferences)
            .map_err(|e| format!("StartInstanceRefresh: {e}"))?;
        let timings = &self.scenario.timings;
        let per_node = timings.drain_timeout_seconds
            + timings.settle_seconds
            + timings.launch_timeout_seconds
            + step.instance_warmup_seconds
            + 10.0;
        let limit = Duration::from_secs_f64(per_node * outdated.len().max(1) as f64 + 30.0);
        let status = autoscaling
            .wait_for_refresh_end(&id, limit)
            .await
            .map(|s| s.as_str().to_owned());
        if self.scenario.refresh_events {
            self.wait_for_marks_undone(Duration::from_secs(15)).await;
        }
        let wall = started.elapsed();
        sampling.store(false, Ordering::Relaxed);
        let _ = sampler.await;

        let evicted: Vec<String> = self
            .server
            .audit()
            .filter(|e| is_accepted_eviction(e, &since))
            .iter()
            .map(|e| format!("{}/{}", e.namespace(), e.name()))
            .collect();
        let nodes_left = store.list::<Node>();
        let landed = landed.lock().unwrap_or_else(|e| e.into_inner()).len();
        let pending = pending.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(RefreshFigures {
            status,
            outdated_nodes: outdated.len(),
            pods_at_start: at_start.len(),
            evictions: evicted.len(),
            pods_moved_twice: evicted.iter().filter(|p| !at_start.contains(*p)).count(),
            scheduled_onto_outdated: landed,
            pending_pod_seconds: pending.values().fold(0.0, |sum, d| sum + d.as_secs_f64()),
            longest_pending: pending.values().max().copied().unwrap_or_default(),
            pdb_violations: self.pdb_violations().saturating_sub(violations_before),
            wall,
            marks_left: nodes_left.iter().filter(|n| has_refresh_label(n)).count(),
            retained: autoscaling.retained_instances(&group),
            cordoned_left: nodes_left
                .iter()
                .filter(|n| is_cordoned(Some(n)))
                // The Node of a terminated instance is deleted a moment later: not left.
                .filter(|n| {
                    instance_of(n)
                        .is_some_and(|id| autoscaling.instance_state(&group, id).is_some())
                })
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
        })
    }

    /// The end event is handled after Auto Scaling ends the refresh: wait for it.
    async fn wait_for_marks_undone(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let marked = self
                .server
                .store()
                .list::<Node>()
                .iter()
                .any(has_refresh_label);
            if !marked {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What the sampler fills while the refresh runs.
struct Sampled {
    sampling: Arc<AtomicBool>,
    /// Pods created after the start that were bound to an outdated node.
    landed: Arc<Mutex<BTreeSet<String>>>,
    /// Per pod created after the start, the time it was seen without a node.
    pending: Arc<Mutex<BTreeMap<String, Duration>>>,
}

/// Every 20 ms until told to stop: the pods created since the start (not in `known_uids`)
/// that are bound to an outdated node, and those without a node (for the time since the
/// last sample).
async fn sample(
    sampled: Sampled,
    store: crate::kube::Store,
    outdated: BTreeSet<String>,
    known_uids: BTreeSet<String>,
) {
    let mut last = Instant::now();
    while sampled.sampling.load(Ordering::Relaxed) {
        let elapsed = last.elapsed();
        last = Instant::now();
        for pod in store.list::<Pod>() {
            let new = pod
                .metadata
                .uid
                .as_ref()
                .is_some_and(|uid| !known_uids.contains(uid));
            if !new || is_daemon_set_pod(&pod) {
                continue;
            }
            match pod.spec.as_ref().and_then(|s| s.node_name.as_ref()) {
                Some(node) if outdated.contains(node) => {
                    let mut landed = sampled.landed.lock().unwrap_or_else(|e| e.into_inner());
                    landed.insert(pod_key(&pod));
                }
                Some(_) => {}
                None => {
                    let mut pending = sampled.pending.lock().unwrap_or_else(|e| e.into_inner());
                    *pending.entry(pod_key(&pod)).or_default() += elapsed;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn instance_of(node: &Node) -> Option<&str> {
    node.spec
        .as_ref()?
        .provider_id
        .as_deref()?
        .rsplit('/')
        .next()
}

fn has_refresh_label(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(REFRESH_LABEL))
}
