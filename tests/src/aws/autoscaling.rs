//! Fake Auto Scaling: groups, lifecycle hooks and the lifecycle-action state machine.
//!
//! A lifecycle action lives from the moment an instance enters `Pending:Wait` or
//! `Terminating:Wait` until it is completed by a call or times out. Each heartbeat restarts
//! the heartbeat timeout; the global timeout (`min(100 × heartbeat, 48 h)` unless set) does not
//! move. On expiry the hook's default result is applied, exactly as Auto Scaling does, and from
//! then on every call about the action fails with "No active Lifecycle Action found".
//! Timeouts are declared in AWS terms (what `DescribeLifecycleHooks` reports) and run scaled by
//! [`FakeAutoScaling::set_time_scale`], so a one-hour hook can expire in a test in 100 ms.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use node_manager::aws::LifecycleActionResult;
use tokio::time::Instant;

use super::protocol::{self, ApiError, QueryParams, Reply, element, xml_escape};
use super::{FakeAwsError, Shared, lock};

/// Auto Scaling's cap on a lifecycle action's total wait.
const MAX_GLOBAL_TIMEOUT: Duration = Duration::from_secs(48 * 3600);

/// The instance transition a hook pauses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LifecycleTransition {
    Launching,
    Terminating,
}

impl LifecycleTransition {
    /// `autoscaling:EC2_INSTANCE_LAUNCHING` / `autoscaling:EC2_INSTANCE_TERMINATING`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Launching => "autoscaling:EC2_INSTANCE_LAUNCHING",
            Self::Terminating => "autoscaling:EC2_INSTANCE_TERMINATING",
        }
    }

    fn word(self) -> &'static str {
        match self {
            Self::Launching => "LAUNCHING",
            Self::Terminating => "TERMINATING",
        }
    }

    fn wait_state(self) -> &'static str {
        match self {
            Self::Launching => "Pending:Wait",
            Self::Terminating => "Terminating:Wait",
        }
    }
}

impl std::fmt::Display for LifecycleTransition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state instances wait in while in a group's warm pool (`PoolState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmPoolState {
    Stopped,
    Running,
    Hibernated,
}

impl WarmPoolState {
    /// The Auto Scaling lifecycle state of an instance waiting in the pool.
    pub fn lifecycle_state(self) -> &'static str {
        match self {
            Self::Stopped => "Warmed:Stopped",
            Self::Running => "Warmed:Running",
            Self::Hibernated => "Warmed:Hibernated",
        }
    }

    /// What EC2 reports for it (a hibernated instance is `stopped` in EC2).
    fn ec2_state(self) -> super::ec2::InstanceState {
        match self {
            Self::Running => super::ec2::InstanceState::Running,
            Self::Stopped | Self::Hibernated => super::ec2::InstanceState::Stopped,
        }
    }
}

/// Where a lifecycle action moves an instance: the notification's `Origin` and `Destination`
/// (`EC2`, `AutoScalingGroup`, `WarmPool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    origin: &'static str,
    destination: &'static str,
    /// The lifecycle state the instance waits in.
    wait_state: &'static str,
}

impl Route {
    const WARM_POOL: &'static str = "WarmPool";

    fn plain(transition: LifecycleTransition) -> Self {
        let (origin, destination) = match transition {
            LifecycleTransition::Launching => ("EC2", "AutoScalingGroup"),
            LifecycleTransition::Terminating => ("AutoScalingGroup", "EC2"),
        };
        Self {
            origin,
            destination,
            wait_state: transition.wait_state(),
        }
    }
}

/// An Auto Scaling group as a test declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeAutoScalingGroup {
    pub name: String,
    pub min_size: u32,
    pub max_size: u32,
    pub desired_capacity: u32,
    pub availability_zones: Vec<String>,
    /// Tags, as `DescribeAutoScalingGroups` returns them (all `PropagateAtLaunch=true`).
    pub tags: BTreeMap<String, String>,
    /// `HealthCheckGracePeriod` as reported (15 s unless set).
    pub health_check_grace_period: Duration,
}

impl FakeAutoScalingGroup {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            min_size: 0,
            max_size: 10,
            desired_capacity: 0,
            availability_zones: Vec::new(),
            tags: BTreeMap::new(),
            health_check_grace_period: Duration::from_secs(15),
        }
    }

    pub fn health_check_grace_period(mut self, grace_period: Duration) -> Self {
        self.health_check_grace_period = grace_period;
        self
    }

    pub fn tag(mut self, key: &str, value: &str) -> Self {
        self.tags.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn availability_zones(mut self, zones: &[&str]) -> Self {
        self.availability_zones = zones.iter().map(|z| (*z).to_owned()).collect();
        self
    }

    pub fn size(mut self, min: u32, desired: u32, max: u32) -> Self {
        self.min_size = min;
        self.desired_capacity = desired;
        self.max_size = max;
        self
    }
}

