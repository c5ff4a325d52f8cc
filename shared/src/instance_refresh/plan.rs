//! Which outdated nodes to take out of service when a refresh starts (pure).
//!
//! The rule, so that evicted pods always have somewhere to go:
//! - **Launch before terminate** (`MaxHealthyPercentage` above 100): Auto Scaling brings up
//!   each batch's replacements before it terminates the batch, so every outdated node is
//!   marked at once, as a managed node group cordons all its old nodes once the new ones are
//!   up. Pods evicted from the first node land on new nodes only.
//! - **Terminate first** (`MaxHealthyPercentage` 100): the first batch's pods need room
//!   before any replacement exists. One batch's worth of outdated nodes (the number Auto
//!   Scaling takes at once, `max(1, desired − ⌈desired × MinHealthyPercentage / 100⌉)`) is
//!   left schedulable as that room; the rest are marked. A pod may then move twice, once
//!   onto a reserve node and once off it, but a drain never waits on capacity that only its
//!   own end creates.
//!
//! An instance is outdated when the refresh will replace it: every `InService` instance
//! without `SkipMatching` (Auto Scaling's default), else those whose launch template (id or
//! name, and version) differs from the refresh's desired one (the group's own when the
//! refresh names none). A symbolic version (`$Latest`) compares as text: a mismatch we
//! cannot resolve marks the node, and the refresh's end undoes marks on nodes it kept.

use serde::Serialize;

use crate::aws::{GroupConfiguration, InstanceRefreshDescription, LaunchTemplateRef};

/// Auto Scaling's defaults when neither the refresh nor the group's maintenance policy sets
/// them.
const DEFAULT_MIN_HEALTHY: u32 = 90;
const DEFAULT_MAX_HEALTHY: u32 = 100;

/// What to mark, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MarkPlan {
    /// Instances to take out of service now.
    pub mark: Vec<String>,
    /// Outdated instances left schedulable as room for the first batch (terminate first).
    pub reserve: Vec<String>,
    /// Every instance the refresh will replace.
    pub outdated: Vec<String>,
    pub launch_before_terminate: bool,
    pub min_healthy_percentage: u32,
    pub max_healthy_percentage: u32,
    /// Instances Auto Scaling takes out at once with terminate first.
    pub batch: u32,
}

fn same_template(
    instance: Option<&LaunchTemplateRef>,
    desired: Option<&LaunchTemplateRef>,
) -> bool {
    let (Some(instance), Some(desired)) = (instance, desired) else {
        return false;
    };
    let same_template = match (&instance.id, &desired.id) {
        (Some(a), Some(b)) => a == b,
        _ => instance.name.is_some() && instance.name == desired.name,
    };
    same_template && instance.version == desired.version
}

