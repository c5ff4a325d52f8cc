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

    /// `PodsEvicted` and `EvictionRetries` (Count) with the `Outcome` dimension; the caller
    /// adds `DrainDuration` (on completion) or `Continuations` (on hand-over).
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
            .property("InstanceId", action.instance_id.clone())
            .property(
                "AutoScalingGroupName",
                action.auto_scaling_group_name.clone(),
            )
            .property("LifecycleHookName", action.lifecycle_hook_name.clone())
            .property("Continuation", self.notification.continuation)
    }
}
