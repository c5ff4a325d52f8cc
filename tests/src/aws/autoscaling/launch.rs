//! What instances are launched with (launch template, instance type), and the launching and
//! leaving of instances Auto Scaling itself decides on (health replacements, instance
//! refreshes): a new EC2 instance, the test's launcher callbacks, the launching hook.

use std::sync::Arc;

use super::{FakeAutoScaling, GroupInstance, GroupRecord, LifecycleTransition};
use crate::aws::protocol::{self, element};
use crate::aws::{FakeAwsError, Shared, lock};

/// A launch template specification: what a group launches with, what an instance was
/// launched with, or what an instance refresh wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLaunchTemplate {
    /// `lt-…`; empty when the specification names the template only by name.
    pub id: String,
    /// Empty when the specification names the template only by id.
    pub name: String,
    /// A version number, `$Latest` or `$Default` (the fake compares versions as text).
    pub version: String,
}

impl FakeLaunchTemplate {
    pub fn new(id: &str, name: &str, version: &str) -> Self {
        Self {
            id: id.to_owned(),
            name: name.to_owned(),
            version: version.to_owned(),
        }
    }

    /// Whether an instance launched with `actual` already runs this (desired) template:
    /// the same template (by id when this names one, else by name) at the same version.
    pub(super) fn is_met_by(&self, actual: &FakeLaunchTemplate) -> bool {
        let same_template = if self.id.is_empty() {
            self.name == actual.name
        } else {
            self.id == actual.id
        };
        same_template && self.version == actual.version
    }

    /// `<LaunchTemplate>` as Auto Scaling reports it, without the parts not specified.
    pub(super) fn xml(&self) -> String {
        let mut xml = String::from("<LaunchTemplate>");
        if !self.id.is_empty() {
            xml.push_str(&element("LaunchTemplateId", &self.id));
        }
        if !self.name.is_empty() {
            xml.push_str(&element("LaunchTemplateName", &self.name));
        }
        xml.push_str(&element("Version", &self.version));
        xml.push_str("</LaunchTemplate>");
        xml
    }
}

/// A group's `InstanceMaintenancePolicy`: the healthy capacity kept while instances are
/// replaced (instance refreshes default to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceMaintenancePolicy {
    pub min_healthy_percentage: u32,
    pub max_healthy_percentage: u32,
}

/// An instance Auto Scaling launched, as handed to the callbacks of
/// [`FakeAutoScaling::on_instance_launched`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchedInstance {
    pub group_name: String,
    pub instance_id: String,
    /// Its node name on EKS.
    pub private_dns_name: String,
    pub availability_zone: String,
}

pub(super) type LaunchedCallback = Arc<dyn Fn(&LaunchedInstance) + Send + Sync>;
pub(super) type TerminatedCallback = Arc<dyn Fn(&str) + Send + Sync>;

/// The callbacks a test registered, kept apart from the state so they run unlocked.
#[derive(Default)]
pub(super) struct Launchers {
    launched: Vec<LaunchedCallback>,
    terminated: Vec<TerminatedCallback>,
}

impl FakeAutoScaling {
    /// Calls `callback` for every instance Auto Scaling launches on its own (health
    /// replacements, instance refreshes) once its EC2 instance exists and before its
    /// launching hook starts: the place for a test to make the instance's Node appear.
    pub fn on_instance_launched(&self, callback: LaunchedCallback) {
        lock(&self.shared.autoscaling.launchers)
            .launched
            .push(callback);
    }

    /// Calls `callback` with the id of every instance that leaves its group terminated,
    /// so a test can delete its Node.
    pub fn on_instance_terminated(&self, callback: TerminatedCallback) {
        lock(&self.shared.autoscaling.launchers)
            .terminated
            .push(callback);
    }

    /// A user's node update: the group launches `version` of its template from now on;
    /// instances keep the version they were launched with.
    pub fn set_launch_template_version(
        &self,
        group_name: &str,
        version: &str,
    ) -> Result<(), FakeAwsError> {
        let mut state = self.state();
        let record = state
            .groups
            .get_mut(group_name)
            .ok_or_else(|| FakeAwsError::UnknownGroup(group_name.to_owned()))?;
        let template = record
            .group
            .launch_template
            .as_mut()
            .ok_or_else(|| FakeAwsError::NoLaunchTemplate(group_name.to_owned()))?;
        template.version = version.to_owned();
        Ok(())
    }
}

/// The zone Auto Scaling balances a launch into: of the group's zones, the one with the fewest
/// instances not leaving the group (the first listed among equals).
fn balancing_zone(record: &GroupRecord) -> Option<String> {
    record
        .group
        .availability_zones
        .iter()
        .min_by_key(|zone| {
            record
                .instances
                .values()
                .filter(|i| &i.availability_zone == *zone)
                .filter(|i| !i.lifecycle_state.starts_with("Terminating"))
                .count()
        })
        .cloned()
}

