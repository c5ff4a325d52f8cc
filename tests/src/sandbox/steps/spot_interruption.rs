//! `spotInterruption`: EC2 interrupts a seeded Spot instance of a group with a terminating
//! hook. The warning goes on the EventBridge bus (to `terminating-hook` through the stack's
//! rule) and Auto Scaling terminates the instance at once (its lifecycle notification to
//! `terminating-hook` through SNS), so the function hears of the same node twice, together;
//! EC2 takes the instance when the notice runs out.
//!
//! The checks say what the two deliveries must come to: one drain of the node, working to
//! the instance's end rather than to the drain timeout, every pod off the node before the
//! instance goes, each evicted once, critical pods last, the PodDisruptionBudgets held, and
//! the lifecycle action completed once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::node_marks::checkpoint::{
    CHECKPOINT_ANNOTATION, DrainCheckpoint, InstanceNotice, NoticeKind,
};

use super::{Checks, listing};
use crate::aws::{CompletedBy, FakeEc2, InstanceState, SpotInterruptionAction};
use crate::fixtures::{is_daemon_set_pod, pod_key, pods_on};
use crate::kube::{AuditEvent, Store};
use crate::sandbox::scenario::SpotInterruptionStep;
use crate::sandbox::timeline::Source;
use crate::sandbox::world::{Sandbox, SimulatedNode};

const WARNING: &str = "EC2 Spot Instance Interruption Warning";

/// What a warning's invocation may answer when its drain is the node's only one: it drained
/// the node itself, joined the lifecycle drain under way, or let the lifecycle drain take
/// its drain over.
const ONE_DRAIN: [&str; 3] = [
    "Drained",
    "JoinedLifecycleDrain",
    "TakenOverByLifecycleDrain",
];

/// What the step saw of the node and its instance while it ran.
#[derive(Debug, Default)]
struct Observed {
    /// When the last evictable pod left the node (its object deleted).
    emptied_at: Option<Instant>,
    /// When EC2 first reported the instance no longer running.
    instance_ended_at: Option<Instant>,
    /// The node's drain checkpoint as last seen (the Node is deleted after the instance).
    checkpoint: Option<DrainCheckpoint>,
}

