//! A local Lambda Runtime API that runs a built function binary as Lambda does.
//!
//! [`LambdaRuntimeApi`] serves the runtime endpoints a custom runtime (`lambda_runtime`)
//! talks to — `/2018-06-01/runtime/invocation/next` (long poll), `.../{id}/response`,
//! `.../{id}/error`, `/runtime/init/error`, and the extension registration that
//! `lambda_runtime`'s graceful-shutdown helper makes — and owns one execution environment:
//! the function process, started with Lambda's environment variables and a clean environment
//! otherwise, its stdout/stderr captured. A test feeds it events with a deadline
//! ([`LambdaRuntimeApi::invoke`]) and reads the outcome, the cold-start timings and the
//! peak RSS; it can kill the process mid-invocation to see what a retried delivery does.
//!
//! As on Lambda: one invocation at a time per environment; a timed-out invocation resets the environment
//! (the process is killed and the next invoke starts a new one); a process that exits during
//! an invocation fails it with `Runtime.ExitError`.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{oneshot, watch};

/// A failure of the local runtime itself (not of the function: see [`InvocationOutcome`]).
#[derive(Debug, thiserror::Error)]
pub enum LambdaApiError {
    #[error("could not start the Lambda Runtime API on 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    #[error("could not start the function binary {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no function process: call spawn first")]
    NoFunction,
}

/// How one invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum InvocationOutcome {
    /// The body the function posted to `/response` (JSON; a non-JSON body as a string).
    Response(Value),
    /// `/error` (handler error), `/init/error`, or the process exiting (`Runtime.ExitError`).
    Error {
        error_type: String,
        error_message: String,
    },
    /// No answer before the deadline; the environment was reset.
    Timeout,
}

/// How the function process is started.
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    pub name: String,
    pub binary: PathBuf,
    pub memory_mb: u32,
    /// `Text` or `JSON` (`AWS_LAMBDA_LOG_FORMAT`).
    pub log_format: String,
    pub region: String,
    pub account_id: String,
    /// Extra environment (the function's configuration, AWS credentials, `RUST_LOG`, ...).
    pub env: BTreeMap<String, String>,
    /// Run under AWS's Lambda Runtime Interface Emulator instead of this API
    /// ([`crate::lambda_rie`]).
    pub rie: Option<crate::lambda_rie::Rie>,
}

impl FunctionSpec {
    /// 128 MB, JSON logs, `eu-west-1`, account `111111111111`.
    pub fn new(name: &str, binary: impl Into<PathBuf>) -> Self {
        Self {
            name: name.to_owned(),
            binary: binary.into(),
            memory_mb: 128,
            log_format: "JSON".to_owned(),
            region: "eu-west-1".to_owned(),
            account_id: "111111111111".to_owned(),
            env: BTreeMap::new(),
            rie: None,
        }
    }

    /// Runs the function under AWS's Lambda Runtime Interface Emulator `rie`: it serves the
    /// runtime API and enforces the timeout; invocations go to its invoke endpoint.
    pub fn under_rie(mut self, rie: crate::lambda_rie::Rie) -> Self {
        self.rie = Some(rie);
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    pub fn memory_mb(mut self, memory_mb: u32) -> Self {
        self.memory_mb = memory_mb;
        self
    }

    pub fn log_format(mut self, format: &str) -> Self {
        self.log_format = format.to_owned();
        self
    }

    pub fn region(mut self, region: &str) -> Self {
        self.region = region.to_owned();
        self
    }

    /// `arn:aws:lambda:<region>:<account>:function:<name>`.
    pub fn function_arn(&self) -> String {
        format!(
            "arn:aws:lambda:{}:{}:function:{}",
            self.region, self.account_id, self.name
        )
    }
}

/// Cold-start timings of the current (or last) process, from its spawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessTimings {
    /// Spawn → first `/invocation/next` (the init phase).
    pub to_first_next: Option<Duration>,
    /// Spawn → first `/response` or `/error` (init + first invocation).
    pub to_first_response: Option<Duration>,
}

