//! The end-to-end scenarios on the real control plane, one home each: `sandbox
//! --real-control-plane` plays them in sequence ([`play_all`]), and each real-plane test plays
//! one ([`play_as_test`]) and fails unless every expectation held.
//!
//! A scenario starts its own [`RealFunctionWorld`](super::world::RealFunctionWorld) (a fresh
//! plane, about 3 s): the scenarios seed workloads that would meet on one cluster, and each
//! reads the whole audit log of its plane. It prints what happened as it goes (its timeline)
//! and returns its named expectations; a step it cannot take (the plane does not start, a
//! seeded workload never becomes Ready) is an error instead.

pub mod drain;
pub mod identity;
pub mod nginx;
pub mod nodegroup_auth;
pub mod refresh;
pub mod repair;
pub mod spot;
pub mod volumes;
pub mod warm_pool;

use std::fmt::Display;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::world::RealFunctionWorld;
use super::{ControlPlaneError, KUBERNETES_VERSION};
use crate::aws::SnsSubscription;
use crate::e2e::RunningFunction;
use crate::lambda_api::InvocationOutcome;

/// One scenario of the real plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealScenario {
    NodegroupAuth,
    Drain,
    Spot,
    WarmPool,
    Repair,
    Refresh,
    Volumes,
}

impl RealScenario {
    /// Every scenario, in the order `sandbox --real-control-plane` plays them (a node's life:
    /// it joins, is drained (its volumes too), interrupted, parked in a warm pool, repaired, replaced).
    pub const ALL: [Self; 7] = [
        Self::NodegroupAuth,
        Self::Drain,
        Self::Volumes,
        Self::Spot,
        Self::WarmPool,
        Self::Repair,
        Self::Refresh,
    ];

    /// The name `sandbox --only` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::NodegroupAuth => "nodegroup-auth",
            Self::Drain => "drain",
            Self::Spot => "spot",
            Self::WarmPool => "warm-pool",
            Self::Repair => "repair",
            Self::Refresh => "refresh",
            Self::Volumes => "volumes",
        }
    }

    /// What it plays, for its header.
    pub fn description(self) -> &'static str {
        match self {
            Self::NodegroupAuth => {
                "nodegroup-auth maps a new node group's role: its node's EKS token authenticates"
            }
            Self::Drain => {
                "a scale-in drains a node through a PDB; the ReplicaSet controller and kube-scheduler move the pods"
            }
            Self::Spot => "a Spot interruption warning drains the node once, within two minutes",
            Self::WarmPool => {
                "a node parked in the warm pool gets its drain undone when it returns"
            }
            Self::Repair => {
                "a node whose kubelet died on an impaired instance gets the out-of-service taint; the plane frees its pods and volume; it is replaced and drained"
            }
            Self::Refresh => {
                "an instance refresh of 4 nodes, kube-scheduler placing the evicted pods, with and without instance-refresh"
            }
            Self::Volumes => {
                "a drain completes once its pods' volumes are detached, not waiting for a DaemonSet's, and its target group let go of the instance"
            }
        }
    }

    /// Plays the scenario on a fresh plane from the binaries in `bin`.
    pub async fn play(self, bin: &Path) -> Result<Played, ControlPlaneError> {
        match self {
            Self::NodegroupAuth => nodegroup_auth::play(bin).await,
            Self::Drain => drain::play(bin).await,
            Self::Spot => spot::play(bin).await,
            Self::WarmPool => warm_pool::play(bin).await,
            Self::Repair => repair::play(bin).await,
            Self::Refresh => refresh::play(bin).await,
            Self::Volumes => volumes::play(bin).await,
        }
    }
}

impl FromStr for RealScenario {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|s| s.name() == name.trim())
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|s| s.name()).collect();
                format!(
                    "unknown scenario `{name}`; the scenarios are {}",
                    known.join(", ")
                )
            })
    }
}

/// An expectation of a scenario: what should hold, whether it did, and what was seen (shown
/// when it did not hold).
#[derive(Debug, Clone)]
pub struct Expectation {
    pub what: String,
    pub held: bool,
    pub detail: String,
}

/// What a scenario printed and its expectations.
#[derive(Debug, Default)]
pub struct Played {
    pub timeline: Vec<String>,
    pub expectations: Vec<Expectation>,
}

impl Played {
    /// A scenario's record, starting with the line saying its world's plane is ready.
    pub fn on(w: &RealFunctionWorld) -> Self {
        let mut played = Self::default();
        played.line(format!(
            "real control plane {KUBERNETES_VERSION} ready in {:.1} s ({})",
            w.plane.ready_after().as_secs_f64(),
            w.plane.url()
        ));
        played
    }

    /// Prints a line of what happened, and keeps it.
    pub fn line(&mut self, text: impl Into<String>) {
        let text = text.into();
        println!("  {text}");
        self.timeline.push(text);
    }

    /// Records an expectation; `detail` is what was seen.
    pub fn expect(&mut self, what: impl Into<String>, held: bool, detail: impl Display) {
        self.expectations.push(Expectation {
            what: what.into(),
            held,
            detail: detail.to_string(),
        });
    }

    /// Whether every expectation held (and there was one at least).
    pub fn held(&self) -> bool {
        !self.expectations.is_empty() && self.expectations.iter().all(|e| e.held)
    }

    /// The expectations that did not hold.
    pub fn failed(&self) -> Vec<&Expectation> {
        self.expectations.iter().filter(|e| !e.held).collect()
    }

