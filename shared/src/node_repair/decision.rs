//! The decision, as a pure function of what one run saw: for every node of one Auto Scaling
//! group, whether it is healthy, broken but not for long enough, being repaired already, due
//! for a repair, or held back by a safety limit. No I/O, no clock: `now` is an argument, so
//! every rule is table-tested.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use super::memory::RepairRecord;
use super::policy::{Limit, PERCENTAGE_THRESHOLD_MIN_GROUP, RepairAction, RepairPolicy};

/// A node whose problem returns within this time after a reboot is replaced, not rebooted
/// again (the reboot did not fix it).
pub(crate) const REBOOT_ESCALATION_WINDOW: Duration = Duration::from_secs(3600);

/// After `SetInstanceHealth`, Auto Scaling may take a moment to show the instance as
/// unhealthy or terminating; for this long the node's own record counts as the repair in
/// flight, so the next run does not ask again.
pub(crate) const REPLACE_PENDING: Duration = Duration::from_secs(600);

/// A Node condition as the run saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedCondition {
    pub type_: String,
    pub status: String,
    pub reason: Option<String>,
    pub last_transition: Option<Timestamp>,
}

/// One node of the group and its instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeObservation {
    pub node: String,
    pub instance_id: String,
    pub created_at: Option<Timestamp>,
    /// The instance's most recent launch (EC2 `LaunchTime`, which a start from a stopped warm
    /// pool moves forward), when known; `None`: the Node's own times are used.
    pub launched_at: Option<Timestamp>,
    pub conditions: Vec<ObservedCondition>,
    /// The instance's lifecycle state in the group (`InService`, `Terminating:Wait`, ...).
    pub lifecycle_state: String,
    /// `HEALTHY` / `UNHEALTHY`.
    pub health_status: String,
    /// Our drain's checkpoint is on the node: it is cordoned on purpose.
    pub draining: bool,
    pub last_repair: Option<RepairRecord>,
}

/// One group as the run saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupObservation {
    pub name: String,
    pub health_check_grace_period: Duration,
    pub nodes: Vec<NodeObservation>,
}

/// A broken condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    pub condition: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Broken since (the condition's `lastTransitionTime`).
    pub since: Timestamp,
}

impl Problem {
    /// `Ready=False (KubeletNotReady)`.
    pub fn describe(&self) -> String {
        match &self.reason {
            Some(reason) => format!("{}={} ({reason})", self.condition, self.status),
            None => format!("{}={}", self.condition, self.status),
        }
    }
}

/// What the run does about one node, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome")]
pub enum Verdict {
    /// No watched condition is unhealthy.
    Healthy,
    /// The instance is not in service (`Pending:*`, `Warmed:*`, `Standby`, ...): its Node says
    /// nothing about its health (a stopped warm-pool instance's Node is NotReady for hours).
    /// Neither judged nor counted in the group's threshold.
    OutOfService { lifecycle_state: String },
    /// Our drain's checkpoint is on the node while its instance is in service: cordoned on
    /// purpose, not repaired. Counts as unhealthy when a watched condition is (`problem`).
    Draining {
        #[serde(skip_serializing_if = "Option::is_none")]
        problem: Option<Problem>,
    },
    /// A repair is under way until the instance has left its group: it is terminating (our
    /// drain may be working on it) or unhealthy in its group, or our replacement request is
    /// recent. Counts against the parallel limit; as unhealthy when a watched condition is
    /// (`problem`; a healthy node leaving on a scale-in is not unhealthy).
    RepairInFlight {
        detail: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        problem: Option<Problem>,
    },
    /// Unhealthy in a way that is reported only (`DiskPressure`, an override's `NoAction`).
    NoAction { problem: Problem },
    /// Unhealthy, not yet for long enough (or a reboot is taking effect).
    Waiting {
        problem: Problem,
        action: RepairAction,
        repair_at: Timestamp,
    },
    /// Due for replacement, but the instance is younger than the group's health-check grace
    /// period.
    WithinGracePeriod { problem: Problem, until: Timestamp },
    /// Repair now.
    Repair {
        problem: Problem,
        action: RepairAction,
        attempt: u32,
    },
    /// Due, but too many of the group's nodes are unhealthy: repairs are paused.
    Paused {
        problem: Problem,
        action: RepairAction,
        limit: String,
    },
    /// Due, but the group has as many repairs under way as allowed: next run.
    Queued {
        problem: Problem,
        action: RepairAction,
        limit: String,
    },
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Healthy => "Healthy",
            Self::OutOfService { .. } => "OutOfService",
            Self::Draining { .. } => "Draining",
            Self::RepairInFlight { .. } => "RepairInFlight",
            Self::NoAction { .. } => "NoAction",
            Self::Waiting { .. } => "Waiting",
            Self::WithinGracePeriod { .. } => "WithinGracePeriod",
            Self::Repair { .. } => "Repair",
            Self::Paused { .. } => "Paused",
            Self::Queued { .. } => "Queued",
        }
    }

    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Self::NoAction { problem }
            | Self::Waiting { problem, .. }
            | Self::WithinGracePeriod { problem, .. }
            | Self::Repair { problem, .. }
            | Self::Paused { problem, .. }
            | Self::Queued { problem, .. } => Some(problem),
            Self::Draining { problem } | Self::RepairInFlight { problem, .. } => problem.as_ref(),
            Self::Healthy | Self::OutOfService { .. } => None,
        }
    }

    /// Whether the node counts as unhealthy for the group's threshold.
    fn is_unhealthy(&self) -> bool {
        matches!(
            self,
            Self::Draining { problem: Some(_) }
                | Self::RepairInFlight {
                    problem: Some(_),
                    ..
                }
                | Self::Waiting { .. }
                | Self::WithinGracePeriod { .. }
                | Self::Repair { .. }
                | Self::Paused { .. }
                | Self::Queued { .. }
        )
    }
}

