//! The invariants the event soak checks at the end of each seed, against what AWS (the
//! in-memory fakes) says now and what the fake API server holds and recorded:
//!
//! 1. `mark-without-reason`: no node carries a mark of ours whose reason AWS no longer reports;
//! 2. `cordon-without-leaving`: no node is cordoned by us unless its instance is leaving or
//!    about to;
//! 3. `drain-not-running`: every drain whose reason stands (a pending lifecycle action, a
//!    running Spot instance whose request is marked, a maintenance due) is running or done;
//!    a pod left because its budget refused its eviction to the end is the budget honoured
//!    (as in 4: room ran out, the replacements of pods evicted before are Pending);
//! 4. `lifecycle-not-drained`: every lifecycle action gets a full drain, completed once, with
//!    PDBs honoured (evictions only, never a delete); a pod left because its budget refused
//!    its eviction to the end (another pod of it unavailable, say on a dead node) is the
//!    budget honoured, as `kubectl drain` would leave it;
//! 5. `eviction-from-kept-node`: no pod is evicted from a node nobody is replacing;
//! 6. `refresh-mark-on-kept-node`: an instance refresh marks only the nodes it replaces:
//!    never its own replacements, nor nodes already on the configuration it applies (also
//!    checked after every step of the seed, as a late or retried start could mark them while
//!    the refresh runs);
//! 7. `mark-after-warm-pool`: a node back from the warm pool (its launching action out of
//!    the pool completed) is Ready and carries none of our marks: no drain record, no
//!    cordon, label or taint of ours (but an instance refresh's that replaces it, started
//!    after its return); and its launching action completed once, with CONTINUE;
//! 8. `repair-beyond-limits`: node repair marks unhealthy only broken nodes' instances, never
//!    more than EKS's `maxParallelNodesRepairedCount` (1) of a group being replaced at once (checked as
//!    each repair is seen); a broken node's pods are evicted only once it is being replaced.
//! 9. `refresh-marks-without-room`: instance refreshes take nodes out of service only as far
//!    as the nodes no refresh marked can take their pods: whenever a refresh takes out of
//!    service a node that accepted pods (one cordoned already, say by a rebalance
//!    recommendation, takes no room away), the pods on every node refreshes took out of service (any group's)
//!    fit in the room free on the nodes that accept pods and carry no refresh's record,
//!    counted as the step before saw it (checked after every step: two groups refreshing at
//!    once must not count the same room twice, or pods go Pending). Every pod of the soak
//!    requests [`WEB_CPU_MILLIS`], so room is counted in such pods, from each node's
//!    allocatable CPU.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::{GroupActivity, InstanceFacts, InstanceNotices, ScheduledInstanceEvent};
use node_manager::lifecycle::node::is_ready;
use node_manager::node_marks::checkpoint::{DrainCheckpoint, NoticeKind};
use node_manager::node_marks::maintenance::ScheduledEventRef;
use node_manager::node_marks::refresh::refresh_marks_of;
use node_manager::reconcile::NodeMarks;

use crate::kube::audit::AuditEvent;

use super::plan::{Fate, Member};
use super::world::{EventWorld, GROUPS, MAINTENANCE_MARGIN, REBALANCE_UNDO, WEB_CPU_MILLIS};

pub const MARK_WITHOUT_REASON: &str = "mark-without-reason";
pub const CORDON_WITHOUT_LEAVING: &str = "cordon-without-leaving";
pub const DRAIN_NOT_RUNNING: &str = "drain-not-running";
pub const LIFECYCLE_NOT_DRAINED: &str = "lifecycle-not-drained";
pub const EVICTION_FROM_KEPT_NODE: &str = "eviction-from-kept-node";
pub const REFRESH_MARK_ON_KEPT_NODE: &str = "refresh-mark-on-kept-node";
pub const MARK_AFTER_WARM_POOL: &str = "mark-after-warm-pool";
pub const REPAIR_BEYOND_LIMITS: &str = "repair-beyond-limits";
pub const REFRESH_MARKS_WITHOUT_ROOM: &str = "refresh-marks-without-room";
/// EKS's default `maxParallelNodesRepairedCount`.
pub const REPAIR_MAX_PARALLEL: usize = 1;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

fn violation(invariant: &'static str, detail: String) -> Violation {
    Violation { invariant, detail }
}

