//! What happens to each instance of a seed (its fate), and the timeline that follows from it:
//! what AWS says, changing at given times, and the events it sends about it, each of which may
//! be lost, repeated or late.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use node_manager::aws::LifecycleActionRef;

use super::world::{GROUPS, HOOK, LAUNCH_HOOK};

/// One instance's story in a seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Nothing happens to it: nothing may be evicted from its node.
    Stays,
    /// Scaled in: a terminating lifecycle action.
    ScaleIn,
    /// A Spot interruption (its warning possibly lost); terminated before the end or not.
    SpotInterrupted { terminated: bool },
    /// A rebalance recommendation and nothing else.
    Rebalanced,
    /// A rebalance recommendation, then an interruption.
    RebalancedThenInterrupted,
    /// Stopped; started again later or not.
    Stopped { started_again: bool },
    /// A scheduled maintenance (`soon`: within the drain margin), cancelled later or not;
    /// `another`: EC2 also lists an unrelated event of another code ten days ahead, which
    /// neither keeps this one's drain nor is ended by this one's end.
    Maintenance {
        soon: bool,
        cancelled: bool,
        another: bool,
    },
    /// Outdated when an instance refresh of its group runs (marked by the instance refresh
    /// function); the refresh ends or still runs at the end; `replaced`: the refresh launches
    /// its replacement and then terminates it (a terminating lifecycle action);
    /// `rebalanced`: a Spot instance that also gets a rebalance recommendation (the rebalance
    /// cordon and the refresh's marks on one node).
    Refreshed {
        ended: bool,
        replaced: bool,
        rebalanced: bool,
    },
    /// The refresh's replacement of a refreshed instance: joins the group while the refresh
    /// runs and stays (nothing may mark, cordon or evict it).
    Replacement,
    /// Scaled in with reuse: back to the group's warm pool (a terminating lifecycle action,
    /// `AutoScalingGroup -> WarmPool`, with a full drain), stopped there, then launched out of
    /// the pool again (a launching lifecycle action, `WarmPool -> AutoScalingGroup`): its
    /// node comes back under its name and must carry none of our marks once Ready.
    /// `launch_lost`: the launching notification never reaches the launching hook (lost, or
    /// every retry failed), so Auto Scaling's hook timeout puts the instance in service with
    /// the hook's default result `CONTINUE`; the reconciler must clear the node.
    WarmPoolReturn { launch_lost: bool },
    /// Its kubelet dies (the node NotReady past node repair's wait): node repair, on its
    /// schedule, marks the instance unhealthy within EKS's limits, and the group replaces it
    /// (a terminating lifecycle action, drained like any other).
    Unhealthy,
}

impl Fate {
    /// Whether this story gives a reason to drain the node (evictions from it are fine).
    pub fn may_be_drained(&self) -> bool {
        !matches!(
            self,
            Self::Stays
                | Self::Unhealthy
                | Self::Rebalanced
                | Self::Refreshed {
                    replaced: false,
                    ..
                }
                | Self::Replacement
        )
    }

    /// Whether EC2 sends it a rebalance recommendation (with `REBALANCE_ACTION=drain` its
    /// node may be drained).
    pub fn gets_rebalance_recommendation(&self) -> bool {
        matches!(
            self,
            Self::Rebalanced
                | Self::RebalancedThenInterrupted
                | Self::Refreshed {
                    rebalanced: true,
                    ..
                }
        )
    }

    /// Whether Auto Scaling starts a terminating lifecycle action for it.
    pub fn has_lifecycle_action(&self) -> bool {
        matches!(
            self,
            Self::ScaleIn | Self::WarmPoolReturn { .. } | Self::Refreshed { replaced: true, .. }
        )
    }

    /// Whether it goes to the warm pool and comes back.
    pub fn is_warm_pool_return(&self) -> bool {
        matches!(self, Self::WarmPoolReturn { .. })
    }

    /// Whether the instance refresh replaces it (its node may carry the refresh's marks).
    pub fn is_refreshed(&self) -> bool {
        matches!(self, Self::Refreshed { .. })
    }

    pub fn is_spot(&self) -> bool {
        matches!(
            self,
            Self::SpotInterrupted { .. }
                | Self::Rebalanced
                | Self::RebalancedThenInterrupted
                | Self::Refreshed {
                    rebalanced: true,
                    ..
                }
        )
    }
}

