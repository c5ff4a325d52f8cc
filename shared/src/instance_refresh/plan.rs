//! Which instances the refresh replaces (pure). How many of their nodes are taken out of
//! service now is the room rule's ([`super::room`]), the same for both strategies: only as
//! far as the capacity the refresh does not replace can take their pods.
//!
//! An instance is outdated when the refresh will replace it, as Auto Scaling decides
//! ([`will_replace`]): it was in the group before the refresh started (launched before the
//! refresh's `StartTime`: an instance launched since is the refresh's own replacement, or
//! was launched with the configuration the refresh applies), it is `InService` (or `Standby` with
//! `StandbyInstances` `Terminate` or `Wait`), it is not protected from scale-in unless
//! `ScaleInProtectedInstances` is `Refresh` or `Wait`, and, with `SkipMatching`, it does not
//! match the desired configuration ([`super::matching`]). The plan is a function of what
//! Auto Scaling and EC2 say now, so a retried, duplicated or late start plans the same.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Serialize;

use super::matching::{DesiredConfiguration, ResolvedVersions};
use crate::aws::{ConfiguredInstance, GroupConfiguration, InstanceRefreshDescription};

/// Auto Scaling's defaults when neither the refresh nor the group's maintenance policy sets
/// them.
const DEFAULT_MIN_HEALTHY: u32 = 90;
const DEFAULT_MAX_HEALTHY: u32 = 100;

/// What to mark, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MarkPlan {
    /// Every instance the refresh will replace.
    pub outdated: Vec<String>,
    /// Outdated instances whose nodes are (to be) out of service: the room rule's choice.
    pub mark: Vec<String>,
    /// Outdated instances whose nodes stay schedulable for now: no room for their pods.
    pub kept: Vec<String>,
    pub launch_before_terminate: bool,
    pub min_healthy_percentage: u32,
    pub max_healthy_percentage: u32,
}

/// What EC2 says about the group's instances and templates, read for the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchFacts {
    /// When each instance was first launched ([`crate::aws::RefreshInstances::launch_times`]); an instance EC2 no longer knows is absent.
    pub launch_times: BTreeMap<String, Timestamp>,
    /// What `$Default` and `$Latest` of the templates involved stand for.
    pub versions: ResolvedVersions,
}

/// Whether Auto Scaling replaces `instance` in `refresh`.
pub fn will_replace(
    instance: &ConfiguredInstance,
    refresh: &InstanceRefreshDescription,
    desired: &DesiredConfiguration<'_>,
    facts: &LaunchFacts,
) -> bool {
    was_there_before(instance, refresh, facts)
        && in_a_replaced_state(instance, refresh)
        && (!refresh.skip_matching || !desired.is_met_by(instance, &facts.versions))
}

/// Launched before the refresh started. Compared to the second: EC2 reports `LaunchTime` to
/// the second, so an instance launched in the refresh's first second counts as new. With no
/// launch time (EC2 no longer knows the instance) nothing proves it is one to replace.
fn was_there_before(
    instance: &ConfiguredInstance,
    refresh: &InstanceRefreshDescription,
    facts: &LaunchFacts,
) -> bool {
    let Some(start) = refresh.start_time else {
        return true;
    };
    facts
        .launch_times
        .get(&instance.instance_id)
        .is_some_and(|launched| launched.as_second() < start.as_second())
}

/// `InService`, or `Standby` when the refresh terminates or waits for standby instances;
/// an instance protected from scale-in only when the refresh replaces or waits for those.
fn in_a_replaced_state(
    instance: &ConfiguredInstance,
    refresh: &InstanceRefreshDescription,
) -> bool {
    let state_replaced = match instance.lifecycle_state.as_str() {
        "InService" => true,
        "Standby" => matches!(
            refresh.standby_instances.as_deref(),
            Some("Terminate" | "Wait")
        ),
        _ => false,
    };
    let protection_allows = !instance.protected_from_scale_in
        || matches!(
            refresh.scale_in_protected_instances.as_deref(),
            Some("Refresh" | "Wait")
        );
    state_replaced && protection_allows
}