/// What AWS says now about one instance.
struct Now {
    instance: Option<InstanceFacts>,
    lifecycle: Option<String>,
    spot: Option<String>,
    scheduled: Vec<ScheduledInstanceEvent>,
    pending_action: bool,
}

impl Now {
    fn running(&self) -> bool {
        self.instance.as_ref().and_then(|i| i.state.as_deref()) == Some("running")
    }

    fn spot_marked(&self) -> bool {
        self.spot
            .as_deref()
            .is_some_and(|s| s.starts_with("marked-for-"))
    }

    fn maintenance_pending(&self) -> bool {
        self.scheduled
            .iter()
            .any(ScheduledInstanceEvent::is_pending)
    }

    /// Whether EC2 lists the event a record names as pending (by its id), starting after
    /// `after` when given. EC2's own schedule is the reason, not the code's matching rule.
    fn lists_pending(&self, event: &ScheduledEventRef, after: Option<Timestamp>) -> bool {
        self.scheduled.iter().any(|e| {
            e.id == event.id
                && e.code == event.code
                && e.is_pending()
                && after.is_none_or(|t| e.not_before.is_none_or(|at| at > t))
        })
    }

    fn maintenance_due(&self, now: Timestamp) -> bool {
        self.scheduled.iter().filter(|e| e.is_pending()).any(|e| {
            e.not_before
                .is_some_and(|at| now >= at.checked_sub(MAINTENANCE_MARGIN).unwrap_or(at))
        })
    }

    /// Leaving or about to: terminating, not running, Spot-marked, maintenance pending.
    fn leaving(&self) -> bool {
        self.pending_action
            || self
                .lifecycle
                .as_deref()
                .is_some_and(|s| s.starts_with("Terminating"))
            || !self.running()
            || self.spot_marked()
            || self.maintenance_pending()
    }
}

async fn aws_now(world: &EventWorld, member: &Member) -> Now {
    let notices = &world.instances.notices;
    let id = &member.instance_id;
    let instance = notices.instance_facts(id).await.ok().flatten();
    let spot = match member.spot_request() {
        Some(request) => notices.spot_request_status(&request).await.ok().flatten(),
        None => None,
    };
    let lifecycle = world
        .autoscaling
        .lifecycle_states(std::slice::from_ref(id))
        .await
        .ok()
        .and_then(|mut m| m.remove(id));
    Now {
        instance,
        lifecycle,
        spot,
        scheduled: notices.scheduled_events(id).await.unwrap_or_default(),
        pending_action: world.autoscaling.is_pending(&member.action()),
    }
}

async fn refresh_runs(world: &EventWorld, marks: &NodeMarks) -> Option<bool> {
    let record = marks.refresh.as_ref()?;
    let status = world
        .autoscaling
        .instance_refresh_status(&record.auto_scaling_group_name, &record.instance_refresh_id)
        .await
        .ok()
        .flatten();
    Some(status.as_deref().is_some_and(replaces_outdated_instances))
}

/// Auto Scaling's documented refresh statuses in which it still replaces outdated
/// instances (a rollback replaces the new ones and keeps the outdated: their marks have no
/// reason left).
fn replaces_outdated_instances(status: &str) -> bool {
    matches!(status, "Pending" | "InProgress" | "Cancelling" | "Baking")
}

/// Checks every invariant; `evicted_from` maps each pod the soak saw to its node, and
/// `recorded` holds what was seen wrong while the seed ran (a completion with pods left).
pub async fn check(
    world: &EventWorld,
    evicted_from: &BTreeMap<String, String>,
    recorded: &[Violation],
) -> Vec<Violation> {
    let mut found = recorded.to_vec();
    let now = Timestamp::now();
    let nodes: BTreeMap<String, Node> = world
        .server
        .store()
        .list::<Node>()
        .into_iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, n)))
        .collect();
    for member in &world.fleet {
        let aws = aws_now(world, member).await;
        if let Some(node) = nodes.get(&member.node) {
            let marks = NodeMarks::of(node);
            let refresh = refresh_runs(world, &marks).await;
            found.extend(marks_have_reasons(&marks, &aws, refresh, now));
            found.extend(cordon_is_ours_and_leaving(node, &marks, &aws, refresh, now));
            found.extend(drain_runs_or_done(world, member, &marks, &aws, now));
            if marks.refresh.is_some() && !world.refresh_replaces(member) {
                found.push(violation(
                    REFRESH_MARK_ON_KEPT_NODE,
                    format!(
                        "{}: ({:?}) carries the mark of a refresh that does not replace it",
                        member.node, member.fate
                    ),
                ));
            }
        }
        found.extend(lifecycle_drained(world, member));
        if member.fate.is_warm_pool_return() {
            found.extend(back_from_the_pool(world, member, nodes.get(&member.node)));
        }
    }
    found.extend(evictions_from_replaced_nodes(world, evicted_from));
    found.extend(repairs_within_limits(world));
    found
}