/// One instance of the fleet.
#[derive(Debug, Clone)]
pub struct Member {
    pub instance_id: String,
    pub node: String,
    pub fate: Fate,
    /// Its Auto Scaling group: an index of [`GROUPS`].
    pub group: usize,
}

impl Member {
    /// Its Auto Scaling group's name.
    pub fn group_name(&self) -> &'static str {
        GROUPS[self.group]
    }

    pub fn provider_id(&self) -> String {
        format!("aws:///eu-west-1a/{}", self.instance_id)
    }

    pub fn spot_request(&self) -> Option<String> {
        self.fate
            .is_spot()
            .then(|| format!("sir-{}", &self.instance_id[2..]))
    }

    /// Its terminating lifecycle action (scale-in only).
    pub fn action(&self) -> LifecycleActionRef {
        LifecycleActionRef {
            auto_scaling_group_name: self.group_name().into(),
            lifecycle_hook_name: HOOK.into(),
            instance_id: self.instance_id.clone(),
            token: format!("token-{}", &self.instance_id[2..]),
        }
    }

    /// Its launching lifecycle action out of the warm pool.
    pub fn launch_action(&self) -> LifecycleActionRef {
        LifecycleActionRef {
            auto_scaling_group_name: self.group_name().into(),
            lifecycle_hook_name: LAUNCH_HOOK.into(),
            instance_id: self.instance_id.clone(),
            token: format!("launch-token-{}", &self.instance_id[2..]),
        }
    }
}

/// A change of what AWS says (never lost: it is the truth the events are about).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Truth {
    /// Auto Scaling starts terminating the instance: its action pending.
    Terminating(String),
    /// EC2 marks the Spot request for termination.
    SpotMarked(String),
    /// The Spot instance is terminated (its node goes).
    SpotTerminated(String),
    /// The instance stops (its node turns NotReady).
    Stopping(String),
    /// It is started again (its node Ready again).
    StartedAgain(String),
    /// EC2 schedules a maintenance (soon or in two days).
    Scheduled {
        instance: String,
        soon: bool,
    },
    /// EC2 cancels it.
    Cancelled(String),
    /// The instance refresh of group `.0` (an index of [`GROUPS`]) runs / is over with
    /// this status.
    RefreshRuns(usize),
    RefreshOver(usize, &'static str),
    /// A replacement is in service: its node registers and turns Ready.
    Launched(String),
    /// The instance's kubelet dies: its node NotReady, as if for longer than node repair's
    /// wait.
    KubeletDies(String),
}

/// An event AWS (or the schedule) sends the terminating hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Lifecycle(String),
    SpotWarning(String),
    Rebalance(String),
    Stopping(String),
    Health {
        instance: String,
        soon: bool,
    },
    /// The instance refresh function's events, as EventBridge delivers them: a group's
    /// refresh's start, a checkpoint, its end (`Succeeded`, `Cancelled`, `Failed`), and a
    /// replacement in service.
    RefreshStart(usize),
    RefreshCheckpoint(usize),
    RefreshEnd(usize, &'static str),
    InstanceLaunched(String),
    /// Node repair's schedule.
    RepairRun,
    Tick,
}

/// One step of the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Truth(Truth),
    Deliver(Delivery),
    /// A burst of 429s and 5xx on the API server and failures on the AWS fakes, for this
    /// many steps.
    Brownout(usize),
}

/// The seeded plan: the fleet and its timeline, and what was done to the events.
#[derive(Debug, Clone)]
pub struct SeedPlan {
    pub fleet: Vec<Member>,
    pub steps: Vec<Step>,
    pub lost: usize,
    pub duplicated: usize,
    pub delayed: usize,
    /// Whether the refresh skips instances already on its configuration (`SkipMatching`);
    /// without it, it replaces every instance launched before it started.
    pub skip_matching: bool,
}

const FATES: usize = 11;

