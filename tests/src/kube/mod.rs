//! A faithful fake Kubernetes API server, as EKS serves it.
//!
//! Real clients (`kube::Client`, kubectl) talk to it over HTTPS with a CA it generates; it
//! authenticates EKS tokens (or a per-server admin token), authorizes with RBAC from the
//! objects it stores, serves the verbs with the real semantics (conflicts, graceful deletion,
//! selectors, pagination, watches, evictions with PDBs), emulates the kubelet and the
//! controllers that make a drain progress, records an audit log, and injects faults.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use node_manager_testkit::kube::FakeApiServer;
//! let server = FakeApiServer::builder().cluster_name("ironman-2022").start().await?;
//! let client = server.admin_client().await?;
//! # let _ = client; Ok(()) }
//! ```

// Pure Kubernetes semantics (no I/O), used by the fake API server.
pub mod disruption;
pub mod eviction;
pub mod rbac;
pub mod selectors;
pub mod strategic_merge;

// The server.
mod api;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod discovery;
pub mod disruption_log;
mod event_views;
mod eviction_api;
pub mod faults;
pub mod fields;
mod paging;
pub mod patch;
pub mod resources;
mod reviews;
pub mod simulation;
pub mod status;
pub mod store;
mod table;
pub mod tls;
mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::Rng as _;
use tokio::net::TcpListener;

pub use self::audit::{AuditEvent, AuditLog};
pub use self::authn::UserInfo;
pub use self::disruption_log::{
    BudgetCounts, DisruptionLog, EvictionOutcome, EvictionRecord, EvictionTally, PodDeletionRecord,
    Requester,
};
pub use self::faults::{FaultAction, FaultId, FaultRule, Faults, RateLimit};
pub use self::simulation::{
    NODE_ALLOCATABLE, NODE_CAPACITY, NodeResources, REPORTED_IMAGE_BYTES, Simulation,
    SimulationTimings, StepTimes,
};
pub use self::status::ApiError;
pub use self::store::{Store, StoreError};
pub use crate::account::FakeAccount;

use self::api::ServerState;
use self::authn::Authenticator;
use self::tls::{ClusterCertificates, TlsError};
use crate::account::AccessEntryLookup;
use crate::aws::FakeEc2;

