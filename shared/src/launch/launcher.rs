//! The launching hook's story: for each launch notification of this cluster's groups, wait for
//! the instance's node to be Ready ([`super::wait`]), then complete the action
//! ([`super::completion`]).

use std::ops::ControlFlow;

use kube::runtime::events::{Recorder, Reporter};

use super::FUNCTION_NAME;
use super::report::{LaunchError, LaunchOutcome, LaunchReport};
use super::signals::log_step;
use super::wait::WaitEnd;
use crate::aws::{AutoScaling, Instances, LifecycleActionResult, Notifications};
use crate::cluster::connection::KubeConnection;
use crate::lifecycle::handler::{
    Clients, HandledRecord, HookClients, HookContext, HookHandler, Invocation,
};
use crate::lifecycle::notification::{
    Delivery, LifecycleMessage, LifecycleNotification, LifecycleTransition,
};
use crate::lifecycle::scope::ScopeDecision;
use crate::lifecycle::settings::LaunchSettings;

/// Everything an invocation of the launching hook needs, built once per execution
/// environment and borrowed by every invocation.
pub struct Launcher<C: HookClients> {
    pub context: HookContext<C, LaunchSettings>,
}

impl<K, A, I, N> Launcher<Clients<K, A, I, N>>
where
    K: KubeConnection,
    A: AutoScaling,
    I: Instances,
    N: Notifications,
{
    pub fn new(
        kube: K,
        autoscaling: A,
        instances: I,
        notifications: N,
        settings: LaunchSettings,
    ) -> Self {
        Self {
            context: HookContext::new(kube, autoscaling, instances, notifications, settings),
        }
    }
}

impl<C: HookClients> Launcher<C> {
    pub(super) fn settings(&self) -> &LaunchSettings {
        &self.context.settings
    }
}

impl<C: HookClients> HookHandler for Launcher<C> {
    type Outcome = LaunchOutcome;
    type Error = LaunchError;
    type Report = LaunchReport;

    fn hand_over_margin(&self) -> std::time::Duration {
        self.settings().lifecycle.hand_over_margin
    }

    fn report(
        &self,
        records: Vec<HandledRecord<LaunchOutcome, LaunchError>>,
        invocation: &Invocation,
    ) -> Result<LaunchReport, LaunchError> {
        LaunchReport::from_records(records, &invocation.request_id)
    }

    async fn handle_delivery(
        &self,
        delivery: &Delivery,
        invocation: &Invocation,
    ) -> Result<LaunchOutcome, LaunchError> {
        let record = &delivery.location;
        match &delivery.message {
            LifecycleMessage::Test(test) => {
                tracing::info!(
                    record = %record,
                    asg = test.group_name.as_deref().unwrap_or_default(),
                    request_id = test.request_id.as_deref().unwrap_or_default(),
                    "test notification acknowledged; nothing to do"
                );
                Ok(LaunchOutcome::TestNotification)
            }
            LifecycleMessage::UnknownTransition {
                transition,
                group_name,
                instance_id,
            } => {
                tracing::info!(
                    record = %record,
                    transition = %transition,
                    instance_id = instance_id.as_deref().unwrap_or_default(),
                    asg = group_name.as_deref().unwrap_or_default(),
                    "notification for a transition the launching hook does not handle; acknowledged"
                );
                Ok(LaunchOutcome::UnknownTransition {
                    transition: transition.clone(),
                })
            }
            LifecycleMessage::Lifecycle(notification)
                if notification.transition == LifecycleTransition::Launching =>
            {
                // Boxed: the wait's future is deep (watch, heartbeats, timers), and an
                // unboxed one overflows the compiler's layout depth in the binary's `main`.
                Box::pin(self.launch(invocation, delivery, notification)).await
            }
            LifecycleMessage::Lifecycle(notification) => {
                log_step(
                    notification,
                    None,
                    "notification for another transition reached the launching hook; acknowledged, nothing done",
                );
                Ok(LaunchOutcome::OtherTransition {
                    transition: notification.transition.as_str().to_owned(),
                })
            }
        }
    }
}

