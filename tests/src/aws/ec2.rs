//! Fake EC2: `DescribeInstances` over the instances a test adds, and the state-change
//! notifications EC2 puts on the default EventBridge bus when an instance's state changes.
//! The Spot and scheduled-event side (`DescribeSpotInstanceRequests`,
//! `DescribeInstanceStatus`, interruption warnings) lives in `interruptions`.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::interruptions::{FakeSpotRequest, ScheduledEvent};
use super::protocol::{self, ApiError, QueryParams, Reply, element};
use super::{Shared, lock};

/// An instance's state, as EC2 reports it (`instanceState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
}

impl InstanceState {
    pub(super) fn code_and_name(self) -> (u16, &'static str) {
        match self {
            Self::Pending => (0, "pending"),
            Self::Running => (16, "running"),
            Self::ShuttingDown => (32, "shutting-down"),
            Self::Terminated => (48, "terminated"),
            Self::Stopping => (64, "stopping"),
            Self::Stopped => (80, "stopped"),
        }
    }
}

/// An EC2 instance as a test declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeInstance {
    pub instance_id: String,
    /// The node name on EKS. Empty once terminated, as EC2 reports it.
    pub private_dns_name: String,
    pub private_ip_address: String,
    pub availability_zone: String,
    pub instance_type: String,
    pub image_id: String,
    pub state: InstanceState,
    pub tags: BTreeMap<String, String>,
    /// The ARN of the instance profile the instance was launched with.
    pub iam_instance_profile_arn: Option<String>,
    /// `LaunchTime`: when the instance last started (EC2 moves it forward when a stopped
    /// instance starts again).
    pub launch_time: jiff::Timestamp,
    /// When its primary network interface was attached: its first launch (the interface
    /// stays attached across a stop and a start).
    pub first_launch: jiff::Timestamp,
    /// The Spot request of a Spot instance (`None`: On-Demand).
    pub spot_request: Option<FakeSpotRequest>,
    /// What `DescribeInstanceStatus` reports in `eventsSet`, oldest first.
    pub scheduled_events: Vec<ScheduledEvent>,
    /// A running instance's status checks fail (`impaired`: the host or the instance is
    /// unreachable); otherwise they pass.
    pub impaired: bool,
}

impl FakeInstance {
    /// A running instance in `region`'s zone `a`, with a private IP and DNS name derived from
    /// the id (stable across runs) in EC2's naming (`ip-10-0-1-2.eu-west-1.compute.internal`,
    /// `....ec2.internal` in us-east-1).
    pub fn new(instance_id: &str, region: &str) -> Self {
        let digest = Sha256::digest(instance_id.as_bytes());
        let now = jiff::Timestamp::now();
        let ip = format!("10.0.{}.{}", digest[0], digest[1].max(4));
        let host = format!("ip-{}", ip.replace('.', "-"));
        let private_dns_name = if region == "us-east-1" {
            format!("{host}.ec2.internal")
        } else {
            format!("{host}.{region}.compute.internal")
        };
        Self {
            instance_id: instance_id.to_owned(),
            private_dns_name,
            private_ip_address: ip,
            availability_zone: format!("{region}a"),
            instance_type: "m5.large".to_owned(),
            image_id: "ami-0123456789abcdef0".to_owned(),
            state: InstanceState::Running,
            tags: BTreeMap::new(),
            iam_instance_profile_arn: None,
            launch_time: now,
            first_launch: now,
            spot_request: None,
            scheduled_events: Vec::new(),
            impaired: false,
        }
    }

    /// A Spot instance: EC2 reports `instanceLifecycle` `spot` and a one-time Spot request
    /// (`sir-` and 8 characters derived from the id, stable across runs), fulfilled at the
    /// instance's launch time.
    pub fn spot(mut self) -> Self {
        self.spot_request = Some(FakeSpotRequest::fulfilled(
            &self.instance_id,
            self.launch_time,
        ));
        self
    }

    pub fn private_dns_name(mut self, name: &str) -> Self {
        self.private_dns_name = name.to_owned();
        self
    }

    pub fn availability_zone(mut self, zone: &str) -> Self {
        self.availability_zone = zone.to_owned();
        self
    }

    pub fn state(mut self, state: InstanceState) -> Self {
        self.state = state;
        self
    }

    pub fn instance_profile(mut self, instance_profile_arn: &str) -> Self {
        self.iam_instance_profile_arn = Some(instance_profile_arn.to_owned());
        self
    }

