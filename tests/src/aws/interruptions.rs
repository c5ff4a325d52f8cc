//! EC2 taking instances away, as EC2 and AWS Health report it: Spot requests and their
//! status (`DescribeSpotInstanceRequests`), scheduled events (`DescribeInstanceStatus`), and
//! the events put on the default EventBridge bus: the Spot interruption warning, the
//! rebalance recommendation and the AWS Health scheduled-change event.
//!
//! A warning alone changes nothing but the Spot request's status: a test decides what
//! follows. [`FakeInterruptions::spot_interruption_carried_out`] plays the whole
//! interruption: the warning, Auto Scaling terminating a group's instance at once (its
//! terminating hook notified as on a scale-in), and EC2 stopping or terminating the instance
//! when the notice runs out. The notice is declared in AWS terms (two minutes) and runs
//! scaled by [`super::FakeAutoScaling::set_time_scale`], like hook timeouts, so a test keeps
//! the proportion between the notice and the hook's timeout.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::autoscaling::LifecycleNotice;
use super::ec2::{self, FakeInstance, InstanceState};
use super::protocol::{self, ApiError, QueryParams, Reply, element};
use super::{FakeAutoScaling, FakeAwsError, Shared, lock};

/// What EC2 does to an interrupted Spot instance (`instance-action` of the warning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpotInterruptionAction {
    Terminate,
    Stop,
    Hibernate,
}

impl SpotInterruptionAction {
    /// `terminate`, `stop`, `hibernate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Terminate => "terminate",
            Self::Stop => "stop",
            Self::Hibernate => "hibernate",
        }
    }

    /// What the Spot request's status says the instance is marked for, from the warning on.
    fn marked_for(self) -> &'static str {
        match self {
            Self::Terminate => "termination",
            Self::Stop => "stop",
            Self::Hibernate => "hibernation",
        }
    }
}

impl std::fmt::Display for SpotInterruptionAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The one-time Spot request behind a Spot instance, as `DescribeSpotInstanceRequests`
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeSpotRequest {
    /// `sir-` and 8 characters.
    pub spot_instance_request_id: String,
    /// `active` while the instance is EC2's to interrupt; `closed` once terminated,
    /// `disabled` once stopped by an interruption.
    pub state: String,
    /// `fulfilled` until interrupted, then `marked-for-termination`, ...
    pub status_code: String,
    pub status_message: String,
    pub status_updated: jiff::Timestamp,
    pub created: jiff::Timestamp,
}

impl FakeSpotRequest {
    /// The fulfilled request of `instance_id`, launched at `launched`.
    pub(super) fn fulfilled(instance_id: &str, launched: jiff::Timestamp) -> Self {
        let digest = hex::encode(Sha256::digest(instance_id.as_bytes()));
        Self {
            spot_instance_request_id: format!("sir-{}", &digest[..8]),
            state: "active".to_owned(),
            status_code: "fulfilled".to_owned(),
            status_message: "Your spot request is fulfilled.".to_owned(),
            status_updated: launched,
            created: launched,
        }
    }

    fn update(&mut self, state: &str, code: &str, message: &str) {
        self.state = state.to_owned();
        self.status_code = code.to_owned();
        self.status_message = message.to_owned();
        self.status_updated = jiff::Timestamp::now();
    }
}

/// The kinds of scheduled event EC2 reports for an instance (`eventsSet`'s `code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduledEventCode {
    InstanceReboot,
    SystemReboot,
    SystemMaintenance,
    InstanceRetirement,
    InstanceStop,
}

