//! `scaleOut`: a new instance launches; its launch hook notifies `launching-hook`, which
//! completes the action once the instance's node is Ready (or abandons it when the node
//! never registers).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use node_manager::lifecycle::node::is_ready;

use super::{Checks, is_cordoned};
use crate::aws::{CompletedBy, LifecycleCompletion};
use crate::sandbox::scenario::ScaleOutStep;
use crate::sandbox::timeline::Source;
use crate::sandbox::world::{Sandbox, SimulatedNode};

impl Sandbox {
    pub(in crate::sandbox) async fn scale_out(&self, index: usize, step: &ScaleOutStep) -> Checks {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let node = self.next_node_of(spec);
        self.timeline.record(
            Source::Step,
            format!(
                "{}. scale-out of {}: instance {} launches ({})",
                index + 1,
                spec.auto_scaling_group,
                node.instance_id,
                if step.node_joins {
                    "its node will register"
                } else {
                    "its node never registers"
                }
            ),
        );
        if let Err(error) = self.add_instance(spec, &node, jiff::Timestamp::now()) {
            return vec![(false, error.to_string())];
        }
        if let Err(error) = self
            .aws
            .autoscaling()
            .launch_instance(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(false, format!("launch lifecycle action started: {error}"))];
        }
        if step.node_joins
            && let Err(error) = self
                .register_after_delay(&node.name, &node.provider_id())
                .await
        {
            return vec![(false, format!("node registered: {error}"))];
        }
        let wait = Duration::from_secs_f64(self.scenario.timings.launch_timeout_seconds)
            + Duration::from_secs(15);
        let completion = self
            .aws
            .autoscaling()
            .wait_for_completion(&node.instance_id, wait)
            .await;
        self.check_launch(step, &node, completion)
    }

    /// The launch hook completed as expected, by the function, on a Ready node that was not
    /// cordoned.
    fn check_launch(
        &self,
        step: &ScaleOutStep,
        node: &SimulatedNode,
        completion: Option<LifecycleCompletion>,
    ) -> Checks {
        let mut checks = Vec::new();
        let node_object = || self.server.store().find::<Node>("", &node.name);
        let node_ready = node_object().is_some_and(|n| is_ready(&n));
        match completion {
            Some(c) => {
                self.timeline.record(
                    Source::Note,
                    format!(
                        "Auto Scaling: launch action of {} ended {} by {:?}",
                        node.instance_id,
                        c.result.as_str(),
                        c.by
                    ),
                );
                checks.push((
                    c.result.as_str() == step.expect_result && c.by == CompletedBy::Call,
                    format!(
                        "launch hook completed {} by the function",
                        step.expect_result
                    ),
                ));
                if step.node_joins {
                    checks.push((
                        node_ready,
                        format!("node {} was Ready when the hook completed", node.name),
                    ));
                }
            }
            None => checks.push((
                false,
                format!("launch hook of {} completed", node.instance_id),
            )),
        }
        if step.node_joins {
            checks.push((
                !is_cordoned(node_object().as_ref()),
                format!("launching node {} was not cordoned", node.name),
            ));
        }
        checks
    }
}
