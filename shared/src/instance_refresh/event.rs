//! The EventBridge events Auto Scaling sends about an instance refresh (source
//! `aws.autoscaling`, detail `InstanceRefreshId` and `AutoScalingGroupName`), and about an
//! instance that joined or left a group (`EC2 Instance Launch Successful`, `EC2 Instance
//! Terminate Successful`: detail `AutoScalingGroupName` and `EC2InstanceId`, no refresh id),
//! as this function reads them. Only AWS services can send `aws.*` sources, but the event is
//! still only a hint: the handler asks Auto Scaling for the refresh before it writes anything.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::node_marks::refresh::is_label_safe;
use crate::reconcile::desired::refresh_in_progress;

const AUTOSCALING_SOURCE: &str = "aws.autoscaling";
const DETAIL_TYPE_PREFIX: &str = "EC2 Auto Scaling Instance Refresh ";
const LAUNCHED: &str = "EC2 Instance Launch Successful";
const TERMINATED: &str = "EC2 Instance Terminate Successful";

/// What happened to the refresh, from the event's `detail-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RefreshEventKind {
    Started,
    CheckpointReached,
    Succeeded,
    Failed,
    Cancelled,
    RollbackStarted,
    RollbackSucceeded,
    RollbackFailed,
    /// An instance of the group is in service (after its launching hook): new room may be
    /// Ready, so a refresh in progress plans again.
    InstanceLaunched,
    /// An instance left the group: room may have changed, a refresh in progress plans again.
    InstanceTerminated,
}

impl RefreshEventKind {
    fn of_detail_type(detail_type: &str) -> Option<Self> {
        match detail_type {
            LAUNCHED => return Some(Self::InstanceLaunched),
            TERMINATED => return Some(Self::InstanceTerminated),
            _ => {}
        }
        Some(match detail_type.strip_prefix(DETAIL_TYPE_PREFIX)? {
            "Started" => Self::Started,
            "Checkpoint Reached" => Self::CheckpointReached,
            "Succeeded" => Self::Succeeded,
            "Failed" => Self::Failed,
            "Cancelled" => Self::Cancelled,
            "Rollback Started" => Self::RollbackStarted,
            "Rollback Succeeded" => Self::RollbackSucceeded,
            "Rollback Failed" => Self::RollbackFailed,
            _ => return None,
        })
    }

    /// Whether the event says the replacement of outdated instances is over (or turned
    /// back): the nodes that stay get our marks undone. The others (`Started`, and
    /// `Checkpoint Reached` and the instance events, which plan again) mark.
    pub fn ends_replacement(self) -> bool {
        !self.plans()
    }

    /// Whether the event (re)plans the marks of a refresh in progress.
    pub fn plans(self) -> bool {
        matches!(
            self,
            Self::Started
                | Self::CheckpointReached
                | Self::InstanceLaunched
                | Self::InstanceTerminated
        )
    }

    /// Whether the event names an instance, not a refresh: the group's refresh in progress
    /// is looked up.
    pub fn names_an_instance(self) -> bool {
        matches!(self, Self::InstanceLaunched | Self::InstanceTerminated)
    }

    /// The refresh statuses that prove this event's claim. Auto Scaling reports the status
    /// the event announces; anything else means the event is stale or not Auto Scaling's,
    /// and nothing is written. An end is proven by exactly the statuses in which the
    /// reconciler drops the refresh's records ([`refresh_in_progress`]): one rule for the
    /// end of a refresh's marks, whether its event arrives or the sweep finds it lost.
    pub fn proven_by(self, status: &str) -> bool {
        if self.ends_replacement() {
            return !refresh_in_progress(status);
        }
        matches!(status, "Pending" | "InProgress")
    }
}

/// One refresh event, checked for shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshEvent {
    pub kind: RefreshEventKind,
    /// Empty for the instance events until the handler finds the group's refresh.
    pub instance_refresh_id: String,
    /// The instance an instance event names.
    pub instance_id: Option<String>,
    pub group_name: String,
    /// The account the event came from.
    pub account: String,
}

/// Why an invocation's payload is not a refresh event we can act on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RefreshEventError {
    #[error("not an EventBridge event (detail-type, source, account, detail): {0}")]
    NotAnEvent(String),
    #[error("event source {0:?} is not aws.autoscaling; refusing it")]
    WrongSource(String),
    #[error(
        "detail-type {0:?} is not an EC2 Auto Scaling instance refresh event; check the EventBridge rule"
    )]
    OtherDetailType(String),
    #[error("EC2InstanceId {0:?} is not an instance id")]
    BadInstanceId(String),
    #[error("the event detail lacks {0}")]
    MissingField(&'static str),
    #[error("InstanceRefreshId {0:?} is not an Auto Scaling refresh id")]
    BadRefreshId(String),
    #[error("AutoScalingGroupName {0:?} is not a group name (1 to 255 characters)")]
    BadGroupName(String),
}

