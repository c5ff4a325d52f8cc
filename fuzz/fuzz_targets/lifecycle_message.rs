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
    let results = parse_event(&sns_event(&message));
    assert_eq!(results.len(), 1, "one SNS record gives one result");
    if let Some(Ok(delivery)) = results.first() {
        // A parsed delivery republishes as a message that parses again.
        let again = delivery.message_for_continuation(1);
        let reparsed = parse_event(&sns_event(&again));
        assert!(
            matches!(reparsed.first(), Some(Ok(_))),
            "a hand-over message must parse: {reparsed:?}"
        );
    }
});

/// A Lambda SNS event of one record carrying `message`, with every field SNS sends.
fn sns_event(message: &str) -> Value {
    json!({"Records": [{
        "EventSource": "aws:sns",
        "EventVersion": "1.0",
        "EventSubscriptionArn": "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic:5e0c9a61",
        "Sns": {
            "Type": "Notification",
            "MessageId": "3b1f6c2e-8d4a-5f09-b7e1-9a2c4d6e8f10",
            "TopicArn": "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic",
            "Subject": "Auto Scaling: Lifecycle action",
            "Message": message,
            "Timestamp": "2022-09-25T13:58:42.190Z",
            "SignatureVersion": "1",
            "Signature": "c2lnbmF0dXJl",
            "SigningCertUrl": "https://sns.eu-west-1.amazonaws.com/cert.pem",
            "UnsubscribeUrl": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe",
            "MessageAttributes": {},
        },
    }]})
}
