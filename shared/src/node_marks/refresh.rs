//! The marks an instance refresh puts on the outdated nodes of a group when it starts, and
//! their record.
//!
//! A node the refresh will replace is taken out of service (load-balancer label, cordon,
//! optional taint) once there is room for its pods, so that pods evicted from the first
//! replaced node land on new nodes, not on the next outdated one (see
//! `crate::instance_refresh`). Until then it is only marked outdated: the `PreferNoSchedule`
//! taint [`OUTDATED_TAINT_KEY`] keeps it schedulable but makes the scheduler put pods
//! elsewhere when it can (the replacements), as cluster-autoscaler's soft taint does for the
//! nodes it may remove. What the write changed is recorded on the node, like the drain's
//! own marks:
//! - the label [`REFRESH_LABEL`] names the refresh, so the refresh's end finds its nodes
//!   with one label-selected list;
//! - the annotation [`REFRESH_ANNOTATION`] holds the [`RefreshMarks`] record.
//!
//! Readers undo or take over exactly what the record says and nothing else: the end of the
//! refresh (cancelled, failed, rolled back, or done with the node kept), the start itself when
//! the refresh ended while it was writing, and the drain (which takes the record into its own
//! checkpoint when the node's turn comes, so that its own undo, on a return from a warm pool,
//! covers it).
//!
//! The API for anyone who keeps marks true to what AWS says now: [`refresh_marks_of`] reads a
//! node's record (the refresh id, its group and instance, and what we added), a list by
//! [`REFRESH_LABEL`] finds every node marked for a refresh, and [`unmark_node`] undoes one
//! node's marks of a given refresh (only what the record says, only where still in place,
//! conditional on the node's `resourceVersion`).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::checkpoint::{OutOfService, drain_holds};
use super::out_of_service::{CordonSteps, Undone, add_undo_to_patch, has_taint_slot};
use super::{PatchStep, Patched, Reread, patch_recomputing};

/// The Node label naming the instance refresh whose marks the node carries.
pub const REFRESH_LABEL: &str = "open-node-manager.io/instance-refresh";

/// The Node annotation holding the [`RefreshMarks`] as JSON.
pub const REFRESH_ANNOTATION: &str = "open-node-manager.io/instance-refresh";

/// The key of the `PreferNoSchedule` taint an instance refresh puts on an outdated node it
/// does not take out of service yet. The key is ours alone: whoever removes the refresh's
/// record (its end, the reconciler, the drain taking the record over) removes the taint.
pub const OUTDATED_TAINT_KEY: &str = "open-node-manager.io/outdated";

/// The taint [`OUTDATED_TAINT_KEY`]: soft, so pods that tolerate nothing still land on the
/// node when no other has room, and nothing is evicted for it.
pub fn outdated_taint() -> Taint {
    Taint {
        key: OUTDATED_TAINT_KEY.to_owned(),
        value: None,
        effect: "PreferNoSchedule".to_owned(),
        time_added: None,
    }
}

/// What an instance refresh changed on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefreshMarks {
    pub instance_refresh_id: String,
    pub auto_scaling_group_name: String,
    pub instance_id: String,
    pub marked_at: Timestamp,
    /// Only what the refresh's write changed: a cordon found in place is not ours.
    pub out_of_service: OutOfService,
    /// Only marked outdated (the taint [`OUTDATED_TAINT_KEY`]), still schedulable: no room
    /// for its pods yet. `false` once the refresh took it out of service.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outdated_only: bool,
}

/// Whether `id` can be a label value (and so an instance refresh id we act on): 1 to 63
/// characters, alphanumerics, `-`, `_` and `.`, alphanumeric at both ends. Auto Scaling's
/// ids are UUIDs.
pub fn is_label_safe(id: &str) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// The refresh record on `node`, if any. An unreadable one counts as none (and records
/// nothing we could undo).
pub fn refresh_marks_of(node: &Node) -> Option<RefreshMarks> {
    let raw = node
        .metadata
        .annotations
        .as_ref()?
        .get(REFRESH_ANNOTATION)?;
    match serde_json::from_str(raw) {
        Ok(marks) => Some(marks),
        Err(error) => {
            tracing::warn!(annotation = REFRESH_ANNOTATION, %error, "ignoring an unreadable instance refresh record");
            None
        }
    }
}

