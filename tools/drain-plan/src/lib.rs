//! `drain-plan`: what the terminating hook's drain of a node would do if it started now.
//!
//! It reads the node, its pods and their namespaces' PodDisruptionBudgets (get and list only),
//! plans them with the drain's own planning code ([`node_manager::drain::plan`]: the same
//! tiers, the same pods left alone) and the drain's own budget matching
//! ([`node_manager::drain::budgets`]), and adds what the drain cannot know in advance: which
//! budgets would refuse now, how many waves the budgets allow, and whether the drain would
//! reach its deadline. The drain's settings are read from the same environment variables
//! with the same defaults (`DRAIN_TIMEOUT_SECONDS`, `EVICTION_CONCURRENCY`, ...).

pub mod preview;
pub mod render;
pub mod snapshot;

use node_manager::lifecycle::settings::DrainSettings;
use node_manager::settings::{SettingsError, SettingsSource};

pub use preview::{Preview, preview};
pub use snapshot::{Snapshot, SnapshotError};

/// `kubectl drain-plan NODE [-o table|json]`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "kubectl-drain_plan",
    version,
    about = "What a drain of NODE by open-node-manager's terminating hook would do, now",
    after_help = "Reads the standard kubeconfig (KUBECONFIG, ~/.kube/config, or in-cluster) and \
                  the drain's settings from the environment (DRAIN_TIMEOUT_SECONDS, \
                  EVICTION_CONCURRENCY, SETTLE_SECONDS, DRAIN_FORCE, DRAIN_TIMEOUT_RESULT, \
                  POD_GRACE_PERIOD_SECONDS, STUCK_POD_SECONDS) with the drain's defaults. \
                  Needs get/list on nodes, pods and poddisruptionbudgets only."
)]
pub struct Args {
    /// The node's name, or its EC2 instance id (i-...), found through the node's providerID.
    pub node: String,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Settings(#[from] SettingsError),
    #[error("cannot load the kubeconfig: {0}")]
    Kubeconfig(String),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
}

/// The drain's settings from the process environment, with the drain's defaults.
pub fn drain_settings() -> Result<DrainSettings, SettingsError> {
    DrainSettings::from_source(&PlanEnvironment)
}

/// The process environment, where the cluster name the hooks require may be missing: the
/// plan does not depend on it.
struct PlanEnvironment;

impl SettingsSource for PlanEnvironment {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name)
            .ok()
            .or_else(|| (name == "CLUSTER_NAME").then(|| "drain-plan".to_owned()))
    }
}

/// Reads the cluster and prints the plan in the chosen format.
pub async fn run(args: &Args) -> Result<String, PlanError> {
    let settings = drain_settings()?;
    let target = snapshot::Target::parse(&args.node)?;
    let client = kube::Client::try_default()
        .await
        .map_err(|e| PlanError::Kubeconfig(e.to_string()))?;
    let snapshot = Snapshot::gather(&client, &target).await?;
    let preview = preview(&snapshot, &settings, jiff::Timestamp::now());
    Ok(match args.output {
        Output::Table => render::table(&preview),
        Output::Json => render::json(&preview),
    })
}
