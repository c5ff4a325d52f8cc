//! What a Lambda event says: Auto Scaling lifecycle notifications delivered by SNS or
//! EventBridge, test notifications, and anything else a hook function might be sent.
//!
//! Parsing is a plain function over JSON so every shape is tested without I/O. Each record of
//! an event is parsed on its own: one malformed record yields an error for that record and
//! does not hide the others. Nothing here panics on input.

use std::fmt;

use jiff::Timestamp;
use serde_json::{Map, Value};

use crate::aws::LifecycleActionRef;

/// The field a handed-over notification carries to count its continuations. Auto Scaling
/// never sends it; its absence means "fresh from Auto Scaling".
pub const CONTINUATION_FIELD: &str = "NodeManagerContinuation";

const TEST_NOTIFICATION_EVENT: &str = "autoscaling:TEST_NOTIFICATION";
const LAUNCH_DETAIL_TYPE: &str = "EC2 Instance-launch Lifecycle Action";
const TERMINATE_DETAIL_TYPE: &str = "EC2 Instance-terminate Lifecycle Action";

/// The two instance transitions a lifecycle hook can pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecycleTransition {
    Launching,
    Terminating,
}

impl LifecycleTransition {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Launching => "autoscaling:EC2_INSTANCE_LAUNCHING",
            Self::Terminating => "autoscaling:EC2_INSTANCE_TERMINATING",
        }
    }

    /// Parses the `LifecycleTransition` value; `None` for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "autoscaling:EC2_INSTANCE_LAUNCHING" => Some(Self::Launching),
            "autoscaling:EC2_INSTANCE_TERMINATING" => Some(Self::Terminating),
            _ => None,
        }
    }
}

/// Where an instance comes from or goes to in a lifecycle transition (the notification's
/// `Origin` and `Destination`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstancePlace {
    /// Outside the group: EC2 itself (a new instance, or a terminated one).
    Ec2,
    /// In service in the group.
    AutoScalingGroup,
    /// The group's warm pool: stopped, running or hibernated, not in service.
    WarmPool,
}

impl InstancePlace {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ec2 => "EC2",
            Self::AutoScalingGroup => "AutoScalingGroup",
            Self::WarmPool => "WarmPool",
        }
    }

    /// Parses an `Origin`/`Destination` value exactly as Auto Scaling writes it.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "EC2" => Some(Self::Ec2),
            "AutoScalingGroup" => Some(Self::AutoScalingGroup),
            "WarmPool" => Some(Self::WarmPool),
            _ => None,
        }
    }
}

/// Where a transition moves the instance. Auto Scaling sends six: a launch goes
/// EC2 → group, EC2 → warm pool, or warm pool → group; a termination goes group → EC2,
/// group → warm pool (scale-in with instance reuse), or warm pool → EC2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifecycleRoute {
    pub origin: InstancePlace,
    pub destination: InstancePlace,
}

impl LifecycleRoute {
    /// The route of a group without a warm pool, assumed when a notification names neither
    /// end (Auto Scaling has sent both fields since warm pools exist; older test fixtures
    /// and hand-made messages may lack them).
    pub fn plain(transition: LifecycleTransition) -> Self {
        match transition {
            LifecycleTransition::Launching => Self {
                origin: InstancePlace::Ec2,
                destination: InstancePlace::AutoScalingGroup,
            },
            LifecycleTransition::Terminating => Self {
                origin: InstancePlace::AutoScalingGroup,
                destination: InstancePlace::Ec2,
            },
        }
    }

    /// Whether Auto Scaling moves instances this way in `transition`.
    pub fn is_valid_for(self, transition: LifecycleTransition) -> bool {
        use InstancePlace::{AutoScalingGroup, Ec2, WarmPool};
        matches!(
            (transition, self.origin, self.destination),
            (
                LifecycleTransition::Launching,
                Ec2 | WarmPool,
                AutoScalingGroup
            ) | (LifecycleTransition::Launching, Ec2, WarmPool)
                | (
                    LifecycleTransition::Terminating,
                    AutoScalingGroup,
                    Ec2 | WarmPool
                )
                | (LifecycleTransition::Terminating, WarmPool, Ec2)
        )
    }

    /// A launch into the warm pool: the instance is being pre-initialised, not put in service.
    pub fn is_into_warm_pool(self) -> bool {
        self.origin != InstancePlace::WarmPool && self.destination == InstancePlace::WarmPool
    }

    /// A launch out of the warm pool into service.
    pub fn is_out_of_warm_pool(self) -> bool {
        self.origin == InstancePlace::WarmPool
            && self.destination == InstancePlace::AutoScalingGroup
    }
}

impl fmt::Display for LifecycleRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {}",
            self.origin.as_str(),
            self.destination.as_str()
        )
    }
}