    /// Launched at `at` and running since (its first launch too).
    pub fn launch_time(mut self, at: jiff::Timestamp) -> Self {
        self.launch_time = at;
        self.first_launch = at;
        self
    }

    pub fn tag(mut self, key: &str, value: &str) -> Self {
        self.tags.insert(key.to_owned(), value.to_owned());
        self
    }
}

#[derive(Default)]
pub(crate) struct Ec2State {
    pub(super) instances: BTreeMap<String, FakeInstance>,
    /// Instance ids rebooted by `RebootInstances`, in call order.
    reboots: Vec<String>,
    /// Launch templates by id.
    launch_templates: BTreeMap<String, FakeEc2LaunchTemplate>,
}

/// A launch template as EC2 knows it: what its `$Default` and `$Latest` versions are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeEc2LaunchTemplate {
    pub id: String,
    pub name: String,
    pub default_version: i64,
    pub latest_version: i64,
}

impl FakeEc2LaunchTemplate {
    pub fn new(id: &str, name: &str, default_version: i64, latest_version: i64) -> Self {
        Self {
            id: id.to_owned(),
            name: name.to_owned(),
            default_version,
            latest_version,
        }
    }
}

/// The version number `version` of the template (by id, else by name) stands for:
/// `$Default` and `$Latest` as EC2 reports them now; `None` when EC2 does not know the
/// template or the version is not symbolic.
pub(crate) fn resolve_template_version(
    shared: &Shared,
    id: &str,
    name: &str,
    version: &str,
) -> Option<String> {
    let state = lock(&shared.ec2);
    let template = state.launch_templates.values().find(|t| {
        if id.is_empty() {
            t.name == name
        } else {
            t.id == id
        }
    })?;
    match version {
        "$Default" => Some(template.default_version.to_string()),
        "$Latest" => Some(template.latest_version.to_string()),
        _ => None,
    }
}

/// `DescribeLaunchTemplates` by `LaunchTemplateId.N` or `LaunchTemplateName.N`: an unknown
/// one fails the call, as EC2 does.
fn describe_launch_templates(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let ids = protocol::query_list(params, "LaunchTemplateId");
    let names = protocol::query_list(params, "LaunchTemplateName");
    let state = lock(&shared.ec2);
    let mut found = Vec::new();
    for id in &ids {
        found.push(state.launch_templates.get(id).ok_or_else(|| {
            ApiError::new(
                400,
                "InvalidLaunchTemplateId.NotFound",
                format!("The specified launch template, with template ID {id}, does not exist."),
            )
        })?);
    }
    for name in &names {
        found.push(
            state
                .launch_templates
                .values()
                .find(|t| t.name == *name)
                .ok_or_else(|| {
                    ApiError::new(
                        400,
                        "InvalidLaunchTemplateName.NotFoundException",
                        format!("At least one of the launch templates specified in the request does not exist: {name}"),
                    )
                })?,
        );
    }
    if ids.is_empty() && names.is_empty() {
        found.extend(state.launch_templates.values());
    }
    let items: String = found
        .iter()
        .map(|t| {
            format!(
                "<item>{}{}<defaultVersionNumber>{}</defaultVersionNumber><latestVersionNumber>{}</latestVersionNumber></item>",
                element("launchTemplateId", &t.id),
                element("launchTemplateName", &t.name),
                t.default_version,
                t.latest_version
            )
        })
        .collect();
    Ok(Reply::Xml(format!(
        "<launchTemplates>{items}</launchTemplates>"
    )))
}

/// Handle on the fake EC2.
#[derive(Clone)]
pub struct FakeEc2 {
    shared: Arc<Shared>,
}

impl FakeEc2 {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Adds (or replaces) an instance.
    pub fn add_instance(&self, instance: FakeInstance) {
        lock(&self.shared.ec2)
            .instances
            .insert(instance.instance_id.clone(), instance);
    }

    /// A running instance with derived DNS name (see [`FakeInstance::new`]) in the account's
    /// region; returns it.
    pub fn add_running_instance(&self, instance_id: &str) -> FakeInstance {
        let instance = FakeInstance::new(instance_id, &self.shared.account.region);
        self.add_instance(instance.clone());
        instance
    }

    pub fn instance(&self, instance_id: &str) -> Option<FakeInstance> {
        lock(&self.shared.ec2).instances.get(instance_id).cloned()
    }

