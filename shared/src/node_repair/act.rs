//! Acting on a group's decision: record each repair on its node, take the AWS action, and
//! leave an Event on the node; in a dry run nothing is written.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;

use crate::aws::{InstanceHealth, RepairInstances};
use crate::node_marks::events::{node_reference, truncate_note};
use crate::node_marks::shutdown::{
    Reread, ShutdownRecord, Tainted, kubelet_silent, taint_dead_node,
};

use super::FUNCTION_NAME;
use super::decision::{GroupDecision, NodeObservation, Verdict};
use super::memory::{REPAIR_ANNOTATION, RepairRecord};
use super::policy::RepairAction;
use super::report::{GroupSummary, NodeReport, RepairError, explain, log_decision};
use super::run::RepairContext;
use super::scope::ObservedGroup;

/// Event reasons.
pub mod reason {
    pub const NODE_REPAIR_STARTED: &str = "NodeRepairStarted";
    pub const NODE_REPAIR_PAUSED: &str = "NodeRepairPaused";
    pub const OUT_OF_SERVICE_TAINT_ADDED: &str = crate::node_marks::shutdown::TAINT_ADDED_REASON;
}

/// The run's repairs: what acting needs, and the tally of attempts and failures.
pub(super) struct Repairs<'a, K, H, R> {
    ctx: &'a RepairContext<K, H, R>,
    nodes: &'a Api<Node>,
    /// The Events' recorder; none in a dry run.
    recorder: Option<Recorder>,
    now: Timestamp,
    attempted: usize,
    failures: Vec<String>,
}

