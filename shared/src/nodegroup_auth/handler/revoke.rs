//! Revoke: a node group was deleted. Its role is unmapped only once the node group is gone
//! and nothing else uses the role ([`super::in_use`]); every other case keeps the mapping and
//! says why.

use crate::aws::{
    AuthenticationMode, ClusterDescription, Eks, InstanceProfiles, InstancesByProfile,
};
use crate::nodegroup_auth::access_entry;
use crate::nodegroup_auth::aws_auth::AwsAuthStore;
use crate::nodegroup_auth::event::Origin;
use crate::nodegroup_auth::role_arn::NodeRoleArn;

use super::report::{NodegroupReport, Outcome, aws_auth_failed, metric};
use super::{DELETING, NodegroupAuth, NodegroupAuthError};

impl<E: Eks, S: AwsAuthStore, P: InstanceProfiles, I: InstancesByProfile>
    NodegroupAuth<E, S, P, I>
{
    /// Unmaps the node group's role once the node group is gone and no other uses it.
    pub(super) async fn revoke(
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
            Some(description) if description.status != DELETING => {
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
        if self
            .kept_for_other_users(origin, cluster, nodegroup, &role, &mut report)
            .await?
        {
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
        if self
            .kept_for_other_users(origin, cluster, nodegroup, &role, &mut report)
            .await?
        {
            return Ok(report);
        }
        // Self-managed or Karpenter instances of the cluster may run with the role too.
        if self
            .kept_for_live_instances(cluster, &role, &mut report)
            .await
        {
            return Ok(report);
        }
        self.unmap(cluster, &role, &mut report).await?;
        Ok(report)
    }

    /// Removes the role's access entry and `aws-auth` mapping (what the cluster's mode uses),
    /// once nothing needs them.
    async fn unmap(
        &self,
        cluster: &ClusterDescription,
        role: &NodeRoleArn,
        report: &mut NodegroupReport,
    ) -> Result<(), NodegroupAuthError> {
        if cluster.authentication_mode != AuthenticationMode::ConfigMap {
            let outcome = access_entry::revoke(&self.eks, &cluster.name, role).await?;
            report.access_entry = Some(self.report_access_entry(role, &outcome, report));
        }
        if self.writes_aws_auth(cluster.authentication_mode) {
            let editor = self.editor();
            let edit = editor
                .revoke(&role.without_path())
                .await
                .inspect_err(|err| aws_auth_failed(role, err))?;
            report.aws_auth = Some(
                self.report_edit(&editor, role, "Revoke", edit, report)
                    .await,
            );
        } else if cluster.authentication_mode == AuthenticationMode::ApiAndConfigMap
            && let Some(remaining) = self.aws_auth_entry(role).await?
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
        Ok(())
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
                Some(description) if description.status != DELETING => {
                    return Ok(Some(description.status));
                }
                Some(_) => {}
            }
        }
    }
}
