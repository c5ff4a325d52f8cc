//! Whether a role is still in use, so a revoke must keep it: another node group of the
//! cluster with the same role, or a live instance of the cluster running with it (its
//! instance profile carries the role), or that could not be checked.

use crate::aws::{
    AuthenticationMode, AwsError, ClusterDescription, Eks, InstanceProfiles, InstancesByProfile,
};
use crate::nodegroup_auth::aws_auth::{AwsAuthEvent, AwsAuthStore};
use crate::nodegroup_auth::event::Origin;
use crate::nodegroup_auth::role_arn::NodeRoleArn;

use super::report::{NodegroupReport, Outcome, metric};
use super::{DELETING, MAX_REPORTED_INSTANCES, NodegroupAuth, NodegroupAuthError};

impl<E: Eks, S: AwsAuthStore, P: InstanceProfiles, I: InstancesByProfile>
    NodegroupAuth<E, S, P, I>
{
    /// The other node groups of the cluster whose role is `role` and that will still need it:
    /// every status but `DELETING`. A node group being deleted is no future user: its own
    /// delete event unmaps the role once nothing else uses it, and when that event was
    /// handled first (kept because this node group used the role), only this one can remove
    /// the entry. Counting it would keep the role mapped forever. Its nodes that still run
    /// are protected by the live-instance check ([`Self::kept_for_live_instances`]), which
    /// comes after the wait. A `DELETE_FAILED` node group counts: it still exists with its
    /// nodes, and the delete an operator retries sends a new event that unmaps the role then.
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
            if other.status == DELETING {
                continue;
            }
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

    /// Whether another node group of the cluster uses `role`, which then stays mapped
    /// whatever happens to this one (the report says by whom).
    pub(super) async fn kept_for_other_users(
        &self,
        origin: &Origin,
        cluster: &ClusterDescription,
        nodegroup: &str,
        role: &NodeRoleArn,
        report: &mut NodegroupReport,
    ) -> Result<bool, NodegroupAuthError> {
        let users = self
            .other_users(origin, &cluster.name, nodegroup, role)
            .await?;
        if users.is_empty() {
            return Ok(false);
        }
        self.keep_in_use(cluster, role, &users, report);
        Ok(true)
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
    pub(super) async fn kept_for_live_instances(
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
}