impl fmt::Display for LifecycleTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pending lifecycle action, as Auto Scaling announced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleNotification {
    pub transition: LifecycleTransition,
    pub action: LifecycleActionRef,
    pub account_id: String,
    pub request_id: String,
    /// When Auto Scaling started the action: deadlines that must survive continuations
    /// (the launch timeout, the hook's global timeout) count from here.
    pub time: Timestamp,
    /// The hook's `NotificationMetadata`, when it sets one.
    pub notification_metadata: Option<String>,
    /// `EC2`, `AutoScalingGroup` or `WarmPool`, as sent (kept for republishing).
    pub origin: Option<String>,
    pub destination: Option<String>,
    /// Where the transition moves the instance: `origin` and `destination` checked against
    /// the routes Auto Scaling uses for this transition.
    pub route: LifecycleRoute,
    /// How many times this notification was handed to a fresh invocation already
    /// (0: straight from Auto Scaling).
    pub continuation: u32,
}

/// `autoscaling:TEST_NOTIFICATION`, sent when a hook or notification is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestNotification {
    pub account_id: Option<String>,
    pub group_name: Option<String>,
    pub request_id: Option<String>,
}

/// What one record means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleMessage {
    Lifecycle(LifecycleNotification),
    Test(TestNotification),
    /// A well-formed message about something these functions do not handle (another
    /// transition, a plain Auto Scaling notification). Acknowledge it with a log line.
    UnknownTransition {
        transition: String,
        group_name: Option<String>,
        instance_id: Option<String>,
    },
}

/// How the notification arrived, which is where a continuation is sent back to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliverySource {
    Sns { topic_arn: String },
    EventBridge,
}

/// Which part of the event a delivery or an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordLocation {
    /// Index into the event's `Records`.
    Record(usize),
    /// The event is a single EventBridge event.
    EventBridge,
}

impl fmt::Display for RecordLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Record(index) => write!(f, "record {index}"),
            Self::EventBridge => f.write_str("EventBridge event"),
        }
    }
}

/// One notification of an event, ready to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub location: RecordLocation,
    pub source: DeliverySource,
    /// The SNS `Subject`, reused when the notification is published again.
    pub subject: Option<String>,
    pub message: LifecycleMessage,
    /// The notification as an SNS `Message`: the original text for SNS, rebuilt in Auto
    /// Scaling's SNS shape for EventBridge. This is what a hand-over publishes again.
    pub raw_message: String,
}

impl Delivery {
    /// The lifecycle notification, when this delivery is one.
    pub fn lifecycle(&self) -> Option<&LifecycleNotification> {
        match &self.message {
            LifecycleMessage::Lifecycle(notification) => Some(notification),
            _ => None,
        }
    }

    /// `raw_message` with the continuation counter set to `continuation`: the message a
    /// hand-over publishes so the next invocation knows it is a continuation.
    pub fn message_for_continuation(&self, continuation: u32) -> String {
        match serde_json::from_str::<Value>(&self.raw_message) {
            Ok(Value::Object(mut fields)) => {
                fields.insert(CONTINUATION_FIELD.to_owned(), Value::from(continuation));
                Value::Object(fields).to_string()
            }
            // Only parsed messages become deliveries, so this is unreachable in practice;
            // sending the original is still better than sending nothing.
            _ => self.raw_message.clone(),
        }
    }
}

/// A record that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum NotificationError {
    #[error(
        "the event is neither an SNS event (Records[].Sns) nor an EventBridge lifecycle event (detail-type/detail): {reason}"
    )]
    UnrecognisedEvent { reason: String },
    #[error("{location}: required field {field} is missing")]
    MissingField {
        location: RecordLocation,
        field: &'static str,
    },
    #[error("{location}: field {field}={value:?} is invalid: expected {expected}")]
    InvalidField {
        location: RecordLocation,
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{location}: Sns.Message is not a JSON object: {source}")]
    InvalidMessageJson {
        location: RecordLocation,
        #[source]
        source: serde_json::Error,
    },
}

impl NotificationError {
    /// Where in the event the problem is, when it is in one record.
    pub fn location(&self) -> Option<RecordLocation> {
        match self {
            Self::UnrecognisedEvent { .. } => None,
            Self::MissingField { location, .. }
            | Self::InvalidField { location, .. }
            | Self::InvalidMessageJson { location, .. } => Some(*location),
        }
    }
}

