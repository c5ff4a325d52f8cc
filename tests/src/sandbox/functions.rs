//! The function processes of a sandbox: started from the built binaries through the local
//! Lambda Runtime API, fed every SNS delivery of the lifecycle topic and the EventBridge
//! events the stack's rules route, and invoked with a record on the timeline of what went in
//! and what came out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::SandboxError;
use super::timeline::{Source, Timeline};
use super::world::{FUNCTIONS, Sandbox, setup};
use crate::account::FakeCredentials;
use crate::aws::{EventPattern, SnsSubscription, SubscriptionFilter};
use crate::binaries;
use crate::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};

const LAUNCHING: &str = "autoscaling:EC2_INSTANCE_LAUNCHING";
const TERMINATING: &str = "autoscaling:EC2_INSTANCE_TERMINATING";

/// `1.0` → `"1"`, `0.5` → `"0.5"`: settings read whole or fractional seconds.
fn seconds(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{}", value as u64)
    } else {
        format!("{value}")
    }
}

impl Sandbox {
    /// One process per function, with its own credentials and the scenario's settings.
    pub(super) async fn start_functions(
        &mut self,
        credentials: &BTreeMap<&'static str, FakeCredentials>,
    ) -> Result<(), SandboxError> {
        for function in FUNCTIONS {
            let spec = self.function_spec_of(function, &credentials[function])?;
            self.specs.insert(function, spec.clone());
            let runtime = LambdaRuntimeApi::start_function(spec)
                .await
                .map_err(setup("Lambda Runtime API"))?;
            self.functions.insert(function, Arc::new(runtime));
        }
        Ok(())
    }

    /// How `function` is started: its binary, credentials and environment.
    fn function_spec_of(
        &self,
        function: &str,
        creds: &FakeCredentials,
    ) -> Result<FunctionSpec, SandboxError> {
        let timings = &self.scenario.timings;
        let binary = binaries::try_function_binary(function).map_err(setup("function binary"))?;
        let mut spec = FunctionSpec::new(function, binary)
            .region(&self.scenario.region)
            .log_format("Text")
            .envs(self.aws.environment(creds))
            .env("CLUSTER_NAME", &self.scenario.cluster)
            .env("CONTINUATION_TOPIC_ARN", &self.topic_arn())
            .env("SETTLE_SECONDS", &seconds(timings.settle_seconds))
            .env(
                "DRAIN_TIMEOUT_SECONDS",
                &seconds(timings.drain_timeout_seconds),
            )
            .env(
                "LAUNCH_TIMEOUT_SECONDS",
                &seconds(timings.launch_timeout_seconds),
            )
            .env("EVICTION_BACKOFF_MAX_SECONDS", "2")
            // nodegroup-auth: poll a DELETING node group every second, not every 15.
            .env("DELETE_POLL_SECONDS", "1")
            .env("RUST_LOG", "warn")
            .envs(self.scenario.function_env.clone());
        spec.account_id = self.scenario.account_id.clone();
        Ok(spec)
    }

    /// Each hook function is subscribed to the lifecycle topic with the filter the SAM
    /// template uses; every delivery (from Auto Scaling or a hand-over) becomes an invocation.
    pub(super) fn deliver_lifecycle_notifications(&mut self) -> Result<(), SandboxError> {
        for (function, transition) in [
            ("launching-hook", LAUNCHING),
            ("terminating-hook", TERMINATING),
        ] {
            let subscription = self
                .aws
                .sns()
                .subscribe_filtered(
                    &self.topic_arn(),
                    Some(SubscriptionFilter::lifecycle_transition(&[transition])),
                )
                .map_err(setup("SNS subscription"))?;
            let delivery = Delivery {
                function,
                runtime: self.functions[function].clone(),
                timeline: self.timeline.clone(),
                timeout: self.function_timeout(),
            };
            let task = if self.scenario.concurrent_invocations {
                let spec = self.specs[function].clone();
                tokio::spawn(delivery.concurrently(subscription, spec, self.scaled_out.clone()))
            } else {
                tokio::spawn(delivery.one_at_a_time(subscription))
            };
            self.background.push(task);
        }
        Ok(())
    }
}

