//! What a Lambda event says: Auto Scaling lifecycle notifications delivered by SNS or
//! EventBridge, test notifications, and anything else a hook function might be sent.
//!
//! One file per source, each turning its envelope into the one shape of [`message`]
//! ([`LifecycleMessage`]): [`sns`] reads an SNS record (`aws_lambda_events`' `SnsRecord`) and
//! Auto Scaling's message inside it, [`eventbridge`] an EventBridge event (`EventBridgeEvent`)
//! whether it came directly or through SNS. The envelopes are deserialized with
//! `aws_lambda_events`' types; the lifecycle body (`Sns.Message` or `detail`) is ours, read
//! by the one tail in [`message`] that builds every [`LifecycleNotification`]. The hooks act
//! on that shape and never ask where it came from, except to send a continuation back.
//!
//! Parsing is a plain function over JSON so every shape is tested without I/O. Each record of
//! an event is parsed on its own: one malformed record yields an error for that record and
//! does not hide the others. Nothing here panics on input.

mod eventbridge;
mod message;
mod sns;
#[cfg(test)]
pub(crate) mod tests;

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

pub use message::{
    CONTINUATION_FIELD, FOUND_WAITING_FIELD, InstancePlace, LifecycleMessage,
    LifecycleNotification, LifecycleRoute, LifecycleTransition, TestNotification,
    found_waiting_message,
};

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
    /// The envelope (SNS record or EventBridge event) does not have the shape AWS delivers:
    /// `reason` names the field, as `aws_lambda_events`' types read it.
    #[error("{location}: not {envelope}: {reason}")]
    InvalidEnvelope {
        location: RecordLocation,
        envelope: &'static str,
        reason: String,
    },
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
            Self::InvalidEnvelope { location, .. }
            | Self::MissingField { location, .. }
            | Self::InvalidField { location, .. }
            | Self::InvalidMessageJson { location, .. } => Some(*location),
        }
    }
}

/// Every notification of a Lambda event, in order; one `Err` per record that cannot be used.
///
/// An event that is neither an SNS event nor an EventBridge event yields one `Err`. The
/// records of an SNS event are deserialized one by one (not as one `SnsEvent`) so that a
/// malformed record fails alone.
pub fn parse_event(event: &Value) -> Vec<Result<Delivery, NotificationError>> {
    if let Some(records) = event.get("Records") {
        return match records.as_array() {
            Some(records) if !records.is_empty() => records
                .iter()
                .enumerate()
                .map(|(index, record)| sns::parse_record(RecordLocation::Record(index), record))
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
        return vec![eventbridge::parse_delivery(event)];
    }
    let reason = match event {
        Value::Object(_) => "it has neither Records nor detail-type".to_owned(),
        other => format!("it is a JSON {}", json_kind(other)),
    };
    vec![Err(NotificationError::UnrecognisedEvent { reason })]
}

/// Deserializes an envelope with `aws_lambda_events`' type `T`, naming the field that does
/// not fit (`Sns.TopicArn: invalid type: integer ...`) instead of serde's bare message.
fn envelope<'a, T: Deserialize<'a>>(
    location: RecordLocation,
    envelope: &'static str,
    value: &'a Value,
) -> Result<T, NotificationError> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let inner = truncated(&error.into_inner().to_string());
        NotificationError::InvalidEnvelope {
            location,
            envelope,
            reason: if path == "." {
                inner
            } else {
                format!("{path}: {inner}")
            },
        }
    })
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
