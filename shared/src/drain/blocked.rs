//! Why a drain waits: while the node still has pods that must leave, a Warning Event
//! `DrainBlocked` on the Node names each of them and what holds it (the PodDisruptionBudget
//! that refused its eviction, with the disruptions its status allows; the do-not-disrupt
//! annotation; a deletion still under way), once the drain has run for
//! `DRAIN_BLOCKED_REPORT_SECONDS` and then at most that often, so `kubectl describe node`
//! answers "why is my drain waiting" long before the deadline's `PodEvictionFailure`; each
//! report also writes the metric `DrainBlockedSeconds` per reason, which the template's
//! `drain-blocked` alarm and dashboard read. Once the pods are gone, a drain still waiting
//! for the node's volumes to detach or for load balancers to let go of the instance says so
//! the same way ([`after_pods`]), with reasons `Volumes` and `LoadBalancers`.

use std::time::Duration;

use super::FUNCTION_NAME;
use super::budget_watch::{BudgetKey, BudgetWatch};
use super::eviction::EvictionOutcome;
use super::eviction_queue::EvictionQueue;
use super::plan::{DrainPlan, PodKey};
use crate::telemetry::{MetricSet, Unit};

/// Pods named in one Event at most (the note is truncated to the Event's limit anyway).
const MAX_NAMED: usize = 20;

/// What holds one pod on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// Its eviction was refused by these budgets; `allowed` is what the last status of the
    /// first one allows, when the drain watches it.
    Budget {
        budgets: Vec<String>,
        allowed: Option<u32>,
    },
    /// Its eviction was refused otherwise (the refusal's label).
    Refused(&'static str),
    /// Annotated `karpenter.sh/do-not-disrupt`: never evicted.
    DoNotDisrupt,
    /// Being deleted: its containers are stopping.
    Terminating,
    /// Not refused yet: its eviction is in flight or its tier has not come.
    Waiting,
}

impl Holding {
    /// The `Reason` dimension of the `DrainBlockedSeconds` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Budget { .. } => "PodDisruptionBudget",
            Self::Refused(_) => "EvictionRefused",
            Self::DoNotDisrupt => "DoNotDisrupt",
            Self::Terminating => "Terminating",
            Self::Waiting => "EvictionPending",
        }
    }
}

impl std::fmt::Display for Holding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Budget { budgets, allowed } => {
                write!(f, "PodDisruptionBudget {}", budgets.join(", "))?;
                match allowed {
                    Some(n) => write!(f, " allows {n} disruption(s)"),
                    None => write!(f, " refused the eviction"),
                }
            }
            Self::Refused(label) => write!(f, "eviction refused ({label})"),
            Self::DoNotDisrupt => write!(f, "karpenter.sh/do-not-disrupt"),
            Self::Terminating => write!(f, "terminating"),
            Self::Waiting => write!(f, "eviction pending"),
        }
    }
}

/// Each pod that keeps the node from being drained, and what holds it.
pub fn holding(
    plan: &DrainPlan,
    queue: &EvictionQueue,
    budgets: &BudgetWatch,
) -> Vec<(PodKey, Holding)> {
    let refusals: std::collections::BTreeMap<&PodKey, &EvictionOutcome> =
        queue.refusals().collect();
    plan.remaining()
        .map(|pod| {
            let why = if plan.is_held(pod) {
                Holding::DoNotDisrupt
            } else if plan.is_terminating(pod) || queue.is_leaving(pod) {
                Holding::Terminating
            } else {
                match refusals.get(pod) {
                    Some(EvictionOutcome::BlockedByBudget { budgets: names, .. }) => {
                        let allowed = names.first().and_then(|name| {
                            budgets.allowed(&BudgetKey {
                                namespace: pod.namespace.clone(),
                                name: name.clone(),
                            })
                        });
                        Holding::Budget {
                            budgets: names.clone(),
                            allowed,
                        }
                    }
                    Some(refusal) => Holding::Refused(refusal.label()),
                    None => Holding::Waiting,
                }
            };
            (pod.clone(), why)
        })
        .collect()
}

/// The Event's note: how long the drain has run, then each pod and what holds it.
pub fn note(node: &str, running_for: Duration, holding: &[(PodKey, Holding)]) -> String {
    let named: Vec<String> = holding
        .iter()
        .take(MAX_NAMED)
        .map(|(pod, why)| format!("{pod} ({why})"))
        .collect();
    let more = holding.len().saturating_sub(MAX_NAMED);
    format!(
        "The drain of node {node} has run {} s and waits for {} pod(s): {}{}",
        running_for.as_secs(),
        holding.len(),
        named.join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        }
    )
}

/// One metric line per reason that holds pods: `DrainBlockedSeconds` (how long the drain has
/// run) and `PodsBlocked` (how many pods that reason holds), dimensions `Function` and
/// `Reason`, the node as a property.
pub fn metrics(node: &str, running_for: Duration, holding: &[(PodKey, Holding)]) -> Vec<MetricSet> {
    let mut by_reason: std::collections::BTreeMap<&'static str, u32> = Default::default();
    for (_, why) in holding {
        *by_reason.entry(why.kind()).or_default() += 1;
    }
    by_reason
        .into_iter()
        .map(|(reason, pods)| {
            blocked_for(node, reason, running_for).metric(
                "PodsBlocked",
                f64::from(pods),
                Unit::Count,
            )
        })
        .collect()
}

