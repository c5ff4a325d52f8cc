//! The function's logic: from an invocation to the node role's mapping, with the truth read
//! from EKS and every outcome reported (log line, Kubernetes Event, EMF metric).

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use serde::Serialize;
use serde_json::Value;

use crate::aws::{
    AuthenticationMode, AwsError, ClusterDescription, Eks, InstanceProfiles, InstancesByProfile,
};
use crate::diagnostic::{FunctionError, diagnostic};
use crate::telemetry::{MetricSet, Unit};

use super::access_entry::{self, AccessEntryOutcome};
use super::aws_auth::{AwsAuthEditor, AwsAuthError, AwsAuthEvent, AwsAuthStore, EditOutcome};
use super::event::{Invocation, InvocationError, Origin};
use super::fake::InMemoryAwsAuth;
use super::role_arn::{NodeRoleArn, RoleArnError};
use super::role_mapping::{MapRoles, NodeOs, RoleMapping};
use super::settings::{AccountError, NodegroupAuthSettings};

/// The function name in metrics.
pub const FUNCTION_NAME: &str = "nodegroup-auth";

/// How many instance ids an answer names when live instances keep a role mapped.
pub const MAX_REPORTED_INSTANCES: usize = 5;

/// How the handler reaches `aws-auth`; asked only when the authentication mode needs it, so
/// an `API`-mode cluster is never contacted.
pub trait AwsAuthAccess: Send + Sync {
    type Store: AwsAuthStore;
    type Error: StdError + Send + Sync + 'static;
    fn aws_auth(&self) -> impl Future<Output = Result<Self::Store, Self::Error>> + Send;
}

impl AwsAuthAccess for InMemoryAwsAuth {
    type Store = InMemoryAwsAuth;
    type Error = Infallible;
    async fn aws_auth(&self) -> Result<InMemoryAwsAuth, Infallible> {
        Ok(self.clone())
    }
}

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
    AwsAuth(#[from] AwsAuthError),
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

/// What happened to one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Mapped,
    AlreadyMapped,
    /// An entry for the role exists that must not be touched: reported, left alone.
    Conflict,
    Unmapped,
    NotPresent,
    /// Delete: another node group, or a live instance of the cluster (its instance profile
    /// carries the role; named in `instances`), still uses the role.
    KeptInUse,
    /// Delete: whether an instance still uses the role could not be checked (IAM or EC2
    /// failed): the mapping stays, never removed on an unknown.
    KeptUnchecked,
    /// Delete: the entry is not of the node shape.
    KeptNotNode,
    /// Delete: the node group was already gone, so nothing the function can read confirms
    /// the event (a direct invocation can forge it): the mapping stays, reported.
    KeptUnverified,
}

/// One node group's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodegroupReport {
    pub cluster: String,
    pub nodegroup: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aws_auth: Option<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_entry: Option<Outcome>,
    /// Delete: live instances of the cluster that still run with the role (at most
    /// [`MAX_REPORTED_INSTANCES`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<String>,
    /// Why nothing was done, or what was found (conflicts, users of the role).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl NodegroupReport {
    fn new(cluster: &str, nodegroup: &str) -> Self {
        Self {
            cluster: cluster.to_owned(),
            nodegroup: nodegroup.to_owned(),
            role_arn: None,
            aws_auth: None,
            access_entry: None,
            instances: Vec::new(),
            note: None,
        }
    }

    fn noted(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    fn add_note(&mut self, note: String) {
        self.note = Some(match self.note.take() {
            Some(previous) => format!("{previous}; {note}"),
            None => note,
        });
    }
}

/// The function's answer (also the Lambda response).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignored: Option<String>,
    pub nodegroups: Vec<NodegroupReport>,
}

/// The node group auth function, built once per execution environment.
pub struct NodegroupAuth<E, A, P, I> {
    eks: E,
    access: A,
    /// IAM: the instance profiles that carry a role (to find instances still using it).
    profiles: P,
    instances: I,
    settings: NodegroupAuthSettings,
}