/// A lifecycle hook. Defaults are AWS's: heartbeat 3600 s, default result `ABANDON`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLifecycleHook {
    pub name: String,
    pub transition: LifecycleTransition,
    /// As declared (and reported); runs scaled by the time scale.
    pub heartbeat_timeout: Duration,
    /// `None`: `min(100 × heartbeat, 48 h)`, as AWS computes it.
    pub global_timeout: Option<Duration>,
    pub default_result: LifecycleActionResult,
    /// The SNS topic the notification goes to (delivered when the fake SNS has it).
    pub notification_target_arn: Option<String>,
    pub role_arn: Option<String>,
    pub notification_metadata: Option<String>,
}

impl FakeLifecycleHook {
    pub fn new(name: &str, transition: LifecycleTransition) -> Self {
        Self {
            name: name.to_owned(),
            transition,
            heartbeat_timeout: Duration::from_secs(3600),
            global_timeout: None,
            default_result: LifecycleActionResult::Abandon,
            notification_target_arn: None,
            role_arn: None,
            notification_metadata: None,
        }
    }

    pub fn launching(name: &str) -> Self {
        Self::new(name, LifecycleTransition::Launching)
    }

    pub fn terminating(name: &str) -> Self {
        Self::new(name, LifecycleTransition::Terminating)
    }

    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    pub fn global_timeout(mut self, timeout: Duration) -> Self {
        self.global_timeout = Some(timeout);
        self
    }

    pub fn default_result(mut self, result: LifecycleActionResult) -> Self {
        self.default_result = result;
        self
    }

    pub fn notification_target(mut self, topic_arn: &str) -> Self {
        self.notification_target_arn = Some(topic_arn.to_owned());
        self
    }

    pub fn role(mut self, role_arn: &str) -> Self {
        self.role_arn = Some(role_arn.to_owned());
        self
    }

    pub fn metadata(mut self, metadata: &str) -> Self {
        self.notification_metadata = Some(metadata.to_owned());
        self
    }

    /// The global timeout AWS applies.
    pub fn effective_global_timeout(&self) -> Duration {
        self.global_timeout
            .unwrap_or_else(|| (self.heartbeat_timeout * 100).min(MAX_GLOBAL_TIMEOUT))
    }
}

/// The lifecycle notification Auto Scaling sent when an action started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleNotice {
    /// The notification JSON exactly as Auto Scaling publishes it (the SNS `Message`).
    pub message: String,
    /// The SNS subject Auto Scaling uses.
    pub subject: String,
    pub token: String,
    pub group_name: String,
    pub hook_name: String,
    pub instance_id: String,
    pub transition: LifecycleTransition,
    /// The topic it was delivered to, when the hook has a target the fake SNS knows.
    pub delivered_to: Option<String>,
}

/// How a lifecycle action ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletedBy {
    /// `CompleteLifecycleAction`.
    Call,
    /// No heartbeat or completion within the heartbeat timeout: default result applied.
    HeartbeatTimeout,
    /// The global timeout passed: default result applied.
    GlobalTimeout,
}

/// The end of one lifecycle action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleCompletion {
    pub group_name: String,
    pub hook_name: String,
    pub instance_id: String,
    pub token: String,
    pub transition: LifecycleTransition,
    pub result: LifecycleActionResult,
    pub by: CompletedBy,
    /// Heartbeats recorded for the action.
    pub heartbeats: u32,
    /// Real time since the action started.
    pub after: Duration,
}

/// One accepted `RecordLifecycleActionHeartbeat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatRecord {
    pub group_name: String,
    pub hook_name: String,
    pub instance_id: String,
    pub token: String,
    /// Real time since the action started.
    pub after: Duration,
}

struct GroupRecord {
    group: FakeAutoScalingGroup,
    arn: String,
    created: jiff::Timestamp,
    hooks: BTreeMap<String, FakeLifecycleHook>,
    /// Instance id → (lifecycle state, availability zone).
    instances: BTreeMap<String, (String, String)>,
}

