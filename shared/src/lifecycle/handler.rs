//! The skeleton both lifecycle hooks share: what they are built from ([`HookContext`]), the
//! invocation a record is handled in ([`Invocation`]), and the loop that hands each record of
//! a Lambda event to the hook ([`handle_records`]).
//!
//! What a hook does with one notification (drain, wait for Ready) and how it reports the
//! records are its own: `crate::drain::Drainer`, `crate::launch::Launcher`.

use std::future::Future;

use serde_json::Value;

use crate::aws::{AutoScaling, AwsError, Instances, Notifications};
use crate::cluster::connection::KubeConnection;
use crate::lifecycle::budget::InvocationBudget;
use crate::lifecycle::hand_over::{ContinuationError, HandOver, hand_over};
use crate::lifecycle::heartbeat::HeartbeatKeeper;
use crate::lifecycle::hook_timings::HookTimings;
use crate::lifecycle::notification::{
    Delivery, LifecycleMessage, LifecycleNotification, NotificationError, parse_event,
};
use crate::lifecycle::scope::{GroupScope, ScopeDecision, account_id_from_function_arn};
use crate::lifecycle::settings::{DrainSettings, LaunchSettings, LifecycleSettings};

/// A hook's settings: the part both hooks share, and its own.
pub trait HookSettings {
    fn lifecycle(&self) -> &LifecycleSettings;
}

impl HookSettings for DrainSettings {
    fn lifecycle(&self) -> &LifecycleSettings {
        &self.lifecycle
    }
}

impl HookSettings for LaunchSettings {
    fn lifecycle(&self) -> &LifecycleSettings {
        &self.lifecycle
    }
}

/// The four clients a hook works with, as one type parameter: the hooks' impls name `C`
/// instead of repeating four parameters and their bounds.
pub trait HookClients {
    type Kube: KubeConnection;
    type AutoScaling: AutoScaling;
    type Instances: Instances;
    type Notifications: Notifications;
}

/// Any four clients that fit ([`HookContext::new`] infers them from its arguments). Only a
/// type: no value of it is made.
pub struct Clients<K, A, I, N>(ClientTypes<K, A, I, N>);

/// `fn() -> ...`: a marker that is `Send` and `Sync` whatever the clients are.
type ClientTypes<K, A, I, N> = std::marker::PhantomData<fn() -> (K, A, I, N)>;

impl<K, A, I, N> HookClients for Clients<K, A, I, N>
where
    K: KubeConnection,
    A: AutoScaling,
    I: Instances,
    N: Notifications,
{
    type Kube = K;
    type AutoScaling = A;
    type Instances = I;
    type Notifications = N;
}

/// Everything an invocation of a hook needs, built once per execution environment (clients,
/// caches, settings) and borrowed by every invocation.
pub struct HookContext<C: HookClients, S> {
    /// The way to the cluster's API; asked for a client only when a record needs one.
    pub kube: C::Kube,
    pub autoscaling: C::AutoScaling,
    pub instances: C::Instances,
    pub notifications: C::Notifications,
    pub settings: S,
    pub scope: GroupScope,
    pub hooks: HookTimings,
    /// Where nodes not named after their instance are (instance notices' lookups).
    pub nodes: super::node::NodeIndex,
}

impl<C: HookClients, S: HookSettings> HookContext<C, S> {
    pub fn new(
        kube: C::Kube,
        autoscaling: C::AutoScaling,
        instances: C::Instances,
        notifications: C::Notifications,
        settings: S,
    ) -> Self {
        let scope = GroupScope::from_settings(settings.lifecycle());
        Self {
            kube,
            autoscaling,
            instances,
            notifications,
            settings,
            scope,
            hooks: HookTimings::new(),
            nodes: super::node::NodeIndex::default(),
        }
    }
}

impl<C: HookClients, S: HookSettings> HookContext<C, S> {
    /// Whether the notification's group is this cluster's (and the function's account's).
    pub async fn decide_scope(
        &self,
        notification: &LifecycleNotification,
        invocation: &Invocation,
    ) -> Result<ScopeDecision, AwsError> {
        self.scope
            .decide_for_account(
                &self.autoscaling,
                invocation.function_account.as_deref(),
                &notification.account_id,
                &notification.action.auto_scaling_group_name,
                &notification.action.memo_key(),
            )
            .await
    }

