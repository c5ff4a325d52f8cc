//! `scaleInToWarmPool`: the instance that came out of the pool last goes back to it (scale-in
//! with reuse); the terminating hook drains the node, records the trip on it and completes;
//! the instance waits in the pool again (stopped, unless the pool keeps instances running).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::LifecycleActionResult;

use super::{Checks, expected_events, is_cordoned, listing};
use crate::aws::{CompletedBy, WarmPoolState};
use crate::fixtures::{is_daemon_set_pod, pod_key, pods_on};
use crate::sandbox::scenario::{NodegroupSpec, WarmPoolStep};
use crate::sandbox::timeline::Source;
use crate::sandbox::world::{DRAIN_CHECKPOINT, Sandbox, SimulatedNode, warm_pool_state};

impl Sandbox {
    pub(in crate::sandbox) async fn scale_in_to_warm_pool(
        &self,
        index: usize,
        step: &WarmPoolStep,
    ) -> Checks {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let last = self
            .from_warm_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        let Some(node) = last else {
            return vec![(
                false,
                "an instance that came out of the warm pool is in service".to_owned(),
            )];
        };
        let before: Vec<String> = pods_on(&self.server.store().list::<Pod>(), &node.name)
            .map(pod_key)
            .collect();
        self.timeline.record(
            Source::Step,
            format!(
                "{}. scale-in of {} with reuse: instance {} (node {}) goes back to the warm pool; pods on it: {}",
                index + 1,
                spec.auto_scaling_group,
                node.instance_id,
                node.name,
                before.join(", ")
            ),
        );
        let seen = self.completions_of(&node.instance_id);
        if let Err(error) = self
            .aws
            .autoscaling()
            .scale_in_to_warm_pool(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(false, format!("scale-in with reuse started: {error}"))];
        }
        let timings = &self.scenario.timings;
        let wait =
            Duration::from_secs_f64(timings.drain_timeout_seconds + timings.settle_seconds + 30.0);
        let Some(completion) = self.next_completion(&node.instance_id, seen, wait).await else {
            return vec![(
                false,
                format!("terminate hook of {} completed", node.instance_id),
            )];
        };
        let mut checks = vec![(
            completion.result == LifecycleActionResult::Continue
                && completion.by == CompletedBy::Call,
            "terminate hook completed CONTINUE by the function".to_owned(),
        )];
        checks.extend(self.check_drained_into_pool(spec, &node).await);
        checks.extend(expected_events(
            &step.expect_node_events,
            &self.node_events(&node.name),
        ));
        if warm_pool_state(spec) != Some(WarmPoolState::Running) {
            checks.extend(self.stop_in_pool(&node));
        }
        self.warm_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(node);
        checks
    }

    /// The node was drained, the instance is back in the pool, and the node records its
    /// trip to the pool and stays cordoned.
    async fn check_drained_into_pool(&self, spec: &NodegroupSpec, node: &SimulatedNode) -> Checks {
        let store = self.server.store();
        let remaining: Vec<String> = pods_on(&store.list::<Pod>(), &node.name)
            .filter(|p| !is_daemon_set_pod(p))
            .map(pod_key)
            .collect();
        let state = self
            .aws
            .autoscaling()
            .instance_state(&spec.auto_scaling_group, &node.instance_id);
        let mut checks = vec![
            (
                remaining.is_empty(),
                format!(
                    "node drained of every non-DaemonSet pod{}",
                    listing(&remaining)
                ),
            ),
            (
                state.as_deref() == warm_pool_state(spec).map(WarmPoolState::lifecycle_state),
                format!(
                    "instance back in the warm pool ({})",
                    state.as_deref().unwrap_or("not in the group")
                ),
            ),
        ];
        // The drain records the trip to the pool right after it completes the action (one
        // conditional write, retried on a conflict with the instance's stop): give it the
        // same few seconds as the Events.
        let went_to_pool = || {
            store
                .find::<Node>("", &node.name)
                .as_ref()
                .and_then(|n| n.metadata.annotations.as_ref())
                .and_then(|a| a.get(DRAIN_CHECKPOINT))
                .is_some_and(|record| record.contains("toWarmPoolAt"))
        };
        let _ = self
            .server
            .wait_for("the warm-pool record", Duration::from_secs(5), |_| {
                went_to_pool()
            })
            .await;
        let node_object = store.find::<Node>("", &node.name);
        checks.push((
            went_to_pool(),
            "node records that it went to the warm pool".to_owned(),
        ));
        checks.push((
            is_cordoned(node_object.as_ref()),
            "node cordoned while pooled".to_owned(),
        ));
        checks
    }

    /// The instance stops in the pool: its node turns NotReady and is tainted as shut down;
    /// the Node object stays.
    fn stop_in_pool(&self, node: &SimulatedNode) -> Checks {
        let mut checks = Vec::new();
        if let Err(error) = self.server.stop_node(&node.name) {
            checks.push((false, format!("node {} stopped: {error}", node.name)));
        }
        self.timeline.record(
            Source::Note,
            format!(
                "instance {} stopped in the pool: node {} NotReady, tainted node.cloudprovider.kubernetes.io/shutdown; the Node object stays",
                node.instance_id, node.name
            ),
        );
        checks
    }
}