/// Every notification of a Lambda event, in order; one `Err` per record that cannot be used.
///
/// An event that is neither an SNS event nor an EventBridge event yields one `Err`.
pub fn parse_event(event: &Value) -> Vec<Result<Delivery, NotificationError>> {
    if let Some(records) = event.get("Records") {
        return match records.as_array() {
            Some(records) if !records.is_empty() => records
                .iter()
                .enumerate()
                .map(|(index, record)| parse_sns_record(RecordLocation::Record(index), record))
                .collect(),
            Some(_) => vec![Err(NotificationError::UnrecognisedEvent {
                reason: "Records is empty".to_owned(),
            })],
            None => vec![Err(NotificationError::UnrecognisedEvent {
                reason: "Records is not an array".to_owned(),
            })],
        };
    }
    if event.get("detail-type").is_some() {
        return vec![parse_eventbridge(RecordLocation::EventBridge, event).map(
            |(message, raw_message)| Delivery {
                location: RecordLocation::EventBridge,
                source: DeliverySource::EventBridge,
                subject: None,
                message,
                raw_message,
            },
        )];
    }
    let reason = match event {
        Value::Object(_) => "it has neither Records nor detail-type".to_owned(),
        other => format!("it is a JSON {}", json_kind(other)),
    };
    vec![Err(NotificationError::UnrecognisedEvent { reason })]
}

fn parse_sns_record(
    location: RecordLocation,
    record: &Value,
) -> Result<Delivery, NotificationError> {
    let sns =
        record
            .get("Sns")
            .filter(|sns| sns.is_object())
            .ok_or(NotificationError::MissingField {
                location,
                field: "Sns",
            })?;
    let topic_arn = required_str(location, sns, "Sns.TopicArn", "TopicArn")?;
    let raw_message = required_str(location, sns, "Sns.Message", "Message")?;
    let subject = optional_str(location, sns, "Sns.Subject", "Subject")?;
    let parsed: Value = serde_json::from_str(&raw_message)
        .map_err(|source| NotificationError::InvalidMessageJson { location, source })?;
    if !parsed.is_object() {
        return Err(NotificationError::InvalidField {
            location,
            field: "Sns.Message",
            value: truncated(&raw_message),
            expected: "a JSON object (an Auto Scaling notification)",
        });
    }
    // An EventBridge rule may target the topic: then the message is the whole EventBridge
    // event. It is republished as it came.
    let message = if parsed.get("detail-type").is_some() {
        parse_eventbridge(location, &parsed)?.0
    } else {
        parse_autoscaling_message(location, &parsed)?
    };
    Ok(Delivery {
        location,
        source: DeliverySource::Sns {
            topic_arn: topic_arn.to_owned(),
        },
        subject,
        message,
        raw_message,
    })
}

/// Auto Scaling's own SNS message: lifecycle fields at the top level, or a test
/// notification (`Event`).
fn parse_autoscaling_message(
    location: RecordLocation,
    message: &Value,
) -> Result<LifecycleMessage, NotificationError> {
    let event = optional_str(location, message, "Event", "Event")?;
    if event.as_deref() == Some(TEST_NOTIFICATION_EVENT) {
        return Ok(LifecycleMessage::Test(TestNotification {
            account_id: optional_str(location, message, "AccountId", "AccountId")?,
            group_name: optional_str(
                location,
                message,
                "AutoScalingGroupName",
                "AutoScalingGroupName",
            )?,
            request_id: optional_str(location, message, "RequestId", "RequestId")?,
        }));
    }
    let Some(transition) = optional_str(
        location,
        message,
        "LifecycleTransition",
        "LifecycleTransition",
    )?
    else {
        // A plain Auto Scaling notification (EC2_INSTANCE_LAUNCH, ...) carries `Event`.
        return match event {
            Some(event) => Ok(unknown(message, event)),
            None => Err(NotificationError::MissingField {
                location,
                field: "LifecycleTransition",
            }),
        };
    };
    let Some(parsed_transition) = LifecycleTransition::parse(&transition) else {
        return Ok(unknown(message, transition));
    };
    let fields = LifecycleFields {
        location,
        object: message,
    };
    let time = fields.timestamp("Time")?;
    let origin = fields.optional("Origin")?;
    let destination = fields.optional("Destination")?;
    Ok(LifecycleMessage::Lifecycle(LifecycleNotification {
        transition: parsed_transition,
        action: fields.action()?,
        account_id: fields.required("AccountId")?,
        request_id: fields.required("RequestId")?,
        time,
        notification_metadata: fields.optional("NotificationMetadata")?,
        route: route(
            location,
            parsed_transition,
            origin.as_deref(),
            destination.as_deref(),
        )?,
        origin,
        destination,
        continuation: continuation(location, message)?,
    }))
}