    /// The instance was launched at `at` and has run since: EC2 reports it as its
    /// `LaunchTime` and its primary network interface's attach time.
    pub fn set_launch_time(&self, instance_id: &str, at: jiff::Timestamp) {
        if let Some(instance) = lock(&self.shared.ec2).instances.get_mut(instance_id) {
            instance.launch_time = at;
            instance.first_launch = at;
        }
    }

    pub fn set_state(&self, instance_id: &str, state: InstanceState) {
        set_state_of(&self.shared, instance_id, state);
    }

    /// The instance's status checks fail (`impaired`) while it runs, or pass again.
    pub fn set_impaired(&self, instance_id: &str, impaired: bool) {
        if let Some(instance) = lock(&self.shared.ec2).instances.get_mut(instance_id) {
            instance.impaired = impaired;
        }
    }

    /// Adds (or replaces) a launch template (`DescribeLaunchTemplates`).
    pub fn add_launch_template(&self, template: FakeEc2LaunchTemplate) {
        lock(&self.shared.ec2)
            .launch_templates
            .insert(template.id.clone(), template);
    }
}

impl FakeEc2 {
    /// Every instance rebooted by `RebootInstances`, in call order.
    pub fn reboots(&self) -> Vec<String> {
        lock(&self.shared.ec2).reboots.clone()
    }
}

/// `RebootInstances`: every id must be a known, not terminated instance, else nothing is rebooted.
fn reboot_instances(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let ids = protocol::query_list(params, "InstanceId");
    if ids.is_empty() {
        return Err(ApiError::new(
            400,
            "MissingParameter",
            "The request must contain the parameter InstanceId",
        ));
    }
    if let Some(bad) = ids.iter().find(|id| !is_instance_id(id)) {
        return Err(ApiError::new(
            400,
            "InvalidInstanceID.Malformed",
            format!("Invalid id: \"{bad}\""),
        ));
    }
    let mut state = lock(&shared.ec2);
    if let Some(missing) = ids.iter().find(|id| {
        state
            .instances
            .get(*id)
            .is_none_or(|i| i.state == InstanceState::Terminated)
    }) {
        return Err(ApiError::new(
            400,
            "InvalidInstanceID.NotFound",
            format!("The instance ID '{missing}' does not exist"),
        ));
    }
    state.reboots.extend(ids);
    Ok(Reply::Xml("<return>true</return>".to_owned()))
}

/// Called when Auto Scaling stops or starts an instance of a warm pool.
/// A start (into `Pending` or `Running` from any other state) is a new launch for EC2.
/// A change of state is announced on the bus, as EC2 does; setting the same state again is
/// no transition and announces nothing.
pub(crate) fn set_state_of(shared: &Shared, instance_id: &str, state: InstanceState) {
    let changed = {
        let mut ec2 = lock(&shared.ec2);
        let Some(instance) = ec2.instances.get_mut(instance_id) else {
            return;
        };
        let starting = |s| matches!(s, InstanceState::Pending | InstanceState::Running);
        if starting(state) && !starting(instance.state) {
            instance.launch_time = jiff::Timestamp::now();
        }
        let changed = instance.state != state;
        instance.state = state;
        changed
    };
    if changed {
        emit_state_change(shared, instance_id, state);
    }
}

/// Called when Auto Scaling lets an instance go: EC2 reports it terminated, without DNS name.
/// EC2 announces `shutting-down` then `terminated` (a termination always passes through
/// `shutting-down`), each only if the instance was not already past it.
/// The tag name Auto Scaling puts on its instances.
const GROUP_TAG: &str = "aws:autoscaling:groupName";

/// Keeps the group tag on an instance that leaves its group terminated: EC2 goes on
/// describing a terminated instance with its tags for a while, the group's included.
pub(crate) fn keep_group_tag(shared: &Shared, instance_id: &str, group_name: &str) {
    if let Some(instance) = lock(&shared.ec2).instances.get_mut(instance_id) {
        instance
            .tags
            .entry(GROUP_TAG.to_owned())
            .or_insert_with(|| group_name.to_owned());
    }
}

pub(crate) fn mark_terminated(shared: &Shared, instance_id: &str) {
    let previous = {
        let mut ec2 = lock(&shared.ec2);
        let Some(instance) = ec2.instances.get_mut(instance_id) else {
            return;
        };
        let previous = instance.state;
        instance.state = InstanceState::Terminated;
        instance.private_dns_name.clear();
        previous
    };
    if !matches!(
        previous,
        InstanceState::ShuttingDown | InstanceState::Terminated
    ) {
        emit_state_change(shared, instance_id, InstanceState::ShuttingDown);
    }
    if previous != InstanceState::Terminated {
        emit_state_change(shared, instance_id, InstanceState::Terminated);
    }
}