impl<'a, K, H, R> Repairs<'a, K, H, R>
where
    H: InstanceHealth,
    R: RepairInstances,
{
    pub(super) fn new(
        ctx: &'a RepairContext<K, H, R>,
        nodes: &'a Api<Node>,
        client: &kube::Client,
        now: Timestamp,
    ) -> Self {
        let settings = &ctx.settings;
        let recorder = (!settings.dry_run).then(|| {
            Recorder::new(
                client.clone(),
                Reporter {
                    controller: format!("open-node-manager/{FUNCTION_NAME}"),
                    // events.k8s.io/v1 requires a reporting instance: the function's name in Lambda.
                    instance: Some(
                        settings
                            .function_name
                            .clone()
                            .unwrap_or_else(|| FUNCTION_NAME.to_owned()),
                    ),
                },
            )
        });
        Self {
            ctx,
            nodes,
            recorder,
            now,
            attempted: 0,
            failures: Vec::new(),
        }
    }

    /// Acts on each node's verdict, adds the nodes' reports, and sums the group up.
    pub(super) async fn act_on_group(
        &mut self,
        group: &ObservedGroup<'_>,
        decision: GroupDecision,
        reports: &mut Vec<NodeReport>,
    ) -> GroupSummary {
        let dry_run = self.ctx.settings.dry_run;
        let observation = &group.observation;
        let mut started = 0;
        let mut paused = 0;
        for ((name, verdict), (seen, node)) in decision
            .verdicts
            .into_iter()
            .zip(observation.nodes.iter().zip(&group.nodes))
        {
            let acted = Box::pin(self.act_on(&observation.name, &name, &verdict, seen, node)).await;
            match &verdict {
                Verdict::Repair { .. } if acted == Some(true) => started += 1,
                Verdict::Paused { .. } => paused += 1,
                _ => {}
            }
            let report = NodeReport {
                node: name,
                instance_id: Some(seen.instance_id.clone()),
                auto_scaling_group: Some(observation.name.clone()),
                outcome: verdict.name().to_owned(),
                why: explain(&verdict, dry_run),
                verdict: Some(verdict),
                acted,
            };
            log_decision(&report, dry_run);
            reports.push(report);
        }
        GroupSummary {
            group: observation.name.clone(),
            nodes: decision.nodes,
            out_of_service: decision.out_of_service,
            unhealthy: decision.unhealthy,
            in_flight: decision.in_flight,
            repairs_started: started,
            repairs_paused: paused,
            paused_by: decision.paused_by,
        }
    }

    /// Acts on one node's verdict: a repair is taken (not in a dry run) and announced, a
    /// pause announced. The answer is the report's `acted` (set for repairs only).
    async fn act_on(
        &mut self,
        group: &str,
        name: &str,
        verdict: &Verdict,
        seen: &NodeObservation,
        node: &Node,
    ) -> Option<bool> {
        match verdict {
            Verdict::Repair {
                problem,
                action,
                attempt,
            } => {
                self.attempted += 1;
                if self.ctx.settings.dry_run {
                    return Some(false);
                }
                let record = RepairRecord {
                    action: *action,
                    at: self.now,
                    attempt: *attempt,
                    condition: problem.condition.clone(),
                    reason: problem.reason.clone(),
                };
                match Box::pin(self.repair(node, seen, &record)).await {
                    Ok(true) => {
                        let note = format!(
                            "{} since {}: {} (attempt {})",
                            problem.describe(),
                            problem.since,
                            action.as_str(),
                            attempt
                        );
                        let started = reason::NODE_REPAIR_STARTED;
                        Box::pin(self.publish(name, node, EventType::Normal, started, note)).await;
                        Some(true)
                    }
                    Ok(false) => Some(false),
                    Err(error) => {
                        self.failures.push(format!("{name}: {error}"));
                        Some(false)
                    }
                }
            }
            Verdict::Paused { problem, limit, .. } => {
                let note = format!(
                    "{} since {}: repairs of Auto Scaling group {group} are paused by {limit}",
                    problem.describe(),
                    problem.since,
                );
                let paused = reason::NODE_REPAIR_PAUSED;
                Box::pin(self.publish(name, node, EventType::Warning, paused, note)).await;
                None
            }
            _ => None,
        }
    }

    /// Records the repair on the node, then acts. `Ok(false)`: the node changed since it was
    /// read (another run got there first): nothing done, the next run decides again.
    async fn repair(
        &self,
        node: &Node,
        seen: &NodeObservation,
        record: &RepairRecord,
    ) -> Result<bool, String> {
        let name = &seen.node;
        // The record first, guarded by the resourceVersion read: of two concurrent runs only
        // one writes it, and only that one acts.
        let patch = json!({
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {REPAIR_ANNOTATION: record.to_annotation()},
            }
        });
        let recorded = match self
            .nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => written,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::info!(node = %name, "node changed since it was read; its repair is left to the next run");
                return Ok(false);
            }
            Err(error) => return Err(format!("cannot record the repair on the node: {error}")),
        };
        if record.action != RepairAction::NoAction && self.ctx.settings.out_of_service_taint {
            Box::pin(self.free_dead_node_pods(recorded, seen)).await;
        }
        let acted = match record.action {
            RepairAction::Replace => {
                self.ctx
                    .health
                    .set_instance_unhealthy(&seen.instance_id)
                    .await
            }
            RepairAction::Reboot => self.ctx.ec2.reboot_instance(&seen.instance_id).await,
            RepairAction::NoAction => Ok(()),
        };
        if let Err(error) = acted {
            // Forget the record so the next run tries again rather than waiting for a repair
            // that never started. Best effort: a failure here only delays the retry.
            let previous = seen.last_repair.as_ref().map(RepairRecord::to_annotation);
            let undo = json!({"metadata": {"annotations": {REPAIR_ANNOTATION: previous}}});
            if let Err(undo_error) = self
                .nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&undo))
                .await
            {
                tracing::warn!(node = %name, error = %undo_error, "could not remove the repair record after the failed action");
            }
            return Err(error.to_string());
        }
        Ok(true)
    }

    /// Before a node whose kubelet is silent is replaced or rebooted: if EC2 shows its
    /// instance down (stopped, or a status check impaired), the out-of-service taint lets
    /// Kubernetes delete its pods and detach their volumes now instead of after the
    /// replacement (see [`crate::node_marks::shutdown`]). Best effort: the repair goes on
    /// whatever this comes to.
    async fn free_dead_node_pods(&self, node: Node, seen: &NodeObservation) {
        let name = &seen.node;
        if !kubelet_silent(&node) {
            return;
        }
        let why = match self.ctx.ec2.instance_condition(&seen.instance_id).await {
            Ok(Some(condition)) => condition.down_because(),
            Ok(None) => Some("EC2 no longer knows it".to_owned()),
            Err(error) => {
                tracing::warn!(node = %name, %error, "cannot read the instance's status: no out-of-service taint");
                return;
            }
        };
        let Some(why) = why else {
            tracing::info!(node = %name, "kubelet silent but EC2 shows the instance running and its status checks not impaired: no out-of-service taint");
            return;
        };
        let record = ShutdownRecord {
            by: FUNCTION_NAME.to_owned(),
            at: self.now,
            why: format!("kubelet silent and instance {}: {why}", seen.instance_id),
        };
        let reference = node_reference(name, node.metadata.uid.as_deref());
        match taint_dead_node(self.nodes, node, Reread::List, &record).await {
            Ok(Tainted::Added) => {
                tracing::info!(step = "out_of_service_taint", node = %name, why = %record.why, "out-of-service taint added: Kubernetes deletes the pods and detaches their volumes now");
                let note = record.event_note();
                let reason = reason::OUT_OF_SERVICE_TAINT_ADDED;
                Box::pin(self.publish_about(name, &reference, EventType::Normal, reason, note))
                    .await;
            }
            Ok(other) => {
                tracing::info!(node = %name, outcome = ?other, "out-of-service taint not added")
            }
            Err(error) => {
                tracing::warn!(node = %name, %error, "could not add the out-of-service taint (the repair goes on)")
            }
        }
    }

    /// Leaves an Event on the node; a failure is logged, never fails the run.
    async fn publish(&self, name: &str, node: &Node, type_: EventType, reason: &str, note: String) {
        let reference = node_reference(name, node.metadata.uid.as_deref());
        Box::pin(self.publish_about(name, &reference, type_, reason, note)).await;
    }

    async fn publish_about(
        &self,
        name: &str,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate_note(note)),
            action: "Repair".to_owned(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, reference).await {
            tracing::warn!(node = %name, reason, %error, "could not record a Kubernetes Event (the repair goes on)");
        }
    }

    /// The run's verdict on its repairs: an error naming each failed one.
    pub(super) fn finish(self) -> Result<(), RepairError> {
        if self.failures.is_empty() {
            Ok(())
        } else {
            Err(RepairError::Repairs {
                attempted: self.attempted,
                failures: self.failures,
            })
        }
    }
}