/// One finished invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct InvocationRecord {
    pub request_id: String,
    pub event: Value,
    pub outcome: InvocationOutcome,
    /// Invoke → outcome.
    pub duration: Duration,
    /// The process generation (1 for the first process, +1 per restart) that handled it.
    pub generation: u64,
}

struct Pending {
    request_id: String,
    event: Bytes,
    deadline_ms: i64,
    reply: oneshot::Sender<InvocationOutcome>,
}

struct Process {
    pid: Option<u32>,
    kill: Option<oneshot::Sender<()>>,
    exited: watch::Receiver<Option<ExitStatus>>,
    spawned_at: Instant,
}

#[derive(Default)]
struct RuntimeState {
    spec: Option<FunctionSpec>,
    /// Bumped on every spawn and kill: a long poll from an older process gives up.
    generation: u64,
    queue: VecDeque<Pending>,
    in_flight: BTreeMap<String, oneshot::Sender<InvocationOutcome>>,
    process: Option<Process>,
    timings: ProcessTimings,
    init_error: Option<(String, String)>,
    peak_rss_kib: Option<u64>,
    records: Vec<InvocationRecord>,
    stdout: String,
    stderr: String,
    /// stdout and stderr interleaved in arrival order.
    output: String,
}

struct RuntimeShared {
    state: Mutex<RuntimeState>,
    /// Bumped on every enqueue and generation change, to wake long polls.
    wake: watch::Sender<u64>,
}