impl ScheduledEventCode {
    /// `instance-reboot`, `system-reboot`, ... as in `DescribeInstanceStatus`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InstanceReboot => "instance-reboot",
            Self::SystemReboot => "system-reboot",
            Self::SystemMaintenance => "system-maintenance",
            Self::InstanceRetirement => "instance-retirement",
            Self::InstanceStop => "instance-stop",
        }
    }

    /// The `eventTypeCode` AWS Health announces the event with.
    pub fn health_event_type_code(self) -> &'static str {
        match self {
            Self::InstanceReboot => "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
            Self::SystemReboot => "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
            Self::SystemMaintenance => "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED",
            Self::InstanceRetirement => "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            Self::InstanceStop => "AWS_EC2_INSTANCE_STOP_SCHEDULED",
        }
    }

    /// EC2's `description` of such an event.
    fn description(self) -> &'static str {
        match self {
            Self::InstanceReboot => "The instance is scheduled for a reboot",
            Self::SystemReboot => "The system is scheduled for a reboot",
            Self::SystemMaintenance => "The system is scheduled for maintenance",
            Self::InstanceRetirement | Self::InstanceStop => {
                "The instance is running on degraded hardware"
            }
        }
    }
}

/// An event EC2 scheduled for an instance, as `DescribeInstanceStatus` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledEvent {
    /// `instance-event-` and 17 hex digits.
    pub instance_event_id: String,
    pub code: ScheduledEventCode,
    pub description: String,
    pub not_before: jiff::Timestamp,
    pub not_after: jiff::Timestamp,
    /// The latest start a user may reschedule the event to: the fake reports three weeks
    /// after `not_before` for every event.
    pub not_before_deadline: jiff::Timestamp,
}

/// A Spot interruption played to its end by
/// [`FakeInterruptions::spot_interruption_carried_out`].
#[derive(Debug, Clone, PartialEq)]
pub struct SpotInterruption {
    /// The `EC2 Spot Instance Interruption Warning` put on the bus.
    pub warning: Value,
    /// The Auto Scaling group that started terminating the instance at the warning.
    pub group_name: Option<String>,
    /// The notification of that group's terminating hook, when it has one.
    pub lifecycle_notice: Option<LifecycleNotice>,
    /// The real time after which EC2 carries the interruption out (the notice scaled).
    pub carried_out_after: Duration,
}

/// Handle on interruptions: Spot warnings, rebalance recommendations, scheduled maintenance.
#[derive(Clone)]
pub struct FakeInterruptions {
    shared: Arc<Shared>,
}

impl FakeInterruptions {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// The Spot interruption warning: the Spot request's status becomes
    /// `marked-for-termination` (`-stop`, `-hibernation`) and `EC2 Spot Instance Interruption
    /// Warning` goes on the bus; returns the event. Nothing else happens to the instance.
    pub fn spot_interruption(
        &self,
        instance_id: &str,
        action: SpotInterruptionAction,
    ) -> Result<Value, FakeAwsError> {
        self.require_spot(instance_id)?;
        let marked_for = action.marked_for();
        with_spot_request(&self.shared, instance_id, |request| {
            request.update(
                "active",
                &format!("marked-for-{marked_for}"),
                &format!("Spot Instance marked for {marked_for} because of EC2 capacity change."),
            );
        });
        Ok(super::eventbridge::emit(
            &self.shared,
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            vec![ec2::instance_arn(&self.shared, instance_id)],
            json!({"instance-id": instance_id, "instance-action": action.as_str()}),
        ))
    }

    /// The whole interruption: the warning ([`Self::spot_interruption`]); if the instance is
    /// in an Auto Scaling group, the group terminates it at once as a scale-in would (its
    /// terminating hook's notification sent, else the instance leaves terminated); and
    /// after `notice` (scaled by the Auto Scaling time scale) EC2 stops it (`stopping`,
    /// `stopped`) or terminates it (`shutting-down`, `terminated`) unless it is already
    /// gone, each state change announced on the bus. A group's instance can only be
    /// terminated: Auto Scaling does not stop or hibernate Spot instances.
    pub fn spot_interruption_carried_out(
        &self,
        instance_id: &str,
        action: SpotInterruptionAction,
        notice: Duration,
    ) -> Result<SpotInterruption, FakeAwsError> {
        self.require_spot(instance_id)?;
        let autoscaling = FakeAutoScaling::new(Arc::clone(&self.shared));
        let group_name = autoscaling.group_of(instance_id);
        if let Some(group) = &group_name
            && action != SpotInterruptionAction::Terminate
        {
            return Err(FakeAwsError::GroupOnlyTerminates {
                instance_id: instance_id.to_owned(),
                group: group.clone(),
                action: action.as_str().to_owned(),
            });
        }
        let warning = self.spot_interruption(instance_id, action)?;
        let lifecycle_notice = match &group_name {
            Some(group) => autoscaling.terminate_interrupted(group, instance_id)?,
            None => None,
        };
        let carried_out_after = autoscaling.scaled(notice);
        schedule_carry_out(&self.shared, instance_id, action, carried_out_after);
        Ok(SpotInterruption {
            warning,
            group_name,
            lifecycle_notice,
            carried_out_after,
        })
    }