/// Invariant 8 at the end: every instance node repair marked unhealthy is a broken node's,
/// and no more than [`REPAIR_MAX_PARALLEL`] are still being replaced.
fn repairs_within_limits(world: &EventWorld) -> Vec<Violation> {
    let marked = world.health.marked_unhealthy();
    let mut out: Vec<Violation> = marked
        .iter()
        .filter(|id| world.member(id).is_none_or(|m| m.fate != Fate::Unhealthy))
        .map(|id| {
            violation(
                REPAIR_BEYOND_LIMITS,
                format!(
                    "{id} ({:?}) marked unhealthy, its node not broken",
                    world.member(id).map(|m| &m.fate)
                ),
            )
        })
        .collect();
    for (group, name) in GROUPS.iter().enumerate() {
        let in_flight = repairs_in_flight(world, group);
        if in_flight.len() > REPAIR_MAX_PARALLEL {
            out.push(violation(
                REPAIR_BEYOND_LIMITS,
                format!(
                    "{} instances of {name} being replaced at once: {in_flight:?}",
                    in_flight.len()
                ),
            ));
        }
    }
    out
}

/// The instances of `group` node repair marked unhealthy that are still being replaced (EKS
/// limits repairs per node group).
pub fn repairs_in_flight(world: &EventWorld, group: usize) -> Vec<String> {
    world
        .health
        .marked_unhealthy()
        .into_iter()
        .filter(|id| world.member(id).is_some_and(|m| m.group == group))
        .filter(|id| world.autoscaling_state(id).as_deref() != Some("Terminated"))
        .collect()
}

/// Invariant 1 for one node.
fn marks_have_reasons(
    marks: &NodeMarks,
    aws: &Now,
    refresh_runs: Option<bool>,
    now: Timestamp,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let node = &marks.node;
    if refresh_runs == Some(false) {
        out.push(violation(
            MARK_WITHOUT_REASON,
            format!("{node}: an instance refresh's record, the refresh is over"),
        ));
    }
    if let Some(plan) = &marks.maintenance {
        let stands = plan
            .event
            .as_ref()
            .is_some_and(|event| aws.lists_pending(event, Some(now)));
        if !stands {
            out.push(violation(
                MARK_WITHOUT_REASON,
                format!("{node}: a maintenance plan EC2 no longer schedules"),
            ));
        }
    }
    if let Some(checkpoint) = &marks.checkpoint
        && let Some(why) = record_without_reason(checkpoint, marks, aws, refresh_runs, now)
    {
        out.push(violation(MARK_WITHOUT_REASON, format!("{node}: {why}")));
    }
    out
}

/// Why a drain record's reason is gone (`None`: it stands).
fn record_without_reason(
    checkpoint: &DrainCheckpoint,
    marks: &NodeMarks,
    aws: &Now,
    refresh_runs: Option<bool>,
    now: Timestamp,
) -> Option<String> {
    if !checkpoint.action.is_notice() {
        return (!aws.pending_action && aws.running())
            .then(|| "a lifecycle drain's record, its action neither pending nor done".to_owned());
    }
    let notice = checkpoint.notice.as_ref()?;
    let stands = match notice.kind {
        NoticeKind::SpotInterruption => aws.spot_marked() || !aws.running(),
        NoticeKind::InstanceStopping => !aws.running(),
        NoticeKind::ScheduledMaintenance => {
            notice
                .scheduled_event
                .as_ref()
                .is_none_or(|event| aws.lists_pending(event, None))
                || !aws.running()
                || (checkpoint.completed_at.is_some() && !marks.ready)
        }
        // AWS: an interruption may never follow a recommendation. It keeps the node out of
        // service (cordoned or drained) for REBALANCE_UNDO, then only while the instance is
        // leaving, or an instance refresh that replaces it still runs.
        NoticeKind::RebalanceRecommendation => {
            rebalance_holds(notice.received_at, now) || aws.leaving() || refresh_runs == Some(true)
        }
    };
    (!stands).then(|| {
        format!(
            "a {:?} drain record AWS no longer gives a reason for",
            notice.kind
        )
    })
}