// `Serialize` only because `EventBridgeEvent<T>` requires it of its detail type.
#[derive(Debug, Deserialize, Serialize)]
struct RefreshDetail {
    #[serde(rename = "InstanceRefreshId")]
    instance_refresh_id: Option<String>,
    #[serde(rename = "AutoScalingGroupName")]
    auto_scaling_group_name: Option<String>,
    #[serde(rename = "EC2InstanceId")]
    instance_id: Option<String>,
}

impl RefreshEvent {
    pub fn parse(payload: &Value) -> Result<Self, RefreshEventError> {
        let event: EventBridgeEvent<RefreshDetail> = serde_path_to_error::deserialize(payload)
            .map_err(|error| {
                let path = error.path().to_string();
                let inner = error.into_inner().to_string();
                RefreshEventError::NotAnEvent(truncate(&format!("{path}: {inner}")))
            })?;
        if event.source != AUTOSCALING_SOURCE {
            return Err(RefreshEventError::WrongSource(truncate(&event.source)));
        }
        let kind = RefreshEventKind::of_detail_type(&event.detail_type)
            .ok_or_else(|| RefreshEventError::OtherDetailType(truncate(&event.detail_type)))?;
        let (id, instance_id) = if kind.names_an_instance() {
            let instance = event
                .detail
                .instance_id
                .ok_or(RefreshEventError::MissingField("EC2InstanceId"))?;
            if !is_instance_id(&instance) {
                return Err(RefreshEventError::BadInstanceId(truncate(&instance)));
            }
            (String::new(), Some(instance))
        } else {
            let id = event
                .detail
                .instance_refresh_id
                .ok_or(RefreshEventError::MissingField("InstanceRefreshId"))?;
            if !is_label_safe(&id) {
                return Err(RefreshEventError::BadRefreshId(truncate(&id)));
            }
            (id, None)
        };
        let group = event
            .detail
            .auto_scaling_group_name
            .ok_or(RefreshEventError::MissingField("AutoScalingGroupName"))?;
        if group.is_empty() || group.len() > 255 || group.chars().any(char::is_control) {
            return Err(RefreshEventError::BadGroupName(truncate(&group)));
        }
        Ok(Self {
            kind,
            instance_refresh_id: id,
            instance_id,
            group_name: group,
            account: event.account.unwrap_or_default(),
        })
    }
}

