//! The local Lambda Runtime API driving a real `lambda_runtime` binary (`echo-lambda`):
//! invocations, handler errors, timeouts, a process killed mid-invocation, init errors,
//! cold-start timings and peak RSS.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use node_manager_testkit::binaries::function_binary;
use node_manager_testkit::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn echo_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_echo-lambda"))
}

async fn echo() -> LambdaRuntimeApi {
    LambdaRuntimeApi::start_function(
        FunctionSpec::new("echo", echo_binary())
            .memory_mb(256)
            .env("CUSTOM", "value"),
    )
    .await
    .unwrap()
}

fn response(outcome: InvocationOutcome) -> Value {
    match outcome {
        InvocationOutcome::Response(value) => value,
        other => panic!("expected a response, got {other:?}"),
    }
}

/// A raw HTTP/1.1 request to the runtime API, returning the status code.
async fn raw_post(runtime_api: &str, path: &str, body: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(runtime_api).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {runtime_api}\r\nContent-Type: application/json\r\nLambda-Runtime-Function-Error-Type: Runtime.Unknown\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap()
}

#[tokio::test]
async fn an_invocation_gets_the_event_lambdas_environment_and_a_deadline() {
    let lambda = echo().await;
    let event = json!({
        "hello": "world",
        "env": ["AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_LOG_FORMAT", "AWS_REGION", "CUSTOM", "HOME"]
    });
    let answer = response(lambda.invoke(&event, Duration::from_secs(5)).await.unwrap());
    assert_eq!(answer["echo"], event);
    assert_eq!(answer["function_name"], "echo");
    assert_eq!(answer["memory_mb"], 256);
    assert_eq!(answer["deadline_in_future"], true);
    assert_eq!(
        answer["invoked_function_arn"],
        "arn:aws:lambda:eu-west-1:111111111111:function:echo"
    );
    assert_eq!(answer["env"]["CUSTOM"], "value");
    assert_eq!(answer["env"]["AWS_LAMBDA_LOG_FORMAT"], "JSON");
    assert_eq!(answer["env"]["AWS_REGION"], "eu-west-1");
    assert_eq!(
        answer["env"]["HOME"],
        Value::Null,
        "the environment is cleared"
    );

    let timings = lambda.timings();
    let first_next = timings.to_first_next.unwrap();
    let first_response = timings.to_first_response.unwrap();
    assert!(first_next <= first_response, "{timings:?}");
    assert!(first_response < Duration::from_secs(5), "{timings:?}");

    let second = response(
        lambda
            .invoke(&json!({"n": 2}), Duration::from_secs(5))
            .await
            .unwrap(),
    );
    assert_eq!(second["echo"]["n"], 2);
    assert_ne!(second["request_id"], answer["request_id"]);
    assert_eq!(
        lambda.generation(),
        1,
        "a warm invocation reuses the process"
    );

    let records = lambda.invocations();
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[0].request_id,
        answer["request_id"].as_str().unwrap()
    );
    let second_line = format!("invocation {}", records[1].request_id);
    let printed = lambda
        .wait_for_stdout(&second_line, Duration::from_secs(5))
        .await;
    let output = lambda.output();
    assert!(output.contains("echo-lambda: init"), "{output}");
    assert!(printed, "{output}");
    assert!(lambda.peak_rss_kib().unwrap() > 0);
}

