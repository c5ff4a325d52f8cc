//! The function's logic: from an invocation to the node role's mapping, with the truth read
//! from EKS and every outcome reported (log line, Kubernetes Event, EMF metric).

use std::error::Error as StdError;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use crate::diagnostic::{FunctionError, diagnostic};

use crate::aws::{
    AuthenticationMode, AwsError, ClusterDescription, Eks, InstanceProfiles, InstancesByProfile,
};

use super::aws_auth::{AwsAuthEditor, AwsAuthError, AwsAuthEvent, AwsAuthStore, StoreError};
use super::event::{Invocation, InvocationError, Origin};
use super::role_arn::{NodeRoleArn, RoleArnError};
use super::role_mapping::{MapRoles, RoleMapping};
use super::settings::{AccountError, NodegroupAuthSettings};

mod grant;
mod in_use;
mod report;
mod revoke;

pub use self::report::{AuthReport, NodegroupReport, Outcome};
use self::report::{metric, publish};

/// The function name in metrics.
pub const FUNCTION_NAME: &str = "nodegroup-auth";

/// The status EKS gives a node group from its `DeleteNodegroup` until it is gone.
const DELETING: &str = "DELETING";

/// How many instance ids an answer names when live instances keep a role mapped.
pub(crate) const MAX_REPORTED_INSTANCES: usize = 5;

/// Why an invocation failed. Rejected payloads write nothing.
#[derive(Debug, thiserror::Error)]
pub enum NodegroupAuthError {
    #[error("rejected: {0}")]
    Rejected(#[from] InvocationError),
    #[error(transparent)]
    Account(#[from] AccountError),
    #[error("cluster {0:?} does not exist (DescribeCluster); check CLUSTER_NAME")]
    ClusterNotFound(String),
    #[error(transparent)]
    Eks(#[from] AwsError),
    #[error("rejected node role of node group {nodegroup:?}: {source}")]
    NodeRole {
        nodegroup: String,
        #[source]
        source: RoleArnError,
    },
    #[error(transparent)]
    AwsAuth(AwsAuthError),
    #[error("cannot reach the cluster's Kubernetes API: {0}")]
    ClusterAccess(#[source] Box<dyn StdError + Send + Sync>),
    #[error(
        "node group {nodegroup:?} is still being deleted after {waited:?}; its role stays mapped until it is gone (the event will be retried)"
    )]
    StillDeleting { nodegroup: String, waited: Duration },
    #[error("{} of the node groups could not be reconciled: {}", failures.len(), failures.join("; "))]
    Partial { failures: Vec<String> },
}

impl FunctionError for NodegroupAuthError {
    fn kind(&self) -> &'static str {
        match self {
            Self::Rejected(_) => "Rejected",
            Self::Account(_) => "Account",
            Self::ClusterNotFound(_) => "ClusterNotFound",
            Self::Eks(_) => "Eks",
            Self::NodeRole { .. } => "NodeRoleRejected",
            Self::AwsAuth(AwsAuthError::RetriesExhausted { .. }) => "RetriesExhausted",
            Self::AwsAuth(_) => "AwsAuth",
            Self::ClusterAccess(_) => "ClusterAccess",
            Self::StillDeleting { .. } => "StillDeleting",
            Self::Partial { .. } => "Partial",
        }
    }

    fn error_type(&self) -> String {
        format!("NodegroupAuth.{}", self.kind())
    }
}

/// An edit that could not reach the cluster at all is a cluster-access failure, as when the
/// store cannot be reached for a read.
impl From<AwsAuthError> for NodegroupAuthError {
    fn from(error: AwsAuthError) -> Self {
        match error {
            AwsAuthError::Store(unreachable @ StoreError::Unreachable(_)) => {
                Self::ClusterAccess(Box::new(unreachable))
            }
            other => Self::AwsAuth(other),
        }
    }
}

/// The node group auth function, built once per execution environment.
pub struct NodegroupAuth<E, S, P, I> {
    eks: E,
    /// `aws-auth`, reached only when the authentication mode needs it.
    aws_auth: S,
    /// IAM: the instance profiles that carry a role (to find instances still using it).
    profiles: P,
    instances: I,
    settings: NodegroupAuthSettings,
}

impl<E: Eks, S: AwsAuthStore, P: InstanceProfiles, I: InstancesByProfile>
    NodegroupAuth<E, S, P, I>
{
    pub fn new(
        eks: E,
        aws_auth: S,
        profiles: P,
        instances: I,
        settings: NodegroupAuthSettings,
    ) -> Self {
        Self {
            eks,
            aws_auth,
            profiles,
            instances,
            settings,
        }
    }

    pub fn settings(&self) -> &NodegroupAuthSettings {
        &self.settings
    }

    /// Handles one invocation; `invoked_function_arn` names this function's account.
    #[tracing::instrument(skip_all)]
    pub async fn handle(
        &self,
        payload: &Value,
        invoked_function_arn: &str,
    ) -> Result<AuthReport, NodegroupAuthError> {
        let origin = Origin {
            account_id: self.settings.account_for(invoked_function_arn)?,
            region: self.settings.region.clone(),
        };
        let invocation =
            Invocation::parse(payload, &origin, &self.settings.scope).inspect_err(|err| {
                tracing::warn!(error = %err, "invocation rejected");
                metric("Invocation", "Rejected", "Rejected");
            })?;
        tracing::info!(?invocation, "handling");
        match invocation {
            Invocation::Ignore { reason } => Ok(AuthReport {
                ignored: Some(reason),
                nodegroups: Vec::new(),
            }),
            Invocation::OtherCluster { cluster } => {
                let reason = format!(
                    "the event is for cluster {cluster:?}; this function serves {:?} only",
                    self.settings.scope.cluster_name
                );
                tracing::info!(%cluster, "event of another cluster ignored");
                metric("Invocation", "OtherCluster", "Ignored");
                Ok(AuthReport {
                    ignored: Some(reason),
                    nodegroups: Vec::new(),
                })
            }
            Invocation::Grant { cluster, nodegroup } => {
                let description = self.cluster(&cluster).await?;
                let report = self.grant(&origin, &description, &nodegroup).await?;
                Ok(AuthReport {
                    ignored: None,
                    nodegroups: vec![report],
                })
            }
            Invocation::GrantAll { cluster } => self.grant_all(&origin, &cluster).await,
            Invocation::Revoke {
                cluster,
                nodegroup,
                event_node_role,
            } => {
                let description = self.cluster(&cluster).await?;
                let report = self
                    .revoke(
                        &origin,
                        &description,
                        &nodegroup,
                        event_node_role.as_deref(),
                    )
                    .await?;
                Ok(AuthReport {
                    ignored: None,
                    nodegroups: vec![report],
                })
            }
        }
    }

    async fn cluster(&self, cluster: &str) -> Result<ClusterDescription, NodegroupAuthError> {
        self.eks
            .describe_cluster(cluster)
            .await?
            .ok_or_else(|| NodegroupAuthError::ClusterNotFound(cluster.to_owned()))
    }

    fn role(
        &self,
        origin: &Origin,
        nodegroup: &str,
        arn: &str,
    ) -> Result<NodeRoleArn, NodegroupAuthError> {
        NodeRoleArn::parse(arn, &origin.account_id, &origin.region).map_err(|source| {
            tracing::warn!(%nodegroup, error = %source, "node role rejected");
            metric("Invocation", "Rejected", "Rejected");
            NodegroupAuthError::NodeRole {
                nodegroup: nodegroup.to_owned(),
                source,
            }
        })
    }

    fn writes_aws_auth(&self, mode: AuthenticationMode) -> bool {
        match mode {
            AuthenticationMode::ConfigMap => true,
            AuthenticationMode::ApiAndConfigMap => self.settings.aws_auth_with_access_entries,
            AuthenticationMode::Api => false,
        }
    }

    fn editor(&self) -> AwsAuthEditor<&S> {
        AwsAuthEditor::new(&self.aws_auth, self.settings.retry)
    }

    /// Records a Warning Event on the `aws-auth` object when it exists; a failure to reach
    /// it is only logged (the answer and the metric carry the outcome).
    async fn warn_on_aws_auth(&self, event: AwsAuthEvent) {
        let editor = self.editor();
        match editor.store().get().await {
            Ok(Some(object)) => publish(editor.store(), &object, &event).await,
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(error = %err, reason = event.reason, "could not record the Kubernetes Event");
            }
        }
    }

