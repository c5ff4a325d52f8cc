//! Waiting for a launching instance's node: within the launch timeout (counted from Auto
//! Scaling's own time, so continuations and retries keep it) and this invocation's budget;
//! handing the wait over to a fresh invocation when the budget runs out first.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use super::Launcher;
use super::readiness::{NodeSighting, wait_until_ready};
use super::report::{LaunchError, LaunchOutcome};
use super::signals::{emit_metrics, log_step};
use crate::lifecycle::budget::instant_at;
use crate::lifecycle::hand_over::HandOver;
use crate::lifecycle::handler::{HookClients, Invocation};
use crate::lifecycle::heartbeat::HeartbeatKeeper;
use crate::lifecycle::node::{find_node, is_ready, private_dns_name};
use crate::lifecycle::notification::{Delivery, LifecycleNotification};

/// The least time an invocation must have for waiting before it hands over.
const MIN_WAIT_SLICE: Duration = Duration::from_secs(1);

/// How a wait ended.
pub(super) enum WaitEnd {
    Ready(Box<Node>),
    /// The launch timeout passed; the instance's node as last seen, if it registered.
    LaunchTimeout(Option<Box<Node>>),
    /// Nothing left to do in this invocation (handed over, or the action is gone).
    Stopped(LaunchOutcome),
}

impl<C: HookClients> Launcher<C> {
    /// When the launch timeout runs out: counted from Auto Scaling's own time, so
    /// continuations and retries keep it.
    pub(super) fn launch_deadline(&self, notification: &LifecycleNotification) -> Timestamp {
        notification
            .time
            .checked_add(
                jiff::SignedDuration::try_from(self.settings().launch_timeout)
                    .unwrap_or(jiff::SignedDuration::MAX),
            )
            .unwrap_or(Timestamp::MAX)
    }
}

impl<C: HookClients> Launcher<C> {
    /// Waits, within the launch timeout and this invocation's budget, for the instance's
    /// node to be Ready; hands over when the budget runs out first.
    pub(super) async fn wait_for_node(
        &self,
        invocation: &Invocation,
        delivery: &Delivery,
        notification: &LifecycleNotification,
        client: &kube::Client,
    ) -> Result<WaitEnd, LaunchError> {
        let action = &notification.action;
        let dns_name = private_dns_name(&self.context.instances, &action.instance_id).await;
        let launch_deadline = self.launch_deadline(notification);
        let launch_deadline_at = instant_at(launch_deadline);
        let deadline_passed = Timestamp::now() >= launch_deadline;
        // Handing over at once would republish the notification in a tight loop until the
        // launch timeout: with no time to wait, look once and report the configuration error.
        let no_time_to_wait = !deadline_passed
            && invocation.budget.remaining() < MIN_WAIT_SLICE
            && invocation.budget.hand_over_at() < launch_deadline_at;
        if deadline_passed || no_time_to_wait {
            // A late continuation or delivery, or no time: one look, no wait.
            return self
                .look_once(invocation, notification, client, no_time_to_wait)
                .await;
        }

        let mut keeper = self.context.heartbeat_keeper(notification).await;
        let stop_at = launch_deadline_at.min(invocation.budget.hand_over_at());
        log_step(
            notification,
            dns_name.as_deref(),
            "waiting for the node to register and turn Ready",
        );
        let sighting = NodeSighting::default();
        let wait = tokio::time::timeout_at(
            stop_at,
            wait_until_ready(
                client,
                &action.instance_id,
                dns_name.as_deref(),
                self.settings().launch_timeout,
                &sighting,
            ),
        );
        let waited = keeper.keep_alive(&self.context.autoscaling, wait).await;
        let outcome = match waited {
            Ok(Ok(node)) => return Ok(WaitEnd::Ready(Box::new(node))),
            Ok(Err(_elapsed)) if Instant::now() >= launch_deadline_at => {
                return Ok(WaitEnd::LaunchTimeout(sighting.node().map(Box::new)));
            }
            Err(_gone) => {
                log_step(
                    notification,
                    None,
                    "the lifecycle action is gone (completed elsewhere or expired); stopping",
                );
                LaunchOutcome::ActionGone
            }
            Ok(Err(_elapsed)) => {
                log_step(
                    notification,
                    dns_name.as_deref(),
                    "invocation time running out; handing the wait over",
                );
                self.hand_over(&mut keeper, delivery, notification).await?
            }
        };
        let continuations = match &outcome {
            LaunchOutcome::HandedOver { continuation } => *continuation,
            _ => notification.continuation,
        };
        emit_metrics(outcome.name(), notification, None, continuations);
        Ok(WaitEnd::Stopped(outcome))
    }

    /// No waiting: the launch timeout passed already, or the invocation has no time (a
    /// configuration error, reported unless the node is Ready at the one look).
    async fn look_once(
        &self,
        invocation: &Invocation,
        notification: &LifecycleNotification,
        client: &kube::Client,
        no_time_to_wait: bool,
    ) -> Result<WaitEnd, LaunchError> {
        let action = &notification.action;
        let node = find_node(client, &self.context.instances, &action.instance_id)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(instance_id = %action.instance_id, error = %error, "cannot look up the node");
                None
            });
        match node {
            Some(node) if is_ready(&node) => Ok(WaitEnd::Ready(Box::new(node))),
            _ if no_time_to_wait => Err(LaunchError::NoTimeToWait {
                remaining: invocation.budget.remaining(),
                margin: self.settings().lifecycle.hand_over_margin,
            }),
            node => Ok(WaitEnd::LaunchTimeout(node.map(Box::new))),
        }
    }

    /// Hands the wait to a fresh invocation.
    async fn hand_over(
        &self,
        keeper: &mut HeartbeatKeeper,
        delivery: &Delivery,
        notification: &LifecycleNotification,
    ) -> Result<LaunchOutcome, LaunchError> {
        match self.context.hand_over(keeper, delivery).await? {
            HandOver::Published { continuation, .. } => {
                Ok(LaunchOutcome::HandedOver { continuation })
            }
            HandOver::ActionGone => {
                log_step(notification, None, "the lifecycle action is gone; stopping");
                Ok(LaunchOutcome::ActionGone)
            }
        }
    }
}
