//! Where a function gets its Kubernetes client: the one connection type of the hooks, node
//! repair and nodegroup-auth.
//!
//! The function reaches the cluster through [`ClusterAccess`] (discovered on first use, so
//! a test notification or another cluster's group needs no cluster access at all); tests hand
//! in a ready `kube::Client`.

use std::future::Future;

use crate::aws::Eks;
use crate::cluster::{ClusterAccess, ClusterAccessError};

/// Something that yields a client for the cluster's API.
pub trait KubeConnection: Send + Sync {
    fn client(&self) -> impl Future<Output = Result<kube::Client, ClusterAccessError>> + Send;
}

/// A fixed client (tests, local runs).
impl KubeConnection for kube::Client {
    async fn client(&self) -> Result<kube::Client, ClusterAccessError> {
        Ok(self.clone())
    }
}

/// The function's way in: the cluster discovered with EKS, its client cached by
/// [`ClusterAccess`] for the execution environment.
pub struct EksConnection<E> {
    pub access: ClusterAccess,
    pub eks: E,
}

impl<E: Eks> KubeConnection for EksConnection<E> {
    async fn client(&self) -> Result<kube::Client, ClusterAccessError> {
        self.access.client(&self.eks).await
    }
}
