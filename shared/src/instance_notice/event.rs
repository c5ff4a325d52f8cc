//! The EventBridge events that announce what AWS is about to do to an instance, parsed and
//! checked: EC2's Spot interruption warning, rebalance recommendation and state-change
//! notification, AWS Health's scheduled changes for EC2 instances; and the stack's schedule,
//! which runs the sweep ([`super::sweep`]).
//!
//! None of these names a group or a cluster: the instance decides ([`super::handler`]).
//! Anything malformed is an error that names the field; nothing is done for it.

use jiff::Timestamp;
use serde_json::Value;

/// `source` of EC2's instance events.
pub const EC2_SOURCE: &str = "aws.ec2";
/// `source` of AWS Health's events.
pub const HEALTH_SOURCE: &str = "aws.health";
/// `source` of a schedule rule's events.
pub const SCHEDULE_SOURCE: &str = "aws.events";

pub const SPOT_INTERRUPTION: &str = "EC2 Spot Instance Interruption Warning";
pub const REBALANCE_RECOMMENDATION: &str = "EC2 Instance Rebalance Recommendation";
pub const STATE_CHANGE: &str = "EC2 Instance State-change Notification";
pub const HEALTH_EVENT: &str = "AWS Health Event";
pub const SCHEDULED_EVENT: &str = "Scheduled Event";

/// How long EC2 gives a Spot instance after its interruption warning.
pub const SPOT_NOTICE: std::time::Duration = std::time::Duration::from_secs(120);

/// What an instance event announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announcement {
    /// The Spot instance is interrupted two minutes after the event's time; `action` is
    /// `terminate`, `stop` or `hibernate`.
    SpotInterruption {
        action: String,
    },
    RebalanceRecommendation,
    /// The instance is `stopping` or `shutting-down` now.
    Stopping {
        state: String,
    },
    /// AWS Health scheduled a change: `type_code` (e.g.
    /// `AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED`) starting at `starts_at` (as the event says;
    /// EC2's own schedule is checked before acting).
    ScheduledChange {
        type_code: String,
        starts_at: Option<Timestamp>,
        /// The Health event's `statusCode` is `closed`: the change is over (a reboot done).
        closed: bool,
    },
}

/// One instance event, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceEvent {
    pub id: String,
    pub account: String,
    /// The region the event comes from: EC2's and AWS Health's events name the region of the
    /// instance (a bus may receive other regions' events through a cross-region rule).
    pub region: String,
    pub time: Timestamp,
    pub announcement: Announcement,
    /// The affected instances (one for EC2's events; any number for AWS Health's).
    pub instance_ids: Vec<String>,
}

/// An event the terminating hook receives besides lifecycle notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeEvent {
    Instance(InstanceEvent),
    /// The stack's schedule: time for the sweep.
    Sweep,
    /// Well-formed, but nothing this function acts on (another Health service or category,
    /// a state other than stopping or shutting down); the reason.
    Ignored(String),
}

