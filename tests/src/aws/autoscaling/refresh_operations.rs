//! The instance refresh operations of the Query protocol: `StartInstanceRefresh`,
//! `DescribeInstanceRefreshes` and `CancelInstanceRefresh`, parameters in, XML out.

use std::sync::Arc;
use std::time::Duration;

use super::FakeLaunchTemplate;
use super::operations::required;
use super::refresh::{self, FakeRefreshPreferences, RefreshRecord};
use crate::aws::protocol::{self, ApiError, QueryParams, Reply, element};
use crate::aws::{Shared, lock};

fn number(params: &QueryParams, name: &str) -> Result<Option<u32>, ApiError> {
    params
        .get(name)
        .map(|value| {
            value.parse::<u32>().map_err(|_| {
                ApiError::validation(format!(
                    "Value '{value}' at '{name}' is not a valid integer"
                ))
            })
        })
        .transpose()
}

pub(super) fn start_instance_refresh(
    shared: &Arc<Shared>,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let group_name = required(params, "AutoScalingGroupName")?;
    if let Some(strategy) = params.get("Strategy").filter(|s| *s != "Rolling") {
        return Err(ApiError::validation(format!(
            "Strategy {strategy} is not supported by this fake: use Rolling"
        )));
    }
    let skip_matching = match params.get("Preferences.SkipMatching").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::validation(format!(
                "Value '{other}' at 'preferences.skipMatching' is not a boolean"
            )));
        }
    };
    let template = |name: &str| {
        params
            .get(&format!("DesiredConfiguration.LaunchTemplate.{name}"))
            .cloned()
    };
    let (id, name) = (template("LaunchTemplateId"), template("LaunchTemplateName"));
    let desired_launch_template = (id.is_some() || name.is_some()).then(|| FakeLaunchTemplate {
        id: id.unwrap_or_default(),
        name: name.unwrap_or_default(),
        // AWS's default when no version is given.
        version: template("Version").unwrap_or_else(|| "$Default".to_owned()),
    });
    let preferences = FakeRefreshPreferences {
        min_healthy_percentage: number(params, "Preferences.MinHealthyPercentage")?,
        max_healthy_percentage: number(params, "Preferences.MaxHealthyPercentage")?,
        instance_warmup: number(params, "Preferences.InstanceWarmup")?
            .map(|seconds| Duration::from_secs(u64::from(seconds))),
        skip_matching,
        desired_launch_template,
    };
    let id = refresh::start(shared, group_name, preferences)?;
    Ok(Reply::Xml(element("InstanceRefreshId", &id)))
}

pub(super) fn cancel_instance_refresh(
    shared: &Shared,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let group_name = required(params, "AutoScalingGroupName")?;
    let id = refresh::cancel(shared, group_name)?;
    Ok(Reply::Xml(element("InstanceRefreshId", &id)))
}

/// Newest first, as AWS lists them.
pub(super) fn describe_instance_refreshes(
    shared: &Shared,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let group_name = required(params, "AutoScalingGroupName")?;
    let wanted = protocol::query_list(params, "InstanceRefreshIds");
    let state = lock(&shared.autoscaling.state);
    let members: String = state
        .refreshes
        .iter()
        .rev()
        .filter(|r| r.view.group_name == group_name)
        .filter(|r| wanted.is_empty() || wanted.contains(&r.view.id))
        .map(refresh_xml)
        .collect();
    Ok(Reply::Xml(format!(
        "<InstanceRefreshes>{members}</InstanceRefreshes>"
    )))
}

fn refresh_xml(record: &RefreshRecord) -> String {
    let view = &record.view;
    let mut xml = String::from("<member>");
    xml.push_str(&element("InstanceRefreshId", &view.id));
    xml.push_str(&element("AutoScalingGroupName", &view.group_name));
    xml.push_str(&element("Status", view.status.as_str()));
    if let Some(reason) = &view.status_reason {
        xml.push_str(&element("StatusReason", reason));
    }
    xml.push_str(&element(
        "StartTime",
        &protocol::timestamp_millis(record.start_time),
    ));
    if let Some(end) = record.end_time {
        xml.push_str(&element("EndTime", &protocol::timestamp_millis(end)));
    }
    xml.push_str(&format!(
        "<PercentageComplete>{}</PercentageComplete><InstancesToUpdate>{}</InstancesToUpdate>",
        view.percentage_complete, view.instances_to_update
    ));
    xml.push_str(&format!(
        "<Preferences><MinHealthyPercentage>{}</MinHealthyPercentage><MaxHealthyPercentage>{}</MaxHealthyPercentage><InstanceWarmup>{}</InstanceWarmup><SkipMatching>{}</SkipMatching><AutoRollback>false</AutoRollback></Preferences>",
        record.min_healthy_percentage,
        record.max_healthy_percentage,
        record.instance_warmup,
        record.skip_matching
    ));
    if let Some(template) = &record.declared_launch_template {
        xml.push_str("<DesiredConfiguration>");
        xml.push_str(&template.xml());
        xml.push_str("</DesiredConfiguration>");
    }
    xml.push_str("<Strategy>Rolling</Strategy></member>");
    xml
}