#[tokio::test]
async fn handler_errors_reach_the_caller_with_type_and_message() {
    let lambda = echo().await;
    let outcome = lambda
        .invoke(&json!({"fail": "node not found"}), Duration::from_secs(5))
        .await
        .unwrap();
    match outcome {
        InvocationOutcome::Error {
            error_type,
            error_message,
        } => {
            assert!(!error_type.is_empty());
            assert_eq!(error_message, "node not found");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    // The environment survives a handler error.
    response(
        lambda
            .invoke(&json!({}), Duration::from_secs(5))
            .await
            .unwrap(),
    );
    assert_eq!(lambda.generation(), 1);
}

#[tokio::test]
async fn a_timeout_resets_the_environment_and_the_next_invocation_is_a_cold_start() {
    let lambda = echo().await;
    let outcome = lambda
        .invoke(&json!({"sleep_ms": 5000}), Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(outcome, InvocationOutcome::Timeout);
    assert_eq!(lambda.pid(), None, "the timed-out process was killed");
    let answer = response(
        lambda
            .invoke(&json!({"n": 1}), Duration::from_secs(5))
            .await
            .unwrap(),
    );
    assert_eq!(answer["echo"]["n"], 1);
    let records = lambda.invocations();
    assert_ne!(records[0].generation, records[1].generation);
    assert!(lambda.timings().to_first_next.is_some());
}

#[tokio::test]
async fn a_process_that_dies_mid_invocation_fails_it_with_runtime_exit_error() {
    let lambda = echo().await;
    let outcome = lambda
        .invoke(&json!({"exit": 3}), Duration::from_secs(5))
        .await
        .unwrap();
    match outcome {
        InvocationOutcome::Error {
            error_type,
            error_message,
        } => {
            assert_eq!(error_type, "Runtime.ExitError");
            assert!(error_message.contains("exit status: 3"), "{error_message}");
        }
        other => panic!("expected Runtime.ExitError, got {other:?}"),
    }
    assert!(lambda.stderr().contains("exiting with 3"));

    // Killing the process during an invocation (a killed Lambda) fails it the same way.
    let slow_event = json!({"sleep_ms": 5000});
    let slow = lambda.invoke(&slow_event, Duration::from_secs(5));
    let kill = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        lambda.kill().await
    };
    let (outcome, status) = tokio::join!(slow, kill);
    assert!(status.is_some_and(|s| !s.success()));
    assert!(matches!(
        outcome.unwrap(),
        InvocationOutcome::Error { error_type, .. } if error_type == "Runtime.ExitError"
    ));
    lambda.restart().await.unwrap();
    response(
        lambda
            .invoke(&json!({}), Duration::from_secs(5))
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn a_response_over_6_mb_is_refused_like_lambda() {
    let lambda = echo().await;
    let outcome = lambda
        .invoke(&json!({"response_mb": 7}), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, InvocationOutcome::Error { error_type, .. } if error_type == "Function.ResponseSizeTooLarge"),
        "{outcome:?}"
    );
    let small = response(
        lambda
            .invoke(&json!({"response_mb": 1}), Duration::from_secs(10))
            .await
            .unwrap(),
    );
    assert_eq!(small.as_str().map(str::len), Some(1024 * 1024));
}

#[tokio::test]
async fn peak_rss_follows_the_memory_the_function_touches() {
    let lambda = echo().await;
    response(
        lambda
            .invoke(&json!({}), Duration::from_secs(5))
            .await
            .unwrap(),
    );
    let before = lambda.peak_rss_kib().unwrap();
    response(
        lambda
            .invoke(&json!({"allocate_mb": 64}), Duration::from_secs(5))
            .await
            .unwrap(),
    );
    let after = lambda.peak_rss_kib().unwrap();
    assert!(
        after >= before + 60 * 1024,
        "before {before} KiB, after {after} KiB"
    );
}

#[tokio::test]
async fn init_errors_and_unknown_request_ids_are_answered_like_lambda() {
    let lambda = LambdaRuntimeApi::start().await.unwrap();
    let api = lambda.runtime_api();
    let status = raw_post(
        &api,
        "/2018-06-01/runtime/init/error",
        r#"{"errorType":"Config.Missing","errorMessage":"CLUSTER_NAME is not set"}"#,
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(
        lambda.init_error(),
        Some((
            "Config.Missing".to_owned(),
            "CLUSTER_NAME is not set".to_owned()
        ))
    );
    let status = raw_post(
        &api,
        "/2018-06-01/runtime/invocation/unknown/response",
        "{}",
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        lambda
            .invoke(&json!({}), Duration::from_secs(1))
            .await
            .is_err(),
        "no function was spawned"
    );
}

#[test]
fn built_binaries_are_found_next_to_the_test() {
    assert_eq!(
        function_binary("echo-lambda").canonicalize().unwrap(),
        echo_binary().canonicalize().unwrap()
    );
}

/// Runs `cargo build --workspace --bins --tests` from inside a test, as a missing binary does: slow
/// (it may compile every function), so only on demand (`--ignored`).
#[test]
#[ignore = "runs a full cargo build of the workspace binaries"]
fn a_missing_binary_is_built_by_cargo_from_inside_a_test() {
    node_manager_testkit::binaries::build_workspace_binaries().unwrap();
    for name in [
        "terminating-hook",
        "launching-hook",
        "nodegroup-auth",
        "eks-token",
    ] {
        assert!(function_binary(name).is_file(), "{name}");
    }
}