/// `i-` and 8 or 17 hexadecimal digits.
fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// Event text quoted in an error stays short (a hostile payload may be megabytes).
fn truncate(text: &str) -> String {
    const LIMIT: usize = 200;
    match text.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn event(detail_type: &str, detail: Value) -> Value {
        json!({
            "version": "0",
            "id": "12345678-1234-1234-1234-123456789012",
            "detail-type": detail_type,
            "source": "aws.autoscaling",
            "account": "123456789012",
            "time": "2026-11-27T08:00:00Z",
            "region": "us-west-2",
            "resources": ["arn:aws:autoscaling:us-west-2:123456789012:autoScalingGroup:x:autoScalingGroupName/ng"],
            "detail": detail,
        })
    }

    fn detail() -> Value {
        json!({"InstanceRefreshId": "c613620e-07e2-4ed2-a9e2-ef8258911ade", "AutoScalingGroupName": "ng"})
    }

    /// One rule for the end of a refresh's marks: an end event is proven by exactly the
    /// statuses in which the reconciler drops the refresh's records, a rollback included
    /// (it keeps the outdated instances, which must be schedulable) and a status this
    /// release does not know.
    #[test]
    fn an_end_is_proven_exactly_where_the_reconciler_ends_the_marks() {
        let statuses = [
            "Pending",
            "InProgress",
            "Cancelling",
            "Baking",
            "Successful",
            "Failed",
            "Cancelled",
            "RollbackInProgress",
            "RollbackSuccessful",
            "RollbackFailed",
            "SomethingNew",
        ];
        let ends = [
            RefreshEventKind::Succeeded,
            RefreshEventKind::Failed,
            RefreshEventKind::Cancelled,
            RefreshEventKind::RollbackStarted,
            RefreshEventKind::RollbackSucceeded,
            RefreshEventKind::RollbackFailed,
        ];
        for kind in ends {
            assert!(kind.ends_replacement(), "{kind:?}");
            for status in statuses {
                assert_eq!(
                    kind.proven_by(status),
                    !refresh_in_progress(status),
                    "{kind:?} with the refresh {status}"
                );
            }
        }
    }

    #[test]
    fn every_refresh_detail_type_is_read() {
        for (suffix, kind) in [
            ("Started", RefreshEventKind::Started),
            ("Checkpoint Reached", RefreshEventKind::CheckpointReached),
            ("Succeeded", RefreshEventKind::Succeeded),
            ("Failed", RefreshEventKind::Failed),
            ("Cancelled", RefreshEventKind::Cancelled),
            ("Rollback Started", RefreshEventKind::RollbackStarted),
            ("Rollback Succeeded", RefreshEventKind::RollbackSucceeded),
            ("Rollback Failed", RefreshEventKind::RollbackFailed),
        ] {
            let parsed = RefreshEvent::parse(&event(
                &format!("EC2 Auto Scaling Instance Refresh {suffix}"),
                detail(),
            ))
            .unwrap();
            assert_eq!(parsed.kind, kind);
            assert_eq!(parsed.group_name, "ng");
            assert_eq!(parsed.account, "123456789012");
        }
    }

    #[test]
    fn malformed_and_foreign_events_are_refused_with_a_reason() {
        let started = "EC2 Auto Scaling Instance Refresh Started";
        let mut wrong_source = event(started, detail());
        wrong_source["source"] = json!("my.app");
        assert_eq!(
            RefreshEvent::parse(&wrong_source),
            Err(RefreshEventError::WrongSource("my.app".into()))
        );
        assert!(matches!(
            RefreshEvent::parse(&event("EC2 Instance-launch Lifecycle Action", detail())),
            Err(RefreshEventError::OtherDetailType(_))
        ));
        assert_eq!(
            RefreshEvent::parse(&event(started, json!({"AutoScalingGroupName": "ng"}))),
            Err(RefreshEventError::MissingField("InstanceRefreshId"))
        );
        assert!(matches!(
            RefreshEvent::parse(&event(
                started,
                json!({"InstanceRefreshId": "../../x", "AutoScalingGroupName": "ng"})
            )),
            Err(RefreshEventError::BadRefreshId(_))
        ));
        assert!(matches!(
            RefreshEvent::parse(&event(
                started,
                json!({"InstanceRefreshId": "abc", "AutoScalingGroupName": ""})
            )),
            Err(RefreshEventError::BadGroupName(_))
        ));
        for bad in [json!("text"), json!({"detail": 1}), json!(null)] {
            assert!(matches!(
                RefreshEvent::parse(&bad),
                Err(RefreshEventError::NotAnEvent(_))
            ));
        }
    }

    #[test]
    fn instance_events_name_the_group_and_the_instance() {
        for (detail_type, kind) in [
            (LAUNCHED, RefreshEventKind::InstanceLaunched),
            (TERMINATED, RefreshEventKind::InstanceTerminated),
        ] {
            let parsed = RefreshEvent::parse(&event(
                detail_type,
                json!({"AutoScalingGroupName": "ng", "EC2InstanceId": "i-1234567890abcdef0",
                       "StatusCode": "InProgress", "ActivityId": "a"}),
            ))
            .unwrap();
            assert_eq!(parsed.kind, kind);
            assert!(kind.plans() && !kind.ends_replacement());
            assert_eq!(parsed.instance_id.as_deref(), Some("i-1234567890abcdef0"));
            assert_eq!(parsed.instance_refresh_id, "");
            assert_eq!(
                RefreshEvent::parse(&event(detail_type, json!({"AutoScalingGroupName": "ng"}))),
                Err(RefreshEventError::MissingField("EC2InstanceId"))
            );
            assert!(matches!(
                RefreshEvent::parse(&event(
                    detail_type,
                    json!({"AutoScalingGroupName": "ng", "EC2InstanceId": "i-../x"})
                )),
                Err(RefreshEventError::BadInstanceId(_))
            ));
        }
    }

    #[test]
    fn only_the_announced_status_proves_an_event() {
        assert!(RefreshEventKind::Started.proven_by("InProgress"));
        assert!(!RefreshEventKind::Started.proven_by("Successful"));
        assert!(RefreshEventKind::Cancelled.proven_by("Cancelled"));
        assert!(!RefreshEventKind::Cancelled.proven_by("InProgress"));
        assert!(!RefreshEventKind::Succeeded.proven_by("Cancelling"));
        assert!(RefreshEventKind::RollbackStarted.proven_by("RollbackInProgress"));
        assert!(RefreshEventKind::CheckpointReached.proven_by("InProgress"));
        assert!(!RefreshEventKind::CheckpointReached.proven_by("Successful"));
    }
}
