//! The function processes of a sandbox: started from the built binaries through the local
//! Lambda Runtime API, fed every SNS delivery of the lifecycle topic, and invoked with a
//! record on the timeline of what went in and what came out.

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
    /// Auto Scaling's instance refresh events, as the stack's EventBridge rule routes them:
    /// each becomes an invocation of `instance-refresh`, one after the other.
    pub(super) fn deliver_refresh_events(&mut self) {
        let mut subscription = self.aws.eventbridge().subscribe(EventPattern {
            sources: vec!["aws.autoscaling".to_owned()],
            detail_types: REFRESH_DETAIL_TYPES
                .iter()
                .map(|kind| format!("EC2 Auto Scaling Instance Refresh {kind}"))
                .collect(),
        });
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
const REFRESH_DETAIL_TYPES: [&str; 7] = [
    "Started",
    "Succeeded",
    "Failed",
    "Cancelled",
    "Rollback Started",
    "Rollback Succeeded",
    "Rollback Failed",
];

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
                    None => match this.scale_out(spec, &scaled_out).await {
                        Some(process) => process,
                        None => return,
                    },
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

    /// A new process of the function, or `None` (recorded) if it cannot start.
    async fn scale_out(
        &self,
        spec: FunctionSpec,
        scaled_out: &Mutex<Vec<Arc<LambdaRuntimeApi>>>,
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
                self.timeline.record(
                    Source::Lambda,
                    format!("{} could not scale out: {error}", self.function),
                );
                None
            }
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
