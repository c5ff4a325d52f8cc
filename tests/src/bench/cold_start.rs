//! Cold start of each function binary through the local Lambda Runtime API, beside a bare
//! `lambda_runtime` binary (`echo-lambda`) measured in the same run; and token signing.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use super::{Mode, median};
use crate::binaries;
use crate::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};
use crate::sandbox::{Sandbox, Scenario};

/// Cold-start figures of one binary (medians over `runs` fresh processes).
#[derive(Debug, Clone)]
pub struct ColdStartRow {
    pub binary: String,
    /// Process start → first `/invocation/next` (Lambda's init phase).
    pub init: Duration,
    /// Process start → the first response (init + the first invocation).
    pub first_response: Duration,
    pub peak_rss_kib: u64,
    /// Size of the binary measured (the profile in use: debug, or release with
    /// `NODE_MANAGER_BIN_DIR`).
    pub size_bytes: u64,
    /// Size of the arm64 Lambda artifact (`bootstrap`), when `cargo lambda build` made one.
    pub arm64_size_bytes: Option<u64>,
    pub runs: usize,
    /// The median over rounds of this binary's init ÷ the bare binary's in the same round
    /// (1.0 for the bare binary itself): each round starts every binary once, one after the
    /// other, so the ratio compares processes started moments apart.
    pub init_vs_bare: f64,
}

/// The `autoscaling:TEST_NOTIFICATION` Auto Scaling sends when a hook is created, as SNS
/// delivers it (shape of `tests/fixtures/sns-test-notification.json`).
fn test_notification(group: &str) -> Value {
    let message = json!({
        "AccountId": "111111111111",
        "RequestId": "5b2e9a0c-3f4d-4e6b-8a7c-1d2e3f4a5b6c",
        "AutoScalingGroupARN": format!("arn:aws:autoscaling:eu-west-1:111111111111:autoScalingGroup:3f2a1b0c:autoScalingGroupName/{group}"),
        "AutoScalingGroupName": group,
        "Service": "AWS Auto Scaling",
        "Event": "autoscaling:TEST_NOTIFICATION",
        "Time": "2022-09-25T12:59:13.402Z",
    });
    json!({"Records": [{
        "EventSource": "aws:sns",
        "EventVersion": "1.0",
        "EventSubscriptionArn": "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic:2bcfbf39",
        "Sns": {
            "Type": "Notification",
            "MessageId": "a1b2c3d4-e5f6-5789-8abc-def012345678",
            "TopicArn": "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic",
            "Subject": format!("Auto Scaling: test notification for group \"{group}\""),
            "Message": message.to_string(),
            "Timestamp": "2022-09-25T12:59:13.402Z",
            "SignatureVersion": "1",
            "Signature": "EXAMPLE",
            "SigningCertUrl": "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0000.pem",
            "UnsubscribeUrl": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe",
            "MessageAttributes": {},
        },
    }]})
}

fn arm64_artifact(function: &str) -> Option<u64> {
    let dir = std::env::var_os("LAMBDA_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".cache/node-manager-lambda-target"))
        })?;
    std::fs::metadata(dir.join("lambda").join(function).join("bootstrap"))
        .ok()
        .map(|m| m.len())
}

/// One fresh process of `spec`, invoked once with `event`: its init, first response and peak
/// RSS.
async fn measure_once(
    spec: &FunctionSpec,
    event: &Value,
) -> Result<(Duration, Duration, u64), String> {
    let runtime = LambdaRuntimeApi::start_function(spec.clone())
        .await
        .map_err(|e| e.to_string())?;
    let outcome = runtime
        .invoke(event, Duration::from_secs(30))
        .await
        .map_err(|e| e.to_string())?;
    // A cold start is only measured on a process that served the event: anything else is a
    // failure to report with what the process said, not a missing figure.
    if !matches!(outcome, InvocationOutcome::Response(_)) {
        let output = runtime.output();
        runtime.kill().await;
        return Err(format!(
            "{}: the measured invocation ended with {outcome:?}; the process wrote:\n{output}",
            spec.name
        ));
    }
    let timings = runtime.timings();
    let measured = (
        timings
            .to_first_next
            .ok_or("the function never asked for an event")?,
        timings
            .to_first_response
            .ok_or("the function never answered")?,
        runtime.peak_rss_kib().unwrap_or_default(),
    );
    runtime.kill().await;
    Ok(measured)
}