/// Why an event could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoticeEventError {
    #[error("the event has no {0}")]
    Missing(&'static str),
    #[error("the event's {field} is invalid: {value:?}")]
    Invalid { field: &'static str, value: String },
}

/// Whether `event` is one of the events this module handles (by source and detail-type);
/// anything else is a lifecycle notification or nothing the terminating hook knows.
pub fn is_notice_event(event: &Value) -> bool {
    let field = |name| event.get(name).and_then(Value::as_str);
    matches!(
        (field("source"), field("detail-type")),
        (
            Some(EC2_SOURCE),
            Some(SPOT_INTERRUPTION | REBALANCE_RECOMMENDATION | STATE_CHANGE)
        ) | (Some(HEALTH_SOURCE), Some(HEALTH_EVENT))
            | (Some(SCHEDULE_SOURCE), Some(SCHEDULED_EVENT))
    )
}

/// Parses and checks an event [`is_notice_event`] accepted.
pub fn parse(event: &Value) -> Result<NoticeEvent, NoticeEventError> {
    let source = text_field(event, "source")?;
    let detail_type = text_field(event, "detail-type")?;
    if source == SCHEDULE_SOURCE && detail_type == SCHEDULED_EVENT {
        return Ok(NoticeEvent::Sweep);
    }
    let id = text_field(event, "id")?.to_owned();
    let (account, region, time) = envelope(event)?;
    let detail = event
        .get("detail")
        .filter(|d| d.is_object())
        .ok_or(NoticeEventError::Missing("detail"))?;
    let (announcement, instance_ids) = match announcement(source, detail_type, detail)? {
        Ok(parsed) => parsed,
        Err(reason) => return Ok(NoticeEvent::Ignored(reason)),
    };
    Ok(NoticeEvent::Instance(InstanceEvent {
        id,
        account,
        region,
        time,
        announcement,
        instance_ids,
    }))
}

fn text_field<'a>(object: &'a Value, name: &'static str) -> Result<&'a str, NoticeEventError> {
    object
        .get(name)
        .and_then(Value::as_str)
        .ok_or(NoticeEventError::Missing(name))
}

/// The event's account, region and time, checked.
fn envelope(event: &Value) -> Result<(String, String, Timestamp), NoticeEventError> {
    let account = text_field(event, "account")?;
    if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NoticeEventError::Invalid {
            field: "account",
            value: account.to_owned(),
        });
    }
    let region = text_field(event, "region")?;
    if !is_region_name(region) {
        return Err(NoticeEventError::Invalid {
            field: "region",
            value: region.chars().take(64).collect(),
        });
    }
    let time = text_field(event, "time")?;
    let time: Timestamp = time.parse().map_err(|_| NoticeEventError::Invalid {
        field: "time",
        value: time.to_owned(),
    })?;
    Ok((account.to_owned(), region.to_owned(), time))
}

/// What the event announces and for which instances; `Err(reason)` for a well-formed event
/// this function does not act on.
#[allow(clippy::type_complexity)]
fn announcement(
    source: &str,
    detail_type: &str,
    detail: &Value,
) -> Result<Result<(Announcement, Vec<String>), String>, NoticeEventError> {
    let the_instance =
        || Ok::<_, NoticeEventError>(vec![instance_id(text_field(detail, "instance-id")?)?]);
    match (source, detail_type) {
        (EC2_SOURCE, SPOT_INTERRUPTION) => {
            let action = text_field(detail, "instance-action")?;
            if !matches!(action, "terminate" | "stop" | "hibernate") {
                return Err(NoticeEventError::Invalid {
                    field: "instance-action",
                    value: action.to_owned(),
                });
            }
            let action = action.to_owned();
            Ok(Ok((
                Announcement::SpotInterruption { action },
                the_instance()?,
            )))
        }
        (EC2_SOURCE, REBALANCE_RECOMMENDATION) => {
            Ok(Ok((Announcement::RebalanceRecommendation, the_instance()?)))
        }
        (EC2_SOURCE, STATE_CHANGE) => {
            let state = text_field(detail, "state")?;
            let instance = instance_id(text_field(detail, "instance-id")?)?;
            if !matches!(state, "stopping" | "shutting-down") {
                return Ok(Err(format!(
                    "instance {instance} is {state}: only stopping and shutting-down are acted on"
                )));
            }
            let state = state.to_owned();
            Ok(Ok((Announcement::Stopping { state }, vec![instance])))
        }
        (HEALTH_SOURCE, HEALTH_EVENT) => scheduled_change(detail),
        _ => Err(NoticeEventError::Invalid {
            field: "detail-type",
            value: format!("{source} / {detail_type}"),
        }),
    }
}