/// The decision for one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupDecision {
    pub group: String,
    pub nodes: usize,
    /// Nodes whose instance is not in service: not judged, not in the threshold's total.
    pub out_of_service: usize,
    pub unhealthy: usize,
    /// Repairs under way before this run (they count against the parallel limit).
    pub in_flight: usize,
    /// The safety limit that paused the group's repairs, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,
    /// Node name and verdict, in the order of the observation.
    pub verdicts: Vec<(String, Verdict)>,
}

/// How one node stands before the group's limits are applied.
enum Assessment {
    Final(Verdict),
    /// Due: repair unless a limit holds it back; ordered by `due`.
    Due {
        problem: Problem,
        action: RepairAction,
        attempt: u32,
        due: Timestamp,
    },
}

fn is_unhealthy_status(condition: &str, status: &str) -> bool {
    // `*Ready` conditions are healthy when True; pressure conditions when False.
    if condition.ends_with("Ready") {
        status != "True"
    } else {
        status == "True"
    }
}

fn plus(at: Timestamp, duration: Duration) -> Timestamp {
    at.checked_add(duration).unwrap_or(Timestamp::MAX)
}

/// How `node` stands at `now`, and whether a repair of it is under way (it counts against
/// the parallel limit).
fn assess(
    policy: &RepairPolicy,
    group: &GroupObservation,
    node: &NodeObservation,
    now: Timestamp,
) -> (Assessment, bool) {
    if !judged_by_its_node(&node.lifecycle_state) {
        let lifecycle_state = node.lifecycle_state.clone();
        return (
            Assessment::Final(Verdict::OutOfService { lifecycle_state }),
            false,
        );
    }
    let (planned, reported) = plan_repair(policy, node, now);
    // Being replaced (or drained on its way out) is a repair in flight whatever the node's
    // conditions say, until the instance has left the group: else the next run would start
    // another repair while this one still takes capacity away.
    if let Some(detail) = repair_under_way(node, now) {
        let problem = planned.map(|p| p.problem);
        return (
            Assessment::Final(Verdict::RepairInFlight { detail, problem }),
            true,
        );
    }
    if node.draining {
        let problem = planned.map(|p| p.problem);
        return (Assessment::Final(Verdict::Draining { problem }), false);
    }
    let Some(PlannedRepair {
        problem,
        action,
        due,
        after_repair,
    }) = planned
    else {
        return match reported {
            Some(problem) => (Assessment::Final(Verdict::NoAction { problem }), false),
            None => (Assessment::Final(Verdict::Healthy), false),
        };
    };
    if now < due {
        // A reboot taking effect is a repair under way.
        let waiting = Verdict::Waiting {
            problem,
            action,
            repair_at: due,
        };
        return (Assessment::Final(waiting), after_repair);
    }
    if action == RepairAction::Replace
        && let Some(started) = node.created_at.max(node.launched_at)
    {
        // From the later of the Node's creation and the instance's last launch: a node back
        // from a stopped warm pool was created long ago but started just now.
        let until = plus(started, group.health_check_grace_period);
        if now < until {
            return (
                Assessment::Final(Verdict::WithinGracePeriod { problem, until }),
                false,
            );
        }
    }
    let attempt = node.last_repair.as_ref().map_or(1, |r| r.attempt + 1);
    (
        Assessment::Due {
            problem,
            action,
            attempt,
            due,
        },
        false,
    )
}

