//! `scaleOutFromWarmPool`: the instance that waited longest in the pool starts; its kubelet
//! (re-)registers the node; the launching hook completes once it is Ready, after undoing
//! what the drain left on it when it went to the pool. The node then serves a new pod.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::LifecycleActionResult;
use node_manager::lifecycle::node::is_ready;
use serde_json::json;

use super::{Checks, expected_events, is_cordoned, listing};
use crate::aws::CompletedBy;
use crate::fixtures;
use crate::sandbox::scenario::WarmPoolStep;
use crate::sandbox::timeline::Source;
use crate::sandbox::world::{DRAIN_CHECKPOINT, EXCLUDE_FROM_LB, Sandbox, SimulatedNode};

impl Sandbox {
    pub(in crate::sandbox) async fn scale_out_from_warm_pool(
        &self,
        index: usize,
        step: &WarmPoolStep,
    ) -> Checks {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let pooled = {
            let mut pool = self.warm_pool.lock().unwrap_or_else(|e| e.into_inner());
            (!pool.is_empty()).then(|| pool.remove(0))
        };
        let Some(node) = pooled else {
            return vec![(false, "an instance waits in the warm pool".to_owned())];
        };
        let returning = self.server.store().find::<Node>("", &node.name).is_some();
        self.timeline.record(
            Source::Step,
            format!(
                "{}. scale-out of {} from the warm pool: instance {} starts; its kubelet {} node {}",
                index + 1,
                spec.auto_scaling_group,
                node.instance_id,
                if returning { "re-registers" } else { "registers" },
                node.name
            ),
        );
        let seen = self.completions_of(&node.instance_id);
        if let Err(error) = self
            .aws
            .autoscaling()
            .launch_from_warm_pool(&spec.auto_scaling_group, &node.instance_id)
        {
            return vec![(false, format!("launch from the warm pool started: {error}"))];
        }
        let timings = &self.scenario.timings;
        tokio::time::sleep(Duration::from_secs_f64(timings.node_register_seconds)).await;
        if let Err(error) = self.server.restart_node(
            &node.name,
            &node.provider_id(),
            Some(Duration::from_secs_f64(timings.node_ready_seconds)),
        ) {
            return vec![(false, format!("node registered: {error}"))];
        }
        let wait =
            Duration::from_secs_f64(timings.launch_timeout_seconds) + Duration::from_secs(15);
        let Some(completion) = self.next_completion(&node.instance_id, seen, wait).await else {
            return vec![(
                false,
                format!("launch hook of {} completed", node.instance_id),
            )];
        };
        let mut checks = vec![(
            completion.result == LifecycleActionResult::Continue
                && completion.by == CompletedBy::Call,
            "launch from the warm pool completed CONTINUE by the function".to_owned(),
        )];
        checks.extend(self.check_back_in_service(&node));
        checks.push(self.serves_a_new_pod(&node).await);
        checks.extend(expected_events(
            &step.expect_node_events,
            &self.node_events(&node.name),
        ));
        self.from_warm_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(node);
        checks
    }

    /// The node is Ready and carries nothing of its trip to the pool: no cordon, taint,
    /// load-balancer exclusion or drain checkpoint.
    fn check_back_in_service(&self, node: &SimulatedNode) -> Checks {
        let node_object = self.server.store().find::<Node>("", &node.name);
        let mut checks = vec![
            (
                node_object.as_ref().is_some_and(is_ready),
                format!("node {} was Ready when the hook completed", node.name),
            ),
            (
                !is_cordoned(node_object.as_ref()),
                format!("node {} is not cordoned", node.name),
            ),
        ];
        let taints: Vec<String> = node_object
            .as_ref()
            .and_then(|n| n.spec.clone())
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        checks.push((
            taints.is_empty(),
            format!("node {} carries no taint{}", node.name, listing(&taints)),
        ));
        let metadata = node_object.map(|n| n.metadata).unwrap_or_default();
        checks.push((
            !metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LB)),
            format!("node {} is not excluded from load balancers", node.name),
        ));
        checks.push((
            !metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DRAIN_CHECKPOINT)),
            format!("node {} carries no drain checkpoint", node.name),
        ));
        checks
    }

    /// Creates a pod nobody placed and checks the scheduler runs it on `node` (the least
    /// loaded node: a node back from the pool has nothing on it).
    async fn serves_a_new_pod(&self, node: &SimulatedNode) -> (bool, String) {
        let name = format!("probe-{}", self.probes.fetch_add(1, Ordering::Relaxed));
        let created = self.server.store().apply_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "probe"}},
            "spec": {"containers": [{"name": "probe", "image": "public.ecr.aws/docker/library/busybox:stable"}]},
        }));
        if let Err(error) = created {
            return (false, format!("probe pod {name} created: {error}"));
        }
        let mut placed = None;
        for _ in 0..200 {
            let pod = self.server.store().find::<Pod>("default", &name);
            if let Some(pod) = pod.filter(fixtures::pod_is_ready) {
                placed = pod.spec.and_then(|s| s.node_name);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.timeline.record(
            Source::Note,
            format!(
                "pod default/{name} scheduled on {}",
                placed.as_deref().unwrap_or("no node")
            ),
        );
        (
            placed.as_deref() == Some(node.name.as_str()),
            format!("node {} serves a new pod ({name})", node.name),
        )
    }
}