/// Invariant 2 for one node.
fn cordon_is_ours_and_leaving(
    node: &Node,
    marks: &NodeMarks,
    aws: &Now,
    refresh_runs: Option<bool>,
    now: Timestamp,
) -> Option<Violation> {
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    if !cordoned {
        return None;
    }
    let name = &marks.node;
    let by_drain = marks
        .checkpoint
        .as_ref()
        .and_then(|c| c.out_of_service.as_ref())
        .is_some_and(|o| o.cordoned);
    let by_refresh = marks
        .refresh
        .as_ref()
        .is_some_and(|r| r.out_of_service.cordoned);
    if !by_drain && !by_refresh {
        return Some(violation(
            CORDON_WITHOUT_LEAVING,
            format!("{name}: cordoned, and no record of ours says so"),
        ));
    }
    let rebalance_holds = marks.checkpoint.as_ref().is_some_and(|c| {
        c.notice.as_ref().is_some_and(|n| {
            n.kind == NoticeKind::RebalanceRecommendation && rebalance_holds(n.received_at, now)
        })
    });
    let maintenance_not_over = marks.checkpoint.as_ref().is_some_and(|c| {
        c.notice
            .as_ref()
            .is_some_and(|n| n.kind == NoticeKind::ScheduledMaintenance)
    }) && !is_ready(node);
    if aws.leaving() || refresh_runs == Some(true) || rebalance_holds || maintenance_not_over {
        return None;
    }
    Some(violation(
        CORDON_WITHOUT_LEAVING,
        format!("{name}: cordoned by us, its instance stays"),
    ))
}

/// Whether a rebalance recommendation received at `received_at` still keeps its node out of
/// service at `now`.
fn rebalance_holds(received_at: Timestamp, now: Timestamp) -> bool {
    now < received_at
        .checked_add(REBALANCE_UNDO)
        .unwrap_or(received_at)
}

/// Pods on `node` a drain must evict: running, not being deleted.
pub fn evictable_on(world: &EventWorld, node: &str) -> Vec<String> {
    world
        .server
        .store()
        .list::<Pod>()
        .into_iter()
        .filter(|p| node_of(p) == Some(node))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect()
}

/// Invariant 3 for one member.
fn drain_runs_or_done(
    world: &EventWorld,
    member: &Member,
    marks: &NodeMarks,
    aws: &Now,
    now: Timestamp,
) -> Option<Violation> {
    // A stopped instance is not asked for: its pods went with it (the drain is for the
    // stopping notice's moment, before the instance is down).
    let stands =
        aws.pending_action || (aws.spot_marked() && aws.running()) || aws.maintenance_due(now);
    if !stands {
        return None;
    }
    let running_or_done = marks.checkpoint.as_ref().is_some_and(|c| {
        c.completed_at.is_some() || (c.lease.holder.is_some() && now < c.lease.expires_at())
    });
    let left = evictable_on(world, &member.node);
    if running_or_done || left.iter().all(|pod| budget_held(world, pod)) {
        return None;
    }
    Some(violation(
        DRAIN_NOT_RUNNING,
        format!(
            "{}: a drain stands ({:?}) and nobody runs it; pods left: {}",
            member.node,
            member.fate,
            left.join(", ")
        ),
    ))
}

/// The eviction requests for `pod` the API server's audit log holds, oldest first.
pub fn evictions_of(world: &EventWorld, pod: &str) -> Vec<AuditEvent> {
    world.server.audit().filter(|e| {
        e.object_ref
            .as_ref()
            .is_some_and(|o| o.subresource == "eviction" && o.name == pod)
    })
}

/// Whether the last eviction of `pod` was refused by its PodDisruptionBudget (a 429 the API
/// server decided, not an injected brownout).
pub fn budget_held(world: &EventWorld, pod: &str) -> bool {
    evictions_of(world, pod).last().is_some_and(|last| {
        last.response_status.code == 429
            && last.injected_fault.is_none()
            && last.response_status.message.contains("disruption budget")
    })
}