struct ActiveAction {
    group_name: String,
    hook_name: String,
    instance_id: String,
    token: String,
    transition: LifecycleTransition,
    route: Route,
    default_result: LifecycleActionResult,
    started: Instant,
    heartbeat_deadline: Instant,
    global_deadline: Instant,
    /// The scaled heartbeat timeout, re-armed by each heartbeat.
    heartbeat_timeout: Duration,
    heartbeats: u32,
}

pub(crate) struct AsgState {
    groups: BTreeMap<String, GroupRecord>,
    /// Groups with a warm pool, and the state its instances wait in.
    warm_pools: BTreeMap<String, WarmPoolState>,
    active: Vec<ActiveAction>,
    completions: Vec<LifecycleCompletion>,
    heartbeats: Vec<HeartbeatRecord>,
    time_scale: f64,
    /// Node repair: instances marked `Unhealthy` by `SetInstanceHealth`.
    unhealthy: std::collections::BTreeSet<String>,
    /// Node repair: replacements launched for unhealthy instances, oldest first.
    health_replacements: Vec<HealthReplacement>,
}

pub(crate) struct AutoScalingShared {
    state: Mutex<AsgState>,
    /// Bumped on every completion, so waiters wake.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for AutoScalingShared {
    fn default() -> Self {
        Self {
            state: Mutex::new(AsgState {
                groups: BTreeMap::new(),
                warm_pools: BTreeMap::new(),
                active: Vec::new(),
                completions: Vec::new(),
                heartbeats: Vec::new(),
                time_scale: 1.0,
                unhealthy: std::collections::BTreeSet::new(),
                health_replacements: Vec::new(),
            }),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// Handle on the fake Auto Scaling.
#[derive(Clone)]
pub struct FakeAutoScaling {
    shared: Arc<Shared>,
}

impl FakeAutoScaling {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, AsgState> {
        lock(&self.shared.autoscaling.state)
    }

    /// Real duration = declared duration × `scale` for actions started (and heartbeats
    /// recorded) from now on. `0.001` turns an hour into 3.6 s.
    pub fn set_time_scale(&self, scale: f64) {
        self.state().time_scale = scale.max(0.0);
    }

    /// Adds (or replaces) a group; its hooks and instances are kept on replace.
    pub fn add_group(&self, group: FakeAutoScalingGroup) {
        let account = &self.shared.account;
        let mut state = self.state();
        let arn = format!(
            "arn:{}:autoscaling:{}:{}:autoScalingGroup:{}:autoScalingGroupName/{}",
            account.partition,
            account.region,
            account.account_id,
            protocol::uuid_v4(),
            group.name
        );
        match state.groups.get_mut(&group.name) {
            Some(record) => record.group = group,
            None => {
                state.groups.insert(
                    group.name.clone(),
                    GroupRecord {
                        group,
                        arn,
                        created: jiff::Timestamp::now(),
                        hooks: BTreeMap::new(),
                        instances: BTreeMap::new(),
                    },
                );
            }
        }
    }

    /// Adds (or replaces) a lifecycle hook of `group_name`.
    pub fn add_hook(&self, group_name: &str, hook: FakeLifecycleHook) -> Result<(), FakeAwsError> {
        let mut state = self.state();
        let record = state
            .groups
            .get_mut(group_name)
            .ok_or_else(|| FakeAwsError::UnknownGroup(group_name.to_owned()))?;
        record.hooks.insert(hook.name.clone(), hook);
        Ok(())
    }

    /// Puts an instance in the group as `InService`, without any lifecycle action.
    pub fn add_instance(
        &self,
        group_name: &str,
        instance_id: &str,
        availability_zone: &str,
    ) -> Result<(), FakeAwsError> {
        let mut state = self.state();
        let record = state
            .groups
            .get_mut(group_name)
            .ok_or_else(|| FakeAwsError::UnknownGroup(group_name.to_owned()))?;
        record.instances.insert(
            instance_id.to_owned(),
            ("InService".to_owned(), availability_zone.to_owned()),
        );
        Ok(())
    }

    /// The instance's lifecycle state in the group (`Pending:Wait`, `InService`,
    /// `Terminating:Wait`, ...), `None` once it left the group.
    pub fn instance_state(&self, group_name: &str, instance_id: &str) -> Option<String> {
        self.state()
            .groups
            .get(group_name)
            .and_then(|record| record.instances.get(instance_id))
            .map(|(state, _)| state.clone())
    }

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

    /// Gives the group a warm pool whose instances wait in `state` (`PutWarmPool`).
    pub fn set_warm_pool(&self, group_name: &str, state: WarmPoolState) {
        self.state().warm_pools.insert(group_name.to_owned(), state);
    }

    /// Launches `instance_id` into the group's warm pool: it waits in `Warmed:Pending:Wait`
    /// (notification `EC2` -> `WarmPool`); once completed it is stopped, hibernated or kept
    /// running as the pool's state says, and not in service.
    pub fn launch_into_warm_pool(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        self.start_routed_action(
            group_name,
            instance_id,
            LifecycleTransition::Launching,
            Route {
                origin: "EC2",
                destination: Route::WARM_POOL,
                wait_state: "Warmed:Pending:Wait",
            },
        )
    }

    /// Scale-out from the warm pool: the pooled instance starts (EC2 `running`) and waits in
    /// `Pending:Wait` (notification `WarmPool` -> `AutoScalingGroup`), then goes in service.
    pub fn launch_from_warm_pool(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        super::ec2::set_state_of(
            &self.shared,
            instance_id,
            super::ec2::InstanceState::Running,
        );
        self.start_routed_action(
            group_name,
            instance_id,
            LifecycleTransition::Launching,
            Route {
                origin: Route::WARM_POOL,
                destination: "AutoScalingGroup",
                wait_state: "Pending:Wait",
            },
        )
    }

    /// Scale-in with instance reuse: the in-service instance goes back to the warm pool
    /// instead of terminating. The terminating hook pauses it in `Warmed:Pending:Wait`
    /// (notification `AutoScalingGroup` -> `WarmPool`); once completed it waits in the pool.
    pub fn scale_in_to_warm_pool(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        self.start_routed_action(
            group_name,
            instance_id,
            LifecycleTransition::Terminating,
            Route {
                origin: "AutoScalingGroup",
                destination: Route::WARM_POOL,
                wait_state: "Warmed:Pending:Wait",
            },
        )
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

    fn start_routed_action(
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
            let zone = record
                .instances
                .get(instance_id)
                .map(|(_, zone)| zone.clone())
                .or_else(|| record.group.availability_zones.first().cloned())
                .unwrap_or_else(|| format!("{}a", self.shared.account.region));
            record
                .instances
                .insert(instance_id.to_owned(), (route.wait_state.to_owned(), zone));
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
            super::sns::deliver(
                &self.shared,
                topic,
                Some(&subject),
                &message,
                BTreeMap::new(),
                super::sns::PublishSource::AutoScaling,
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

    /// Sends the `autoscaling:TEST_NOTIFICATION` Auto Scaling sends to a hook's target when
    /// the hook is created, and returns its message.
    pub fn send_test_notification(
        &self,
        group_name: &str,
        hook_name: &str,
    ) -> Result<String, FakeAwsError> {
        let (arn, target) = {
            let state = self.state();
            let record = state
                .groups
                .get(group_name)
                .ok_or_else(|| FakeAwsError::UnknownGroup(group_name.to_owned()))?;
            let target = record
                .hooks
                .get(hook_name)
                .and_then(|hook| hook.notification_target_arn.clone());
            (record.arn.clone(), target)
        };
        let account = &self.shared.account;
        let message = format!(
            "{{\"AccountId\":{},\"RequestId\":{},\"AutoScalingGroupARN\":{},\"AutoScalingGroupName\":{},\"Service\":\"AWS Auto Scaling\",\"Event\":\"autoscaling:TEST_NOTIFICATION\",\"Time\":{}}}",
            json_string(&account.account_id),
            json_string(&protocol::uuid_v4()),
            json_string(&arn),
            json_string(group_name),
            json_string(&protocol::timestamp_millis(jiff::Timestamp::now())),
        );
        if let Some(topic) = target {
            let subject = format!("Auto Scaling: test notification for group \"{group_name}\"");
            super::sns::deliver(
                &self.shared,
                &topic,
                Some(&subject),
                &message,
                BTreeMap::new(),
                super::sns::PublishSource::AutoScaling,
            )?;
        }
        Ok(message)
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

fn json_string(value: &str) -> String {
    serde_json::Value::from(value).to_string()
}

/// The notification in Auto Scaling's field order.
fn lifecycle_message(
    shared: &Shared,
    group_name: &str,
    hook: &FakeLifecycleHook,
    instance_id: &str,
    token: &str,
    route: Route,
) -> String {
    let (origin, destination) = (route.origin, route.destination);
    let mut message = format!(
        "{{\"Origin\":{},\"Destination\":{},\"Service\":\"AWS Auto Scaling\",\"Time\":{},\"AccountId\":{},\"LifecycleTransition\":{},\"RequestId\":{},\"LifecycleActionToken\":{},\"EC2InstanceId\":{},\"LifecycleHookName\":{},\"AutoScalingGroupName\":{}",
        json_string(origin),
        json_string(destination),
        json_string(&protocol::timestamp_millis(jiff::Timestamp::now())),
        json_string(&shared.account.account_id),
        json_string(hook.transition.as_str()),
        json_string(&protocol::uuid_v4()),
        json_string(token),
        json_string(instance_id),
        json_string(&hook.name),
        json_string(group_name),
    );
    if let Some(metadata) = &hook.notification_metadata {
        message.push_str(",\"NotificationMetadata\":");
        message.push_str(&json_string(metadata));
    }
    message.push('}');
    message
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
            return;
        }
    });
}

/// Ends the action at `index`: records it and moves the instance on, as Auto Scaling does.
fn end_action(
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
                instance.0 = pool.lifecycle_state().to_owned();
            }
        }
        if abandoned {
            super::ec2::mark_terminated(shared, &action.instance_id);
        } else {
            super::ec2::set_state_of(shared, &action.instance_id, pool.ec2_state());
        }
        record_completion(shared, state, action, result, by);
        return;
    }
    let leaves_group = action.transition == LifecycleTransition::Terminating
        || result == LifecycleActionResult::Abandon;
    if let Some(record) = state.groups.get_mut(&action.group_name) {
        if leaves_group {
            record.instances.remove(&action.instance_id);
        } else if let Some(instance) = record.instances.get_mut(&action.instance_id) {
            instance.0 = "InService".to_owned();
        }
    }
    if leaves_group {
        super::ec2::mark_terminated(shared, &action.instance_id);
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

pub(crate) fn dispatch(
    shared: &Arc<Shared>,
    operation: &str,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    match operation {
        "DescribeAutoScalingInstances" => describe_auto_scaling_instances(shared, params),
        "SetInstanceHealth" => set_instance_health(shared, params),
        "CompleteLifecycleAction" => complete_lifecycle_action(shared, params),
        "RecordLifecycleActionHeartbeat" => record_heartbeat(shared, params),
        "DescribeLifecycleHooks" => describe_lifecycle_hooks(shared, params),
        "DescribeAutoScalingGroups" => describe_groups(shared, params),
        other => Err(ApiError::new(
            400,
            "InvalidAction",
            format!("The action {other} is not valid for this web service."),
        )),
    }
}

fn required<'a>(params: &'a QueryParams, name: &str) -> Result<&'a str, ApiError> {
    params.get(name).map(String::as_str).ok_or_else(|| {
        ApiError::validation(format!(
            "1 validation error detected: Value null at '{}' failed to satisfy constraint: Member must not be null",
            lower_first(name)
        ))
    })
}

fn lower_first(name: &str) -> String {
    let mut chars = name.chars();
    chars
        .next()
        .map(|c| c.to_ascii_lowercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// The index of the active action a call addresses, or AWS's "No active Lifecycle Action"
/// error naming the token when one was given, else the instance id.
fn find_action(state: &AsgState, params: &QueryParams) -> Result<usize, ApiError> {
    let group = required(params, "AutoScalingGroupName")?;
    let hook = required(params, "LifecycleHookName")?;
    let token = params.get("LifecycleActionToken");
    let instance = params.get("InstanceId");
    if token.is_none() && instance.is_none() {
        return Err(ApiError::validation(
            "Either LifecycleActionToken or InstanceId must be specified.",
        ));
    }
    state
        .active
        .iter()
        .position(|a| {
            a.group_name == group
                && a.hook_name == hook
                && token.is_none_or(|t| *t == a.token)
                && instance.is_none_or(|i| *i == a.instance_id)
        })
        .ok_or_else(|| match (token, instance) {
            (Some(token), _) => ApiError::validation(format!(
                "No active Lifecycle Action found with token {token}"
            )),
            (None, Some(instance)) => ApiError::validation(format!(
                "No active Lifecycle Action found with instance ID {instance}"
            )),
            (None, None) => ApiError::validation("No active Lifecycle Action found"),
        })
}

fn complete_lifecycle_action(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let raw_result = required(params, "LifecycleActionResult")?;
    let result = match raw_result {
        "CONTINUE" => LifecycleActionResult::Continue,
        "ABANDON" => LifecycleActionResult::Abandon,
        other => {
            return Err(ApiError::validation(format!(
                "Invalid value '{other}' for LifecycleActionResult: valid values are CONTINUE and ABANDON"
            )));
        }
    };
    let mut state = lock(&shared.autoscaling.state);
    let index = find_action(&state, params)?;
    end_action(shared, &mut state, index, result, CompletedBy::Call);
    Ok(Reply::Xml(String::new()))
}

fn record_heartbeat(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let mut state = lock(&shared.autoscaling.state);
    let index = find_action(&state, params)?;
    let action = &mut state.active[index];
    let now = Instant::now();
    action.heartbeat_deadline = (now + action.heartbeat_timeout).min(action.global_deadline);
    action.heartbeats += 1;
    let record = HeartbeatRecord {
        group_name: action.group_name.clone(),
        hook_name: action.hook_name.clone(),
        instance_id: action.instance_id.clone(),
        token: action.token.clone(),
        after: action.started.elapsed(),
    };
    state.heartbeats.push(record);
    Ok(Reply::Xml(String::new()))
}

fn describe_lifecycle_hooks(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let group_name = required(params, "AutoScalingGroupName")?;
    let wanted = protocol::query_list(params, "LifecycleHookNames");
    let state = lock(&shared.autoscaling.state);
    let record = state
        .groups
        .get(group_name)
        .ok_or_else(|| ApiError::validation(format!("Group {group_name} not found")))?;
    let mut members = String::new();
    for hook in record.hooks.values() {
        if !wanted.is_empty() && !wanted.contains(&hook.name) {
            continue;
        }
        members.push_str("<member>");
        members.push_str(&element("AutoScalingGroupName", group_name));
        members.push_str(&element("LifecycleHookName", &hook.name));
        members.push_str(&element("LifecycleTransition", hook.transition.as_str()));
        if let Some(target) = &hook.notification_target_arn {
            members.push_str(&element("NotificationTargetARN", target));
        }
        if let Some(role) = &hook.role_arn {
            members.push_str(&element("RoleARN", role));
        }
        if let Some(metadata) = &hook.notification_metadata {
            members.push_str(&element("NotificationMetadata", metadata));
        }
        members.push_str(&format!(
            "<HeartbeatTimeout>{}</HeartbeatTimeout><GlobalTimeout>{}</GlobalTimeout>",
            hook.heartbeat_timeout.as_secs(),
            hook.effective_global_timeout().as_secs()
        ));
        members.push_str(&element("DefaultResult", hook.default_result.as_str()));
        members.push_str("</member>");
    }
    Ok(Reply::Xml(format!(
        "<LifecycleHooks>{members}</LifecycleHooks>"
    )))
}

/// Whether a group passes the `DescribeAutoScalingGroups` filters (`tag:<key>`, `tag-key`,
/// `tag-value`); several filters must all match, several values of one filter any.
fn group_matches(group: &FakeAutoScalingGroup, filters: &[(String, Vec<String>)]) -> bool {
    filters.iter().all(|(name, values)| {
        if let Some(key) = name.strip_prefix("tag:") {
            group.tags.get(key).is_some_and(|v| values.contains(v))
        } else if name == "tag-key" {
            group.tags.keys().any(|k| values.contains(k))
        } else if name == "tag-value" {
            group.tags.values().any(|v| values.contains(v))
        } else {
            false
        }
    })
}

fn describe_groups(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let names = protocol::query_list(params, "AutoScalingGroupNames");
    let mut filters = Vec::new();
    for index in 1.. {
        let Some(name) = params.get(&format!("Filters.member.{index}.Name")) else {
            break;
        };
        let values = protocol::query_list(params, &format!("Filters.member.{index}.Values"));
        filters.push((name.clone(), values));
    }
    let state = lock(&shared.autoscaling.state);
    let mut members = String::new();
    for record in state.groups.values() {
        let group = &record.group;
        if !names.is_empty() && !names.contains(&group.name) {
            continue;
        }
        if !group_matches(group, &filters) {
            continue;
        }
        members.push_str("<member>");
        members.push_str(&element("AutoScalingGroupName", &group.name));
        members.push_str(&element("AutoScalingGroupARN", &record.arn));
        members.push_str(&format!(
            "<MinSize>{}</MinSize><MaxSize>{}</MaxSize><DesiredCapacity>{}</DesiredCapacity><DefaultCooldown>300</DefaultCooldown>",
            group.min_size, group.max_size, group.desired_capacity
        ));
        members.push_str("<AvailabilityZones>");
        for zone in &group.availability_zones {
            members.push_str(&element("member", zone));
        }
        members.push_str("</AvailabilityZones><HealthCheckType>EC2</HealthCheckType>");
        members.push_str(&element(
            "HealthCheckGracePeriod",
            &group.health_check_grace_period.as_secs().to_string(),
        ));
        members.push_str("<Instances>");
        for (instance_id, (lifecycle_state, zone)) in &record.instances {
            members.push_str("<member>");
            members.push_str(&element("InstanceId", instance_id));
            members.push_str(&element("AvailabilityZone", zone));
            members.push_str(&element("LifecycleState", lifecycle_state));
            let health = if state.unhealthy.contains(instance_id) {
                "Unhealthy"
            } else {
                "Healthy"
            };
            members.push_str(&element("HealthStatus", health));
            members.push_str("<ProtectedFromScaleIn>false</ProtectedFromScaleIn></member>");
        }
        members.push_str("</Instances>");
        members.push_str(&element(
            "CreatedTime",
            &protocol::timestamp_millis(record.created),
        ));
        members.push_str("<Tags>");
        for (key, value) in &group.tags {
            members.push_str(&format!(
                "<member><ResourceId>{}</ResourceId><ResourceType>auto-scaling-group</ResourceType>{}{}<PropagateAtLaunch>true</PropagateAtLaunch></member>",
                xml_escape(&group.name),
                element("Key", key),
                element("Value", value)
            ));
        }
        members.push_str("</Tags><NewInstancesProtectedFromScaleIn>false</NewInstancesProtectedFromScaleIn></member>");
    }
    Ok(Reply::Xml(format!(
        "<AutoScalingGroups>{members}</AutoScalingGroups>"
    )))
}

// ---------------------------------------------------------------- instance health (node repair)

/// A replacement Auto Scaling launched for an instance marked unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReplacement {
    pub group_name: String,
    pub unhealthy_instance_id: String,
    pub replacement_instance_id: String,
    /// The replacement's node name (its private DNS name in the fake EC2).
    pub replacement_node: String,
}

impl FakeAutoScaling {
    /// Every replacement launched for an instance marked unhealthy, oldest first.
    pub fn health_replacements(&self) -> Vec<HealthReplacement> {
        self.state().health_replacements.clone()
    }

    /// Waits until `instance_id` was marked unhealthy and its replacement launched.
    pub async fn wait_for_health_replacement(
        &self,
        instance_id: &str,
        timeout: Duration,
    ) -> Option<HealthReplacement> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self
                .health_replacements()
                .into_iter()
                .find(|r| r.unhealthy_instance_id == instance_id);
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The group an instance belongs to, with its lifecycle state and zone.
fn membership(state: &AsgState, instance_id: &str) -> Option<(String, String, String)> {
    state.groups.values().find_map(|record| {
        record
            .instances
            .get(instance_id)
            .map(|(lifecycle, zone)| (record.group.name.clone(), lifecycle.clone(), zone.clone()))
    })
}

/// `DescribeAutoScalingInstances`: at most 50 ids and 50 records per call, as AWS allows;
/// health in the API's capitals (`HEALTHY` / `UNHEALTHY`).
fn describe_auto_scaling_instances(
    shared: &Shared,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let ids = protocol::query_list(params, "InstanceIds");
    if ids.len() > 50 {
        return Err(ApiError::validation(format!(
            "1 validation error detected: Value at 'instanceIds' failed to satisfy constraint: Member must have length less than or equal to 50 ({} given)",
            ids.len()
        )));
    }
    if let Some(max) = params.get("MaxRecords")
        && max.parse::<u32>().map_or(true, |m| m == 0 || m > 50)
    {
        return Err(ApiError::validation(format!(
            "MaxRecords {max} must be between 1 and 50"
        )));
    }
    let state = lock(&shared.autoscaling.state);
    let mut members = String::new();
    for id in &ids {
        let Some((group, lifecycle, zone)) = membership(&state, id) else {
            continue;
        };
        let health = if state.unhealthy.contains(id) {
            "UNHEALTHY"
        } else {
            "HEALTHY"
        };
        members.push_str("<member>");
        members.push_str(&element("InstanceId", id));
        members.push_str(&element("AutoScalingGroupName", &group));
        members.push_str(&element("AvailabilityZone", &zone));
        members.push_str(&element("LifecycleState", &lifecycle));
        members.push_str(&element("HealthStatus", health));
        members.push_str("<ProtectedFromScaleIn>false</ProtectedFromScaleIn></member>");
    }
    Ok(Reply::Xml(format!(
        "<AutoScalingInstances>{members}</AutoScalingInstances>"
    )))
}

/// `SetInstanceHealth`: `Unhealthy` takes an `InService` instance out of service as Auto
/// Scaling does: it terminates through the group's terminate hook (`Terminating:Wait`, the
/// notification sent) and a replacement launches through the launch hook (`Pending:Wait`).
/// Without a hook the instance goes (or the replacement is `InService`) at once.
fn set_instance_health(shared: &Arc<Shared>, params: &QueryParams) -> Result<Reply, ApiError> {
    let instance_id = required(params, "InstanceId")?;
    let health = required(params, "HealthStatus")?;
    if !matches!(health, "Healthy" | "Unhealthy") {
        return Err(ApiError::validation(format!(
            "Valid HealthStatus values are Healthy and Unhealthy, not {health}"
        )));
    }
    let (group, lifecycle, zone, hooks) = {
        let mut state = lock(&shared.autoscaling.state);
        let Some((group, lifecycle, zone)) = membership(&state, instance_id) else {
            return Err(ApiError::validation(format!(
                "Instance Id not found - No managed instance found for instance ID: {instance_id}"
            )));
        };
        if health == "Healthy" {
            state.unhealthy.remove(instance_id);
            return Ok(Reply::Xml(String::new()));
        }
        if !state.unhealthy.insert(instance_id.to_owned()) || lifecycle != "InService" {
            // Already on its way out (or not yet in service): nothing more happens.
            return Ok(Reply::Xml(String::new()));
        }
        let hooks: Vec<LifecycleTransition> = state
            .groups
            .get(&group)
            .map(|r| r.hooks.values().map(|h| h.transition).collect())
            .unwrap_or_default();
        (group, lifecycle, zone, hooks)
    };
    debug_assert_eq!(lifecycle, "InService");
    let asg = FakeAutoScaling::new(Arc::clone(shared));
    if hooks.contains(&LifecycleTransition::Terminating) {
        asg.terminate_instance(&group, instance_id)
            .map_err(|e| ApiError::new(500, "InternalFailure", e.to_string()))?;
    } else {
        let mut state = lock(&shared.autoscaling.state);
        if let Some(record) = state.groups.get_mut(&group) {
            record.instances.remove(instance_id);
        }
        drop(state);
        super::ec2::mark_terminated(shared, instance_id);
    }
    // The replacement: a fresh instance in the same zone.
    let digest = protocol::uuid_v4().replace('-', "");
    let replacement_id = format!("i-{}", &digest[..17]);
    let instance = super::ec2::FakeInstance::new(&replacement_id, &shared.account.region)
        .availability_zone(&zone);
    let replacement_node = instance.private_dns_name.clone();
    super::ec2::FakeEc2::new(Arc::clone(shared)).add_instance(instance);
    if hooks.contains(&LifecycleTransition::Launching) {
        asg.launch_instance(&group, &replacement_id)
            .map_err(|e| ApiError::new(500, "InternalFailure", e.to_string()))?;
    } else {
        asg.add_instance(&group, &replacement_id, &zone)
            .map_err(|e| ApiError::new(500, "InternalFailure", e.to_string()))?;
    }
    lock(&shared.autoscaling.state)
        .health_replacements
        .push(HealthReplacement {
            group_name: group,
            unhealthy_instance_id: instance_id.to_owned(),
            replacement_instance_id: replacement_id,
            replacement_node,
        });
    Ok(Reply::Xml(String::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_global_timeout_is_100_heartbeats_capped_at_48_hours() {
        let short = FakeLifecycleHook::terminating("h").heartbeat_timeout(Duration::from_secs(60));
        assert_eq!(short.effective_global_timeout(), Duration::from_secs(6000));
        let long = FakeLifecycleHook::terminating("h").heartbeat_timeout(Duration::from_secs(7200));
        assert_eq!(long.effective_global_timeout(), MAX_GLOBAL_TIMEOUT);
        let set = short.global_timeout(Duration::from_secs(90));
        assert_eq!(set.effective_global_timeout(), Duration::from_secs(90));
    }

    #[test]
    fn tag_filters_must_all_match() {
        let group = FakeAutoScalingGroup::new("g")
            .tag("eks:cluster-name", "demo")
            .tag("team", "a");
        let filter = |name: &str, value: &str| (name.to_owned(), vec![value.to_owned()]);
        assert!(group_matches(
            &group,
            &[filter("tag:eks:cluster-name", "demo")]
        ));
        assert!(!group_matches(
            &group,
            &[
                filter("tag:eks:cluster-name", "demo"),
                filter("tag:team", "b")
            ]
        ));
        assert!(group_matches(&group, &[filter("tag-key", "team")]));
        assert!(!group_matches(&group, &[filter("unknown", "x")]));
    }
}