impl RuntimeShared {
    fn state(&self) -> MutexGuard<'_, RuntimeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The local Lambda Runtime API and the one function process it serves. Dropping it kills the
/// process and stops the server.
pub struct LambdaRuntimeApi {
    shared: Arc<RuntimeShared>,
    address: SocketAddr,
    server: tokio::task::JoinHandle<()>,
    /// One invocation at a time: the environment is single-threaded, as on Lambda.
    invoke_lock: tokio::sync::Mutex<()>,
}

impl Drop for LambdaRuntimeApi {
    fn drop(&mut self) {
        if let Some(kill) = self
            .shared
            .state()
            .process
            .as_mut()
            .and_then(|p| p.kill.take())
        {
            let _ = kill.send(());
        }
        self.server.abort();
    }
}

impl LambdaRuntimeApi {
    /// Starts the API on `127.0.0.1` on a free port.
    pub async fn start() -> Result<Self, LambdaApiError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(LambdaApiError::Bind)?;
        let address = listener.local_addr().map_err(LambdaApiError::Bind)?;
        let shared = Arc::new(RuntimeShared {
            state: Mutex::default(),
            wake: watch::Sender::new(0),
        });
        let router = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next_invocation))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(invocation_response),
            )
            .route(
                "/2018-06-01/runtime/invocation/{id}/error",
                post(invocation_error),
            )
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .route("/2020-01-01/extension/register", post(extension_register))
            .route("/2020-01-01/extension/event/next", get(extension_next))
            // Above Lambda's 6 MB response limit, so an oversized response is judged here.
            .layer(axum::extract::DefaultBodyLimit::max(4 * MAX_RESPONSE_BYTES))
            .with_state(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, router).await {
                tracing::error!(%error, "local Lambda Runtime API stopped");
            }
        });
        Ok(Self {
            shared,
            address,
            server,
            invoke_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Starts the API and spawns `spec`'s binary.
    pub async fn start_function(spec: FunctionSpec) -> Result<Self, LambdaApiError> {
        let api = Self::start().await?;
        api.spawn(spec).await?;
        Ok(api)
    }

    /// `127.0.0.1:<port>`: the value of `AWS_LAMBDA_RUNTIME_API`.
    pub fn runtime_api(&self) -> String {
        self.address.to_string()
    }

    /// Starts `spec`'s binary as Lambda does (killing any current process).
    pub async fn spawn(&self, spec: FunctionSpec) -> Result<(), LambdaApiError> {
        self.kill().await;
        self.shared.state().spec = Some(spec);
        self.spawn_current()
    }

    /// The function's process with Lambda's environment: the binary itself, or AWS's emulator
    /// with the binary as its bootstrap (the emulator serves the runtime API and tells the
    /// function where, so `AWS_LAMBDA_RUNTIME_API` is its to set).
    fn command_for(&self, spec: &FunctionSpec) -> tokio::process::Command {
        let lambda = lambda_environment(spec, &self.runtime_api());
        match &spec.rie {
            Some(rie) => {
                let mut command = rie.command(&spec.binary);
                let lambda = lambda
                    .into_iter()
                    .filter(|(key, _)| key != "AWS_LAMBDA_RUNTIME_API");
                command.env_clear().envs(lambda).envs(rie.env());
                command
            }
            None => {
                let mut command = tokio::process::Command::new(&spec.binary);
                command.env_clear().envs(lambda);
                command
            }
        }
    }

    fn spawn_current(&self) -> Result<(), LambdaApiError> {
        let spec = self
            .shared
            .state()
            .spec
            .clone()
            .ok_or(LambdaApiError::NoFunction)?;
        let mut command = self.command_for(&spec);
        command
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // The new process's state (generation, timings, kill and exit channels) is in place
        // before the child exists: a child that polls `/next` before `spawn` returns (a
        // loaded machine may deschedule this thread for tens of milliseconds right after the
        // fork) must find its own generation, not be told that its environment was reset.
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (exit_tx, exit_rx) = watch::channel(None);
        let spawned_at = Instant::now();
        let generation = {
            let mut state = self.shared.state();
            state.generation += 1;
            state.process = Some(Process {
                pid: None,
                kill: Some(kill_tx),
                exited: exit_rx,
                spawned_at,
            });
            state.timings = ProcessTimings::default();
            state.init_error = None;
            state.generation
        };
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(source) => {
                let mut state = self.shared.state();
                if state.generation == generation {
                    state.process = None;
                }
                return Err(LambdaApiError::Spawn {
                    path: spec.binary.clone(),
                    source,
                });
            }
        };
        let pid = child.id();
        if let Some(process) = self.shared.state().process.as_mut() {
            process.pid = pid;
        }
        if let Some(stdout) = child.stdout.take() {
            capture(Arc::clone(&self.shared), stdout, false);
        }
        if let Some(stderr) = child.stderr.take() {
            capture(Arc::clone(&self.shared), stderr, true);
        }
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            let status = tokio::select! {
                status = child.wait() => status.ok(),
                _ = kill_rx => {
                    if let Some(pid) = pid {
                        record_peak_rss(&shared, pid);
                    }
                    let _ = child.start_kill();
                    child.wait().await.ok()
                }
            };
            let _ = exit_tx.send(Some(status.unwrap_or_else(failed_status)));
        });
        self.shared.wake();
        Ok(())
    }

    /// Kills the function process (SIGKILL, as Lambda does to a timed-out or failed
    /// environment) and waits for it to exit. The next [`invoke`](Self::invoke) starts a new one.
    pub async fn kill(&self) -> Option<ExitStatus> {
        let (kill, mut exited) = {
            let mut state = self.shared.state();
            let process = state.process.as_mut()?;
            let handles = (process.kill.take(), process.exited.clone());
            state.generation += 1;
            handles
        };
        self.shared.wake();
        if let Some(kill) = kill {
            let _ = kill.send(());
        }
        exited.wait_for(Option::is_some).await.ok().and_then(|s| *s)
    }

    /// Kills the process and starts a new one with the same spec (a cold start).
    pub async fn restart(&self) -> Result<(), LambdaApiError> {
        self.kill().await;
        self.spawn_current()
    }

    /// Sends `event` to the function and waits for the outcome until `timeout` (the function's
    /// configured timeout: the deadline the function sees). Starts a new process first when
    /// the previous one is gone.
    ///
    /// Concurrent calls are served one after the other by the one environment (as with a
    /// reserved concurrency of 1); each one's deadline starts when it gets the environment.
    pub async fn invoke(
        &self,
        event: &Value,
        timeout: Duration,
    ) -> Result<InvocationOutcome, LambdaApiError> {
        let _environment = self.invoke_lock.lock().await;
        let exited_before = {
            let state = self.shared.state();
            match &state.process {
                Some(process) => process.kill.is_none() || process.exited.borrow().is_some(),
                None => true,
            }
        };
        if exited_before {
            self.spawn_current()?;
        }
        let rie = self
            .shared
            .state()
            .spec
            .as_ref()
            .and_then(|s| s.rie.clone());
        if let Some(rie) = rie {
            return Ok(self.invoke_rie(&rie, event, timeout).await);
        }
        let started = Instant::now();
        let request_id = crate::aws::uuid_v4();
        let (reply_tx, reply_rx) = oneshot::channel();
        let deadline_ms = jiff::Timestamp::now().as_millisecond()
            + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 2);
        let (mut exited, generation) = {
            let mut state = self.shared.state();
            state.queue.push_back(Pending {
                request_id: request_id.clone(),
                event: Bytes::from(event.to_string()),
                deadline_ms,
                reply: reply_tx,
            });
            let exited = state
                .process
                .as_ref()
                .map(|p| p.exited.clone())
                .ok_or(LambdaApiError::NoFunction)?;
            (exited, state.generation)
        };
        self.shared.wake();
        let outcome = tokio::select! {
            outcome = reply_rx => outcome.unwrap_or(InvocationOutcome::Timeout),
            () = tokio::time::sleep(timeout) => {
                self.kill().await;
                InvocationOutcome::Timeout
            }
            // Copy the status out at once: a held `watch::Ref` would make this future !Send.
            status = async { exited.wait_for(Option::is_some).await.ok().and_then(|s| *s) } => {
                let init_error = self.shared.state().init_error.clone();
                match init_error {
                    Some((error_type, error_message)) => InvocationOutcome::Error { error_type, error_message },
                    None => InvocationOutcome::Error {
                        error_type: "Runtime.ExitError".to_owned(),
                        error_message: format!(
                            "RequestId: {request_id} Error: Runtime exited{}",
                            status.map(|s| format!(" with {s}")).unwrap_or_default()
                        ),
                    },
                }
            }
        };
        let mut state = self.shared.state();
        state.queue.retain(|p| p.request_id != request_id);
        state.in_flight.remove(&request_id);
        state.records.push(InvocationRecord {
            request_id,
            event: event.clone(),
            outcome: outcome.clone(),
            duration: started.elapsed(),
            generation,
        });
        Ok(outcome)
    }

    /// An invocation through the emulator, which enforces the function's own timeout; the
    /// kit waits a little longer for its answer.
    async fn invoke_rie(
        &self,
        rie: &crate::lambda_rie::Rie,
        event: &Value,
        timeout: Duration,
    ) -> InvocationOutcome {
        let started = Instant::now();
        let generation = self.shared.state().generation;
        let wait = timeout.max(rie.timeout) + Duration::from_secs(5);
        let outcome = tokio::time::timeout(wait, rie.invoke(event))
            .await
            .unwrap_or(InvocationOutcome::Timeout);
        self.shared.state().records.push(InvocationRecord {
            request_id: String::new(),
            event: event.clone(),
            outcome: outcome.clone(),
            duration: started.elapsed(),
            generation,
        });
        outcome
    }

    /// Everything the process wrote to stdout and stderr, interleaved.
    pub fn output(&self) -> String {
        self.shared.state().output.clone()
    }

    pub fn stdout(&self) -> String {
        self.shared.state().stdout.clone()
    }

    /// Waits (at most `timeout`) until the process's stdout contains `needle`: its pipes are
    /// read by a task of their own, so a line printed just before an answer may arrive after
    /// it. Returns whether it did.
    pub async fn wait_for_stdout(&self, needle: &str, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.stdout().contains(needle) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    pub fn stderr(&self) -> String {
        self.shared.state().stderr.clone()
    }

    /// Timings of the current (or last) process.
    pub fn timings(&self) -> ProcessTimings {
        self.shared.state().timings
    }

    /// The peak resident set size (`VmHWM`) in KiB over the processes run so far, read
    /// now from a live process and before every kill and every `/next` poll.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let pid = self
            .shared
            .state()
            .process
            .as_ref()
            .and_then(|p| (p.exited.borrow().is_none()).then_some(p.pid).flatten());
        if let Some(pid) = pid {
            record_peak_rss(&self.shared, pid);
        }
        self.shared.state().peak_rss_kib
    }

    /// The `/init/error` the current process reported, as (errorType, errorMessage).
    pub fn init_error(&self) -> Option<(String, String)> {
        self.shared.state().init_error.clone()
    }

    /// The process generation: 1 for the first process, +1 per spawn and per kill (a
    /// restart adds 2), so a test can tell whether two invocations shared a process.
    pub fn generation(&self) -> u64 {
        self.shared.state().generation
    }

    /// The current process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        let state = self.shared.state();
        let process = state.process.as_ref()?;
        if process.exited.borrow().is_some() {
            return None;
        }
        process.pid
    }

    /// Every finished invocation, oldest first.
    pub fn invocations(&self) -> Vec<InvocationRecord> {
        self.shared.state().records.clone()
    }
}