    /// Prints ✓ or ✗ per expectation, with what was seen under each ✗.
    pub fn print_expectations(&self) {
        for e in &self.expectations {
            println!("{} {}", if e.held { "✓" } else { "✗" }, e.what);
            if !e.held {
                println!("    {}", e.detail.replace('\n', "\n    "));
            }
        }
    }

    /// Panics naming every expectation that did not hold, with what was seen.
    pub fn assert_held(&self, scenario: &str) {
        self.print_expectations();
        let failed: Vec<String> = self
            .failed()
            .iter()
            .map(|e| format!("✗ {}\n    {}", e.what, e.detail.replace('\n', "\n    ")))
            .collect();
        assert!(
            self.held(),
            "{scenario}: {} of {} expectations did not hold:\n{}",
            failed.len(),
            self.expectations.len(),
            failed.join("\n")
        );
    }
}

/// For a real-plane test: plays `scenario` (unless the plane is not built and skipping is
/// asked for, see [`binaries_or_skip`](super::binaries_or_skip)) and panics unless every
/// expectation held.
pub async fn play_as_test(test: &str, scenario: RealScenario) {
    let Some(bin) = super::binaries_or_skip(test) else {
        return;
    };
    match scenario.play(&bin).await {
        Ok(played) => played.assert_held(scenario.name()),
        Err(error) => panic!("{}: {error}", scenario.name()),
    }
}

/// Plays `scenarios` one after the other, each under its header, then a summary; true when
/// every expectation of every scenario held. A scenario that could not be played counts as
/// failed and the next one still plays.
pub async fn play_all(scenarios: &[RealScenario], bin: &Path) -> bool {
    let mut summary = Vec::new();
    for scenario in scenarios {
        println!("\n── {}: {}", scenario.name(), scenario.description());
        let started = Instant::now();
        let outcome = scenario.play(bin).await;
        let took = started.elapsed();
        let line = match &outcome {
            Ok(played) => {
                played.print_expectations();
                let held = played.expectations.iter().filter(|e| e.held).count();
                let mark = if played.held() { "✓" } else { "✗" };
                format!(
                    "{mark} {}: {held} of {} expectations held",
                    scenario.name(),
                    played.expectations.len()
                )
            }
            Err(error) => {
                println!("✗ could not be played: {error}");
                format!("✗ {}: could not be played", scenario.name())
            }
        };
        let held = outcome.as_ref().is_ok_and(Played::held);
        summary.push((format!("{line} ({:.1} s)", took.as_secs_f64()), held));
    }
    println!("\nsummary:");
    for (line, _) in &summary {
        println!("{line}");
    }
    summary.iter().all(|(_, held)| *held)
}

/// The function's response to `event`; an error (with the process's output) when it answered
/// with an error or not at all.
pub async fn response(
    function: &RunningFunction,
    event: &Value,
) -> Result<Value, ControlPlaneError> {
    response_within(function, event, RunningFunction::INVOKE_TIMEOUT).await
}

/// [`response`] with the function's timeout `timeout` (a drain that waits out real grace
/// periods needs the template's, not a test's).
pub async fn response_within(
    function: &RunningFunction,
    event: &Value,
    timeout: Duration,
) -> Result<Value, ControlPlaneError> {
    match function.runtime.invoke(event, timeout).await {
        Ok(InvocationOutcome::Response(value)) => Ok(value),
        other => Err(ControlPlaneError::setup(
            function.target.function_name(),
            format!(
                "expected a response, got {other:?}\n--- function output ---\n{}",
                function.runtime.output()
            ),
        )),
    }
}

/// The next lifecycle notification on `topic` (at most 5 s away).
pub async fn next_notification(topic: &mut SnsSubscription) -> Result<Value, ControlPlaneError> {
    topic
        .next_event(Duration::from_secs(5))
        .await
        .ok_or_else(|| ControlPlaneError::setup("the lifecycle notification", "none within 5 s"))
}

/// The environment that scales a drain's pauses down to a test's: the settle pause and the
/// eviction back-off (the functions' defaults are for a cluster, seconds to minutes).
pub const QUICK_DRAIN: [(&str, &str); 3] = [
    ("SETTLE_SECONDS", "0.1"),
    ("EVICTION_BACKOFF_SECONDS", "0.1"),
    ("EVICTION_BACKOFF_MAX_SECONDS", "0.5"),
];

/// Waits (at most `timeout`, every 50 ms) until `condition` holds; `false` on a timeout.
pub async fn eventually<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !condition().await {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_is_found_by_its_name() {
        for scenario in RealScenario::ALL {
            assert_eq!(scenario.name().parse::<RealScenario>(), Ok(scenario));
        }
    }

    #[test]
    fn an_unknown_name_is_refused_naming_the_scenarios() {
        let error = "drian".parse::<RealScenario>().expect_err("not a scenario");
        assert!(error.contains("unknown scenario `drian`"), "{error}");
        assert!(error.contains("nodegroup-auth, drain, volumes, spot, warm-pool, repair, refresh"));
    }

    #[test]
    fn a_scenario_without_expectations_did_not_hold() {
        let mut played = Played::default();
        assert!(!played.held());
        played.expect("one", true, "");
        assert!(played.held());
        played.expect("two", false, "seen");
        assert!(!played.held());
        assert_eq!(played.failed().len(), 1);
    }
}