/// The events each measured binary gets.
fn measured_binaries(sandbox: &Sandbox) -> Result<Vec<(FunctionSpec, Value)>, String> {
    let group = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
    let baseline = FunctionSpec::new(
        "echo-lambda",
        binaries::try_function_binary("echo-lambda").map_err(|e| e.to_string())?,
    );
    let mut binaries = vec![(baseline, json!({"ping": 1}))];
    for function in [
        "terminating-hook",
        "launching-hook",
        "nodegroup-auth",
        "node-repair",
        "instance-refresh",
    ] {
        let spec = sandbox
            .function_spec(function)
            .ok_or_else(|| format!("no spec for {function}"))?;
        let event = match function {
            "nodegroup-auth" => sandbox.nodegroup_event_payload("CreateNodegroup", "demo-ng"),
            // A scheduled run over the reference cluster's healthy nodes: discovery, token,
            // TLS, the node list and one DescribeAutoScalingInstances/-Groups each.
            "node-repair" => {
                json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}})
            }
            // A checkpoint of a refresh in a group of no cluster's: start-up, parsing, one
            // DescribeAutoScalingGroups (the scope check) and the answer (`NotOurs`). Every
            // refresh event of a group of ours now plans or undoes marks, and a refresh
            // started for the measurement would replace the reference cluster's nodes.
            "instance-refresh" => json!({
                "version": "0", "id": "7e1b6c1e-0d6e-4a49-9a55-1f2e3d4c5b6a",
                "detail-type": "EC2 Auto Scaling Instance Refresh Checkpoint Reached",
                "source": "aws.autoscaling", "account": "111111111111",
                "time": "2026-11-27T08:00:00Z", "region": "eu-west-1", "resources": [],
                "detail": {"InstanceRefreshId": "c613620e-07e2-4ed2-a9e2-ef8258911ade",
                           "AutoScalingGroupName": "another-teams-group",
                           "CheckpointPercentage": "50"},
            }),
            _ => test_notification(group),
        };
        binaries.push((spec, event));
    }
    Ok(binaries)
}

/// Cold start of the bare baseline and each function, interleaved: each round starts every
/// binary once, one after the other, so machine noise hits all of them alike. The hooks get a
/// test notification (what Auto Scaling sends when a hook is attached); `nodegroup-auth` a
/// `CreateNodegroup` event it must act on (discovery, token, TLS to the API server, one
/// `aws-auth` read).
pub async fn cold_start(mode: Mode) -> Result<Vec<ColdStartRow>, String> {
    let rounds = match mode {
        Mode::Quick => 2,
        Mode::Full => 40,
    };
    let sandbox = Sandbox::start(Scenario::reference().map_err(|e| e.to_string())?, false)
        .await
        .map_err(|e| e.to_string())?;
    // Map the node role first, so every measured nodegroup-auth run is the same no-op check.
    sandbox.play_step(0).await;
    let binaries = measured_binaries(&sandbox)?;
    let mut samples: Vec<Vec<(Duration, Duration, u64)>> = vec![Vec::new(); binaries.len()];
    for _ in 0..rounds {
        for (index, (spec, event)) in binaries.iter().enumerate() {
            samples[index].push(measure_once(spec, event).await?);
        }
    }
    sandbox.shutdown().await;
    let baseline: Vec<Duration> = samples[0].iter().map(|s| s.0).collect();
    Ok(binaries
        .iter()
        .zip(samples)
        .map(|((spec, _), samples)| {
            let mut ratios: Vec<f64> = samples
                .iter()
                .zip(&baseline)
                .map(|(s, bare)| s.0.as_secs_f64() / bare.as_secs_f64().max(f64::EPSILON))
                .collect();
            ratios.sort_by(f64::total_cmp);
            let mut init: Vec<Duration> = samples.iter().map(|s| s.0).collect();
            let mut first: Vec<Duration> = samples.iter().map(|s| s.1).collect();
            let mut rss: Vec<u64> = samples.iter().map(|s| s.2).collect();
            rss.sort_unstable();
            ColdStartRow {
                binary: spec.name.clone(),
                init: median(&mut init),
                first_response: median(&mut first),
                peak_rss_kib: rss[(rss.len() - 1) / 2],
                size_bytes: std::fs::metadata(&spec.binary)
                    .map(|m| m.len())
                    .unwrap_or_default(),
                arm64_size_bytes: arm64_artifact(&spec.name),
                runs: rounds,
                init_vs_bare: ratios[(ratios.len() - 1) / 2],
            }
        })
        .collect())
}

/// Median time to sign one EKS token, over `count` signings.
pub fn token_signing(count: usize) -> Duration {
    let credentials = aws_credential_types::Credentials::new(
        "ASIAEXAMPLEEXAMPLE00",
        "fake-secret-key-for-the-benchmark-000000",
        Some("fake-session-token".to_owned()),
        None,
        "bench",
    );
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let token = node_manager::cluster::token::sign_token(
            &credentials,
            "eu-west-1",
            "ironman-2022",
            SystemTime::now(),
        );
        samples.push(started.elapsed());
        std::hint::black_box(token.is_ok());
    }
    median(&mut samples)
}