#[cfg(unix)]
fn failed_status() -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw(1 << 8)
}

#[cfg(not(unix))]
fn failed_status() -> ExitStatus {
    ExitStatus::default()
}

/// The variables Lambda sets for a `provided.al2023` function (the rest of the environment is
/// cleared, as on Lambda; `PATH` is kept so the binary can run tools).
fn lambda_environment(spec: &FunctionSpec, runtime_api: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("AWS_LAMBDA_RUNTIME_API", runtime_api.to_owned()),
        ("AWS_LAMBDA_FUNCTION_NAME", spec.name.clone()),
        (
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
            spec.memory_mb.to_string(),
        ),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        ("AWS_LAMBDA_LOG_FORMAT", spec.log_format.clone()),
        (
            "AWS_LAMBDA_LOG_GROUP_NAME",
            format!("/aws/lambda/{}", spec.name),
        ),
        (
            "AWS_LAMBDA_LOG_STREAM_NAME",
            "2026/01/01/[$LATEST]00000000000000000000000000000000".to_owned(),
        ),
        ("AWS_REGION", spec.region.clone()),
        ("AWS_DEFAULT_REGION", spec.region.clone()),
        ("AWS_EXECUTION_ENV", "AWS_Lambda_provided.al2023".to_owned()),
        ("_HANDLER", "bootstrap".to_owned()),
        ("LANG", "en_US.UTF-8".to_owned()),
        ("TZ", ":UTC".to_owned()),
    ];
    if let Ok(path) = std::env::var("PATH") {
        env.push(("PATH", path));
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn capture<R>(shared: Arc<RuntimeShared>, reader: R, is_stderr: bool)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut state = shared.state();
            let buffer = if is_stderr {
                &mut state.stderr
            } else {
                &mut state.stdout
            };
            buffer.push_str(&line);
            buffer.push('\n');
            state.output.push_str(&line);
            state.output.push('\n');
        }
    });
}

