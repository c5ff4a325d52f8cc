//! What happens to each instance of a seed (its fate), and the timeline that follows from it:
//! what AWS says, changing at given times, and the events it sends about it, each of which may
//! be lost, repeated or late.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use node_manager::aws::LifecycleActionRef;

use super::world::{GROUP, HOOK};

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
    /// A scheduled maintenance (`soon`: within the drain margin), cancelled later or not.
    Maintenance { soon: bool, cancelled: bool },
    /// Marked by an instance refresh of its group; the refresh ends or still runs at the end.
    Refreshed { ended: bool },
}

impl Fate {
    /// Whether this story gives a reason to drain the node (evictions from it are fine).
    pub fn may_be_drained(&self) -> bool {
        !matches!(
            self,
            Self::Stays | Self::Rebalanced | Self::Refreshed { .. }
        )
    }

    pub fn is_spot(&self) -> bool {
        matches!(
            self,
            Self::SpotInterrupted { .. } | Self::Rebalanced | Self::RebalancedThenInterrupted
        )
    }
}

/// One instance of the fleet.
#[derive(Debug, Clone)]
pub struct Member {
    pub instance_id: String,
    pub node: String,
    pub fate: Fate,
}

impl Member {
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
            auto_scaling_group_name: GROUP.into(),
            lifecycle_hook_name: HOOK.into(),
            instance_id: self.instance_id.clone(),
            token: format!("token-{}", &self.instance_id[2..]),
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
    /// The group's instance refresh runs / is over.
    RefreshRuns,
    RefreshOver,
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
    /// The refresh function's start (marks the instances it replaces) and end.
    RefreshStart,
    RefreshEnd,
    Tick,
}

impl Delivery {
    /// Lost for good is allowed: AWS may lose it (a lifecycle notification is retried by
    /// Lambda until it arrives, so it is only ever delayed).
    pub fn may_be_lost(&self) -> bool {
        !matches!(self, Self::Lifecycle(_))
    }
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
}

const FATES: usize = 9;

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
        },
        7 => Fate::Refreshed {
            ended: rng.random_bool(0.6),
        },
        _ => Fate::Stays,
    }
}

/// The fleet of `seed`: 3 to 5 instances, at least one that stays (room for the pods).
fn fleet(rng: &mut StdRng, seed: u64) -> Vec<Member> {
    let size = rng.random_range(3..=5usize);
    (0..size)
        .map(|i| Member {
            instance_id: format!("i-0{seed:08x}{i:08x}"),
            node: format!(
                "ip-10-{}-{}-{i}.eu-west-1.compute.internal",
                seed % 250,
                seed / 250 % 250
            ),
            fate: if i == 0 { Fate::Stays } else { fate(rng) },
        })
        .collect()
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
        Fate::ScaleIn => vec![
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
        Fate::Maintenance { soon, cancelled } => {
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
        Fate::Refreshed { .. } => vec![],
    };
    steps.sort_by_key(|(t, _)| *t);
    steps
}

/// The group's refresh, if any member is refreshed: runs at one time, ends later (or not).
fn refresh_story(fleet: &[Member], rng: &mut StdRng) -> Vec<(u32, Step)> {
    let Some(ended) = fleet.iter().find_map(|m| match m.fate {
        Fate::Refreshed { ended } => Some(ended),
        _ => None,
    }) else {
        return vec![];
    };
    let t = rng.random_range(0..15u32);
    let mut steps = vec![
        (t, Step::Truth(Truth::RefreshRuns)),
        (t, Step::Deliver(Delivery::RefreshStart)),
    ];
    if ended {
        let end = t + rng.random_range(1..10u32);
        steps.push((end, Step::Truth(Truth::RefreshOver)));
        steps.push((end, Step::Deliver(Delivery::RefreshEnd)));
    }
    steps
}

/// The seeded plan: stories, then every delivery lost, repeated or delayed at random,
/// schedule ticks and brownouts at random times, in time order.
pub fn plan(seed: u64) -> SeedPlan {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x35_e7e7);
    let fleet = fleet(&mut rng, seed);
    let mut timed: Vec<(u32, Step)> = fleet.iter().flat_map(|m| story(m, &mut rng)).collect();
    timed.extend(refresh_story(&fleet, &mut rng));
    for _ in 0..rng.random_range(1..4) {
        timed.push((rng.random_range(0..30), Step::Deliver(Delivery::Tick)));
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
        let Step::Deliver(delivery) = &step else {
            out.push((t * 10, i, step));
            continue;
        };
        let roll: f64 = rng.random();
        if roll < 0.2 && delivery.may_be_lost() {
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
    }
}
