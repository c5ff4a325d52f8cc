//! `SkipMatching` as Auto Scaling compares (pure): whether an instance already runs the
//! refresh's desired configuration.
//!
//! The desired configuration is the refresh's `DesiredConfiguration` (a launch template or a
//! mixed instances policy), else the group's own, as last saved. An instance matches a launch
//! template when it runs the same template (by id, or by name when no id is known) at the
//! same version; a mixed instances policy when its instance type is one of the overrides'
//! (when they name types) and it runs the template of its type's override, else the
//! policy's. `$Default`, `$Latest` and a missing version stand for the version numbers EC2
//! reports for the template now ([`ResolvedVersions`]); a symbolic version EC2 could not
//! resolve is compared as written.

use crate::aws::{
    ConfiguredInstance, GroupConfiguration, InstanceRefreshDescription, LaunchTemplateRef,
    LaunchTemplateVersions, MixedInstancesPolicyRef,
};

/// What the refresh wants every instance to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DesiredConfiguration<'a> {
    Template(&'a LaunchTemplateRef),
    Mixed(&'a MixedInstancesPolicyRef),
    /// Neither the refresh nor the group names a template: nothing matches.
    Unknown,
}

impl<'a> DesiredConfiguration<'a> {
    pub fn of(refresh: &'a InstanceRefreshDescription, group: &'a GroupConfiguration) -> Self {
        if let Some(policy) = &refresh.desired_mixed_instances_policy {
            Self::Mixed(policy)
        } else if let Some(template) = &refresh.desired_launch_template {
            Self::Template(template)
        } else if let Some(policy) = &group.mixed_instances_policy {
            Self::Mixed(policy)
        } else if let Some(template) = &group.launch_template {
            Self::Template(template)
        } else {
            Self::Unknown
        }
    }

    /// Every launch template this configuration names (to resolve their versions).
    pub fn templates(&self) -> Vec<&'a LaunchTemplateRef> {
        match self {
            Self::Template(template) => vec![template],
            Self::Mixed(policy) => policy
                .launch_template
                .iter()
                .chain(
                    policy
                        .overrides
                        .iter()
                        .filter_map(|o| o.launch_template.as_ref()),
                )
                .collect(),
            Self::Unknown => Vec::new(),
        }
    }

    /// Whether `instance` already runs this configuration.
    pub fn is_met_by(&self, instance: &ConfiguredInstance, versions: &ResolvedVersions) -> bool {
        let wanted = match self {
            Self::Template(template) => Some(*template),
            Self::Mixed(policy) => template_for_type(policy, instance.instance_type.as_deref()),
            Self::Unknown => None,
        };
        match (wanted, &instance.launch_template) {
            (Some(wanted), Some(actual)) => versions.same(wanted, actual),
            _ => false,
        }
    }
}

/// The template instances of `instance_type` launch with under `policy`; `None` when the
/// overrides name types and this is none of them.
fn template_for_type<'a>(
    policy: &'a MixedInstancesPolicyRef,
    instance_type: Option<&str>,
) -> Option<&'a LaunchTemplateRef> {
    let typed: Vec<_> = policy
        .overrides
        .iter()
        .filter(|o| o.instance_type.is_some())
        .collect();
    if typed.is_empty() {
        return policy.launch_template.as_ref();
    }
    let chosen = typed
        .iter()
        .find(|o| instance_type.is_some() && o.instance_type.as_deref() == instance_type)?;
    chosen
        .launch_template
        .as_ref()
        .or(policy.launch_template.as_ref())
}

/// The launch templates EC2 reported, to turn a template reference into one identity and
/// one version number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvedVersions {
    pub templates: Vec<LaunchTemplateVersions>,
}

impl ResolvedVersions {
    fn known(&self, template: &LaunchTemplateRef) -> Option<&LaunchTemplateVersions> {
        self.templates.iter().find(|known| match &template.id {
            Some(id) => *id == known.id,
            None => template.name.as_deref() == Some(known.name.as_str()),
        })
    }

    /// The template's identity and version, as far as they can be known: EC2's id and
    /// version number when EC2 reported the template, else what the reference says.
    fn canonical(&self, template: &LaunchTemplateRef) -> (Option<String>, Option<String>) {
        let known = self.known(template);
        let identity = known
            .map(|k| k.id.clone())
            .or_else(|| template.id.clone())
            .or_else(|| template.name.as_ref().map(|n| format!("name:{n}")));
        let version = match (template.version.as_deref(), known) {
            (None | Some("$Default"), Some(k)) => Some(k.default_version.to_string()),
            (Some("$Latest"), Some(k)) => Some(k.latest_version.to_string()),
            (None, None) => Some("$Default".to_owned()),
            (Some(written), _) => Some(written.to_owned()),
        };
        (identity, version)
    }

