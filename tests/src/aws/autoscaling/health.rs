//! Instance health for node repair: `SetInstanceHealth` takes an unhealthy instance out of
//! service and launches its replacement, `DescribeAutoScalingInstances` reports health.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::operations::required;
use super::{AsgState, FakeAutoScaling, LifecycleTransition};
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
        crate::aws::ec2::mark_terminated(shared, instance_id);
    }
    // The replacement: a fresh instance in the same zone.
    let digest = protocol::uuid_v4().replace('-', "");
    let replacement_id = format!("i-{}", &digest[..17]);
    let instance = crate::aws::ec2::FakeInstance::new(&replacement_id, &shared.account.region)
        .availability_zone(&zone);
    let replacement_node = instance.private_dns_name.clone();
    crate::aws::ec2::FakeEc2::new(Arc::clone(shared)).add_instance(instance);
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