/// Why the server could not start or a helper failed.
#[derive(Debug, thiserror::Error)]
pub enum FakeApiServerError {
    #[error("binding the fake API server to 127.0.0.1 failed: {0}")]
    Bind(#[source] std::io::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("writing the kubeconfig {path} failed: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("building a kube client for the fake API server failed: {0}")]
    Client(String),
    #[error("reading the manifest {path} failed: {source}")]
    Manifest {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Configures a [`FakeApiServer`].
pub struct FakeApiServerBuilder {
    cluster_name: String,
    account: FakeAccount,
    access_entries: Option<Arc<dyn AccessEntryLookup>>,
    ec2: Option<FakeEc2>,
    plain_http: bool,
    timings: SimulationTimings,
    bookmark_interval: Duration,
    fault_seed: u64,
    store: Option<Store>,
    cluster_creator_arn: Option<String>,
}

impl FakeApiServerBuilder {
    pub fn cluster_name(mut self, name: &str) -> Self {
        self.cluster_name = name.to_owned();
        self
    }

    pub fn account(mut self, account: FakeAccount) -> Self {
        self.account = account;
        self
    }

    /// EKS access entries, consulted before the `aws-auth` ConfigMap.
    pub fn access_entries(mut self, lookup: Arc<dyn AccessEntryLookup>) -> Self {
        self.access_entries = Some(lookup);
        self
    }

    /// The fake EC2, for `{{EC2PrivateDNSName}}` in a mapping (as EKS resolves it).
    pub fn ec2(mut self, ec2: FakeEc2) -> Self {
        self.ec2 = Some(ec2);
        self
    }

    /// Serve plain HTTP instead of HTTPS.
    pub fn plain_http(mut self, plain: bool) -> Self {
        self.plain_http = plain;
        self
    }

    pub fn simulation(mut self, timings: SimulationTimings) -> Self {
        self.timings = timings;
        self
    }

    /// How often watches with `allowWatchBookmarks` get a BOOKMARK (default 60 s, kube-apiserver's
    /// "roughly every minute"; one comes two seconds before a watch's deadline too).
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// Seed of the fault injector's random generator.
    pub fn fault_seed(mut self, seed: u64) -> Self {
        self.fault_seed = seed;
        self
    }

    /// The IAM principal that created the cluster: like EKS, its tokens authenticate as
    /// `kubernetes-admin` in `system:masters` with no access entry or aws-auth mapping.
    pub fn cluster_creator(mut self, principal_arn: &str) -> Self {
        self.cluster_creator_arn = Some(principal_arn.to_owned());
        self
    }

    /// Serve an existing store (e.g. prepared before the server starts).
    pub fn store(mut self, store: Store) -> Self {
        self.store = Some(store);
        self
    }

    /// Binds `127.0.0.1:0` and starts serving and the emulation.
    pub async fn start(self) -> Result<FakeApiServer, FakeApiServerError> {
        let certificates = ClusterCertificates::generate()?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(FakeApiServerError::Bind)?;
        let address = listener.local_addr().map_err(FakeApiServerError::Bind)?;
        let scheme = if self.plain_http { "http" } else { "https" };
        let url = format!("{scheme}://{address}");
        let admin_token = format!(
            "fake-admin-{}",
            hex::encode(rand::rng().random::<[u8; 16]>())
        );
        let store = self.store.unwrap_or_default();
        let audit = AuditLog::default();
        let disruptions = DisruptionLog::default();
        let faults = Faults::with_seed(self.fault_seed);
        let (shutdown_sender, shutdown) = tokio::sync::watch::channel(false);
        let static_tokens: Arc<RwLock<HashMap<String, UserInfo>>> = Arc::default();
        let state = Arc::new(ServerState {
            store: store.clone(),
            audit: audit.clone(),
            disruptions: disruptions.clone(),
            faults: faults.clone(),
            authn: Authenticator {
                cluster_name: self.cluster_name.clone(),
                account: self.account.clone(),
                access_entries: self.access_entries,
                admin_token: admin_token.clone(),
                store: store.clone(),
                static_tokens: static_tokens.clone(),
                cluster_creator_arn: self.cluster_creator_arn,
                ec2: self.ec2,
            },
            bookmark_interval: self.bookmark_interval,
            server_address: address.to_string(),
            shutdown: shutdown.clone(),
        });
        let tls = (!self.plain_http)
            .then(|| tokio_rustls::TlsAcceptor::from(certificates.server_config.clone()));
        let connections = Arc::new(AtomicU64::new(0));
        tokio::spawn(accept_loop(
            listener,
            tls,
            state,
            connections.clone(),
            shutdown.clone(),
        ));
        let simulation = Simulation::new(store.clone(), self.timings);
        tokio::spawn(simulation.clone().run(shutdown));
        Ok(FakeApiServer {
            url,
            address,
            ca_pem: certificates.ca_pem,
            admin_token,
            cluster_name: self.cluster_name,
            account: self.account,
            store,
            audit,
            disruptions,
            faults,
            simulation,
            static_tokens,
            connections,
            shutdown: shutdown_sender,
        })
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<ServerState>,
    connections: Arc<AtomicU64>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "fake API server could not accept a connection");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        connections.fetch_add(1, Ordering::Relaxed);
        let state = state.clone();
        let tls = tls.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => serve_connection(stream, peer, state, shutdown).await,
                    Err(error) => {
                        tracing::debug!(%error, "TLS handshake with the fake API server failed")
                    }
                },
                None => serve_connection(stream, peer, state, shutdown).await,
            }
        });
    }
}

async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    state: Arc<ServerState>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| api::serve(state.clone(), request, peer));
    // HTTP/2 (offered over ALPN, as kube-apiserver does; or h2c on plain HTTP) or HTTP/1.1,
    // whichever the client speaks.
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(%error, "fake API server connection ended with an error");
            }
        }
        _ = shutdown.changed() => {}
    }
}