/// Invariant 4 for one member: its action, if it has one, completed once with CONTINUE.
fn lifecycle_drained(world: &EventWorld, member: &Member) -> Vec<Violation> {
    let mut out = Vec::new();
    let action = member.action();
    let completions: Vec<_> = world
        .autoscaling
        .completions()
        .into_iter()
        .filter(|c| c.action.instance_id == action.instance_id)
        .filter(|c| c.action.lifecycle_hook_name == action.lifecycle_hook_name)
        .collect();
    let repaired = world
        .health
        .marked_unhealthy()
        .contains(&member.instance_id);
    let expected = usize::from(member.fate.has_lifecycle_action() || repaired);
    if completions.len() != expected || world.autoscaling.is_pending(&action) {
        out.push(violation(
            LIFECYCLE_NOT_DRAINED,
            format!(
                "{}: {} completions of its lifecycle action, {expected} expected (pending: {})",
                member.instance_id,
                completions.len(),
                world.autoscaling.is_pending(&action)
            ),
        ));
    }
    out
}

/// Invariant 7 for one member back from the warm pool.
fn back_from_the_pool(world: &EventWorld, member: &Member, node: Option<&Node>) -> Vec<Violation> {
    let action = member.launch_action();
    let launches: Vec<_> = world
        .autoscaling
        .completions()
        .into_iter()
        .filter(|c| c.action == action)
        .collect();
    let launched = launches
        .iter()
        .all(|c| c.result == node_manager::aws::LifecycleActionResult::Continue);
    // A lost launch is ended by the hook's timeout, not by a completion.
    let expected = if member.fate == (Fate::WarmPoolReturn { launch_lost: true }) {
        0
    } else {
        1
    };
    if launches.len() != expected || !launched || world.autoscaling.is_pending(&action) {
        return vec![violation(
            MARK_AFTER_WARM_POOL,
            format!(
                "{}: {} completions of its launch out of the warm pool, {expected} with CONTINUE expected: {launches:?}",
                member.instance_id,
                launches.len()
            ),
        )];
    }
    let Some(node) = node else {
        return vec![violation(
            MARK_AFTER_WARM_POOL,
            format!("{}: back from the warm pool, no node", member.node),
        )];
    };
    let marks = NodeMarks::of(node);
    // A refresh that started after its return replaces it too (without `SkipMatching`): that
    // record's reasons are invariants 1 and 6's.
    let refresh_only = marks.refresh.is_some()
        && marks.checkpoint.is_none()
        && marks.maintenance.is_none()
        && world.refresh_replaces(member);
    if refresh_only && is_ready(node) {
        return vec![];
    }
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(node_manager::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL))
        .is_some_and(|v| v == "true");
    let ours_tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|t| t.key.starts_with("open-node-manager.io/"))
        });
    if is_ready(node) && !marks.any() && !marks.labelled && !cordoned && !excluded && !ours_tainted
    {
        return vec![];
    }
    vec![violation(
        MARK_AFTER_WARM_POOL,
        format!(
            "{}: back from the warm pool, Ready {}, cordoned {cordoned}, excluded from load balancers {excluded}, our taint {ours_tainted}, marks {marks:?}",
            member.node,
            is_ready(node)
        ),
    )]
}

/// Invariant 4's PDB half and invariant 5, from the audit log.
fn evictions_from_replaced_nodes(
    world: &EventWorld,
    evicted_from: &BTreeMap<String, String>,
) -> Vec<Violation> {
    let audit = world.server.audit();
    let mut out: Vec<Violation> = audit
        .requests("delete", "pods")
        .iter()
        .filter(|e| e.user.username == "terminating-hook")
        .map(|e| {
            violation(
                LIFECYCLE_NOT_DRAINED,
                format!("pod {} deleted past its PDB", e.name()),
            )
        })
        .collect();
    for eviction in audit.subresource_requests("pods", "eviction") {
        if eviction.user.username != "terminating-hook" || !(200..300).contains(&eviction.code()) {
            continue;
        }
        let pod = eviction.name();
        let node = evicted_from.get(pod).map(String::as_str).unwrap_or("?");
        let fate = world.fleet.iter().find(|m| m.node == node).map(|m| &m.fate);
        let member = world.fleet.iter().find(|m| m.node == node);
        let repaired = member.is_some_and(|m| {
            m.fate == Fate::Unhealthy && world.health.marked_unhealthy().contains(&m.instance_id)
        });
        let rebalance_drain =
            world.rebalance_drains && fate.is_some_and(Fate::gets_rebalance_recommendation);
        if !repaired && !rebalance_drain && !fate.is_some_and(Fate::may_be_drained) {
            out.push(violation(
                EVICTION_FROM_KEPT_NODE,
                format!("pod {pod} evicted from {node} ({fate:?}), which nobody replaces"),
            ));
        }
    }
    out
}