    /// `EC2 Instance Rebalance Recommendation` for a Spot instance: EC2's early hint that
    /// its capacity is at risk; returns the event. The instance and its request are
    /// unchanged.
    pub fn rebalance_recommendation(&self, instance_id: &str) -> Result<Value, FakeAwsError> {
        self.require_spot(instance_id)?;
        Ok(super::eventbridge::emit(
            &self.shared,
            "aws.ec2",
            "EC2 Instance Rebalance Recommendation",
            vec![ec2::instance_arn(&self.shared, instance_id)],
            json!({"instance-id": instance_id}),
        ))
    }

    /// Schedules `code` for `instance_id` between `not_before` and `not_after`: from now on
    /// `DescribeInstanceStatus` reports it, and AWS Health announces it on the bus
    /// (`AWS Health Event`, category `scheduledChange`); returns that event.
    pub fn schedule_maintenance(
        &self,
        instance_id: &str,
        code: ScheduledEventCode,
        not_before: jiff::Timestamp,
        not_after: jiff::Timestamp,
    ) -> Result<Value, FakeAwsError> {
        let three_weeks = jiff::SignedDuration::from_hours(21 * 24);
        let event = ScheduledEvent {
            instance_event_id: format!(
                "instance-event-{}",
                &protocol::uuid_v4().replace('-', "")[..17]
            ),
            code,
            description: code.description().to_owned(),
            not_before,
            not_after,
            not_before_deadline: not_before.saturating_add(three_weeks).unwrap_or(not_before),
        };
        lock(&self.shared.ec2)
            .instances
            .get_mut(instance_id)
            .ok_or_else(|| FakeAwsError::UnknownInstance(instance_id.to_owned()))?
            .scheduled_events
            .push(event.clone());
        let account = &self.shared.account;
        let type_code = code.health_event_type_code();
        let detail = json!({
            "eventArn": format!(
                "arn:{}:health:{}::event/EC2/{type_code}/{}",
                account.partition,
                account.region,
                protocol::uuid_v4()
            ),
            "service": "EC2",
            "eventTypeCode": type_code,
            "eventTypeCategory": "scheduledChange",
            "startTime": health_time(not_before),
            "endTime": health_time(not_after),
            "eventDescription": [{
                "language": "en_US",
                "latestDescription": format!(
                    "{} (EC2 event {}, {}). It is scheduled between {} and {}.",
                    event.description,
                    event.instance_event_id,
                    code.as_str(),
                    health_time(not_before),
                    health_time(not_after)
                ),
            }],
            "affectedEntities": [{"entityValue": instance_id}],
        });
        Ok(super::eventbridge::emit(
            &self.shared,
            "aws.health",
            "AWS Health Event",
            vec![instance_id.to_owned()],
            detail,
        ))
    }