/// Reads `VmHWM` of `pid` and keeps the maximum seen.
fn record_peak_rss(shared: &RuntimeShared, pid: u32) {
    let Some(kib) = read_vm_hwm(pid) else {
        return;
    };
    let mut state = shared.state();
    state.peak_rss_kib = Some(state.peak_rss_kib.map_or(kib, |peak| peak.max(kib)));
}

fn read_vm_hwm(pid: u32) -> Option<u64> {
    status_kib(&pid.to_string(), "VmHWM")
}

/// A memory figure in kB (`VmRSS`, `VmHWM`, ...) of process `pid` (`self` for this one), from
/// `/proc/<pid>/status`; `None` when the process or the field is not there.
pub fn status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

fn header(value: &str) -> HeaderValue {
    HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn trace_id() -> String {
    let now = jiff::Timestamp::now().as_second();
    let random: [u8; 12] = rand::random();
    let parent: [u8; 8] = rand::random();
    format!(
        "Root=1-{now:08x}-{};Parent={};Sampled=0;Lineage=1:0:0",
        hex::encode(random),
        hex::encode(parent)
    )
}

async fn next_invocation(State(shared): State<Arc<RuntimeShared>>) -> Response {
    let mut wake = shared.wake.subscribe();
    let generation = shared.state().generation;
    loop {
        {
            let mut state = shared.state();
            if state.generation != generation {
                // This poll belongs to a process that was killed or replaced.
                return (StatusCode::GONE, "the execution environment was reset").into_response();
            }
            if let Some(process) = &state.process {
                let elapsed = process.spawned_at.elapsed();
                let pid = process.pid;
                if state.timings.to_first_next.is_none() {
                    state.timings.to_first_next = Some(elapsed);
                }
                if let Some(pid) = pid
                    && let Some(kib) = read_vm_hwm(pid)
                {
                    state.peak_rss_kib = Some(state.peak_rss_kib.map_or(kib, |p| p.max(kib)));
                }
            }
            while let Some(pending) = state.queue.pop_front() {
                if pending.reply.is_closed() {
                    continue;
                }
                let function_arn = state
                    .spec
                    .as_ref()
                    .map(FunctionSpec::function_arn)
                    .unwrap_or_default();
                let mut headers = HeaderMap::new();
                headers.insert("Lambda-Runtime-Aws-Request-Id", header(&pending.request_id));
                headers.insert(
                    "Lambda-Runtime-Deadline-Ms",
                    header(&pending.deadline_ms.to_string()),
                );
                headers.insert("Lambda-Runtime-Invoked-Function-Arn", header(&function_arn));
                headers.insert("Lambda-Runtime-Trace-Id", header(&trace_id()));
                headers.insert("content-type", HeaderValue::from_static("application/json"));
                state.in_flight.insert(pending.request_id, pending.reply);
                return (StatusCode::OK, headers, pending.event).into_response();
            }
        }
        if wake.changed().await.is_err() {
            return StatusCode::GONE.into_response();
        }
    }
}

fn accepted() -> Response {
    (StatusCode::ACCEPTED, axum::Json(json!({ "status": "OK" }))).into_response()
}

fn invalid_request_id() -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({
            "errorMessage": "Invalid request ID",
            "errorType": "InvalidRequestID"
        })),
    )
        .into_response()
}

