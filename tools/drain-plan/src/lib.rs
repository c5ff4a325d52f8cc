//! `drain-plan`: what the terminating hook's drain of a node would do if it started now.
//!
//! It reads the node, its pods and their namespaces' PodDisruptionBudgets (get and list only),
//! plans them with the drain's own planning code ([`node_manager::drain::plan`]: the same
//! tiers, the same pods left alone) and the drain's own budget matching
//! ([`node_manager::drain::budgets`]), and adds what the drain cannot know in advance: which
//! budgets would refuse now, how many waves the budgets allow, and whether the drain would
//! reach its deadline. The drain's settings are read from the same environment variables
//! with the same defaults (`DRAIN_TIMEOUT_SECONDS`, `EVICTION_CONCURRENCY`, ...). With
//! `--load-balancers-of CLUSTER` it also asks Elastic Load Balancing, as the drain does
//! ([`node_manager::drain::load_balancers`]), which of the cluster's load balancers route to
//! the node's instance.

pub mod load_balancers;
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
                  POD_GRACE_PERIOD_SECONDS, STUCK_POD_SECONDS, VOLUME_DETACH_SECONDS) with the \
                  drain's defaults. Needs get/list on nodes, pods and poddisruptionbudgets, list on \
                  volumeattachments and get on persistentvolumeclaims only; with \
                  --load-balancers-of, AWS credentials allowed the Elastic Load Balancing reads \
                  the terminating hook makes."
)]
pub struct Args {
    /// The node's name, or its EC2 instance id (i-...), found through the node's providerID.
    pub node: String,
    /// Also ask Elastic Load Balancing (AWS credentials and region from the environment)
    /// which of this cluster's target groups and classic load balancers route to the node's
    /// instance, as the drain waits for them.
    #[arg(long, value_name = "CLUSTER")]
    pub load_balancers_of: Option<String>,
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
    #[error("cannot read the load balancers: {0}")]
    LoadBalancers(String),
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
    let mut snapshot = Snapshot::gather(&client, &target).await?;
    if let Some(cluster) = &args.load_balancers_of {
        snapshot.load_balancers = Some(load_balancers::routing_to(&snapshot.node, cluster).await?);
    }
    let preview = preview(&snapshot, &settings, jiff::Timestamp::now());
    Ok(match args.output {
        Output::Table => render::table(&preview),
        Output::Json => render::json(&preview),
    })
}
