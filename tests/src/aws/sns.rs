//! Fake SNS: topics, `Publish`, and subscriptions that receive the event Lambda would get.
//!
//! A subscription is what the SAM template wires: a topic → Lambda subscription, optionally
//! with a filter policy on the message body. The fake hands each subscription the Lambda SNS
//! event (`{"Records":[{"EventSource":"aws:sns",...,"Sns":{...}}]}`), over a channel or to a
//! callback, so a test or the sandbox can invoke a function with it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::protocol::{self, ApiError, QueryParams, Reply, element};
use super::{FakeAwsError, Shared, lock};

/// Who put a message on a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishSource {
    /// An SNS `Publish` call.
    Api,
    /// A lifecycle (or test) notification of the fake Auto Scaling.
    AutoScaling,
}

/// One message a topic received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedMessage {
    pub topic_arn: String,
    pub message_id: String,
    pub subject: Option<String>,
    pub message: String,
    /// Name → (data type, string value).
    pub attributes: BTreeMap<String, (String, String)>,
    pub source: PublishSource,
    /// Subscriptions the message was delivered to (after filtering).
    pub delivered_to: Vec<String>,
}

/// An SNS subscription filter policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionFilter {
    /// `FilterPolicyScope: MessageBody`, `{key: [values...]}`: the message must be a JSON
    /// object whose top-level `key` is a string among `values`.
    MessageBody { key: String, values: Vec<String> },
    /// `FilterPolicyScope: MessageAttributes`, `{name: [values...]}`.
    MessageAttribute { name: String, values: Vec<String> },
}