/// Whether an instance in `lifecycle_state` is judged by its Node: in service, or leaving
/// the group (`Terminating*`, judged as a repair in flight). `Pending:*` (not yet in
/// service), `Warmed:*` (in the warm pool, stopped or not), `Standby`, `EnteringStandby`,
/// `Detaching` and the like are not.
/// Whether the decision about `node` may depend on its instance's last launch: it is judged
/// by its Node and some condition is bad. Only those are looked up (usually none).
pub(crate) fn needs_launch_time(node: &NodeObservation) -> bool {
    node.lifecycle_state == "InService"
        && node
            .conditions
            .iter()
            .any(|c| is_unhealthy_status(&c.type_, &c.status))
}

pub(crate) fn judged_by_its_node(lifecycle_state: &str) -> bool {
    lifecycle_state == "InService" || leaving_the_group(lifecycle_state)
}

fn leaving_the_group(lifecycle_state: &str) -> bool {
    lifecycle_state.starts_with("Terminating") || lifecycle_state == "Terminated"
}

/// What says a repair of `node` is under way already: its instance leaving the group or
/// marked unhealthy in it (our drain's checkpoint on the node changes nothing: it is the
/// repair taking effect), or a replacement we requested recently.
fn repair_under_way(node: &NodeObservation, now: Timestamp) -> Option<String> {
    let leaving = leaving_the_group(&node.lifecycle_state);
    let marked = node.health_status.eq_ignore_ascii_case("unhealthy");
    if leaving || marked {
        let drain = if node.draining {
            "; our drain is working on its node"
        } else {
            ""
        };
        return Some(format!(
            "instance {} is {} and {} in its group{drain}",
            node.instance_id, node.lifecycle_state, node.health_status
        ));
    }
    if let Some(last) = &node.last_repair
        && last.action == RepairAction::Replace
        && now < plus(last.at, REPLACE_PENDING)
    {
        return Some(format!("replacement requested at {}", last.at));
    }
    None
}

/// The repair a node's unhealthy condition calls for.
struct PlannedRepair {
    problem: Problem,
    action: RepairAction,
    due: Timestamp,
    /// The wait runs from our last repair rather than from the problem's start.
    after_repair: bool,
}

/// The repair due first among `node`'s unhealthy conditions, and the first problem the
/// policy only reports (`NoAction`).
fn plan_repair(
    policy: &RepairPolicy,
    node: &NodeObservation,
    now: Timestamp,
) -> (Option<PlannedRepair>, Option<Problem>) {
    let mut reported = None;
    let mut best: Option<PlannedRepair> = None;
    for condition in &node.conditions {
        if !is_unhealthy_status(&condition.type_, &condition.status) {
            continue;
        }
        let Some(rule) = policy.rule_for(&condition.type_, condition.reason.as_deref()) else {
            continue;
        };
        // Not before the instance's last launch: what a Node said while its instance was
        // stopped in a warm pool says nothing about the instance now.
        let since = condition
            .last_transition
            .unwrap_or(now)
            .max(node.launched_at.unwrap_or(Timestamp::MIN));
        let problem = Problem {
            condition: condition.type_.clone(),
            status: condition.status.clone(),
            reason: condition.reason.clone(),
            since,
        };
        if rule.action == RepairAction::NoAction {
            reported.get_or_insert(problem);
            continue;
        }
        // A repair restarts the clock: a reboot gets the full wait to take effect.
        let (start, after_repair) = match &node.last_repair {
            Some(last) if last.at > problem.since => (last.at, true),
            _ => (problem.since, false),
        };
        let due = plus(start, rule.wait);
        let mut action = rule.action;
        if action == RepairAction::Reboot
            && let Some(last) = &node.last_repair
            && last.action == RepairAction::Reboot
            && problem.since < plus(last.at, REBOOT_ESCALATION_WINDOW)
        {
            // Rebooted already and still (or again) broken: replace.
            action = RepairAction::Replace;
        }
        if best.as_ref().is_none_or(|b| due < b.due) {
            best = Some(PlannedRepair {
                problem,
                action,
                due,
                after_repair,
            });
        }
    }
    (best, reported)
}

fn describe_limit(limit: Limit, kind: &str) -> String {
    match limit {
        Limit::Count(n) => format!("{kind}Count={n}"),
        Limit::Percentage(p) => format!("{kind}Percentage={p}"),
    }
}

