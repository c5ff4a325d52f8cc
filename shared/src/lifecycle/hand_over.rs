//! The end of an invocation's work on a lifecycle action: hand it over to a fresh invocation
//! ([`hand_over`]: a heartbeat, then the notification published again) or complete it
//! ([`complete_action`]).

use crate::aws::{
    AutoScaling, AwsError, CompletionOutcome, LifecycleActionRef, LifecycleActionResult,
    Notifications,
};
use crate::retry::{RetryPolicy, with_retries};

use super::heartbeat::HeartbeatKeeper;
use super::notification::{Delivery, DeliverySource};

/// What [`hand_over`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandOver {
    /// A fresh invocation will continue: the message went to `topic_arn` with this
    /// continuation count.
    Published {
        topic_arn: String,
        continuation: u32,
    },
    /// The heartbeat found the action gone: nothing to continue.
    ActionGone,
}

/// A hand-over that could not happen.
#[derive(Debug, thiserror::Error)]
pub enum ContinuationError {
    #[error(
        "cannot continue a notification that arrived through EventBridge: set CONTINUATION_TOPIC_ARN to an SNS topic that invokes this function"
    )]
    NoTopic,
    #[error("only lifecycle notifications can be continued")]
    NotALifecycleNotification,
    #[error(transparent)]
    Aws(#[from] AwsError),
}

/// The field a handed-over notification carries to name the invocation (its Lambda request
/// id, the name its drain lease holds) that stopped working and handed over: the
/// continuation may take over a lease that still names it (its hand-over mark may not have
/// been written). Auto Scaling never sends it.
pub const HANDED_OVER_BY_FIELD: &str = "NodeManagerHandedOverBy";

/// The longest request id [`predecessor_of`] accepts (Lambda's are 36-character UUIDs).
const MAX_PREDECESSOR_LEN: usize = 128;

/// The invocation that handed `delivery` over, as its message names it
/// ([`HANDED_OVER_BY_FIELD`]); `None` when it names none. A malformed name is ignored with a
/// warning: without it the continuation waits for the lease to lapse, as for a message of a
/// release that did not name itself.
pub(crate) fn predecessor_of(delivery: &Delivery) -> Option<String> {
    let message: serde_json::Value = serde_json::from_str(&delivery.raw_message).ok()?;
    let value = message.get(HANDED_OVER_BY_FIELD)?;
    let valid = value.as_str().filter(|id| {
        !id.is_empty()
            && id.len() <= MAX_PREDECESSOR_LEN
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    });
    if valid.is_none() {
        tracing::warn!(
            field = HANDED_OVER_BY_FIELD,
            "ignoring a malformed predecessor in a handed-over notification"
        );
    }
    valid.map(str::to_owned)
}

/// The message a hand-over publishes: the notification with its continuation count, naming
/// `predecessor` when given (else the predecessor it named, if any, stays).
fn continuation_message(
    delivery: &Delivery,
    continuation: u32,
    predecessor: Option<&str>,
) -> String {
    let message = delivery.message_for_continuation(continuation);
    let Some(predecessor) = predecessor else {
        return message;
    };
    match serde_json::from_str::<serde_json::Value>(&message) {
        Ok(serde_json::Value::Object(mut fields)) => {
            fields.insert(HANDED_OVER_BY_FIELD.to_owned(), predecessor.into());
            serde_json::Value::Object(fields).to_string()
        }
        _ => message,
    }
}

/// Extends the action with a heartbeat, then publishes the notification again to the topic it
/// came from (or `fallback_topic` for EventBridge deliveries) so a fresh invocation resumes.
pub(crate) async fn hand_over(
    autoscaling: &impl AutoScaling,
    notifications: &impl Notifications,
    keeper: &mut HeartbeatKeeper,
    delivery: &Delivery,
    fallback_topic: Option<&str>,
) -> Result<HandOver, ContinuationError> {
    hand_over_from(
        autoscaling,
        notifications,
        keeper,
        delivery,
        fallback_topic,
        None,
    )
    .await
}