/// Adds to a merge `patch` the refresh's label (naming its refresh), the common marked label
/// and the record `marks`.
fn add_record_to_patch(patch: &mut Value, marks: &RefreshMarks) {
    patch["metadata"]["labels"][REFRESH_LABEL] = json!(marks.instance_refresh_id);
    patch["metadata"]["labels"][super::MARKED_LABEL] = json!("true");
    patch["metadata"]["annotations"][REFRESH_ANNOTATION] =
        json!(serde_json::to_string(marks).unwrap_or_default());
}

/// Adds to a merge `patch` of `node` the removal of the refresh's label, record and
/// [`OUTDATED_TAINT_KEY`] taint (the drain does this in the write that takes the record
/// over). Whether the taint was there.
pub fn add_record_removal_to_patch(patch: &mut Value, node: &Node) -> bool {
    patch["metadata"]["labels"][REFRESH_LABEL] = Value::Null;
    patch["metadata"]["annotations"][REFRESH_ANNOTATION] = Value::Null;
    remove_outdated_taint(patch, node)
}

/// Drops the [`outdated_taint`] (key and effect) from the taints a merge `patch` of `node` writes
/// (the patch's own list when it sets one, else the node's): a merge patch replaces
/// `spec.taints` whole, so it must carry the node's `resourceVersion`. Whether it was there.
fn remove_outdated_taint(patch: &mut Value, node: &Node) -> bool {
    let taints: Vec<Value> = match patch["spec"]["taints"].as_array() {
        Some(written) => written.clone(),
        None => node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|t| {
                t.iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect()
            })
            .unwrap_or_default(),
    };
    let is_outdated =
        |t: &Value| t["key"] == OUTDATED_TAINT_KEY && t["effect"] == "PreferNoSchedule";
    if !taints.iter().any(is_outdated) {
        return false;
    }
    let kept: Vec<Value> = taints.into_iter().filter(|t| !is_outdated(t)).collect();
    patch["spec"]["taints"] = if kept.is_empty() {
        Value::Null
    } else {
        Value::Array(kept)
    };
    true
}

/// Whether `node` carries the [`OUTDATED_TAINT_KEY`] taint.
fn has_outdated_taint(node: &Node) -> bool {
    has_taint_slot(node, &outdated_taint())
}

/// Which mark a node gets: the room rule's choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MarkAs<'a> {
    /// Out of service (load-balancer label, cordon, and this taint if any).
    OutOfService { taint: Option<&'a Taint> },
    /// Outdated only: schedulable, with the [`OUTDATED_TAINT_KEY`] taint.
    Outdated,
}

/// What marking a node came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marked {
    /// Written (or already there): what the node now carries for this refresh.
    Marked(RefreshMarks),
    /// The drain of this node has begun (its checkpoint is on it): the drain owns the marks.
    Draining,
    NodeGone,
}

/// What marking `node` takes.
#[derive(Debug, Clone, PartialEq)]
pub enum MarkStep {
    /// This merge patch (conditional on the node's `resourceVersion`), recording these marks.
    Write(Value, RefreshMarks),
    /// The node carries this refresh's record and every mark already: nothing to write.
    InPlace(RefreshMarks),
    /// The drain of this node has begun: the drain owns the marks.
    Draining,
}

/// Whether a drain of `node` has begun: the drain owns its marks. A rebalance cordon drains
/// nothing: the refresh marks such a node as it would any other (and the reconciler keeps
/// the cordon while the refresh runs).
fn left_to_the_drain(node: &Node) -> bool {
    let cordon_only = super::checkpoint::checkpoint_of(node)
        .is_some_and(|c| c.notice.as_ref().is_some_and(|n| n.cordon_only));
    !cordon_only && drain_holds(node)
}

/// Whether `node` carries [`REFRESH_LABEL`] naming `refresh_id`.
fn labelled_for(node: &Node, refresh_id: &str) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REFRESH_LABEL))
        .is_some_and(|v| v == refresh_id)
}

