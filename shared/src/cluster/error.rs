//! What can go wrong reaching the cluster, phrased for the operator who has to fix it.

use crate::aws::{AwsError, AwsErrorKind};
use crate::settings::SettingsError;

use super::token::TokenError;

/// `error` and its sources, `outer: inner: innermost`: the credential providers put the
/// actionable part (which file, which role) in a source that `Display` alone leaves out.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Why the cluster or its Kubernetes API cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ClusterAccessError {
    #[error(
        "EKS cluster {cluster_name:?} does not exist in {region}: check CLUSTER_NAME and the function's region"
    )]
    ClusterNotFound {
        cluster_name: String,
        region: String,
    },

    #[error(
        "no AWS region configured: set AWS_REGION (Lambda sets it) so the token is signed for the cluster's region"
    )]
    MissingRegion,

    #[error(
        "no AWS credentials: {reason}; give the function an execution role (or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY for local runs)"
    )]
    NoCredentials { reason: String },

    #[error(
        "access denied calling {operation} for cluster {cluster_name:?}: allow eks:DescribeCluster on the cluster in the function's role ({message})"
    )]
    AccessDenied {
        operation: &'static str,
        cluster_name: String,
        message: String,
    },

    #[error(
        "the Kubernetes API of cluster {cluster_name:?} rejected the function's token (401): map the function's role to a Kubernetes user with an access entry or in aws-auth"
    )]
    Unauthorized { cluster_name: String },

    #[error(
        "the Kubernetes API of cluster {cluster_name:?} forbade a request (403): grant the function's Kubernetes user the RBAC permissions of infra/rbac ({message})"
    )]
    Forbidden {
        cluster_name: String,
        message: String,
    },

    #[error(
        "cannot reach the Kubernetes API at {endpoint}: check the cluster's endpoint access (public/private) and that the function's subnets and security groups can reach it ({reason})"
    )]
    Unreachable { endpoint: String, reason: String },

    #[error("DescribeCluster failed for cluster {cluster_name:?}: {source}")]
    DescribeCluster {
        cluster_name: String,
        #[source]
        source: AwsError,
    },

    #[error(
        "cluster endpoint {endpoint:?} is unusable: {reason} (from DescribeCluster, or CLUSTER_ENDPOINT when set)"
    )]
    InvalidEndpoint { endpoint: String, reason: String },

    #[error(
        "cluster certificate authority is unusable: {reason} (expected base64 of a PEM bundle as DescribeCluster returns it, or in CLUSTER_CA_DATA)"
    )]
    InvalidCertificateAuthority { reason: String },

    #[error(transparent)]
    Settings(#[from] SettingsError),

    #[error("cannot sign an EKS token: {0}")]
    Token(#[from] TokenError),

    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

impl ClusterAccessError {
    /// Whether the same call may succeed later without anybody fixing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::DescribeCluster { source, .. } => source.is_retryable(),
            Self::Unreachable { .. } | Self::NoCredentials { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn from_describe(cluster_name: &str, region: &str, error: AwsError) -> Self {
        match error.kind {
            AwsErrorKind::NotFound => Self::ClusterNotFound {
                cluster_name: cluster_name.to_owned(),
                region: region.to_owned(),
            },
            AwsErrorKind::AccessDenied => Self::AccessDenied {
                operation: error.operation,
                cluster_name: cluster_name.to_owned(),
                message: error.message,
            },
            _ => Self::DescribeCluster {
                cluster_name: cluster_name.to_owned(),
                source: error,
            },
        }
    }

    /// Reads a failed Kubernetes call as an access problem, when it is one: 401, 403, no
    /// connection, or a token that could not be made. `None` for everything else (404, 409,
    /// bad requests...), which the caller handles itself.
    pub fn from_kube_error(
        cluster_name: &str,
        endpoint: &str,
        error: &kube::Error,
    ) -> Option<Self> {
        match error {
            kube::Error::Api(status) if status.code == 401 => Some(Self::Unauthorized {
                cluster_name: cluster_name.to_owned(),
            }),
            kube::Error::Api(status) if status.code == 403 => Some(Self::Forbidden {
                cluster_name: cluster_name.to_owned(),
                message: status.message.clone(),
            }),
            kube::Error::HyperError(e) => Some(Self::Unreachable {
                endpoint: endpoint.to_owned(),
                reason: e.to_string(),
            }),
            kube::Error::Service(e) => match e.downcast_ref::<ClusterAccessError>() {
                Some(Self::NoCredentials { reason }) => Some(Self::NoCredentials {
                    reason: reason.clone(),
                }),
                Some(Self::Token(token)) => Some(Self::Token(token.clone())),
                Some(Self::MissingRegion) => Some(Self::MissingRegion),
                _ => Some(Self::Unreachable {
                    endpoint: endpoint.to_owned(),
                    reason: e.to_string(),
                }),
            },
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_chain_names_every_source() {
        let error = Outer(std::io::Error::other("profile file not found"));
        assert_eq!(error_chain(&error), "outer: profile file not found");
        assert_eq!(error_chain(&std::io::Error::other("alone")), "alone");
    }
}
