//! Taking the node out of service before its pods leave: out of external load balancers,
//! then unschedulable, then (optionally) tainted.
//!
//! Load balancers first, as EKS does: the service controller starts removing the node while
//! its pods still serve, and the settle period after the drain gives it time to finish.
//! Each step is its own patch, skipped when the node already has it, so a resumed or
//! duplicate drain writes nothing twice.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// The well-known label that makes the service controller drop the node from external load
/// balancers.
pub const EXCLUDE_FROM_LOAD_BALANCERS_LABEL: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";

/// The steps a node still needs.
#[derive(Debug, Clone, PartialEq)]
pub struct CordonSteps {
    pub label: bool,
    pub cordon: bool,
    pub taint: Option<Taint>,
}

impl CordonSteps {
    /// What `node` still lacks (pure).
    pub fn needed(node: &Node, taint: Option<&Taint>) -> Self {
        let labelled = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(EXCLUDE_FROM_LOAD_BALANCERS_LABEL))
            .is_some_and(|v| v == "true");
        let cordoned = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let taint = taint.filter(|wanted| !has_taint(node, wanted)).cloned();
        Self {
            label: !labelled,
            cordon: !cordoned,
            taint,
        }
    }

    pub fn is_done(&self) -> bool {
        !self.label && !self.cordon && self.taint.is_none()
    }
}

fn has_taint(node: &Node, wanted: &Taint) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints.iter().any(|t| {
                t.key == wanted.key && t.effect == wanted.effect && t.value == wanted.value
            })
        })
}

/// What [`cordon`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CordonReport {
    pub labelled: bool,
    pub cordoned: bool,
    pub tainted: bool,
}

/// Brings `node` to labelled + cordoned (+ tainted), patching only what is missing. Returns
/// the node as last written and what changed.
pub async fn cordon(
    nodes: &Api<Node>,
    node: Node,
    taint: Option<&Taint>,
) -> Result<(Node, CordonReport), kube::Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let steps = CordonSteps::needed(&node, taint);
    let mut report = CordonReport::default();
    let mut node = node;
    let params = PatchParams::default();
    if steps.label {
        let patch = json!({"metadata": {"labels": {EXCLUDE_FROM_LOAD_BALANCERS_LABEL: "true"}}});
        node = nodes.patch(&name, &params, &Patch::Merge(&patch)).await?;
        report.labelled = true;
    }
    if steps.cordon {
        let patch = json!({"spec": {"unschedulable": true}});
        node = nodes.patch(&name, &params, &Patch::Merge(&patch)).await?;
        report.cordoned = true;
    }
    if let Some(wanted) = steps.taint {
        node = add_taint(nodes, node, &wanted).await?;
        report.tainted = true;
    }
    Ok((node, report))
}

/// Appends a taint: `spec.taints` is a list a merge patch replaces whole, so the write
/// carries the resourceVersion it was computed from and is redone on a conflict.
async fn add_taint(nodes: &Api<Node>, node: Node, wanted: &Taint) -> Result<Node, kube::Error> {
    const ATTEMPTS: u32 = 5;
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut node = node;
    let mut attempt = 0;
    loop {
        if has_taint(&node, wanted) {
            return Ok(node);
        }
        let mut taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        taints.retain(|t| !(t.key == wanted.key && t.effect == wanted.effect));
        taints.push(wanted.clone());
        let patch = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": taints},
        });
        match nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => return Ok(written),
            Err(kube::Error::Api(status)) if status.is_conflict() && attempt + 1 < ATTEMPTS => {
                attempt += 1;
                node = nodes.get(&name).await?;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    fn taint() -> Taint {
        Taint {
            key: "open-node-manager.io/draining".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }
    }

    #[test]
    fn fresh_node_needs_every_step() {
        let n = node(json!({"metadata": {"name": "n1"}}));
        let steps = CordonSteps::needed(&n, Some(&taint()));
        assert!(steps.label && steps.cordon);
        assert_eq!(steps.taint, Some(taint()));
        assert!(!CordonSteps::needed(&n, None).is_done());
    }

    #[test]
    fn steps_in_place_are_skipped() {
        let n = node(json!({
            "metadata": {"name": "n1", "labels": {EXCLUDE_FROM_LOAD_BALANCERS_LABEL: "true"}},
            "spec": {"unschedulable": true, "taints": [
                {"key": "open-node-manager.io/draining", "value": "true", "effect": "NoSchedule"}
            ]},
        }));
        assert!(CordonSteps::needed(&n, Some(&taint())).is_done());
        assert!(CordonSteps::needed(&n, None).is_done());
    }

    #[test]
    fn a_label_with_another_value_is_corrected() {
        let n = node(json!({
            "metadata": {"name": "n1", "labels": {EXCLUDE_FROM_LOAD_BALANCERS_LABEL: "false"}},
            "spec": {"unschedulable": true},
        }));
        let steps = CordonSteps::needed(&n, None);
        assert!(steps.label);
        assert!(!steps.cordon);
    }
}