/// [`hand_over`] by `predecessor`, the invocation letting go of its drain lease: the
/// message names it ([`HANDED_OVER_BY_FIELD`]).
pub(crate) async fn hand_over_from(
    autoscaling: &impl AutoScaling,
    notifications: &impl Notifications,
    keeper: &mut HeartbeatKeeper,
    delivery: &Delivery,
    fallback_topic: Option<&str>,
    predecessor: Option<&str>,
) -> Result<HandOver, ContinuationError> {
    let notification = delivery
        .lifecycle()
        .ok_or(ContinuationError::NotALifecycleNotification)?;
    let topic_arn = match &delivery.source {
        DeliverySource::Sns { topic_arn } => topic_arn.as_str(),
        DeliverySource::EventBridge => fallback_topic.ok_or(ContinuationError::NoTopic)?,
    };
    if keeper.beat(autoscaling).await.is_err() {
        return Ok(HandOver::ActionGone);
    }
    let continuation = notification.continuation.saturating_add(1);
    let message = continuation_message(delivery, continuation, predecessor);
    with_retries(&RetryPolicy::AWS_CALL, || {
        notifications.publish(topic_arn, delivery.subject.as_deref(), &message)
    })
    .await?;
    tracing::info!(
        instance_id = %notification.action.instance_id,
        asg = %notification.action.auto_scaling_group_name,
        hook = %notification.action.lifecycle_hook_name,
        request_id = %notification.request_id,
        topic_arn,
        continuation,
        "handed over to a fresh invocation"
    );
    Ok(HandOver::Published {
        topic_arn: topic_arn.to_owned(),
        continuation,
    })
}

