//! An SNS record: the envelope as `aws_lambda_events`' `SnsRecord` (both spellings of the
//! URL fields, `SigningCertUrl` from Lambda and `SigningCertURL` from SNS over HTTP), and
//! Auto Scaling's message inside it: a lifecycle notification, a test notification, another
//! Auto Scaling notification, or a whole EventBridge event when a rule targets the topic.

use aws_lambda_events::event::sns::SnsRecord;
use serde_json::Value;

use super::message::{
    Announcement, LifecycleFields, LifecycleMessage, LifecycleTransition, TestNotification,
    continuation, lifecycle_notification, optional_str,
};
use super::{Delivery, DeliverySource, NotificationError, RecordLocation, eventbridge, truncated};

const ENVELOPE: &str = "an SNS record as Lambda delivers it (Records[].Sns)";
const TEST_NOTIFICATION_EVENT: &str = "autoscaling:TEST_NOTIFICATION";

/// One record of an SNS event.
pub(super) fn parse_record(
    location: RecordLocation,
    record: &Value,
) -> Result<Delivery, NotificationError> {
    let record: SnsRecord = super::envelope(location, ENVELOPE, record)?;
    let sns = record.sns;
    let parsed: Value = serde_json::from_str(&sns.message)
        .map_err(|source| NotificationError::InvalidMessageJson { location, source })?;
    if !parsed.is_object() {
        return Err(NotificationError::InvalidField {
            location,
            field: "Sns.Message",
            value: truncated(&sns.message),
            expected: "a JSON object (an Auto Scaling notification)",
        });
    }
    // An EventBridge rule may target the topic: then the message is the whole EventBridge
    // event. It is republished as it came.
    let message = if parsed.get("detail-type").is_some() {
        eventbridge::parse(location, &parsed)?
    } else {
        parse_autoscaling_message(location, &parsed)?
    };
    Ok(Delivery {
        location,
        source: DeliverySource::Sns {
            topic_arn: sns.topic_arn,
        },
        subject: sns.subject,
        message,
        raw_message: sns.message,
    })
}

/// Auto Scaling's own SNS message: lifecycle fields at the top level, or a test
/// notification (`Event`).
fn parse_autoscaling_message(
    location: RecordLocation,
    message: &Value,
) -> Result<LifecycleMessage, NotificationError> {
    let fields = LifecycleFields {
        location,
        object: message,
    };
    let event = fields.optional("Event")?;
    if event.as_deref() == Some(TEST_NOTIFICATION_EVENT) {
        return Ok(LifecycleMessage::Test(TestNotification {
            account_id: fields.optional("AccountId")?,
            group_name: fields.optional("AutoScalingGroupName")?,
            request_id: fields.optional("RequestId")?,
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
            Some(event) => Ok(LifecycleMessage::unknown(event, Some(message))),
            None => Err(NotificationError::MissingField {
                location,
                field: "LifecycleTransition",
            }),
        };
    };
    let Some(parsed_transition) = LifecycleTransition::parse(&transition) else {
        return Ok(LifecycleMessage::unknown(transition, Some(message)));
    };
    // Auto Scaling's SNS message carries who announced the action and when beside the action.
    let announcement = Announcement {
        time: fields.timestamp("Time")?,
        account_id: fields.required("AccountId")?,
        request_id: fields.required("RequestId")?,
        continuation: continuation(location, message)?,
    };
    lifecycle_notification(location, parsed_transition, announcement, message)
        .map(LifecycleMessage::Lifecycle)
}