/// A running fake API server. Dropping it stops the server and the emulation.
pub struct FakeApiServer {
    url: String,
    address: SocketAddr,
    ca_pem: String,
    admin_token: String,
    cluster_name: String,
    account: FakeAccount,
    store: Store,
    audit: AuditLog,
    disruptions: DisruptionLog,
    faults: Faults,
    simulation: Simulation,
    static_tokens: Arc<RwLock<HashMap<String, UserInfo>>>,
    /// TCP connections accepted so far.
    connections: Arc<AtomicU64>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl FakeApiServer {
    /// How many TCP connections clients have opened to this server so far (HTTP/2 clients
    /// multiplex every request and watch over one).
    pub fn connections_accepted(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn builder() -> FakeApiServerBuilder {
        FakeApiServerBuilder {
            cluster_name: "ironman-2022".to_owned(),
            account: FakeAccount::reference(),
            access_entries: None,
            ec2: None,
            plain_http: false,
            timings: SimulationTimings::default(),
            bookmark_interval: Duration::from_secs(60),
            fault_seed: 0,
            store: None,
            cluster_creator_arn: None,
        }
    }

    /// `https://127.0.0.1:<port>` (or `http://` with `plain_http(true)`).
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The cluster CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA as EKS's `certificateAuthority.data` (and `CLUSTER_CA_DATA`): base64 of the PEM.
    pub fn ca_data(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes())
    }

    /// A bearer token for `kubernetes-admin` in `system:masters` (test setup, kubectl).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }

    pub fn account(&self) -> &FakeAccount {
        &self.account
    }

    /// The objects, in process (no HTTP, no audit, no authorization).
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Every eviction decided and every pod DELETE carried out, with the PDB counts at that
    /// instant (see [`disruption_log`]).
    pub fn disruption_log(&self) -> &DisruptionLog {
        &self.disruptions
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    pub fn simulation(&self) -> &Simulation {
        &self.simulation
    }

    /// A node registers (NotReady) and turns Ready after `ready_after` (`None`: the
    /// scenario's default), as after an instance launch.
    pub fn register_node(
        &self,
        name: &str,
        provider_id: &str,
        ready_after: Option<Duration>,
    ) -> Result<(), ApiError> {
        self.simulation
            .register_node(name, provider_id, ready_after)
            .map(|_| ())
    }

    /// The node's instance stopped (went to a warm pool): see [`Simulation::stop_node`].
    pub fn stop_node(&self, name: &str) -> Result<(), ApiError> {
        self.simulation.stop_node(name)
    }

    /// The node's instance started again (left a warm pool) and its kubelet re-registers
    /// under the old name: see [`Simulation::restart_node`].
    pub fn restart_node(
        &self,
        name: &str,
        provider_id: &str,
        ready_after: Option<Duration>,
    ) -> Result<(), ApiError> {
        self.simulation.restart_node(name, provider_id, ready_after)
    }

    /// Stops `node`'s kubelet: the node turns NotReady (`Ready=Unknown`) and deletions of its
    /// pods are never confirmed. See [`Simulation::kill_kubelet`].
    pub fn kill_kubelet(&self, node: &str) -> Result<(), ApiError> {
        self.simulation.kill_kubelet(node)
    }

    /// Starts `node`'s kubelet again (a rebooted instance): the node turns Ready on the next
    /// step. See [`Simulation::revive_kubelet`].
    pub fn revive_kubelet(&self, node: &str) {
        self.simulation.revive_kubelet(node);
    }

    /// Stops `node`'s kubelet as [`Self::kill_kubelet`] does, as if it had stopped at `since`:
    /// its `Ready` condition turned `Unknown` then (a story that starts later than the fault).
    pub fn kill_kubelet_since(&self, node: &str, since: jiff::Timestamp) -> Result<(), ApiError> {
        self.kill_kubelet(node)?;
        self.store
            .modify::<k8s_openapi::api::core::v1::Node>("", node, |n| {
                let conditions = n
                    .status
                    .get_or_insert_default()
                    .conditions
                    .get_or_insert_default();
                for condition in conditions.iter_mut().filter(|c| c.type_ == "Ready") {
                    condition.last_transition_time =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since));
                }
            })
            .map(|_| ())
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    /// Registers a static bearer token for a user (like `--token-auth-file`); the user also
    /// gets `system:authenticated`. Returns the token.
    pub fn add_static_token(&self, username: &str, groups: &[&str]) -> String {
        let token = format!(
            "fake-static-{}",
            hex::encode(rand::rng().random::<[u8; 16]>())
        );
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        groups.push("system:authenticated".to_owned());
        self.static_tokens
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                token.clone(),
                UserInfo {
                    username: username.to_owned(),
                    groups,
                    principal_arn: None,
                },
            );
        token
    }

