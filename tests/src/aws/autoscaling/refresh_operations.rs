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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use aws_sdk_autoscaling::error::ProvideErrorMetadata;
    use aws_sdk_autoscaling::types::{
        DesiredConfiguration, LaunchTemplateSpecification, LifecycleState, RefreshPreferences,
        RetentionAction,
    };

    use super::super::refresh_tests::GROUP;
    use super::super::{FakeAutoScalingGroup, FakeLifecycleHook};
    use crate::account::FakeAccount;
    use crate::aws::FakeAws;

    /// The real SDK client reads the refresh and the launch configuration the fake reports.
    #[tokio::test]
    async fn the_sdk_starts_describes_and_cancels_a_refresh_and_reads_launch_templates() {
        let account = FakeAccount::reference();
        let credentials = account.add_role_credentials("refresh-test");
        let aws = FakeAws::start(account).await.unwrap();
        let client = aws_sdk_autoscaling::Client::new(&aws.sdk_config(&credentials).await);
        let autoscaling = aws.autoscaling();
        autoscaling.add_group(
            FakeAutoScalingGroup::new(GROUP)
                .size(0, 2, 4)
                .launch_template("lt-0abc", "nodes", "1")
                .instance_type("m6i.large")
                .instance_maintenance_policy(100, 150)
                .retain_on_abandon(true),
        );
        autoscaling.add_group(FakeAutoScalingGroup::new("other"));
        // No responder: the first terminations wait, so the refresh stays in progress.
        autoscaling
            .add_hook(GROUP, FakeLifecycleHook::terminating("terminate"))
            .unwrap();
        for id in ["i-00000001", "i-00000002"] {
            aws.ec2().add_running_instance(id);
            autoscaling.add_instance(GROUP, id, "eu-west-1a").unwrap();
        }
        autoscaling.set_launch_template_version(GROUP, "2").unwrap();

        let started = client
            .start_instance_refresh()
            .auto_scaling_group_name(GROUP)
            .strategy("Rolling".into())
            .preferences(
                RefreshPreferences::builder()
                    .min_healthy_percentage(100)
                    .max_healthy_percentage(150)
                    .instance_warmup(0)
                    .skip_matching(true)
                    .build(),
            )
            .desired_configuration(
                DesiredConfiguration::builder()
                    .launch_template(
                        LaunchTemplateSpecification::builder()
                            .launch_template_id("lt-0abc")
                            .version("2")
                            .build(),
                    )
                    .build(),
            )
            .send()
            .await
            .unwrap();
        let id = started.instance_refresh_id().unwrap().to_owned();
        for _ in 0..200 {
            if autoscaling.has_active_action("i-00000001") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        let again = client
            .start_instance_refresh()
            .auto_scaling_group_name(GROUP)
            .send()
            .await
            .unwrap_err();
        assert_eq!(again.code(), Some("InstanceRefreshInProgress"));

        let described = client
            .describe_instance_refreshes()
            .auto_scaling_group_name(GROUP)
            .instance_refresh_ids(&id)
            .send()
            .await
            .unwrap();
        let refresh = &described.instance_refreshes()[0];
        assert_eq!(refresh.instance_refresh_id(), Some(id.as_str()));
        assert_eq!(refresh.auto_scaling_group_name(), Some(GROUP));
        assert_eq!(refresh.status().map(|s| s.as_str()), Some("InProgress"));
        assert_eq!(refresh.instances_to_update(), Some(2));
        assert!(refresh.start_time().is_some() && refresh.end_time().is_none());
        assert_eq!(refresh.strategy().map(|s| s.as_str()), Some("Rolling"));
        let preferences = refresh.preferences().unwrap();
        assert_eq!(preferences.min_healthy_percentage(), Some(100));
        assert_eq!(preferences.max_healthy_percentage(), Some(150));
        assert_eq!(preferences.instance_warmup(), Some(0));
        assert_eq!(preferences.skip_matching(), Some(true));
        assert_eq!(preferences.auto_rollback(), Some(false));
        let desired = refresh
            .desired_configuration()
            .and_then(|d| d.launch_template())
            .unwrap();
        assert_eq!(desired.launch_template_id(), Some("lt-0abc"));
        assert_eq!(desired.version(), Some("2"));

        let groups = client
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(GROUP)
            .send()
            .await
            .unwrap();
        let group = &groups.auto_scaling_groups()[0];
        let template = group.launch_template().unwrap();
        assert_eq!(template.launch_template_id(), Some("lt-0abc"));
        assert_eq!(template.launch_template_name(), Some("nodes"));
        assert_eq!(template.version(), Some("2"));
        let policy = group.instance_maintenance_policy().unwrap();
        assert_eq!(
            (
                policy.min_healthy_percentage(),
                policy.max_healthy_percentage()
            ),
            (Some(100), Some(150))
        );
        let retention = group
            .instance_lifecycle_policy()
            .and_then(|p| p.retention_triggers())
            .and_then(|t| t.terminate_hook_abandon());
        assert_eq!(retention, Some(&RetentionAction::Retain));
        let old = group
            .instances()
            .iter()
            .find(|i| i.instance_id() == Some("i-00000001"))
            .unwrap();
        assert_eq!(old.instance_type(), Some("m6i.large"));
        assert_eq!(old.launch_template().and_then(|t| t.version()), Some("1"));
        assert_eq!(
            old.lifecycle_state(),
            Some(&LifecycleState::TerminatingWait)
        );
        let new = group
            .instances()
            .iter()
            .find(|i| !i.instance_id().unwrap_or_default().starts_with("i-0000000"))
            .unwrap();
        assert_eq!(new.launch_template().and_then(|t| t.version()), Some("2"));

        let instances = client
            .describe_auto_scaling_instances()
            .instance_ids("i-00000002")
            .send()
            .await
            .unwrap();
        let details = &instances.auto_scaling_instances()[0];
        assert_eq!(details.instance_type(), Some("m6i.large"));
        let template = details.launch_template().unwrap();
        assert_eq!(
            (template.launch_template_name(), template.version()),
            (Some("nodes"), Some("1"))
        );

        let cancelled = client
            .cancel_instance_refresh()
            .auto_scaling_group_name(GROUP)
            .send()
            .await
            .unwrap();
        assert_eq!(cancelled.instance_refresh_id(), Some(id.as_str()));
        let status = client
            .describe_instance_refreshes()
            .auto_scaling_group_name(GROUP)
            .send()
            .await
            .unwrap()
            .instance_refreshes()[0]
            .status()
            .cloned();
        assert_eq!(
            status.map(|s| s.as_str().to_owned()).as_deref(),
            Some("Cancelling")
        );
        let none = client
            .cancel_instance_refresh()
            .auto_scaling_group_name("other")
            .send()
            .await
            .unwrap_err();
        assert_eq!(none.code(), Some("ActiveInstanceRefreshNotFound"));
    }
}
