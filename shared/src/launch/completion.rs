//! The ways a launch ends with `CompleteLifecycleAction`: the node is Ready (undoing the
//! scale-in's drain first when it comes back from the warm pool), the launch timeout passed,
//! or the instance went into the warm pool without a node.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::{EventType, Recorder};

use super::Launcher;
use super::report::{LaunchError, LaunchOutcome};
use super::signals::{emit_metrics, log_step, publish_event, seconds_since};
use super::warm_pool::{
    Restore, Restored, RunningWait, restore_returning_node, wait_until_running,
};
use crate::aws::{CompletionOutcome, LifecycleActionResult};
use crate::lifecycle::budget::instant_at;
use crate::lifecycle::hand_over::complete_action;
use crate::lifecycle::handler::{HookClients, Invocation};
use crate::lifecycle::node::find_node;
use crate::lifecycle::notification::LifecycleNotification;

impl<C: HookClients> Launcher<C> {
    /// `CompleteLifecycleAction` with `result`.
    async fn complete(
        &self,
        notification: &LifecycleNotification,
        result: LifecycleActionResult,
    ) -> Result<CompletionOutcome, LaunchError> {
        complete_action(&self.context.autoscaling, &notification.action, result)
            .await
            .map_err(LaunchError::Complete)
    }

    /// The node is Ready: complete with CONTINUE, and say so on the node.
    pub(super) async fn complete_ready(
        &self,
        recorder: &Recorder,
        notification: &LifecycleNotification,
        node: &Node,
        restored: Option<Restored>,
    ) -> Result<LaunchOutcome, LaunchError> {
        let action = &notification.action;
        let node_name = node.metadata.name.clone().unwrap_or_default();
        log_step(
            notification,
            Some(&node_name),
            "node is Ready; completing with CONTINUE",
        );
        let outcome = self
            .complete(notification, LifecycleActionResult::Continue)
            .await?;
        let waited_seconds = seconds_since(notification.time);
        let outcome = match outcome {
            CompletionOutcome::Completed => {
                log_step(
                    notification,
                    Some(&node_name),
                    "launch completed with CONTINUE",
                );
                publish_event(
                    recorder,
                    node,
                    EventType::Normal,
                    "LaunchCompleted",
                    format!(
                        "Node is Ready: lifecycle action {} of instance {} completed with CONTINUE after {waited_seconds:.0} s",
                        action.lifecycle_hook_name, action.instance_id
                    ),
                )
                .await;
                LaunchOutcome::Completed {
                    node: node_name.clone(),
                    waited_seconds,
                    restored,
                }
            }
            CompletionOutcome::NoActiveAction => {
                log_step(
                    notification,
                    Some(&node_name),
                    "node is Ready; the lifecycle action was already completed",
                );
                LaunchOutcome::AlreadyCompleted {
                    node: node_name.clone(),
                }
            }
        };
        emit_metrics(
            outcome.name(),
            notification,
            Some(&node_name),
            notification.continuation,
        );
        Ok(outcome)
    }

    /// The launch timeout passed: complete with the configured result and report it
    /// (`restored`: what of the scale-in's drain was undone first, for a node back from the
    /// warm pool completed with CONTINUE).
    pub(super) async fn complete_timed_out(
        &self,
        recorder: &Recorder,
        notification: &LifecycleNotification,
        node: Option<&Node>,
        restored: Option<Restored>,
    ) -> Result<LaunchOutcome, LaunchError> {
        let action = &notification.action;
        let result = self.settings().timeout_result;
        let node_name = node.and_then(|n| n.metadata.name.clone());
        tracing::warn!(
            instance_id = %action.instance_id,
            node = node_name.as_deref().unwrap_or_default(),
            hook = %action.lifecycle_hook_name,
            asg = %action.auto_scaling_group_name,
            request_id = %notification.request_id,
            registered = node.is_some(),
            result = result.as_str(),
            timeout_seconds = self.settings().launch_timeout.as_secs_f64(),
            "the node did not become Ready within the launch timeout; completing with the timeout result"
        );
        self.complete(notification, result).await?;
        if let Some(node) = node {
            publish_event(
                recorder,
                node,
                EventType::Warning,
                "LaunchTimedOut",
                format!(
                    "Node not Ready {:.0} s after instance {} launched: lifecycle action {} completed with {}",
                    self.settings().launch_timeout.as_secs_f64(),
                    action.instance_id,
                    action.lifecycle_hook_name,
                    result.as_str()
                ),
            )
            .await;
        }
        emit_metrics(
            "TimedOut",
            notification,
            node_name.as_deref(),
            notification.continuation,
        );
        Ok(LaunchOutcome::TimedOut {
            result: result.as_str().to_owned(),
            node: node_name,
            restored,
        })
    }