    /// A kubeconfig for the admin token, trusting the cluster CA.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig_yaml_with_user(&format!("    token: {}\n", self.admin_token))
    }

    /// A kubeconfig whose user entry is `user_yaml` (indented by 4 spaces under `user:`),
    /// e.g. an `exec:` plugin block.
    pub fn kubeconfig_yaml_with_user(&self, user_yaml: &str) -> String {
        let cluster = &self.cluster_name;
        let server = &self.url;
        let ca = if self.url.starts_with("https") {
            format!("    certificate-authority-data: {}\n", self.ca_data())
        } else {
            String::new()
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\n{ca}contexts:\n- name: {cluster}\n  context:\n    cluster: {cluster}\n    user: {cluster}-user\n    namespace: default\ncurrent-context: {cluster}\nusers:\n- name: {cluster}-user\n  user:\n{user_yaml}"
        )
    }

    /// Writes [`FakeApiServer::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), FakeApiServerError> {
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| {
            FakeApiServerError::Kubeconfig {
                path: path.display().to_string(),
                source,
            }
        })
    }

    /// A `kube::Client` authenticated as the admin, built from the kubeconfig (so the CA
    /// data path is the one real clients use).
    pub async fn admin_client(&self) -> Result<kube::Client, FakeApiServerError> {
        self.client_with_token(&self.admin_token).await
    }

    /// A `kube::Client` sending `token` as its bearer token.
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client, FakeApiServerError> {
        let config = self.config_with_token(token).await?;
        kube::Client::try_from(config).map_err(|e| FakeApiServerError::Client(e.to_string()))
    }

    /// An admin `kube::Client` without kube's built-in retries (by default `kube::Client`
    /// retries 429/503/504 up to 15 times with exponential backoff, which hides them).
    pub async fn admin_client_without_retries(&self) -> Result<kube::Client, FakeApiServerError> {
        let mut config = self.config_with_token(&self.admin_token).await?;
        config.default_retry = false;
        kube::Client::try_from(config).map_err(|e| FakeApiServerError::Client(e.to_string()))
    }

    /// The `kube::Config` a kubeconfig with this bearer token gives.
    pub async fn config_with_token(&self, token: &str) -> Result<kube::Config, FakeApiServerError> {
        let yaml = self.kubeconfig_yaml_with_user(&format!("    token: {token}\n"));
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml)
            .map_err(|e| FakeApiServerError::Client(e.to_string()))?;
        kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| FakeApiServerError::Client(e.to_string()))
    }

    /// Loads a multi-document manifest (e.g. the shipped `infra/rbac.yaml`) into the store.
    pub fn apply_manifest_file(&self, path: &Path) -> Result<usize, FakeApiServerError> {
        let yaml =
            std::fs::read_to_string(path).map_err(|source| FakeApiServerError::Manifest {
                path: path.display().to_string(),
                source,
            })?;
        Ok(self.store.apply_yaml(&yaml)?)
    }

    /// Polls the store (every 5 ms) until `condition` holds; `Err` names `what` on timeout.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        condition: impl Fn(&Store) -> bool,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if condition(&self.store) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("timed out after {timeout:?} waiting for {what}"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Restarts the API server as far as its clients see it (kube-apiserver's rolling update):
    /// every open watch ends, and one resuming from a version before the restart is answered
    /// `410 Expired`, so its client lists again.
    pub fn restart(&self) {
        self.store.restart_watch_cache();
    }

    /// Stops serving and the emulation (also done on drop).
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