/// Launches a new instance into the group as Auto Scaling does: an EC2 instance with the
/// group's tags and instance type in `zone` (else the zone [`balancing_zone`] picks), the launcher
/// callbacks, then the launching hook (`Pending:Wait`) or, without one, `InService` at once.
/// `launch_template` overrides the group's (an instance refresh's desired configuration).
pub(super) fn launch_new_instance(
    shared: &Arc<Shared>,
    group_name: &str,
    zone: Option<&str>,
    launch_template: Option<FakeLaunchTemplate>,
) -> Result<LaunchedInstance, FakeAwsError> {
    let digest = protocol::uuid_v4().replace('-', "");
    let instance_id = format!("i-{}", &digest[..17]);
    let (zone, instance_type, tags, has_launching_hook) = {
        let mut state = lock(&shared.autoscaling.state);
        let joined = state.next_joined();
        let record = state
            .groups
            .get_mut(group_name)
            .ok_or_else(|| FakeAwsError::UnknownGroup(group_name.to_owned()))?;
        let zone = zone
            .map(str::to_owned)
            .or_else(|| balancing_zone(record))
            .unwrap_or_else(|| format!("{}a", shared.account.region));
        let has_launching_hook = record
            .hooks
            .values()
            .any(|hook| hook.transition == LifecycleTransition::Launching);
        let instance_type = record.group.instance_type.clone();
        record.instances.insert(
            instance_id.clone(),
            GroupInstance {
                lifecycle_state: "Pending".to_owned(),
                availability_zone: zone.clone(),
                launch_template: launch_template.or_else(|| record.group.launch_template.clone()),
                instance_type: instance_type.clone(),
                joined,
            },
        );
        (
            zone,
            instance_type,
            record.group.tags.clone(),
            has_launching_hook,
        )
    };
    let mut instance = crate::aws::ec2::FakeInstance::new(&instance_id, &shared.account.region)
        .availability_zone(&zone);
    instance.instance_type = instance_type;
    instance.tags = tags;
    let launched = LaunchedInstance {
        group_name: group_name.to_owned(),
        instance_id: instance_id.clone(),
        private_dns_name: instance.private_dns_name.clone(),
        availability_zone: zone,
    };
    crate::aws::ec2::FakeEc2::new(Arc::clone(shared)).add_instance(instance);
    let callbacks = lock(&shared.autoscaling.launchers).launched.clone();
    for callback in callbacks {
        callback(&launched);
    }
    if has_launching_hook {
        FakeAutoScaling::new(Arc::clone(shared)).launch_instance(group_name, &instance_id)?;
    } else if let Some(instance) = lock(&shared.autoscaling.state)
        .groups
        .get_mut(group_name)
        .and_then(|record| record.instances.get_mut(&instance_id))
    {
        instance.lifecycle_state = "InService".to_owned();
    }
    Ok(launched)
}

/// Takes an instance out of its group without a terminating hook: it leaves at once.
pub(super) fn terminate_at_once(shared: &Shared, group_name: &str, instance_id: &str) {
    let mut state = lock(&shared.autoscaling.state);
    if let Some(record) = state.groups.get_mut(group_name) {
        record.instances.remove(instance_id);
    }
    crate::aws::ec2::keep_group_tag(shared, instance_id, group_name);
    crate::aws::ec2::mark_terminated(shared, instance_id);
    state.departed.push(instance_id.to_owned());
    drop(state);
    announce_departures(shared);
}

/// Calls the terminated callbacks for the instances that left since the last call. Callers
/// run it with the state unlocked, so a callback may use the fake.
pub(super) fn announce_departures(shared: &Shared) {
    let departed = std::mem::take(&mut lock(&shared.autoscaling.state).departed);
    if departed.is_empty() {
        return;
    }
    let callbacks = lock(&shared.autoscaling.launchers).terminated.clone();
    for instance_id in &departed {
        for callback in &callbacks {
            callback(instance_id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_desired_template_is_matched_by_id_else_by_name_and_by_version() {
        let actual = FakeLaunchTemplate::new("lt-1", "nodes", "3");
        assert!(FakeLaunchTemplate::new("lt-1", "", "3").is_met_by(&actual));
        assert!(FakeLaunchTemplate::new("", "nodes", "3").is_met_by(&actual));
        assert!(!FakeLaunchTemplate::new("lt-1", "", "4").is_met_by(&actual));
        assert!(!FakeLaunchTemplate::new("lt-2", "nodes", "3").is_met_by(&actual));
    }

    #[test]
    fn the_xml_leaves_out_what_was_not_specified() {
        assert_eq!(
            FakeLaunchTemplate::new("", "nodes", "$Latest").xml(),
            "<LaunchTemplate><LaunchTemplateName>nodes</LaunchTemplateName><Version>$Latest</Version></LaunchTemplate>"
        );
    }

    #[tokio::test]
    async fn a_launch_goes_to_the_zone_with_the_fewest_instances() {
        let aws = crate::aws::FakeAws::start(crate::account::FakeAccount::reference())
            .await
            .unwrap();
        let zones = ["eu-west-1a", "eu-west-1b", "eu-west-1c"];
        aws.autoscaling()
            .add_group(crate::aws::FakeAutoScalingGroup::new("g").availability_zones(&zones));
        for (id, zone) in [("i-01", zones[0]), ("i-02", zones[0]), ("i-03", zones[1])] {
            aws.autoscaling().add_instance("g", id, zone).unwrap();
        }
        let launched: Vec<String> = (0..3)
            .map(|_| {
                launch_new_instance(&aws.shared, "g", None, None)
                    .unwrap()
                    .availability_zone
            })
            .collect();
        // c had none; then b and c have one each against a's two: b, listed first; then c.
        assert_eq!(launched, ["eu-west-1c", "eu-west-1b", "eu-west-1c"]);
    }
}
