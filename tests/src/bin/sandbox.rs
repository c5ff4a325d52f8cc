//! `sandbox`: the whole node lifecycle on a simulated EKS cluster and AWS, in one command.
//!
//! `cargo run -p node-manager-testkit --bin sandbox [-- --scenario FILE] [--serve]`, or
//! `-- --real-control-plane [--only NAME,...]` for the end-to-end scenarios on a real
//! Kubernetes control plane (node group auth, the drain with PDB waves, Spot, warm pool,
//! repair, instance refresh; see `control_plane::scenarios`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use node_manager_testkit::binaries;
use node_manager_testkit::control_plane::scenarios::{self, RealScenario};
use node_manager_testkit::sandbox::{self, Sandbox, Scenario};

#[derive(Parser)]
#[command(
    about = "Plays the node lifecycle (node group auth, launch, drain) on a simulated EKS cluster, or its end-to-end scenarios on a real Kubernetes control plane"
)]
struct Args {
    /// A scenario file (YAML); the reference scenario when absent. See tests/scenarios/.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// After the scenario, keep the fakes running and print how to reach them.
    #[arg(long)]
    serve: bool,
    /// Play the end-to-end scenarios on a real Kubernetes control plane instead, one after
    /// the other, each on a fresh plane: nodegroup-auth, drain (a PDB's waves, the real
    /// ReplicaSet controller and kube-scheduler moving the pods), spot, warm-pool, repair,
    /// refresh (4 nodes, with and without instance-refresh). Exits non-zero when an
    /// expectation did not hold. Needs `scripts/control-plane.sh build` first.
    #[arg(long, conflicts_with_all = ["scenario", "serve"])]
    real_control_plane: bool,
    /// With --real-control-plane: play only these scenarios (repeat the option or separate
    /// names with commas), in the order given.
    #[arg(
        long,
        value_name = "NAME",
        value_delimiter = ',',
        requires = "real_control_plane"
    )]
    only: Vec<RealScenario>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The function binaries the sandbox runs are built here, in the open, before anything
    // starts: on a first run that is the only wait after cargo built the sandbox itself.
    if let Err(error) = binaries::build_for_sandbox(binaries::SANDBOX_BINARIES) {
        eprintln!("sandbox: {error}");
        return ExitCode::from(2);
    }
    if args.real_control_plane {
        return exit_code(real_control_plane(&args.only).await);
    }
    let scenario = match &args.scenario {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| sandbox::SandboxError::Scenario(format!("{}: {e}", path.display())))
            .and_then(|text| Scenario::from_yaml(&text)),
        None => Scenario::reference(),
    };
    let result = match scenario {
        Ok(scenario) => play(scenario, args.serve).await,
        Err(error) => Err(error),
    };
    exit_code(result)
}

/// Plays `only` (every scenario when empty) on the real plane.
async fn real_control_plane(only: &[RealScenario]) -> Result<bool, String> {
    let bin = node_manager_testkit::control_plane::built_binaries().map_err(|e| e.to_string())?;
    let selected = if only.is_empty() {
        &RealScenario::ALL[..]
    } else {
        only
    };
    Ok(scenarios::play_all(selected, &bin).await)
}

fn exit_code<E: std::fmt::Display>(result: Result<bool, E>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("sandbox: some expectations did not hold (see ✗ above)");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("sandbox: {error}");
            ExitCode::from(2)
        }
    }
}

async fn play(scenario: Scenario, serve: bool) -> Result<bool, sandbox::SandboxError> {
    let sandbox = Sandbox::start(scenario, true).await?;
    let report = sandbox.play().await;
    sandbox.print_final_state();
    if serve {
        let kubeconfig = std::env::temp_dir().join("open-node-manager-sandbox.kubeconfig");
        sandbox.write_kubeconfig(&kubeconfig)?;
        println!("\n{}", sandbox.describe_for_serving(&kubeconfig));
        let _ = tokio::signal::ctrl_c().await;
    }
    sandbox.shutdown().await;
    Ok(report.succeeded())
}