    /// The heartbeats of the notification's action, paced by its hook's heartbeat timeout.
    pub async fn heartbeat_keeper(&self, notification: &LifecycleNotification) -> HeartbeatKeeper {
        let action = &notification.action;
        let hook = self
            .hooks
            .get_or_default(
                &self.autoscaling,
                &action.auto_scaling_group_name,
                &action.lifecycle_hook_name,
                &action.memo_key(),
            )
            .await;
        HeartbeatKeeper::new(action.clone(), &hook, notification.time, notification.time)
    }

    /// Hands `delivery` to a fresh invocation (see [`hand_over`]).
    pub async fn hand_over(
        &self,
        keeper: &mut HeartbeatKeeper,
        delivery: &Delivery,
    ) -> Result<HandOver, ContinuationError> {
        hand_over(
            &self.autoscaling,
            &self.notifications,
            keeper,
            delivery,
            self.settings.lifecycle().continuation_topic_arn.as_deref(),
        )
        .await
    }
}

/// The invocation a record is handled in: who is working (the drain's lease holder) and
/// until when. Built from the Lambda context; tests build it directly to simulate short
/// invocations.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The Lambda request id: the lease holder's name. Lambda's own retries of a failed
    /// invocation keep it, so a retry resumes its own lease at once.
    pub request_id: String,
    /// This function's account (from its ARN); `None` skips the account check.
    pub function_account: Option<String>,
    pub budget: InvocationBudget,
}

impl Invocation {
    pub fn from_context(
        lambda: &lambda_runtime::Context,
        hand_over_margin: std::time::Duration,
    ) -> Self {
        Self {
            request_id: lambda.request_id.clone(),
            function_account: account_id_from_function_arn(&lambda.invoked_function_arn),
            budget: InvocationBudget::from_context(lambda, hand_over_margin),
        }
    }
}

/// A lifecycle hook: what it does with one delivery, and how it reports an event's records.
/// The invocation around them is the same for both hooks: [`HookHandler::handle`].
pub trait HookHandler {
    /// What became of one record.
    type Outcome;
    /// Why a record (or the invocation) failed.
    type Error: From<NotificationError>;
    /// The Lambda response.
    type Report;

    /// `HAND_OVER_MARGIN_SECONDS`: how long before the invocation's deadline work stops.
    fn hand_over_margin(&self) -> std::time::Duration;

    /// Handles one record.
    fn handle_delivery(
        &self,
        delivery: &Delivery,
        invocation: &Invocation,
    ) -> impl Future<Output = Result<Self::Outcome, Self::Error>>;

    /// The response for an event's handled records, or the invocation's failure.
    fn report(
        &self,
        records: Vec<HandledRecord<Self::Outcome, Self::Error>>,
        invocation: &Invocation,
    ) -> Result<Self::Report, Self::Error>;

    /// Handles every record of one Lambda event. Records that fail are reported after the
    /// others were handled, and make the invocation fail.
    fn handle(
        &self,
        event: Value,
        lambda: &lambda_runtime::Context,
    ) -> impl Future<Output = Result<Self::Report, Self::Error>> {
        let invocation = Invocation::from_context(lambda, self.hand_over_margin());
        async move { self.handle_invocation(event, &invocation).await }
    }

    /// [`Self::handle`] for an invocation described directly (tests, local runs).
    fn handle_invocation(
        &self,
        event: Value,
        invocation: &Invocation,
    ) -> impl Future<Output = Result<Self::Report, Self::Error>> {
        async move {
            let records = handle_records(&event, |delivery| async move {
                self.handle_delivery(&delivery, invocation).await
            })
            .await;
            self.report(records, invocation)
        }
    }
}

/// One record of an event, handled: where it was, what it was about, and how it went.
#[derive(Debug)]
pub struct HandledRecord<O, E> {
    /// Where the record was in the event: `record 0`, `EventBridge event`; `event` when the
    /// event itself was not understood.
    pub record: String,
    pub instance_id: Option<String>,
    pub auto_scaling_group: Option<String>,
    pub result: Result<O, E>,
}

