//! The plan of a [`Snapshot`]: the drain's own [`DrainPlan`] of the node's pods, with the
//! budgets in their way and an estimate of the waves and the time the drain would take.
//!
//! The estimate is a model, not a promise: each wave takes as long as the longest grace
//! period among the pods of its tier (pods usually leave faster), a budget that allows `a`
//! disruptions lets `a` of its pods go per wave (its replacements must be Ready before the
//! next wave: slow-starting replacements make waves longer), pods without a budget go
//! `EVICTION_CONCURRENCY` at a time, and the tiers go one after the other. What it is sure
//! of: a budget allowing no disruption now, a pod that more than one budget selects, or a pod
//! annotated `karpenter.sh/do-not-disrupt: "true"` (never evicted), stops the drain until the
//! deadline unless something else changes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use node_manager::drain::budgets;
use node_manager::drain::plan::{
    DrainPlan, EvictionTier, PlanContext, PlannedPod, PodDisposition, PodKey,
};
use node_manager::drain::session::not_ready_since;
use node_manager::drain::volumes;
use node_manager::lifecycle::node::{is_ready, node_instance_id};
use node_manager::lifecycle::settings::{DrainSettings, DrainTimeoutResult};
use node_manager::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, DrainCheckpoint};
use serde::Serialize;

use crate::load_balancers::RoutingLoadBalancer;
use crate::snapshot::Snapshot;

/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 30;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    pub node: NodeSummary,
    /// The pods the drain would evict, in eviction order: tier by tier, critical last.
    pub evict: Vec<EvictedPod>,
    /// Pods already being deleted: waited for, not evicted again.
    pub terminating: Vec<PodRef>,
    /// Pods annotated `karpenter.sh/do-not-disrupt: "true"`: never evicted, they hold the
    /// drain until its deadline.
    pub held: Vec<PodRef>,
    /// Pods the drain leaves on the node, with the reason.
    pub left: Vec<LeftPod>,
    /// The budgets that select a pod to evict.
    pub budgets: Vec<BudgetSummary>,
    /// The volumes attached to the node; `None` when they cannot be read.
    pub volumes: Option<Vec<AttachedVolume>>,
    /// `VOLUME_DETACH_SECONDS`: how long after the pods are gone the drain waits for the
    /// volumes it waits for.
    pub volume_detach_seconds: u64,
    /// The cluster's load balancers routing to the instance (`--load-balancers-of`); the drain
    /// waits for each to let go, at most `SETTLE_SECONDS` plus its deregistration delay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancers: Option<Vec<RoutingLoadBalancer>>,
    pub estimate: Estimate,
}