/// The instances `refresh` of `group` replaces; the room rule fills `mark` and `kept`.
pub fn plan(
    refresh: &InstanceRefreshDescription,
    group: &GroupConfiguration,
    facts: &LaunchFacts,
) -> MarkPlan {
    let min = refresh
        .min_healthy_percentage
        .or(group.maintenance_min_healthy_percentage)
        .unwrap_or(DEFAULT_MIN_HEALTHY)
        .min(100);
    let max = refresh
        .max_healthy_percentage
        .or(group.maintenance_max_healthy_percentage)
        .unwrap_or(DEFAULT_MAX_HEALTHY);
    let desired = DesiredConfiguration::of(refresh, group);
    let outdated: Vec<String> = group
        .instances
        .iter()
        .filter(|i| will_replace(i, refresh, &desired, facts))
        .map(|i| i.instance_id.clone())
        .collect();
    MarkPlan {
        outdated,
        mark: Vec::new(),
        kept: Vec::new(),
        launch_before_terminate: max > 100,
        min_healthy_percentage: min,
        max_healthy_percentage: max,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::aws::LaunchTemplateRef;

    fn template(version: &str) -> LaunchTemplateRef {
        LaunchTemplateRef {
            id: Some("lt-0abc".into()),
            name: Some("nodes".into()),
            version: Some(version.into()),
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    /// The refresh starts at second 100.
    const START: i64 = 100;

    fn group(desired: u32, instances: &[(&str, &str, &str)]) -> GroupConfiguration {
        GroupConfiguration {
            name: "ng".into(),
            desired_capacity: desired,
            launch_template: Some(template("2")),
            instances: instances
                .iter()
                .map(|(id, state, version)| ConfiguredInstance {
                    instance_id: (*id).into(),
                    lifecycle_state: (*state).into(),
                    instance_type: Some("m5.large".into()),
                    launch_template: Some(template(version)),
                    protected_from_scale_in: false,
                })
                .collect(),
            ..GroupConfiguration::default()
        }
    }

    /// Every instance of `group` launched before the refresh.
    fn launched_before(group: &GroupConfiguration) -> LaunchFacts {
        LaunchFacts {
            launch_times: group
                .instances
                .iter()
                .map(|i| (i.instance_id.clone(), at(0)))
                .collect(),
            ..LaunchFacts::default()
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
            start_time: Some(at(START)),
            min_healthy_percentage: min,
            max_healthy_percentage: max,
            skip_matching,
            ..InstanceRefreshDescription::default()
        }
    }

    fn plan_of(refresh: &InstanceRefreshDescription, group: &GroupConfiguration) -> MarkPlan {
        plan(refresh, group, &launched_before(group))
    }

    const THREE_OLD: [(&str, &str, &str); 3] = [
        ("i-1", "InService", "1"),
        ("i-2", "InService", "1"),
        ("i-3", "InService", "1"),
    ];

    #[test]
    fn every_in_service_instance_from_before_the_start_is_outdated_in_both_strategies() {
        let lbt = plan_of(&refresh(Some(100), Some(200), false), &group(3, &THREE_OLD));
        assert!(lbt.launch_before_terminate);
        assert_eq!(lbt.outdated, vec!["i-1", "i-2", "i-3"]);
        let first = plan_of(&refresh(None, None, false), &group(3, &THREE_OLD));
        assert!(!first.launch_before_terminate);
        assert_eq!(
            (first.min_healthy_percentage, first.max_healthy_percentage),
            (90, 100)
        );
        assert_eq!(first.outdated, lbt.outdated);
    }

    #[test]
    fn the_groups_maintenance_policy_applies_when_the_refresh_sets_none() {
        let mut g = group(3, &THREE_OLD);
        g.maintenance_max_healthy_percentage = Some(150);
        assert!(plan_of(&refresh(None, None, false), &g).launch_before_terminate);
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
        let marking = plan_of(&refresh(Some(100), Some(200), true), &g);
        assert_eq!(marking.outdated, vec!["i-1"]);
        let all = plan_of(&refresh(Some(100), Some(200), false), &g);
        assert_eq!(all.outdated, vec!["i-1", "i-2"]);
    }

    /// A retried or late start, after the first replacements came in service: the plan is
    /// the same as at the start, without the replacements.
    #[test]
    fn instances_launched_since_the_refresh_started_are_never_outdated() {
        let g = group(
            3,
            &[
                ("i-old", "InService", "1"),
                ("i-new", "InService", "1"),
                ("i-same-second", "InService", "1"),
                ("i-unknown", "InService", "1"),
            ],
        );
        let mut facts = launched_before(&g);
        facts.launch_times.insert("i-new".into(), at(START + 30));
        facts.launch_times.insert("i-same-second".into(), at(START));
        facts.launch_times.remove("i-unknown");
        let marking = plan(&refresh(Some(100), Some(200), false), &g, &facts);
        assert_eq!(marking.outdated, vec!["i-old"]);
    }

    #[test]
    fn protected_and_standby_instances_follow_the_refreshs_preferences() {
        let mut g = group(
            3,
            &[
                ("i-1", "InService", "1"),
                ("i-protected", "InService", "1"),
                ("i-standby", "Standby", "1"),
            ],
        );
        g.instances[1].protected_from_scale_in = true;
        let mut r = refresh(Some(100), Some(200), false);
        assert_eq!(plan_of(&r, &g).outdated, vec!["i-1"], "Ignore by default");
        r.scale_in_protected_instances = Some("Ignore".into());
        r.standby_instances = Some("Ignore".into());
        assert_eq!(plan_of(&r, &g).outdated, vec!["i-1"]);
        r.scale_in_protected_instances = Some("Refresh".into());
        r.standby_instances = Some("Terminate".into());
        assert_eq!(
            plan_of(&r, &g).outdated,
            vec!["i-1", "i-protected", "i-standby"]
        );
        r.scale_in_protected_instances = Some("Wait".into());
        r.standby_instances = Some("Wait".into());
        assert_eq!(plan_of(&r, &g).outdated.len(), 3);
    }
}
