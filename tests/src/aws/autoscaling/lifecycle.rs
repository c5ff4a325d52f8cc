//! The lifecycle-action state machine: an action starts when an instance enters a wait
//! state (its notification sent), a timer applies the hook's default result when the
//! heartbeat or global deadline passes, and ending it (by call or timeout) moves the
//! instance on and records how it ended.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use node_manager::aws::LifecycleActionResult;
use tokio::time::Instant;

use super::notifications::lifecycle_message;
use super::{
    ActiveAction, AsgState, CompletedBy, FakeAutoScaling, GroupInstance, HeartbeatRecord,
    LifecycleCompletion, LifecycleNotice, LifecycleTransition, RETAINED, Route, WarmPoolState,
};
use crate::aws::protocol;
use crate::aws::{FakeAwsError, Shared, lock};

impl FakeAutoScaling {
    /// Starts the launch lifecycle action of `instance_id` (which joins the group in
    /// `Pending:Wait`) and sends the notification to the hook's topic.
    pub fn launch_instance(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        self.start_action(group_name, instance_id, LifecycleTransition::Launching)
    }

    /// Starts the terminate lifecycle action of `instance_id` (`Terminating:Wait`) and sends
    /// the notification to the hook's topic.
    pub fn terminate_instance(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        self.start_action(group_name, instance_id, LifecycleTransition::Terminating)
    }