impl Sandbox {
    /// Auto Scaling's instance refresh and instance events, as the stack's EventBridge rule
    /// routes them: each becomes an invocation of `instance-refresh`, one after the other.
    pub(super) fn deliver_refresh_events(&mut self) {
        let mut subscription = self.aws.eventbridge().subscribe(refresh_rule());
        let function = "instance-refresh";
        let runtime = self.functions[function].clone();
        let timeline = self.timeline.clone();
        let timeout = self.function_timeout();
        self.background.push(tokio::spawn(async move {
            loop {
                let Some(event) = subscription.next_event(Duration::from_secs(3600)).await else {
                    continue;
                };
                let summary = format!(
                    "EventBridge {} {}",
                    event["detail-type"].as_str().unwrap_or("?"),
                    event["detail"]["AutoScalingGroupName"]
                        .as_str()
                        .unwrap_or("?")
                );
                invoke(&timeline, function, &runtime, &event, timeout, &summary).await;
            }
        }));
    }
}

/// The refresh events the stack's rule forwards (`infra/template.yaml`).
const REFRESH_DETAIL_TYPES: [&str; 8] = [
    "Started",
    "Checkpoint Reached",
    "Succeeded",
    "Failed",
    "Cancelled",
    "Rollback Started",
    "Rollback Succeeded",
    "Rollback Failed",
];

/// The instance events the same rule forwards.
const INSTANCE_DETAIL_TYPES: [&str; 2] = [
    "EC2 Instance Launch Successful",
    "EC2 Instance Terminate Successful",
];

/// The stack's rule for `instance-refresh` (`infra/template.yaml`): Auto Scaling's refresh
/// events and the instance events that re-plan a refresh.
pub fn refresh_rule() -> EventPattern {
    EventPattern {
        sources: vec!["aws.autoscaling".to_owned()],
        detail_types: REFRESH_DETAIL_TYPES
            .iter()
            .map(|kind| format!("EC2 Auto Scaling Instance Refresh {kind}"))
            .chain(INSTANCE_DETAIL_TYPES.map(str::to_owned))
            .collect(),
    }
}

impl Sandbox {
    /// EC2's and AWS Health's instance events, as the stack's `InstanceNoticeEventsRule` and
    /// `ScheduledMaintenanceEventsRule` route them: each matching event becomes an
    /// invocation of `terminating-hook` at once, on a process of its own (started when none
    /// is idle), as Lambda runs concurrent invocations, so a warning and the lifecycle
    /// notification it comes with are handled together, not one after the other.
    pub(super) fn deliver_instance_notices(&mut self) {
        let mut subscription = self.aws.eventbridge().subscribe(EventPattern {
            sources: vec!["aws.ec2".to_owned(), "aws.health".to_owned()],
            detail_types: NOTICE_DETAIL_TYPES.map(str::to_owned).to_vec(),
        });
        let function = "terminating-hook";
        let pool = Arc::new(NoticePool {
            spec: self.specs[function].clone(),
            idle: Mutex::default(),
            scaled_out: self.scaled_out.clone(),
            timeline: self.timeline.clone(),
            timeout: self.function_timeout(),
            answers: self.notice_answers.clone(),
        });
        self.background.push(tokio::spawn(async move {
            loop {
                let Some(event) = subscription.next_event(Duration::from_secs(3600)).await else {
                    continue;
                };
                if !routed_by_notice_rules(&event) {
                    continue;
                }
                tokio::spawn(pool.clone().deliver(event));
            }
        }));
    }
}

/// The detail types of the stack's two instance-notice rules (`infra/template.yaml`).
const NOTICE_DETAIL_TYPES: [&str; 4] = [
    "EC2 Spot Instance Interruption Warning",
    "EC2 Instance Rebalance Recommendation",
    "EC2 Instance State-change Notification",
    "AWS Health Event",
];

