//! The pods a drain could not get off the node: deletions stuck on a node whose kubelet no
//! longer confirms them (reported once, then no longer waited for), pods that ask not to be
//! disrupted (reported once, never evicted), and the pods still there at the drain deadline,
//! each with the budgets in its way and the reason.

use std::collections::BTreeMap;

use super::budgets;
use super::events::reason;
use super::eviction::EvictionOutcome;
use super::eviction_queue::EvictionQueue;
use super::node_pods::NodePods;
use super::plan::{DrainPlan, PodKey};
use super::session::DrainSession;

/// A pod still on the node at the deadline, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckPod {
    pub pod: PodKey,
    /// Budgets that select the pod (from the namespace's budgets or the refusal).
    pub budgets: Vec<String>,
    pub why: StuckReason,
}

/// Why a pod was still there at the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StuckReason {
    /// Its eviction was refused; the last answer.
    Refused(EvictionOutcome),
    /// It was being deleted and did not finish.
    Terminating,
    /// Its eviction request was still unanswered (a client that retries 429s itself hides
    /// the refusals until it gives up).
    InFlight,
    /// Not tried: it waited for an earlier tier (critical pods wait for the ordinary ones).
    NotReached,
    /// Never tried: annotated `karpenter.sh/do-not-disrupt: "true"`.
    DoNotDisrupt,
}

impl std::fmt::Display for StuckPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.pod)?;
        match (&self.why, self.budgets.as_slice()) {
            (StuckReason::Terminating, _) => write!(f, " (still terminating)"),
            (StuckReason::DoNotDisrupt, _) => {
                write!(
                    f,
                    " (do-not-disrupt: karpenter.sh/do-not-disrupt, never evicted)"
                )
            }
            (StuckReason::NotReached, _) => {
                write!(f, " (not evicted yet: waits for the pods before it)")
            }
            (StuckReason::InFlight, []) => write!(f, " (eviction unanswered)"),
            (StuckReason::InFlight, budgets) => write!(
                f,
                " (eviction unanswered; PodDisruptionBudget {})",
                budgets.join(", ")
            ),
            (StuckReason::Refused(_), [one]) => write!(f, " (PodDisruptionBudget {one})"),
            (StuckReason::Refused(_), [_, _, ..]) => write!(
                f,
                " (PodDisruptionBudgets {}: more than one selects it, eviction cannot work)",
                self.budgets.join(", ")
            ),
            (StuckReason::Refused(refusal), []) => write!(f, " ({})", refusal.label()),
        }
    }
}

