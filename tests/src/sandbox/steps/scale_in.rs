//! `scaleIn`: a seeded instance terminates; its terminating hook notifies `terminating-hook`,
//! which takes the node out of load balancers, cordons and drains it (respecting PDBs) and
//! completes the action.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};

use super::{Checks, expected_events, is_cordoned, listing};
use crate::aws::{CompletedBy, LifecycleCompletion};
use crate::fixtures::{is_daemon_set_pod, pod_key, pods_on};
use crate::sandbox::scenario::ScaleInStep;
use crate::sandbox::timeline::Source;
use crate::sandbox::world::{EXCLUDE_FROM_LB, Sandbox, SimulatedNode};

impl Sandbox {
    pub(in crate::sandbox) async fn scale_in(&self, index: usize, step: &ScaleInStep) -> Checks {
        let Some((spec, node)) = self.seeded(&step.nodegroup, step.node) else {
            return vec![(
                false,
                format!("node {} of {} exists", step.node, step.nodegroup),
            )];
        };
        let before: Vec<String> = pods_on(&self.server.store().list::<Pod>(), &node.name)
            .map(pod_key)
            .collect();
        self.timeline.record(
            Source::Step,
            format!(
                "{}. scale-in of {}: instance {} (node {}) terminates; pods on it: {}",
                index + 1,
                spec.auto_scaling_group,
                node.instance_id,
                node.name,
                before.join(", ")
            ),
        );
        if let Err(error) = self
            .aws
            .autoscaling()
            .terminate_instance(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(
                false,
                format!("terminate lifecycle action started: {error}"),
            )];
        }
        let timings = &self.scenario.timings;
        let wait =
            Duration::from_secs_f64(timings.drain_timeout_seconds + timings.settle_seconds + 30.0);
        let completion = self
            .aws
            .autoscaling()
            .wait_for_completion(&node.instance_id, wait)
            .await;
        let Some(completion) = completion else {
            return vec![(
                false,
                format!("terminate hook of {} completed", node.instance_id),
            )];
        };
        let mut checks = self.check_termination(step, node, &completion);
        if step.expect_drained {
            checks.push(self.check_out_of_load_balancers(node));
        }
        checks.extend(self.check_drained(step, node));
        checks.extend(self.check_drain_events(step, node).await);
        checks
    }

    /// The terminating hook completed as expected, once, by the function.
    fn check_termination(
        &self,
        step: &ScaleInStep,
        node: &SimulatedNode,
        completion: &LifecycleCompletion,
    ) -> Checks {
        self.timeline.record(
            Source::Note,
            format!(
                "Auto Scaling: terminate action of {} ended {} by {:?} after {:.1}s",
                node.instance_id,
                completion.result.as_str(),
                completion.by,
                completion.after.as_secs_f64()
            ),
        );
        let completions = self.completions_of(&node.instance_id);
        vec![
            (
                completion.result.as_str() == step.expect_result
                    && completion.by == CompletedBy::Call,
                format!(
                    "terminate hook completed {} by the function",
                    step.expect_result
                ),
            ),
            (
                completions == 1,
                format!("exactly one completion for {}", node.instance_id),
            ),
        ]
    }

    /// When the action completed, the cluster's load balancer no longer routed to the instance
    /// (deregistered by the service controller, its connections drained).
    fn check_out_of_load_balancers(&self, node: &SimulatedNode) -> (bool, String) {
        let elb = self.aws.elb();
        let routing: Vec<String> = self
            .service_controller
            .iter()
            .flat_map(|controller| controller.load_balancers())
            .filter(|lb| elb.routes_to(lb, &node.instance_id))
            .map(|lb| format!("{lb:?}"))
            .collect();
        (
            routing.is_empty(),
            format!(
                "no load balancer routed to {} when its action completed{}",
                node.instance_id,
                if routing.is_empty() {
                    String::new()
                } else {
                    format!(" (still: {})", routing.join(", "))
                }
            ),
        )
    }

    /// The node is out of load balancers and cordoned; its pods are gone (or stayed, where
    /// a PDB protects them) but for the DaemonSets'.
    fn check_drained(&self, step: &ScaleInStep, node: &SimulatedNode) -> Checks {
        let store = self.server.store();
        let node_object = store.find::<Node>("", &node.name);
        let labelled = node_object
            .as_ref()
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(EXCLUDE_FROM_LB))
            .is_some_and(|v| v == "true");
        let mut checks = vec![
            (labelled, format!("node labelled {EXCLUDE_FROM_LB}=true")),
            (
                is_cordoned(node_object.as_ref()),
                "node cordoned".to_owned(),
            ),
        ];
        let pods = store.list::<Pod>();
        let remaining: Vec<String> = pods_on(&pods, &node.name)
            .filter(|p| !is_daemon_set_pod(p))
            .map(pod_key)
            .collect();
        let daemons = pods_on(&pods, &node.name)
            .filter(|p| is_daemon_set_pod(p))
            .count();
        checks.push(if step.expect_drained {
            (
                remaining.is_empty(),
                format!(
                    "node drained of every non-DaemonSet pod{}",
                    listing(&remaining)
                ),
            )
        } else {
            (
                !remaining.is_empty(),
                format!(
                    "pods the PDB protects stayed on the node{}",
                    listing(&remaining)
                ),
            )
        });
        let daemon_sets = self
            .scenario
            .workloads
            .iter()
            .filter(|w| w.kind == "DaemonSet")
            .count();
        checks.push((
            daemons == daemon_sets,
            format!("DaemonSet pods left in place ({daemons} of {daemon_sets})"),
        ));
        checks
    }

    /// The Events the step expects on the node (after a note of the evictions).
    async fn check_drain_events(&self, step: &ScaleInStep, node: &SimulatedNode) -> Checks {
        let evictions = self.server.audit().subresource_requests("pods", "eviction");
        let refused = evictions.iter().filter(|e| e.code() == 429).count();
        self.timeline.record(
            Source::Note,
            format!(
                "{} eviction requests, {refused} refused by a PodDisruptionBudget (429) and retried",
                evictions.len()
            ),
        );
        // The function writes its Events after it completes the action (it flushes them
        // before the invocation ends): give the expected ones that long to land.
        let _ = self
            .server
            .wait_for("the expected node Events", Duration::from_secs(5), |_| {
                let reasons = self.node_events(&node.name);
                step.expect_node_events
                    .iter()
                    .all(|expected| reasons.contains(expected))
            })
            .await;
        expected_events(&step.expect_node_events, &self.node_events(&node.name))
    }
}
