//! Taking a node out of service, and undoing exactly that: out of external load balancers,
//! unschedulable, and (optionally) tainted.
//!
//! The label makes the service controller start removing the node from external load
//! balancers while its pods still serve (as EKS does); the settle period after the drain
//! gives it time to finish. The drain puts all three into the write that claims it
//! ([`crate::drain::lease::claim`]), the instance refresh into the write that records its
//! marks ([`super::refresh`]); either writes only what the node still lacks, so a resumed or
//! duplicate write changes nothing twice, and records only what it changed, so that
//! [`add_undo_to_patch`] removes nothing somebody else put there.

use k8s_openapi::api::core::v1::{Node, Taint};
use serde::Serialize;
use serde_json::{Value, json};

use super::checkpoint::{AddedTaint, OutOfService};

use super::{EXCLUDE_FROM_LOAD_BALANCERS_LABEL, excluded_from_load_balancers};

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
        let labelled = excluded_from_load_balancers(node);
        let cordoned = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        // A taint with the wanted key and effect already there (ours from an earlier claim,
        // or a user's with any value) is left as it is and not recorded as added: only a
        // taint this drain adds is ours to remove later.
        let taint = taint
            .filter(|wanted| !has_taint_slot(node, wanted))
            .cloned();
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

/// Whether `node` has a taint with `wanted`'s key and effect, whatever its value: the API
/// server keeps one taint per key and effect, so that slot is taken.
pub(crate) fn has_taint_slot(node: &Node, wanted: &Taint) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|t| t.key == wanted.key && t.effect == wanted.effect)
        })
}

/// What taking the node out of service changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CordonReport {
    pub labelled: bool,
    pub cordoned: bool,
    pub tainted: bool,
}

impl CordonReport {
    pub fn changed_anything(&self) -> bool {
        self.labelled || self.cordoned || self.tainted
    }
}

impl CordonSteps {
    /// What writing these steps changes.
    pub fn report(&self) -> CordonReport {
        CordonReport {
            labelled: self.label,
            cordoned: self.cordon,
            tainted: self.taint.is_some(),
        }
    }

    /// What writing these steps changes, as the checkpoint records it (see
    /// [`OutOfService`]).
    pub fn record(&self) -> OutOfService {
        OutOfService {
            labelled: self.label,
            cordoned: self.cordon,
            taint: self.taint.as_ref().map(AddedTaint::of),
        }
    }

    /// Adds the missing steps to a merge `patch` of `node`. `spec.taints` is a list a merge
    /// patch replaces whole, so the taints are `node`'s plus the wanted one (only wanted when
    /// no taint has its key and effect, see [`Self::needed`]): the patch must carry `node`'s
    /// `resourceVersion` (the claim's does) so a concurrent change of the taints is a
    /// conflict, not lost.
    pub fn add_to_patch(&self, patch: &mut Value, node: &Node) {
        if self.label {
            patch["metadata"]["labels"][EXCLUDE_FROM_LOAD_BALANCERS_LABEL] = json!("true");
        }
        if self.cordon {
            patch["spec"]["unschedulable"] = json!(true);
        }
        if let Some(wanted) = &self.taint {
            let mut taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            taints.push(wanted.clone());
            patch["spec"]["taints"] = json!(taints);
        }
    }
}

/// What undoing recorded marks removed from a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Undone {
    /// `spec.unschedulable` cleared.
    pub uncordoned: bool,
    /// The exclude-from-external-load-balancers label removed.
    pub unlabelled: bool,
    /// The taint removed (`key=value:Effect`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untainted: Option<String>,
}

impl Undone {
    pub fn changed_anything(&self) -> bool {
        self.uncordoned || self.unlabelled || self.untainted.is_some()
    }

    /// The undone items, for log lines and Events.
    pub fn items(&self) -> Vec<String> {
        let mut items = Vec::new();
        if self.uncordoned {
            items.push("uncordoned".to_owned());
        }
        if self.unlabelled {
            items.push(format!("label {EXCLUDE_FROM_LOAD_BALANCERS_LABEL} removed"));
        }
        if let Some(taint) = &self.untainted {
            items.push(format!("taint {taint} removed"));
        }
        items
    }
}

