//! The one shape every source is turned into ([`LifecycleMessage`], [`LifecycleNotification`]),
//! and the one tail that builds a [`LifecycleNotification`] from a lifecycle body: Auto
//! Scaling's SNS message or an EventBridge event's `detail`, which carry the same fields.
//!
//! Each source first reads who announced the action and when ([`Announcement`]: from Auto
//! Scaling's message for SNS, from the envelope for EventBridge), then hands the body to
//! [`lifecycle_notification`]. So a body with several faults reports them in one order
//! whatever the source: the announcement, then the action (`EC2InstanceId`,
//! `AutoScalingGroupName`, `LifecycleHookName`, `LifecycleActionToken`), then
//! `NotificationMetadata`, then the route (`Origin`, `Destination`).

use std::fmt;

use jiff::Timestamp;
use serde_json::{Map, Value};

use super::{NotificationError, RecordLocation, truncated};
use crate::aws::LifecycleActionRef;

/// The field a handed-over notification carries to count its continuations. Auto Scaling
/// never sends it; its absence means "fresh from Auto Scaling".
pub const CONTINUATION_FIELD: &str = "NodeManagerContinuation";

/// The field (`true`) of a notification the sweep publishes for a terminating action it
/// found waiting whose own notification was lost or never handled. Auto Scaling lists no
/// token for it, so the message has none and names the action by its instance; Auto
/// Scaling never sends the field, and a message without a token is refused without it.
pub const FOUND_WAITING_FIELD: &str = "NodeManagerFoundWaiting";

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

impl LifecycleMessage {
    /// A well-formed message about `transition`, which these functions do not handle; `body`
    /// names the group and instance when it has them.
    pub(super) fn unknown(transition: String, body: Option<&Value>) -> Self {
        let text = |key: &str| {
            body.and_then(|body| body.get(key))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        Self::UnknownTransition {
            transition,
            group_name: text("AutoScalingGroupName"),
            instance_id: text("EC2InstanceId"),
        }
    }
}

/// Who announced a lifecycle action and when, read by each source from where it keeps them.
pub(super) struct Announcement {
    pub account_id: String,
    pub request_id: String,
    pub time: Timestamp,
    pub continuation: u32,
}

/// The one tail: the lifecycle action `body` announces, checked field by field.
pub(super) fn lifecycle_notification(
    location: RecordLocation,
    transition: LifecycleTransition,
    announcement: Announcement,
    body: &Value,
) -> Result<LifecycleNotification, NotificationError> {
    let fields = LifecycleFields {
        location,
        object: body,
    };
    let action = fields.action()?;
    if action.by_instance_only() && transition != LifecycleTransition::Terminating {
        return Err(NotificationError::InvalidField {
            location,
            field: FOUND_WAITING_FIELD,
            value: "true".to_owned(),
            expected: "only on a terminating action (the sweep finds no other)",
        });
    }
    let notification_metadata = fields.optional("NotificationMetadata")?;
    let origin = fields.optional("Origin")?;
    let destination = fields.optional("Destination")?;
    let route = route(
        location,
        transition,
        origin.as_deref(),
        destination.as_deref(),
    )?;
    Ok(LifecycleNotification {
        transition,
        action,
        account_id: announcement.account_id,
        request_id: announcement.request_id,
        time: announcement.time,
        notification_metadata,
        origin,
        destination,
        route,
        continuation: announcement.continuation,
    })
}

/// Renders a notification the way Auto Scaling writes it to SNS.
pub(super) fn sns_shaped(notification: &LifecycleNotification) -> String {
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
    let by_instance = notification.action.by_instance_only();
    put(
        "LifecycleActionToken",
        (!by_instance).then_some(notification.action.token.as_str()),
    );
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
    if by_instance {
        fields.insert(FOUND_WAITING_FIELD.to_owned(), Value::Bool(true));
    }
    Value::Object(fields).to_string()
}

/// The notification of a terminating action the sweep found waiting (see
/// [`FOUND_WAITING_FIELD`]), as Auto Scaling would have written it to SNS, announced at
/// `found_at` (when it was found: Auto Scaling does not say when the action started);
/// `into_warm_pool`: the instance goes back to the warm pool, not out of the group.
pub fn found_waiting_message(
    action: &LifecycleActionRef,
    account_id: &str,
    found_at: Timestamp,
    into_warm_pool: bool,
) -> String {
    let destination = if into_warm_pool {
        InstancePlace::WarmPool
    } else {
        InstancePlace::Ec2
    };
    let route = LifecycleRoute {
        origin: InstancePlace::AutoScalingGroup,
        destination,
    };
    let notification = LifecycleNotification {
        transition: LifecycleTransition::Terminating,
        action: LifecycleActionRef {
            token: String::new(),
            ..action.clone()
        },
        account_id: account_id.to_owned(),
        request_id: format!("found-waiting-{}", action.instance_id),
        time: found_at,
        notification_metadata: None,
        origin: Some(route.origin.as_str().to_owned()),
        destination: Some(route.destination.as_str().to_owned()),
        route,
        continuation: 0,
    };
    sns_shaped(&notification)
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

pub(super) fn continuation(
    location: RecordLocation,
    message: &Value,
) -> Result<u32, NotificationError> {
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
pub(super) struct LifecycleFields<'a> {
    pub location: RecordLocation,
    pub object: &'a Value,
}

impl LifecycleFields<'_> {
    pub fn required(&self, field: &'static str) -> Result<String, NotificationError> {
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

    pub fn optional(&self, field: &'static str) -> Result<Option<String>, NotificationError> {
        optional_str(self.location, self.object, field, field)
    }

    pub fn timestamp(&self, field: &'static str) -> Result<Timestamp, NotificationError> {
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
            token: self.token()?,
        })
    }

    /// The action's token; none (empty) only in a message the sweep marked as found
    /// waiting ([`FOUND_WAITING_FIELD`]), which must not carry one.
    fn token(&self) -> Result<String, NotificationError> {
        match self.object.get(FOUND_WAITING_FIELD) {
            None | Some(Value::Null) => self.required("LifecycleActionToken"),
            Some(Value::Bool(true)) => match self.optional("LifecycleActionToken")? {
                None => Ok(String::new()),
                Some(token) => Err(NotificationError::InvalidField {
                    location: self.location,
                    field: "LifecycleActionToken",
                    value: truncated(&token),
                    expected: "none in a message found waiting by the sweep",
                }),
            },
            Some(other) => Err(NotificationError::InvalidField {
                location: self.location,
                field: FOUND_WAITING_FIELD,
                value: truncated(&other.to_string()),
                expected: "true",
            }),
        }
    }
}

/// `i-` followed by hexadecimal digits: the id goes into provider IDs and log lines.
fn is_instance_id(value: &str) -> bool {
    value.strip_prefix("i-").is_some_and(|hex| {
        !hex.is_empty() && hex.len() <= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

pub(super) fn required_str(
    location: RecordLocation,
    object: &Value,
    field: &'static str,
    key: &str,
) -> Result<String, NotificationError> {
    optional_str(location, object, field, key)?
        .ok_or(NotificationError::MissingField { location, field })
}

pub(super) fn optional_str(
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
