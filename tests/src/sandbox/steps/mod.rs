//! The scenario's steps, one module per kind of step. Each plays its step on the sandbox
//! and returns its checks: (held, what was expected).

mod instance_refresh;

pub use instance_refresh::RefreshFigures;
mod launch_into_warm_pool;
mod nodegroup;
mod repair_node;
mod scale_in;
mod scale_in_to_warm_pool;
mod scale_out;
mod scale_out_from_warm_pool;
mod spot_interruption;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;

use super::world::Sandbox;
use crate::aws::LifecycleCompletion;

/// What a step found: (held, what was expected), in order.
pub(super) type Checks = Vec<(bool, String)>;

/// ` (on it: a, b)`, or nothing for no items.
fn listing(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" (on it: {})", items.join(", "))
    }
}

/// Whether the node is cordoned (`spec.unschedulable`).
fn is_cordoned(node: Option<&Node>) -> bool {
    node.and_then(|n| n.spec.as_ref())
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// One check per expected Event reason: recorded on the node (`reasons` are those found).
fn expected_events(expected: &[String], reasons: &[String]) -> Checks {
    expected
        .iter()
        .map(|expected| {
            (
                reasons.contains(expected),
                format!("Event {expected} recorded on the node"),
            )
        })
        .collect()
}

impl Sandbox {
    /// Waits for a lifecycle action of `instance_id` to end after the `seen` ones already
    /// recorded for it.
    async fn next_completion(
        &self,
        instance_id: &str,
        seen: usize,
        timeout: Duration,
    ) -> Option<LifecycleCompletion> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let completions: Vec<LifecycleCompletion> = self
                .aws
                .autoscaling()
                .completions()
                .into_iter()
                .filter(|c| c.instance_id == instance_id)
                .collect();
            if completions.len() > seen {
                return completions.last().cloned();
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Evictions so far that broke a PodDisruptionBudget (the fake's disruption log).
    fn pdb_violations(&self) -> usize {
        self.server
            .disruption_log()
            .evictions()
            .iter()
            .filter(|r| !r.broken_budgets().is_empty())
            .count()
    }

    /// How many lifecycle actions of `instance_id` ended so far.
    fn completions_of(&self, instance_id: &str) -> usize {
        self.aws
            .autoscaling()
            .completions()
            .iter()
            .filter(|c| c.instance_id == instance_id)
            .count()
    }

    /// The reasons of the Events about `node`.
    fn node_events(&self, node: &str) -> Vec<String> {
        self.server
            .store()
            .list::<Event>()
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
            .filter_map(|e| e.reason)
            .collect()
    }

    /// Registers a new node for instance `provider_id` after the scenario's registration
    /// delay, Ready after its readiness delay, as its kubelet would.
    async fn register_after_delay(&self, node: &str, provider_id: &str) -> Result<(), String> {
        let timings = &self.scenario.timings;
        let ready_after = Duration::from_secs_f64(timings.node_ready_seconds);
        tokio::time::sleep(Duration::from_secs_f64(timings.node_register_seconds)).await;
        let registered = self
            .server
            .register_node(node, provider_id, Some(ready_after));
        registered.map_err(|error| error.to_string())?;
        self.timeline.record(
            super::timeline::Source::Note,
            format!("kubelet on {node} registers the node (Ready in {ready_after:?})"),
        );
        Ok(())
    }
}
