//! The node role's EKS access entry (authentication modes `API` and `API_AND_CONFIG_MAP`).
//!
//! EKS gives an `EC2_LINUX`/`EC2_WINDOWS` entry the node username and groups itself, so
//! nothing but the type is chosen here. An entry for the role that already exists is left
//! as it is (its type cannot be changed in place, and it is never deleted to recreate it);
//! when it is not a node entry it is reported.

use crate::aws::{AccessEntryCreation, AccessEntryType, AwsError, Eks};

use super::role_arn::NodeRoleArn;
use super::role_mapping::NodeOs;

/// What happened to the access entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessEntryOutcome {
    Created(AccessEntryType),
    AlreadyPresent {
        entry_type: String,
    },
    /// An entry exists that is not what the node group needs (STANDARD, or Linux where
    /// Windows is needed): left alone, reported.
    Conflict {
        entry_type: String,
        needed: AccessEntryType,
    },
    Deleted,
    NotPresent,
    /// Not a node entry: never deleted.
    KeptNotNode {
        entry_type: String,
    },
}

pub(crate) fn entry_type_for(os: NodeOs) -> AccessEntryType {
    match os {
        NodeOs::Linux => AccessEntryType::Ec2Linux,
        NodeOs::Windows => AccessEntryType::Ec2Windows,
    }
}

/// Ensures the role has a node access entry of the right type.
pub async fn grant(
    eks: &impl Eks,
    cluster: &str,
    role: &NodeRoleArn,
    os: NodeOs,
) -> Result<AccessEntryOutcome, AwsError> {
    let needed = entry_type_for(os);
    let principal = role.full();
    match eks.create_access_entry(cluster, &principal, needed).await? {
        AccessEntryCreation::Created => Ok(AccessEntryOutcome::Created(needed)),
        AccessEntryCreation::AlreadyExists => {
            let entry_type = eks
                .describe_access_entry(cluster, &principal)
                .await?
                .map(|entry| entry.entry_type)
                .unwrap_or_default();
            // A Windows entry serves Linux nodes too; the reverse lacks the Windows group.
            let serves = entry_type == needed.as_str()
                || (entry_type == AccessEntryType::Ec2Windows.as_str()
                    && needed == AccessEntryType::Ec2Linux);
            Ok(if serves {
                AccessEntryOutcome::AlreadyPresent { entry_type }
            } else {
                AccessEntryOutcome::Conflict { entry_type, needed }
            })
        }
    }
}

/// Deletes the role's access entry when it is a node entry.
pub async fn revoke(
    eks: &impl Eks,
    cluster: &str,
    role: &NodeRoleArn,
) -> Result<AccessEntryOutcome, AwsError> {
    let principal = role.full();
    let Some(entry) = eks.describe_access_entry(cluster, &principal).await? else {
        return Ok(AccessEntryOutcome::NotPresent);
    };
    let is_node = entry.entry_type == AccessEntryType::Ec2Linux.as_str()
        || entry.entry_type == AccessEntryType::Ec2Windows.as_str();
    if !is_node {
        return Ok(AccessEntryOutcome::KeptNotNode {
            entry_type: entry.entry_type,
        });
    }
    Ok(if eks.delete_access_entry(cluster, &principal).await? {
        AccessEntryOutcome::Deleted
    } else {
        AccessEntryOutcome::NotPresent
    })
}