/// `arn:<partition>:ec2:<region>:<account>:instance/<id>`, as EC2's events name an instance.
pub(super) fn instance_arn(shared: &Shared, instance_id: &str) -> String {
    let account = &shared.account;
    format!(
        "arn:{}:ec2:{}:{}:instance/{instance_id}",
        account.partition, account.region, account.account_id
    )
}

/// `EC2 Instance State-change Notification` for `state`, as EC2 puts it on the default bus.
fn emit_state_change(shared: &Shared, instance_id: &str, state: InstanceState) {
    super::eventbridge::emit(
        shared,
        "aws.ec2",
        "EC2 Instance State-change Notification",
        vec![instance_arn(shared, instance_id)],
        serde_json::json!({
            "instance-id": instance_id,
            "state": state.code_and_name().1,
        }),
    );
}

pub(crate) fn dispatch(
    shared: &Shared,
    operation: &str,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    match operation {
        "DescribeInstances" => describe_instances(shared, params),
        "RebootInstances" => reboot_instances(shared, params),
        "DescribeLaunchTemplates" => describe_launch_templates(shared, params),
        "DescribeSpotInstanceRequests" => {
            super::interruptions::describe_spot_instance_requests(shared, params)
        }
        "DescribeInstanceStatus" => super::interruptions::describe_instance_status(shared, params),
        other => Err(ApiError::new(
            400,
            "InvalidAction",
            format!("The action {other} is not valid for this web service."),
        )),
    }
}

fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        (hex.len() == 8 || hex.len() == 17) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

fn filter_matches(instance: &FakeInstance, name: &str, values: &[String]) -> bool {
    let any = |value: &str| values.iter().any(|v| v == value);
    match name {
        "instance-id" => any(&instance.instance_id),
        "private-dns-name" => any(&instance.private_dns_name),
        "private-ip-address" => any(&instance.private_ip_address),
        "availability-zone" => any(&instance.availability_zone),
        "instance-state-name" => any(instance.state.code_and_name().1),
        "tag-key" => instance.tags.keys().any(|k| any(k)),
        "iam-instance-profile.arn" => instance
            .iam_instance_profile_arn
            .as_deref()
            .is_some_and(any),
        _ => match name.strip_prefix("tag:") {
            Some(key) => instance.tags.get(key).is_some_and(|v| any(v)),
            None => false,
        },
    }
}

/// The `Filter.N.Name` / `Filter.N.Value.M` pairs of an EC2 request, in order.
pub(super) fn query_filters(params: &QueryParams) -> Vec<(String, Vec<String>)> {
    let mut filters = Vec::new();
    for index in 1.. {
        let Some(name) = params.get(&format!("Filter.{index}.Name")) else {
            break;
        };
        let values = protocol::query_list(params, &format!("Filter.{index}.Value"));
        filters.push((name.clone(), values));
    }
    filters
}

/// EC2's answer to instance ids it cannot read (`InvalidInstanceID.Malformed`) or does not
/// know (`InvalidInstanceID.NotFound`, every unknown id named).
pub(super) fn check_instance_ids(state: &Ec2State, ids: &[String]) -> Result<(), ApiError> {
    if let Some(bad) = ids.iter().find(|id| !is_instance_id(id)) {
        return Err(ApiError::new(
            400,
            "InvalidInstanceID.Malformed",
            format!("Invalid id: \"{bad}\""),
        ));
    }
    let missing: Vec<&str> = ids
        .iter()
        .filter(|id| !state.instances.contains_key(*id))
        .map(String::as_str)
        .collect();
    match missing.as_slice() {
        [] => Ok(()),
        [one] => Err(ApiError::new(
            400,
            "InvalidInstanceID.NotFound",
            format!("The instance ID '{one}' does not exist"),
        )),
        many => Err(ApiError::new(
            400,
            "InvalidInstanceID.NotFound",
            format!("The instance IDs '{}' do not exist", many.join(", ")),
        )),
    }
}