/// The marking plan for `refresh` of `group`.
pub fn plan(refresh: &InstanceRefreshDescription, group: &GroupConfiguration) -> MarkPlan {
    let min = refresh
        .min_healthy_percentage
        .or(group.maintenance_min_healthy_percentage)
        .unwrap_or(DEFAULT_MIN_HEALTHY)
        .min(100);
    let max = refresh
        .max_healthy_percentage
        .or(group.maintenance_max_healthy_percentage)
        .unwrap_or(DEFAULT_MAX_HEALTHY);
    let desired_template = refresh
        .desired_launch_template
        .as_ref()
        .or(group.launch_template.as_ref());
    let outdated: Vec<String> = group
        .instances
        .iter()
        .filter(|i| i.lifecycle_state == "InService")
        .filter(|i| {
            !refresh.skip_matching || !same_template(i.launch_template.as_ref(), desired_template)
        })
        .map(|i| i.instance_id.clone())
        .collect();
    let desired = group.desired_capacity;
    let kept_healthy = (u64::from(desired) * u64::from(min)).div_ceil(100);
    let batch = u32::try_from(u64::from(desired).saturating_sub(kept_healthy))
        .unwrap_or(u32::MAX)
        .max(1);
    let launch_before_terminate = max > 100;
    let (mark, reserve) = if launch_before_terminate {
        (outdated.clone(), Vec::new())
    } else {
        let keep = usize::try_from(batch)
            .unwrap_or(usize::MAX)
            .min(outdated.len());
        let (mark, reserve) = outdated.split_at(outdated.len() - keep);
        (mark.to_vec(), reserve.to_vec())
    };
    MarkPlan {
        mark,
        reserve,
        outdated,
        launch_before_terminate,
        min_healthy_percentage: min,
        max_healthy_percentage: max,
        batch,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::aws::ConfiguredInstance;

    fn template(version: &str) -> LaunchTemplateRef {
        LaunchTemplateRef {
            id: Some("lt-0abc".into()),
            name: Some("nodes".into()),
            version: Some(version.into()),
        }
    }

    fn group(desired: u32, instances: &[(&str, &str, &str)]) -> GroupConfiguration {
        GroupConfiguration {
            name: "ng".into(),
            tags: Default::default(),
            desired_capacity: desired,
            launch_template: Some(template("2")),
            maintenance_min_healthy_percentage: None,
            maintenance_max_healthy_percentage: None,
            retains_abandoned_instances: false,
            instances: instances
                .iter()
                .map(|(id, state, version)| ConfiguredInstance {
                    instance_id: (*id).into(),
                    lifecycle_state: (*state).into(),
                    instance_type: Some("m5.large".into()),
                    launch_template: Some(template(version)),
                })
                .collect(),
        }
    }

    fn refresh(
        min: Option<u32>,
        max: Option<u32>,
        skip_matching: bool,
    ) -> InstanceRefreshDescription {
        InstanceRefreshDescription {
            instance_refresh_id: "r".into(),
            auto_scaling_group_name: "ng".into(),
            status: "InProgress".into(),
            min_healthy_percentage: min,
            max_healthy_percentage: max,
            skip_matching,
            desired_launch_template: None,
        }
    }

    const THREE_OLD: [(&str, &str, &str); 3] = [
        ("i-1", "InService", "1"),
        ("i-2", "InService", "1"),
        ("i-3", "InService", "1"),
    ];

    #[test]
    fn launch_before_terminate_marks_every_outdated_instance() {
        let marking = super::plan(&refresh(Some(100), Some(200), false), &group(3, &THREE_OLD));
        assert!(marking.launch_before_terminate);
        assert_eq!(marking.mark, vec!["i-1", "i-2", "i-3"]);
        assert!(marking.reserve.is_empty());
    }

    #[test]
    fn terminate_first_keeps_one_batch_schedulable() {
        let marking = super::plan(&refresh(None, None, false), &group(3, &THREE_OLD));
        assert!(!marking.launch_before_terminate);
        assert_eq!(
            (
                marking.min_healthy_percentage,
                marking.max_healthy_percentage
            ),
            (90, 100)
        );
        assert_eq!(marking.batch, 1);
        assert_eq!(marking.mark, vec!["i-1", "i-2"]);
        assert_eq!(marking.reserve, vec!["i-3"]);

        let ten: Vec<(String, &str, &str)> = (0..10)
            .map(|i| (format!("i-{i}"), "InService", "1"))
            .collect();
        let ten: Vec<(&str, &str, &str)> =
            ten.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
        let marking = super::plan(&refresh(Some(50), Some(100), false), &group(10, &ten));
        assert_eq!(marking.batch, 5);
        assert_eq!((marking.mark.len(), marking.reserve.len()), (5, 5));
    }

    #[test]
    fn the_groups_maintenance_policy_applies_when_the_refresh_sets_none() {
        let mut g = group(3, &THREE_OLD);
        g.maintenance_max_healthy_percentage = Some(150);
        assert!(plan(&refresh(None, None, false), &g).launch_before_terminate);
    }

    #[test]
    fn skip_matching_leaves_instances_with_the_desired_template_and_others_than_in_service() {
        let g = group(
            4,
            &[
                ("i-1", "InService", "1"),
                ("i-2", "InService", "2"),
                ("i-3", "Terminating:Wait", "1"),
                ("i-4", "Standby", "1"),
            ],
        );
        let marking = super::plan(&refresh(Some(100), Some(200), true), &g);
        assert_eq!(marking.outdated, vec!["i-1"]);
        let all = super::plan(&refresh(Some(100), Some(200), false), &g);
        assert_eq!(all.outdated, vec!["i-1", "i-2"]);
    }
}