impl SubscriptionFilter {
    /// The filter the SAM template puts on each function's subscription:
    /// `{"LifecycleTransition": [transition]}` on the message body.
    pub fn lifecycle_transition(transitions: &[&str]) -> Self {
        Self::MessageBody {
            key: "LifecycleTransition".to_owned(),
            values: transitions.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    fn accepts(&self, message: &str, attributes: &BTreeMap<String, (String, String)>) -> bool {
        match self {
            Self::MessageBody { key, values } => serde_json::from_str::<Value>(message)
                .ok()
                .and_then(|body| body.get(key).and_then(Value::as_str).map(str::to_owned))
                .is_some_and(|value| values.contains(&value)),
            Self::MessageAttribute { name, values } => attributes
                .get(name)
                .is_some_and(|(_, value)| values.contains(value)),
        }
    }
}

type Callback = Arc<dyn Fn(Value) + Send + Sync>;

#[derive(Clone)]
enum Sink {
    Channel(mpsc::UnboundedSender<Value>),
    Callback(Callback),
}

struct Subscription {
    arn: String,
    filter: Option<SubscriptionFilter>,
    sink: Sink,
}

#[derive(Default)]
pub(crate) struct SnsState {
    topics: BTreeMap<String, Vec<Subscription>>,
    messages: Vec<PublishedMessage>,
}

/// A subscription whose events arrive on a channel.
#[derive(Debug)]
pub struct SnsSubscription {
    pub arn: String,
    receiver: mpsc::UnboundedReceiver<Value>,
}

impl SnsSubscription {
    /// The next Lambda SNS event, `None` after `timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Option<Value> {
        tokio::time::timeout(timeout, self.receiver.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next event if one is waiting.
    pub fn try_next(&mut self) -> Option<Value> {
        self.receiver.try_recv().ok()
    }
}

/// Handle on the fake SNS.
#[derive(Clone)]
pub struct FakeSns {
    shared: Arc<Shared>,
}

impl FakeSns {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// `arn:<partition>:sns:<region>:<account>:<name>`.
    pub fn topic_arn(&self, name: &str) -> String {
        let account = &self.shared.account;
        format!(
            "arn:{}:sns:{}:{}:{name}",
            account.partition, account.region, account.account_id
        )
    }

    /// Creates the topic (idempotent, like SNS) and returns its ARN.
    pub fn create_topic(&self, name: &str) -> String {
        let arn = self.topic_arn(name);
        lock(&self.shared.sns)
            .topics
            .entry(arn.clone())
            .or_default();
        arn
    }

    fn add(
        &self,
        topic_arn: &str,
        filter: Option<SubscriptionFilter>,
        sink: Sink,
    ) -> Result<String, FakeAwsError> {
        let mut state = lock(&self.shared.sns);
        let subscriptions = state
            .topics
            .get_mut(topic_arn)
            .ok_or_else(|| FakeAwsError::UnknownTopic(topic_arn.to_owned()))?;
        let arn = format!("{topic_arn}:{}", protocol::uuid_v4());
        subscriptions.push(Subscription {
            arn: arn.clone(),
            filter,
            sink,
        });
        Ok(arn)
    }

    /// Subscribes a channel receiving every message as a Lambda SNS event.
    pub fn subscribe(&self, topic_arn: &str) -> Result<SnsSubscription, FakeAwsError> {
        self.subscribe_filtered(topic_arn, None)
    }

    /// Subscribes a channel with a filter policy.
    pub fn subscribe_filtered(
        &self,
        topic_arn: &str,
        filter: Option<SubscriptionFilter>,
    ) -> Result<SnsSubscription, FakeAwsError> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let arn = self.add(topic_arn, filter, Sink::Channel(sender))?;
        Ok(SnsSubscription { arn, receiver })
    }

    /// Subscribes a callback, called (on the publishing thread) with each Lambda SNS event;
    /// returns the subscription ARN.
    pub fn subscribe_fn(
        &self,
        topic_arn: &str,
        filter: Option<SubscriptionFilter>,
        callback: impl Fn(Value) + Send + Sync + 'static,
    ) -> Result<String, FakeAwsError> {
        self.add(topic_arn, filter, Sink::Callback(Arc::new(callback)))
    }

    pub fn unsubscribe(&self, subscription_arn: &str) {
        for subscriptions in lock(&self.shared.sns).topics.values_mut() {
            subscriptions.retain(|s| s.arn != subscription_arn);
        }
    }

    /// Every message any topic received, oldest first.
    pub fn published(&self) -> Vec<PublishedMessage> {
        lock(&self.shared.sns).messages.clone()
    }
}

/// The event Lambda receives for one message on one subscription.
fn lambda_event(
    subscription_arn: &str,
    message: &PublishedMessage,
    timestamp: &str,
    region: &str,
) -> Value {
    let attributes: serde_json::Map<String, Value> = message
        .attributes
        .iter()
        .map(|(name, (data_type, value))| {
            (name.clone(), json!({ "Type": data_type, "Value": value }))
        })
        .collect();
    json!({
        "Records": [{
            "EventSource": "aws:sns",
            "EventVersion": "1.0",
            "EventSubscriptionArn": subscription_arn,
            "Sns": {
                "Type": "Notification",
                "MessageId": message.message_id,
                "TopicArn": message.topic_arn,
                "Subject": message.subject,
                "Message": message.message,
                "Timestamp": timestamp,
                "SignatureVersion": "1",
                "Signature": "RkFLRS1TSUdOQVRVUkU=",
                "SigningCertUrl": format!("https://sns.{region}.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem"),
                "UnsubscribeUrl": format!("https://sns.{region}.amazonaws.com/?Action=Unsubscribe&SubscriptionArn={subscription_arn}"),
                "MessageAttributes": attributes,
            }
        }]
    })
}

/// Puts a message on a topic: records it and hands the Lambda event to every subscription
/// whose filter accepts it. Returns the message id.
pub(crate) fn deliver(
    shared: &Shared,
    topic_arn: &str,
    subject: Option<&str>,
    message: &str,
    attributes: BTreeMap<String, (String, String)>,
    source: PublishSource,
) -> Result<String, FakeAwsError> {
    let timestamp = protocol::timestamp_millis(jiff::Timestamp::now());
    let mut published = PublishedMessage {
        topic_arn: topic_arn.to_owned(),
        message_id: protocol::uuid_v4(),
        subject: subject.map(str::to_owned),
        message: message.to_owned(),
        attributes,
        source,
        delivered_to: Vec::new(),
    };
    let deliveries: Vec<(Sink, Value)> = {
        let mut state = lock(&shared.sns);
        let subscriptions = state
            .topics
            .get(topic_arn)
            .ok_or_else(|| FakeAwsError::UnknownTopic(topic_arn.to_owned()))?;
        let accepted: Vec<&Subscription> = subscriptions
            .iter()
            .filter(|s| {
                s.filter
                    .as_ref()
                    .is_none_or(|f| f.accepts(message, &published.attributes))
            })
            .collect();
        published.delivered_to = accepted.iter().map(|s| s.arn.clone()).collect();
        let deliveries: Vec<(Sink, Value)> = accepted
            .iter()
            .map(|s| {
                (
                    s.sink.clone(),
                    lambda_event(&s.arn, &published, &timestamp, &shared.account.region),
                )
            })
            .collect();
        state.messages.push(published.clone());
        deliveries
    };
    for (sink, event) in deliveries {
        match sink {
            Sink::Channel(sender) => {
                // A dropped receiver is an unsubscribed test: nothing to deliver to.
                let _ = sender.send(event);
            }
            Sink::Callback(callback) => callback(event),
        }
    }
    Ok(published.message_id)
}

pub(crate) fn dispatch(
    shared: &Shared,
    operation: &str,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    match operation {
        "Publish" => publish(shared, params),
        other => Err(ApiError::new(
            400,
            "InvalidAction",
            format!("The action {other} is not valid for this web service."),
        )),
    }
}

/// SNS's maximum message size.
const MAX_MESSAGE_BYTES: usize = 256 * 1024;

fn publish(shared: &Shared, params: &QueryParams) -> Result<Reply, ApiError> {
    let Some(topic_arn) = params.get("TopicArn").or_else(|| params.get("TargetArn")) else {
        return Err(ApiError::new(
            400,
            "InvalidParameter",
            "Invalid parameter: TopicArn or TargetArn Reason: no value for required parameter",
        ));
    };
    let message = params.get("Message").map(String::as_str).unwrap_or("");
    if message.is_empty() {
        return Err(ApiError::new(
            400,
            "InvalidParameter",
            "Invalid parameter: Empty message",
        ));
    }
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(ApiError::new(
            400,
            "InvalidParameter",
            "Invalid parameter: Message too long",
        ));
    }
    let subject = params.get("Subject").map(String::as_str);
    if subject.is_some_and(|s| s.is_empty() || s.len() > 100) {
        return Err(ApiError::new(
            400,
            "InvalidParameter",
            "Invalid parameter: Subject",
        ));
    }
    let mut attributes = BTreeMap::new();
    for index in 1.. {
        let prefix = format!("MessageAttributes.entry.{index}");
        let Some(name) = params.get(&format!("{prefix}.Name")) else {
            break;
        };
        let data_type = params
            .get(&format!("{prefix}.Value.DataType"))
            .cloned()
            .unwrap_or_else(|| "String".to_owned());
        let value = params
            .get(&format!("{prefix}.Value.StringValue"))
            .cloned()
            .unwrap_or_default();
        attributes.insert(name.clone(), (data_type, value));
    }
    let message_id = deliver(
        shared,
        topic_arn,
        subject,
        message,
        attributes,
        PublishSource::Api,
    )
    .map_err(|_| ApiError::new(404, "NotFound", "Topic does not exist"))?;
    Ok(Reply::Xml(element("MessageId", &message_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_filters_match_the_lifecycle_transition() {
        let filter =
            SubscriptionFilter::lifecycle_transition(&["autoscaling:EC2_INSTANCE_TERMINATING"]);
        let none = BTreeMap::new();
        assert!(filter.accepts(
            r#"{"LifecycleTransition":"autoscaling:EC2_INSTANCE_TERMINATING"}"#,
            &none
        ));
        assert!(!filter.accepts(
            r#"{"LifecycleTransition":"autoscaling:EC2_INSTANCE_LAUNCHING"}"#,
            &none
        ));
        assert!(!filter.accepts(r#"{"Event":"autoscaling:TEST_NOTIFICATION"}"#, &none));
        assert!(!filter.accepts("not json", &none));
    }
}
