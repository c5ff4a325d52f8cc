//! Scheduled maintenance planned ahead: AWS Health announces retirements and maintenance
//! about two weeks before; the drain is due only `MAINTENANCE_DRAIN_MARGIN_SECONDS` before the
//! start. Until then the plan is kept on the node (a label to find it, an annotation with the
//! times), where the sweep ([`super::sweep`]) finds it and starts the drain when due. Nothing
//! else changes on the node: it stays in service until then.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::node_marks::{MARKED_LABEL, PatchStep, Patched, Reread, patch_recomputing};

/// Label on a node with planned maintenance (value `planned`): the sweep lists by it.
pub const MAINTENANCE_LABEL: &str = "open-node-manager.io/maintenance";
/// Annotation with the [`MaintenanceRecord`] as JSON.
pub const MAINTENANCE_ANNOTATION: &str = "open-node-manager.io/maintenance";

/// A scheduled change of an instance, as confirmed by EC2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMaintenance {
    pub type_code: String,
    pub starts_at: Timestamp,
    pub drain_from: Timestamp,
}

/// What is kept on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceRecord {
    pub type_code: String,
    pub instance_id: String,
    pub auto_scaling_group_name: String,
    pub starts_at: Timestamp,
    pub drain_from: Timestamp,
}

impl MaintenanceRecord {
    pub fn of(node: &Node) -> Option<Self> {
        let raw = node
            .metadata
            .annotations
            .as_ref()?
            .get(MAINTENANCE_ANNOTATION)?;
        serde_json::from_str(raw).ok()
    }
}

/// Records `planned` on `node` (conditional write, recomputed on conflicts); `false` when
/// the same plan was there already.
pub async fn plan_maintenance(
    client: &kube::Client,
    node: Node,
    group: &str,
    instance_id: &str,
    planned: &PlannedMaintenance,
) -> Result<bool, kube::Error> {
    let record = MaintenanceRecord {
        type_code: planned.type_code.clone(),
        instance_id: instance_id.to_owned(),
        auto_scaling_group_name: group.to_owned(),
        starts_at: planned.starts_at,
        drain_from: planned.drain_from,
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let written = patch_recomputing(&nodes, node, Reread::Get, "planning maintenance", |node| {
        // An earlier plan for an earlier start stays: the drain is due by the first one.
        let kept = MaintenanceRecord::of(node)
            .filter(|r| r.instance_id == instance_id && r.drain_from <= record.drain_from);
        if kept.is_some() {
            return PatchStep::Stop(());
        }
        PatchStep::Write(
            json!({"metadata": {
                "resourceVersion": node.metadata.resource_version,
                "labels": {MAINTENANCE_LABEL: "planned", MARKED_LABEL: "true"},
                "annotations": {MAINTENANCE_ANNOTATION: serde_json::to_string(&record).unwrap_or_default()},
            }}),
            (),
        )
    })
    .await?;
    Ok(matches!(written, Patched::Written(..)))
}

/// Removes the plan from the node (it is due, or past), if it is still `record`.
pub async fn clear_maintenance(
    client: &kube::Client,
    node: Node,
    record: &MaintenanceRecord,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    patch_recomputing(
        &nodes,
        node,
        Reread::Get,
        "clearing planned maintenance",
        |node| {
            if MaintenanceRecord::of(node).as_ref() != Some(record) {
                return PatchStep::Stop(());
            }
            PatchStep::Write(
                json!({"metadata": {
                    "resourceVersion": node.metadata.resource_version,
                    "labels": {MAINTENANCE_LABEL: null},
                    "annotations": {MAINTENANCE_ANNOTATION: null},
                }}),
                (),
            )
        },
    )
    .await?;
    Ok(())
}

/// Moves the plan `from` on `node` to `to` (EC2 rescheduled the maintenance), if the node
/// still carries `from`; `false` when it did not (changed or removed meanwhile).
pub async fn replan_maintenance(
    client: &kube::Client,
    node: Node,
    from: &MaintenanceRecord,
    to: &MaintenanceRecord,
) -> Result<bool, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let written = patch_recomputing(&nodes, node, Reread::Get, "moving planned maintenance", |node| {
        if MaintenanceRecord::of(node).as_ref() != Some(from) {
            return PatchStep::Stop(());
        }
        PatchStep::Write(
            json!({"metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {MAINTENANCE_ANNOTATION: serde_json::to_string(to).unwrap_or_default()},
            }}),
            (),
        )
    })
    .await?;
    Ok(matches!(written, Patched::Written(..)))
}