/// What marking `node` for the refresh takes. Marks of an earlier refresh still on the node
/// (its end was missed) stay ours: the record keeps them.
pub fn mark_step(
    node: &Node,
    refresh_id: &str,
    group_name: &str,
    instance_id: &str,
    taint: Option<&Taint>,
    now: Timestamp,
) -> MarkStep {
    if left_to_the_drain(node) {
        return MarkStep::Draining;
    }
    let existing = refresh_marks_of(node);
    let steps = CordonSteps::needed(node, taint);
    let labelled = labelled_for(node, refresh_id);
    if let Some(existing) = existing
        .as_ref()
        .filter(|m| m.instance_refresh_id == refresh_id && !m.outdated_only)
        && steps.is_done()
        && labelled
        && !has_outdated_taint(node)
    {
        return MarkStep::InPlace(existing.clone());
    }
    let marked_at = existing
        .as_ref()
        .filter(|m| m.instance_refresh_id == refresh_id)
        .map_or(now, |m| m.marked_at);
    let earlier = existing.map(|m| m.out_of_service).unwrap_or_default();
    let marks = RefreshMarks {
        instance_refresh_id: refresh_id.to_owned(),
        auto_scaling_group_name: group_name.to_owned(),
        instance_id: instance_id.to_owned(),
        marked_at,
        out_of_service: earlier.union(&steps.record()),
        outdated_only: false,
    };
    let mut patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version}});
    steps.add_to_patch(&mut patch, node);
    // Out of service now: the soft taint has done its work.
    remove_outdated_taint(&mut patch, node);
    add_record_to_patch(&mut patch, &marks);
    MarkStep::Write(patch, marks)
}

/// What marking `node` outdated (schedulable, with the [`OUTDATED_TAINT_KEY`] taint) for
/// the refresh takes. A node the refresh already took out of service stays so (marked
/// nodes stay marked); a record of an earlier refresh is carried over, as [`mark_step`]
/// does.
pub fn outdated_step(
    node: &Node,
    refresh_id: &str,
    group_name: &str,
    instance_id: &str,
    now: Timestamp,
) -> MarkStep {
    if left_to_the_drain(node) {
        return MarkStep::Draining;
    }
    let existing = refresh_marks_of(node);
    let ours = existing
        .as_ref()
        .filter(|m| m.instance_refresh_id == refresh_id);
    let labelled = labelled_for(node, refresh_id);
    if let Some(marks) = ours
        && labelled
        && (!marks.outdated_only || has_outdated_taint(node))
    {
        return MarkStep::InPlace(marks.clone());
    }
    let marks = RefreshMarks {
        instance_refresh_id: refresh_id.to_owned(),
        auto_scaling_group_name: group_name.to_owned(),
        instance_id: instance_id.to_owned(),
        marked_at: ours.map_or(now, |m| m.marked_at),
        out_of_service: existing.map(|m| m.out_of_service).unwrap_or_default(),
        outdated_only: true,
    };
    let mut patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version}});
    let soft_taint = CordonSteps {
        label: false,
        cordon: false,
        taint: (!has_outdated_taint(node)).then(outdated_taint),
    };
    soft_taint.add_to_patch(&mut patch, node);
    add_record_to_patch(&mut patch, &marks);
    MarkStep::Write(patch, marks)
}

/// The merge patch undoing the refresh's marks on `node` and removing its record, with what
/// it undoes; `None` when the node carries no record of `refresh_id`.
pub fn unmark_patch(node: &Node, refresh_id: &str) -> Option<(Value, Undone)> {
    let marks = refresh_marks_of(node)?;
    if marks.instance_refresh_id != refresh_id {
        return None;
    }
    let mut patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version}});
    let mut undone = add_undo_to_patch(&marks.out_of_service, node, &mut patch);
    if add_record_removal_to_patch(&mut patch, node) && undone.untainted.is_none() {
        undone.untainted = Some(format!("{OUTDATED_TAINT_KEY}:PreferNoSchedule"));
    }
    Some((patch, undone))
}

/// What a failed write of the marks was doing (the function holds `list`, not `get`, on
/// nodes: a conflict re-reads by list).
const WRITING: &str = "its instance refresh marks were written";

/// Marks `node` for the refresh (out of service, or `outdated_only`: schedulable with the
/// [`OUTDATED_TAINT_KEY`] taint), in one conditional write (repeated on conflicts).
pub async fn mark_node(
    nodes: &Api<Node>,
    node: Node,
    refresh_id: &str,
    group_name: &str,
    instance_id: &str,
    mark_as: MarkAs<'_>,
) -> Result<Marked, kube::Error> {
    let now = Timestamp::now();
    let step = |node: &Node| match mark_as {
        MarkAs::OutOfService { taint } => {
            mark_step(node, refresh_id, group_name, instance_id, taint, now)
        }
        MarkAs::Outdated => outdated_step(node, refresh_id, group_name, instance_id, now),
    };
    let patched = patch_recomputing(nodes, node, Reread::List, WRITING, |node| {
        match step(node) {
            MarkStep::Write(patch, marks) => PatchStep::Write(patch, marks),
            MarkStep::InPlace(marks) => PatchStep::Stop(Marked::Marked(marks)),
            MarkStep::Draining => PatchStep::Stop(Marked::Draining),
        }
    })
    .await?;
    Ok(match patched {
        Patched::Written(_, marks) => Marked::Marked(marks),
        Patched::Stopped(marked) => marked,
        Patched::NodeGone => Marked::NodeGone,
    })
}

