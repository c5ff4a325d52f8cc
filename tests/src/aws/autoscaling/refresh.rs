//! Instance refreshes: a rolling replacement of a group's instances, batch by batch, through
//! the group's lifecycle hooks, keeping the healthy capacity its preferences ask for.
//!
//! With a maximum healthy percentage above 100 a batch of new instances launches first and
//! as many outdated ones terminate once the new ones are in service (and warmed up);
//! otherwise a batch terminates first and its replacements launch after. This file holds
//! the refresh as recorded and its start and cancel; `refresh_loop` the replacement loop.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;

use super::refresh_loop::{self, POLL, Plan};
use super::{FakeAutoScaling, FakeLaunchTemplate};
use crate::aws::protocol::{self, ApiError};
use crate::aws::{FakeAwsError, Shared, lock};

/// What a test asks of a refresh (`StartInstanceRefresh`'s preferences and desired
/// configuration). `None`: AWS's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeRefreshPreferences {
    /// The group's instance maintenance policy's, else 90.
    pub min_healthy_percentage: Option<u32>,
    /// The group's instance maintenance policy's, else 100.
    pub max_healthy_percentage: Option<u32>,
    /// Declared like AWS's seconds (0 unless set), run scaled by the time scale.
    pub instance_warmup: Option<Duration>,
    /// Replace only instances whose launch template or instance type differs from the
    /// desired configuration (AWS's default: replace all).
    pub skip_matching: bool,
    /// `DesiredConfiguration.LaunchTemplate`; `None`: the group's current template.
    pub desired_launch_template: Option<FakeLaunchTemplate>,
}

impl FakeRefreshPreferences {
    pub fn healthy_percentage(mut self, min: u32, max: u32) -> Self {
        self.min_healthy_percentage = Some(min);
        self.max_healthy_percentage = Some(max);
        self
    }

    pub fn instance_warmup(mut self, warmup: Duration) -> Self {
        self.instance_warmup = Some(warmup);
        self
    }

    pub fn skip_matching(mut self, skip: bool) -> Self {
        self.skip_matching = skip;
        self
    }

    pub fn desired_launch_template(mut self, id: &str, name: &str, version: &str) -> Self {
        self.desired_launch_template = Some(FakeLaunchTemplate::new(id, name, version));
        self
    }
}

/// An instance refresh's `Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceRefreshStatus {
    Pending,
    InProgress,
    Successful,
    Failed,
    Cancelling,
    Cancelled,
    RollbackInProgress,
    RollbackSuccessful,
    RollbackFailed,
}

impl InstanceRefreshStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::InProgress => "InProgress",
            Self::Successful => "Successful",
            Self::Failed => "Failed",
            Self::Cancelling => "Cancelling",
            Self::Cancelled => "Cancelled",
            Self::RollbackInProgress => "RollbackInProgress",
            Self::RollbackSuccessful => "RollbackSuccessful",
            Self::RollbackFailed => "RollbackFailed",
        }
    }

    /// Whether the refresh still blocks another on its group.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            Self::Pending | Self::InProgress | Self::Cancelling | Self::RollbackInProgress
        )
    }
}

/// What a test sees of a refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRefreshView {
    pub id: String,
    pub group_name: String,
    pub status: InstanceRefreshStatus,
    pub status_reason: Option<String>,
    pub instances_to_update: u32,
    pub percentage_complete: u32,
    /// Outdated instances terminated, in order.
    pub replaced_instance_ids: Vec<String>,
    /// New instances launched, in order.
    pub launched_instance_ids: Vec<String>,
}

pub(super) struct RefreshRecord {
    pub(super) view: InstanceRefreshView,
    pub(super) start_time: Timestamp,
    pub(super) end_time: Option<Timestamp>,
    pub(super) min_healthy_percentage: u32,
    pub(super) max_healthy_percentage: u32,
    /// Declared seconds.
    pub(super) instance_warmup: u64,
    pub(super) skip_matching: bool,
    /// The desired launch template as the caller gave it (reported only then).
    pub(super) declared_launch_template: Option<FakeLaunchTemplate>,
}

/// The batch order and size for `desired` instances: launch first when the maximum healthy
/// percentage leaves room above the desired capacity, else terminate first as far as the
/// minimum allows; at least one instance either way, so the refresh moves.
pub(super) fn batching(desired: u32, min: u32, max: u32) -> (bool, u32) {
    if max > 100 {
        (true, (desired * max / 100).saturating_sub(desired).max(1))
    } else {
        let kept = (desired * min).div_ceil(100);
        (false, desired.saturating_sub(kept).max(1))
    }
}