/// Decides every node of `group` at `now`.
pub(crate) fn decide_group(
    policy: &RepairPolicy,
    group: &GroupObservation,
    now: Timestamp,
) -> GroupDecision {
    let assessed: Vec<(Assessment, bool)> = group
        .nodes
        .iter()
        .map(|node| assess(policy, group, node, now))
        .collect();
    let total = group.nodes.len();
    let out_of_service = assessed
        .iter()
        .filter(|(a, _)| matches!(a, Assessment::Final(Verdict::OutOfService { .. })))
        .count();
    // The threshold is of the nodes in service (leaving ones included): a warm pool's
    // stopped instances neither count as unhealthy nor dilute the percentage.
    let judged = total - out_of_service;
    let unhealthy = assessed
        .iter()
        .filter(|(a, _)| match a {
            Assessment::Final(v) => v.is_unhealthy(),
            Assessment::Due { .. } => true,
        })
        .count();
    let in_flight = assessed.iter().filter(|(_, in_flight)| *in_flight).count();

    let paused_by = pausing_limit(policy, unhealthy, judged);
    let allowed = policy.max_parallel.of(unhealthy).max(1);
    let slots = allowed.saturating_sub(in_flight);
    let parallel_limit = format!(
        "{} ({in_flight} repairs under way, {allowed} allowed)",
        describe_limit(policy.max_parallel, "maxParallelNodesRepaired")
    );
    let chosen = match paused_by {
        Some(_) => vec![false; total],
        None => longest_due_first(&assessed, slots),
    };

    let verdicts = assessed
        .into_iter()
        .zip(chosen)
        .zip(&group.nodes)
        .map(|(((assessment, _), chosen), node)| {
            let verdict = limited(assessment, paused_by.as_deref(), chosen, &parallel_limit);
            (node.node.clone(), verdict)
        })
        .collect();
    GroupDecision {
        group: group.name.clone(),
        nodes: total,
        out_of_service,
        unhealthy,
        in_flight,
        paused_by,
        verdicts,
    }
}

/// A node's verdict once the group's limits are applied: a due repair is paused with its
/// group, started when `chosen`, else queued behind the parallel limit.
fn limited(
    assessment: Assessment,
    paused_by: Option<&str>,
    chosen: bool,
    parallel_limit: &str,
) -> Verdict {
    match assessment {
        Assessment::Final(verdict) => verdict,
        Assessment::Due {
            problem,
            action,
            attempt,
            ..
        } => match paused_by {
            Some(limit) => Verdict::Paused {
                problem,
                action,
                limit: limit.to_owned(),
            },
            None if chosen => Verdict::Repair {
                problem,
                action,
                attempt,
            },
            None => Verdict::Queued {
                problem,
                action,
                limit: parallel_limit.to_owned(),
            },
        },
    }
}

/// The unhealthy-node threshold, in words, when `unhealthy` of `total` nodes exceed it.
fn pausing_limit(policy: &RepairPolicy, unhealthy: usize, total: usize) -> Option<String> {
    let over_threshold = match policy.max_unhealthy {
        Limit::Count(n) => unhealthy > n as usize,
        Limit::Percentage(p) => {
            total > PERCENTAGE_THRESHOLD_MIN_GROUP && unhealthy * 100 > p as usize * total
        }
    };
    over_threshold.then(|| {
        format!(
            "{} ({unhealthy} of {total} nodes unhealthy)",
            describe_limit(policy.max_unhealthy, "maxUnhealthyNodeThreshold")
        )
    })
}

