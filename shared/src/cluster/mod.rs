//! Cluster access: discovery, EKS bearer tokens and a self-refreshing `kube::Client`.
//!
//! A function builds one [`ClusterAccess`] per execution environment (before its handler
//! loop) and asks it for the cluster and a client on each invocation. Both are made on first
//! use and kept: a warm invocation calls no AWS API for discovery and builds no client. The
//! client signs EKS tokens in process ([`token`]), refreshes them before they expire and
//! retries a 401 once with a new one ([`bearer`]).
//!
//! ```no_run
//! # async fn example(sdk_config: aws_types::SdkConfig, eks: impl node_manager::aws::Eks)
//! # -> Result<(), node_manager::cluster::ClusterAccessError> {
//! use node_manager::cluster::ClusterAccess;
//!
//! let access = ClusterAccess::new(&sdk_config, "ironman-2022", "terminating-hook");
//! // in the handler:
//! let client = access.client(&eks).await?;
//! let mode = access.cluster(&eks).await?.authentication_mode;
//! # let _ = (client, mode); Ok(()) }
//! ```

pub mod bearer;
pub mod client;
pub mod clock;
pub mod connection;
pub mod discovery;
pub mod error;
pub mod pages;
mod server_retry;
pub mod token;

use std::sync::Arc;

use aws_credential_types::provider::SharedCredentialsProvider;
use tokio::sync::OnceCell;

use crate::aws::Eks;
use crate::settings::{ProcessEnv, SettingsError, SettingsSource};

pub use self::bearer::TokenSource;
pub use self::clock::{Clock, ManualClock, SystemClock};
pub use self::discovery::{ClusterInfo, ClusterOverride};
pub use self::error::ClusterAccessError;
pub use self::server_retry::{AfterFailure, Throttled, ThrottledRetries, is_throttled};
pub use self::token::{EksToken, TokenError, sign_token};

/// The way to one cluster's Kubernetes API, built once and reused by every invocation.
pub struct ClusterAccess {
    cluster_name: String,
    function_name: String,
    region: Option<String>,
    credentials: Option<SharedCredentialsProvider>,
    clock: Arc<dyn Clock>,
    cluster_override: Result<Option<ClusterOverride>, SettingsError>,
    cluster: OnceCell<ClusterInfo>,
    client: OnceCell<kube::Client>,
    tokens: OnceCell<Arc<TokenSource>>,
}

impl std::fmt::Debug for ClusterAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterAccess")
            .field("cluster_name", &self.cluster_name)
            .field("function_name", &self.function_name)
            .field("region", &self.region)
            .field("cluster_override", &self.cluster_override)
            .field("cluster", &self.cluster.get())
            .finish_non_exhaustive()
    }
}

impl ClusterAccess {
    /// Access to `cluster_name` with the region and credentials of `sdk_config`, for the
    /// function `function_name` (named in the user agent).
    ///
    /// Reads the local override (`CLUSTER_ENDPOINT`, `CLUSTER_CA_DATA`,
    /// `CLUSTER_AUTHENTICATION_MODE`) from the process environment; use
    /// [`ClusterAccess::with_settings`] to read it from elsewhere. Does no I/O.
    pub fn new(
        sdk_config: &aws_types::SdkConfig,
        cluster_name: impl Into<String>,
        function_name: impl Into<String>,
    ) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            function_name: function_name.into(),
            region: sdk_config.region().map(|r| r.as_ref().to_owned()),
            credentials: sdk_config.credentials_provider(),
            clock: Arc::new(SystemClock),
            cluster_override: ClusterOverride::from_settings(&ProcessEnv),
            cluster: OnceCell::new(),
            client: OnceCell::new(),
            tokens: OnceCell::new(),
        }
    }

    /// Reads the local override from `source` instead of the process environment.
    pub fn with_settings(mut self, source: &(impl SettingsSource + ?Sized)) -> Self {
        self.cluster_override = ClusterOverride::from_settings(source);
        self
    }

    /// Signs tokens with time from `clock` (tests move time instead of waiting).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }

    /// The cluster's endpoint, CA and authentication mode: from the override when set, else
    /// from `DescribeCluster` on first use. Cached once found; a failure is not cached.
    pub async fn cluster(&self, eks: &impl Eks) -> Result<&ClusterInfo, ClusterAccessError> {
        self.cluster
            .get_or_try_init(|| async {
                match self.cluster_override.clone()? {
                    Some(found) => {
                        let info = found.into_cluster_info(&self.cluster_name);
                        info.validate()?;
                        tracing::info!(
                            cluster = %info.name,
                            endpoint = %info.endpoint,
                            "using the cluster endpoint from CLUSTER_ENDPOINT, not DescribeCluster"
                        );
                        Ok(info)
                    }
                    None => {
                        let region = self.region.as_deref().unwrap_or("(no region)");
                        discovery::describe_cluster(eks, &self.cluster_name, region).await
                    }
                }
            })
            .await
    }

    /// A client for the cluster's Kubernetes API, made on first use; clones are cheap.
    pub async fn client(&self, eks: &impl Eks) -> Result<kube::Client, ClusterAccessError> {
        let cluster = self.cluster(eks).await?;
        let client = self
            .client
            .get_or_try_init(|| async {
                let tokens = self.token_source()?;
                client::build_client(cluster, &self.function_name, tokens)
            })
            .await?;
        Ok(client.clone())
    }

    /// The token source the client uses (one per `ClusterAccess`).
    pub fn token_source(&self) -> Result<Arc<TokenSource>, ClusterAccessError> {
        if let Some(tokens) = self.tokens.get() {
            return Ok(tokens.clone());
        }
        let region = self
            .region
            .clone()
            .ok_or(ClusterAccessError::MissingRegion)?;
        let credentials =
            self.credentials
                .clone()
                .ok_or_else(|| ClusterAccessError::NoCredentials {
                    reason: "the AWS configuration has no credentials provider".to_owned(),
                })?;
        let tokens = Arc::new(TokenSource::new(
            self.cluster_name.clone(),
            region,
            credentials,
            self.clock.clone(),
        ));
        // A concurrent first call may have won; use whichever is stored.
        let _ = self.tokens.set(tokens);
        self.tokens
            .get()
            .cloned()
            .ok_or(ClusterAccessError::MissingRegion)
    }

    /// Reads a failed Kubernetes call on this cluster as an access problem, when it is one
    /// (see [`ClusterAccessError::from_kube_error`]).
    pub fn access_problem(&self, error: &kube::Error) -> Option<ClusterAccessError> {
        let endpoint = self
            .cluster
            .get()
            .map(|c| c.endpoint.as_str())
            .unwrap_or("(unknown endpoint)");
        ClusterAccessError::from_kube_error(&self.cluster_name, endpoint, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::in_memory::InMemoryEks;

    /// Functions keep one `ClusterAccess` for all invocations and call it from Lambda
    /// handlers, whose futures must be `Send`.
    #[test]
    fn is_shareable_and_its_futures_are_send() {
        fn shareable<T: Send + Sync + 'static>() {}
        fn send<F: std::future::Future + Send>(_: F) {}
        shareable::<ClusterAccess>();
        let access = ClusterAccess::new(&aws_types::SdkConfig::builder().build(), "c", "f")
            .with_settings(&[][..] as &[(&str, &str)]);
        let eks = InMemoryEks::default();
        send(access.cluster(&eks));
        send(access.client(&eks));
    }
}
