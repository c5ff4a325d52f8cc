//! `fake-eks`: a fake EKS cluster (Kubernetes API server) and fake AWS endpoints on this
//! machine, for trying the functions and kubectl by hand.
//!
//! Starts both fakes from a scenario file, writes a kubeconfig whose user runs the `eks-token`
//! exec plugin (signing as the cluster creator, so kubectl is admin as on a new EKS cluster),
//! prints the environment each function role needs, then serves until Ctrl-C.
//!
//! `cargo run -p node-manager-testkit --bin fake-eks -- [--scenario FILE] [--audit]`
//!
//! Scenario (YAML, every field optional):
//! ```yaml
//! clusterName: ironman-2022
//! authenticationMode: API_AND_CONFIG_MAP   # or CONFIG_MAP, API
//! realTime: false                          # true: real grace periods and start delays
//! roles: [terminating-hook, launching-hook, nodegroup-auth]   # credentials issued per role
//! manifests: [../infra/rbac.yaml]          # applied to the store (paths relative to the file)
//! nodes:                                   # registered, Ready after readyAfterMs
//!   - name: ip-10-0-1-1.eu-west-1.compute.internal
//!     providerId: aws:///eu-west-1a/i-0123456789abcdef0
//!     readyAfterMs: 0
//! objects: |                               # more manifests, inline
//!   apiVersion: v1
//!   kind: Namespace
//!   metadata: {name: shop}
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use node_manager_testkit::account::{FakeAccount, FakeCredentials};
use node_manager_testkit::aws::{FakeAws, FakeCluster};
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use serde::Deserialize;

#[derive(Parser)]
#[command(about = "Runs a fake EKS cluster and fake AWS endpoints until Ctrl-C")]
struct Args {
    /// Scenario file (YAML); an empty cluster when absent.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Where to write the kubeconfig.
    #[arg(long, default_value = "fake-eks.kubeconfig")]
    kubeconfig: PathBuf,
    /// The `eks-token` command the kubeconfig's exec plugin runs.
    #[arg(long, default_value = "eks-token")]
    eks_token: String,
    /// Print every API request (one audit line each) as it happens.
    #[arg(long)]
    audit: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct Scenario {
    cluster_name: Option<String>,
    authentication_mode: Option<String>,
    real_time: bool,
    roles: Vec<String>,
    manifests: Vec<PathBuf>,
    nodes: Vec<NodeSpec>,
    objects: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeSpec {
    name: String,
    provider_id: Option<String>,
    ready_after_ms: Option<u64>,
}

/// The role whose credentials the kubeconfig signs with: the cluster creator.
const CREATOR_ROLE: &str = "fake-eks-cluster-creator";

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fake-eks: {message}");
            ExitCode::FAILURE
        }
    }
}

