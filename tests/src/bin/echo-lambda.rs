//! A tiny Lambda function for testing the local Lambda Runtime API: it answers with what it
//! received, and the event can ask it to misbehave.
//!
//! Event fields (all optional): `"sleep_ms"`: wait before answering; `"fail"`: return a
//! handler error with this message; `"exit"`: exit the process with this code mid-invocation;
//! `"allocate_mb"`: touch this much memory (to move the peak RSS); `"response_mb"`: answer
//! with a string this large (Lambda's 6 MB response limit). The response is
//! `{"echo": <event>, "function_name", "memory_mb", "request_id", "deadline_in_future", "env": {...}}`
//! where `env` holds the variables named in the event's `"env"` list.

use std::time::Duration;

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::{Value, json};

async fn handle(event: LambdaEvent<Value>) -> Result<Value, Error> {
    let (payload, context) = event.into_parts();
    println!("echo-lambda: invocation {}", context.request_id);
    if let Some(ms) = payload.get("sleep_ms").and_then(Value::as_u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(code) = payload.get("exit").and_then(Value::as_i64) {
        eprintln!("echo-lambda: exiting with {code}");
        std::process::exit(i32::try_from(code).unwrap_or(1));
    }
    if let Some(mb) = payload.get("allocate_mb").and_then(Value::as_u64) {
        let size = usize::try_from(mb).unwrap_or(0) * 1024 * 1024;
        let buffer = vec![1u8; size];
        // Read it back so the allocation is not optimised away.
        let sum: u64 = buffer.iter().step_by(4096).map(|b| u64::from(*b)).sum();
        println!("echo-lambda: touched {sum} pages");
    }
    if let Some(mb) = payload.get("response_mb").and_then(Value::as_u64) {
        let size = usize::try_from(mb).unwrap_or(0) * 1024 * 1024;
        return Ok(Value::String("x".repeat(size)));
    }
    if let Some(message) = payload.get("fail").and_then(Value::as_str) {
        return Err(message.to_owned().into());
    }
    let env: serde_json::Map<String, Value> = payload
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|name| {
            (
                name.to_owned(),
                std::env::var(name).map(Value::from).unwrap_or(Value::Null),
            )
        })
        .collect();
    let deadline_in_future = context.deadline() > std::time::SystemTime::now();
    Ok(json!({
        "echo": payload,
        "function_name": context.env_config.function_name,
        "memory_mb": context.env_config.memory,
        "request_id": context.request_id,
        "invoked_function_arn": context.invoked_function_arn,
        "deadline_in_future": deadline_in_future,
        "env": env,
    }))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    eprintln!("echo-lambda: init");
    lambda_runtime::run(service_fn(handle)).await
}