/// `DrainBlockedSeconds` of a drain held for `reason` (dimensions `Function`, `Reason`; the
/// node as a property): the line both kinds of report start from.
fn blocked_for(node: &str, reason: &str, running_for: Duration) -> MetricSet {
    MetricSet::new(FUNCTION_NAME)
        .dimension("Reason", reason)
        .metric(
            "DrainBlockedSeconds",
            running_for.as_secs_f64(),
            Unit::Seconds,
        )
        .property("Node", node.to_owned())
}

/// What a drain whose pods are gone still waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterPods {
    /// These volumes (persistent volume names) are still attached to the node.
    Volumes(Vec<String>),
    /// These load balancers still route to the instance.
    LoadBalancers(Vec<String>),
}

impl AfterPods {
    /// The `Reason` dimension of the `DrainBlockedSeconds` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Volumes(_) => "Volumes",
            Self::LoadBalancers(_) => "LoadBalancers",
        }
    }
}

impl std::fmt::Display for AfterPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, names) = match self {
            Self::Volumes(names) => ("volume(s) still attached", names),
            Self::LoadBalancers(names) => ("load balancer(s) still routing to the instance", names),
        };
        let shown: Vec<&str> = names.iter().take(MAX_NAMED).map(String::as_str).collect();
        let more = names.len().saturating_sub(MAX_NAMED);
        write!(f, "{} {what}: {}", names.len(), shown.join(", "))?;
        if more > 0 {
            write!(f, " and {more} more")?;
        }
        Ok(())
    }
}

/// The Event's note of a drain whose pods are gone and that still waits.
pub fn after_pods(node: &str, running_for: Duration, waits: &[AfterPods]) -> String {
    let parts: Vec<String> = waits.iter().map(ToString::to_string).collect();
    format!(
        "The drain of node {node} has run {} s; its pods are gone and it waits for {}",
        running_for.as_secs(),
        parts.join("; ")
    )
}

/// One `DrainBlockedSeconds` line per thing a drain whose pods are gone waits for.
pub fn after_pods_metrics(
    node: &str,
    running_for: Duration,
    waits: &[AfterPods],
) -> Vec<MetricSet> {
    waits
        .iter()
        .map(|wait| blocked_for(node, wait.kind(), running_for))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        PodKey {
            namespace: "shop".into(),
            name: name.into(),
            uid: name.into(),
        }
    }

    #[test]
    fn the_note_names_each_pod_and_what_holds_it() {
        let holding = [
            (
                key("web-1"),
                Holding::Budget {
                    budgets: vec!["web".into()],
                    allowed: Some(0),
                },
            ),
            (key("db-0"), Holding::DoNotDisrupt),
            (key("cache-0"), Holding::Terminating),
        ];
        let note = note("ip-10-0-1-2", Duration::from_secs(190), &holding);
        assert_eq!(
            note,
            "The drain of node ip-10-0-1-2 has run 190 s and waits for 3 pod(s): shop/web-1 \
             (PodDisruptionBudget web allows 0 disruption(s)); shop/db-0 \
             (karpenter.sh/do-not-disrupt); shop/cache-0 (terminating)"
        );
    }

    #[test]
    fn one_metric_line_per_reason_counts_its_pods() {
        let holding = [
            (
                key("web-1"),
                Holding::Budget {
                    budgets: vec!["web".into()],
                    allowed: Some(0),
                },
            ),
            (
                key("web-2"),
                Holding::Budget {
                    budgets: vec!["web".into()],
                    allowed: Some(0),
                },
            ),
            (key("db-0"), Holding::DoNotDisrupt),
        ];
        let lines: Vec<String> = metrics("n", Duration::from_secs(200), &holding)
            .iter()
            .map(|m| m.to_json_line(0))
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].contains("\"Reason\":\"DoNotDisrupt\""),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("\"PodsBlocked\":1.0"), "{}", lines[0]);
        assert!(
            lines[1].contains("\"Reason\":\"PodDisruptionBudget\""),
            "{}",
            lines[1]
        );
        assert!(lines[1].contains("\"PodsBlocked\":2.0"), "{}", lines[1]);
        assert!(
            lines[1].contains("\"DrainBlockedSeconds\":200.0"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn a_drain_whose_pods_are_gone_names_the_volumes_and_load_balancers_it_waits_for() {
        let waits = [
            AfterPods::Volumes(vec!["pv-db-0".into(), "pv-db-1".into()]),
            AfterPods::LoadBalancers(vec!["target group targetgroup/web/1 (draining)".into()]),
        ];
        assert_eq!(
            after_pods("n", Duration::from_secs(200), &waits),
            "The drain of node n has run 200 s; its pods are gone and it waits for 2 volume(s) \
             still attached: pv-db-0, pv-db-1; 1 load balancer(s) still routing to the instance: \
             target group targetgroup/web/1 (draining)"
        );
        let lines: Vec<String> = after_pods_metrics("n", Duration::from_secs(200), &waits)
            .iter()
            .map(|m| m.to_json_line(0))
            .collect();
        assert!(lines[0].contains("\"Reason\":\"Volumes\""), "{}", lines[0]);
        assert!(
            lines[1].contains("\"Reason\":\"LoadBalancers\""),
            "{}",
            lines[1]
        );
        assert!(
            lines[1].contains("\"DrainBlockedSeconds\":200.0"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn a_long_list_is_cut_with_a_count() {
        let holding: Vec<_> = (0..25)
            .map(|i| (key(&format!("p{i}")), Holding::Waiting))
            .collect();
        let note = note("n", Duration::from_secs(1), &holding);
        assert!(note.ends_with("; and 5 more"), "{note}");
        assert!(note.contains("shop/p19 (eviction pending)"), "{note}");
        assert!(!note.contains("shop/p20 "), "{note}");
    }
}