/// The `detail` part of the rules' patterns (the fake bus matches source and detail type
/// only): EC2 actions and the two state changes that mean going down, and AWS Health's
/// scheduled changes of EC2.
fn routed_by_notice_rules(event: &Value) -> bool {
    let detail = &event["detail"];
    match event["source"].as_str() {
        Some("aws.ec2") => match (detail.get("instance-action"), detail.get("state")) {
            (Some(action), _) => {
                matches!(action.as_str(), Some("terminate" | "stop" | "hibernate"))
            }
            (None, Some(state)) => matches!(state.as_str(), Some("stopping" | "shutting-down")),
            (None, None) => true,
        },
        Some("aws.health") => {
            detail["service"] == "EC2" && detail["eventTypeCategory"] == "scheduledChange"
        }
        _ => false,
    }
}

/// One instance event delivered to `terminating-hook`, and how the invocation ended.
#[derive(Debug, Clone)]
pub(super) struct NoticeAnswer {
    pub(super) detail_type: String,
    /// The instances the event names (EC2's `instance-id`, AWS Health's affected entities).
    pub(super) instance_ids: Vec<String>,
    /// `None` when the function could not be invoked.
    pub(super) outcome: Option<InvocationOutcome>,
}

impl NoticeAnswer {
    /// The outcome the response gives `instance_id` (`Drained`, `JoinedLifecycleDrain`,
    /// ...), or the error type of a failed invocation.
    pub(super) fn outcome_for(&self, instance_id: &str) -> Option<String> {
        match self.outcome.as_ref()? {
            InvocationOutcome::Response(response) => response["instances"]
                .as_array()?
                .iter()
                // The function writes `instance_id` (its report's camelCase stops at the
                // top level); `instanceId` is what the documented shape says.
                .find(|i| i["instanceId"] == instance_id || i["instance_id"] == instance_id)
                .and_then(|i| i["outcome"].as_str())
                .map(str::to_owned),
            InvocationOutcome::Error { error_type, .. } => Some(error_type.clone()),
            InvocationOutcome::Timeout => Some("timed out".to_owned()),
        }
    }
}

fn instances_named(event: &Value) -> Vec<String> {
    let detail = &event["detail"];
    if let Some(id) = detail["instance-id"].as_str() {
        return vec![id.to_owned()];
    }
    detail["affectedEntities"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entity| entity["entityValue"].as_str().map(str::to_owned))
        .collect()
}

/// `terminating-hook`'s processes for instance events, apart from the one the lifecycle
/// notifications use.
struct NoticePool {
    spec: FunctionSpec,
    idle: Mutex<Vec<Arc<LambdaRuntimeApi>>>,
    scaled_out: Arc<Mutex<Vec<Arc<LambdaRuntimeApi>>>>,
    timeline: Timeline,
    timeout: Duration,
    answers: Arc<Mutex<Vec<NoticeAnswer>>>,
}

impl NoticePool {
    async fn deliver(self: Arc<Self>, event: Value) {
        let function = "terminating-hook";
        let free = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let process = match free {
            Some(process) => Some(process),
            None => {
                start_another(
                    function,
                    self.spec.clone(),
                    &self.scaled_out,
                    &self.timeline,
                )
                .await
            }
        };
        let instance_ids = instances_named(&event);
        let detail_type = event["detail-type"].as_str().unwrap_or("?").to_owned();
        let outcome = match &process {
            Some(process) => {
                let summary = format!("EventBridge {detail_type} {}", instance_ids.join(" "));
                invoke(
                    &self.timeline,
                    function,
                    process,
                    &event,
                    self.timeout,
                    &summary,
                )
                .await
            }
            None => None,
        };
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(NoticeAnswer {
                detail_type,
                instance_ids,
                outcome,
            });
        if let Some(process) = process {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(process);
        }
    }
}

/// The SNS deliveries to one hook function.
struct Delivery {
    function: &'static str,
    runtime: Arc<LambdaRuntimeApi>,
    timeline: Timeline,
    timeout: Duration,
}