impl<C: HookClients> Launcher<C> {
    /// One launch: ours or not; into the warm pool without a node; else wait for the node to
    /// be Ready and complete (undoing the scale-in's drain when it comes back from the pool).
    async fn launch(
        &self,
        invocation: &Invocation,
        delivery: &Delivery,
        notification: &LifecycleNotification,
    ) -> Result<LaunchOutcome, LaunchError> {
        log_step(notification, None, "launch notification received");
        if let ControlFlow::Break(outcome) = self.check_scope(invocation, notification).await? {
            return Ok(outcome);
        }
        let route = notification.route;
        if route.is_into_warm_pool() && !self.settings().warm_pool_wait_for_node {
            log_step(
                notification,
                None,
                "launch into the warm pool: completing as soon as the instance runs, without waiting for a node (WARM_POOL_WAIT_FOR_NODE=false)",
            );
            return self.complete_into_warm_pool(invocation, notification).await;
        }
        if route.is_into_warm_pool() {
            log_step(
                notification,
                None,
                "launch into the warm pool: waiting for the node to be Ready (WARM_POOL_WAIT_FOR_NODE=true)",
            );
        } else if route.is_out_of_warm_pool() {
            log_step(
                notification,
                None,
                "launch out of the warm pool: waiting for the node to be Ready, then undoing the scale-in's drain if the node carries ours",
            );
        }

        let client = self.context.kube.client().await?;
        let recorder = self.recorder(&client);
        let waited = self
            .wait_for_node(invocation, delivery, notification, &client)
            .await?;
        match waited {
            WaitEnd::Ready(node) if route.is_out_of_warm_pool() => {
                let (node, restored) = self
                    .restore(&client, &recorder, notification, *node)
                    .await?;
                self.complete_ready(&recorder, notification, &node, restored)
                    .await
            }
            WaitEnd::Ready(node) => {
                self.complete_ready(&recorder, notification, &node, None)
                    .await
            }
            WaitEnd::LaunchTimeout(node)
                if route.is_out_of_warm_pool()
                    && self.settings().timeout_result == LifecycleActionResult::Continue =>
            {
                // CONTINUE puts the instance into service, Ready or not: our drain's marks
                // must go as they do for a node Ready in time, or nothing ever lifts them.
                let (node, restored) = self
                    .restore_after_timeout(&client, &recorder, notification, node.map(|n| *n))
                    .await?;
                self.complete_timed_out(&recorder, notification, node.as_ref(), restored)
                    .await
            }
            WaitEnd::LaunchTimeout(node) => {
                self.complete_timed_out(&recorder, notification, node.as_deref(), None)
                    .await
            }
            WaitEnd::Stopped(outcome) => Ok(outcome),
        }
    }

    /// Whether the notification's group is this cluster's; a foreign one is left alone.
    async fn check_scope(
        &self,
        invocation: &Invocation,
        notification: &LifecycleNotification,
    ) -> Result<ControlFlow<LaunchOutcome>, LaunchError> {
        let action = &notification.action;
        let decision = self
            .context
            .decide_scope(notification, invocation)
            .await
            .map_err(LaunchError::Scope)?;
        match decision {
            ScopeDecision::Foreign(reason) => {
                tracing::info!(
                    instance_id = %action.instance_id,
                    hook = %action.lifecycle_hook_name,
                    asg = %action.auto_scaling_group_name,
                    request_id = %notification.request_id,
                    reason = %reason,
                    "Auto Scaling group is not this cluster's; left alone"
                );
                Ok(ControlFlow::Break(LaunchOutcome::NotOurs {
                    reason: reason.to_string(),
                }))
            }
            ScopeDecision::Ours { evidence } => {
                tracing::debug!(asg = %action.auto_scaling_group_name, evidence, "group is this cluster's");
                Ok(ControlFlow::Continue(()))
            }
        }
    }

    /// The recorder of the Events on the node.
    fn recorder(&self, client: &kube::Client) -> Recorder {
        Recorder::new(
            client.clone(),
            Reporter {
                controller: format!("open-node-manager/{FUNCTION_NAME}"),
                // events.k8s.io/v1 requires a reporting instance: the function's name in Lambda.
                instance: Some(
                    self.settings()
                        .function_name
                        .clone()
                        .unwrap_or_else(|| FUNCTION_NAME.to_owned()),
                ),
            },
        )
    }
}