/// An EventBridge event: lifecycle fields under `detail`, account/time/id at the top.
/// Returns the message and an SNS-shaped rendering of it for republishing.
fn parse_eventbridge(
    location: RecordLocation,
    event: &Value,
) -> Result<(LifecycleMessage, String), NotificationError> {
    let detail_type = required_str(location, event, "detail-type", "detail-type")?;
    let detail = event.get("detail").filter(|d| d.is_object());
    let transition = match detail {
        Some(detail) => optional_str(
            location,
            detail,
            "detail.LifecycleTransition",
            "LifecycleTransition",
        )?,
        None => None,
    };
    let expected_transition = match detail_type.as_str() {
        LAUNCH_DETAIL_TYPE => Some(LifecycleTransition::Launching),
        TERMINATE_DETAIL_TYPE => Some(LifecycleTransition::Terminating),
        _ => None,
    };
    let parsed_transition = match (&transition, expected_transition) {
        (Some(value), _) => LifecycleTransition::parse(value),
        (None, expected) => expected,
    };
    let Some(parsed_transition) = parsed_transition.filter(|_| expected_transition.is_some())
    else {
        let message = LifecycleMessage::UnknownTransition {
            transition: transition.unwrap_or(detail_type),
            group_name: detail
                .and_then(|d| d.get("AutoScalingGroupName"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            instance_id: detail
                .and_then(|d| d.get("EC2InstanceId"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        return Ok((message, event.to_string()));
    };
    let detail = detail.ok_or(NotificationError::MissingField {
        location,
        field: "detail",
    })?;
    let top = LifecycleFields {
        location,
        object: event,
    };
    let fields = LifecycleFields {
        location,
        object: detail,
    };
    let origin = fields.optional("Origin")?;
    let destination = fields.optional("Destination")?;
    let notification = LifecycleNotification {
        transition: parsed_transition,
        action: fields.action()?,
        account_id: top.required("account")?,
        request_id: top.required("id")?,
        time: top.timestamp("time")?,
        notification_metadata: fields.optional("NotificationMetadata")?,
        route: route(
            location,
            parsed_transition,
            origin.as_deref(),
            destination.as_deref(),
        )?,
        origin,
        destination,
        continuation: continuation(location, event)?,
    };
    let raw = match location {
        // Delivered through SNS: republish exactly what came.
        RecordLocation::Record(_) => event.to_string(),
        RecordLocation::EventBridge => sns_shaped(&notification),
    };
    Ok((LifecycleMessage::Lifecycle(notification), raw))
}

/// Renders a notification the way Auto Scaling writes it to SNS.
fn sns_shaped(notification: &LifecycleNotification) -> String {
    let mut fields = Map::new();
    let mut put = |key: &str, value: Option<&str>| {
        if let Some(value) = value {
            fields.insert(key.to_owned(), Value::from(value));
        }
    };
    put("Origin", notification.origin.as_deref());
    put("Destination", notification.destination.as_deref());
    put("Service", Some("AWS Auto Scaling"));
    put("Time", Some(&notification.time.to_string()));
    put("AccountId", Some(&notification.account_id));
    put(
        "LifecycleTransition",
        Some(notification.transition.as_str()),
    );
    put("RequestId", Some(&notification.request_id));
    put("LifecycleActionToken", Some(&notification.action.token));
    put("EC2InstanceId", Some(&notification.action.instance_id));
    put(
        "LifecycleHookName",
        Some(&notification.action.lifecycle_hook_name),
    );
    put(
        "AutoScalingGroupName",
        Some(&notification.action.auto_scaling_group_name),
    );
    put(
        "NotificationMetadata",
        notification.notification_metadata.as_deref(),
    );
    Value::Object(fields).to_string()
}

fn unknown(message: &Value, transition: String) -> LifecycleMessage {
    LifecycleMessage::UnknownTransition {
        transition,
        group_name: message
            .get("AutoScalingGroupName")
            .and_then(Value::as_str)
            .map(str::to_owned),
        instance_id: message
            .get("EC2InstanceId")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

/// The route `Origin` → `Destination` names, refused unless it is one Auto Scaling uses for
/// `transition`: a launch "into EC2" or a termination "out of the warm pool into the group"
/// cannot be acted on safely (draining, undoing a drain and skipping the node wait all hang
/// on it), so an odd value is an error that names it, never a guess.
fn route(
    location: RecordLocation,
    transition: LifecycleTransition,
    origin: Option<&str>,
    destination: Option<&str>,
) -> Result<LifecycleRoute, NotificationError> {
    const PLACES: &str = "EC2, AutoScalingGroup or WarmPool";
    let place = |field: &'static str, value: &str| {
        InstancePlace::parse(value).ok_or_else(|| NotificationError::InvalidField {
            location,
            field,
            value: truncated(value),
            expected: PLACES,
        })
    };
    let route = match (origin, destination) {
        (None, None) => return Ok(LifecycleRoute::plain(transition)),
        (Some(origin), Some(destination)) => LifecycleRoute {
            origin: place("Origin", origin)?,
            destination: place("Destination", destination)?,
        },
        (None, Some(_)) => {
            return Err(NotificationError::MissingField {
                location,
                field: "Origin",
            });
        }
        (Some(_), None) => {
            return Err(NotificationError::MissingField {
                location,
                field: "Destination",
            });
        }
    };
    if route.is_valid_for(transition) {
        return Ok(route);
    }
    let expected = match transition {
        LifecycleTransition::Launching => {
            "a launch route: EC2 -> AutoScalingGroup, EC2 -> WarmPool or WarmPool -> AutoScalingGroup"
        }
        LifecycleTransition::Terminating => {
            "a termination route: AutoScalingGroup -> EC2, AutoScalingGroup -> WarmPool or WarmPool -> EC2"
        }
    };
    Err(NotificationError::InvalidField {
        location,
        field: "Origin/Destination",
        value: route.to_string(),
        expected,
    })
}

fn continuation(location: RecordLocation, message: &Value) -> Result<u32, NotificationError> {
    match message.get(CONTINUATION_FIELD) {
        None | Some(Value::Null) => Ok(0),
        Some(value) => value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| NotificationError::InvalidField {
                location,
                field: CONTINUATION_FIELD,
                value: truncated(&value.to_string()),
                expected: "a whole number",
            }),
    }
}

/// Reads the lifecycle fields of one JSON object, naming the field in every error.
struct LifecycleFields<'a> {
    location: RecordLocation,
    object: &'a Value,
}

impl LifecycleFields<'_> {
    fn required(&self, field: &'static str) -> Result<String, NotificationError> {
        let value = required_str(self.location, self.object, field, field)?;
        if value.trim().is_empty() {
            return Err(NotificationError::InvalidField {
                location: self.location,
                field,
                value,
                expected: "a non-empty string",
            });
        }
        Ok(value)
    }

    fn optional(&self, field: &'static str) -> Result<Option<String>, NotificationError> {
        optional_str(self.location, self.object, field, field)
    }

    fn timestamp(&self, field: &'static str) -> Result<Timestamp, NotificationError> {
        let value = self.required(field)?;
        value
            .parse::<Timestamp>()
            .map_err(|_| NotificationError::InvalidField {
                location: self.location,
                field,
                value: truncated(&value),
                expected: "an RFC 3339 time such as 2022-09-25T12:59:58.871Z",
            })
    }

    fn action(&self) -> Result<LifecycleActionRef, NotificationError> {
        let instance_id = self.required("EC2InstanceId")?;
        if !is_instance_id(&instance_id) {
            return Err(NotificationError::InvalidField {
                location: self.location,
                field: "EC2InstanceId",
                value: truncated(&instance_id),
                expected: "an EC2 instance id such as i-0a1b2c3d4e5f60718",
            });
        }
        Ok(LifecycleActionRef {
            auto_scaling_group_name: self.required("AutoScalingGroupName")?,
            lifecycle_hook_name: self.required("LifecycleHookName")?,
            instance_id,
            token: self.required("LifecycleActionToken")?,
        })
    }
}

/// `i-` followed by hexadecimal digits: the id goes into provider IDs and log lines.
fn is_instance_id(value: &str) -> bool {
    value.strip_prefix("i-").is_some_and(|hex| {
        !hex.is_empty() && hex.len() <= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

fn required_str(
    location: RecordLocation,
    object: &Value,
    field: &'static str,
    key: &str,
) -> Result<String, NotificationError> {
    optional_str(location, object, field, key)?
        .ok_or(NotificationError::MissingField { location, field })
}

fn optional_str(
    location: RecordLocation,
    object: &Value,
    field: &'static str,
    key: &str,
) -> Result<Option<String>, NotificationError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(other) => Err(NotificationError::InvalidField {
            location,
            field,
            value: truncated(&other.to_string()),
            expected: "a string",
        }),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Error messages quote values, but never a whole payload.
fn truncated(value: &str) -> String {
    const LIMIT: usize = 120;
    match value.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}...", &value[..cut]),
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn fixture(name: &str) -> Value {
        let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    fn only(event: &Value) -> Delivery {
        let mut deliveries = parse_event(event);
        assert_eq!(deliveries.len(), 1, "{deliveries:?}");
        deliveries.remove(0).unwrap()
    }

    fn sns_event(message: &Value) -> Value {
        serde_json::json!({"Records": [{
            "EventSource": "aws:sns",
            "Sns": {
                "TopicArn": "arn:aws:sns:eu-west-1:111111111111:topic",
                "Subject": "s",
                "Message": message.to_string(),
                "SigningCertURL": "https://example/cert.pem",
            }
        }]})
    }

    fn lifecycle_message() -> Value {
        serde_json::json!({
            "Origin": "AutoScalingGroup",
            "Destination": "EC2",
            "Service": "AWS Auto Scaling",
            "Time": "2022-09-25T13:58:42.123Z",
            "AccountId": "111111111111",
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
            "RequestId": "r-1",
            "LifecycleActionToken": "tok",
            "EC2InstanceId": "i-07e9ea9eb19a67337",
            "LifecycleHookName": "Terminate-LC-Hook",
            "AutoScalingGroupName": "asg"
        })
    }

    #[test]
    fn terminating_fixture_is_a_lifecycle_notification() {
        let delivery = only(&fixture("sns-lifecycle-terminating.json"));
        assert_eq!(
            delivery.source,
            DeliverySource::Sns {
                topic_arn: "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic".into()
            }
        );
        let n = delivery.lifecycle().unwrap();
        assert_eq!(n.transition, LifecycleTransition::Terminating);
        assert_eq!(n.action.instance_id, "i-07e9ea9eb19a67337");
        assert_eq!(n.action.lifecycle_hook_name, "Terminate-LC-Hook");
        assert_eq!(
            n.action.auto_scaling_group_name,
            "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412"
        );
        assert_eq!(n.action.token, "c613620e-07e2-4ed2-a9e2-ef8258911ade");
        assert_eq!(n.account_id, "111111111111");
        assert_eq!(n.request_id, "6c95f3a4-1b7e-4e8b-a4a3-2f1b0c9e7d11");
        assert_eq!(
            n.time,
            "2022-09-25T13:58:42.123Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(n.origin.as_deref(), Some("AutoScalingGroup"));
        assert_eq!(n.continuation, 0);
        assert!(delivery.subject.unwrap().contains("TERMINATING"));
    }

    #[test]
    fn launching_fixture_is_a_launch() {
        let delivery = only(&fixture("sns-lifecycle-launching.json"));
        let n = delivery.lifecycle().unwrap();
        assert_eq!(n.transition, LifecycleTransition::Launching);
        assert_eq!(n.action.lifecycle_hook_name, "Launch-LC-Hook");
        assert_eq!(n.notification_metadata, None);
    }

    #[test]
    fn test_notification_is_recognised() {
        let delivery = only(&fixture("sns-test-notification.json"));
        match delivery.message {
            LifecycleMessage::Test(test) => assert_eq!(
                test.group_name.as_deref(),
                Some("eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412")
            ),
            other => panic!("expected a test notification, got {other:?}"),
        }
    }

    #[test]
    fn both_spellings_of_the_sns_url_fields_are_accepted() {
        let mut message = lifecycle_message();
        message["NotificationMetadata"] = "meta".into();
        let event = sns_event(&message);
        let delivery = only(&event);
        assert_eq!(
            delivery
                .lifecycle()
                .unwrap()
                .notification_metadata
                .as_deref(),
            Some("meta")
        );
    }

    #[test]
    fn every_record_is_parsed_and_a_bad_one_is_named() {
        let good = sns_event(&lifecycle_message())["Records"][0].clone();
        let mut bad_message = lifecycle_message();
        bad_message
            .as_object_mut()
            .unwrap()
            .remove("LifecycleActionToken");
        let bad = sns_event(&bad_message)["Records"][0].clone();
        let event = serde_json::json!({"Records": [good, bad, good]});
        let deliveries = parse_event(&event);
        assert_eq!(deliveries.len(), 3);
        assert!(deliveries[0].is_ok() && deliveries[2].is_ok());
        let err = deliveries[1].as_ref().unwrap_err();
        assert_eq!(err.location(), Some(RecordLocation::Record(1)));
        let text = err.to_string();
        assert!(
            text.contains("record 1") && text.contains("LifecycleActionToken"),
            "{text}"
        );
    }

    #[test]
    fn malformed_inputs_are_errors_not_panics() {
        let cases: Vec<(Value, &str)> = vec![
            (Value::Null, "null"),
            (serde_json::json!({"Records": []}), "empty"),
            (serde_json::json!({"Records": "x"}), "not an array"),
            (
                serde_json::json!({"Records": [{"Sns": {"TopicArn": "t"}}]}),
                "Sns.Message",
            ),
            (
                serde_json::json!({"Records": [{"Sns": {"TopicArn": "t", "Message": "not json"}}]}),
                "not a JSON object",
            ),
            (
                serde_json::json!({"Records": [{"Sns": {"TopicArn": "t", "Message": "[1]"}}]}),
                "Sns.Message",
            ),
            (serde_json::json!({"Records": [{}]}), "Sns"),
            (
                serde_json::json!({"hello": 1}),
                "neither Records nor detail-type",
            ),
        ];
        for (event, expected) in cases {
            let deliveries = parse_event(&event);
            assert_eq!(deliveries.len(), 1);
            let err = deliveries[0].as_ref().unwrap_err().to_string();
            assert!(err.contains(expected), "{event}: {err}");
        }
    }

    #[test]
    fn bad_fields_are_named() {
        for (field, value, expected) in [
            ("Time", Value::from("yesterday"), "Time=\"yesterday\""),
            ("EC2InstanceId", Value::from("node-1"), "EC2InstanceId"),
            ("AccountId", Value::from(42), "AccountId=\"42\""),
            (
                "AutoScalingGroupName",
                Value::from(""),
                "AutoScalingGroupName",
            ),
            (CONTINUATION_FIELD, Value::from("two"), CONTINUATION_FIELD),
        ] {
            let mut message = lifecycle_message();
            message[field] = value;
            let err = parse_event(&sns_event(&message))
                .remove(0)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{field}: {err}");
        }
    }

    #[test]
    fn an_unknown_transition_is_its_own_variant() {
        let mut message = lifecycle_message();
        message["LifecycleTransition"] = "autoscaling:EC2_INSTANCE_HIBERNATING".into();
        match only(&sns_event(&message)).message {
            LifecycleMessage::UnknownTransition {
                transition,
                instance_id,
                ..
            } => {
                assert_eq!(transition, "autoscaling:EC2_INSTANCE_HIBERNATING");
                assert_eq!(instance_id.as_deref(), Some("i-07e9ea9eb19a67337"));
            }
            other => panic!("{other:?}"),
        }
        let plain = serde_json::json!({"Event": "autoscaling:EC2_INSTANCE_LAUNCH", "AutoScalingGroupName": "asg"});
        assert!(matches!(
            only(&sns_event(&plain)).message,
            LifecycleMessage::UnknownTransition { .. }
        ));
    }

    fn eventbridge_event() -> Value {
        serde_json::json!({
            "version": "0",
            "id": "468fcd3a-1e0b-4a2b-a6a6-4a5c6c2c8a11",
            "detail-type": "EC2 Instance-launch Lifecycle Action",
            "source": "aws.autoscaling",
            "account": "111111111111",
            "time": "2022-09-25T12:59:58Z",
            "region": "eu-west-1",
            "resources": [],
            "detail": {
                "LifecycleActionToken": "tok",
                "AutoScalingGroupName": "asg",
                "LifecycleHookName": "Launch-LC-Hook",
                "EC2InstanceId": "i-0a1b2c3d4e5f60718",
                "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
                "NotificationMetadata": "m",
                "Origin": "EC2",
                "Destination": "AutoScalingGroup"
            }
        })
    }

    #[test]
    fn eventbridge_delivery_is_rebuilt_in_sns_shape() {
        let delivery = only(&eventbridge_event());
        assert_eq!(delivery.source, DeliverySource::EventBridge);
        let n = delivery.lifecycle().unwrap().clone();
        assert_eq!(n.transition, LifecycleTransition::Launching);
        assert_eq!(n.account_id, "111111111111");
        assert_eq!(n.request_id, "468fcd3a-1e0b-4a2b-a6a6-4a5c6c2c8a11");
        assert_eq!(n.notification_metadata.as_deref(), Some("m"));
        // The rebuilt message, delivered by SNS, means the same thing.
        let again = only(&sns_event(
            &serde_json::from_str(&delivery.raw_message).unwrap(),
        ));
        assert_eq!(again.lifecycle().unwrap(), &n);
    }

    #[test]
    fn eventbridge_through_sns_and_other_detail_types() {
        let via_sns = only(&sns_event(&eventbridge_event()));
        assert_eq!(
            via_sns.lifecycle().unwrap().transition,
            LifecycleTransition::Launching
        );
        let mut other = eventbridge_event();
        other["detail-type"] = "EC2 Instance Launch Successful".into();
        assert!(matches!(
            only(&other).message,
            LifecycleMessage::UnknownTransition { .. }
        ));
        let mut missing = eventbridge_event();
        missing["detail"]
            .as_object_mut()
            .unwrap()
            .remove("EC2InstanceId");
        let err = parse_event(&missing).remove(0).unwrap_err().to_string();
        assert!(
            err.contains("EventBridge event") && err.contains("EC2InstanceId"),
            "{err}"
        );
    }

    #[test]
    fn continuation_counter_round_trips() {
        let delivery = only(&fixture("sns-lifecycle-launching.json"));
        let republished: Value =
            serde_json::from_str(&delivery.message_for_continuation(3)).unwrap();
        let again = only(&sns_event(&republished));
        let n = again.lifecycle().unwrap();
        assert_eq!(n.continuation, 3);
        assert_eq!(n.action, delivery.lifecycle().unwrap().action);
        assert_eq!(n.time, delivery.lifecycle().unwrap().time);
    }

    #[test]
    fn warm_pool_routes_are_parsed_from_sns_and_eventbridge() {
        let cases = [
            ("autoscaling:EC2_INSTANCE_LAUNCHING", "EC2", "WarmPool"),
            (
                "autoscaling:EC2_INSTANCE_LAUNCHING",
                "WarmPool",
                "AutoScalingGroup",
            ),
            (
                "autoscaling:EC2_INSTANCE_LAUNCHING",
                "EC2",
                "AutoScalingGroup",
            ),
            (
                "autoscaling:EC2_INSTANCE_TERMINATING",
                "AutoScalingGroup",
                "WarmPool",
            ),
            (
                "autoscaling:EC2_INSTANCE_TERMINATING",
                "AutoScalingGroup",
                "EC2",
            ),
            ("autoscaling:EC2_INSTANCE_TERMINATING", "WarmPool", "EC2"),
        ];
        for (transition, origin, destination) in cases {
            let mut message = lifecycle_message();
            message["LifecycleTransition"] = transition.into();
            message["Origin"] = origin.into();
            message["Destination"] = destination.into();
            let n = only(&sns_event(&message)).lifecycle().unwrap().clone();
            assert_eq!(n.route.origin.as_str(), origin);
            assert_eq!(n.route.destination.as_str(), destination);
            let mut event = eventbridge_event();
            if transition.ends_with("TERMINATING") {
                event["detail-type"] = TERMINATE_DETAIL_TYPE.into();
            }
            event["detail"]["LifecycleTransition"] = transition.into();
            event["detail"]["Origin"] = origin.into();
            event["detail"]["Destination"] = destination.into();
            let delivery = only(&event);
            assert_eq!(delivery.lifecycle().unwrap().route, n.route);
            // The SNS-shaped rebuild keeps the route for a hand-over.
            let again = only(&sns_event(
                &serde_json::from_str(&delivery.raw_message).unwrap(),
            ));
            assert_eq!(again.lifecycle().unwrap().route, n.route);
        }
        let into = LifecycleRoute {
            origin: InstancePlace::Ec2,
            destination: InstancePlace::WarmPool,
        };
        assert!(into.is_into_warm_pool() && !into.is_out_of_warm_pool());
        let out = LifecycleRoute {
            origin: InstancePlace::WarmPool,
            destination: InstancePlace::AutoScalingGroup,
        };
        assert!(out.is_out_of_warm_pool() && !out.is_into_warm_pool());
    }

    #[test]
    fn a_notification_without_origin_and_destination_takes_the_plain_route() {
        let mut message = lifecycle_message();
        let object = message.as_object_mut().unwrap();
        object.remove("Origin");
        object.remove("Destination");
        let n = only(&sns_event(&message)).lifecycle().unwrap().clone();
        assert_eq!(
            n.route,
            LifecycleRoute::plain(LifecycleTransition::Terminating)
        );
        assert_eq!(n.route.to_string(), "AutoScalingGroup -> EC2");
    }

    #[test]
    fn odd_origins_and_destinations_are_refused_by_name() {
        for (transition, origin, destination, expected) in [
            ("TERMINATING", Some("Moon"), Some("EC2"), "Origin=\"Moon\""),
            (
                "TERMINATING",
                Some("AutoScalingGroup"),
                Some("warmpool"),
                "Destination=\"warmpool\"",
            ),
            ("TERMINATING", Some(""), Some("EC2"), "Origin=\"\""),
            ("TERMINATING", None, Some("WarmPool"), "Origin is missing"),
            (
                "TERMINATING",
                Some("WarmPool"),
                None,
                "Destination is missing",
            ),
            (
                "TERMINATING",
                Some("WarmPool"),
                Some("WarmPool"),
                "WarmPool -> WarmPool",
            ),
            (
                "TERMINATING",
                Some("EC2"),
                Some("AutoScalingGroup"),
                "a termination route",
            ),
            (
                "TERMINATING",
                Some("WarmPool"),
                Some("AutoScalingGroup"),
                "a termination route",
            ),
            (
                "LAUNCHING",
                Some("AutoScalingGroup"),
                Some("EC2"),
                "a launch route",
            ),
            (
                "LAUNCHING",
                Some("AutoScalingGroup"),
                Some("WarmPool"),
                "a launch route",
            ),
            ("LAUNCHING", Some("EC2"), Some("EC2"), "EC2 -> EC2"),
        ] {
            let mut message = lifecycle_message();
            message["LifecycleTransition"] =
                format!("autoscaling:EC2_INSTANCE_{transition}").into();
            let object = message.as_object_mut().unwrap();
            object.remove("Origin");
            object.remove("Destination");
            if let Some(origin) = origin {
                message["Origin"] = origin.into();
            }
            if let Some(destination) = destination {
                message["Destination"] = destination.into();
            }
            let err = parse_event(&sns_event(&message))
                .remove(0)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expected),
                "{transition} {origin:?} {destination:?}: {err}"
            );
        }
        let mut message = lifecycle_message();
        message["Destination"] = Value::from(3);
        let err = parse_event(&sns_event(&message))
            .remove(0)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("Destination") && err.contains("a string"),
            "{err}"
        );
    }
}
