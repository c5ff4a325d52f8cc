//! Applies one node's [`Action`]s that change marks (the drains are the terminating hook's
//! notice feature's, [`crate::instance_notice::sweep`]), and is the one place a record of
//! ours is ended: a feature that sees a record's end at once (the launching hook on a return
//! from the warm pool, a refresh's end event, a maintenance drain that ran) writes it through
//! the functions here, never the record's own module. Every write reads the node again
//! and is conditional on its `resourceVersion`, recomputed on conflicts: what is undone is
//! only what the record says we did, only where it is still in place, and only while the
//! record is the one the decision was made on (a drain that took it over meanwhile keeps
//! it).

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::{Value, json};

use super::desired::Action;
use crate::node_marks::checkpoint::{DrainCheckpoint, checkpoint_of, undo_record_patch};
use crate::node_marks::maintenance::{MaintenanceRecord, clear_maintenance, replan_maintenance};
use crate::node_marks::marks::NodeMarks;
use crate::node_marks::out_of_service::Undone;
use crate::node_marks::refresh::unmark_node;
use crate::node_marks::shutdown::lift_shutdown_taint;
use crate::node_marks::{MARKED_LABEL, PatchStep, Patched, Reread, patch_recomputing};

/// Applies `action` to node `name`; what it came to, for the report (`None`: nothing worth
/// reporting, the common label was already right). Drains and [`Action::Unchecked`] write
/// nothing here.
pub async fn apply(
    client: &kube::Client,
    name: &str,
    action: &Action,
) -> Result<Option<String>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(node) = nodes.get_opt(name).await? else {
        return Ok(Some("node gone".to_owned()));
    };
    match action {
        Action::AddMarkedLabel | Action::RemoveMarkedLabel => sync_marked_label(&nodes, node).await,
        other => apply_to(client, &nodes, node, other).await.map(Some),
    }
}

/// Adds the common label to `name` if it carries a mark of ours, removes it if it carries
/// none; what was written, `None` when the label was right.
pub async fn sync_label(client: &kube::Client, name: &str) -> Result<Option<String>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.get_opt(name).await? {
        Some(node) => sync_marked_label(&nodes, node).await,
        None => Ok(None),
    }
}

async fn apply_to(
    client: &kube::Client,
    nodes: &Api<Node>,
    node: Node,
    action: &Action,
) -> Result<String, kube::Error> {
    match action {
        Action::RemoveRefreshMarks { refresh_id, why } => {
            Ok(match remove_refresh_marks(nodes, node, refresh_id).await? {
                Some(undone) => described(why, &undone.items()),
                None => "no longer on the node".to_owned(),
            })
        }
        Action::UndoDrainRecord { record, why } => {
            Ok(match undo_drain_record(nodes, node, record).await? {
                RecordUndo::Undone(_, undone) => {
                    described(why, &undone.unwrap_or_default().items())
                }
                RecordUndo::Left => "the record changed meanwhile: left".to_owned(),
            })
        }
        Action::LiftShutdownTaint { record, why } => {
            Ok(match lift_shutdown_taint(nodes, node, record).await? {
                Some(undone) => described(why, &undone),
                None => "the record changed meanwhile: left".to_owned(),
            })
        }
        Action::DropMaintenancePlan { record, why } => {
            drop_maintenance_plan(client, node, record).await?;
            Ok(why.clone())
        }
        Action::ReplanMaintenance {
            record,
            starts_at,
            drain_from,
        } => {
            let to = MaintenanceRecord {
                starts_at: *starts_at,
                drain_from: *drain_from,
                ..record.clone()
            };
            let moved = replan_maintenance(client, node, record, &to).await?;
            Ok(if moved {
                format!("moved to {starts_at}, drain from {drain_from}")
            } else {
                "the plan changed meanwhile: left".to_owned()
            })
        }
        Action::Unchecked { why, .. } => Ok(why.clone()),
        Action::AddMarkedLabel
        | Action::RemoveMarkedLabel
        | Action::DrainForMaintenance { .. }
        | Action::DrainForSpotInterruption { .. }
        | Action::ResumeNoticeDrain { .. } => Ok("not a change of marks".to_owned()),
    }
}

fn described(why: &str, undone: &[String]) -> String {
    if undone.is_empty() {
        format!("{why}: record removed, nothing of ours was still in place")
    } else {
        format!("{why}: {}", undone.join(", "))
    }
}

/// Ends an instance refresh's record on `node`: its marks undone (only what the record says,
/// only where still in place) and the record removed; `None` when the node no longer carries
/// it. The reconciler's write, and the refresh's own at its end event (one rule decides both:
/// [`crate::reconcile::desired::refresh_in_progress`]).
pub async fn remove_refresh_marks(
    nodes: &Api<Node>,
    node: Node,
    refresh_id: &str,
) -> Result<Option<Undone>, kube::Error> {
    unmark_node(nodes, node, refresh_id).await
}

/// Removes a maintenance plan from `node`, if it is still `record`: its reason is gone (the
/// reconciler), or the drain it planned has run (the notice's drain, which the plan stood
/// for).
pub async fn drop_maintenance_plan(
    client: &kube::Client,
    node: Node,
    record: &MaintenanceRecord,
) -> Result<(), kube::Error> {
    clear_maintenance(client, node, record).await
}

/// What undoing a drain record came to.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordUndo {
    /// Written: the node as written, and what was undone (`None`: the record does not say
    /// what the drain changed, written by an older version; only the record went).
    Undone(Box<Node>, Option<Undone>),
    /// The node no longer carries exactly that record, or is gone: nothing written.
    Left,
}

/// Undoes what `record` says the drain did and removes it, if the node still carries
/// exactly `record`: the one write that ends a drain record, whoever decided it (the
/// reconciler, the launching hook on a return from the warm pool).
pub async fn undo_drain_record(
    nodes: &Api<Node>,
    node: Node,
    record: &DrainCheckpoint,
) -> Result<RecordUndo, kube::Error> {
    let written = patch_recomputing(nodes, node, Reread::Get, "undoing a drain record", |node| {
        if checkpoint_of(node).as_ref() != Some(record) {
            return PatchStep::Stop(());
        }
        let (patch, undone) = undo_record_patch(node, record);
        PatchStep::Write(patch, undone)
    })
    .await?;
    Ok(match written {
        Patched::Written(node, undone) => RecordUndo::Undone(node, undone),
        Patched::Stopped(()) | Patched::NodeGone => RecordUndo::Left,
    })
}

/// Adds the common label to a node with marks of ours, or removes it from a node without;
/// what was written.
async fn sync_marked_label(nodes: &Api<Node>, node: Node) -> Result<Option<String>, kube::Error> {
    let written = patch_recomputing(
        nodes,
        node,
        Reread::Get,
        "setting the marked label",
        |node| {
            let marks = NodeMarks::of(node);
            if marks.any() == marks.labelled {
                return PatchStep::Stop(());
            }
            let value = if marks.any() {
                json!("true")
            } else {
                Value::Null
            };
            PatchStep::Write(
                json!({"metadata": {
                    "resourceVersion": node.metadata.resource_version,
                    "labels": {MARKED_LABEL: value},
                }}),
                marks.any(),
            )
        },
    )
    .await?;
    Ok(match written {
        Patched::Written(_, true) => Some(format!("label {MARKED_LABEL} added")),
        Patched::Written(_, false) => Some(format!("label {MARKED_LABEL} removed")),
        Patched::Stopped(()) | Patched::NodeGone => None,
    })
}