impl Delivery {
    /// One process; each delivery waits for the invocation before it.
    async fn one_at_a_time(self, mut subscription: SnsSubscription) {
        loop {
            let Some(event) = subscription.next_event(Duration::from_secs(3600)).await else {
                continue;
            };
            invoke(
                &self.timeline,
                self.function,
                &self.runtime,
                &event,
                self.timeout,
                &summarize_sns(&event),
            )
            .await;
        }
    }

    /// As Lambda scales out: each delivery runs at once, on an idle process or a new one
    /// (kept in `scaled_out` to be stopped at the end).
    async fn concurrently(
        self,
        mut subscription: SnsSubscription,
        spec: FunctionSpec,
        scaled_out: Arc<Mutex<Vec<Arc<LambdaRuntimeApi>>>>,
    ) {
        let idle = Arc::new(Mutex::new(vec![self.runtime.clone()]));
        let this = Arc::new(self);
        loop {
            let Some(event) = subscription.next_event(Duration::from_secs(3600)).await else {
                continue;
            };
            let (this, idle, scaled_out, spec) =
                (this.clone(), idle.clone(), scaled_out.clone(), spec.clone());
            tokio::spawn(async move {
                let free = idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
                let process = match free {
                    Some(process) => process,
                    None => {
                        match start_another(this.function, spec, &scaled_out, &this.timeline).await
                        {
                            Some(process) => process,
                            None => return,
                        }
                    }
                };
                invoke(
                    &this.timeline,
                    this.function,
                    &process,
                    &event,
                    this.timeout,
                    &summarize_sns(&event),
                )
                .await;
                idle.lock().unwrap_or_else(|e| e.into_inner()).push(process);
            });
        }
    }
}

/// A new process of `function`, kept in `scaled_out` to be stopped at the end, or `None`
/// (recorded) if it cannot start.
async fn start_another(
    function: &str,
    spec: FunctionSpec,
    scaled_out: &Mutex<Vec<Arc<LambdaRuntimeApi>>>,
    timeline: &Timeline,
) -> Option<Arc<LambdaRuntimeApi>> {
    match LambdaRuntimeApi::start_function(spec).await {
        Ok(process) => {
            let process = Arc::new(process);
            scaled_out
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(process.clone());
            Some(process)
        }
        Err(error) => {
            timeline.record(
                Source::Lambda,
                format!("{function} could not scale out: {error}"),
            );
            None
        }
    }
}

/// Invokes `function` with `event` and records the invocation and its outcome.
pub(super) async fn invoke(
    timeline: &Timeline,
    function: &str,
    runtime: &LambdaRuntimeApi,
    event: &Value,
    timeout: Duration,
    summary: &str,
) -> Option<InvocationOutcome> {
    timeline.record(Source::Lambda, format!("{function} ← {summary}"));
    match runtime.invoke(event, timeout).await {
        Ok(outcome) => {
            let text = match &outcome {
                InvocationOutcome::Response(value) => {
                    format!("{function} → {}", shorten(&value.to_string(), 240))
                }
                InvocationOutcome::Error {
                    error_type,
                    error_message,
                } => {
                    format!(
                        "{function} → ERROR {error_type}: {}",
                        shorten(error_message, 240)
                    )
                }
                InvocationOutcome::Timeout => format!("{function} → timed out after {timeout:?}"),
            };
            timeline.record(Source::Lambda, text);
            Some(outcome)
        }
        Err(error) => {
            timeline.record(
                Source::Lambda,
                format!("{function} could not be invoked: {error}"),
            );
            None
        }
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// `SNS LAUNCHING i-...` from a Lambda SNS event.
fn summarize_sns(event: &Value) -> String {
    let message = event["Records"][0]["Sns"]["Message"]
        .as_str()
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .unwrap_or_default();
    let transition = message["LifecycleTransition"]
        .as_str()
        .and_then(|t| t.rsplit('_').next())
        .unwrap_or("?");
    let continuation = if message.get("NodeManagerContinuation").is_some() {
        " (hand-over)"
    } else {
        ""
    };
    format!(
        "SNS {transition} {}{continuation}",
        message["EC2InstanceId"].as_str().unwrap_or("?")
    )
}
