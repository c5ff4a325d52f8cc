//! `launchIntoWarmPool`: a new instance launches into the group's warm pool; the launching
//! hook completes at once (no node joins a pool) and the instance waits in the pool.

use std::time::Duration;

use node_manager::aws::LifecycleActionResult;

use super::Checks;
use crate::aws::{CompletedBy, LifecycleCompletion, WarmPoolState};
use crate::sandbox::scenario::{NodegroupSpec, WarmPoolStep};
use crate::sandbox::timeline::Source;
use crate::sandbox::world::{Sandbox, SimulatedNode, warm_pool_state};

impl Sandbox {
    pub(in crate::sandbox) async fn launch_into_warm_pool(
        &self,
        index: usize,
        step: &WarmPoolStep,
    ) -> Checks {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let node = self.next_node_of(spec);
        self.timeline.record(
            Source::Step,
            format!(
                "{}. instance {} launches into the warm pool of {}",
                index + 1,
                node.instance_id,
                spec.auto_scaling_group
            ),
        );
        if let Err(error) = self.add_instance(spec, &node, jiff::Timestamp::now()) {
            return vec![(false, error.to_string())];
        }
        if let Err(error) = self
            .aws
            .autoscaling()
            .launch_into_warm_pool(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(false, format!("launch into the warm pool started: {error}"))];
        }
        let timeout = Duration::from_secs_f64(self.scenario.timings.launch_timeout_seconds);
        let Some(completion) = self
            .next_completion(&node.instance_id, 0, timeout + Duration::from_secs(15))
            .await
        else {
            return vec![(
                false,
                format!("launch hook of {} completed", node.instance_id),
            )];
        };
        let checks = self.check_pooled(spec, &node, &completion, timeout);
        self.warm_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(node);
        checks
    }

    /// The hook completed CONTINUE by the function without waiting for a node, and the
    /// instance waits in the pool.
    fn check_pooled(
        &self,
        spec: &NodegroupSpec,
        node: &SimulatedNode,
        completion: &LifecycleCompletion,
        timeout: Duration,
    ) -> Checks {
        let pooled_state = warm_pool_state(spec).map(WarmPoolState::lifecycle_state);
        let state = self
            .aws
            .autoscaling()
            .instance_state(&spec.auto_scaling_group, &node.instance_id);
        vec![
            (
                completion.result == LifecycleActionResult::Continue
                    && completion.by == CompletedBy::Call,
                "launch into the warm pool completed CONTINUE by the function".to_owned(),
            ),
            (
                completion.after < timeout / 2,
                format!(
                    "without waiting for a node ({:.1}s, launch timeout {:.0}s)",
                    completion.after.as_secs_f64(),
                    timeout.as_secs_f64()
                ),
            ),
            (
                state.as_deref() == pooled_state,
                format!(
                    "instance waits in the pool ({})",
                    state.as_deref().unwrap_or("not in the group")
                ),
            ),
        ]
    }
}