/// Undoes the refresh's marks on `node` (only what its record says, only where still in
/// place) and removes the record. `Ok(None)`: nothing of this refresh on it (any more).
pub async fn unmark_node(
    nodes: &Api<Node>,
    node: Node,
    refresh_id: &str,
) -> Result<Option<Undone>, kube::Error> {
    let patched = patch_recomputing(
        nodes,
        node,
        Reread::List,
        WRITING,
        |node| match unmark_patch(node, refresh_id) {
            Some((patch, undone)) => PatchStep::Write(patch, undone),
            None => PatchStep::Stop(()),
        },
    )
    .await?;
    Ok(match patched {
        Patched::Written(_, undone) => Some(undone),
        Patched::Stopped(()) | Patched::NodeGone => None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;
    use crate::node_marks::checkpoint::OutOfService;

    const REFRESH: &str = "c613620e-07e2-4ed2-a9e2-ef8258911ade";

    fn node(value: Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn mark_patch(
        node: &Node,
        refresh_id: &str,
        group_name: &str,
        instance_id: &str,
        taint: Option<&Taint>,
        now: Timestamp,
    ) -> Option<(Value, RefreshMarks)> {
        match mark_step(node, refresh_id, group_name, instance_id, taint, now) {
            MarkStep::Write(patch, marks) => Some((patch, marks)),
            _ => None,
        }
    }

    fn apply(node: &Node, patch: &Value) -> Node {
        let mut value = serde_json::to_value(node).unwrap();
        json_patch_merge(&mut value, patch);
        serde_json::from_value(value).unwrap()
    }

    /// RFC 7386 merge, enough for these tests.
    fn json_patch_merge(target: &mut Value, patch: &Value) {
        if let Value::Object(patch) = patch {
            if !target.is_object() {
                *target = json!({});
            }
            let map = target.as_object_mut().unwrap();
            for (key, value) in patch {
                if value.is_null() {
                    map.remove(key);
                } else {
                    json_patch_merge(map.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        } else {
            *target = patch.clone();
        }
    }

    #[test]
    fn marking_records_only_what_it_changed_and_unmarking_undoes_only_that() {
        let user_cordoned = node(json!({
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "spec": {"unschedulable": true},
        }));
        let (patch, marks) = mark_patch(&user_cordoned, REFRESH, "ng", "i-1", None, at(0)).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["metadata"]["labels"][REFRESH_LABEL], REFRESH);
        assert!(marks.out_of_service.labelled);
        assert!(!marks.out_of_service.cordoned, "the cordon was the user's");
        let marked = apply(&user_cordoned, &patch);
        assert_eq!(refresh_marks_of(&marked), Some(marks.clone()));
        assert_eq!(
            mark_step(&marked, REFRESH, "ng", "i-1", None, at(9)),
            MarkStep::InPlace(marks),
            "a repeated start writes nothing"
        );

        let (undo, undone) = unmark_patch(&marked, REFRESH).unwrap();
        assert!(undone.unlabelled && !undone.uncordoned);
        let after = apply(&marked, &undo);
        assert_eq!(after.spec.unwrap().unschedulable, Some(true));
        let labels = after.metadata.labels.unwrap_or_default();
        assert!(!labels.contains_key(EXCLUDE_FROM_LOAD_BALANCERS_LABEL));
        assert!(!labels.contains_key(REFRESH_LABEL));
        assert!(
            !after
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(REFRESH_ANNOTATION)
        );
    }

    #[test]
    fn another_refreshs_record_is_not_undone_but_is_carried_into_a_new_mark() {
        let fresh = node(json!({"metadata": {"name": "n1"}}));
        let (patch, _) = mark_patch(&fresh, "old-refresh", "ng", "i-1", None, at(0)).unwrap();
        let marked = apply(&fresh, &patch);
        assert!(unmark_patch(&marked, REFRESH).is_none());
        let (patch, marks) = mark_patch(&marked, REFRESH, "ng", "i-1", None, at(5)).unwrap();
        assert!(marks.out_of_service.cordoned && marks.out_of_service.labelled);
        assert_eq!(marks.marked_at, at(5));
        let remarked = apply(&marked, &patch);
        let (_, undone) = unmark_patch(&remarked, REFRESH).unwrap();
        assert!(undone.uncordoned && undone.unlabelled);
    }

    #[test]
    fn a_node_whose_drain_has_begun_is_left_to_the_drain() {
        let action = crate::aws::LifecycleActionRef {
            auto_scaling_group_name: "ng".into(),
            lifecycle_hook_name: "h".into(),
            instance_id: "i-1".into(),
            token: "t".into(),
        };
        let checkpoint = crate::node_marks::checkpoint::DrainCheckpoint::start(
            &action,
            at(0),
            std::time::Duration::from_secs(900),
            "req",
            std::time::Duration::from_secs(60),
        );
        let draining = node(json!({"metadata": {"name": "n1", "annotations": {
            crate::node_marks::checkpoint::CHECKPOINT_ANNOTATION: checkpoint.to_json()
        }}}));
        assert_eq!(
            mark_step(&draining, REFRESH, "ng", "i-1", None, at(1)),
            MarkStep::Draining
        );
    }

    fn taint_keys(node: &Node) -> Vec<String> {
        let spec = node.spec.clone().unwrap_or_default();
        spec.taints
            .unwrap_or_default()
            .into_iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect()
    }

    #[test]
    fn an_outdated_node_stays_schedulable_with_the_soft_taint_until_it_is_taken_out() {
        let fresh = node(json!({
            "metadata": {"name": "n1", "resourceVersion": "3"},
            "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]},
        }));
        let MarkStep::Write(patch, marks) = outdated_step(&fresh, REFRESH, "ng", "i-1", at(0))
        else {
            panic!("an unmarked node is written");
        };
        assert!(marks.outdated_only);
        assert_eq!(marks.out_of_service, OutOfService::default());
        assert!(patch["spec"].get("unschedulable").is_none(), "{patch}");
        let outdated = apply(&fresh, &patch);
        assert_eq!(
            taint_keys(&outdated),
            [
                "dedicated:NoSchedule",
                "open-node-manager.io/outdated:PreferNoSchedule"
            ]
        );
        assert_eq!(
            outdated_step(&outdated, REFRESH, "ng", "i-1", at(5)),
            MarkStep::InPlace(marks.clone()),
            "a repeated plan writes nothing"
        );

        // Room came: out of service, the soft taint gone in the same write.
        let (patch, full) = mark_patch(&outdated, REFRESH, "ng", "i-1", None, at(9)).unwrap();
        assert!(!full.outdated_only && full.out_of_service.cordoned);
        assert_eq!(
            full.marked_at,
            at(0),
            "the refresh marked it at its first plan"
        );
        let out = apply(&outdated, &patch);
        assert_eq!(taint_keys(&out), ["dedicated:NoSchedule"]);
        assert_eq!(out.spec.as_ref().unwrap().unschedulable, Some(true));
        assert_eq!(
            outdated_step(&out, REFRESH, "ng", "i-1", at(12)),
            MarkStep::InPlace(full),
            "a marked node stays marked"
        );
    }

    #[test]
    fn undoing_an_outdated_mark_removes_the_soft_taint_and_nothing_else() {
        let fresh = node(json!({
            "metadata": {"name": "n1", "resourceVersion": "3"},
            "spec": {"unschedulable": true, "taints": [
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
            ]},
        }));
        let MarkStep::Write(patch, _) = outdated_step(&fresh, REFRESH, "ng", "i-1", at(0)) else {
            panic!("an unmarked node is written");
        };
        let outdated = apply(&fresh, &patch);
        let (undo, undone) = unmark_patch(&outdated, REFRESH).unwrap();
        assert_eq!(
            undone.untainted.as_deref(),
            Some("open-node-manager.io/outdated:PreferNoSchedule")
        );
        assert!(!undone.uncordoned, "the cordon was somebody else's");
        let after = apply(&outdated, &undo);
        assert_eq!(taint_keys(&after), ["dedicated:NoSchedule"]);
        assert_eq!(after.spec.as_ref().unwrap().unschedulable, Some(true));
        assert!(refresh_marks_of(&after).is_none());

        // The drain taking the record over removes the taint too.
        let mut takeover = json!({"metadata": {"resourceVersion": "4"}});
        assert!(add_record_removal_to_patch(&mut takeover, &outdated));
        assert_eq!(
            apply(&outdated, &takeover)
                .spec
                .unwrap()
                .taints
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn label_safe_ids() {
        assert!(is_label_safe(REFRESH));
        for bad in ["", "-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            assert!(!is_label_safe(bad), "{bad}");
        }
    }
}