impl<E: Eks, A: AwsAuthAccess, P: InstanceProfiles, I: InstancesByProfile>
    NodegroupAuth<E, A, P, I>
{
    pub fn new(
        eks: E,
        access: A,
        profiles: P,
        instances: I,
        settings: NodegroupAuthSettings,
    ) -> Self {
        Self {
            eks,
            access,
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
            Invocation::GrantAll { cluster } => {
                let description = self.cluster(&cluster).await?;
                let mut reports = Vec::new();
                let mut failures = Vec::new();
                for nodegroup in self.eks.list_nodegroups(&cluster).await? {
                    match self.grant(&origin, &description, &nodegroup).await {
                        Ok(report) => reports.push(report),
                        Err(err) => {
                            tracing::error!(%nodegroup, error = %err, "reconcile failed");
                            failures.push(format!("{nodegroup}: {err}"));
                        }
                    }
                }
                if failures.is_empty() {
                    Ok(AuthReport {
                        ignored: None,
                        nodegroups: reports,
                    })
                } else {
                    Err(NodegroupAuthError::Partial { failures })
                }
            }
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

    async fn editor(&self) -> Result<AwsAuthEditor<A::Store>, NodegroupAuthError> {
        let store = self
            .access
            .aws_auth()
            .await
            .map_err(|err| NodegroupAuthError::ClusterAccess(Box::new(err)))?;
        Ok(AwsAuthEditor::new(store, self.settings.retry))
    }

    /// Ensures the node group's role is mapped.
    async fn grant(
        &self,
        origin: &Origin,
        cluster: &ClusterDescription,
        nodegroup: &str,
    ) -> Result<NodegroupReport, NodegroupAuthError> {
        let report = NodegroupReport::new(&cluster.name, nodegroup);
        let Some(description) = self
            .eks
            .describe_nodegroup(&cluster.name, nodegroup)
            .await?
        else {
            return Ok(report.noted("the node group does not exist (any more); nothing to map"));
        };
        if description.status == "DELETING" {
            return Ok(report.noted("the node group is being deleted; nothing to map"));
        }
        let role = self.role(origin, nodegroup, &description.node_role)?;
        let os = NodeOs::from_ami_type(&description.ami_type);
        let mut report = NodegroupReport {
            role_arn: Some(role.full()),
            ..report
        };
        let mode = cluster.authentication_mode;
        if mode == AuthenticationMode::ApiAndConfigMap
            && let Some(conflict) = self.aws_auth_conflict(&role).await?
        {
            // An access entry takes precedence over aws-auth for the same principal: an
            // EC2_* entry would silently turn this role into a node identity.
            tracing::warn!(role = %role, %conflict, "no access entry created");
            metric("AccessEntry", "Conflict", "Conflict");
            report.access_entry = Some(Outcome::Conflict);
            report.add_note(format!(
                "{conflict}; an EC2 access entry would take precedence over it, so none was created"
            ));
        } else if mode != AuthenticationMode::ConfigMap {
            let outcome = access_entry::grant(&self.eks, &cluster.name, &role, os).await?;
            report.access_entry = Some(self.report_access_entry(&role, &outcome, &mut report));
        }
        if self.writes_aws_auth(mode) {
            let editor = self.editor().await?;
            let edit = editor
                .grant(&role.without_path(), os.required_groups())
                .await
                .inspect_err(|err| aws_auth_failed(&role, err))?;
            report.aws_auth = Some(
                self.report_edit(&editor, &role, "Grant", edit, &mut report)
                    .await,
            );
        }
        Ok(report)
    }

    /// Unmaps the node group's role once the node group is gone and no other uses it.
    async fn revoke(
        &self,
        origin: &Origin,
        cluster: &ClusterDescription,
        nodegroup: &str,
        event_node_role: Option<&str>,
    ) -> Result<NodegroupReport, NodegroupAuthError> {
        let report = NodegroupReport::new(&cluster.name, nodegroup);
        let description = match self
            .eks
            .describe_nodegroup(&cluster.name, nodegroup)
            .await?
        {
            Some(description) if description.status != "DELETING" => {
                return Ok(report.noted(format!(
                    "the node group exists with status {}; its role stays mapped",
                    description.status
                )));
            }
            Some(description) => description,
            None => return Ok(self.unverified_delete(origin, cluster, report, event_node_role)),
        };
        // The role comes from EKS, never from the event.
        let role = self.role(origin, nodegroup, &description.node_role)?;
        let mut report = NodegroupReport {
            role_arn: Some(role.full()),
            ..report
        };
        // Another node group using the role keeps the entry whatever happens to this one:
        // answer now rather than wait for the deletion to finish.
        let users = self
            .other_users(origin, &cluster.name, nodegroup, &role)
            .await?;
        if !users.is_empty() {
            self.keep_in_use(cluster, &role, &users, &mut report);
            return Ok(report);
        }
        // Its nodes are still draining and need the mapping until they are gone (unless
        // DELETE_WAIT_SECONDS=0 asks to unmap at once).
        if self.settings.delete_wait.is_zero() {
            tracing::info!(%nodegroup, "DELETE_WAIT_SECONDS=0: unmapping while it is deleting");
        } else if let Some(status) = self.wait_until_gone(&cluster.name, nodegroup).await? {
            return Ok(report.noted(format!(
                "the node group exists again with status {status}; its role stays mapped"
            )));
        }
        // A node group created with the role while this one was deleting.
        let users = self
            .other_users(origin, &cluster.name, nodegroup, &role)
            .await?;
        if !users.is_empty() {
            self.keep_in_use(cluster, &role, &users, &mut report);
            return Ok(report);
        }
        // Self-managed or Karpenter instances of the cluster may run with the role too.
        if self
            .kept_for_live_instances(cluster, &role, &mut report)
            .await
        {
            return Ok(report);
        }
        if cluster.authentication_mode != AuthenticationMode::ConfigMap {
            let outcome = access_entry::revoke(&self.eks, &cluster.name, &role).await?;
            report.access_entry = Some(self.report_access_entry(&role, &outcome, &mut report));
        }
        if self.writes_aws_auth(cluster.authentication_mode) {
            let editor = self.editor().await?;
            let edit = editor
                .revoke(&role.without_path())
                .await
                .inspect_err(|err| aws_auth_failed(&role, err))?;
            report.aws_auth = Some(
                self.report_edit(&editor, &role, "Revoke", edit, &mut report)
                    .await,
            );
        } else if cluster.authentication_mode == AuthenticationMode::ApiAndConfigMap
            && let Some(remaining) = self.aws_auth_entry(&role).await?
        {
            // The access entry is gone, but the authenticator still maps the role from
            // aws-auth: say what it keeps rather than claim it is unmapped.
            let note = format!(
                "aws-auth still maps {} to username {:?} with groups {:?}; the role keeps that access",
                role.without_path(),
                remaining.username,
                remaining.groups
            );
            tracing::warn!(role = %role, %note, "aws-auth entry remains");
            metric("AwsAuth", "Remaining", "Remaining");
            report.add_note(note);
        }
        Ok(report)
    }

    /// The node group is gone: the only word for its role is the event's, and nothing the
    /// function may call confirms it (a direct invocation needs only lambda:InvokeFunction).
    /// The mapping stays; the answer and a metric say so.
    fn unverified_delete(
        &self,
        origin: &Origin,
        cluster: &ClusterDescription,
        mut report: NodegroupReport,
        event_node_role: Option<&str>,
    ) -> NodegroupReport {
        let named = event_node_role
            .and_then(|arn| NodeRoleArn::parse(arn, &origin.account_id, &origin.region).ok())
            .map_or_else(|| "its role".to_owned(), |role| format!("role {role}"));
        let note = format!(
            "the node group is already gone, so this delivery cannot be checked against EKS; {named} stays mapped (remove the entry by hand once no node uses it)"
        );
        tracing::warn!(nodegroup = %report.nodegroup, %note, "unverified delete; nothing unmapped");
        metric("Revoke", "Unverified", "Unverified");
        if cluster.authentication_mode != AuthenticationMode::ConfigMap {
            report.access_entry = Some(Outcome::KeptUnverified);
        }
        if self.writes_aws_auth(cluster.authentication_mode) {
            report.aws_auth = Some(Outcome::KeptUnverified);
        }
        report.noted(note)
    }

    fn keep_in_use(
        &self,
        cluster: &ClusterDescription,
        role: &NodeRoleArn,
        users: &[String],
        report: &mut NodegroupReport,
    ) {
        let note = format!("still used by node group(s) {}", users.join(", "));
        tracing::info!(role = %role, %note, "role kept");
        if cluster.authentication_mode != AuthenticationMode::ConfigMap {
            report.access_entry = Some(Outcome::KeptInUse);
        }
        if self.writes_aws_auth(cluster.authentication_mode) {
            report.aws_auth = Some(Outcome::KeptInUse);
        }
        report.add_note(note);
    }

    /// Whether the role must stay mapped because a live instance of the cluster runs with it
    /// (its instance profile carries the role), or because that could not be checked: in
    /// both cases the report, a Warning Event and a metric say so. No retry is asked for on
    /// an IAM or EC2 failure: the node group is gone by now, so a retried delivery could not
    /// be verified and would keep the mapping anyway.
    async fn kept_for_live_instances(
        &self,
        cluster: &ClusterDescription,
        role: &NodeRoleArn,
        report: &mut NodegroupReport,
    ) -> bool {
        let (outcome, reason, note) = match self.live_instances_using(&cluster.name, role).await {
            Ok(ids) if ids.is_empty() => return false,
            Ok(ids) => {
                let note = format!(
                    "live instance(s) of the cluster still run with {role}: {}; it stays mapped until they are gone",
                    ids.join(", ")
                );
                tracing::warn!(role = %role, instances = ?ids, "role kept: instances still use it");
                metric("Revoke", "InstancesRunning", "KeptInUse");
                report.instances = ids;
                (Outcome::KeptInUse, "NodeRoleInUse", note)
            }
            Err(err) => {
                let note = format!(
                    "could not check whether instances still run with {role} ({err}); it stays mapped"
                );
                tracing::error!(role = %role, error = %err, "role kept: instance use unknown");
                metric("Revoke", "UsageUnknown", "KeptUnchecked");
                (Outcome::KeptUnchecked, "NodeRoleUsageUnknown", note)
            }
        };
        if cluster.authentication_mode != AuthenticationMode::ConfigMap {
            report.access_entry = Some(outcome);
        }
        if self.writes_aws_auth(cluster.authentication_mode) {
            report.aws_auth = Some(outcome);
        }
        if cluster.authentication_mode != AuthenticationMode::Api {
            self.warn_on_aws_auth(AwsAuthEvent {
                warning: true,
                reason,
                action: "Revoke",
                note: note.clone(),
            })
            .await;
        }
        report.add_note(note);
        true
    }

    /// Live instances of `cluster` whose instance profile carries `role` (a few at most).
    async fn live_instances_using(
        &self,
        cluster: &str,
        role: &NodeRoleArn,
    ) -> Result<Vec<String>, AwsError> {
        let profiles = self
            .profiles
            .instance_profiles_for_role(role.name())
            .await?;
        if profiles.is_empty() {
            return Ok(Vec::new());
        }
        self.instances
            .live_cluster_instances_with_profiles(cluster, &profiles, MAX_REPORTED_INSTANCES)
            .await
    }

    /// Records a Warning Event on the `aws-auth` object when it exists; a failure to reach
    /// it is only logged (the answer and the metric carry the outcome).
    async fn warn_on_aws_auth(&self, event: AwsAuthEvent) {
        let editor = match self.editor().await {
            Ok(editor) => editor,
            Err(err) => {
                tracing::warn!(error = %err, reason = event.reason, "could not record the Kubernetes Event");
                return;
            }
        };
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
    ) -> Result<Option<(AwsAuthEditor<A::Store>, ConfigMap, RoleMapping)>, NodegroupAuthError> {
        let editor = self.editor().await?;
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

    /// Why an EC2 access entry must not be created for `role`: its aws-auth entry is
    /// privileged or not a node mapping (`None` when there is none, or a node one).
    async fn aws_auth_conflict(
        &self,
        role: &NodeRoleArn,
    ) -> Result<Option<String>, NodegroupAuthError> {
        let Some((editor, object, mapping)) = self.aws_auth_object_entry(role).await? else {
            return Ok(None);
        };
        let privileged = mapping.privileged_groups();
        let conflict = if !privileged.is_empty() {
            Some(format!(
                "aws-auth maps {} with privileged groups {privileged:?}",
                role.without_path()
            ))
        } else if !mapping.is_node_shaped() {
            Some(format!(
                "aws-auth maps {} to username {:?} with groups {:?}, not a node mapping",
                role.without_path(),
                mapping.username,
                mapping.groups
            ))
        } else {
            None
        };
        if let Some(note) = &conflict {
            let event = AwsAuthEvent {
                warning: true,
                reason: "NodeRoleMappingConflict",
                action: "Grant",
                note: format!("{note}; no EC2 access entry created"),
            };
            publish(editor.store(), &object, &event).await;
        }
        Ok(conflict)
    }

    /// Polls until the node group is gone: `None`, or `Some(status)` when it exists again
    /// in another state (recreated under the same name).
    async fn wait_until_gone(
        &self,
        cluster: &str,
        nodegroup: &str,
    ) -> Result<Option<String>, NodegroupAuthError> {
        let started = tokio::time::Instant::now();
        loop {
            if started.elapsed() >= self.settings.delete_wait {
                return Err(NodegroupAuthError::StillDeleting {
                    nodegroup: nodegroup.to_owned(),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(self.settings.delete_poll_interval).await;
            match self.eks.describe_nodegroup(cluster, nodegroup).await? {
                None => return Ok(None),
                Some(description) if description.status != "DELETING" => {
                    return Ok(Some(description.status));
                }
                Some(_) => {}
            }
        }
    }

    /// The other node groups of the cluster whose role is `role` (any status: a node group
    /// that is itself being deleted still has draining nodes).
    async fn other_users(
        &self,
        origin: &Origin,
        cluster: &str,
        nodegroup: &str,
        role: &NodeRoleArn,
    ) -> Result<Vec<String>, NodegroupAuthError> {
        let mut users = Vec::new();
        for name in self.eks.list_nodegroups(cluster).await? {
            if name == nodegroup {
                continue;
            }
            let Some(other) = self.eks.describe_nodegroup(cluster, &name).await? else {
                continue;
            };
            let same =
                match NodeRoleArn::parse(&other.node_role, &origin.account_id, &origin.region) {
                    Ok(other_role) => other_role.same_role(role),
                    Err(_) => other.node_role.eq_ignore_ascii_case(&role.full()),
                };
            if same {
                users.push(name);
            }
        }
        Ok(users)
    }

    fn report_access_entry(
        &self,
        role: &NodeRoleArn,
        outcome: &AccessEntryOutcome,
        report: &mut NodegroupReport,
    ) -> Outcome {
        let (result, label) = match outcome {
            AccessEntryOutcome::Created(entry_type) => {
                tracing::info!(role = %role, entry_type = entry_type.as_str(), "access entry created");
                (Outcome::Mapped, "Written")
            }
            AccessEntryOutcome::AlreadyPresent { .. } => (Outcome::AlreadyMapped, "NoOp"),
            AccessEntryOutcome::Conflict { entry_type, needed } => {
                let note = format!(
                    "access entry for {role} has type {entry_type}, not {}; left untouched",
                    needed.as_str()
                );
                tracing::warn!(%note, "access entry conflict");
                report.add_note(note);
                (Outcome::Conflict, "Conflict")
            }
            AccessEntryOutcome::Deleted => {
                tracing::info!(role = %role, "access entry deleted");
                (Outcome::Unmapped, "Written")
            }
            AccessEntryOutcome::NotPresent => (Outcome::NotPresent, "NoOp"),
            AccessEntryOutcome::KeptNotNode { entry_type } => {
                let note = format!("access entry for {role} has type {entry_type}; kept");
                tracing::warn!(%note, "access entry kept");
                report.add_note(note);
                (Outcome::KeptNotNode, "Conflict")
            }
        };
        metric("AccessEntry", label, label);
        result
    }

    async fn report_edit(
        &self,
        editor: &AwsAuthEditor<A::Store>,
        role: &NodeRoleArn,
        action: &'static str,
        edit: EditOutcome,
        report: &mut NodegroupReport,
    ) -> Outcome {
        let role_arn = role.without_path();
        match edit {
            EditOutcome::Unchanged => {
                tracing::info!(role = %role_arn, action, "aws-auth already as needed; no write");
                metric("AwsAuth", "NoOp", "NoOp");
                if action == "Grant" {
                    Outcome::AlreadyMapped
                } else {
                    Outcome::NotPresent
                }
            }
            EditOutcome::Written(written) => {
                tracing::info!(
                    role = %role_arn,
                    action,
                    created = written.created,
                    old_sha256 = %written.old_sha256,
                    new_sha256 = %written.new_sha256,
                    resource_version = written.resource_version.as_deref().unwrap_or_default(),
                    conflicts_retried = written.conflicts_retried,
                    "aws-auth written"
                );
                MetricSet::new(FUNCTION_NAME)
                    .dimension("Target", "AwsAuth")
                    .dimension("Outcome", "Written")
                    .metric("Written", 1.0, Unit::Count)
                    .metric(
                        "WriteConflictsRetried",
                        f64::from(written.conflicts_retried),
                        Unit::Count,
                    )
                    .emit();
                let (reason, verb) = if action == "Grant" {
                    ("NodeRoleMapped", "mapped")
                } else {
                    ("NodeRoleUnmapped", "unmapped")
                };
                let event = AwsAuthEvent {
                    warning: false,
                    reason,
                    action,
                    note: format!(
                        "{verb} node role {role_arn} (mapRoles sha256 {} -> {})",
                        short(&written.old_sha256),
                        short(&written.new_sha256)
                    ),
                };
                publish(editor.store(), &written.object, &event).await;
                if action == "Grant" {
                    Outcome::Mapped
                } else {
                    Outcome::Unmapped
                }
            }
            EditOutcome::Conflict(conflict) => {
                let note = conflict.to_string();
                tracing::warn!(role = %role_arn, action, %note, "aws-auth entry left untouched");
                metric("AwsAuth", "Conflict", "Conflict");
                if let Ok(Some(object)) = editor.store().get().await {
                    let event = AwsAuthEvent {
                        warning: true,
                        reason: "NodeRoleMappingConflict",
                        action,
                        note: note.clone(),
                    };
                    publish(editor.store(), &object, &event).await;
                }
                report.add_note(note);
                if action == "Grant" {
                    Outcome::Conflict
                } else {
                    Outcome::KeptNotNode
                }
            }
        }
    }
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

fn aws_auth_failed(role: &NodeRoleArn, err: &AwsAuthError) {
    tracing::error!(role = %role.without_path(), error = %err, "aws-auth not changed");
    let label = match err {
        AwsAuthError::RetriesExhausted { .. } => "RetriesExhausted",
        AwsAuthError::MapRoles(_) => "Malformed",
        _ => "Failed",
    };
    metric("AwsAuth", label, "Failed");
}

async fn publish<S: AwsAuthStore>(store: &S, object: &ConfigMap, event: &AwsAuthEvent) {
    if let Err(err) = store.publish_event(object, event).await {
        // The mapping is what matters; a lost Event is only logged.
        tracing::warn!(error = %err, reason = event.reason, "could not record the Kubernetes Event");
    }
}

fn metric(target: &str, outcome: &str, name: &str) {
    MetricSet::new(FUNCTION_NAME)
        .dimension("Target", target)
        .dimension("Outcome", outcome)
        .metric(name, 1.0, Unit::Count)
        .emit();
}

impl From<NodegroupAuthError> for lambda_runtime::Diagnostic {
    fn from(error: NodegroupAuthError) -> Self {
        diagnostic(&error)
    }
}
