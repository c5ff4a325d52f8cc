//! What the function answers and reports: the per-node-group [`Outcome`]s, the answer
//! ([`AuthReport`]), and the log line, metric and Kubernetes Event of each outcome.

use k8s_openapi::api::core::v1::ConfigMap;
use serde::Serialize;

use crate::aws::{Eks, InstanceProfiles, InstancesByProfile};
use crate::nodegroup_auth::access_entry::AccessEntryOutcome;
use crate::nodegroup_auth::aws_auth::{
    AwsAuthEditor, AwsAuthError, AwsAuthEvent, AwsAuthStore, EditOutcome, StoreError, WrittenChange,
};
use crate::nodegroup_auth::role_arn::NodeRoleArn;
use crate::telemetry::{MetricSet, Unit};

use super::{FUNCTION_NAME, NodegroupAuth};

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
    pub(super) fn new(cluster: &str, nodegroup: &str) -> Self {
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

    pub(super) fn noted(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    pub(super) fn add_note(&mut self, note: String) {
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

impl<E: Eks, S: AwsAuthStore, P: InstanceProfiles, I: InstancesByProfile>
    NodegroupAuth<E, S, P, I>
{
    pub(super) fn report_access_entry(
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

    pub(super) async fn report_edit(
        &self,
        editor: &AwsAuthEditor<&S>,
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
                self.report_written(editor, &role_arn, action, &written)
                    .await
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

    /// Logs, counts and records as an Event a write that went through.
    async fn report_written(
        &self,
        editor: &AwsAuthEditor<&S>,
        role_arn: &str,
        action: &'static str,
        written: &WrittenChange,
    ) -> Outcome {
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
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

pub(super) fn aws_auth_failed(role: &NodeRoleArn, err: &AwsAuthError) {
    if matches!(err, AwsAuthError::Store(StoreError::Unreachable(_))) {
        // Not an aws-auth failure: reported as the cluster access it is.
        return;
    }
    tracing::error!(role = %role.without_path(), error = %err, "aws-auth not changed");
    let label = match err {
        AwsAuthError::RetriesExhausted { .. } => "RetriesExhausted",
        AwsAuthError::MapRoles(_) => "Malformed",
        _ => "Failed",
    };
    metric("AwsAuth", label, "Failed");
}

pub(super) async fn publish<S: AwsAuthStore>(store: &S, object: &ConfigMap, event: &AwsAuthEvent) {
    if let Err(err) = store.publish_event(object, event).await {
        // The mapping is what matters; a lost Event is only logged.
        tracing::warn!(error = %err, reason = event.reason, "could not record the Kubernetes Event");
    }
}

pub(super) fn metric(target: &str, outcome: &str, name: &str) {
    MetricSet::new(FUNCTION_NAME)
        .dimension("Target", target)
        .dimension("Outcome", outcome)
        .metric(name, 1.0, Unit::Count)
        .emit();
}
