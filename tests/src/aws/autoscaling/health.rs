//! Instance health for node repair: `SetInstanceHealth` takes an unhealthy instance out of
//! service and launches its replacement, `DescribeAutoScalingInstances` reports health.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::launch::{launch_new_instance, terminate_at_once};
use super::operations::{instance_launch_configuration, required};
use super::{AsgState, FakeAutoScaling, GroupInstance, LifecycleTransition};
use crate::aws::protocol::{self, ApiError, QueryParams, Reply, element};
use crate::aws::{Shared, lock};

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

/// The group an instance belongs to, and the instance.
fn membership<'a>(state: &'a AsgState, instance_id: &str) -> Option<(&'a str, &'a GroupInstance)> {
    state.groups.values().find_map(|record| {
        record
            .instances
            .get(instance_id)
            .map(|instance| (record.group.name.as_str(), instance))
    })
}

/// `DescribeAutoScalingInstances`: at most 50 ids and 50 records per call, as AWS allows;
/// health in the API's capitals (`HEALTHY` / `UNHEALTHY`).
pub(super) fn describe_auto_scaling_instances(
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
        let Some((group, instance)) = membership(&state, id) else {
            continue;
        };
        let health = if state.unhealthy.contains(id) {
            "UNHEALTHY"
        } else {
            "HEALTHY"
        };
        members.push_str("<member>");
        members.push_str(&element("InstanceId", id));
        members.push_str(&instance_launch_configuration(instance));
        members.push_str(&element("AutoScalingGroupName", group));
        members.push_str(&element("AvailabilityZone", &instance.availability_zone));
        members.push_str(&element("LifecycleState", &instance.lifecycle_state));
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
pub(super) fn set_instance_health(
    shared: &Arc<Shared>,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let instance_id = required(params, "InstanceId")?;
    let health = required(params, "HealthStatus")?;
    if !matches!(health, "Healthy" | "Unhealthy") {
        return Err(ApiError::validation(format!(
            "Valid HealthStatus values are Healthy and Unhealthy, not {health}"
        )));
    }
    let (group, lifecycle, zone, has_terminating_hook) = {
        let mut state = lock(&shared.autoscaling.state);
        let Some((group, instance)) = membership(&state, instance_id) else {
            return Err(ApiError::validation(format!(
                "Instance Id not found - No managed instance found for instance ID: {instance_id}"
            )));
        };
        let (group, lifecycle, zone) = (
            group.to_owned(),
            instance.lifecycle_state.clone(),
            instance.availability_zone.clone(),
        );
        if health == "Healthy" {
            state.unhealthy.remove(instance_id);
            return Ok(Reply::Xml(String::new()));
        }
        if !state.unhealthy.insert(instance_id.to_owned()) || lifecycle != "InService" {
            // Already on its way out (or not yet in service): nothing more happens.
            return Ok(Reply::Xml(String::new()));
        }
        let has_terminating_hook = state.has_hook(&group, LifecycleTransition::Terminating);
        (group, lifecycle, zone, has_terminating_hook)
    };
    debug_assert_eq!(lifecycle, "InService");
    let internal =
        |e: crate::aws::FakeAwsError| ApiError::new(500, "InternalFailure", e.to_string());
    if has_terminating_hook {
        FakeAutoScaling::new(Arc::clone(shared))
            .terminate_instance(&group, instance_id)
            .map_err(internal)?;
    } else {
        terminate_at_once(shared, &group, instance_id);
    }
    // The replacement: a fresh instance in the same zone.
    let replacement = launch_new_instance(shared, &group, Some(&zone), None).map_err(internal)?;
    lock(&shared.autoscaling.state)
        .health_replacements
        .push(HealthReplacement {
            group_name: group,
            unhealthy_instance_id: instance_id.to_owned(),
            replacement_instance_id: replacement.instance_id,
            replacement_node: replacement.private_dns_name,
        });
    Ok(Reply::Xml(String::new()))
}
