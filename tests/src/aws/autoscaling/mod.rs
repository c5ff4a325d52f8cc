//! Fake Auto Scaling: groups, lifecycle hooks and the lifecycle-action state machine.
//!
//! A lifecycle action lives from the moment an instance enters `Pending:Wait` or
//! `Terminating:Wait` until it is completed by a call or times out. Each heartbeat restarts
//! the heartbeat timeout; the global timeout (`min(100 × heartbeat, 48 h)` unless set) does not
//! move. On expiry the hook's default result is applied, exactly as Auto Scaling does, and from
//! then on every call about the action fails with "No active Lifecycle Action found".
//! Timeouts are declared in AWS terms (what `DescribeLifecycleHooks` reports) and run scaled by
//! [`FakeAutoScaling::set_time_scale`], so a one-hour hook can expire in a test in 100 ms.
//!
//! One file per job: `hooks` (hooks and the transitions they pause, and the records of
//! their actions), `lifecycle` (the lifecycle-action state machine: start, timers, end),
//! `notifications` (the messages Auto Scaling publishes), `warm_pool`, `health` (instance
//! health for node repair), `launch` (launch templates, and the instances Auto Scaling
//! launches and terminates on its own), `refresh` and `refresh_loop` (instance refreshes;
//! `refresh_operations` their Query operations) and `operations` (the Query-protocol
//! operations: parameters in, XML out). This file holds the groups, the shared state and
//! the handle.

mod health;
mod hooks;
mod launch;
mod lifecycle;
mod notifications;
mod operations;
mod refresh;
mod refresh_loop;
mod refresh_operations;
#[cfg(test)]
mod refresh_tests;
#[cfg(test)]
mod retention_tests;
mod warm_pool;

pub use self::health::HealthReplacement;
pub use self::hooks::{
    CompletedBy, FakeLifecycleHook, HeartbeatRecord, LifecycleCompletion, LifecycleNotice,
    LifecycleTransition,
};
pub use self::launch::{FakeLaunchTemplate, InstanceMaintenancePolicy, LaunchedInstance};
pub(crate) use self::operations::dispatch;
pub use self::refresh::{FakeRefreshPreferences, InstanceRefreshStatus, InstanceRefreshView};
pub use self::warm_pool::WarmPoolState;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use node_manager::aws::LifecycleActionResult;
use tokio::time::Instant;

use super::protocol;
use super::{FakeAwsError, Shared, lock};