fn fate(rng: &mut StdRng) -> Fate {
    match rng.random_range(0..FATES) {
        0 => Fate::Stays,
        1 => Fate::ScaleIn,
        2 => Fate::SpotInterrupted {
            terminated: rng.random_bool(0.5),
        },
        3 => Fate::Rebalanced,
        4 => Fate::RebalancedThenInterrupted,
        5 => Fate::Stopped {
            started_again: rng.random_bool(0.5),
        },
        6 => Fate::Maintenance {
            soon: rng.random_bool(0.5),
            cancelled: rng.random_bool(0.4),
            another: rng.random_bool(0.4),
        },
        7 => refreshed(rng),
        8 => Fate::WarmPoolReturn {
            launch_lost: rng.random_bool(0.3),
        },
        9 => Fate::Unhealthy,
        _ => Fate::Stays,
    }
}

/// An instance the refresh of its group replaces or keeps outdated (see [`Fate::Refreshed`]).
fn refreshed(rng: &mut StdRng) -> Fate {
    Fate::Refreshed {
        ended: rng.random_bool(0.6),
        replaced: rng.random_bool(0.6),
        rebalanced: rng.random_bool(0.3),
    }
}

fn seed_member(seed: u64, i: usize, fate: Fate, group: usize) -> Member {
    Member {
        instance_id: format!("i-0{seed:08x}{i:08x}"),
        node: format!(
            "ip-10-{}-{}-{i}.eu-west-1.compute.internal",
            seed % 250,
            seed / 250 % 250
        ),
        fate,
        group,
    }
}

/// The fleet of `seed`: a group of 3 to 5 instances, at least one that stays (room for the
/// pods); in half the seeds a second group of 2 or 3, and then both groups refresh at once
/// (the last instance of each is refreshed, whatever the others' fates). After them, a
/// replacement for each refreshed instance its group's refresh replaces (one refresh per
/// group: every refreshed instance of a group shares whether it ends).
fn fleet(rng: &mut StdRng, seed: u64) -> Vec<Member> {
    let two_groups = rng.random_bool(0.5);
    let mut sizes = vec![rng.random_range(3..=5usize)];
    if two_groups {
        sizes.push(rng.random_range(2..=3usize));
    }
    let mut fleet: Vec<Member> = Vec::new();
    for (group, size) in sizes.iter().enumerate() {
        for k in 0..*size {
            let fate = match (group, k) {
                (0, 0) => Fate::Stays,
                _ if two_groups && k + 1 == *size => refreshed(rng),
                _ => fate(rng),
            };
            fleet.push(seed_member(seed, fleet.len(), fate, group));
        }
        share_the_refresh_end(&mut fleet, group);
    }
    let replaced: Vec<usize> = fleet
        .iter()
        .filter(|m| matches!(m.fate, Fate::Refreshed { replaced: true, .. }))
        .map(|m| m.group)
        .collect();
    for group in replaced {
        fleet.push(seed_member(seed, fleet.len(), Fate::Replacement, group));
    }
    fleet
}

/// Every refreshed instance of `group` takes whether the refresh ends from the first one.
fn share_the_refresh_end(fleet: &mut [Member], group: usize) {
    let in_group = |m: &&mut Member| m.group == group;
    let refresh_ends = fleet
        .iter_mut()
        .filter(in_group)
        .find_map(|m| match m.fate {
            Fate::Refreshed { ended, .. } => Some(ended),
            _ => None,
        });
    for member in fleet.iter_mut().filter(in_group) {
        if let (Fate::Refreshed { ended, .. }, Some(ends)) = (&mut member.fate, refresh_ends) {
            *ended = ends;
        }
    }
}

/// Whether `member` is in the group from the start (a replacement joins later).
pub fn initial(member: &Member) -> bool {
    member.fate != Fate::Replacement
}