    /// The role's effective aws-auth mapping (as the authenticator reads it), if any.
    async fn aws_auth_entry(
        &self,
        role: &NodeRoleArn,
    ) -> Result<Option<RoleMapping>, NodegroupAuthError> {
        Ok(self.aws_auth_object_entry(role).await?.map(|(_, _, m)| m))
    }

    /// The aws-auth object, its store and the role's effective mapping in it.
    async fn aws_auth_object_entry(
        &self,
        role: &NodeRoleArn,
    ) -> Result<Option<(AwsAuthEditor<&S>, ConfigMap, RoleMapping)>, NodegroupAuthError> {
        let editor = self.editor();
        let Some(object) = editor
            .store()
            .get()
            .await
            .map_err(|err| NodegroupAuthError::ClusterAccess(Box::new(err)))?
        else {
            return Ok(None);
        };
        let map_roles = object.data.as_ref().and_then(|d| d.get("mapRoles"));
        let parsed = MapRoles::parse(map_roles.map(String::as_str))
            .map_err(|err| NodegroupAuthError::AwsAuth(AwsAuthError::MapRoles(err)))?;
        let mapping = parsed
            .effective(&role.without_path())
            .map(|(_, mapping)| mapping.clone());
        Ok(mapping.map(|mapping| (editor, object, mapping)))
    }
}

impl From<NodegroupAuthError> for lambda_runtime::Diagnostic {
    fn from(error: NodegroupAuthError) -> Self {
        diagnostic(&error)
    }
}
