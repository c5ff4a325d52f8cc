//! The lifecycle notification parser (`node_manager::lifecycle::notification::parse_event`)
//! on arbitrary bytes: as a whole Lambda event, and as the `Message` of an SNS record (the
//! part Auto Scaling writes). It must never panic, and every record must come back either
//! parsed or as an error that says which record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_manager::lifecycle::notification::parse_event;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = serde_json::from_slice::<Value>(data) {
        let _ = parse_event(&event);
    }
    let message = String::from_utf8_lossy(data);
    let event = json!({"Records": [{
        "EventSource": "aws:sns",
        "EventVersion": "1.0",
        "Sns": {
            "Type": "Notification",
            "TopicArn": "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic",
            "Subject": "Auto Scaling: Lifecycle action",
            "Message": message,
        },
    }]});
    let results = parse_event(&event);
    assert_eq!(results.len(), 1, "one SNS record gives one result");
    if let Some(Ok(delivery)) = results.first() {
        // A parsed delivery republishes as a message that parses again.
        let again = delivery.message_for_continuation(1);
        let event = json!({"Records": [{"EventSource": "aws:sns", "Sns": {
            "TopicArn": "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic",
            "Message": again}}]});
        let reparsed = parse_event(&event);
        assert!(
            matches!(reparsed.first(), Some(Ok(_))),
            "a hand-over message must parse: {reparsed:?}"
        );
    }
});