fn describe_instances(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let ids = protocol::query_list(params, "InstanceId");
    let filters = query_filters(params);
    // Read before EC2's own state is locked (Auto Scaling's paths lock the two the other
    // way round).
    let groups = super::autoscaling::FakeAutoScaling::memberships(shared);
    let state = lock(&shared.ec2);
    check_instance_ids(&state, &ids)?;
    let account_id = &shared.account.account_id;
    let mut reservations = String::new();
    for instance in state.instances.values() {
        if !ids.is_empty() && !ids.contains(&instance.instance_id) {
            continue;
        }
        if !filters
            .iter()
            .all(|(name, values)| filter_matches(instance, name, values))
        {
            continue;
        }
        let (code, name) = instance.state.code_and_name();
        let reservation_id = format!("r-{}", &instance.instance_id[2..]);
        let mut tags = String::new();
        // Auto Scaling tags its instances with their group, a tag nobody else may set.
        let group_tag = groups
            .get(&instance.instance_id)
            .filter(|_| !instance.tags.contains_key(GROUP_TAG))
            .map(|group| (GROUP_TAG.to_owned(), group.clone()));
        for (key, value) in instance
            .tags
            .iter()
            .chain(group_tag.as_ref().map(|(k, v)| (k, v)))
        {
            tags.push_str(&format!(
                "<item>{}{}</item>",
                element("key", key),
                element("value", value)
            ));
        }
        let profile = instance
            .iam_instance_profile_arn
            .as_deref()
            .map(|arn| {
                format!(
                    "<iamInstanceProfile>{}{}</iamInstanceProfile>",
                    element("arn", arn),
                    element("id", "AIPAFAKE")
                )
            })
            .unwrap_or_default();
        let spot = instance
            .spot_request
            .as_ref()
            .map(|request| {
                format!(
                    "<instanceLifecycle>spot</instanceLifecycle>{}",
                    element("spotInstanceRequestId", &request.spot_instance_request_id)
                )
            })
            .unwrap_or_default();
        let interface = primary_network_interface(instance);
        reservations.push_str(&format!(
            "<item><reservationId>{reservation_id}</reservationId><ownerId>{account_id}</ownerId><groupSet/><instancesSet><item>{}{}<instanceState><code>{code}</code><name>{name}</name></instanceState>{}<dnsName/>{}<amiLaunchIndex>0</amiLaunchIndex>{}<placement>{}<groupName/><tenancy>default</tenancy></placement>{}{profile}{spot}{interface}<tagSet>{tags}</tagSet></item></instancesSet></item>",
            element("instanceId", &instance.instance_id),
            element("imageId", &instance.image_id),
            element("privateDnsName", &instance.private_dns_name),
            element("instanceType", &instance.instance_type),
            element("launchTime", &whole_seconds(instance.launch_time).to_string()),
            element("availabilityZone", &instance.availability_zone),
            if instance.state == InstanceState::Terminated {
                String::new()
            } else {
                element("privateIpAddress", &instance.private_ip_address)
            },
        ));
    }
    Ok(Reply::Xml(format!(
        "<reservationSet>{reservations}</reservationSet>"
    )))
}

/// The instance's primary network interface (device index 0), attached at its first launch.
fn primary_network_interface(instance: &FakeInstance) -> String {
    let id = instance.instance_id.trim_start_matches("i-");
    format!(
        "<networkInterfaceSet><item><networkInterfaceId>eni-{id}</networkInterfaceId><attachment><attachmentId>eni-attach-{id}</attachmentId><deviceIndex>0</deviceIndex><status>attached</status>{}</attachment></item></networkInterfaceSet>",
        element(
            "attachTime",
            &whole_seconds(instance.first_launch).to_string()
        )
    )
}

/// EC2 reports times to the second.
fn whole_seconds(at: jiff::Timestamp) -> jiff::Timestamp {
    jiff::Timestamp::from_second(at.as_second()).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_ids_have_8_or_17_hex_digits() {
        assert!(is_instance_id("i-07e9ea9eb19a67337"));
        assert!(is_instance_id("i-1234abcd"));
        assert!(!is_instance_id("i-xyz"));
        assert!(!is_instance_id("07e9ea9eb19a67337"));
    }

    #[test]
    fn derived_dns_names_follow_the_region_convention() {
        let eu = FakeInstance::new("i-07e9ea9eb19a67337", "eu-west-1");
        assert!(eu.private_dns_name.starts_with("ip-10-0-"));
        assert!(eu.private_dns_name.ends_with(".eu-west-1.compute.internal"));
        let us = FakeInstance::new("i-07e9ea9eb19a67337", "us-east-1");
        assert!(us.private_dns_name.ends_with(".ec2.internal"));
        assert_eq!(
            eu.private_ip_address,
            FakeInstance::new("i-07e9ea9eb19a67337", "eu-west-1").private_ip_address
        );
    }
}