/// Adds to the merge `patch` of `node` the removal of the marks `ours` records, each only
/// where it is still in place; a cordon or taint somebody else put there (the record says
/// we did not) stays. `spec.taints` is replaced whole by a merge patch, so the patch must
/// carry `node`'s `resourceVersion` for a concurrent change to be a conflict, not lost.
pub fn add_undo_to_patch(ours: &OutOfService, node: &Node, patch: &mut Value) -> Undone {
    let mut undone = Undone::default();
    if ours.labelled && excluded_from_load_balancers(node) {
        patch["metadata"]["labels"][EXCLUDE_FROM_LOAD_BALANCERS_LABEL] = Value::Null;
        undone.unlabelled = true;
    }
    let spec = node.spec.as_ref();
    if ours.cordoned && spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        patch["spec"]["unschedulable"] = Value::Null;
        undone.uncordoned = true;
    }
    if let Some(taint) = &ours.taint {
        let taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
        if taints.iter().any(|t| taint.is(t)) {
            let kept: Vec<_> = taints.into_iter().filter(|t| !taint.is(t)).collect();
            patch["spec"]["taints"] = if kept.is_empty() {
                Value::Null
            } else {
                json!(kept)
            };
            undone.untainted = Some(match &taint.value {
                Some(value) => format!("{}={value}:{}", taint.key, taint.effect),
                None => format!("{}:{}", taint.key, taint.effect),
            });
        }
    }
    undone
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

    #[test]
    fn a_taint_with_the_same_key_and_effect_is_never_taken_over() {
        // A user's taint in the slot (another value): not replaced, not recorded as ours.
        let n = node(json!({
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "spec": {"taints": [
                {"key": "open-node-manager.io/draining", "value": "user", "effect": "NoSchedule"}
            ]},
        }));
        let steps = CordonSteps::needed(&n, Some(&taint()));
        assert_eq!(steps.taint, None);
        assert_eq!(steps.record().taint, None);
        let mut patch = json!({"metadata": {"resourceVersion": "7"}});
        steps.add_to_patch(&mut patch, &n);
        assert!(patch["spec"].get("taints").is_none(), "{patch}");
        assert!(!steps.report().tainted);
        // The same key with another effect is another slot: ours is added.
        let other_effect = node(json!({
            "metadata": {"name": "n1"},
            "spec": {"taints": [
                {"key": "open-node-manager.io/draining", "value": "user", "effect": "NoExecute"}
            ]},
        }));
        let steps = CordonSteps::needed(&other_effect, Some(&taint()));
        assert_eq!(steps.taint, Some(taint()));
    }

    #[test]
    fn the_patch_adds_only_missing_steps_and_keeps_other_taints() {
        let n = node(json!({
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "spec": {"taints": [
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
            ]},
        }));
        let steps = CordonSteps::needed(&n, Some(&taint()));
        let mut patch = json!({"metadata": {"resourceVersion": "7"}});
        steps.add_to_patch(&mut patch, &n);
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "resourceVersion": "7",
                    "labels": {EXCLUDE_FROM_LOAD_BALANCERS_LABEL: "true"},
                },
                "spec": {
                    "unschedulable": true,
                    "taints": [
                        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                        {"key": "open-node-manager.io/draining", "value": "true", "effect": "NoSchedule"}
                    ],
                },
            })
        );
        assert_eq!(
            steps.report(),
            CordonReport {
                labelled: true,
                cordoned: true,
                tainted: true
            }
        );

        let done = node(json!({
            "metadata": {"name": "n1", "labels": {EXCLUDE_FROM_LOAD_BALANCERS_LABEL: "true"}},
            "spec": {"unschedulable": true},
        }));
        let steps = CordonSteps::needed(&done, None);
        let mut patch = json!({"metadata": {"resourceVersion": "8"}});
        steps.add_to_patch(&mut patch, &done);
        assert_eq!(patch, json!({"metadata": {"resourceVersion": "8"}}));
        assert!(!steps.report().changed_anything());
    }
}