    /// Auto Scaling's answer to EC2 interrupting a member of `group_name` (a Spot
    /// interruption warning): it terminates the instance at once, as a scale-in would:
    /// through the group's terminating hook (its notification sent) when it has one, else
    /// the instance leaves the group terminated. Returns the hook's notice, if any.
    pub(crate) fn terminate_interrupted(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<Option<LifecycleNotice>, FakeAwsError> {
        if self
            .state()
            .has_hook(group_name, LifecycleTransition::Terminating)
        {
            return self.terminate_instance(group_name, instance_id).map(Some);
        }
        super::launch::terminate_at_once(&self.shared, group_name, instance_id);
        Ok(None)
    }

    fn start_action(
        &self,
        group_name: &str,
        instance_id: &str,
        transition: LifecycleTransition,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        self.start_routed_action(
            group_name,
            instance_id,
            transition,
            Route::plain(transition),
        )
    }

    pub(super) fn start_routed_action(
        &self,
        group_name: &str,
        instance_id: &str,
        transition: LifecycleTransition,
        route: Route,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        let token = protocol::uuid_v4();
        let (hook, message, subject) = {
            let mut state = self.state();
            let scale = state.time_scale;
            let is_member = state
                .groups
                .get(group_name)
                .is_some_and(|record| record.instances.contains_key(instance_id));
            let joined = if is_member { 0 } else { state.next_joined() };
            let record = state
                .groups
                .get_mut(group_name)
                .ok_or_else(|| FakeAwsError::UnknownGroup(group_name.to_owned()))?;
            let hook = record
                .hooks
                .values()
                .find(|hook| hook.transition == transition)
                .cloned()
                .ok_or_else(|| FakeAwsError::NoLifecycleHook {
                    group: group_name.to_owned(),
                    transition: transition.as_str().to_owned(),
                })?;
            let default_zone = || {
                record
                    .group
                    .availability_zones
                    .first()
                    .cloned()
                    .unwrap_or_else(|| format!("{}a", self.shared.account.region))
            };
            // A member keeps its zone and launch configuration; a newcomer gets the group's.
            match record.instances.get_mut(instance_id) {
                Some(member) => member.lifecycle_state = route.wait_state.to_owned(),
                None => {
                    let member = GroupInstance::joining(
                        &record.group,
                        route.wait_state,
                        &default_zone(),
                        joined,
                    );
                    record.instances.insert(instance_id.to_owned(), member);
                }
            }
            let now = Instant::now();
            let heartbeat_timeout = hook.heartbeat_timeout.mul_f64(scale);
            state
                .active
                .retain(|a| !(a.instance_id == instance_id && a.hook_name == hook.name));
            state.active.push(ActiveAction {
                group_name: group_name.to_owned(),
                hook_name: hook.name.clone(),
                instance_id: instance_id.to_owned(),
                token: token.clone(),
                transition,
                route,
                default_result: hook.default_result,
                started: now,
                heartbeat_deadline: now + heartbeat_timeout,
                global_deadline: now + hook.effective_global_timeout().mul_f64(scale),
                heartbeat_timeout,
                heartbeats: 0,
            });
            let message =
                lifecycle_message(&self.shared, group_name, &hook, instance_id, &token, route);
            let subject = format!(
                "Auto Scaling:  Lifecycle action '{}' for instance {instance_id} in progress.",
                transition.word()
            );
            (hook, message, subject)
        };
        spawn_timer(Arc::downgrade(&self.shared), token.clone());
        let delivered_to = hook.notification_target_arn.as_deref().and_then(|topic| {
            crate::aws::sns::deliver(
                &self.shared,
                topic,
                Some(&subject),
                &message,
                BTreeMap::new(),
                crate::aws::sns::PublishSource::AutoScaling,
            )
            .ok()
            .map(|_| topic.to_owned())
        });
        Ok(LifecycleNotice {
            message,
            subject,
            token,
            group_name: group_name.to_owned(),
            hook_name: hook.name,
            instance_id: instance_id.to_owned(),
            transition,
            delivered_to,
        })
    }

    /// Every ended lifecycle action, oldest first.
    pub fn completions(&self) -> Vec<LifecycleCompletion> {
        self.state().completions.clone()
    }

    /// Every accepted heartbeat, oldest first.
    pub fn heartbeats(&self) -> Vec<HeartbeatRecord> {
        self.state().heartbeats.clone()
    }

    /// Whether `instance_id` has a lifecycle action waiting.
    pub fn has_active_action(&self, instance_id: &str) -> bool {
        self.state()
            .active
            .iter()
            .any(|action| action.instance_id == instance_id)
    }

    /// Waits until the lifecycle action of `instance_id` has ended (by call or timeout) and
    /// returns how; `None` after `timeout`.
    pub async fn wait_for_completion(
        &self,
        instance_id: &str,
        timeout: Duration,
    ) -> Option<LifecycleCompletion> {
        let mut changes = self.shared.autoscaling.changed.subscribe();
        let find = || {
            self.state()
                .completions
                .iter()
                .rev()
                .find(|c| c.instance_id == instance_id)
                .cloned()
        };
        tokio::time::timeout(timeout, async {
            loop {
                if let Some(completion) = find() {
                    return Some(completion);
                }
                if changes.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await
        .ok()
        .flatten()
    }
}

/// Expires the action with `token` when its heartbeat or global deadline passes.
fn spawn_timer(shared: Weak<Shared>, token: String) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        loop {
            let deadline = {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let state = lock(&shared.autoscaling.state);
                match state.active.iter().find(|a| a.token == token) {
                    Some(action) => action.heartbeat_deadline.min(action.global_deadline),
                    None => return,
                }
            };
            tokio::time::sleep_until(deadline).await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let now = Instant::now();
            let mut state = lock(&shared.autoscaling.state);
            let Some(index) = state.active.iter().position(|a| a.token == token) else {
                return;
            };
            let action = &state.active[index];
            let by = if now >= action.global_deadline {
                CompletedBy::GlobalTimeout
            } else if now >= action.heartbeat_deadline {
                CompletedBy::HeartbeatTimeout
            } else {
                continue;
            };
            let result = action.default_result;
            end_action(&shared, &mut state, index, result, by);
            drop(state);
            super::launch::announce_departures(&shared);
            return;
        }
    });
}

/// Ends the action at `index`: records it and moves the instance on, as Auto Scaling does.
/// An instance that leaves terminated is queued for the terminated callbacks: the caller
/// announces it (`launch::announce_departures`) once it has unlocked the state.
pub(super) fn end_action(
    shared: &Shared,
    state: &mut AsgState,
    index: usize,
    result: LifecycleActionResult,
    by: CompletedBy,
) {
    let action = state.active.remove(index);
    if action.route.destination == Route::WARM_POOL {
        // Into the pool (launched, or scaled in with reuse): whatever the result, a
        // terminating instance goes to the pool; an abandoned launch is terminated.
        let pool = state
            .warm_pools
            .get(&action.group_name)
            .copied()
            .unwrap_or(WarmPoolState::Stopped);
        let abandoned = action.transition == LifecycleTransition::Launching
            && result == LifecycleActionResult::Abandon;
        if let Some(record) = state.groups.get_mut(&action.group_name) {
            if abandoned {
                record.instances.remove(&action.instance_id);
            } else if let Some(instance) = record.instances.get_mut(&action.instance_id) {
                instance.lifecycle_state = pool.lifecycle_state().to_owned();
            }
        }
        if abandoned {
            crate::aws::ec2::keep_group_tag(shared, &action.instance_id, &action.group_name);
            crate::aws::ec2::mark_terminated(shared, &action.instance_id);
            state.departed.push(action.instance_id.clone());
        } else {
            crate::aws::ec2::set_state_of(shared, &action.instance_id, pool.ec2_state());
        }
        record_completion(shared, state, action, result, by);
        return;
    }
    let terminating = action.transition == LifecycleTransition::Terminating;
    let abandoned = result == LifecycleActionResult::Abandon;
    // The instance lifecycle policy: an abandoned termination keeps the instance, running.
    let retained = terminating
        && abandoned
        && state
            .groups
            .get(&action.group_name)
            .is_some_and(|record| record.group.retain_on_abandon);
    let leaves_group = (terminating || abandoned) && !retained;
    if let Some(record) = state.groups.get_mut(&action.group_name) {
        if leaves_group {
            record.instances.remove(&action.instance_id);
        } else if let Some(instance) = record.instances.get_mut(&action.instance_id) {
            instance.lifecycle_state = if retained { RETAINED } else { "InService" }.to_owned();
        }
    }
    if leaves_group {
        crate::aws::ec2::keep_group_tag(shared, &action.instance_id, &action.group_name);
        crate::aws::ec2::mark_terminated(shared, &action.instance_id);
        state.departed.push(action.instance_id.clone());
    }
    record_completion(shared, state, action, result, by);
}

fn record_completion(
    shared: &Shared,
    state: &mut AsgState,
    action: ActiveAction,
    result: LifecycleActionResult,
    by: CompletedBy,
) {
    state.completions.push(LifecycleCompletion {
        group_name: action.group_name,
        hook_name: action.hook_name,
        instance_id: action.instance_id,
        token: action.token,
        transition: action.transition,
        result,
        by,
        heartbeats: action.heartbeats,
        after: action.started.elapsed(),
    });
    shared.autoscaling.changed.send_modify(|n| *n += 1);
}
