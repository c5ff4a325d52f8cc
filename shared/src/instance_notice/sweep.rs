//! The sweep, run by the stack's schedule (every five minutes): what instance notices leave
//! for later.
//!
//! - **Planned maintenance that is due** (see [`super::maintenance`]): drained now, until the
//!   maintenance's start; a plan whose start has passed is dropped without action.
//! - **Rebalance cordons that no termination followed** within `REBALANCE_UNDO_SECONDS`:
//!   undone, only what the record says we did and only where it is still in place. A
//!   termination's drain takes the record over ([`crate::node_marks::checkpoint`]), so a node
//!   being drained is never put back in service.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use super::handler::{
    InstanceOutcome, NoticeError, NoticeHandler, NoticeReport, kube_error, maintenance_drain,
};
use super::maintenance::{MAINTENANCE_LABEL, MaintenanceRecord, clear_maintenance};
use crate::aws::InstanceNotices;
use crate::cluster::connection::KubeConnection;
use crate::drain::Drainer;
use crate::lifecycle::handler::{HookClients, Invocation};
use crate::lifecycle::node::node_instance_id;
use crate::node_marks::checkpoint::{CHECKPOINT_ANNOTATION, checkpoint_of};
use crate::node_marks::out_of_service::add_undo_to_patch;
use crate::node_marks::{
    EXCLUDE_FROM_LOAD_BALANCERS_LABEL, PatchStep, Patched, Reread, patch_recomputing,
};

pub(super) async fn sweep<C: HookClients>(
    drainer: &Drainer<C>,
    invocation: &Invocation,
) -> Result<NoticeReport, NoticeError>
where
    C::Instances: InstanceNotices,
{
    let client = drainer.context.kube.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    // The lists are of all nodes: no node to name.
    let kube = |source| kube_error("", source);
    let mut instances = Vec::new();
    let now = Timestamp::now();

    // Rebalance cordons: a node we took out of service carries the load-balancer label
    // (ours or found there), so that list holds every candidate.
    let marked = nodes
        .list(&ListParams::default().labels(EXCLUDE_FROM_LOAD_BALANCERS_LABEL))
        .await
        .map_err(kube)?;
    for node in marked.items {
        let Some(checkpoint) = checkpoint_of(&node) else {
            continue;
        };
        if !is_expired_rebalance_cordon(&checkpoint, now) {
            continue;
        }
        let instance_id = checkpoint.action.instance_id.clone();
        let name = node.metadata.name.clone().unwrap_or_default();
        let undone = undo_rebalance_cordon(&nodes, node)
            .await
            .map_err(|source| kube_error(&name, source))?;
        tracing::info!(step = "rebalance_cordon_undone", instance_id, undone = ?undone, "no termination followed the rebalance recommendation: our cordon undone");
        instances.push(InstanceOutcome {
            instance_id,
            outcome: "RebalanceCordonUndone".to_owned(),
            detail: Some(undone.join(", ")),
        });
    }

    // Planned maintenance.
    let planned = nodes
        .list(&ListParams::default().labels(MAINTENANCE_LABEL))
        .await
        .map_err(kube)?;
    let handler = NoticeHandler { drainer };
    for node in planned.items {
        let Some(record) = MaintenanceRecord::of(&node) else {
            continue;
        };
        // The record names the instance it was made for; a node name reused by another
        // instance drops it.
        let same_instance = node_instance_id(&node) == Some(record.instance_id.as_str());
        if now < record.drain_from && same_instance {
            continue;
        }
        if now >= record.starts_at || !same_instance {
            let name = node.metadata.name.clone().unwrap_or_default();
            clear_maintenance(&client, node, &record)
                .await
                .map_err(|source| kube_error(&name, source))?;
            instances.push(InstanceOutcome {
                instance_id: record.instance_id,
                outcome: "MaintenancePlanDropped".to_owned(),
                detail: Some(if same_instance {
                    format!("{} started at {}", record.type_code, record.starts_at)
                } else {
                    "the node now belongs to another instance".to_owned()
                }),
            });
            continue;
        }
        let (notice, deadline) = maintenance_drain(
            record.starts_at,
            now,
            drainer.context.settings.drain_timeout,
        );
        // The drain clears the plan once it has run.
        let drained = handler
            .drain(
                &client,
                node,
                &record.auto_scaling_group_name,
                &record.instance_id,
                &notice,
                deadline,
                invocation,
            )
            .await?;
        tracing::info!(
            step = "maintenance_drain",
            instance_id = record.instance_id,
            outcome = drained.name(),
            "planned maintenance drain ran"
        );
        instances.push(InstanceOutcome {
            instance_id: record.instance_id,
            outcome: drained.name().to_owned(),
            detail: None,
        });
    }
    Ok(NoticeReport {
        event: "Sweep".to_owned(),
        instances,
    })
}

/// A cordon-only rebalance record nobody took over, past its time.
fn is_expired_rebalance_cordon(
    checkpoint: &crate::node_marks::checkpoint::DrainCheckpoint,
    now: Timestamp,
) -> bool {
    checkpoint.action.is_notice()
        && checkpoint.notice.as_ref().is_some_and(|n| n.cordon_only)
        && checkpoint.lease.holder.is_none()
        && now >= checkpoint.deadline
}

/// Undoes what the cordon-only record says we did and removes the record, in one write
/// conditional on the node's `resourceVersion`; what was undone.
async fn undo_rebalance_cordon(nodes: &Api<Node>, node: Node) -> Result<Vec<String>, kube::Error> {
    let written = patch_recomputing(
        nodes,
        node,
        Reread::Get,
        "undoing a rebalance cordon",
        |node| {
            let Some(checkpoint) =
                checkpoint_of(node).filter(|c| is_expired_rebalance_cordon(c, Timestamp::now()))
            else {
                return PatchStep::Stop(());
            };
            let mut patch = json!({"metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {CHECKPOINT_ANNOTATION: null},
            }});
            let ours = checkpoint.out_of_service.unwrap_or_default();
            let undone = add_undo_to_patch(&ours, node, &mut patch);
            PatchStep::Write(patch, undone.items())
        },
    )
    .await?;
    Ok(match written {
        Patched::Written(_, items) => items,
        Patched::Stopped(()) | Patched::NodeGone => Vec::new(),
    })
}