/// The story of one member: timed truth changes and deliveries (time in abstract ticks).
fn story(member: &Member, rng: &mut StdRng) -> Vec<(u32, Step)> {
    use Delivery as D;
    use Truth as T;
    let id = member.instance_id.clone();
    let at = |rng: &mut StdRng| rng.random_range(0..20u32);
    let t = at(rng);
    let later = t + rng.random_range(1..10u32);
    let mut steps = match &member.fate {
        Fate::Stays => vec![],
        Fate::ScaleIn | Fate::WarmPoolReturn { .. } => vec![
            (t, Step::Truth(T::Terminating(id.clone()))),
            (t, Step::Deliver(D::Lifecycle(id.clone()))),
        ],
        Fate::SpotInterrupted { terminated } => {
            let mut s = vec![
                (t, Step::Truth(T::SpotMarked(id.clone()))),
                (t, Step::Deliver(D::SpotWarning(id.clone()))),
            ];
            if *terminated {
                s.push((later, Step::Truth(T::SpotTerminated(id.clone()))));
            }
            s
        }
        Fate::Rebalanced => vec![(t, Step::Deliver(D::Rebalance(id.clone())))],
        Fate::RebalancedThenInterrupted => vec![
            (t, Step::Deliver(D::Rebalance(id.clone()))),
            (later, Step::Truth(T::SpotMarked(id.clone()))),
            (later, Step::Deliver(D::SpotWarning(id.clone()))),
        ],
        Fate::Stopped { started_again } => {
            let mut s = vec![
                (t, Step::Truth(T::Stopping(id.clone()))),
                (t, Step::Deliver(D::Stopping(id.clone()))),
            ];
            if *started_again {
                s.push((later, Step::Truth(T::StartedAgain(id.clone()))));
            }
            s
        }
        Fate::Maintenance {
            soon, cancelled, ..
        } => {
            let mut s = vec![
                (
                    t,
                    Step::Truth(T::Scheduled {
                        instance: id.clone(),
                        soon: *soon,
                    }),
                ),
                (
                    t,
                    Step::Deliver(D::Health {
                        instance: id.clone(),
                        soon: *soon,
                    }),
                ),
            ];
            if *cancelled {
                s.push((later, Step::Truth(T::Cancelled(id.clone()))));
            }
            s
        }
        Fate::Unhealthy => vec![
            (t, Step::Truth(T::KubeletDies(id.clone()))),
            (later, Step::Deliver(D::RepairRun)),
        ],
        Fate::Refreshed {
            rebalanced: true, ..
        } => vec![(t, Step::Deliver(D::Rebalance(id.clone())))],
        Fate::Refreshed { .. } | Fate::Replacement => vec![],
    };
    steps.sort_by_key(|(t, _)| *t);
    steps
}

/// The refresh of `group`, if any of its members is refreshed: it runs from one time; each
/// replaced instance's replacement comes into service, then the instance is terminated (its
/// lifecycle action); maybe a checkpoint; then it ends (or not), `Succeeded` only when it
/// replaced every outdated instance.
fn refresh_story(fleet: &[Member], group: usize, rng: &mut StdRng) -> Vec<(u32, Step)> {
    let fleet: Vec<&Member> = fleet.iter().filter(|m| m.group == group).collect();
    let Some(ended) = fleet.iter().find_map(|m| match m.fate {
        Fate::Refreshed { ended, .. } => Some(ended),
        _ => None,
    }) else {
        return vec![];
    };
    let t = rng.random_range(0..15u32);
    let mut steps = vec![
        (t, Step::Truth(Truth::RefreshRuns(group))),
        (t, Step::Deliver(Delivery::RefreshStart(group))),
    ];
    let replaced: Vec<&&Member> = fleet
        .iter()
        .filter(|m| matches!(m.fate, Fate::Refreshed { replaced: true, .. }))
        .collect();
    let replacements = fleet.iter().filter(|m| m.fate == Fate::Replacement);
    let mut last = t;
    for (old, new) in replaced.iter().zip(replacements) {
        let launched = t + rng.random_range(1..6u32);
        let terminating = launched + rng.random_range(1..4u32);
        last = last.max(terminating);
        steps.extend([
            (
                launched,
                Step::Truth(Truth::Launched(new.instance_id.clone())),
            ),
            (
                launched,
                Step::Deliver(Delivery::InstanceLaunched(new.instance_id.clone())),
            ),
            (
                terminating,
                Step::Truth(Truth::Terminating(old.instance_id.clone())),
            ),
            (
                terminating,
                Step::Deliver(Delivery::Lifecycle(old.instance_id.clone())),
            ),
        ]);
    }
    if rng.random_bool(0.4) {
        steps.push((
            rng.random_range(t..=last),
            Step::Deliver(Delivery::RefreshCheckpoint(group)),
        ));
    }
    if ended {
        let every_one = fleet.iter().all(|m| {
            !matches!(
                m.fate,
                Fate::Refreshed {
                    replaced: false,
                    ..
                }
            )
        });
        steps.extend(refresh_end(group, every_one, last, rng));
    }
    steps
}