fn finish(shared: &RuntimeShared, request_id: &str, outcome: InvocationOutcome) -> Response {
    let mut state = shared.state();
    let Some(reply) = state.in_flight.remove(request_id) else {
        return invalid_request_id();
    };
    if state.timings.to_first_response.is_none()
        && let Some(process) = &state.process
    {
        state.timings.to_first_response = Some(process.spawned_at.elapsed());
    }
    let _ = reply.send(outcome);
    accepted()
}

/// Lambda's limit on a synchronous response payload.
const MAX_RESPONSE_BYTES: usize = 6 * 1024 * 1024;

async fn invocation_response(
    State(shared): State<Arc<RuntimeShared>>,
    Path(request_id): Path<String>,
    body: Bytes,
) -> Response {
    if body.len() > MAX_RESPONSE_BYTES {
        let outcome = InvocationOutcome::Error {
            error_type: "Function.ResponseSizeTooLarge".to_owned(),
            error_message: format!(
                "Response payload size ({} bytes) exceeded maximum allowed payload size ({MAX_RESPONSE_BYTES} bytes).",
                body.len()
            ),
        };
        let accepted = finish(&shared, &request_id, outcome);
        if accepted.status() != StatusCode::ACCEPTED {
            return accepted;
        }
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            axum::Json(json!({
                "errorMessage": "Exceeded maximum allowed payload size (6291556 bytes).",
                "errorType": "RequestEntityTooLarge"
            })),
        )
            .into_response();
    }
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    finish(&shared, &request_id, InvocationOutcome::Response(value))
}