/// `CompleteLifecycleAction`, retried when that may help. `Ok(NoActiveAction)` means it was
/// done already (by a duplicate, or it timed out): a success for the caller.
pub(crate) async fn complete_action(
    autoscaling: &impl AutoScaling,
    action: &LifecycleActionRef,
    result: LifecycleActionResult,
) -> Result<CompletionOutcome, AwsError> {
    with_retries(&RetryPolicy::AWS_CALL, || {
        autoscaling.complete_lifecycle_action(action, result)
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use jiff::Timestamp;

    use super::*;
    use crate::aws::AwsErrorKind;
    use crate::aws::in_memory::{InMemoryAutoScaling, InMemoryNotifications};
    use crate::lifecycle::notification::parse_event;
    use crate::lifecycle::notification::tests::sns_event_with;
    use crate::lifecycle::test_support::{action, hook};

    #[tokio::test]
    async fn retries_only_what_may_succeed() {
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action());
        asg.faults
            .fail("CompleteLifecycleAction", AwsErrorKind::Transient, 1);
        let outcome = complete_action(&asg, &action(), LifecycleActionResult::Continue)
            .await
            .unwrap();
        assert_eq!(outcome, CompletionOutcome::Completed);
        assert_eq!(asg.completions().len(), 1);
        // Already done: success, not an error.
        assert_eq!(
            complete_action(&asg, &action(), LifecycleActionResult::Continue)
                .await
                .unwrap(),
            CompletionOutcome::NoActiveAction
        );
        asg.faults
            .fail("CompleteLifecycleAction", AwsErrorKind::AccessDenied, 1);
        let err = complete_action(&asg, &action(), LifecycleActionResult::Continue)
            .await
            .unwrap_err();
        assert_eq!(err.kind, AwsErrorKind::AccessDenied);
    }

    fn delivery(path: &str) -> Delivery {
        let path = format!("{}/../tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
        let event = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        parse_event(&event).remove(0).unwrap()
    }

    #[tokio::test]
    async fn hand_over_beats_then_republishes_to_the_same_topic() {
        let delivery = delivery("sns-lifecycle-launching.json");
        let action = delivery.lifecycle().unwrap().action.clone();
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action);
        let sns = InMemoryNotifications::default();
        let mut keeper = HeartbeatKeeper::new(
            action.clone(),
            &hook(60, 6000),
            Timestamp::now(),
            Timestamp::now(),
        );
        let outcome = hand_over(&asg, &sns, &mut keeper, &delivery, None)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            HandOver::Published {
                topic_arn: "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic".into(),
                continuation: 1
            }
        );
        assert_eq!(asg.heartbeats().len(), 1);
        let published = sns.published();
        assert_eq!(published.len(), 1);
        let again = sns_event_with(&published[0].topic_arn, &published[0].message);
        let resumed = parse_event(&again).remove(0).unwrap();
        let resumed = resumed.lifecycle().unwrap();
        assert_eq!(resumed.continuation, 1);
        assert_eq!(resumed.time, delivery.lifecycle().unwrap().time);
        assert_eq!(resumed.action, action);
    }

    /// Hands `delivery` over by `predecessor` and parses what was published.
    async fn republish(
        asg: &InMemoryAutoScaling,
        sns: &InMemoryNotifications,
        keeper: &mut HeartbeatKeeper,
        delivery: &Delivery,
        predecessor: Option<&str>,
    ) -> Delivery {
        hand_over_from(asg, sns, keeper, delivery, None, predecessor)
            .await
            .unwrap();
        let published = sns.published();
        let last = published.last().unwrap();
        let again = sns_event_with(&last.topic_arn, &last.message);
        parse_event(&again).remove(0).unwrap()
    }

    #[tokio::test]
    async fn a_hand_over_names_the_invocation_letting_go_and_a_continuation_reads_it() {
        let delivery = delivery("sns-lifecycle-launching.json");
        assert_eq!(predecessor_of(&delivery), None, "Auto Scaling names nobody");
        let action = delivery.lifecycle().unwrap().action.clone();
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action);
        let sns = InMemoryNotifications::default();
        let mut keeper = HeartbeatKeeper::new(
            action.clone(),
            &hook(60, 6000),
            Timestamp::now(),
            Timestamp::now(),
        );
        let first = republish(&asg, &sns, &mut keeper, &delivery, Some("req-1")).await;
        assert_eq!(predecessor_of(&first).as_deref(), Some("req-1"));
        assert_eq!(first.lifecycle().unwrap().action, action);
        // Handed on without a lease of its own: the predecessor named stays.
        let second = republish(&asg, &sns, &mut keeper, &first, None).await;
        assert_eq!(predecessor_of(&second).as_deref(), Some("req-1"));
        assert_eq!(second.lifecycle().unwrap().continuation, 2);
        // A malformed name is ignored.
        for bad in [r#"42"#, r#""""#, r#""req 1""#] {
            let mut message: serde_json::Value = serde_json::from_str(&first.raw_message).unwrap();
            message[HANDED_OVER_BY_FIELD] = serde_json::from_str(bad).unwrap();
            let event =
                sns_event_with("arn:aws:sns:eu-west-1:111111111111:t", &message.to_string());
            let parsed = parse_event(&event).remove(0).unwrap();
            assert_eq!(predecessor_of(&parsed), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn hand_over_of_a_gone_action_publishes_nothing() {
        let delivery = delivery("sns-lifecycle-launching.json");
        let action = delivery.lifecycle().unwrap().action.clone();
        let asg = InMemoryAutoScaling::new();
        let sns = InMemoryNotifications::default();
        let mut keeper =
            HeartbeatKeeper::new(action, &hook(60, 6000), Timestamp::now(), Timestamp::now());
        let outcome = hand_over(&asg, &sns, &mut keeper, &delivery, None)
            .await
            .unwrap();
        assert_eq!(outcome, HandOver::ActionGone);
        assert!(sns.published().is_empty());
    }

    #[tokio::test]
    async fn eventbridge_deliveries_continue_through_the_configured_topic() {
        let event: serde_json::Value = serde_json::json!({
            "id": "e-1",
            "source": "aws.autoscaling",
            "detail-type": "EC2 Instance-launch Lifecycle Action",
            "account": "111111111111",
            "time": "2022-09-25T12:59:58Z",
            "detail": {
                "LifecycleActionToken": "tok",
                "AutoScalingGroupName": "asg",
                "LifecycleHookName": "Launch-LC-Hook",
                "EC2InstanceId": "i-0a1b2c3d4e5f60718",
                "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING"
            }
        });
        let delivery = parse_event(&event).remove(0).unwrap();
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action());
        let sns = InMemoryNotifications::default();
        let mut keeper = HeartbeatKeeper::new(
            action(),
            &hook(60, 6000),
            Timestamp::now(),
            Timestamp::now(),
        );
        let err = hand_over(&asg, &sns, &mut keeper, &delivery, None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("CONTINUATION_TOPIC_ARN"), "{err}");
        let outcome = hand_over(
            &asg,
            &sns,
            &mut keeper,
            &delivery,
            Some("arn:aws:sns:eu-west-1:111111111111:continue"),
        )
        .await
        .unwrap();
        assert!(matches!(
            outcome,
            HandOver::Published {
                continuation: 1,
                ..
            }
        ));
        let published = sns.published();
        assert_eq!(
            published[0].topic_arn,
            "arn:aws:sns:eu-west-1:111111111111:continue"
        );
        // What was published is an Auto Scaling SNS message for the same action.
        let again = sns_event_with(&published[0].topic_arn, &published[0].message);
        let resumed = parse_event(&again).remove(0).unwrap();
        assert_eq!(resumed.lifecycle().unwrap().action, action());
        assert_eq!(resumed.lifecycle().unwrap().continuation, 1);
    }
}
