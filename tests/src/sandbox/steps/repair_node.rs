//! `repairNode`: the kubelet of a seeded node dies and its node has been `Ready=Unknown`
//! for the step's minutes; a scheduled `node-repair` run marks the instance Unhealthy, Auto
//! Scaling replaces it through both hooks (the old node drained, the new one Ready).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use node_manager::aws::LifecycleActionResult;
use serde_json::{Value, json};

use super::Checks;
use crate::aws::{CompletedBy, LifecycleCompletion};
use crate::lambda_api::InvocationOutcome;
use crate::sandbox::functions::invoke;
use crate::sandbox::scenario::RepairNodeStep;
use crate::sandbox::timeline::Source;
use crate::sandbox::world::{Sandbox, SimulatedNode};

impl Sandbox {
    pub(in crate::sandbox) async fn repair_node(
        &self,
        index: usize,
        step: &RepairNodeStep,
    ) -> Checks {
        let Some((_, node)) = self.seeded(&step.nodegroup, step.node) else {
            return vec![(
                false,
                format!("node {} of {} exists", step.node, step.nodegroup),
            )];
        };
        self.timeline.record(
            Source::Step,
            format!(
                "{}. the kubelet of {} ({}) dies: Ready=Unknown for {} minutes",
                index + 1,
                node.name,
                node.instance_id,
                step.not_ready_minutes
            ),
        );
        if let Err(error) = self.kubelet_died(node, step.not_ready_minutes) {
            return vec![(false, format!("node {} went NotReady: {error}", node.name))];
        }
        let mut checks = vec![self.run_node_repair(node).await];
        checks.extend(self.check_replacement(node).await);
        checks
    }

    /// Stops the node's kubelet (the node turns `Ready=Unknown` as the node lifecycle
    /// controller marks it, and its pods' deletions are never confirmed), `minutes` ago.
    fn kubelet_died(&self, node: &SimulatedNode, minutes: f64) -> Result<(), String> {
        let since = jiff::Timestamp::now() - Duration::from_secs_f64((minutes * 60.0).max(0.0));
        // Its instance has been running since well before (node repair counts a condition
        // from no earlier than the instance's launch).
        self.aws
            .ec2()
            .set_launch_time(&node.instance_id, since - Duration::from_secs(3600));
        // The story starts `minutes` after the kubelet stopped.
        self.server
            .kill_kubelet_since(&node.name, since)
            .map_err(|e| e.to_string())?;
        // The sandbox labels its nodes like a managed node group's, which node repair leaves
        // to EKS; this story is about a self-managed group, whose nodes carry no such label.
        self.server
            .store()
            .modify::<Node>("", &node.name, |n| {
                if let Some(labels) = n.metadata.labels.as_mut() {
                    labels.remove("eks.amazonaws.com/nodegroup");
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// One scheduled `node-repair` run; it must have repaired `node`.
    async fn run_node_repair(&self, node: &SimulatedNode) -> (bool, String) {
        let Some(runtime) = self.functions.get("node-repair") else {
            return (false, "node-repair runs in the sandbox".to_owned());
        };
        let schedule =
            json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}});
        let answer = invoke(
            &self.timeline,
            "node-repair",
            runtime,
            &schedule,
            self.function_timeout(),
            "EventBridge schedule",
        )
        .await;
        let report = match answer {
            Some(InvocationOutcome::Response(value)) => value["nodes"]
                .as_array()
                .and_then(|nodes| nodes.iter().find(|n| n["node"] == node.name.as_str()))
                .cloned()
                .unwrap_or_default(),
            _ => Value::Null,
        };
        (
            report["outcome"] == "Repair" && report["acted"] == true,
            format!("node-repair replaced {} ({})", node.name, report["why"]),
        )
    }

    /// Auto Scaling replaced the instance: the old one terminated through the terminating
    /// hook (drained), the new one launched through the launching hook once its node was
    /// Ready; and the repair left an Event on the old node.
    async fn check_replacement(&self, node: &SimulatedNode) -> Checks {
        let mut checks = Vec::new();
        let autoscaling = self.aws.autoscaling();
        let Some(replacement) = autoscaling
            .wait_for_health_replacement(&node.instance_id, Duration::from_secs(5))
            .await
        else {
            checks.push((false, format!("Auto Scaling replaced {}", node.instance_id)));
            return checks;
        };
        let new_instance = &replacement.replacement_instance_id;
        self.timeline.record(
            Source::Note,
            format!(
                "Auto Scaling: {} marked Unhealthy, terminating; replacement {new_instance} launching",
                node.instance_id
            ),
        );
        // Its kubelet registers the node as for any instance Auto Scaling launches on its
        // own (the sandbox follows launches: `follow_instances`).
        let timings = &self.scenario.timings;
        let wait =
            Duration::from_secs_f64(timings.drain_timeout_seconds + timings.launch_timeout_seconds)
                + Duration::from_secs(15);
        let continued_by_the_function = |c: &Option<LifecycleCompletion>| {
            c.as_ref().is_some_and(|c| {
                c.by == CompletedBy::Call && c.result == LifecycleActionResult::Continue
            })
        };
        let terminated = autoscaling
            .wait_for_completion(&node.instance_id, wait)
            .await;
        checks.push((
            continued_by_the_function(&terminated),
            format!(
                "terminate hook of {} completed CONTINUE by the function (drained)",
                node.instance_id
            ),
        ));
        let launched = autoscaling.wait_for_completion(new_instance, wait).await;
        checks.push((
            continued_by_the_function(&launched),
            format!(
                "launch hook of replacement {new_instance} completed CONTINUE once its node was Ready"
            ),
        ));
        let started = self.server.store().list::<Event>().iter().any(|e| {
            e.reason.as_deref() == Some("NodeRepairStarted")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.name.as_str())
        });
        checks.push((started, format!("Event NodeRepairStarted on {}", node.name)));
        checks
    }
}
