//! Kubernetes' non-graceful node shutdown for a node whose kubelet is gone: the
//! `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` taint, with its record.
//!
//! A dead kubelet confirms no deletion: the node's pods stay `Terminating` and their volumes
//! stay attached (the attach/detach controller waits six minutes for an unmount nobody
//! reports, then the multi-attach error holds the replacement pods). With the taint on a node
//! that is not Ready, the taint-eviction controller deletes the pods that do not tolerate it,
//! the pod garbage collector force-deletes the node's terminating pods, and the attach/detach
//! controller detaches their volumes at once. Node repair puts it on a node it replaces or
//! reboots because EC2 shows the instance stopped or impaired ([`crate::node_repair::act`]),
//! the drain on a node whose kubelet is silent while pods are stuck terminating
//! ([`crate::drain`]). Never on a node whose kubelet answers: its `Ready` condition must be
//! `Unknown` (the node lifecycle controller's mark for a kubelet that stopped posting
//! status), checked again on the node as written.
//!
//! The record ([`SHUTDOWN_ANNOTATION`]) says who put the taint there and why; only a taint we
//! added is recorded, and the reconciler ([`crate::reconcile`]) lifts exactly that one once
//! the node is Ready again (a rebooted or restarted instance whose kubelet is back). A node
//! whose instance is gone is deleted with its taint.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use super::Reread;
use super::{MARKED_LABEL, PatchStep, Patched, patch_recomputing};
use crate::lifecycle::node::{is_ready, ready_condition};

/// The taint's key, value and effect (Kubernetes' own, GA since 1.28).
pub const OUT_OF_SERVICE_TAINT_KEY: &str = "node.kubernetes.io/out-of-service";
pub const OUT_OF_SERVICE_TAINT_VALUE: &str = "nodeshutdown";
pub const OUT_OF_SERVICE_TAINT_EFFECT: &str = "NoExecute";

/// The reason of the Event on the node when we add the taint.
pub const TAINT_ADDED_REASON: &str = "OutOfServiceTaintAdded";

/// The record of a taint we added (JSON, [`ShutdownRecord`]).
pub const SHUTDOWN_ANNOTATION: &str = "open-node-manager.io/out-of-service";

/// Who added the taint, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownRecord {
    /// The function that added it (`node-repair`, `terminating-hook`).
    pub by: String,
    pub at: Timestamp,
    /// What showed the kubelet gone (the instance's state, the stuck pods).
    pub why: String,
}

impl ShutdownRecord {
    /// The note of the Event on the node when the taint is added.
    pub fn event_note(&self) -> String {
        format!("{OUT_OF_SERVICE_TAINT_KEY} added: {}", self.why)
    }

    /// The record on `node`, if any (an unreadable one is no record: nothing of it is undone).
    pub fn of(node: &Node) -> Option<Self> {
        let text = node
            .metadata
            .annotations
            .as_ref()?
            .get(SHUTDOWN_ANNOTATION)?;
        serde_json::from_str(text).ok()
    }
}

/// Whether the node's kubelet has stopped posting status: its `Ready` condition is `Unknown`.
/// `False` is a kubelet that answers (it reports the node not ready); no condition at all is
/// a node that never registered its status, which says nothing either.
pub fn kubelet_silent(node: &Node) -> bool {
    ready_condition(node).is_some_and(|c| c.status == "Unknown")
}

/// Whether `node` carries the out-of-service taint, whatever its value (the controllers
/// look at the key only).
fn has_out_of_service_taint(node: &Node) -> bool {
    taints(node)
        .iter()
        .any(|t| t.key == OUT_OF_SERVICE_TAINT_KEY)
}

fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// Whether `node` carries the taint exactly as we write it (key, value and effect).
pub fn carries_our_taint(node: &Node) -> bool {
    taints(node).iter().any(is_ours)
}

fn is_ours(taint: &Taint) -> bool {
    taint.key == OUT_OF_SERVICE_TAINT_KEY
        && taint.value.as_deref() == Some(OUT_OF_SERVICE_TAINT_VALUE)
        && taint.effect == OUT_OF_SERVICE_TAINT_EFFECT
}

/// What [`taint_dead_node`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tainted {
    /// The taint and its record were written.
    Added,
    /// The node already carries an out-of-service taint (ours or somebody's): left as it is.
    AlreadyTainted,
    /// The node's kubelet answers (`Ready` is not `Unknown`): never tainted.
    KubeletAnswers,
    NodeGone,
}

