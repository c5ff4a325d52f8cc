//! The drain's CloudWatch metrics (Embedded Metric Format): one line per handled
//! notification, with the outcome as a dimension so dashboards can split drained, forced and
//! failed drains.

use crate::lifecycle::notification::LifecycleNotification;
use crate::telemetry::{MetricSet, Unit};

use super::session::SessionStats;

/// The metrics of one invocation's work on one drain.
#[derive(Debug, Clone)]
pub struct DrainMetrics<'a> {
    pub function_name: &'a str,
    pub notification: &'a LifecycleNotification,
    pub stats: SessionStats,
    /// `Drained`, `Forced`, `PodEvictionFailure`, `NoNode`, `HandedOver`, `ActionGone`, ...
    pub outcome: &'a str,
}

impl<'a> DrainMetrics<'a> {
    pub fn new(
        function_name: &'a str,
        notification: &'a LifecycleNotification,
        stats: SessionStats,
        outcome: &'a str,
    ) -> Self {
        Self {
            function_name,
            notification,
            stats,
            outcome,
        }
    }

    /// `PodsEvicted`, `EvictionRetries` and `HandOvers` (Count) with the `Outcome`
    /// dimension; the caller adds `DrainDuration` (on completion) or `Continuations` (on
    /// hand-over). `HandOvers` is how many times this drain was handed to a fresh invocation
    /// before this one: its maximum is the length of the longest hand-over chain, which the
    /// template's alarm watches (a drain needs about one per 870 s of deadline).
    pub fn metric_set(&self) -> MetricSet {
        let action = &self.notification.action;
        MetricSet::new(self.function_name)
            .dimension("Outcome", self.outcome)
            .metric(
                "PodsEvicted",
                f64::from(self.stats.pods_evicted),
                Unit::Count,
            )
            .metric(
                "EvictionRetries",
                f64::from(self.stats.eviction_retries),
                Unit::Count,
            )
            .metric(
                "HandOvers",
                f64::from(self.notification.continuation),
                Unit::Count,
            )
            .property("InstanceId", action.instance_id.clone())
            .property(
                "AutoScalingGroupName",
                action.auto_scaling_group_name.clone(),
            )
            .property("LifecycleHookName", action.lifecycle_hook_name.clone())
            .property("Continuation", self.notification.continuation)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::lifecycle::notification::parse_event;
    use serde_json::Value;

    fn notification(continuation: u32) -> LifecycleNotification {
        let path = format!(
            "{}/../tests/fixtures/sns-lifecycle-terminating.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let event = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut notification = parse_event(&event)
            .remove(0)
            .unwrap()
            .lifecycle()
            .unwrap()
            .clone();
        notification.continuation = continuation;
        notification
    }

    #[test]
    fn every_drain_line_carries_the_hand_overs_before_it_as_a_metric() {
        let notification = notification(3);
        let stats = SessionStats {
            pods_evicted: 2,
            eviction_retries: 5,
        };
        let line = DrainMetrics::new("terminating-hook", &notification, stats, "HandedOver")
            .metric_set()
            .to_json_line(1);
        let doc: Value = serde_json::from_str(&line).unwrap();
        let declared: Vec<&str> = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["Name"].as_str())
            .collect();
        assert_eq!(declared, ["PodsEvicted", "EvictionRetries", "HandOvers"]);
        assert_eq!(doc["HandOvers"], 3.0);
        assert_eq!(doc["Outcome"], "HandedOver");
        assert_eq!(doc["PodsEvicted"], 2.0);
    }
}