/// A volume attached to the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachedVolume {
    /// The persistent volume (or the attachment, for an inline volume).
    pub volume: String,
    /// The node's pods that mount it.
    pub pods: Vec<PodRef>,
    /// The drain waits for it to detach before completing: no pod that stays mounts it.
    pub waited_for: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub name: String,
    pub instance_id: Option<String>,
    pub ready: bool,
    /// A drain is already under way (its checkpoint is on the node): planned as it sees it.
    pub draining_since: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl From<&PodKey> for PodRef {
    fn from(key: &PodKey) -> Self {
        Self {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        }
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Tier {
    Ordinary,
    Critical,
}

impl From<EvictionTier> for Tier {
    fn from(tier: EvictionTier) -> Self {
        match tier {
            EvictionTier::Ordinary => Self::Ordinary,
            EvictionTier::Critical => Self::Critical,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictedPod {
    #[serde(flatten)]
    pub pod: PodRef,
    pub tier: Tier,
    /// The budgets that select it (names, its namespace).
    pub budgets: Vec<String>,
    /// `emptyDir` or `hostPath` volumes: their data goes with the instance.
    pub local_storage: bool,
    /// No controller owns it: nothing recreates it elsewhere.
    pub no_controller: bool,
    pub grace_period_seconds: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LeftReason {
    DaemonSet,
    Mirror,
    /// Bound after the drain's cordon and tolerating it (only while a drain is under way).
    ToleratesCordon,
    /// Being deleted for longer than its grace period plus `STUCK_POD_SECONDS`.
    StuckDeletion,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftPod {
    #[serde(flatten)]
    pub pod: PodRef,
    pub reason: LeftReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSummary {
    pub namespace: String,
    pub name: String,
    /// `status.disruptionsAllowed` (0 when the disruption controller has not set it).
    pub disruptions_allowed: i32,
    /// How many of the node's pods to evict it selects.
    pub pods_to_evict: usize,
    /// It would refuse the drain's evictions now.
    pub blocks_now: bool,
    /// Waves it needs for its pods here at its current allowance; `None` when blocking.
    pub waves: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    /// Eviction waves over all tiers; `None` when a budget blocks.
    pub waves: Option<u64>,
    /// Estimated seconds to drain and settle; `None` when a budget blocks.
    pub seconds: Option<u64>,
    /// Seconds from now to the drain's deadline (`DRAIN_TIMEOUT_SECONDS` from the start, or
    /// what is left of a drain under way).
    pub deadline_seconds: u64,
    pub reaches_deadline: bool,
    /// Pods no eviction can move now: selected by a blocking budget or by more than one, or
    /// held by `karpenter.sh/do-not-disrupt`.
    pub blocked: Vec<PodRef>,
    /// What happens at the deadline (`DRAIN_FORCE`, `DRAIN_TIMEOUT_RESULT`).
    pub at_deadline: String,
}

/// Plans `snapshot` with the drain's settings as of `now`.
pub fn preview(snapshot: &Snapshot, settings: &DrainSettings, now: Timestamp) -> Preview {
    let node = &snapshot.node;
    let checkpoint = drain_under_way(node);
    let context = plan_context(node, &checkpoint, settings, now);
    let plan = DrainPlan::in_context(&snapshot.pods, &context);
    let (evict, terminating) = evicted_and_terminating(snapshot, &plan, settings);
    let budgets = budget_summaries(snapshot, &evict);
    let deadline = checkpoint.as_ref().map_or(settings.drain_timeout, |c| {
        Duration::from_secs(c.deadline.duration_since(now).as_secs().max(0) as u64)
    });
    let held: Vec<PodRef> = plan.held().iter().map(|p| PodRef::from(&p.key)).collect();
    let estimate = estimate(&evict, &held, &budgets, settings, deadline);
    Preview {
        node: NodeSummary {
            name: node.metadata.name.clone().unwrap_or_default(),
            instance_id: node_instance_id(node).map(str::to_owned),
            ready: is_ready(node),
            draining_since: checkpoint.map(|c| c.started_at),
        },
        evict,
        terminating,
        held,
        left: left_pods(&plan),
        budgets,
        volumes: attached_volumes(snapshot, &context),
        volume_detach_seconds: settings.volume_detach.as_secs(),
        load_balancers: snapshot.load_balancers.clone(),
        estimate,
    }
}

/// The node's attached volumes, each with the pods that mount it and whether the drain waits
/// for it (the drain's own rule: not for a volume a pod that stays mounts).
fn attached_volumes(snapshot: &Snapshot, context: &PlanContext) -> Option<Vec<AttachedVolume>> {
    let volumes = snapshot.volumes.as_ref()?;
    let staying: BTreeSet<String> = volumes::staying_claims(&snapshot.pods, context)
        .iter()
        .filter_map(|claim| volumes.claims.get(claim).cloned())
        .collect();
    let waited_for: BTreeSet<String> = volumes::to_detach(&volumes.attachments, Some(&staying))
        .into_iter()
        .collect();
    let mounting = |volume: &str| -> Vec<PodRef> {
        snapshot
            .pods
            .iter()
            .filter(|pod| {
                volumes::pod_claims([*pod])
                    .iter()
                    .any(|claim| volumes.claims.get(claim).map(String::as_str) == Some(volume))
            })
            .map(|pod| PodRef {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
            })
            .collect()
    };
    Some(
        volumes
            .attachments
            .iter()
            .map(|attachment| {
                let volume = attachment
                    .spec
                    .source
                    .persistent_volume_name
                    .clone()
                    .or_else(|| attachment.metadata.name.clone())
                    .unwrap_or_default();
                AttachedVolume {
                    pods: mounting(&volume),
                    waited_for: waited_for.contains(&volume),
                    volume,
                }
            })
            .collect(),
    )
}

/// The node's drain record while that drain is still running.
fn drain_under_way(node: &Node) -> Option<DrainCheckpoint> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CHECKPOINT_ANNOTATION))
        .and_then(|json| DrainCheckpoint::parse(json).ok())
        .filter(|c| c.completed_at.is_none())
}

/// What the drain itself would know when planning: a drain under way keeps its own start
/// and notice.
fn plan_context(
    node: &Node,
    checkpoint: &Option<DrainCheckpoint>,
    settings: &DrainSettings,
    now: Timestamp,
) -> PlanContext {
    let notice = checkpoint.as_ref().and_then(|c| c.notice.as_ref());
    PlanContext {
        now: Some(now),
        cordoned_at: checkpoint.as_ref().map(|c| c.started_at),
        not_ready_since: not_ready_since(node),
        first_listed: None,
        stuck_after: settings.stuck_pod_after,
        instance_ends_at: notice.and_then(|n| n.instance_ends_at),
        // A drain running for an involuntary notice moves do-not-disrupt pods too.
        involuntary: notice.is_some_and(node_manager::drain::plan::is_involuntary),
    }
}

/// The pods to evict, tier by tier, and those already terminating.
fn evicted_and_terminating(
    snapshot: &Snapshot,
    plan: &DrainPlan,
    settings: &DrainSettings,
) -> (Vec<EvictedPod>, Vec<PodRef>) {
    let pods_by_key: BTreeMap<(&str, &str), &Pod> = snapshot
        .pods
        .iter()
        .filter_map(|p| {
            let meta = &p.metadata;
            Some(((meta.namespace.as_deref()?, meta.name.as_deref()?), p))
        })
        .collect();
    let mut evict = Vec::new();
    let mut terminating = Vec::new();
    for (tier, to_evict, leaving) in plan.tiers() {
        for planned in to_evict {
            let key = (planned.key.namespace.as_str(), planned.key.name.as_str());
            let pod = pods_by_key.get(&key).copied();
            let budgets = budgets_selecting(snapshot, &planned.key.namespace, pod);
            evict.push(evicted_pod(planned, tier, pod, budgets, settings));
        }
        terminating.extend(leaving.iter().map(PodRef::from));
    }
    (evict, terminating)
}

/// The names of the budgets in `namespace` that select `pod`.
fn budgets_selecting(snapshot: &Snapshot, namespace: &str, pod: Option<&Pod>) -> Vec<String> {
    let labels = pod
        .and_then(|p| p.metadata.labels.clone())
        .unwrap_or_default();
    let namespace_budgets: Vec<PodDisruptionBudget> = snapshot
        .budgets
        .iter()
        .filter(|b| b.metadata.namespace.as_deref() == Some(namespace))
        .cloned()
        .collect();
    budgets::covering(&namespace_budgets, &labels)
}

/// The pods the drain leaves on the node, and why.
fn left_pods(plan: &DrainPlan) -> Vec<LeftPod> {
    plan.skipped
        .iter()
        .filter_map(|(key, disposition)| {
            let reason = match disposition {
                PodDisposition::SkipDaemonSet => LeftReason::DaemonSet,
                PodDisposition::SkipMirror => LeftReason::Mirror,
                PodDisposition::SkipToleratesCordon => LeftReason::ToleratesCordon,
                PodDisposition::StuckDeletion(_) => LeftReason::StuckDeletion,
                PodDisposition::AwaitDeletion(_)
                | PodDisposition::Evict(_)
                | PodDisposition::HoldDoNotDisrupt => return None,
            };
            Some(LeftPod {
                pod: key.into(),
                reason,
            })
        })
        .collect()
}

fn evicted_pod(
    planned: &PlannedPod,
    tier: EvictionTier,
    pod: Option<&Pod>,
    budgets: Vec<String>,
    settings: &DrainSettings,
) -> EvictedPod {
    let meta = pod.map(|p| &p.metadata);
    let spec = pod.and_then(|p| p.spec.as_ref());
    let local_storage = spec.and_then(|s| s.volumes.as_ref()).is_some_and(|v| {
        v.iter()
            .any(|v| v.empty_dir.is_some() || v.host_path.is_some())
    });
    let no_controller = !meta
        .and_then(|m| m.owner_references.as_ref())
        .is_some_and(|o| o.iter().any(|o| o.controller == Some(true)));
    // What the drain sends (POD_GRACE_PERIOD_SECONDS) wins over the pod's own.
    let grace_period_seconds = settings
        .pod_grace_period
        .map(|d| d.as_secs_f64().ceil() as i64)
        .or(planned.grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS)
        .max(0);
    EvictedPod {
        pod: (&planned.key).into(),
        tier: tier.into(),
        budgets,
        local_storage,
        no_controller,
        grace_period_seconds,
    }
}

fn budget_summaries(snapshot: &Snapshot, evict: &[EvictedPod]) -> Vec<BudgetSummary> {
    let mut summaries = Vec::new();
    for budget in &snapshot.budgets {
        let (Some(namespace), Some(name)) = (&budget.metadata.namespace, &budget.metadata.name)
        else {
            continue;
        };
        let pods_to_evict = evict
            .iter()
            .filter(|p| &p.pod.namespace == namespace && p.budgets.contains(name))
            .count();
        if pods_to_evict == 0 {
            continue;
        }
        let allowed = budget
            .status
            .as_ref()
            .map_or(0, |s| s.disruptions_allowed)
            .max(0);
        let blocks_now = allowed == 0;
        summaries.push(BudgetSummary {
            namespace: namespace.clone(),
            name: name.clone(),
            disruptions_allowed: allowed,
            pods_to_evict,
            blocks_now,
            waves: (!blocks_now).then(|| (pods_to_evict as u64).div_ceil(allowed as u64)),
        });
    }
    summaries.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    summaries
}

fn estimate(
    evict: &[EvictedPod],
    held: &[PodRef],
    budgets: &[BudgetSummary],
    settings: &DrainSettings,
    deadline: Duration,
) -> Estimate {
    let blocked = blocked_pods(evict, held, budgets);
    let at_deadline = at_deadline(settings);
    let deadline_seconds = deadline.as_secs();
    if !blocked.is_empty() {
        return Estimate {
            waves: None,
            seconds: None,
            deadline_seconds,
            reaches_deadline: true,
            blocked,
            at_deadline,
        };
    }
    let mut waves = 0;
    let mut seconds = 0;
    for tier in [Tier::Ordinary, Tier::Critical] {
        let pods: Vec<&EvictedPod> = evict.iter().filter(|p| p.tier == tier).collect();
        let (tier_waves, wave_seconds) = tier_waves(&pods, budgets, settings);
        waves += tier_waves;
        seconds += tier_waves * wave_seconds;
    }
    seconds += settings.settle.as_secs_f64().ceil() as u64;
    Estimate {
        waves: Some(waves),
        seconds: Some(seconds),
        deadline_seconds,
        reaches_deadline: seconds > deadline_seconds,
        blocked,
        at_deadline,
    }
}

fn budget_named<'a>(
    budgets: &'a [BudgetSummary],
    namespace: &str,
    name: &str,
) -> Option<&'a BudgetSummary> {
    budgets
        .iter()
        .find(|b| b.namespace == namespace && b.name == name)
}

/// Pods no eviction can move now: a blocking budget, more than one budget, or held.
fn blocked_pods(evict: &[EvictedPod], held: &[PodRef], budgets: &[BudgetSummary]) -> Vec<PodRef> {
    evict
        .iter()
        .filter(|p| match p.budgets.as_slice() {
            [] => false,
            [one] => budget_named(budgets, &p.pod.namespace, one).is_some_and(|b| b.blocks_now),
            // The eviction API refuses a pod that more than one budget selects.
            _ => true,
        })
        .map(|p| p.pod.clone())
        .chain(held.iter().cloned())
        .collect()
}

/// What happens at the deadline (`DRAIN_FORCE`, `DRAIN_TIMEOUT_RESULT`).
fn at_deadline(settings: &DrainSettings) -> String {
    if settings.force {
        return "the pods still there are deleted (DRAIN_FORCE), bypassing their budgets"
            .to_owned();
    }
    match settings.timeout_result {
        DrainTimeoutResult::Retain => "the lifecycle action completes with ABANDON if the group retains abandoned instances (the instance and node are kept for inspection), else with CONTINUE and the pods still there go with the instance (PodEvictionFailure)".to_owned(),
        DrainTimeoutResult::Abandon => "the lifecycle action completes with ABANDON and the pods still there go with the instance unless its group retains abandoned instances (PodEvictionFailure)".to_owned(),
        DrainTimeoutResult::Continue => "the lifecycle action completes with CONTINUE and the pods still there go with the instance (PodEvictionFailure)".to_owned(),
    }
}

/// One tier's eviction waves and the longest grace period of a wave: the evictions go
/// `EVICTION_CONCURRENCY` at a time, and a budget's pods `disruptionsAllowed` at a time.
fn tier_waves(
    pods: &[&EvictedPod],
    budgets: &[BudgetSummary],
    settings: &DrainSettings,
) -> (u64, u64) {
    if pods.is_empty() {
        return (0, 0);
    }
    let concurrency = settings.eviction_concurrency.max(1) as u64;
    let by_concurrency = (pods.len() as u64).div_ceil(concurrency);
    let mut per_budget: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for pod in pods {
        if let [one] = pod.budgets.as_slice() {
            *per_budget
                .entry((pod.pod.namespace.as_str(), one.as_str()))
                .or_default() += 1;
        }
    }
    let by_budgets = per_budget
        .iter()
        .filter_map(|(&(namespace, name), &count)| {
            let allowed = budget_named(budgets, namespace, name)?
                .disruptions_allowed
                .max(1) as u64;
            Some(count.div_ceil(allowed))
        })
        .max()
        .unwrap_or(0);
    let wave_seconds = pods
        .iter()
        .map(|p| p.grace_period_seconds as u64)
        .max()
        .unwrap_or(0);
    (by_concurrency.max(by_budgets), wave_seconds)
}