    /// Carries out `instance_id`'s pending scheduled event of `code`: EC2 then lists it as
    /// `[Completed]`, and AWS Health closes its event (`statusCode` `closed`) on the bus;
    /// returns that event.
    pub fn complete_maintenance(
        &self,
        instance_id: &str,
        code: ScheduledEventCode,
    ) -> Result<Value, FakeAwsError> {
        {
            let mut ec2 = lock(&self.shared.ec2);
            let instance = ec2
                .instances
                .get_mut(instance_id)
                .ok_or_else(|| FakeAwsError::UnknownInstance(instance_id.to_owned()))?;
            for event in &mut instance.scheduled_events {
                if event.code == code && !event.description.starts_with('[') {
                    event.description = format!("[Completed] {}", event.description);
                }
            }
        }
        let account = &self.shared.account;
        let type_code = code.health_event_type_code();
        let detail = json!({
            "eventArn": format!(
                "arn:{}:health:{}::event/EC2/{type_code}/{}",
                account.partition,
                account.region,
                protocol::uuid_v4()
            ),
            "service": "EC2",
            "eventTypeCode": type_code,
            "eventTypeCategory": "scheduledChange",
            "statusCode": "closed",
            "affectedEntities": [{"entityValue": instance_id}],
        });
        Ok(super::eventbridge::emit(
            &self.shared,
            "aws.health",
            "AWS Health Event",
            vec![instance_id.to_owned()],
            detail,
        ))
    }

    /// Cancels every scheduled event of `instance_id` as EC2 does when AWS no longer needs
    /// it: `DescribeInstanceStatus` keeps listing it for a while, its description starting
    /// with `[Canceled]`. No event is emitted (AWS Health announces none reliably).
    pub fn cancel_scheduled_events(&self, instance_id: &str) -> Result<(), FakeAwsError> {
        self.with_events(instance_id, |event| {
            if !event.description.starts_with('[') {
                event.description = format!("[Canceled] {}", event.description);
            }
        })
    }

    /// Moves every pending scheduled event of `instance_id` to `not_before` (a user's
    /// `ModifyInstanceEventStartTime`, or AWS rescheduling).
    pub fn reschedule_events(
        &self,
        instance_id: &str,
        not_before: jiff::Timestamp,
    ) -> Result<(), FakeAwsError> {
        self.with_events(instance_id, |event| {
            let length = event.not_after.duration_since(event.not_before);
            event.not_before = not_before;
            event.not_after = not_before.saturating_add(length).unwrap_or(not_before);
        })
    }

    fn with_events(
        &self,
        instance_id: &str,
        change: impl Fn(&mut ScheduledEvent),
    ) -> Result<(), FakeAwsError> {
        lock(&self.shared.ec2)
            .instances
            .get_mut(instance_id)
            .ok_or_else(|| FakeAwsError::UnknownInstance(instance_id.to_owned()))?
            .scheduled_events
            .iter_mut()
            .for_each(change);
        Ok(())
    }

    fn require_spot(&self, instance_id: &str) -> Result<(), FakeAwsError> {
        match lock(&self.shared.ec2).instances.get(instance_id) {
            None => Err(FakeAwsError::UnknownInstance(instance_id.to_owned())),
            Some(instance) if instance.spot_request.is_none() => {
                Err(FakeAwsError::NotSpot(instance_id.to_owned()))
            }
            Some(_) => Ok(()),
        }
    }
}

/// AWS Health's time format: RFC 2822 in GMT, to the second (`Sat, 05 Jun 2016 15:10:09 GMT`).
fn health_time(at: jiff::Timestamp) -> String {
    jiff::fmt::rfc2822::DateTimePrinter::new()
        .timestamp_to_rfc9110_string(&at)
        .unwrap_or_else(|_| at.to_string())
}

fn with_spot_request(
    shared: &Shared,
    instance_id: &str,
    change: impl FnOnce(&mut FakeSpotRequest),
) {
    if let Some(request) = lock(&shared.ec2)
        .instances
        .get_mut(instance_id)
        .and_then(|instance| instance.spot_request.as_mut())
    {
        change(request);
    }
}