/// `errorType`/`errorMessage` from an error body, falling back to the error-type header.
fn error_parts(headers: &HeaderMap, body: &[u8]) -> (String, String) {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let header_type = headers
        .get("Lambda-Runtime-Function-Error-Type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let error_type = parsed
        .get("errorType")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or(header_type)
        .unwrap_or_else(|| "Unhandled".to_owned());
    let error_message = parsed
        .get("errorMessage")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    (error_type, error_message)
}

async fn invocation_error(
    State(shared): State<Arc<RuntimeShared>>,
    Path(request_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (error_type, error_message) = error_parts(&headers, &body);
    finish(
        &shared,
        &request_id,
        InvocationOutcome::Error {
            error_type,
            error_message,
        },
    )
}

async fn init_error(
    State(shared): State<Arc<RuntimeShared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parts = error_parts(&headers, &body);
    let mut state = shared.state();
    state.init_error = Some(parts.clone());
    // An init error fails whatever was handed out; queued events wait for a new process.
    let in_flight = std::mem::take(&mut state.in_flight);
    for (_, reply) in in_flight {
        let _ = reply.send(InvocationOutcome::Error {
            error_type: parts.0.clone(),
            error_message: parts.1.clone(),
        });
    }
    accepted()
}

async fn extension_register(State(shared): State<Arc<RuntimeShared>>) -> Response {
    let name = shared
        .state()
        .spec
        .as_ref()
        .map(|s| s.name.clone())
        .unwrap_or_default();
    let mut headers = HeaderMap::new();
    headers.insert(
        "Lambda-Extension-Identifier",
        header(&crate::aws::uuid_v4()),
    );
    (
        StatusCode::OK,
        headers,
        axum::Json(json!({
            "functionName": name,
            "functionVersion": "$LATEST",
            "handler": "bootstrap"
        })),
    )
        .into_response()
}

/// Extensions that subscribe to nothing wait here until their process goes away.
async fn extension_next(State(shared): State<Arc<RuntimeShared>>) -> Response {
    let mut wake = shared.wake.subscribe();
    let generation = shared.state().generation;
    while shared.state().generation == generation {
        if wake.changed().await.is_err() {
            break;
        }
    }
    let deadline_ms = jiff::Timestamp::now().as_millisecond() + 2000;
    axum::Json(json!({
        "eventType": "SHUTDOWN",
        "shutdownReason": "spindown",
        "deadlineMs": deadline_ms
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_give_type_and_message() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "Lambda-Runtime-Function-Error-Type",
            HeaderValue::from_static("Runtime.HandlerError"),
        );
        assert_eq!(
            error_parts(
                &headers,
                br#"{"errorType":"DrainError","errorMessage":"boom"}"#
            ),
            ("DrainError".to_owned(), "boom".to_owned())
        );
        assert_eq!(
            error_parts(&headers, b"plain"),
            ("Runtime.HandlerError".to_owned(), "plain".to_owned())
        );
    }

    #[test]
    fn the_environment_is_lambdas() {
        let spec = FunctionSpec::new("terminating-hook", "/bin/true").memory_mb(256);
        let env: BTreeMap<String, String> = lambda_environment(&spec, "127.0.0.1:9001")
            .into_iter()
            .collect();
        assert_eq!(env["AWS_LAMBDA_RUNTIME_API"], "127.0.0.1:9001");
        assert_eq!(env["AWS_LAMBDA_FUNCTION_NAME"], "terminating-hook");
        assert_eq!(env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"], "256");
        assert_eq!(env["AWS_LAMBDA_FUNCTION_VERSION"], "$LATEST");
        assert_eq!(env["AWS_REGION"], "eu-west-1");
        assert_eq!(
            spec.function_arn(),
            "arn:aws:lambda:eu-west-1:111111111111:function:terminating-hook"
        );
    }

    /// Compile-time check: the sandbox drives invocations from spawned tasks.
    #[allow(dead_code)]
    fn invocations_can_run_on_spawned_tasks(api: &LambdaRuntimeApi, event: &Value) {
        fn send<T: Send>(_: T) {}
        send(api.invoke(event, Duration::ZERO));
        send(api.kill());
        send(api.restart());
    }

    #[test]
    fn trace_ids_have_the_x_ray_shape() {
        let id = trace_id();
        assert!(id.starts_with("Root=1-"));
        assert!(id.contains(";Parent="));
    }
}