/// Hands every record of `event` to `handle`, one after the other; a record that cannot be
/// parsed fails alone (logged, `E::from` its parse error) and the others are still handled.
pub(crate) async fn handle_records<O, E, Fut>(
    event: &Value,
    mut handle: impl FnMut(Delivery) -> Fut,
) -> Vec<HandledRecord<O, E>>
where
    Fut: Future<Output = Result<O, E>>,
    E: From<NotificationError>,
{
    let mut records = Vec::new();
    for parsed in parse_event(event) {
        let record = match parsed {
            Ok(delivery) => {
                let (instance_id, auto_scaling_group) = subject_of(&delivery.message);
                HandledRecord {
                    record: delivery.location.to_string(),
                    instance_id,
                    auto_scaling_group,
                    result: handle(delivery).await,
                }
            }
            Err(error) => {
                tracing::error!(%error, "malformed notification: nothing done for this record");
                HandledRecord {
                    record: error
                        .location()
                        .map(|l| l.to_string())
                        .unwrap_or_else(|| "event".to_owned()),
                    instance_id: None,
                    auto_scaling_group: None,
                    result: Err(E::from(error)),
                }
            }
        };
        records.push(record);
    }
    records
}

/// The instance and the group a message is about, as far as it says.
fn subject_of(message: &LifecycleMessage) -> (Option<String>, Option<String>) {
    match message {
        LifecycleMessage::Test(test) => (None, test.group_name.clone()),
        LifecycleMessage::UnknownTransition {
            group_name,
            instance_id,
            ..
        } => (instance_id.clone(), group_name.clone()),
        LifecycleMessage::Lifecycle(n) => (
            Some(n.action.instance_id.clone()),
            Some(n.action.auto_scaling_group_name.clone()),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn fixture(name: &str) -> Value {
        let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[derive(Debug, PartialEq)]
    enum Failed {
        Malformed(String),
        Handler,
    }

    impl From<NotificationError> for Failed {
        fn from(error: NotificationError) -> Self {
            Self::Malformed(error.to_string())
        }
    }

    /// An event of a launch record, a record that is not a notification, a test notification.
    fn mixed_event() -> Value {
        let launch = fixture("sns-lifecycle-launching.json")["Records"][0].clone();
        let test = fixture("sns-test-notification.json")["Records"][0].clone();
        serde_json::json!({"Records": [launch, {"EventSource": "aws:sns", "Sns": {}}, test]})
    }

    #[tokio::test]
    async fn every_record_is_handled_and_a_malformed_one_fails_alone() {
        let mut seen = Vec::new();
        let records: Vec<HandledRecord<String, Failed>> =
            handle_records(&mixed_event(), |delivery| {
                seen.push(delivery.location.to_string());
                async move {
                    match delivery.message {
                        LifecycleMessage::Test(_) => Err(Failed::Handler),
                        _ => Ok(delivery.location.to_string()),
                    }
                }
            })
            .await;
        assert_eq!(seen, ["record 0", "record 2"]);
        assert_eq!(records.len(), 3);

        assert_eq!(records[0].record, "record 0");
        assert_eq!(
            records[0].instance_id.as_deref(),
            Some("i-0a1b2c3d4e5f60718")
        );
        assert!(records[0].auto_scaling_group.is_some());
        assert_eq!(records[0].result, Ok("record 0".to_owned()));

        assert_eq!(records[1].record, "record 1");
        assert_eq!(records[1].instance_id, None);
        assert!(
            matches!(&records[1].result, Err(Failed::Malformed(message)) if !message.is_empty()),
            "{:?}",
            records[1].result
        );

        assert_eq!(records[2].record, "record 2");
        assert_eq!(records[2].instance_id, None);
        assert_eq!(records[2].result, Err(Failed::Handler));
    }

    #[test]
    fn the_invocation_is_named_after_the_request_and_the_function_account() {
        let mut lambda = lambda_runtime::Context::default();
        lambda.request_id = "req-1".to_owned();
        lambda.invoked_function_arn =
            "arn:aws:lambda:eu-west-1:111111111111:function:terminating-hook".to_owned();
        lambda.deadline = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
                + 60_000,
        )
        .unwrap();
        let invocation = Invocation::from_context(&lambda, std::time::Duration::from_secs(10));
        assert_eq!(invocation.request_id, "req-1");
        assert_eq!(invocation.function_account.as_deref(), Some("111111111111"));
        assert!(invocation.budget.remaining() <= std::time::Duration::from_secs(50));
        assert!(invocation.budget.remaining() > std::time::Duration::from_secs(40));
    }
}
