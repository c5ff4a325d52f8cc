//! The Auto Scaling Query-protocol operations the functions call: each reads its form
//! parameters, acts on the state, and answers in Auto Scaling's XML (or its error).

use std::sync::Arc;

use node_manager::aws::LifecycleActionResult;
use tokio::time::Instant;

use super::health::{describe_auto_scaling_instances, set_instance_health};
use super::launch::announce_departures;
use super::lifecycle::end_action;
use super::refresh_operations::{
    cancel_instance_refresh, describe_instance_refreshes, start_instance_refresh,
};
use super::{
    AsgState, CompletedBy, FakeAutoScalingGroup, GroupInstance, GroupRecord, HeartbeatRecord,
};
use crate::aws::protocol::{self, ApiError, QueryParams, Reply, element, xml_escape};
use crate::aws::{Shared, lock};

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
        "DescribeWarmPool" => describe_warm_pool(shared, params),
        "StartInstanceRefresh" => start_instance_refresh(shared, params),
        "DescribeInstanceRefreshes" => describe_instance_refreshes(shared, params),
        "CancelInstanceRefresh" => cancel_instance_refresh(shared, params),
        other => Err(ApiError::new(
            400,
            "InvalidAction",
            format!("The action {other} is not valid for this web service."),
        )),
    }
}

pub(super) fn required<'a>(params: &'a QueryParams, name: &str) -> Result<&'a str, ApiError> {
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
    drop(state);
    announce_departures(shared);
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
    let record = group_record(&state, group_name)?;
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

/// The group named `group_name`, or Auto Scaling's validation error naming it.
fn group_record<'a>(state: &'a AsgState, group_name: &str) -> Result<&'a GroupRecord, ApiError> {
    state
        .groups
        .get(group_name)
        .ok_or_else(|| ApiError::validation(format!("Group {group_name} not found")))
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
        if let Some(template) = &group.launch_template {
            members.push_str(&template.xml());
        }
        if let Some(policy) = &group.instance_maintenance_policy {
            members.push_str(&format!(
                "<InstanceMaintenancePolicy><MinHealthyPercentage>{}</MinHealthyPercentage><MaxHealthyPercentage>{}</MaxHealthyPercentage></InstanceMaintenancePolicy>",
                policy.min_healthy_percentage, policy.max_healthy_percentage
            ));
        }
        if group.has_instance_lifecycle_policy {
            let action = if group.retain_on_abandon {
                "retain"
            } else {
                "terminate"
            };
            members.push_str(&format!(
                "<InstanceLifecyclePolicy><RetentionTriggers><TerminateHookAbandon>{action}</TerminateHookAbandon></RetentionTriggers></InstanceLifecyclePolicy>"
            ));
        }
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
        if let Some(pool) = state.warm_pools.get(&group.name) {
            members.push_str(&warm_pool_configuration(*pool));
        }
        members.push_str("<Instances>");
        // An instance in the warm pool is listed by `DescribeWarmPool` only.
        for (instance_id, instance) in record.instances.iter().filter(|(_, i)| !in_pool(i)) {
            members.push_str("<member>");
            members.push_str(&element("InstanceId", instance_id));
            members.push_str(&instance_launch_configuration(instance));
            members.push_str(&element("AvailabilityZone", &instance.availability_zone));
            members.push_str(&element("LifecycleState", &instance.lifecycle_state));
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

/// Whether `instance` is in its group's warm pool (on its way in, or waiting there).
fn in_pool(instance: &GroupInstance) -> bool {
    instance.lifecycle_state.starts_with("Warmed:")
}

fn warm_pool_configuration(pool: super::WarmPoolState) -> String {
    format!(
        "<WarmPoolConfiguration><MinSize>0</MinSize>{}</WarmPoolConfiguration>",
        element("PoolState", pool.pool_state())
    )
}

/// `DescribeWarmPool`: the group's pool and the instances in it (one page: the fake's pools
/// are small).
fn describe_warm_pool(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let group_name = required(params, "AutoScalingGroupName")?;
    let state = lock(&shared.autoscaling.state);
    let record = group_record(&state, group_name)?;
    let mut members = String::new();
    for (instance_id, instance) in record.instances.iter().filter(|(_, i)| in_pool(i)) {
        members.push_str("<member>");
        members.push_str(&element("InstanceId", instance_id));
        members.push_str(&instance_launch_configuration(instance));
        members.push_str(&element("AvailabilityZone", &instance.availability_zone));
        members.push_str(&element("LifecycleState", &instance.lifecycle_state));
        members.push_str("<HealthStatus>Healthy</HealthStatus><ProtectedFromScaleIn>false</ProtectedFromScaleIn></member>");
    }
    let configuration = state
        .warm_pools
        .get(group_name)
        .map(|pool| warm_pool_configuration(*pool))
        .unwrap_or_default();
    Ok(Reply::Xml(format!(
        "{configuration}<Instances>{members}</Instances>"
    )))
}

/// An instance's `InstanceType` and `LaunchTemplate`, as both instance listings report them.
pub(super) fn instance_launch_configuration(instance: &GroupInstance) -> String {
    let mut xml = element("InstanceType", &instance.instance_type);
    if let Some(template) = &instance.launch_template {
        xml.push_str(&template.xml());
    }
    xml
}

#[cfg(test)]
mod tests {
    use super::*;

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
