//! An EventBridge event (`aws_lambda_events`' `EventBridgeEvent`), delivered directly or as
//! the message of an SNS record: Auto Scaling's `EC2 Instance-launch Lifecycle Action` and
//! `EC2 Instance-terminate Lifecycle Action`, with the lifecycle fields under `detail` and who
//! announced the action and when (`account`, `id`, `time`) in the envelope. Any other
//! `detail-type` is a well-formed event these functions do not handle.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use jiff::Timestamp;
use serde_json::Value;

use super::message::{
    Announcement, LifecycleMessage, LifecycleTransition, continuation, lifecycle_notification,
    optional_str, sns_shaped,
};
use super::{Delivery, DeliverySource, NotificationError, RecordLocation, truncated};

const ENVELOPE: &str = "an EventBridge event (detail-type, source, detail)";
const LAUNCH_DETAIL_TYPE: &str = "EC2 Instance-launch Lifecycle Action";
const TERMINATE_DETAIL_TYPE: &str = "EC2 Instance-terminate Lifecycle Action";
/// Only AWS services can send `aws.*` sources (`PutEvents` refuses them), so an event that
/// says it is Auto Scaling's lifecycle action from any other source is not Auto Scaling's.
const AUTOSCALING_SOURCE: &str = "aws.autoscaling";

/// A Lambda event that is one EventBridge event. It is republished (on a hand-over) in Auto
/// Scaling's SNS shape, so the next invocation reads it like any SNS delivery.
pub(super) fn parse_delivery(event: &Value) -> Result<Delivery, NotificationError> {
    let location = RecordLocation::EventBridge;
    let message = parse(location, event)?;
    let raw_message = match &message {
        LifecycleMessage::Lifecycle(notification) => sns_shaped(notification),
        _ => event.to_string(),
    };
    Ok(Delivery {
        location,
        source: DeliverySource::EventBridge,
        subject: None,
        message,
        raw_message,
    })
}

/// What an EventBridge event at `location` means.
pub(super) fn parse(
    location: RecordLocation,
    event: &Value,
) -> Result<LifecycleMessage, NotificationError> {
    let envelope: EventBridgeEvent<Value> = super::envelope(location, ENVELOPE, event)?;
    let detail = Some(&envelope.detail).filter(|detail| detail.is_object());
    let transition = match detail {
        Some(detail) => optional_str(
            location,
            detail,
            "detail.LifecycleTransition",
            "LifecycleTransition",
        )?,
        None => None,
    };
    let expected_transition = match envelope.detail_type.as_str() {
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
        return Ok(LifecycleMessage::unknown(
            transition.unwrap_or(envelope.detail_type),
            detail,
        ));
    };
    if envelope.source != AUTOSCALING_SOURCE {
        return Err(NotificationError::InvalidField {
            location,
            field: "source",
            value: truncated(&envelope.source),
            expected: "aws.autoscaling for a lifecycle action",
        });
    }
    let Some(detail) = detail else {
        return Err(NotificationError::InvalidField {
            location,
            field: "detail",
            value: truncated(&envelope.detail.to_string()),
            expected: "a JSON object of lifecycle fields",
        });
    };
    let announcement = Announcement {
        account_id: non_empty(location, "account", envelope.account)?,
        request_id: non_empty(location, "id", envelope.id)?,
        time: match envelope.time {
            // Read by `aws_lambda_events` (chrono), kept as the crate's `jiff::Timestamp`.
            Some(time) => i32::try_from(time.timestamp_subsec_nanos())
                .ok()
                .and_then(|nanos| Timestamp::new(time.timestamp(), nanos).ok())
                .ok_or_else(|| NotificationError::InvalidField {
                    location,
                    field: "time",
                    value: time.to_rfc3339(),
                    expected: "an RFC 3339 time such as 2022-09-25T12:59:58Z",
                })?,
            None => {
                return Err(NotificationError::MissingField {
                    location,
                    field: "time",
                });
            }
        },
        continuation: continuation(location, event)?,
    };
    lifecycle_notification(location, parsed_transition, announcement, detail)
        .map(LifecycleMessage::Lifecycle)
}

fn non_empty(
    location: RecordLocation,
    field: &'static str,
    value: Option<String>,
) -> Result<String, NotificationError> {
    match value {
        None => Err(NotificationError::MissingField { location, field }),
        Some(value) if value.trim().is_empty() => Err(NotificationError::InvalidField {
            location,
            field,
            value,
            expected: "a non-empty string",
        }),
        Some(value) => Ok(value),
    }
}
