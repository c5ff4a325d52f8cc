//! AWS's own Lambda Runtime Interface Emulator (`aws-lambda-rie`, the runtime API AWS ships
//! in its Lambda base images) as the execution environment of a built function, instead of
//! the kit's [`LambdaRuntimeApi`](crate::lambda_api::LambdaRuntimeApi): the deadline header,
//! error reporting, the function timeout and init are AWS's.
//!
//! Built by `scripts/lambda-rie.sh build` (from its Go module, pinned there, cached outside
//! the clone); [`rie_binary`] finds it. [`LambdaRuntimeApi`](crate::lambda_api::LambdaRuntimeApi)
//! starts the emulator with the function binary as its bootstrap when the function's spec
//! asks for it ([`FunctionSpec::under_rie`](crate::lambda_api::FunctionSpec::under_rie)) and
//! sends invocations to the emulator's invoke endpoint
//! (`POST /2015-03-31/functions/function/invocations`), as `docker run` of a base image does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;

use crate::lambda_api::InvocationOutcome;

/// The account of the ARN the emulator gives every function
/// (`arn:aws:lambda:us-east-1:012345678912:function:<name>`): a world whose functions run under
/// it is that account.
pub const RIE_ACCOUNT: &str = "012345678912";

/// Where `scripts/lambda-rie.sh build` leaves the emulator (`ONM_LAMBDA_RIE` overrides it).
pub fn rie_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("ONM_LAMBDA_RIE") {
        return Ok(PathBuf::from(path));
    }
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    let path = Path::new(&home).join(".cache/open-node-manager/lambda-rie/aws-lambda-rie");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "AWS's Lambda Runtime Interface Emulator is not built ({} is missing): run `scripts/lambda-rie.sh build` (a minute, once; needs Go)",
            path.display()
        ))
    }
}

/// The emulator of one function: its binary, the address it serves invocations on, and the
/// function timeout it enforces (`AWS_LAMBDA_FUNCTION_TIMEOUT`).
#[derive(Debug, Clone)]
pub struct Rie {
    pub binary: PathBuf,
    pub invoke_address: std::net::SocketAddr,
    pub runtime_api_address: std::net::SocketAddr,
    pub timeout: Duration,
}

impl Rie {
    /// An emulator on two free local ports with `timeout` as the function's timeout.
    pub fn new(binary: PathBuf, timeout: Duration) -> std::io::Result<Self> {
        Ok(Self {
            binary,
            invoke_address: free_port()?,
            runtime_api_address: free_port()?,
            timeout,
        })
    }

    /// The command that starts the emulator with `bootstrap` as the function.
    pub fn command(&self, bootstrap: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .arg("--runtime-interface-emulator-address")
            .arg(self.invoke_address.to_string())
            .arg("--runtime-api-address")
            .arg(self.runtime_api_address.to_string())
            .arg(bootstrap);
        command
    }

    /// The environment the emulator needs beside Lambda's: the timeout it enforces.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![(
            "AWS_LAMBDA_FUNCTION_TIMEOUT".to_owned(),
            self.timeout.as_secs().max(1).to_string(),
        )]
    }

    /// Posts `event` to the emulator's invoke endpoint; connection refusals while it starts
    /// are retried for a few seconds. An answer carrying `errorType` (the emulator's shape of
    /// a handler error, an init error or a timeout) is an error.
    pub async fn invoke(&self, event: &Value) -> InvocationOutcome {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Full<Bytes>>();
        let uri = format!(
            "http://{}/2015-03-31/functions/function/invocations",
            self.invoke_address
        );
        let started = std::time::Instant::now();
        let response = loop {
            let request = hyper::Request::post(&uri)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(event.to_string())));
            let Ok(request) = request else {
                return error("Kit.Request", "could not build the invoke request".into());
            };
            match client.request(request).await {
                Ok(response) => break response,
                Err(e) if started.elapsed() < Duration::from_secs(5) && e.is_connect() => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return error("Kit.Unreachable", e.to_string()),
            }
        };
        let function_error = response.headers().contains_key("x-amz-function-error");
        let body = match response.into_body().collect().await {
            Ok(body) => body.to_bytes(),
            Err(e) => return error("Kit.Body", e.to_string()),
        };
        let value: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        match value.get("errorType").and_then(Value::as_str) {
            Some(error_type) => error(
                error_type,
                value["errorMessage"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ),
            None if function_error => error("Unhandled", value.to_string()),
            None => InvocationOutcome::Response(value),
        }
    }
}

fn error(error_type: &str, error_message: String) -> InvocationOutcome {
    InvocationOutcome::Error {
        error_type: error_type.to_owned(),
        error_message,
    }
}

fn free_port() -> std::io::Result<std::net::SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}