/// `StartInstanceRefresh`, for the Query operation and the Rust API alike: validates,
/// records the refresh (`Pending`) and starts its loop. Returns the refresh id.
pub(super) fn start(
    shared: &Arc<Shared>,
    group_name: &str,
    preferences: FakeRefreshPreferences,
) -> Result<String, ApiError> {
    let id = protocol::uuid_v4();
    let plan = {
        let mut state = lock(&shared.autoscaling.state);
        let scale = state.time_scale;
        let record = state.groups.get(group_name).ok_or_else(|| {
            ApiError::validation(format!("AutoScalingGroup name not found - {group_name}"))
        })?;
        if state
            .refreshes
            .iter()
            .any(|r| r.view.group_name == group_name && r.view.status.is_active())
        {
            return Err(ApiError::new(
                400,
                "InstanceRefreshInProgress",
                format!("An Instance Refresh is already in progress on group {group_name}"),
            ));
        }
        let policy = record.group.instance_maintenance_policy;
        let min = preferences
            .min_healthy_percentage
            .or(policy.map(|p| p.min_healthy_percentage))
            .unwrap_or(90);
        let max = preferences
            .max_healthy_percentage
            .or(policy.map(|p| p.max_healthy_percentage))
            .unwrap_or(100);
        if min > 100 || !(100..=200).contains(&max) || max - min > 100 {
            return Err(ApiError::validation(format!(
                "MinHealthyPercentage {min} and MaxHealthyPercentage {max} must be 0-100 and 100-200 at most 100 apart"
            )));
        }
        let launch_template = resolve(
            preferences.desired_launch_template.as_ref(),
            &record.group.launch_template,
        );
        let instance_type = &record.group.instance_type;
        let mut in_service: Vec<(&String, &super::GroupInstance)> = record
            .instances
            .iter()
            .filter(|(_, instance)| instance.lifecycle_state == "InService")
            .filter(|(_, instance)| {
                let matching = instance.instance_type == *instance_type
                    && match (&launch_template, &instance.launch_template) {
                        (Some(desired), Some(actual)) => {
                            numbered(shared, desired).is_met_by(&numbered(shared, actual))
                        }
                        (None, _) => true,
                        (Some(_), None) => false,
                    };
                !(preferences.skip_matching && matching)
            })
            .collect();
        in_service.sort_by_key(|(_, instance)| instance.joined);
        let policies = &record.group.termination_policies;
        if policies.first().is_some_and(|p| p == "NewestInstance") {
            in_service.reverse();
        }
        let outdated: Vec<String> = in_service.into_iter().map(|(id, _)| id.clone()).collect();
        let (launch_first, batch_size) = batching(record.group.desired_capacity, min, max);
        let warmup_seconds = preferences.instance_warmup.map_or(0, |w| w.as_secs());
        let view = InstanceRefreshView {
            id: id.clone(),
            group_name: group_name.to_owned(),
            status: InstanceRefreshStatus::Pending,
            status_reason: None,
            instances_to_update: u32::try_from(outdated.len()).unwrap_or(u32::MAX),
            percentage_complete: 0,
            replaced_instance_ids: Vec::new(),
            launched_instance_ids: Vec::new(),
        };
        state.refreshes.push(RefreshRecord {
            view,
            start_time: Timestamp::now(),
            end_time: None,
            min_healthy_percentage: min,
            max_healthy_percentage: max,
            instance_warmup: warmup_seconds,
            skip_matching: preferences.skip_matching,
            declared_launch_template: preferences.desired_launch_template,
        });
        Plan {
            id: id.clone(),
            group_name: group_name.to_owned(),
            outdated,
            launch_first,
            batch_size: usize::try_from(batch_size).unwrap_or(1),
            warmup: Duration::from_secs(warmup_seconds).mul_f64(scale),
            launch_template,
        }
    };
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(refresh_loop::run(Arc::downgrade(shared), plan));
    }
    Ok(id)
}

/// `template` with a symbolic version (`$Latest`, `$Default`) replaced by the number EC2
/// reports for it now, as Auto Scaling compares versions for `SkipMatching`; as given when
/// EC2 does not know the template.
fn numbered(shared: &Shared, template: &FakeLaunchTemplate) -> FakeLaunchTemplate {
    let mut numbered = template.clone();
    if let Some(version) = crate::aws::ec2::resolve_template_version(
        shared,
        &template.id,
        &template.name,
        &template.version,
    ) {
        numbered.version = version;
    }
    numbered
}

/// The desired template, completed from the group's when it names the same template (a
/// caller may give only the id or only the name); the group's when none is given.
fn resolve(
    desired: Option<&FakeLaunchTemplate>,
    current: &Option<FakeLaunchTemplate>,
) -> Option<FakeLaunchTemplate> {
    let Some(desired) = desired else {
        return current.clone();
    };
    let mut resolved = desired.clone();
    if let Some(current) = current
        && (desired.id == current.id || desired.name == current.name)
    {
        resolved.id = current.id.clone();
        resolved.name = current.name.clone();
    }
    Some(resolved)
}

/// `CancelInstanceRefresh`: the active refresh of the group goes `Cancelling`; its loop
/// stops once the actions in flight end.
pub(super) fn cancel(shared: &Shared, group_name: &str) -> Result<String, ApiError> {
    let mut state = lock(&shared.autoscaling.state);
    let record = state
        .refreshes
        .iter_mut()
        .find(|r| r.view.group_name == group_name && r.view.status.is_active())
        .ok_or_else(|| {
            ApiError::new(
                400,
                "ActiveInstanceRefreshNotFound",
                format!("No in progress or pending Instance Refresh found for Auto Scaling group {group_name}"),
            )
        })?;
    record.view.status = InstanceRefreshStatus::Cancelling;
    Ok(record.view.id.clone())
}