/// The lifecycle state of an instance kept after its terminating action was abandoned.
const RETAINED: &str = "Terminating:Retained";

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
    /// What new instances launch with (`None`: the group reports no template).
    pub launch_template: Option<FakeLaunchTemplate>,
    /// What new instances launch as (`m5.large` unless set).
    pub instance_type: String,
    pub instance_maintenance_policy: Option<InstanceMaintenancePolicy>,
    /// The instance lifecycle policy `RetentionTriggers.TerminateHookAbandon = retain`: an
    /// instance whose terminating action is abandoned stays, `Terminating:Retained`.
    pub retain_on_abandon: bool,
    /// Whether the group has an instance lifecycle policy at all (reported only then).
    pub has_instance_lifecycle_policy: bool,
    /// The group's termination policies. The fake reads only whether the first is
    /// `NewestInstance`: an instance refresh then replaces the newest instances first
    /// (else the oldest first), as AWS applies the termination policy within a zone.
    pub termination_policies: Vec<String>,
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
            launch_template: None,
            instance_type: "m5.large".to_owned(),
            instance_maintenance_policy: None,
            retain_on_abandon: false,
            has_instance_lifecycle_policy: false,
            termination_policies: Vec::new(),
        }
    }

    pub fn termination_policies(mut self, policies: &[&str]) -> Self {
        self.termination_policies = policies.iter().map(|p| (*p).to_owned()).collect();
        self
    }

    pub fn launch_template(mut self, id: &str, name: &str, version: &str) -> Self {
        self.launch_template = Some(FakeLaunchTemplate::new(id, name, version));
        self
    }

    pub fn instance_type(mut self, instance_type: &str) -> Self {
        self.instance_type = instance_type.to_owned();
        self
    }

    pub fn instance_maintenance_policy(
        mut self,
        min_healthy_percentage: u32,
        max_healthy_percentage: u32,
    ) -> Self {
        self.instance_maintenance_policy = Some(InstanceMaintenancePolicy {
            min_healthy_percentage,
            max_healthy_percentage,
        });
        self
    }

    /// Declares the instance lifecycle policy: `retain` (true) or `terminate` (false) when
    /// a terminating lifecycle action is abandoned.
    pub fn retain_on_abandon(mut self, retain: bool) -> Self {
        self.retain_on_abandon = retain;
        self.has_instance_lifecycle_policy = true;
        self
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

struct GroupRecord {
    group: FakeAutoScalingGroup,
    arn: String,
    created: jiff::Timestamp,
    hooks: BTreeMap<String, FakeLifecycleHook>,
    instances: BTreeMap<String, GroupInstance>,
}

/// An instance of a group.
#[derive(Debug, Clone)]
struct GroupInstance {
    /// `Pending:Wait`, `InService`, `Terminating:Wait`, `Terminating:Retained`, ...
    lifecycle_state: String,
    availability_zone: String,
    /// What it was launched with: the group's configuration when it joined.
    launch_template: Option<FakeLaunchTemplate>,
    instance_type: String,
    /// When it joined, as a sequence number (refreshes replace the oldest first, or the
    /// newest with the `NewestInstance` termination policy).
    joined: u64,
}

impl GroupInstance {
    /// A member joining `group` now, with the group's launch configuration.
    fn joining(group: &FakeAutoScalingGroup, state: &str, zone: &str, joined: u64) -> Self {
        Self {
            lifecycle_state: state.to_owned(),
            availability_zone: zone.to_owned(),
            launch_template: group.launch_template.clone(),
            instance_type: group.instance_type.clone(),
            joined,
        }
    }
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
    /// Instance refreshes, oldest first.
    refreshes: Vec<refresh::RefreshRecord>,
    /// The sequence number the next instance joining a group gets.
    joined_count: u64,
    /// Instances that left terminated, not yet announced to the terminated callbacks.
    departed: Vec<String>,
}

impl AsgState {
    fn next_joined(&mut self) -> u64 {
        self.joined_count += 1;
        self.joined_count
    }

    /// Whether the group has a hook pausing `transition`.
    fn has_hook(&self, group_name: &str, transition: LifecycleTransition) -> bool {
        self.groups
            .get(group_name)
            .is_some_and(|record| record.hooks.values().any(|h| h.transition == transition))
    }
}

pub(crate) struct AutoScalingShared {
    state: Mutex<AsgState>,
    /// Bumped on every completion, so waiters wake.
    changed: tokio::sync::watch::Sender<u64>,
    launchers: Mutex<launch::Launchers>,
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
                refreshes: Vec::new(),
                joined_count: 0,
                departed: Vec::new(),
            }),
            changed: tokio::sync::watch::Sender::new(0),
            launchers: Mutex::default(),
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

    /// `declared` as it runs under the time scale: the same scaling for durations other fakes
    /// declare in AWS terms (a Spot interruption's notice), so they keep their proportion to
    /// hook timeouts.
    pub(crate) fn scaled(&self, declared: Duration) -> Duration {
        declared.mul_f64(self.state().time_scale)
    }

    /// The group `instance_id` is a member of, if any.
    /// Every instance in a group, with its group (what EC2's `aws:autoscaling:groupName` tag
    /// says).
    pub(crate) fn memberships(
        shared: &super::Shared,
    ) -> std::collections::BTreeMap<String, String> {
        lock(&shared.autoscaling.state)
            .groups
            .iter()
            .flat_map(|(name, record)| {
                record
                    .instances
                    .keys()
                    .map(move |id| (id.clone(), name.clone()))
            })
            .collect()
    }

    pub(crate) fn group_of(&self, instance_id: &str) -> Option<String> {
        self.state()
            .groups
            .iter()
            .find(|(_, record)| record.instances.contains_key(instance_id))
            .map(|(name, _)| name.clone())
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

    /// Puts an instance in the group as `InService`, without any lifecycle action, launched
    /// with the group's current launch template and instance type.
    pub fn add_instance(
        &self,
        group_name: &str,
        instance_id: &str,
        availability_zone: &str,
    ) -> Result<(), FakeAwsError> {
        let mut state = self.state();
        let joined = state.next_joined();
        let record = state
            .groups
            .get_mut(group_name)
            .ok_or_else(|| FakeAwsError::UnknownGroup(group_name.to_owned()))?;
        let instance =
            GroupInstance::joining(&record.group, "InService", availability_zone, joined);
        record.instances.insert(instance_id.to_owned(), instance);
        Ok(())
    }

    /// The instance's lifecycle state in the group (`Pending:Wait`, `InService`,
    /// `Terminating:Wait`, ...), `None` once it left the group.
    pub fn instance_state(&self, group_name: &str, instance_id: &str) -> Option<String> {
        self.state()
            .groups
            .get(group_name)
            .and_then(|record| record.instances.get(instance_id))
            .map(|instance| instance.lifecycle_state.clone())
    }

    /// The instances kept `Terminating:Retained` after their terminating lifecycle action
    /// was abandoned (the group's instance lifecycle policy).
    pub fn retained_instances(&self, group_name: &str) -> Vec<String> {
        self.state()
            .groups
            .get(group_name)
            .map(|record| {
                record
                    .instances
                    .iter()
                    .filter(|(_, instance)| instance.lifecycle_state == RETAINED)
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}
