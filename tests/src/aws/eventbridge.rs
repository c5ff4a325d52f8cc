//! Fake EventBridge: the default bus the fake services put their events on (instance
//! refresh events of Auto Scaling, ...), in EventBridge's envelope, and rules a test
//! subscribes to. The functions never call `PutEvents`, so there is no HTTP API: a test
//! injects events (a forged or malformed one) with [`FakeEventBridge::put`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Shared, lock};

/// The part of an EventBridge rule's event pattern the fake matches: `source` and
/// `detail-type`, each a list of accepted values (empty: any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventPattern {
    pub sources: Vec<String>,
    pub detail_types: Vec<String>,
}

impl EventPattern {
    fn accepts(&self, event: &Value) -> bool {
        let field_in = |name: &str, accepted: &[String]| {
            accepted.is_empty()
                || event
                    .get(name)
                    .and_then(Value::as_str)
                    .is_some_and(|value| accepted.iter().any(|a| a == value))
        };
        field_in("source", &self.sources) && field_in("detail-type", &self.detail_types)
    }
}

struct Rule {
    pattern: EventPattern,
    target: mpsc::UnboundedSender<Value>,
}

#[derive(Default)]
pub(crate) struct EventBridgeState {
    events: Vec<Value>,
    rules: Vec<Rule>,
}

/// The events matching a pattern, as a rule's target receives them.
#[derive(Debug)]
pub struct EventSubscription {
    receiver: mpsc::UnboundedReceiver<Value>,
}

impl EventSubscription {
    /// The next matching event, `None` after `timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Option<Value> {
        tokio::time::timeout(timeout, self.receiver.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next matching event if one is waiting.
    pub fn try_next(&mut self) -> Option<Value> {
        self.receiver.try_recv().ok()
    }
}

/// Handle on the fake EventBridge bus.
#[derive(Clone)]
pub struct FakeEventBridge {
    shared: Arc<Shared>,
}

impl FakeEventBridge {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Every event matching `pattern` from now on.
    pub fn subscribe(&self, pattern: EventPattern) -> EventSubscription {
        let (target, receiver) = mpsc::unbounded_channel();
        lock(&self.shared.eventbridge)
            .rules
            .push(Rule { pattern, target });
        EventSubscription { receiver }
    }

    /// Every event put on the bus so far, oldest first.
    pub fn events(&self) -> Vec<Value> {
        lock(&self.shared.eventbridge).events.clone()
    }

    /// Puts an event on the bus, in the envelope (id, time, account, region) the fake
    /// services' events get, and returns it.
    pub fn put(
        &self,
        source: &str,
        detail_type: &str,
        resources: Vec<String>,
        detail: Value,
    ) -> Value {
        emit(&self.shared, source, detail_type, resources, detail)
    }
}

/// Wraps `detail` in EventBridge's envelope, records the event and hands it to every rule
/// whose pattern matches.
pub(crate) fn emit(
    shared: &Shared,
    source: &str,
    detail_type: &str,
    resources: Vec<String>,
    detail: Value,
) -> Value {
    // EventBridge stamps events to the second.
    let now = jiff::Timestamp::now();
    let time = jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    let event = json!({
        "version": "0",
        "id": super::uuid_v4(),
        "detail-type": detail_type,
        "source": source,
        "account": shared.account.account_id,
        "time": time.to_string(),
        "region": shared.account.region,
        "resources": resources,
        "detail": detail,
    });
    let mut state = lock(&shared.eventbridge);
    state.events.push(event.clone());
    // A dropped subscription is a test no longer listening: its rule goes.
    state
        .rules
        .retain(|rule| !rule.pattern.accepts(&event) || rule.target.send(event.clone()).is_ok());
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::FakeAccount;
    use crate::aws::FakeAws;

    #[tokio::test]
    async fn events_have_the_eventbridge_envelope_and_reach_matching_rules() {
        let aws = FakeAws::start(FakeAccount::reference())
            .await
            .expect("fake AWS starts");
        let bus = aws.eventbridge();
        let mut refreshes = bus.subscribe(EventPattern {
            sources: vec!["aws.autoscaling".to_owned()],
            detail_types: Vec::new(),
        });
        let mut everything = bus.subscribe(EventPattern::default());
        bus.put("custom.forged", "Anything", Vec::new(), json!({}));
        let put = bus.put(
            "aws.autoscaling",
            "EC2 Auto Scaling Instance Refresh Started",
            vec!["arn:aws:autoscaling:eu-west-1:1:autoScalingGroup:x".to_owned()],
            json!({"InstanceRefreshId": "r-1"}),
        );

        let received = refreshes.try_next().expect("the matching event arrives");
        assert_eq!(received, put);
        assert!(
            refreshes.try_next().is_none(),
            "the forged source is filtered out"
        );
        assert_eq!(
            everything.try_next().map(|e| e["source"].clone()),
            Some(json!("custom.forged"))
        );
        assert_eq!(received["version"], "0");
        assert_eq!(
            received["detail-type"],
            "EC2 Auto Scaling Instance Refresh Started"
        );
        assert_eq!(received["account"], aws.account().account_id.as_str());
        assert_eq!(received["region"], aws.account().region.as_str());
        assert_eq!(received["id"].as_str().map(str::len), Some(36));
        let time = received["time"].as_str().expect("time is a string");
        assert!(time.ends_with('Z') && !time.contains('.'), "{time}");
        assert!(time.parse::<jiff::Timestamp>().is_ok(), "{time}");
        assert_eq!(bus.events().len(), 2);
    }
}