/// An AWS Health event's scheduled change for EC2 instances; `Err(reason)` for a
/// well-formed event this function does not act on.
#[allow(clippy::type_complexity)]
fn scheduled_change(
    detail: &Value,
) -> Result<Result<(Announcement, Vec<String>), String>, NoticeEventError> {
    let text = |name: &'static str| {
        detail
            .get(name)
            .and_then(Value::as_str)
            .ok_or(NoticeEventError::Missing(name))
    };
    let service = text("service")?;
    let category = text("eventTypeCategory")?;
    let type_code = text("eventTypeCode")?;
    if service != "EC2" || category != "scheduledChange" {
        return Ok(Err(format!(
            "AWS Health event {type_code} ({service}, {category}): only EC2 scheduled changes are acted on"
        )));
    }
    let starts_at = match detail.get("startTime").and_then(Value::as_str) {
        None => None,
        Some(raw) => Some(health_time(raw).ok_or_else(|| NoticeEventError::Invalid {
            field: "startTime",
            value: raw.to_owned(),
        })?),
    };
    let entities = detail
        .get("affectedEntities")
        .and_then(Value::as_array)
        .ok_or(NoticeEventError::Missing("affectedEntities"))?;
    let mut instance_ids = Vec::new();
    for entity in entities {
        let value = entity
            .get("entityValue")
            .and_then(Value::as_str)
            .ok_or(NoticeEventError::Missing("affectedEntities[].entityValue"))?;
        // A scheduled change may name other entities (a Dedicated Host): only instances
        // have nodes.
        if value.starts_with("i-") {
            instance_ids.push(instance_id(value)?);
        }
    }
    if instance_ids.is_empty() {
        return Ok(Err(format!(
            "AWS Health event {type_code} names no EC2 instance"
        )));
    }
    let closed = detail.get("statusCode").and_then(Value::as_str) == Some("closed");
    Ok(Ok((
        Announcement::ScheduledChange {
            type_code: type_code.to_owned(),
            starts_at,
            closed,
        },
        instance_ids,
    )))
}

/// AWS Health writes its times as in `Sat, 05 Jun 2016 15:10:09 GMT` (RFC 2822); RFC 3339
/// is accepted too.
fn health_time(raw: &str) -> Option<Timestamp> {
    jiff::fmt::rfc2822::parse(raw)
        .map(|zoned| zoned.timestamp())
        .ok()
        .or_else(|| raw.parse().ok())
}