    /// Whether two references name the same template at the same version.
    pub fn same(&self, a: &LaunchTemplateRef, b: &LaunchTemplateRef) -> bool {
        let (a, b) = (self.canonical(a), self.canonical(b));
        a.0.is_some() && a == b
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::aws::TemplateOverride;

    fn template(id: Option<&str>, name: Option<&str>, version: Option<&str>) -> LaunchTemplateRef {
        LaunchTemplateRef {
            id: id.map(str::to_owned),
            name: name.map(str::to_owned),
            version: version.map(str::to_owned),
        }
    }

    fn instance(instance_type: &str, launched_with: LaunchTemplateRef) -> ConfiguredInstance {
        ConfiguredInstance {
            instance_id: "i-1".into(),
            lifecycle_state: "InService".into(),
            instance_type: Some(instance_type.into()),
            launch_template: Some(launched_with),
            protected_from_scale_in: false,
        }
    }

    fn nodes_template() -> ResolvedVersions {
        ResolvedVersions {
            templates: vec![LaunchTemplateVersions {
                id: "lt-0abc".into(),
                name: "nodes".into(),
                default_version: 2,
                latest_version: 3,
            }],
        }
    }

    #[test]
    fn symbolic_versions_are_the_numbers_ec2_reports_now() {
        let versions = nodes_template();
        let on_3 = template(Some("lt-0abc"), Some("nodes"), Some("3"));
        let on_2 = template(Some("lt-0abc"), Some("nodes"), Some("2"));
        let latest = template(Some("lt-0abc"), None, Some("$Latest"));
        let default = template(None, Some("nodes"), Some("$Default"));
        let unversioned = template(Some("lt-0abc"), None, None);
        assert!(versions.same(&latest, &on_3));
        assert!(!versions.same(&latest, &on_2));
        assert!(versions.same(&default, &on_2));
        assert!(versions.same(&unversioned, &on_2), "no version is $Default");
        assert!(
            versions.same(&template(None, Some("nodes"), Some("3")), &on_3),
            "the name finds the same template as the id"
        );
        let unresolved = ResolvedVersions::default();
        assert!(
            !unresolved.same(&latest, &on_3),
            "an unresolved $Latest matches no number"
        );
        assert!(unresolved.same(&on_3, &on_3));
    }

    #[test]
    fn a_mixed_policy_matches_the_type_and_the_template_of_its_override() {
        let policy = MixedInstancesPolicyRef {
            launch_template: Some(template(Some("lt-0abc"), None, Some("3"))),
            overrides: vec![
                TemplateOverride {
                    instance_type: Some("m6i.large".into()),
                    launch_template: None,
                },
                TemplateOverride {
                    instance_type: Some("m6g.large".into()),
                    launch_template: Some(template(Some("lt-0arm"), None, Some("7"))),
                },
            ],
        };
        let desired = DesiredConfiguration::Mixed(&policy);
        let versions = nodes_template();
        let x86 = template(Some("lt-0abc"), Some("nodes"), Some("3"));
        let arm = template(Some("lt-0arm"), Some("nodes-arm"), Some("7"));
        assert!(desired.is_met_by(&instance("m6i.large", x86.clone()), &versions));
        assert!(desired.is_met_by(&instance("m6g.large", arm.clone()), &versions));
        assert!(
            !desired.is_met_by(&instance("m6g.large", x86.clone()), &versions),
            "an override's own template"
        );
        assert!(
            !desired.is_met_by(&instance("m5.large", x86), &versions),
            "a type no override names"
        );
        let untyped = MixedInstancesPolicyRef {
            launch_template: policy.launch_template.clone(),
            overrides: Vec::new(),
        };
        assert!(DesiredConfiguration::Mixed(&untyped).is_met_by(
            &instance(
                "c7i.xlarge",
                template(Some("lt-0abc"), None, Some("$Latest"))
            ),
            &versions
        ));
    }

    #[test]
    fn the_refreshs_desired_configuration_wins_over_the_groups() {
        let group = GroupConfiguration {
            launch_template: Some(template(Some("lt-0abc"), None, Some("1"))),
            ..GroupConfiguration::default()
        };
        let mut refresh = InstanceRefreshDescription::default();
        assert!(matches!(
            DesiredConfiguration::of(&refresh, &group),
            DesiredConfiguration::Template(t) if t.version.as_deref() == Some("1")
        ));
        refresh.desired_mixed_instances_policy = Some(MixedInstancesPolicyRef::default());
        assert!(matches!(
            DesiredConfiguration::of(&refresh, &group),
            DesiredConfiguration::Mixed(_)
        ));
    }
}