/// Puts the out-of-service taint on `node` (as just read) with its record, if its kubelet
/// is silent and no such taint is there; on a conflict the node is read again (`reread`,
/// for a function that may only list nodes) and every check made again.
pub async fn taint_dead_node(
    nodes: &Api<Node>,
    node: Node,
    reread: Reread,
    record: &ShutdownRecord,
) -> Result<Tainted, kube::Error> {
    let annotation = serde_json::to_string(record).unwrap_or_default();
    let written = patch_recomputing(
        nodes,
        node,
        reread,
        "adding the out-of-service taint",
        |node| {
            if !kubelet_silent(node) {
                return PatchStep::Stop(Tainted::KubeletAnswers);
            }
            if has_out_of_service_taint(node) {
                return PatchStep::Stop(Tainted::AlreadyTainted);
            }
            let mut taints = taints(node);
            taints.push(Taint {
                key: OUT_OF_SERVICE_TAINT_KEY.to_owned(),
                value: Some(OUT_OF_SERVICE_TAINT_VALUE.to_owned()),
                effect: OUT_OF_SERVICE_TAINT_EFFECT.to_owned(),
                time_added: Some(Time(record.at)),
            });
            let patch = json!({
                "metadata": {
                    "resourceVersion": node.metadata.resource_version,
                    "labels": {MARKED_LABEL: "true"},
                    "annotations": {SHUTDOWN_ANNOTATION: annotation},
                },
                "spec": {"taints": taints},
            });
            PatchStep::Write(patch, ())
        },
    )
    .await?;
    Ok(match written {
        Patched::Written(..) => Tainted::Added,
        Patched::Stopped(why) => why,
        Patched::NodeGone => Tainted::NodeGone,
    })
}

/// Lifts the taint `record` stands for from `node` and removes the record, if the node still
/// carries exactly that record and is Ready; what was undone (`None`: the node changed and
/// the record is left to the next run). A taint somebody else changed (another value) is
/// theirs: only the record goes then.
pub async fn lift_shutdown_taint(
    nodes: &Api<Node>,
    node: Node,
    record: &ShutdownRecord,
) -> Result<Option<Vec<String>>, kube::Error> {
    let written = patch_recomputing(
        nodes,
        node,
        Reread::Get,
        "lifting the out-of-service taint",
        |node| {
            if ShutdownRecord::of(node).as_ref() != Some(record) || !is_ready(node) {
                return PatchStep::Stop(());
            }
            let mut patch = json!({"metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {SHUTDOWN_ANNOTATION: Value::Null},
            }});
            let mut undone = Vec::new();
            let before = taints(node);
            if before.iter().any(is_ours) {
                let after: Vec<Taint> = before.into_iter().filter(|t| !is_ours(t)).collect();
                patch["spec"]["taints"] = json!(after);
                undone.push(format!(
                    "taint {OUT_OF_SERVICE_TAINT_KEY}={OUT_OF_SERVICE_TAINT_VALUE}:{OUT_OF_SERVICE_TAINT_EFFECT} removed"
                ));
            }
            PatchStep::Write(patch, undone)
        },
    )
    .await?;
    Ok(match written {
        Patched::Written(_, undone) => Some(undone),
        Patched::Stopped(()) | Patched::NodeGone => None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(ready: &str, taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_silent_kubelet_counts_as_gone() {
        assert!(kubelet_silent(&node("Unknown", json!([]))));
        assert!(!kubelet_silent(&node("False", json!([]))));
        assert!(!kubelet_silent(&node("True", json!([]))));
        let unregistered: Node =
            serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        assert!(!kubelet_silent(&unregistered));
    }

    #[test]
    fn any_out_of_service_taint_counts_but_only_ours_is_lifted() {
        let theirs = node(
            "Unknown",
            json!([{"key": OUT_OF_SERVICE_TAINT_KEY, "value": "fenced", "effect": "NoExecute"}]),
        );
        assert!(has_out_of_service_taint(&theirs));
        assert!(!carries_our_taint(&theirs));
        let ours = node(
            "Unknown",
            json!([{"key": OUT_OF_SERVICE_TAINT_KEY, "value": OUT_OF_SERVICE_TAINT_VALUE, "effect": "NoExecute"}]),
        );
        assert!(carries_our_taint(&ours));
    }

    #[test]
    fn the_record_reads_back() {
        let record = ShutdownRecord {
            by: "node-repair".into(),
            at: "2026-12-07T03:00:00Z".parse().unwrap(),
            why: "instance i-1 is stopped".into(),
        };
        let mut n = node("Unknown", json!([]));
        n.metadata.annotations = Some(
            [(
                SHUTDOWN_ANNOTATION.to_owned(),
                serde_json::to_string(&record).unwrap(),
            )]
            .into(),
        );
        assert_eq!(ShutdownRecord::of(&n), Some(record));
        n.metadata.annotations = Some([(SHUTDOWN_ANNOTATION.to_owned(), "{".to_owned())].into());
        assert_eq!(ShutdownRecord::of(&n), None);
    }
}