impl DrainSession<'_> {
    /// Reports the stuck deletions of `plan` not reported yet: a log line and a Warning Event
    /// on the node naming them.
    pub(super) fn report_stuck(&mut self, plan: &DrainPlan) {
        let new: Vec<PodKey> = plan
            .stuck()
            .filter(|k| !self.reported_stuck.contains(*k))
            .cloned()
            .collect();
        if new.is_empty() {
            return;
        }
        let names: Vec<String> = new.iter().map(ToString::to_string).collect();
        let why = match self.node_not_ready_since {
            Some(since) => format!("node not Ready since {since}"),
            None => "their deletion is overdue".to_owned(),
        };
        let note = format!(
            "No longer waiting for {} pod(s) whose deletion is stuck ({why}; STUCK_POD_SECONDS {}): {}. The drain goes on; they go with the instance.",
            new.len(),
            self.settings.stuck_pod_after.as_secs_f64(),
            names.join(", ")
        );
        tracing::warn!(step = "stuck_pods", node = %self.node_name, pods = ?names, "{note}");
        self.events
            .warning(&self.node_reference(), reason::POD_DELETION_STUCK, note);
        self.reported_stuck.extend(new);
        self.dead_node_check_due = self.settings.out_of_service_taint;
    }

    /// Reports the pods of `plan` held by `karpenter.sh/do-not-disrupt` not reported yet: a
    /// log line and a Warning Event on the node naming them, so an operator sees why the
    /// drain waits.
    pub(super) fn report_held(&mut self, plan: &DrainPlan) {
        let new: Vec<PodKey> = plan
            .held()
            .iter()
            .map(|p| &p.key)
            .filter(|k| !self.reported_held.contains(*k))
            .cloned()
            .collect();
        if new.is_empty() {
            return;
        }
        let names: Vec<String> = new.iter().map(ToString::to_string).collect();
        let note = format!(
            "Not evicting {} pod(s) annotated karpenter.sh/do-not-disrupt=true: {}. They keep node {} from being drained until the drain deadline ({}), where the deadline policy applies to them as to any pod left (DRAIN_FORCE deletes them; otherwise PodEvictionFailure and DRAIN_TIMEOUT_RESULT). Remove the annotation or delete the pods to let the drain finish sooner.",
            new.len(),
            names.join(", "),
            self.node_name,
            self.checkpoint.deadline
        );
        tracing::warn!(step = "held_do_not_disrupt", node = %self.node_name, pods = ?names, "{note}");
        self.events
            .warning(&self.node_reference(), reason::DO_NOT_DISRUPT, note);
        self.reported_held.extend(new);
    }

    pub(super) async fn stuck_pods(
        &mut self,
        pods: &NodePods,
        queue: &EvictionQueue,
    ) -> Vec<StuckPod> {
        let context = self.plan_context();
        let plan = DrainPlan::in_context(pods.pods(), &context);
        let refusals: BTreeMap<&PodKey, &EvictionOutcome> = queue.refusals().collect();
        let mut namespaces: BTreeMap<
            String,
            Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
        > = BTreeMap::new();
        let labels_of: BTreeMap<PodKey, BTreeMap<String, String>> = pods
            .pods()
            .filter_map(|p| {
                Some((
                    PodKey::of(p)?,
                    p.metadata.labels.clone().unwrap_or_default(),
                ))
            })
            .collect();
        let mut stuck = Vec::new();
        for key in plan.remaining() {
            if !namespaces.contains_key(&key.namespace) {
                let list = budgets::list(self.client, &key.namespace)
                    .await
                    .unwrap_or_else(|error| {
                        tracing::debug!(%error, "could not list PodDisruptionBudgets");
                        Vec::new()
                    });
                namespaces.insert(key.namespace.clone(), list);
            }
            let refusal = refusals.get(key).map(|r| (*r).clone());
            let terminating = queue.is_leaving(key) || plan.is_terminating(key);
            let mut names = labels_of
                .get(key)
                .map(|labels| budgets::covering(&namespaces[&key.namespace], labels))
                .unwrap_or_default();
            if names.is_empty()
                && let Some(EvictionOutcome::BlockedByBudget { budgets, .. }) = &refusal
            {
                names = budgets.clone();
            }
            let why = match refusal {
                _ if terminating => StuckReason::Terminating,
                _ if plan.is_held(key) => StuckReason::DoNotDisrupt,
                Some(refusal) => StuckReason::Refused(refusal),
                None if queue.is_in_flight(key) => StuckReason::InFlight,
                None => StuckReason::NotReached,
            };
            stuck.push(StuckPod {
                pod: key.clone(),
                budgets: names,
                why,
            });
        }
        stuck
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        PodKey {
            namespace: "default".into(),
            name: name.into(),
            uid: "u".into(),
        }
    }

    #[test]
    fn stuck_pods_say_why() {
        let refused = EvictionOutcome::BlockedByBudget {
            budgets: vec!["web".into()],
            retry_after: None,
            message: String::new(),
        };
        let one = StuckPod {
            pod: key("a"),
            budgets: vec!["web".into()],
            why: StuckReason::Refused(refused),
        };
        assert_eq!(one.to_string(), "default/a (PodDisruptionBudget web)");
        let two = StuckPod {
            pod: key("b"),
            budgets: vec!["x".into(), "y".into()],
            why: StuckReason::Refused(EvictionOutcome::MultipleBudgets {
                message: String::new(),
            }),
        };
        assert!(two.to_string().contains("PodDisruptionBudgets x, y"));
        let terminating = StuckPod {
            pod: key("c"),
            budgets: vec![],
            why: StuckReason::Terminating,
        };
        assert_eq!(terminating.to_string(), "default/c (still terminating)");
        let later = StuckPod {
            pod: key("d"),
            budgets: vec![],
            why: StuckReason::NotReached,
        };
        assert!(later.to_string().contains("not evicted yet"));
        let held = StuckPod {
            pod: key("e"),
            budgets: vec!["web".into()],
            why: StuckReason::DoNotDisrupt,
        };
        assert_eq!(
            held.to_string(),
            "default/e (do-not-disrupt: karpenter.sh/do-not-disrupt, never evicted)"
        );
    }
}