/// Carries the interruption out after `delay`, on the test's runtime (at once without one).
fn schedule_carry_out(
    shared: &Arc<Shared>,
    instance_id: &str,
    action: SpotInterruptionAction,
    delay: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        carry_out(shared, instance_id, action);
        return;
    };
    let shared: Weak<Shared> = Arc::downgrade(shared);
    let instance_id = instance_id.to_owned();
    runtime.spawn(async move {
        tokio::time::sleep(delay).await;
        if let Some(shared) = shared.upgrade() {
            carry_out(&shared, &instance_id, action);
        }
    });
}

/// EC2 reclaims the instance, unless it is already gone (Auto Scaling terminated it first):
/// then there is nothing left to interrupt and the request keeps its status.
fn carry_out(shared: &Shared, instance_id: &str, action: SpotInterruptionAction) {
    let state = lock(&shared.ec2)
        .instances
        .get(instance_id)
        .map(|instance| instance.state);
    let gone = |state| {
        matches!(
            state,
            InstanceState::ShuttingDown | InstanceState::Terminated
        )
    };
    match (action, state) {
        (_, None) => {}
        (_, Some(state)) if gone(state) => {}
        (SpotInterruptionAction::Terminate, Some(_)) => {
            with_spot_request(shared, instance_id, |request| {
                request.update(
                    "closed",
                    "instance-terminated-no-capacity",
                    "Spot Instance terminated due to no available capacity.",
                );
            });
            ec2::mark_terminated(shared, instance_id);
        }
        (_, Some(InstanceState::Stopping | InstanceState::Stopped)) => {}
        (SpotInterruptionAction::Stop | SpotInterruptionAction::Hibernate, Some(_)) => {
            with_spot_request(shared, instance_id, |request| {
                request.update(
                    "disabled",
                    "instance-stopped-no-capacity",
                    "Spot Instance stopped due to no available capacity.",
                );
            });
            ec2::set_state_of(shared, instance_id, InstanceState::Stopping);
            ec2::set_state_of(shared, instance_id, InstanceState::Stopped);
        }
    }
}

/// `DescribeSpotInstanceRequests`: by `SpotInstanceRequestId.N` (each must exist) and
/// filters `instance-id`, `spot-instance-request-id`, `state`, `status-code`,
/// `launched-availability-zone` (another filter matches nothing, as in `DescribeInstances`).
pub(super) fn describe_spot_instance_requests(
    shared: &Shared,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let ids = protocol::query_list(params, "SpotInstanceRequestId");
    let filters = ec2::query_filters(params);
    let state = lock(&shared.ec2);
    let requests: Vec<(&FakeInstance, &FakeSpotRequest)> = state
        .instances
        .values()
        .filter_map(|instance| instance.spot_request.as_ref().map(|r| (instance, r)))
        .collect();
    if let Some(missing) = ids.iter().find(|id| {
        !requests
            .iter()
            .any(|(_, request)| &request.spot_instance_request_id == *id)
    }) {
        return Err(ApiError::new(
            400,
            "InvalidSpotInstanceRequestID.NotFound",
            format!("The spot instance request ID '{missing}' does not exist"),
        ));
    }
    let mut items = String::new();
    for (instance, request) in requests {
        if !ids.is_empty() && !ids.contains(&request.spot_instance_request_id) {
            continue;
        }
        let matches = |name: &str, values: &[String]| {
            let value: &str = match name {
                "instance-id" => &instance.instance_id,
                "spot-instance-request-id" => &request.spot_instance_request_id,
                "state" => &request.state,
                "status-code" => &request.status_code,
                "launched-availability-zone" => &instance.availability_zone,
                _ => return false,
            };
            values.iter().any(|v| v == value)
        };
        if !filters.iter().all(|(name, values)| matches(name, values)) {
            continue;
        }
        items.push_str(&format!(
            "<item>{}<type>one-time</type>{}<status>{}{}{}</status><launchSpecification>{}{}<placement>{}</placement></launchSpecification>{}{}<productDescription>Linux/UNIX</productDescription>{}</item>",
            element("spotInstanceRequestId", &request.spot_instance_request_id),
            element("state", &request.state),
            element("code", &request.status_code),
            element("updateTime", &protocol::timestamp_millis(request.status_updated)),
            element("message", &request.status_message),
            element("imageId", &instance.image_id),
            element("instanceType", &instance.instance_type),
            element("availabilityZone", &instance.availability_zone),
            element("instanceId", &instance.instance_id),
            element("createTime", &protocol::timestamp_millis(request.created)),
            element("launchedAvailabilityZone", &instance.availability_zone),
        ));
    }
    Ok(Reply::Xml(format!(
        "<spotInstanceRequestSet>{items}</spotInstanceRequestSet>"
    )))
}