    /// A launch into the warm pool: complete with CONTINUE once EC2 has the instance out of
    /// `pending` (Auto Scaling then stops, hibernates or keeps it running in the pool).
    pub(super) async fn complete_into_warm_pool(
        &self,
        invocation: &Invocation,
        notification: &LifecycleNotification,
    ) -> Result<LaunchOutcome, LaunchError> {
        let action = &notification.action;
        let deadline = self.launch_deadline(notification);
        let stop_at = instant_at(deadline).min(invocation.budget.hand_over_at());
        let waited = wait_until_running(&self.context.instances, &action.instance_id, stop_at)
            .await
            .map_err(LaunchError::InstanceState)?;
        let instance_state = match waited {
            RunningWait::Settled(state) => state,
            RunningWait::Unknown => "unknown".to_owned(),
            RunningWait::StillPending if Timestamp::now() >= deadline => {
                tracing::warn!(
                    instance_id = %action.instance_id,
                    hook = %action.lifecycle_hook_name,
                    asg = %action.auto_scaling_group_name,
                    result = self.settings().timeout_result.as_str(),
                    "the instance launching into the warm pool stayed pending past the launch timeout; completing with the timeout result"
                );
                self.complete(notification, self.settings().timeout_result)
                    .await?;
                emit_metrics("TimedOut", notification, None, notification.continuation);
                return Ok(LaunchOutcome::TimedOut {
                    result: self.settings().timeout_result.as_str().to_owned(),
                    node: None,
                    restored: None,
                });
            }
            RunningWait::StillPending => return Err(LaunchError::StillPending),
        };
        let outcome = self
            .complete(notification, LifecycleActionResult::Continue)
            .await?;
        let completed = outcome == CompletionOutcome::Completed;
        tracing::info!(
            instance_id = %action.instance_id,
            hook = %action.lifecycle_hook_name,
            asg = %action.auto_scaling_group_name,
            request_id = %notification.request_id,
            instance_state = %instance_state,
            completed,
            "launch into the warm pool completed with CONTINUE"
        );
        let outcome = LaunchOutcome::EnteredWarmPool {
            instance_state,
            waited_seconds: seconds_since(notification.time),
            completed,
        };
        emit_metrics(
            outcome.name(),
            notification,
            None,
            notification.continuation,
        );
        Ok(outcome)
    }

    /// Back from the warm pool, not Ready within the launch timeout, about to be completed
    /// with CONTINUE: the scale-in's drain ends all the same (the instance goes into service;
    /// the scheduler keeps pods off the node while it is NotReady), by the same rule. `node` is the node as the
    /// wait last saw it; when it saw none, the node is looked up afresh. When the cluster has
    /// no node of the instance, nothing of ours is left to undo: the drain's marks live only
    /// on that Node object, and a Node the kubelet registers afresh has none of them. A
    /// lookup that fails fails the invocation before the action is completed, so a retry
    /// looks again.
    pub(super) async fn restore_after_timeout(
        &self,
        client: &kube::Client,
        recorder: &Recorder,
        notification: &LifecycleNotification,
        node: Option<Node>,
    ) -> Result<(Option<Node>, Option<Restored>), LaunchError> {
        let instance_id = &notification.action.instance_id;
        let node = match node {
            Some(node) => Some(node),
            None => find_node(client, &self.context.instances, instance_id)
                .await
                .map_err(LaunchError::NodeLookup)?,
        };
        let Some(node) = node else {
            log_step(
                notification,
                None,
                "back from the warm pool, no node of the instance in the cluster at the launch timeout: the drain's marks went with its Node, nothing to undo",
            );
            return Ok((None, None));
        };
        let (node, restored) = self.restore(client, recorder, notification, node).await?;
        Ok((Some(node), restored))
    }

    /// Back from the warm pool, the launch about to complete with CONTINUE (its node Ready, or
    /// the launch timeout passed): end the scale-in's drain record by the reconciler's rule
    /// and writer ([`restore_returning_node`]), before the action completes (the group counts
    /// the instance in service from then).
    pub(super) async fn restore(
        &self,
        client: &kube::Client,
        recorder: &Recorder,
        notification: &LifecycleNotification,
        node: Node,
    ) -> Result<(Node, Option<Restored>), LaunchError> {
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let nodes: kube::Api<Node> = kube::Api::all(client.clone());
        let restore = restore_returning_node(&nodes, node.clone())
            .await
            .map_err(|source| LaunchError::Restore {
                node: node_name.clone(),
                source,
            })?;
        match restore {
            Restore::Restored { node, restored } => {
                tracing::info!(
                    instance_id = %notification.action.instance_id,
                    node = %node_name,
                    asg = %notification.action.auto_scaling_group_name,
                    went_to_pool_at = restored.went_to_pool_at.as_deref().unwrap_or_default(),
                    uncordoned = restored.undone.uncordoned,
                    unlabelled = restored.undone.unlabelled,
                    untainted = restored.undone.untainted.as_deref().unwrap_or_default(),
                    "node back from the warm pool: the scale-in's drain undone ({})",
                    restored.summary()
                );
                if restored.unknown_changes {
                    publish_event(
                        recorder,
                        &node,
                        EventType::Warning,
                        "WarmPoolReturnUnknownDrain",
                        format!(
                            "Node back from the warm pool with instance {}: its drain checkpoint does not record what the drain changed, so only the checkpoint was removed; uncordon it if the drain cordoned it",
                            notification.action.instance_id
                        ),
                    )
                    .await;
                } else {
                    publish_event(
                        recorder,
                        &node,
                        EventType::Normal,
                        "WarmPoolReturn",
                        format!(
                            "Node back from the warm pool with instance {}: {}",
                            notification.action.instance_id,
                            restored.summary()
                        ),
                    )
                    .await;
                }
                Ok((*node, Some(restored)))
            }
            Restore::NothingOfOurs => {
                log_step(
                    notification,
                    Some(&node_name),
                    "node back from the warm pool carries no drain record of ours for its launch to end (none, one a drain holds, or it changed meanwhile): nothing undone here, the reconciler decides the rest",
                );
                Ok((node, None))
            }
        }
    }
}