fn read_scenario(path: Option<&Path>) -> Result<(Scenario, PathBuf), String> {
    let Some(path) = path else {
        return Ok((Scenario::default(), PathBuf::from(".")));
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let scenario: Scenario =
        serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let base = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    Ok((scenario, base))
}

fn exports(variables: &[(String, String)]) -> String {
    variables
        .iter()
        .map(|(name, value)| format!("export {name}='{value}'\n"))
        .collect()
}

async fn run(args: Args) -> Result<(), String> {
    let (scenario, base) = read_scenario(args.scenario.as_deref())?;
    let cluster_name = scenario
        .cluster_name
        .clone()
        .unwrap_or_else(|| "ironman-2022".to_owned());
    let account = FakeAccount::reference();
    let creator = account.add_role_credentials(CREATOR_ROLE);
    let aws = FakeAws::start(account.clone())
        .await
        .map_err(|e| format!("starting the fake AWS endpoints: {e}"))?;
    let timings = if scenario.real_time {
        SimulationTimings::real_time()
    } else {
        SimulationTimings::default()
    };
    let server = FakeApiServer::builder()
        .cluster_name(&cluster_name)
        .account(account.clone())
        .access_entries(Arc::new(aws.eks()))
        .cluster_creator(&creator.principal_arn)
        .simulation(timings)
        .start()
        .await
        .map_err(|e| format!("starting the fake API server: {e}"))?;
    aws.eks().add_cluster(
        FakeCluster::new(&cluster_name, server.url(), &server.ca_data())
            .authentication_mode(Some(
                scenario
                    .authentication_mode
                    .as_deref()
                    .unwrap_or("API_AND_CONFIG_MAP"),
            ))
            .status("ACTIVE"),
    );

    for manifest in &scenario.manifests {
        let path = base.join(manifest);
        let applied = server
            .apply_manifest_file(&path)
            .map_err(|e| e.to_string())?;
        println!("# applied {applied} objects from {}", path.display());
    }
    if let Some(objects) = &scenario.objects {
        server
            .store()
            .apply_yaml(objects)
            .map_err(|e| format!("objects: {e}"))?;
    }
    for node in &scenario.nodes {
        let provider_id = node
            .provider_id
            .clone()
            .unwrap_or_else(|| format!("aws:///{}a/i-0123456789abcdef0", account.region));
        server
            .register_node(
                &node.name,
                &provider_id,
                node.ready_after_ms.map(Duration::from_millis),
            )
            .map_err(|e| format!("node {}: {e}", node.name))?;
    }

    let kubeconfig = server.kubeconfig_yaml_with_user(&exec_user(
        &args.eks_token,
        &cluster_name,
        &account.region,
        &creator,
        &aws.endpoint_url(),
    ));
    std::fs::write(&args.kubeconfig, kubeconfig)
        .map_err(|e| format!("writing {}: {e}", args.kubeconfig.display()))?;

    println!("# fake EKS cluster {cluster_name:?} is running");
    println!(
        "# Kubernetes API: {}   AWS endpoints: {}",
        server.url(),
        aws.endpoint_url()
    );
    println!(
        "export KUBECONFIG='{}'   # kubectl as the cluster creator (system:masters), via {}",
        absolute(&args.kubeconfig).display(),
        args.eks_token
    );
    let cluster_variables = vec![
        ("CLUSTER_NAME".to_owned(), cluster_name.clone()),
        ("CLUSTER_ENDPOINT".to_owned(), server.url().to_owned()),
        ("CLUSTER_CA_DATA".to_owned(), server.ca_data()),
    ];
    for role in &scenario.roles {
        let credentials = account.add_role_credentials(role);
        println!(
            "\n# environment of a function running as {}",
            credentials.principal_arn
        );
        print!("{}", exports(&cluster_variables));
        print!("{}", exports(&aws.environment(&credentials)));
    }
    if scenario.roles.is_empty() {
        println!(
            "\n# environment of a function (add `roles:` to the scenario for AWS credentials)"
        );
        print!("{}", exports(&cluster_variables));
    }
    println!("\n# Ctrl-C to stop");

    let mut audit = server.audit().subscribe();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            event = audit.recv(), if args.audit => match event {
                Ok(event) => println!("{}", event.line()),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    println!("# ... {missed} audit events not shown");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
        }
    }
    Ok(())
}

fn absolute(path: &Path) -> PathBuf {
    std::env::current_dir()
        .map(|dir| dir.join(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// A kubeconfig `user:` block running `eks-token` with the creator's credentials against
/// the fake STS-less verifier (the token is checked by the fake API server itself).
fn exec_user(
    command: &str,
    cluster_name: &str,
    region: &str,
    credentials: &FakeCredentials,
    aws_endpoint: &str,
) -> String {
    let mut env = vec![
        ("AWS_ACCESS_KEY_ID", credentials.access_key_id.clone()),
        (
            "AWS_SECRET_ACCESS_KEY",
            credentials.secret_access_key.clone(),
        ),
        ("AWS_REGION", region.to_owned()),
        ("AWS_ENDPOINT_URL", aws_endpoint.to_owned()),
    ];
    if let Some(token) = &credentials.session_token {
        env.push(("AWS_SESSION_TOKEN", token.clone()));
    }
    let env: String = env
        .iter()
        .map(|(name, value)| format!("      - name: {name}\n        value: \"{value}\"\n"))
        .collect();
    format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: {command}\n      args: [\"--cluster-name\", \"{cluster_name}\", \"--region\", \"{region}\"]\n      interactiveMode: Never\n      env:\n{env}"
    )
}
