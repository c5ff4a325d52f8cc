//! A fault of issue #24 item 3 in the soak: an instance comes back from the warm pool while
//! its node still carries the scale-in's drain (cordon, exclude-from-load-balancers label,
//! checkpoint), and the node turns Ready only after the launch timeout. The launching action
//! is delivered like the others (duplicated, killed, handed over, late); the launch timeout
//! completes it with CONTINUE, and at the end no node may keep our marks.
//!
//! Drawn from its own generator (see [`WARM_RETURN_DRAW`]) so the scenario's other draws
//! keep their meaning.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use node_manager::aws::{LifecycleActionRef, LifecycleActionResult};
use node_manager::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;
use node_manager::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, DrainCheckpoint, OutOfService};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::setup::{Soak, instance_id, node_name};
use super::{GROUP, LAUNCH_HOOK, TERMINATE_HOOK};
use crate::fixtures::{self, lifecycle_notification};
use crate::soak::corpus::{self, Target};

/// Seeds the warm-pool return draws apart from the rest of the scenario.
const WARM_RETURN_DRAW: u64 = 0x3A_2E70;
/// The soak's launch timeout (`functions.rs`): the node turns Ready only after it.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The instance back from the warm pool in this scenario, if any.
#[derive(Debug, Clone)]
pub(super) struct WarmReturn {
    pub(super) instance_id: String,
    pub(super) node: String,
    /// After the first delivery, when the node turns Ready (past the launch timeout).
    ready_after: Duration,
}

impl Soak {
    /// Maybe (one scenario in three) an instance back from the warm pool: its node, stopped
    /// in the pool, carries our drain's marks; its launching action starts now. Call after
    /// `start_actions` (the group and its hooks exist).
    pub(super) fn start_warm_pool_return(&mut self) {
        let mut draw = StdRng::seed_from_u64(self.seed ^ WARM_RETURN_DRAW);
        if !draw.random_bool(1.0 / 3.0) {
            return;
        }
        let index = self.launch_index() + 1;
        let instance = instance_id(index);
        let node = node_name(index);
        let provider_id = format!("aws:///eu-west-1a/{instance}");
        self.server
            .register_node(&node, &provider_id, Some(Duration::ZERO))
            .expect("returning node");
        self.server.stop_node(&node).expect("stopped in the pool");
        let scale_in = LifecycleActionRef {
            auto_scaling_group_name: GROUP.into(),
            lifecycle_hook_name: TERMINATE_HOOK.into(),
            instance_id: instance.clone(),
            token: format!("00000000-0000-4000-a000-{:012x}", self.seed),
        };
        let mut checkpoint = DrainCheckpoint::start(
            &scale_in,
            Timestamp::now(),
            Duration::from_secs(60),
            "scale-in",
            Duration::from_secs(1),
        )
        .handed_over(Timestamp::now());
        checkpoint.out_of_service = Some(OutOfService {
            labelled: true,
            cordoned: true,
            taint: None,
        });
        checkpoint.completed_at = Some(Timestamp::now());
        checkpoint.to_warm_pool_at = Some(Timestamp::now());
        let record = checkpoint.to_json();
        self.store
            .modify::<Node>("", &node, |n| {
                n.spec.get_or_insert_default().unschedulable = Some(true);
                n.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(EXCLUDE_FROM_LOAD_BALANCERS_LABEL.into(), "true".into());
                n.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(CHECKPOINT_ANNOTATION.into(), record.clone());
            })
            .expect("the scale-in's marks");
        self.instances.add(&instance, &node);
        let token = format!("00000000-0000-4000-b000-{:012x}", self.seed);
        let action = fixtures::start_action(&self.inner, GROUP, LAUNCH_HOOK, &instance, &token);
        self.actions.push((Target::LaunchingHook, action));
        self.report.launching += 1;
        self.warm_return = Some(WarmReturn {
            instance_id: instance,
            node,
            ready_after: LAUNCH_TIMEOUT + Duration::from_millis(draw.random_range(1000..3000)),
        });
    }

    /// The returning instance starts: its kubelet re-registers the node, which turns Ready
    /// only after the launch timeout.
    pub(super) fn restart_returning_node(&self) {
        if let Some(warm) = &self.warm_return {
            self.server
                .restart_node(
                    &warm.node,
                    &format!("aws:///eu-west-1a/{}", warm.instance_id),
                    Some(warm.ready_after),
                )
                .expect("restart the returning node");
        }
    }

    /// The notification of `action` as Auto Scaling sends it: for the instance back from the
    /// warm pool, with its route (`WarmPool` -> `AutoScalingGroup`).
    pub(super) fn notification_of(&self, target: Target, action: &LifecycleActionRef) -> Value {
        let event = lifecycle_notification(target, action);
        match &self.warm_return {
            Some(warm) if warm.instance_id == action.instance_id => {
                let mut message = corpus::message_of(&event);
                message["Origin"] = json!("WarmPool");
                message["Destination"] = json!("AutoScalingGroup");
                corpus::with_message(&event, &message.to_string())
            }
            _ => event,
        }
    }

    /// Once the returning instance's action completed with CONTINUE, its node keeps none of
    /// our drain's marks.
    pub(super) fn warm_return_violations(&self) -> Vec<String> {
        let Some(warm) = &self.warm_return else {
            return Vec::new();
        };
        let continued = self
            .autoscaling()
            .completions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(action, result, _, _)| {
                action.instance_id == warm.instance_id && *result == LifecycleActionResult::Continue
            });
        if !continued {
            // Not completed with CONTINUE: `completion_violations` reports it.
            return Vec::new();
        }
        let Some(node) = self.store.find::<Node>("", &warm.node) else {
            return Vec::new();
        };
        let mut kept = Vec::new();
        if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
            kept.push("cordon");
        }
        if node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LOAD_BALANCERS_LABEL))
        {
            kept.push("exclude-from-load-balancers label");
        }
        if node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(CHECKPOINT_ANNOTATION))
        {
            kept.push("drain checkpoint");
        }
        if kept.is_empty() {
            Vec::new()
        } else {
            vec![format!(
                "node {} back from the warm pool completed with CONTINUE but keeps our {}",
                warm.node,
                kept.join(", ")
            )]
        }
    }
}
