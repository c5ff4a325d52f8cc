//! The invariants checked after a scenario: each action completed exactly once, CONTINUE,
//! after its node was drained (or its drain deadline passed); no PDB broken, from the fake
//! API server's disruption log; no pod DELETE without force; no write to a LAUNCHING node.

use std::time::{Duration, Instant};

use node_manager::aws::LifecycleActionResult;

use super::functions::DRAIN_TIMEOUT_SECONDS;
use super::setup::Soak;
use super::{Budget, DRAIN_USER, ScenarioReport};
use crate::kube::DisruptionLog;
use crate::soak::corpus::Target;

impl Soak {
    /// Exactly-once completions, CONTINUE, after the drain (`deliveries_started`: when the
    /// drain deadline started to run).
    pub(super) fn completion_violations(&mut self, deliveries_started: Instant) -> Vec<String> {
        let mut found = Vec::new();
        let completions = self
            .autoscaling()
            .completions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (target, action) in &self.actions {
            let done: Vec<_> = completions
                .iter()
                .filter(|(a, _, _, _)| a == action)
                .collect();
            if done.len() != 1 {
                found.push(format!(
                    "{} action of {} completed {} times",
                    target.function_name(),
                    action.instance_id,
                    done.len()
                ));
                continue;
            }
            let (_, result, remaining, at) = done[0];
            // Before the drain deadline could have passed, a completion means "drained";
            // after it (slow machine, blocking PDB) the deadline result with pods left is the
            // setting.
            let before_deadline = at.duration_since(deliveries_started)
                < Duration::from_secs_f64(DRAIN_TIMEOUT_SECONDS);
            if *result != LifecycleActionResult::Continue {
                found.push(format!(
                    "{} action of {} completed {}",
                    target.function_name(),
                    action.instance_id,
                    result.as_str()
                ));
            }
            if self.force && *target == Target::TerminatingHook && *remaining > 0 {
                // Force means the instance never goes with workload pods still running: each
                // one left was neither evicted nor deleted (retries exhausted, or not tried).
                self.report.forced_completions_with_pods += 1;
                found.push(format!(
                    "forced drain of {} completed while {remaining} workload pods still ran (neither evicted nor deleted)",
                    action.instance_id
                ));
            }
            if *target == Target::TerminatingHook && *remaining > 0 && before_deadline {
                found.push(format!(
                    "action of {} completed before its drain deadline while {remaining} workload pods still ran on its node",
                    action.instance_id
                ));
            }
        }
        found
    }

    /// No PDB violated, from the server's own records of every eviction and pod DELETE.
    pub(super) fn budget_violations(&mut self) -> Vec<String> {
        budget_violations(
            self.server.disruption_log(),
            &self.budgets,
            self.force,
            &mut self.report,
        )
    }

    /// Without force the terminating hook sends no pod DELETE at all (not even one that
    /// fails); it never writes a launching node.
    pub(super) fn audit_violations(&self) -> Vec<String> {
        let mut found = Vec::new();
        let audit = self.server.audit();
        let deletes = audit.filter(|e| {
            e.user.username == DRAIN_USER && e.verb == "delete" && e.resource() == "pods"
        });
        if !self.force && !deletes.is_empty() {
            found.push(format!("{} pod DELETEs without force", deletes.len()));
        }
        if let Some(node) = &self.launching_node() {
            let writes = audit.filter(|e| {
                e.user.username == DRAIN_USER
                    && e.resource() == "nodes"
                    && e.name() == node
                    && !matches!(e.verb.as_str(), "get" | "list" | "watch")
            });
            if !writes.is_empty() {
                found.push(format!(
                    "terminating hook wrote the LAUNCHING node {node}: {}",
                    writes[0].line()
                ));
            }
        }
        found
    }
}

/// The PDB invariant, from the fake API server's disruption log (recorded in the critical
/// section of each decision, so exact): no granted eviction took a budget below its
/// `desiredHealthy` (as its status said) or below the scenario's minimum by evicting a healthy
/// pod, and no pod of a budget was deleted directly unless the terminating hook did it with
/// force configured. Fills the report's eviction figures.
fn budget_violations(
    log: &DisruptionLog,
    budgets: &[Budget],
    force: bool,
    report: &mut ScenarioReport,
) -> Vec<String> {
    let mut found = Vec::new();
    let tally = log.eviction_tally();
    report.evictions_decided = tally.decided;
    report.evictions = tally.granted;
    report.evictions_refused = tally.refused_by_budget;
    report.pdb_checks_at_eviction = tally.budget_checks;
    for record in log.evictions().iter().filter(|r| r.granted()) {
        if !record.broken_budgets().is_empty() {
            found.push(format!(
                "eviction left a PDB below desiredHealthy: {}",
                record.line()
            ));
        }
        for counts in &record.budgets {
            let Some(after) = counts.healthy_after else {
                continue;
            };
            let minimum = budgets
                .iter()
                .find(|b| b.namespace == counts.namespace && b.name == counts.name)
                .map_or(0, |b| b.min_healthy);
            if after < minimum && after < counts.healthy_before {
                found.push(format!(
                    "eviction left PDB {}/{} with {after} healthy pods, the scenario needs {minimum}: {}",
                    counts.namespace,
                    counts.name,
                    record.line()
                ));
            }
        }
    }
    for deletion in log.pod_deletions().iter().filter(|d| d.deleted()) {
        report.pod_deletions += 1;
        if !deletion.covered_by_budget() {
            continue;
        }
        report.covered_pod_deletions += 1;
        let allowed = force && deletion.requester.username == DRAIN_USER;
        if !allowed {
            found.push(format!(
                "pod of a PDB deleted directly{}: {}",
                if force { "" } else { " without force" },
                deletion.line()
            ));
        }
    }
    found
}