/// What invariant 9 reads of the cluster at one moment. The oracle judges the room rule, so
/// it counts room its own way (from the soak's one pod size), not with the rule's code.
#[derive(Debug, Clone, Default)]
pub struct RoomView {
    /// The nodes an instance refresh took out of service (cordoned, not only marked
    /// outdated), whichever group's.
    pub taken: BTreeSet<String>,
    /// The nodes that accept new pods (Ready, not cordoned, no `NoSchedule` or `NoExecute`
    /// taint), marked by a refresh or not.
    pub accepting: BTreeSet<String>,
    /// The room on each node that accepts new pods and carries no refresh's record: how many
    /// more of the workload's pods its allocatable CPU takes.
    pub room: BTreeMap<String, u64>,
    /// The pods (not being deleted) on the nodes refreshes took out of service.
    pub moving: u64,
}

impl RoomView {
    pub fn of(nodes: &[Node], pods: &[Pod]) -> Self {
        let name = |n: &Node| n.metadata.name.clone();
        let taken: BTreeSet<String> = nodes
            .iter()
            .filter(|n| refresh_marks_of(n).is_some_and(|m| !m.outdated_only))
            .filter_map(name)
            .collect();
        let accepting: BTreeSet<String> = nodes
            .iter()
            .filter(|n| accepts_pods(n))
            .filter_map(name)
            .collect();
        let bound = |node: &str| pods.iter().filter(|p| node_of(p) == Some(node)).count();
        let room = nodes
            .iter()
            .filter(|n| accepts_pods(n) && refresh_marks_of(n).is_none())
            .filter_map(|n| {
                let node = name(n)?;
                let slots = allocatable_cpu_millis(n) / WEB_CPU_MILLIS;
                let free = slots.saturating_sub(bound(&node) as u64);
                Some((node, free))
            })
            .collect();
        let moving = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| node_of(p).is_some_and(|n| taken.contains(n)))
            .count() as u64;
        Self {
            taken,
            accepting,
            room,
            moving,
        }
    }

    /// The nodes refreshes took out of service since `before` that accepted pods then (one
    /// cordoned already, say by a rebalance cordon, takes no room away).
    pub fn newly_taken(&self, before: &Self) -> BTreeSet<String> {
        self.taken
            .difference(&before.taken)
            .filter(|node| before.accepting.contains(*node))
            .cloned()
            .collect()
    }
}

/// Invariant 9 after a step in which refreshes took `newly_taken` out of service (`before`
/// and `now` the cluster around the step): the pods on every node they took out of service
/// fit in the room of the nodes that are still room now, each counted as it was before the
/// step (the refresh decided on what it saw) or is now, whichever is more.
pub fn refresh_marks_have_room(
    before: &RoomView,
    now: &RoomView,
    newly_taken: &BTreeSet<String>,
) -> Option<Violation> {
    let room: u64 = now
        .room
        .iter()
        .map(|(node, free)| (*free).max(before.room.get(node).copied().unwrap_or(0)))
        .sum();
    (now.moving > room).then(|| {
        violation(
            REFRESH_MARKS_WITHOUT_ROOM,
            format!(
                "taking {newly_taken:?} out of service: {} pods on the nodes refreshes took out of service ({:?}), room for {room} on the nodes no refresh marked ({:?})",
                now.moving, now.taken, now.room
            ),
        )
    })
}

pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

fn accepts_pods(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable) == Some(true);
    let repelled = spec.and_then(|s| s.taints.as_ref()).is_some_and(|taints| {
        taints
            .iter()
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    });
    is_ready(node) && !cordoned && !repelled
}

/// The node's allocatable CPU in millicores (`3920m` or whole cores); none when unreported.
fn allocatable_cpu_millis(node: &Node) -> u64 {
    let cpu = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get("cpu"))
        .map(|q| q.0.as_str());
    match cpu {
        Some(millis) if millis.ends_with('m') => millis[..millis.len() - 1].parse().unwrap_or(0),
        Some(cores) => cores.parse::<u64>().map_or(0, |c| c * 1000),
        None => 0,
    }
}