impl FakeAutoScaling {
    /// Starts an instance refresh as `StartInstanceRefresh` does; returns its id.
    pub fn start_instance_refresh(
        &self,
        group_name: &str,
        preferences: FakeRefreshPreferences,
    ) -> Result<String, FakeAwsError> {
        start(&self.shared, group_name, preferences).map_err(api_error)
    }

    /// Rolls the group's refresh back as `RollbackInstanceRefresh` does: the refresh goes
    /// `RollbackInProgress` (and `EC2 Auto Scaling Instance Refresh Rollback Started` goes
    /// on the bus, returned), its loop replaces the instances it launched with the group's
    /// previous configuration, then `RollbackSuccessful`.
    pub fn rollback_instance_refresh(&self, group_name: &str) -> Result<Value, FakeAwsError> {
        let (id, arn) = {
            let mut state = lock(&self.shared.autoscaling.state);
            let arn = state
                .groups
                .get(group_name)
                .map(|g| g.arn.clone())
                .unwrap_or_default();
            let record = state
                .refreshes
                .iter_mut()
                .find(|r| {
                    r.view.group_name == group_name
                        && matches!(
                            r.view.status,
                            InstanceRefreshStatus::Pending | InstanceRefreshStatus::InProgress
                        )
                })
                .ok_or_else(|| FakeAwsError::AutoScalingApi {
                    code: "ActiveInstanceRefreshNotFound".to_owned(),
                    message: format!(
                        "No in progress or pending Instance Refresh found for Auto Scaling group {group_name}"
                    ),
                })?;
            record.view.status = InstanceRefreshStatus::RollbackInProgress;
            (record.view.id.clone(), arn)
        };
        Ok(crate::aws::eventbridge::emit(
            &self.shared,
            "aws.autoscaling",
            "EC2 Auto Scaling Instance Refresh Rollback Started",
            vec![arn],
            serde_json::json!({"InstanceRefreshId": id, "AutoScalingGroupName": group_name}),
        ))
    }

    /// Cancels the group's active refresh as `CancelInstanceRefresh` does; returns its id.
    pub fn cancel_instance_refresh(&self, group_name: &str) -> Result<String, FakeAwsError> {
        cancel(&self.shared, group_name).map_err(api_error)
    }

    pub fn instance_refresh(&self, refresh_id: &str) -> Option<InstanceRefreshView> {
        self.state()
            .refreshes
            .iter()
            .find(|r| r.view.id == refresh_id)
            .map(|r| r.view.clone())
    }

    /// Waits until the refresh has ended and returns how; `None` after `timeout`.
    pub async fn wait_for_refresh_end(
        &self,
        refresh_id: &str,
        timeout: Duration,
    ) -> Option<InstanceRefreshStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let status = self.instance_refresh(refresh_id).map(|view| view.status);
            if let Some(status) = status.filter(|s| !s.is_active()) {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

fn api_error(error: ApiError) -> FakeAwsError {
    FakeAwsError::AutoScalingApi {
        code: error.code,
        message: error.message,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::refresh_tests::{GROUP, fake, group, nodes};
    use super::*;

    #[test]
    fn batches_follow_the_healthy_percentages() {
        // Terminate first: keep ceil(D × min / 100) in service.
        assert_eq!(batching(4, 50, 100), (false, 2));
        assert_eq!(batching(10, 90, 100), (false, 1));
        assert_eq!(batching(3, 90, 100), (false, 1));
        assert_eq!(batching(3, 100, 100), (false, 1));
        // Launch first: up to floor(D × max / 100) instances at once.
        assert_eq!(batching(4, 100, 150), (true, 2));
        assert_eq!(batching(3, 100, 110), (true, 1));
        assert_eq!(batching(4, 100, 200), (true, 4));
    }

    #[tokio::test]
    async fn a_second_refresh_and_bad_percentages_are_refused() {
        let aws = fake().await;
        group(&aws, nodes(2), true);
        let autoscaling = aws.autoscaling();
        let code = |result: Result<String, crate::aws::FakeAwsError>| match result {
            Err(crate::aws::FakeAwsError::AutoScalingApi { code, .. }) => code,
            other => format!("{other:?}"),
        };
        let bad = FakeRefreshPreferences::default().healthy_percentage(20, 150);
        assert_eq!(
            code(autoscaling.start_instance_refresh(GROUP, bad)),
            "ValidationError"
        );
        autoscaling
            .start_instance_refresh(GROUP, FakeRefreshPreferences::default())
            .unwrap();
        assert_eq!(
            code(autoscaling.start_instance_refresh(GROUP, FakeRefreshPreferences::default())),
            "InstanceRefreshInProgress"
        );
    }
}
