#![allow(clippy::unwrap_used)]

use jiff::Timestamp;
use serde_json::Value;

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
    sns_event_with(
        "arn:aws:sns:eu-west-1:111111111111:topic",
        &message.to_string(),
    )
}

/// A Lambda SNS event of one record carrying `message`, with every field SNS sends (the URL
/// fields in SNS's HTTP spelling, as some deliveries have them).
pub(crate) fn sns_event_with(topic_arn: &str, message: &str) -> Value {
    serde_json::json!({"Records": [{
        "EventSource": "aws:sns",
        "EventVersion": "1.0",
        "EventSubscriptionArn": format!("{topic_arn}:5e0c9a61"),
        "Sns": {
            "Type": "Notification",
            "MessageId": "3b1f6c2e-8d4a-5f09-b7e1-9a2c4d6e8f10",
            "TopicArn": topic_arn,
            "Subject": "s",
            "Message": message,
            "Timestamp": "2022-09-25T13:58:42.190Z",
            "SignatureVersion": "1",
            "Signature": "c2lnbmF0dXJl",
            "SigningCertURL": "https://example/cert.pem",
            "UnsubscribeURL": "https://example/?Action=Unsubscribe",
            "MessageAttributes": {},
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
            without(sns_event_with("t", "{}"), "Message"),
            "Sns: missing field `Message`",
        ),
        (sns_event_with("t", "not json"), "not a JSON object"),
        (sns_event_with("t", "[1]"), "Sns.Message"),
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

/// `event` (one SNS record) without the field `field` of its `Sns`.
fn without(mut event: Value, field: &str) -> Value {
    event["Records"][0]["Sns"]
        .as_object_mut()
        .unwrap()
        .remove(field);
    event
}

#[test]
fn sns_records_are_read_as_lambda_delivers_them_and_a_bad_envelope_is_named() {
    // What SNS always sends is required, named by its path when missing or of another type.
    let err = parse_event(&without(sns_event(&lifecycle_message()), "Signature"))
        .remove(0)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("record 0: not an SNS record")
            && err.contains("Sns: missing field `Signature`"),
        "{err}"
    );
    let mut event = sns_event(&lifecycle_message());
    event["Records"][0]["Sns"]["TopicArn"] = Value::from(5);
    let err = parse_event(&event).remove(0).unwrap_err().to_string();
    assert!(
        err.contains("Sns.TopicArn: invalid type: integer `5`"),
        "{err}"
    );
    // Both spellings of the URL fields: Lambda's `...Url` and SNS over HTTP's `...URL`.
    let mut lambda_spelling = sns_event(&lifecycle_message());
    let sns = lambda_spelling["Records"][0]["Sns"]
        .as_object_mut()
        .unwrap();
    for (http, lambda) in [
        ("SigningCertURL", "SigningCertUrl"),
        ("UnsubscribeURL", "UnsubscribeUrl"),
    ] {
        let value = sns.remove(http).unwrap();
        sns.insert(lambda.to_owned(), value);
    }
    assert_eq!(
        only(&lambda_spelling).lifecycle(),
        only(&sns_event(&lifecycle_message())).lifecycle()
    );
}

/// One order of faults for both sources: who announced the action and when (SNS: `Time`,
/// `AccountId`, `RequestId` in the message; EventBridge: `account`, `id`, `time` in the
/// envelope), then the action, then `NotificationMetadata`, then the route. (Before the shared
/// tail, SNS checked `Origin`/`Destination` types before the action and `AccountId` after it,
/// while EventBridge checked its envelope fields after the action.)
#[test]
fn a_record_with_two_faults_reports_the_same_first_fault_from_either_source() {
    let mut message = lifecycle_message();
    message["AccountId"] = Value::from(42);
    message.as_object_mut().unwrap().remove("EC2InstanceId");
    let err = parse_event(&sns_event(&message))
        .remove(0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("AccountId"), "{err}");

    let mut event = eventbridge_event();
    event.as_object_mut().unwrap().remove("time");
    event["detail"]
        .as_object_mut()
        .unwrap()
        .remove("EC2InstanceId");
    let err = parse_event(&event).remove(0).unwrap_err().to_string();
    assert!(err.contains("field time is missing"), "{err}");

    let mut message = lifecycle_message();
    message["Destination"] = Value::from(3);
    message
        .as_object_mut()
        .unwrap()
        .remove("LifecycleActionToken");
    let err = parse_event(&sns_event(&message))
        .remove(0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("LifecycleActionToken"), "{err}");
    let mut event = eventbridge_event();
    event["detail"]["Destination"] = Value::from(3);
    event["detail"]
        .as_object_mut()
        .unwrap()
        .remove("LifecycleActionToken");
    let err = parse_event(&event).remove(0).unwrap_err().to_string();
    assert!(err.contains("LifecycleActionToken"), "{err}");
}

#[test]
fn eventbridge_envelopes_are_checked_and_a_bad_one_is_named() {
    // A lifecycle action only Auto Scaling can announce.
    let mut forged = eventbridge_event();
    forged["source"] = "my.app".into();
    let err = parse_event(&forged).remove(0).unwrap_err().to_string();
    assert!(
        err.contains("EventBridge event") && err.contains("source=\"my.app\""),
        "{err}"
    );
    let mut late = eventbridge_event();
    late["time"] = "yesterday".into();
    let err = parse_event(&late).remove(0).unwrap_err().to_string();
    assert!(
        err.starts_with("EventBridge event: not an EventBridge event") && err.contains("time:"),
        "{err}"
    );
    let mut anonymous = eventbridge_event();
    anonymous["account"] = "".into();
    let err = parse_event(&anonymous).remove(0).unwrap_err().to_string();
    assert!(err.contains("account=\"\""), "{err}");
    let mut flat = eventbridge_event();
    flat["detail"] = "x".into();
    let err = parse_event(&flat).remove(0).unwrap_err().to_string();
    assert!(
        err.contains("field detail=") && err.contains("a JSON object of lifecycle fields"),
        "{err}"
    );
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
    let republished: Value = serde_json::from_str(&delivery.message_for_continuation(3)).unwrap();
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
            event["detail-type"] = "EC2 Instance-terminate Lifecycle Action".into();
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
        message["LifecycleTransition"] = format!("autoscaling:EC2_INSTANCE_{transition}").into();
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

/// The sweep's message for a terminating action found waiting: read back as the same action
/// named by its instance (no token), announced when it was found.
#[test]
fn a_found_waiting_action_reads_back_without_a_token() {
    let action = crate::aws::LifecycleActionRef {
        auto_scaling_group_name: "asg".into(),
        lifecycle_hook_name: "Terminate-LC-Hook".into(),
        instance_id: "i-07e9ea9eb19a67337".into(),
        token: "ignored".into(),
    };
    let found_at: Timestamp = "2026-12-07T09:00:00Z".parse().unwrap();
    let message = found_waiting_message(&action, "111111111111", found_at, false);
    let body: Value = serde_json::from_str(&message).unwrap();
    assert!(body.get("LifecycleActionToken").is_none(), "{body}");
    assert_eq!(body[FOUND_WAITING_FIELD], true, "{body}");
    let delivery = only(&sns_event(&body));
    let LifecycleMessage::Lifecycle(read) = delivery.message else {
        panic!("{:?}", delivery.message);
    };
    assert!(read.action.by_instance_only());
    assert_eq!(read.action.instance_id, action.instance_id);
    assert_eq!(read.transition, LifecycleTransition::Terminating);
    assert_eq!(read.time, found_at);
    assert_eq!(read.account_id, "111111111111");
    assert_eq!(read.route.destination, InstancePlace::Ec2);
    let pooled = found_waiting_message(&action, "111111111111", found_at, true);
    let pooled: Value = serde_json::from_str(&pooled).unwrap();
    let LifecycleMessage::Lifecycle(read) = only(&sns_event(&pooled)).message else {
        panic!("{pooled}");
    };
    assert!(read.route.is_into_warm_pool(), "{pooled}");
}

/// Without the sweep's mark a missing token is an error, as before; with it a token, a
/// launching transition or a value other than `true` is.
#[test]
fn a_message_without_a_token_is_refused_unless_the_sweep_found_it_waiting() {
    let refused = |message: Value, expected: &str| {
        let err = parse_event(&sns_event(&message))
            .remove(0)
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{message}: {err}");
    };
    let mut no_token = lifecycle_message();
    no_token
        .as_object_mut()
        .unwrap()
        .remove("LifecycleActionToken");
    refused(no_token.clone(), "LifecycleActionToken");
    let mut with_token = lifecycle_message();
    with_token[FOUND_WAITING_FIELD] = Value::Bool(true);
    refused(with_token, "LifecycleActionToken");
    let mut launching = no_token.clone();
    launching[FOUND_WAITING_FIELD] = Value::Bool(true);
    launching["LifecycleTransition"] = Value::from("autoscaling:EC2_INSTANCE_LAUNCHING");
    launching["Origin"] = Value::from("EC2");
    launching["Destination"] = Value::from("AutoScalingGroup");
    refused(launching, FOUND_WAITING_FIELD);
    let mut not_true = no_token;
    not_true[FOUND_WAITING_FIELD] = Value::from("yes");
    refused(not_true, FOUND_WAITING_FIELD);
}
