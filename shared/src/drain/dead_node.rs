//! A drain that meets a dead kubelet: pods it evicted stay `Terminating` (nothing confirms
//! their deletion) and their volumes stay attached for the attach/detach controller's six
//! minutes. Once such deletions are reported stuck and the node's kubelet is silent
//! (`Ready=Unknown`), the drain puts Kubernetes' out-of-service taint on the node
//! ([`crate::node_marks::shutdown`]): the pod garbage collector deletes them and their
//! volumes detach now, so the volume wait and the replacements do not sit out the timeout.
//! The instance is on its way out (its lifecycle action is this drain's), so its containers
//! end with it anyway. Tried once per invocation after the stuck pods are reported and every
//! pod of the node was asked to leave (the taint-eviction controller deletes whatever it finds
//! without an eviction, so a pod of a later tier, the critical one, is evicted through its
//! budget first); never on a node whose kubelet answers; `OUT_OF_SERVICE_TAINT=false` turns
//! it off.

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::session::DrainSession;
use crate::node_marks::shutdown::{
    Reread, ShutdownRecord, TAINT_ADDED_REASON, Tainted, taint_dead_node,
};

impl DrainSession<'_> {
    /// Adds the out-of-service taint if the node's kubelet is silent (checked on the node as
    /// read now); a failure is logged and the drain goes on (the stuck pods no longer hold
    /// it).
    pub(super) async fn free_dead_node_pods(&mut self) {
        self.dead_node_check_due = false;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let record = ShutdownRecord {
            by: crate::drain::drainer::FUNCTION_NAME.to_owned(),
            at: jiff::Timestamp::now(),
            why: format!(
                "kubelet silent while draining for instance {}, with {} pod deletion(s) stuck",
                self.checkpoint.action.instance_id,
                self.reported_stuck.len()
            ),
        };
        let node = match nodes.get_opt(&self.node_name).await {
            Ok(Some(node)) => node,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(node = %self.node_name, %error, "could not read the node for the out-of-service taint (the drain goes on)");
                return;
            }
        };
        match taint_dead_node(&nodes, node, Reread::Get, &record).await {
            Ok(Tainted::Added) => {
                tracing::info!(step = "out_of_service_taint", node = %self.node_name, why = %record.why, "out-of-service taint added: Kubernetes deletes the stuck pods and detaches their volumes now");
                let note = record.event_note();
                self.events
                    .normal(&self.node_reference(), TAINT_ADDED_REASON, note);
            }
            Ok(other) => {
                tracing::info!(node = %self.node_name, outcome = ?other, "out-of-service taint not added");
            }
            Err(error) => {
                tracing::warn!(node = %self.node_name, %error, "could not add the out-of-service taint (the drain goes on)");
            }
        }
    }
}