/// Samples the node's pods, its checkpoint and its instance's state until stopped: the
/// order of those changes is what the checks are about, and the Node is gone soon after.
struct Watch {
    running: Arc<AtomicBool>,
    observed: Arc<Mutex<Observed>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(store: Store, ec2: FakeEc2, node: SimulatedNode, evictable: BTreeSet<String>) -> Self {
        let running = Arc::new(AtomicBool::new(true));
        let observed: Arc<Mutex<Observed>> = Arc::default();
        let task = tokio::spawn({
            let (running, observed) = (running.clone(), observed.clone());
            async move {
                // One last look after the stop, so a change just before it is not missed.
                loop {
                    let last = !running.load(Ordering::Relaxed);
                    sample(&store, &ec2, &node, &evictable, &observed);
                    if last {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Self {
            running,
            observed,
            task,
        }
    }

    async fn stop(self) -> Observed {
        self.running.store(false, Ordering::Relaxed);
        let _ = self.task.await;
        std::mem::take(&mut *self.observed.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Notes what changed since the last look: the node emptied of `evictable` pods, the
/// instance no longer running, the node's checkpoint.
fn sample(
    store: &Store,
    ec2: &FakeEc2,
    node: &SimulatedNode,
    evictable: &BTreeSet<String>,
    observed: &Mutex<Observed>,
) {
    let pods = store.list::<Pod>();
    let empty = !pods_on(&pods, &node.name).any(|p| evictable.contains(&pod_key(p)));
    let ended = ec2
        .instance(&node.instance_id)
        .is_none_or(|i| !matches!(i.state, InstanceState::Running | InstanceState::Pending));
    let checkpoint = store
        .find::<Node>("", &node.name)
        .as_ref()
        .and_then(|n| n.metadata.annotations.as_ref())
        .and_then(|a| a.get(CHECKPOINT_ANNOTATION))
        .and_then(|raw| DrainCheckpoint::parse(raw).ok());
    let mut seen = observed.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    if empty && seen.emptied_at.is_none() {
        seen.emptied_at = Some(now);
    }
    if ended && seen.instance_ended_at.is_none() {
        seen.instance_ended_at = Some(now);
    }
    if checkpoint.is_some() {
        seen.checkpoint = checkpoint;
    }
}

fn is_critical(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    matches!(
        spec.priority_class_name.as_deref(),
        Some("system-cluster-critical" | "system-node-critical")
    ) || spec.priority.is_some_and(|p| p >= 2_000_000_000)
}

fn is_accepted_eviction(event: &AuditEvent) -> bool {
    event.user_agent.contains("terminating-hook")
        && event.resource() == "pods"
        && event.subresource() == "eviction"
        && event.code() == 201
}

impl Sandbox {
    pub(in crate::sandbox) async fn spot_interruption(
        &self,
        index: usize,
        step: &SpotInterruptionStep,
    ) -> Checks {
        let Some((spec, node)) = self.seeded(&step.nodegroup, step.node) else {
            return vec![(
                false,
                format!("node {} of {} exists", step.node, step.nodegroup),
            )];
        };
        let store = self.server.store();
        let pods = store.list::<Pod>();
        let evictable: Vec<&Pod> = pods_on(&pods, &node.name)
            .filter(|p| !is_daemon_set_pod(p))
            .collect();
        let keys: BTreeSet<String> = evictable.iter().map(|p| pod_key(p)).collect();
        let critical: BTreeSet<String> = evictable
            .iter()
            .filter(|p| is_critical(p))
            .map(|p| pod_key(p))
            .collect();
        self.timeline.record(
            Source::Step,
            format!(
                "{}. Spot interruption of instance {} (node {}, {}): warning, {}s notice; pods on it: {}",
                index + 1,
                node.instance_id,
                node.name,
                spec.auto_scaling_group,
                step.notice_seconds,
                keys.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        );
        let audit_before = self.server.audit().events().len();
        let violations_before = self.pdb_violations();
        let completions_before = self.completions_of(&node.instance_id);
        let answers_before = self.answers().len();
        let watch = Watch::start(store.clone(), self.aws.ec2(), node.clone(), keys.clone());
        let started = Instant::now();
        let interruption = self.aws.interruptions().spot_interruption_carried_out(
            &node.instance_id,
            SpotInterruptionAction::Terminate,
            Duration::from_secs_f64(step.notice_seconds),
        );
        let interruption = match interruption {
            Ok(interruption) => interruption,
            Err(error) => {
                watch.stop().await;
                return vec![(
                    false,
                    format!("EC2 interrupts {}: {error}", node.instance_id),
                )];
            }
        };
        let notice_runs_out = started + interruption.carried_out_after;
        let timings = &self.scenario.timings;
        let wait = Duration::from_secs_f64(
            timings.drain_timeout_seconds.min(step.notice_seconds) + timings.settle_seconds + 30.0,
        );
        let completion = self
            .next_completion(&node.instance_id, completions_before, wait)
            .await;
        // The instance goes once the action is completed; the warning's invocation may still
        // be writing its answer.
        self.wait_until(Duration::from_secs(10), || {
            let answered = self
                .warning_answer(&node.instance_id, answers_before)
                .is_some();
            let ended = self
                .aws
                .ec2()
                .instance(&node.instance_id)
                .is_none_or(|i| i.state != InstanceState::Running);
            answered && (ended || completion.is_none())
        })
        .await;
        let observed = watch.stop().await;
        let warning_outcome = self.warning_answer(&node.instance_id, answers_before);
        let evictions: Vec<AuditEvent> = self
            .server
            .audit()
            .events()
            .into_iter()
            .skip(audit_before)
            .filter(is_accepted_eviction)
            .collect();
        self.timeline.record(
            Source::Note,
            format!(
                "node emptied {:?} and instance ended {:?} after the warning (EC2 would take it after {:?}); the warning's invocation answered {:?}; {} evictions accepted",
                observed.emptied_at.map(|t| t - started),
                observed.instance_ended_at.map(|t| t - started),
                interruption.carried_out_after,
                warning_outcome,
                evictions.len()
            ),
        );

        let mut checks = vec![(
            warning_outcome
                .as_deref()
                .is_some_and(|o| ONE_DRAIN.contains(&o)),
            format!(
                "terminating-hook confirmed the Spot warning and answered it with the node's one drain ({})",
                warning_outcome.as_deref().unwrap_or("no answer")
            ),
        )];
        let warning_time = interruption.warning["time"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok());
        checks.push(drain_works_to_the_instance_end(
            observed.checkpoint.as_ref(),
            warning_time,
            step.notice_seconds,
        ));
        let instance_end = observed
            .instance_ended_at
            .map_or(notice_runs_out, |ended| ended.min(notice_runs_out));
        let remaining: Vec<String> = pods_on(&store.list::<Pod>(), &node.name)
            .map(pod_key)
            .filter(|k| keys.contains(k))
            .collect();
        checks.push((
            observed.emptied_at.is_some_and(|t| t <= instance_end),
            format!(
                "every evictable pod was off the node before its instance ended (emptied after {:?}, instance ended after {:?}){}",
                observed.emptied_at.map(|t| t - started),
                instance_end - started,
                listing(&remaining)
            ),
        ));
        checks.push(evicted_once(&keys, &evictions));
        if !critical.is_empty() {
            checks.push(critical_last(&critical, &evictions));
        }
        let violations = self.pdb_violations().saturating_sub(violations_before);
        checks.push((
            violations == 0,
            format!("no eviction broke a PodDisruptionBudget ({violations})"),
        ));
        let completions = self.completions_of(&node.instance_id) - completions_before;
        checks.push((
            completion.as_ref().is_some_and(|c| {
                c.result.as_str() == "CONTINUE" && c.by == CompletedBy::Call
            }) && completions == 1,
            format!(
                "the terminating lifecycle action was completed CONTINUE by the function, exactly once ({completions} completions{})",
                completion
                    .as_ref()
                    .map(|c| format!(", {} by {:?}", c.result.as_str(), c.by))
                    .unwrap_or_default()
            ),
        ));
        checks
    }

    fn answers(&self) -> Vec<crate::sandbox::functions::NoticeAnswer> {
        self.notice_answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The outcome of the first Spot warning about `instance_id` answered after the first
    /// `skip` answers.
    fn warning_answer(&self, instance_id: &str, skip: usize) -> Option<String> {
        self.answers()
            .into_iter()
            .skip(skip)
            .filter(|a| a.detail_type == WARNING && a.instance_ids.iter().any(|i| i == instance_id))
            .find_map(|a| a.outcome_for(instance_id))
    }

    /// Polls `done` every 50 ms until it holds or `timeout` passes.
    async fn wait_until(&self, timeout: Duration, done: impl Fn() -> bool) {
        let deadline = Instant::now() + timeout;
        while !done() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The drain's checkpoint records the Spot notice and its deadline is no later than the
/// instance's announced end: a drain that works to the drain timeout instead would send grace
/// periods and retries past the moment EC2 takes the instance.
fn drain_works_to_the_instance_end(
    checkpoint: Option<&DrainCheckpoint>,
    warning_time: Option<jiff::Timestamp>,
    notice_seconds: f64,
) -> (bool, String) {
    let announced_end = warning_time.and_then(|t| {
        t.checked_add(jiff::SignedDuration::from_secs_f64(notice_seconds))
            .ok()
    });
    let spot_notice = checkpoint
        .and_then(|c| c.notice.as_ref())
        .is_some_and(|n: &InstanceNotice| n.kind == NoticeKind::SpotInterruption);
    let deadline = checkpoint.map(|c| c.deadline);
    (
        spot_notice && matches!((deadline, announced_end), (Some(d), Some(end)) if d <= end),
        format!(
            "the node's drain answers the Spot notice and works to the instance's end (deadline {}, instance ends {}{})",
            deadline.map_or("none".to_owned(), |d| d.to_string()),
            announced_end.map_or("?".to_owned(), |e| e.to_string()),
            if spot_notice {
                ""
            } else {
                "; the checkpoint records no Spot notice"
            }
        ),
    )
}

/// Every evictable pod of the node was evicted once, none twice.
fn evicted_once(keys: &BTreeSet<String>, evictions: &[AuditEvent]) -> (bool, String) {
    let mut counts: BTreeMap<String, usize> = keys.iter().map(|k| (k.clone(), 0)).collect();
    for eviction in evictions {
        let key = format!("{}/{}", eviction.namespace(), eviction.name());
        if let Some(count) = counts.get_mut(&key) {
            *count += 1;
        }
    }
    let wrong: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n != 1)
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect();
    (
        wrong.is_empty(),
        format!(
            "each of the node's {} evictable pods was evicted exactly once{}",
            keys.len(),
            if wrong.is_empty() {
                String::new()
            } else {
                format!(" (not: {})", wrong.join(", "))
            }
        ),
    )
}

/// The critical pods' first eviction came after every other pod's: DNS kept serving the
/// pods shutting down.
fn critical_last(critical: &BTreeSet<String>, evictions: &[AuditEvent]) -> (bool, String) {
    let key = |e: &AuditEvent| format!("{}/{}", e.namespace(), e.name());
    let first_critical = evictions.iter().position(|e| critical.contains(&key(e)));
    let last_other = evictions.iter().rposition(|e| !critical.contains(&key(e)));
    let held = match (first_critical, last_other) {
        (Some(first), Some(last)) => first > last,
        (Some(_), None) => true,
        (None, _) => false,
    };
    (
        held,
        format!(
            "critical pods ({}) were evicted after every other pod",
            critical.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
    )
}
