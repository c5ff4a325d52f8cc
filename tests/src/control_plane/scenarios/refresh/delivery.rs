//! How the stack routes events to the functions during a refresh: each hook's lifecycle
//! notifications (the SNS subscriptions' filter policies) and the refresh rule's EventBridge
//! events, each delivered as its subscription or rule invokes the function.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use node_manager::node_marks::refresh::REFRESH_LABEL;
use serde_json::Value;

use super::Run;
use super::group::REFRESH_FUNCTION;
use crate::aws::{EventSubscription, InstanceRefreshStatus, SnsSubscription, SubscriptionFilter};
use crate::control_plane::ControlPlaneError;
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::Target;
use crate::lambda_api::{InvocationOutcome, LambdaRuntimeApi};
use crate::sandbox::refresh_rule;

const INVOKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a delivery waits for the next event before looking whether to stop.
const QUIET: Duration = Duration::from_millis(300);

/// What the stack routes to the functions: each hook's lifecycle notifications (the SNS
/// subscriptions' filter policies) and the refresh rule's events.
pub(super) struct Subscriptions {
    terminating: SnsSubscription,
    launching: SnsSubscription,
    bus: EventSubscription,
}

impl Subscriptions {
    pub(super) fn new(w: &RealFunctionWorld) -> Result<Self, ControlPlaneError> {
        let sns = w.aws.sns();
        let subscribe = |t: &str| {
            let transition = format!("autoscaling:{t}");
            let filter = SubscriptionFilter::lifecycle_transition(&[&transition]);
            sns.subscribe_filtered(&w.topic, Some(filter))
                .map_err(|e| ControlPlaneError::setup("subscribing to the hooks' topic", e))
        };
        Ok(Self {
            terminating: subscribe("EC2_INSTANCE_TERMINATING")?,
            launching: subscribe("EC2_INSTANCE_LAUNCHING")?,
            bus: w.aws.eventbridge().subscribe(refresh_rule()),
        })
    }
}

/// One invocation; a failure is recorded with the function's output.
async fn invoke(runtime: &LambdaRuntimeApi, event: &Value, failures: &Mutex<Vec<String>>) {
    match runtime.invoke(event, INVOKE_TIMEOUT).await {
        Ok(InvocationOutcome::Response(_)) => {}
        other => failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!(
                "{} -> {other:?}\n--- function output ---\n{}",
                event.to_string().chars().take(300).collect::<String>(),
                runtime.output()
            )),
    }
}

/// Delivers the events `next` gives one after the other, as an SNS subscription or an
/// EventBridge rule invokes its function, until `stop` is set and none came for [`QUIET`].
async fn deliver(
    mut next: impl AsyncFnMut() -> Option<Value>,
    runtime: &LambdaRuntimeApi,
    stop: &AtomicBool,
    failures: &Mutex<Vec<String>>,
) {
    loop {
        match next().await {
            Some(event) => invoke(runtime, &event, failures).await,
            None if stop.load(Ordering::Relaxed) => return,
            None => {}
        }
    }
}

/// Delivers every notification and (with the function) every refresh event until the
/// refresh ended and the function undid its marks; returns how the refresh ended and the
/// invocations that failed.
pub(super) async fn deliver_until_the_end(
    w: &RealFunctionWorld,
    admin: &kube::Client,
    run: Run,
    mut subscriptions: Subscriptions,
    id: &str,
) -> (Option<InstanceRefreshStatus>, Vec<String>) {
    let (stop, failures) = (AtomicBool::new(false), Mutex::new(Vec::new()));
    let terminating = &w.function(Target::TerminatingHook).runtime;
    let launching = &w.function(Target::LaunchingHook).runtime;
    let deliveries = async {
        let refresh = async {
            if run.with_function {
                let bus = &mut subscriptions.bus;
                let next = async || bus.next_event(QUIET).await;
                deliver(next, w.named(REFRESH_FUNCTION), &stop, &failures).await;
            }
        };
        let (to_terminating, to_launching) =
            (&mut subscriptions.terminating, &mut subscriptions.launching);
        futures::join!(
            deliver(
                async || to_terminating.next_event(QUIET).await,
                terminating,
                &stop,
                &failures
            ),
            deliver(
                async || to_launching.next_event(QUIET).await,
                launching,
                &stop,
                &failures
            ),
            refresh,
        );
    };
    let ending = async {
        let status = w
            .aws
            .autoscaling()
            .wait_for_refresh_end(id, Duration::from_secs(150))
            .await;
        wait_for_marks_undone(admin, Duration::from_secs(15)).await;
        stop.store(true, Ordering::Relaxed);
        status
    };
    let ((), status) = futures::join!(deliveries, ending);
    (
        status,
        failures
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner),
    )
}

/// The end event is handled after Auto Scaling ends the refresh: waits until no node carries
/// the refresh's label.
async fn wait_for_marks_undone(admin: &kube::Client, timeout: Duration) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let labelled = nodes
            .list(&ListParams::default().labels(REFRESH_LABEL))
            .await
            .map(|l| l.items.len())
            .unwrap_or(1);
        if labelled == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
