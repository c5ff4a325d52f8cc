//! The marks of ours one Node carries, read once from the Node as listed: the reconciler's
//! input besides what AWS says, and what tells whether a record is a node's last mark.

use k8s_openapi::api::core::v1::Node;

use super::MARKED_LABEL;
use super::checkpoint::{DrainCheckpoint, checkpoint_of};
use super::maintenance::MaintenanceRecord;
use super::refresh::{RefreshMarks, refresh_marks_of};
use super::shutdown::ShutdownRecord;
use crate::lifecycle::node::{is_ready, node_instance_id};

/// Every mark of ours on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeMarks {
    pub node: String,
    /// The instance the node is now (its providerID).
    pub instance_id: Option<String>,
    /// The drain's record (a lifecycle drain, a notice drain or a rebalance cordon).
    pub checkpoint: Option<DrainCheckpoint>,
    /// An instance refresh's record.
    pub refresh: Option<RefreshMarks>,
    /// A maintenance drain planned for later.
    pub maintenance: Option<MaintenanceRecord>,
    /// The out-of-service taint we put on a node whose kubelet was gone.
    pub shutdown: Option<ShutdownRecord>,
    /// Whether the node carries [`MARKED_LABEL`] (what the reconciler lists by).
    pub labelled: bool,
    /// Whether the node is Ready (after a maintenance, our cordon stays until it is).
    pub ready: bool,
}

impl NodeMarks {
    pub fn of(node: &Node) -> Self {
        Self {
            node: node.metadata.name.clone().unwrap_or_default(),
            instance_id: node_instance_id(node).map(str::to_owned),
            checkpoint: checkpoint_of(node),
            refresh: refresh_marks_of(node),
            maintenance: MaintenanceRecord::of(node),
            shutdown: ShutdownRecord::of(node),
            labelled: node
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(MARKED_LABEL)),
            ready: is_ready(node),
        }
    }

    /// Whether the node carries any mark of ours besides the common label.
    pub fn any(&self) -> bool {
        self.checkpoint.is_some()
            || self.refresh.is_some()
            || self.maintenance.is_some()
            || self.shutdown.is_some()
    }

    /// Whether a scheduled maintenance of the instance needs no plan from the sweep: the node
    /// carries one already (the reconciler keeps it true to EC2's schedule), or a drain
    /// record that drains it (a lifecycle or notice drain; a rebalance cordon does not).
    pub fn covers_maintenance(&self) -> bool {
        let drains = self
            .checkpoint
            .as_ref()
            .is_some_and(|c| !c.notice.as_ref().is_some_and(|n| n.cordon_only));
        self.maintenance.is_some() || drains
    }

    /// The instance the marks are about: the node's own, else the one a record names.
    pub fn instance(&self) -> Option<&str> {
        self.instance_id
            .as_deref()
            .or_else(|| {
                self.checkpoint
                    .as_ref()
                    .map(|c| c.action.instance_id.as_str())
            })
            .or_else(|| self.refresh.as_ref().map(|r| r.instance_id.as_str()))
            .or_else(|| self.maintenance.as_ref().map(|m| m.instance_id.as_str()))
    }
}