/// A region name as AWS writes it (`eu-west-1`, `us-gov-west-1`): lowercase letters, digits
/// and dashes.
fn is_region_name(raw: &str) -> bool {
    (1..=32).contains(&raw.len())
        && raw
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// An EC2 instance id: `i-` and 8 or 17 lowercase hex digits.
fn instance_id(raw: &str) -> Result<String, NoticeEventError> {
    let valid = raw.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if valid {
        Ok(raw.to_owned())
    } else {
        Err(NoticeEventError::Invalid {
            field: "instance-id",
            value: raw.chars().take(64).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn envelope(source: &str, detail_type: &str, detail: Value) -> Value {
        json!({
            "version": "0", "id": "7f2a0e43-9f1c-4b0c-8a61-0d3c5b1e2f11",
            "detail-type": detail_type, "source": source, "account": "123456789012",
            "time": "2026-11-27T10:00:00Z", "region": "eu-west-1",
            "resources": ["arn:aws:ec2:eu-west-1:123456789012:instance/i-0a1b2c3d4e5f60718"],
            "detail": detail,
        })
    }

    fn instance(event: NoticeEvent) -> InstanceEvent {
        match event {
            NoticeEvent::Instance(event) => event,
            other => panic!("expected an instance event, got {other:?}"),
        }
    }

    #[test]
    fn spot_warning_rebalance_and_state_change() {
        let spot = envelope(
            EC2_SOURCE,
            SPOT_INTERRUPTION,
            json!({"instance-id": "i-0a1b2c3d4e5f60718", "instance-action": "terminate"}),
        );
        assert!(is_notice_event(&spot));
        let spot = instance(parse(&spot).unwrap());
        assert_eq!(
            spot.announcement,
            Announcement::SpotInterruption {
                action: "terminate".into()
            }
        );
        assert_eq!(spot.instance_ids, ["i-0a1b2c3d4e5f60718"]);
        assert_eq!(spot.region, "eu-west-1");
        assert_eq!(spot.time, "2026-11-27T10:00:00Z".parse().unwrap());

        let rebalance = envelope(
            EC2_SOURCE,
            REBALANCE_RECOMMENDATION,
            json!({"instance-id": "i-0a1b2c3d"}),
        );
        assert_eq!(
            instance(parse(&rebalance).unwrap()).announcement,
            Announcement::RebalanceRecommendation
        );

        let stopping = envelope(
            EC2_SOURCE,
            STATE_CHANGE,
            json!({"instance-id": "i-0a1b2c3d", "state": "shutting-down"}),
        );
        assert_eq!(
            instance(parse(&stopping).unwrap()).announcement,
            Announcement::Stopping {
                state: "shutting-down".into()
            }
        );
        let running = envelope(
            EC2_SOURCE,
            STATE_CHANGE,
            json!({"instance-id": "i-0a1b2c3d", "state": "running"}),
        );
        assert!(matches!(parse(&running).unwrap(), NoticeEvent::Ignored(_)));
    }

    #[test]
    fn health_scheduled_change_with_its_rfc2822_start() {
        let event = envelope(
            HEALTH_SOURCE,
            HEALTH_EVENT,
            json!({
                "eventArn": "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/x",
                "service": "EC2",
                "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
                "eventTypeCategory": "scheduledChange",
                "startTime": "Sat, 05 Dec 2026 15:10:09 GMT",
                "affectedEntities": [{"entityValue": "i-0a1b2c3d4e5f60718"}, {"entityValue": "h-0123"}],
            }),
        );
        let parsed = instance(parse(&event).unwrap());
        assert_eq!(
            parsed.announcement,
            Announcement::ScheduledChange {
                type_code: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".into(),
                starts_at: Some("2026-12-05T15:10:09Z".parse().unwrap()),
                closed: false,
            }
        );
        assert_eq!(parsed.instance_ids, ["i-0a1b2c3d4e5f60718"]);

        let mut other = event.clone();
        other["detail"]["service"] = json!("RDS");
        assert!(matches!(parse(&other).unwrap(), NoticeEvent::Ignored(_)));
        let mut issue = event;
        issue["detail"]["eventTypeCategory"] = json!("issue");
        assert!(matches!(parse(&issue).unwrap(), NoticeEvent::Ignored(_)));
    }

    #[test]
    fn malformed_and_hostile_events_are_errors_naming_the_field() {
        let cases = [
            (
                json!({"instance-id": "i-0a1b2c3d; rm -rf", "instance-action": "terminate"}),
                "instance-id",
            ),
            (
                json!({"instance-id": "i-0a1b2c3d", "instance-action": "explode"}),
                "instance-action",
            ),
            (json!({"instance-action": "terminate"}), "instance-id"),
        ];
        for (detail, field) in cases {
            let error = parse(&envelope(EC2_SOURCE, SPOT_INTERRUPTION, detail)).unwrap_err();
            assert!(error.to_string().contains(field), "{error}");
        }
        let mut bad_account = envelope(
            EC2_SOURCE,
            REBALANCE_RECOMMENDATION,
            json!({"instance-id": "i-0a1b2c3d"}),
        );
        bad_account["account"] = json!("12345");
        assert!(
            parse(&bad_account)
                .unwrap_err()
                .to_string()
                .contains("account")
        );
        let mut bad_region = bad_account.clone();
        bad_region["account"] = json!("123456789012");
        bad_region["region"] = json!("eu west 1; drop");
        assert!(
            parse(&bad_region)
                .unwrap_err()
                .to_string()
                .contains("region")
        );
        bad_region["region"] = Value::Null;
        assert_eq!(
            parse(&bad_region).unwrap_err(),
            NoticeEventError::Missing("region")
        );
        let mut no_detail = bad_account.clone();
        no_detail["account"] = json!("123456789012");
        no_detail["detail"] = json!("text");
        assert_eq!(
            parse(&no_detail).unwrap_err(),
            NoticeEventError::Missing("detail")
        );
        let bad_start = envelope(
            HEALTH_SOURCE,
            HEALTH_EVENT,
            json!({"service": "EC2", "eventTypeCode": "X", "eventTypeCategory": "scheduledChange",
                   "startTime": "soon", "affectedEntities": [{"entityValue": "i-0a1b2c3d"}]}),
        );
        assert!(
            parse(&bad_start)
                .unwrap_err()
                .to_string()
                .contains("startTime")
        );
    }

    #[test]
    fn lifecycle_notifications_and_other_events_are_not_notices() {
        let lifecycle = json!({"source": "aws.autoscaling", "detail-type": "EC2 Instance-terminate Lifecycle Action"});
        assert!(!is_notice_event(&lifecycle));
        assert!(!is_notice_event(&json!({"Records": []})));
        let schedule =
            json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}});
        assert!(is_notice_event(&schedule));
        assert_eq!(parse(&schedule).unwrap(), NoticeEvent::Sweep);
    }
}