/// How `group`'s refresh ends after `last` (`Succeeded` only when it replaced `every_one`
/// outdated instance): what Auto Scaling reports and the event it sends.
fn refresh_end(group: usize, every_one: bool, last: u32, rng: &mut StdRng) -> Vec<(u32, Step)> {
    let (status, detail) = match rng.random_range(0..4u32) {
        0 if every_one => ("Successful", "Succeeded"),
        0 | 1 => ("Cancelled", "Cancelled"),
        2 => ("Failed", "Failed"),
        // A rollback: Auto Scaling keeps the outdated instances (the soak does not model its
        // replacing the new ones), so their marks lose their reason at its start.
        _ => ("RollbackInProgress", "Rollback Started"),
    };
    let end = last + rng.random_range(1..8u32);
    // Sometimes the event runs ahead of `DescribeInstanceRefreshes`: Auto Scaling reports the
    // end a tick after the event is delivered.
    let reported = end + u32::from(rng.random_bool(0.3));
    let mut steps = vec![
        (reported, Step::Truth(Truth::RefreshOver(group, status))),
        (end, Step::Deliver(Delivery::RefreshEnd(group, detail))),
    ];
    if status == "RollbackInProgress" && rng.random_bool(0.5) {
        let over = reported + rng.random_range(1..4u32);
        steps.push((
            over,
            Step::Truth(Truth::RefreshOver(group, "RollbackSuccessful")),
        ));
        steps.push((
            over,
            Step::Deliver(Delivery::RefreshEnd(group, "Rollback Succeeded")),
        ));
    }
    steps
}

/// The seeded plan: stories, then every delivery lost, repeated or delayed at random,
/// schedule ticks and brownouts at random times, in time order.
pub fn plan(seed: u64) -> SeedPlan {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x35_e7e7);
    let fleet = fleet(&mut rng, seed);
    let skip_matching = rng.random_bool(0.7);
    let mut timed: Vec<(u32, Step)> = fleet.iter().flat_map(|m| story(m, &mut rng)).collect();
    for group in 0..GROUPS.len() {
        timed.extend(refresh_story(&fleet, group, &mut rng));
    }
    for _ in 0..rng.random_range(1..4) {
        timed.push((rng.random_range(0..30), Step::Deliver(Delivery::Tick)));
    }
    if fleet.iter().any(|m| m.fate == Fate::Unhealthy) {
        for _ in 0..rng.random_range(1..4) {
            timed.push((rng.random_range(0..30), Step::Deliver(Delivery::RepairRun)));
        }
    }
    for _ in 0..rng.random_range(0..3) {
        timed.push((
            rng.random_range(0..30),
            Step::Brownout(rng.random_range(1..4)),
        ));
    }
    let (mut lost, mut duplicated, mut delayed) = (0, 0, 0);
    let mut out: Vec<(u32, usize, Step)> = Vec::new();
    for (i, (t, step)) in timed.into_iter().enumerate() {
        if !matches!(step, Step::Deliver(_)) {
            out.push((t * 10, i, step));
            continue;
        }
        let roll: f64 = rng.random();
        // Any event may be lost for good, lifecycle notifications included: Lambda retries
        // a failing invocation a finite number of times (the template's two), and an SNS
        // delivery can fail.
        if roll < 0.2 {
            lost += 1;
            continue;
        }
        // Late: after other events (possibly after what followed it in AWS).
        let delay = if roll < 0.45 {
            delayed += 1;
            rng.random_range(10..150)
        } else {
            0
        };
        out.push((t * 10 + 1 + delay, i, step.clone()));
        if rng.random_bool(0.25) {
            duplicated += 1;
            out.push((t * 10 + 1 + rng.random_range(0..100), i, step));
        }
    }
    out.sort_by_key(|(t, i, _)| (*t, *i));
    SeedPlan {
        fleet,
        steps: out.into_iter().map(|(_, _, s)| s).collect(),
        lost,
        duplicated,
        delayed,
        skip_matching,
    }
}
