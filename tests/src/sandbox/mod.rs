//! The local sandbox: the whole node lifecycle on a simulated EKS cluster and AWS.
//!
//! It starts the fake API server (HTTPS, EKS authentication, the shipped RBAC) and the fake
//! AWS endpoints, seeds a cluster from a [`Scenario`], runs the **built function binaries**
//! through the local Lambda Runtime API exactly as Lambda would (SNS deliveries from the
//! Auto Scaling hooks, EventBridge events for node groups), and checks that every step had
//! the effect it should. The functions find the cluster with `DescribeCluster` and sign real
//! EKS tokens; nothing in them knows it is not talking to AWS.

mod functions;
mod report;
pub mod scenario;
mod seeding;
mod serving;
pub mod steps;
pub mod timeline;
mod world;

use std::time::Duration;

pub use functions::refresh_rule;
pub use scenario::Scenario;
pub use timeline::{Source, Timeline, TimelineEntry};
pub use world::{FUNCTIONS, Sandbox};

/// Something about the sandbox itself went wrong (not a failed expectation).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("scenario: {0}")]
    Scenario(String),
    #[error("could not set the sandbox up: {0}")]
    Setup(String),
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct SandboxReport {
    /// Expectations that held.
    pub passed: Vec<String>,
    /// Expectations that did not hold: the run failed.
    pub failed: Vec<String>,
    pub elapsed: Duration,
}

impl SandboxReport {
    pub fn succeeded(&self) -> bool {
        self.failed.is_empty() && !self.passed.is_empty()
    }
}

/// Plays `scenario` from start to end and reports; prints the timeline while it runs when
/// `echo` is set.
pub async fn run(scenario: Scenario, echo: bool) -> Result<SandboxReport, SandboxError> {
    let sandbox = Sandbox::start(scenario, echo).await?;
    let report = sandbox.play().await;
    if echo {
        sandbox.print_final_state();
    }
    sandbox.shutdown().await;
    Ok(report)
}
