//! Grant: a node group was created (or a reconciliation asked for every one): map its role
//! with an access entry, `aws-auth`, or both, as the cluster's authentication mode needs.

use crate::aws::{
    AuthenticationMode, ClusterDescription, Eks, InstanceProfiles, InstancesByProfile,
};
use crate::nodegroup_auth::access_entry;
use crate::nodegroup_auth::aws_auth::{AwsAuthEvent, AwsAuthStore};
use crate::nodegroup_auth::event::Origin;
use crate::nodegroup_auth::role_arn::NodeRoleArn;
use crate::nodegroup_auth::role_mapping::NodeOs;

use super::report::{AuthReport, NodegroupReport, Outcome, aws_auth_failed, metric, publish};
use super::{DELETING, NodegroupAuth, NodegroupAuthError};

impl<E: Eks, S: AwsAuthStore, P: InstanceProfiles, I: InstancesByProfile>
    NodegroupAuth<E, S, P, I>
{
    /// Maps the role of every node group of the cluster (a reconciliation); one node group
    /// that fails does not stop the others, and fails the invocation at the end.
    pub(super) async fn grant_all(
        &self,
        origin: &Origin,
        cluster: &str,
    ) -> Result<AuthReport, NodegroupAuthError> {
        let description = self.cluster(cluster).await?;
        let mut reports = Vec::new();
        let mut failures = Vec::new();
        for nodegroup in self.eks.list_nodegroups(cluster).await? {
            match self.grant(origin, &description, &nodegroup).await {
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

    /// Ensures the node group's role is mapped.
    pub(super) async fn grant(
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
        if description.status == DELETING {
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
            let editor = self.editor();
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
}