/// Which due nodes get one of the `slots` repairs: the longest-due first.
fn longest_due_first(assessed: &[(Assessment, bool)], mut slots: usize) -> Vec<bool> {
    let mut due_order: Vec<(usize, Timestamp)> = assessed
        .iter()
        .enumerate()
        .filter_map(|(i, (a, _))| match a {
            Assessment::Due { due, .. } => Some((i, *due)),
            Assessment::Final(_) => None,
        })
        .collect();
    due_order.sort_by_key(|(i, due)| (*due, *i));
    let mut chosen = vec![false; assessed.len()];
    for (i, _) in due_order {
        if slots > 0 {
            chosen[i] = true;
            slots -= 1;
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn at(minutes: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + minutes * 60).unwrap()
    }

    const NOW: i64 = 1000;

    fn condition(type_: &str, status: &str, reason: Option<&str>, since: i64) -> ObservedCondition {
        ObservedCondition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.map(Into::into),
            last_transition: Some(at(since)),
        }
    }

    fn healthy(name: &str) -> NodeObservation {
        NodeObservation {
            node: name.into(),
            instance_id: format!("i-{name}"),
            created_at: Some(at(0)),
            launched_at: None,
            conditions: vec![
                condition("Ready", "True", Some("KubeletReady"), 0),
                condition("DiskPressure", "False", None, 0),
            ],
            lifecycle_state: "InService".into(),
            health_status: "HEALTHY".into(),
            draining: false,
            last_repair: None,
        }
    }

    fn broken(
        name: &str,
        type_: &str,
        status: &str,
        reason: Option<&str>,
        minutes_ago: i64,
    ) -> NodeObservation {
        let mut node = healthy(name);
        node.conditions
            .push(condition(type_, status, reason, NOW - minutes_ago));
        node.conditions
            .retain(|c| !(c.type_ == type_ && c.status != status));
        node
    }

    fn group(nodes: Vec<NodeObservation>) -> GroupObservation {
        GroupObservation {
            name: "g".into(),
            health_check_grace_period: Duration::from_secs(300),
            nodes,
        }
    }

    fn verdict_of(policy: &RepairPolicy, node: NodeObservation) -> Verdict {
        decide_group(policy, &group(vec![node]), at(NOW)).verdicts[0]
            .1
            .clone()
    }

    #[test]
    fn eks_defaults_table() {
        let policy = RepairPolicy::default();
        // (node, expected verdict name, expected action)
        let table: Vec<(NodeObservation, &str, Option<RepairAction>)> = vec![
            (healthy("a"), "Healthy", None),
            (
                broken("a", "Ready", "False", Some("KubeletNotReady"), 29),
                "Waiting",
                Some(RepairAction::Replace),
            ),
            (
                broken("a", "Ready", "False", Some("KubeletNotReady"), 30),
                "Repair",
                Some(RepairAction::Replace),
            ),
            (
                broken("a", "Ready", "Unknown", Some("NodeStatusUnknown"), 45),
                "Repair",
                Some(RepairAction::Replace),
            ),
            (
                broken("a", "KernelReady", "False", Some("KernelBug"), 31),
                "Repair",
                Some(RepairAction::Replace),
            ),
            (
                broken("a", "NetworkingReady", "False", Some("IPAMDNotRunning"), 31),
                "Repair",
                Some(RepairAction::Replace),
            ),
            (
                broken("a", "StorageReady", "False", None, 31),
                "Repair",
                Some(RepairAction::Replace),
            ),
            (
                broken("a", "ContainerRuntimeReady", "False", None, 20),
                "Waiting",
                Some(RepairAction::Replace),
            ),
            (
                broken(
                    "a",
                    "AcceleratedHardwareReady",
                    "False",
                    Some("NvidiaXID31Error"),
                    9,
                ),
                "Waiting",
                Some(RepairAction::Reboot),
            ),
            (
                broken(
                    "a",
                    "AcceleratedHardwareReady",
                    "False",
                    Some("NvidiaXID31Error"),
                    10,
                ),
                "Repair",
                Some(RepairAction::Reboot),
            ),
            (
                broken("a", "DiskPressure", "True", None, 600),
                "NoAction",
                None,
            ),
            (
                broken("a", "MemoryPressure", "True", None, 600),
                "NoAction",
                None,
            ),
            // Conditions nobody watches are ignored.
            (
                broken("a", "PIDPressure", "True", None, 600),
                "Healthy",
                None,
            ),
        ];
        for (node, name, action) in table {
            let label = format!("{:?}", node.conditions.last());
            let verdict = verdict_of(&policy, node);
            assert_eq!(verdict.name(), name, "{label}: {verdict:?}");
            let got = match &verdict {
                Verdict::Waiting { action, .. } | Verdict::Repair { action, .. } => Some(*action),
                _ => None,
            };
            assert_eq!(got, action, "{label}");
        }
    }

    #[test]
    fn in_flight_draining_and_grace_period() {
        let policy = RepairPolicy::default();
        let mut node = broken("a", "Ready", "False", None, 60);
        node.draining = true;
        let verdict = verdict_of(&policy, node);
        assert!(
            matches!(&verdict, Verdict::Draining { problem: Some(_) }),
            "{verdict:?}"
        );
        assert!(verdict.is_unhealthy());
        for (state, health) in [("Terminating:Wait", "HEALTHY"), ("InService", "UNHEALTHY")] {
            let mut node = broken("a", "Ready", "False", None, 60);
            node.lifecycle_state = state.into();
            node.health_status = health.into();
            assert_eq!(verdict_of(&policy, node).name(), "RepairInFlight");
        }
        let mut young = broken("a", "Ready", "False", None, 31);
        young.created_at = Some(at(NOW - 2));
        assert_eq!(verdict_of(&policy, young).name(), "WithinGracePeriod");
        // A replacement asked for 5 minutes ago that Auto Scaling does not show yet.
        let mut asked = broken("a", "Ready", "False", None, 60);
        asked.last_repair = Some(RepairRecord {
            action: RepairAction::Replace,
            at: at(NOW - 5),
            attempt: 1,
            condition: "Ready".into(),
            reason: None,
        });
        assert_eq!(verdict_of(&policy, asked).name(), "RepairInFlight");
    }

    fn replaced(minutes_ago: i64) -> RepairRecord {
        RepairRecord {
            action: RepairAction::Replace,
            at: at(NOW - minutes_ago),
            attempt: 1,
            condition: "Ready".into(),
            reason: None,
        }
    }

    fn outcomes(decision: &GroupDecision) -> Vec<String> {
        decision
            .verdicts
            .iter()
            .map(|(n, v)| format!("{n}:{}", v.name()))
            .collect()
    }

    #[test]
    fn a_node_drained_for_its_replacement_is_in_flight_until_its_instance_leaves() {
        let policy = RepairPolicy::default();
        let mut nodes: Vec<_> = (0..10).map(|i| healthy(&format!("n{i}"))).collect();
        // n0 was replaced; its instance is still in the group while our drain works on its
        // node (checkpoint on it), long after the replacement request.
        for minutes_ago in [1, 15, 120] {
            let mut n0 = broken("n0", "Ready", "Unknown", None, 200);
            n0.draining = true;
            n0.lifecycle_state = "Terminating:Wait".into();
            n0.health_status = "UNHEALTHY".into();
            n0.last_repair = Some(replaced(minutes_ago));
            nodes[0] = n0;
            nodes[1] = broken("n1", "Ready", "False", None, 40);
            let decision = decide_group(&policy, &group(nodes.clone()), at(NOW));
            assert_eq!(
                outcomes(&decision)[..2],
                ["n0:RepairInFlight", "n1:Queued"],
                "replaced {minutes_ago} min ago"
            );
            assert_eq!((decision.in_flight, decision.unhealthy), (1, 2));
        }
        // Still Terminating:Proceed (the drain done, the instance shutting down): the same.
        nodes[0].draining = false;
        nodes[0].lifecycle_state = "Terminating:Proceed".into();
        let decision = decide_group(&policy, &group(nodes.clone()), at(NOW));
        assert_eq!(outcomes(&decision)[1], "n1:Queued");
        // The broken node being replaced counts toward the threshold: one more broken node
        // (3 of 10) pauses the group.
        nodes[2] = broken("n2", "Ready", "False", None, 35);
        let decision = decide_group(&policy, &group(nodes.clone()), at(NOW));
        assert!(decision.paused_by.unwrap().contains("3 of 10"));
        // A healthy node drained on a scale-in is in flight (capacity is leaving) but not
        // unhealthy.
        let mut scale_in = healthy("n0");
        scale_in.draining = true;
        scale_in.lifecycle_state = "Terminating:Wait".into();
        nodes[0] = scale_in;
        nodes[2] = healthy("n2");
        let decision = decide_group(&policy, &group(nodes), at(NOW));
        assert_eq!(outcomes(&decision)[..2], ["n0:RepairInFlight", "n1:Queued"]);
        assert_eq!((decision.in_flight, decision.unhealthy), (1, 1));
    }

    #[test]
    fn instances_out_of_service_are_neither_judged_nor_counted() {
        let policy = RepairPolicy::default();
        let mut nodes: Vec<_> = (0..10).map(|i| healthy(&format!("n{i}"))).collect();
        nodes[0] = broken("n0", "Ready", "False", None, 50);
        nodes[1] = broken("n1", "Ready", "False", None, 40);
        // Stopped in the warm pool for hours (their Nodes registered before), launching,
        // in standby: NotReady, none of it says anything about the instance.
        for (i, state) in [
            "Warmed:Stopped",
            "Warmed:Running",
            "Warmed:Hibernated",
            "Warmed:Pending:Wait",
            "Warmed:Terminating:Wait",
            "Pending:Wait",
            "Pending:Proceed",
            "Standby",
            "EnteringStandby",
        ]
        .into_iter()
        .enumerate()
        {
            let mut pooled = broken(&format!("w{i}"), "Ready", "Unknown", None, 600);
            pooled.lifecycle_state = state.into();
            nodes.push(pooled);
        }
        let decision = decide_group(&policy, &group(nodes.clone()), at(NOW));
        assert_eq!(decision.out_of_service, 9);
        assert!(
            decision.verdicts[10..]
                .iter()
                .all(|(_, v)| v.name() == "OutOfService"),
            "{decision:?}"
        );
        // 2 of the 10 in service: not paused, the longest broken repaired.
        assert_eq!(
            (decision.unhealthy, decision.paused_by.as_deref()),
            (2, None)
        );
        assert_eq!(outcomes(&decision)[..2], ["n0:Repair", "n1:Queued"]);
        // 3 of the 10 in service pause the group; the pool does not dilute the percentage.
        nodes[2] = broken("n2", "Ready", "False", None, 35);
        let decision = decide_group(&policy, &group(nodes), at(NOW));
        assert!(decision.paused_by.unwrap().contains("3 of 10"));
    }

    #[test]
    fn a_node_back_from_the_warm_pool_gets_its_wait_and_grace_period_from_its_launch() {
        // Created long ago, NotReady since it was stopped hours ago, started 2 minutes ago.
        let mut back = broken("a", "Ready", "Unknown", Some("NodeStatusUnknown"), 600);
        back.launched_at = Some(at(NOW - 2));
        let verdict = verdict_of(&RepairPolicy::default(), back.clone());
        assert!(
            matches!(&verdict, Verdict::Waiting { repair_at, problem, .. }
                if *repair_at == at(NOW + 28) && problem.since == at(NOW - 2)),
            "{verdict:?}"
        );
        // With no wait, the group's 5-minute grace period runs from the launch too.
        let no_wait = RepairPolicy::from_json(
            r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 0, "repairAction": "Replace"}]}"#,
        )
        .unwrap();
        let verdict = verdict_of(&no_wait, back.clone());
        assert!(
            matches!(&verdict, Verdict::WithinGracePeriod { until, .. } if *until == at(NOW + 3)),
            "{verdict:?}"
        );
        // Launched long ago: the Node's own times hold.
        back.launched_at = Some(at(-100));
        assert_eq!(verdict_of(&no_wait, back).name(), "Repair");
    }

    #[test]
    fn reboot_then_replace() {
        let policy = RepairPolicy::default();
        let reboot = |minutes_ago| RepairRecord {
            action: RepairAction::Reboot,
            at: at(NOW - minutes_ago),
            attempt: 1,
            condition: "AcceleratedHardwareReady".into(),
            reason: None,
        };
        // Rebooted 5 minutes ago, still broken since before: the reboot gets its 10 minutes.
        let mut node = broken("a", "AcceleratedHardwareReady", "False", None, 20);
        node.last_repair = Some(reboot(5));
        let verdict = verdict_of(&policy, node.clone());
        assert!(
            matches!(verdict, Verdict::Waiting { action: RepairAction::Replace, repair_at, .. } if repair_at == at(NOW + 5)),
            "{verdict:?}"
        );
        // Still broken 10 minutes after the reboot: replaced, second attempt.
        node.last_repair = Some(reboot(10));
        let verdict = verdict_of(&policy, node);
        assert_eq!(
            verdict,
            Verdict::Repair {
                problem: Problem {
                    condition: "AcceleratedHardwareReady".into(),
                    status: "False".into(),
                    reason: None,
                    since: at(NOW - 20)
                },
                action: RepairAction::Replace,
                attempt: 2
            }
        );
        // Broken again long after a reboot that worked: rebooted again.
        let mut node = broken("a", "AcceleratedHardwareReady", "False", None, 15);
        node.last_repair = Some(reboot(600));
        assert!(matches!(
            verdict_of(&policy, node),
            Verdict::Repair {
                action: RepairAction::Reboot,
                attempt: 2,
                ..
            }
        ));
    }

    #[test]
    fn overrides_change_wait_and_action() {
        let policy = RepairPolicy::from_json(
            r#"{"nodeRepairConfigOverrides": [
                {"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 1, "repairAction": "Reboot"},
                {"nodeMonitoringCondition": "NetworkingReady", "nodeUnhealthyReason": "IPAMDNotRunning", "minRepairWaitTimeMins": 60, "repairAction": "NoAction"}]}"#,
        )
        .unwrap();
        assert!(matches!(
            verdict_of(&policy, broken("a", "Ready", "False", None, 2)),
            Verdict::Repair {
                action: RepairAction::Reboot,
                ..
            }
        ));
        assert_eq!(
            verdict_of(
                &policy,
                broken(
                    "a",
                    "NetworkingReady",
                    "False",
                    Some("IPAMDNotRunning"),
                    120
                )
            )
            .name(),
            "NoAction"
        );
        assert_eq!(
            verdict_of(
                &policy,
                broken("a", "NetworkingReady", "False", Some("InterfaceNotUp"), 31)
            )
            .name(),
            "Repair"
        );
    }

    #[test]
    fn repairs_pause_when_more_than_20_percent_of_a_group_above_5_nodes_is_unhealthy() {
        let policy = RepairPolicy::default();
        let mut nodes: Vec<_> = (0..10).map(|i| healthy(&format!("n{i}"))).collect();
        nodes[0] = broken("n0", "Ready", "False", None, 40);
        nodes[1] = broken("n1", "Ready", "False", None, 50);
        // 2 of 10: 20% is not more than 20%: the longest-broken one is repaired.
        let decision = decide_group(&policy, &group(nodes.clone()), at(NOW));
        assert_eq!(decision.paused_by, None);
        assert_eq!(decision.verdicts[1].1.name(), "Repair");
        assert_eq!(decision.verdicts[0].1.name(), "Queued");
        // 3 of 10 (one merely waiting still counts): paused, naming the limit.
        nodes[2] = broken("n2", "Ready", "False", None, 1);
        let decision = decide_group(&policy, &group(nodes), at(NOW));
        let limit = decision.paused_by.clone().unwrap();
        assert!(
            limit.contains("maxUnhealthyNodeThresholdPercentage=20"),
            "{limit}"
        );
        assert!(limit.contains("3 of 10"), "{limit}");
        assert_eq!(decision.verdicts[0].1.name(), "Paused");
        assert_eq!(decision.verdicts[1].1.name(), "Paused");
        assert_eq!(decision.verdicts[2].1.name(), "Waiting");
        // A group of five nodes is exempt: 2 of 5 unhealthy are still repaired.
        let small: Vec<_> = (0..5)
            .map(|i| {
                if i < 2 {
                    broken(&format!("s{i}"), "Ready", "False", None, 40)
                } else {
                    healthy(&format!("s{i}"))
                }
            })
            .collect();
        let decision = decide_group(&policy, &group(small), at(NOW));
        assert_eq!(decision.paused_by, None);
        // A count threshold applies to any size.
        let policy = RepairPolicy::from_json(r#"{"maxUnhealthyNodeThresholdCount": 1}"#).unwrap();
        let two: Vec<_> = (0..2)
            .map(|i| broken(&format!("c{i}"), "Ready", "False", None, 40))
            .collect();
        let decision = decide_group(&policy, &group(two), at(NOW));
        assert!(
            decision
                .paused_by
                .unwrap()
                .contains("maxUnhealthyNodeThresholdCount=1")
        );
    }

    #[test]
    fn in_flight_repairs_count_against_the_parallel_limit() {
        let policy = RepairPolicy::from_json(
            r#"{"maxParallelNodesRepairedCount": 2, "maxUnhealthyNodeThresholdCount": 10}"#,
        )
        .unwrap();
        let mut terminating = broken("t", "Ready", "False", None, 90);
        terminating.lifecycle_state = "Terminating:Wait".into();
        let nodes = vec![
            terminating,
            broken("a", "Ready", "False", None, 40),
            broken("b", "Ready", "False", None, 60),
            broken("c", "Ready", "False", None, 50),
            healthy("h"),
        ];
        let decision = decide_group(&policy, &group(nodes), at(NOW));
        assert_eq!(decision.in_flight, 1);
        assert_eq!(decision.unhealthy, 4);
        let names: Vec<_> = decision
            .verdicts
            .iter()
            .map(|(n, v)| format!("{n}:{}", v.name()))
            .collect();
        // One slot left: the longest-broken node (b) takes it.
        assert_eq!(
            names,
            [
                "t:RepairInFlight",
                "a:Queued",
                "b:Repair",
                "c:Queued",
                "h:Healthy"
            ]
        );
        let Verdict::Queued { limit, .. } = &decision.verdicts[1].1 else {
            unreachable!()
        };
        assert!(limit.contains("maxParallelNodesRepairedCount=2"), "{limit}");
        // A percentage of the unhealthy nodes, at least one.
        let policy = RepairPolicy::from_json(
            r#"{"maxParallelNodesRepairedPercentage": 50, "maxUnhealthyNodeThresholdCount": 10}"#,
        )
        .unwrap();
        let nodes: Vec<_> = (0..4)
            .map(|i| broken(&format!("p{i}"), "Ready", "False", None, 40 + i))
            .collect();
        let decision = decide_group(&policy, &group(nodes), at(NOW));
        let repaired = decision
            .verdicts
            .iter()
            .filter(|(_, v)| v.name() == "Repair")
            .count();
        assert_eq!(repaired, 2);
    }
}