/// `DescribeInstanceStatus`: by `InstanceId.N` (each must exist, as in `DescribeInstances`),
/// running instances only unless `IncludeAllInstances`, filters `instance-id`,
/// `availability-zone`, `instance-state-name`, `event.code` (another matches nothing).
pub(super) fn describe_instance_status(
    shared: &Shared,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let ids = protocol::query_list(params, "InstanceId");
    let include_all = params
        .get("IncludeAllInstances")
        .is_some_and(|value| value == "true");
    let filters = ec2::query_filters(params);
    let state = lock(&shared.ec2);
    ec2::check_instance_ids(&state, &ids)?;
    let items: String = state
        .instances
        .values()
        .filter(|instance| ids.is_empty() || ids.contains(&instance.instance_id))
        .filter(|instance| include_all || instance.state == InstanceState::Running)
        .filter(|instance| {
            filters
                .iter()
                .all(|(name, values)| status_filter_matches(instance, name, values))
        })
        .map(instance_status_item)
        .collect();
    Ok(Reply::Xml(format!(
        "<instanceStatusSet>{items}</instanceStatusSet>"
    )))
}

fn status_filter_matches(instance: &FakeInstance, name: &str, values: &[String]) -> bool {
    let any = |value: &str| values.iter().any(|v| v == value);
    match name {
        "instance-id" => any(&instance.instance_id),
        "availability-zone" => any(&instance.availability_zone),
        "instance-state-name" => any(instance.state.code_and_name().1),
        "event.code" => instance
            .scheduled_events
            .iter()
            .any(|event| any(event.code.as_str())),
        _ => false,
    }
}

fn instance_status_item(instance: &FakeInstance) -> String {
    let (code, name) = instance.state.code_and_name();
    // EC2 checks only a running (or starting) instance; the others are not applicable.
    let summary = match instance.state {
        InstanceState::Running if instance.impaired => {
            "<status>impaired</status><details><item><name>reachability</name><status>failed</status></item></details>"
        }
        InstanceState::Running => {
            "<status>ok</status><details><item><name>reachability</name><status>passed</status></item></details>"
        }
        InstanceState::Pending => {
            "<status>initializing</status><details><item><name>reachability</name><status>initializing</status></item></details>"
        }
        _ => "<status>not-applicable</status>",
    };
    let events: String = instance
        .scheduled_events
        .iter()
        .map(|event| {
            format!(
                "<item>{}{}{}{}{}{}</item>",
                element("instanceEventId", &event.instance_event_id),
                element("code", event.code.as_str()),
                element("description", &event.description),
                element("notBefore", &protocol::timestamp_millis(event.not_before)),
                element("notAfter", &protocol::timestamp_millis(event.not_after)),
                element(
                    "notBeforeDeadline",
                    &protocol::timestamp_millis(event.not_before_deadline)
                ),
            )
        })
        .collect();
    // EC2 leaves `eventsSet` out when nothing is scheduled.
    let events = if events.is_empty() {
        events
    } else {
        format!("<eventsSet>{events}</eventsSet>")
    };
    format!(
        "<item>{}{}{events}<instanceState><code>{code}</code><name>{name}</name></instanceState><systemStatus>{summary}</systemStatus><instanceStatus>{summary}</instanceStatus></item>",
        element("instanceId", &instance.instance_id),
        element("availabilityZone", &instance.availability_zone),
    )
}
