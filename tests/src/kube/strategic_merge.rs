//! Strategic merge patch (`application/strategic-merge-patch+json`) over `serde_json::Value`,
//! following apimachinery's `strategicpatch` package for the kinds the fake API server serves.
//!
//! The rules, as the real server applies them:
//! - maps merge recursively; `null` deletes a key;
//! - a list merges only when its Go field declares `patchStrategy:"merge"`: by
//!   `patchMergeKey` for lists of objects (`status.conditions` by `type`,
//!   `metadata.ownerReferences` by `uid`, `spec.containers` by `name`), as a set for lists of
//!   scalars (`metadata.finalizers`); every other list is replaced (notably a Node's
//!   `spec.taints`, which is atomic);
//! - in a merged list, elements already on the server keep their order and elements named by
//!   the patch are placed by the patch's order (new elements first), as
//!   `normalizeElementOrder` does;
//! - directives: `$patch: replace | delete` on a map or a list element, `$retainKeys`,
//!   `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>`;
//! - kinds without a schema here get the same algorithm with every list replaced, which for
//!   ordinary patches is exactly a JSON merge patch (RFC 7386).
//!
//! Values the patch introduces are stored without directives and `null`s, as the real
//! server's decode into typed objects would leave them.

use serde_json::{Map, Value};

/// Why a patch could not be applied. [`PatchError::status_code`] is the HTTP status the
/// real API server answers (`interpretStrategicMergePatchError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The object or the patch is not a JSON object.
    #[error("invalid JSON document")]
    BadJsonDocument,
    #[error("invalid patch format of primitive list")]
    BadPrimitiveList,
    #[error("invalid patch format of retainKeys")]
    BadRetainKeys,
    #[error("invalid patch format of setElementOrder list")]
    BadSetElementOrder,
    #[error("lists of lists are not supported")]
    ListOfLists,
    /// An element of a merged list lacks the field it is merged by.
    #[error("map: {element} does not contain declared merge key: {merge_key}")]
    NoMergeKey { element: String, merge_key: String },
    /// `$patch` with a value other than `replace`/`delete` (or `merge` in a list).
    #[error("unknown patch type: {directive} in map: {map}")]
    UnknownPatchType { directive: String, map: String },
    #[error("merging lists cannot yet be specified in the patch")]
    MergeDirectiveInList,
    /// Mixed element types in a merged list, or objects in a list merged as a set.
    #[error("{message}")]
    IncompatibleList { message: String },
}

impl PatchError {
    /// 400 for malformed patches, 422 for unsupported shapes, 500 for the rest.
    pub fn status_code(&self) -> u16 {
        match self {
            Self::BadJsonDocument
            | Self::BadPrimitiveList
            | Self::BadRetainKeys
            | Self::BadSetElementOrder => 400,
            Self::ListOfLists => 422,
            Self::NoMergeKey { .. }
            | Self::UnknownPatchType { .. }
            | Self::MergeDirectiveInList
            | Self::IncompatibleList { .. } => 500,
        }
    }
}

/// How the elements of one list field are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// The patch's list replaces the server's (no `patchStrategy`, or `listType=atomic`).
    Replace,
    /// A set of scalars (`patchStrategy:"merge"` without a merge key).
    MergeScalars,
    /// Objects merged by the named field (`patchMergeKey`).
    MergeByKey(&'static str),
}

/// Fields of a pod spec (also found under `spec.template.` of workloads).
const POD_LISTS: &[(&str, ListStrategy)] = &[
    ("spec.containers", ListStrategy::MergeByKey("name")),
    ("spec.initContainers", ListStrategy::MergeByKey("name")),
    ("spec.ephemeralContainers", ListStrategy::MergeByKey("name")),
    (
        "spec.containers.ports",
        ListStrategy::MergeByKey("containerPort"),
    ),
    (
        "spec.initContainers.ports",
        ListStrategy::MergeByKey("containerPort"),
    ),
    ("spec.containers.env", ListStrategy::MergeByKey("name")),
    ("spec.initContainers.env", ListStrategy::MergeByKey("name")),
    (
        "spec.ephemeralContainers.env",
        ListStrategy::MergeByKey("name"),
    ),
    (
        "spec.containers.volumeMounts",
        ListStrategy::MergeByKey("mountPath"),
    ),
    (
        "spec.initContainers.volumeMounts",
        ListStrategy::MergeByKey("mountPath"),
    ),
    (
        "spec.ephemeralContainers.volumeMounts",
        ListStrategy::MergeByKey("mountPath"),
    ),
    (
        "spec.containers.volumeDevices",
        ListStrategy::MergeByKey("devicePath"),
    ),
    (
        "spec.initContainers.volumeDevices",
        ListStrategy::MergeByKey("devicePath"),
    ),
    ("spec.volumes", ListStrategy::MergeByKey("name")),
    ("spec.imagePullSecrets", ListStrategy::MergeByKey("name")),
    ("spec.hostAliases", ListStrategy::MergeByKey("ip")),
    (
        "spec.topologySpreadConstraints",
        ListStrategy::MergeByKey("topologyKey"),
    ),
    ("spec.schedulingGates", ListStrategy::MergeByKey("name")),
    ("spec.resourceClaims", ListStrategy::MergeByKey("name")),
];

const POD_STATUS_LISTS: &[(&str, ListStrategy)] = &[
    ("status.conditions", ListStrategy::MergeByKey("type")),
    ("status.podIPs", ListStrategy::MergeByKey("ip")),
    ("status.hostIPs", ListStrategy::MergeByKey("ip")),
    (
        "status.resourceClaimStatuses",
        ListStrategy::MergeByKey("name"),
    ),
];

const NODE_LISTS: &[(&str, ListStrategy)] = &[
    // `spec.taints` is deliberately absent: the field is atomic, a patch replaces it.
    ("spec.podCIDRs", ListStrategy::MergeScalars),
    ("status.conditions", ListStrategy::MergeByKey("type")),
    ("status.addresses", ListStrategy::MergeByKey("type")),
];

const CONDITIONS_BY_TYPE: &[(&str, ListStrategy)] =
    &[("status.conditions", ListStrategy::MergeByKey("type"))];

/// Kinds whose list strategies are known here (the others replace every list).
const KNOWN_KINDS: &[&str] = &[
    "Pod",
    "Node",
    "ConfigMap",
    "Event",
    "PodDisruptionBudget",
    "Namespace",
    "ReplicaSet",
    "Deployment",
    "DaemonSet",
    "StatefulSet",
];

/// Whether `kind` has a strategic merge schema here. (The real server refuses strategic
/// merge patches for custom resources with 415; the fake may choose to do the same.)
pub fn has_strategic_schema(kind: &str) -> bool {
    KNOWN_KINDS.contains(&kind)
}

/// The strategy of the list at `path` (dotted field names, list positions omitted, e.g.
/// `spec.containers.env`) in an object of `kind`.
pub fn list_strategy(kind: &str, path: &str) -> ListStrategy {
    let lookup = |table: &[(&str, ListStrategy)], path: &str| {
        table
            .iter()
            .find(|(field, _)| *field == path)
            .map(|(_, strategy)| *strategy)
    };
    // Every object's metadata, including pod templates' metadata.
    let metadata_path = path
        .strip_prefix("spec.template.")
        .unwrap_or(path)
        .strip_prefix("metadata.");
    match metadata_path {
        Some("ownerReferences") => return ListStrategy::MergeByKey("uid"),
        Some("finalizers") => return ListStrategy::MergeScalars,
        _ => {}
    }
    let found = match kind {
        "Pod" => lookup(POD_LISTS, path).or_else(|| lookup(POD_STATUS_LISTS, path)),
        "Node" => lookup(NODE_LISTS, path),
        "PodDisruptionBudget" | "Namespace" => lookup(CONDITIONS_BY_TYPE, path),
        "ReplicaSet" | "Deployment" | "DaemonSet" | "StatefulSet" => path
            .strip_prefix("spec.template.")
            .and_then(|pod_path| lookup(POD_LISTS, pod_path))
            .or_else(|| lookup(CONDITIONS_BY_TYPE, path)),
        _ => None,
    };
    found.unwrap_or(ListStrategy::Replace)
}

/// Applies a strategic merge patch to an object of `kind` (`"Node"`, `"Pod"`, ...).
pub fn strategic_merge_patch(
    kind: &str,
    original: &Value,
    patch: &Value,
) -> Result<Value, PatchError> {
    let (Value::Object(original), Value::Object(patch)) = (original, patch) else {
        return Err(PatchError::BadJsonDocument);
    };
    let patcher = Patcher { kind };
    patcher
        .merge_map(original.clone(), patch.clone(), "")
        .map(Value::Object)
}

/// A JSON merge patch (RFC 7386, `application/merge-patch+json`): objects merge
/// recursively, `null` deletes, anything else (lists included) replaces.
pub fn json_merge_patch(original: &Value, patch: &Value) -> Value {
    let Value::Object(patch) = patch else {
        return patch.clone();
    };
    let mut result = match original {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    for (key, value) in patch {
        if value.is_null() {
            result.remove(key);
        } else {
            let merged = json_merge_patch(result.get(key).unwrap_or(&Value::Null), value);
            result.insert(key.clone(), merged);
        }
    }
    Value::Object(result)
}

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

struct Patcher<'a> {
    kind: &'a str,
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A value as the typed decode would keep it: without directives and `null` map entries,
/// without list elements that only asked for their own deletion.
fn clean(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(key, value)| !key.starts_with('$') && !value.is_null())
                .map(|(key, value)| (key, clean(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .filter(|item| item.get(DIRECTIVE).and_then(Value::as_str) != Some("delete"))
                .map(clean)
                .collect(),
        ),
        other => other,
    }
}

fn compact(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

impl Patcher<'_> {
    fn merge_map(
        &self,
        mut original: Map<String, Value>,
        mut patch: Map<String, Value>,
        path: &str,
    ) -> Result<Map<String, Value>, PatchError> {
        if let Some(directive) = patch.get(DIRECTIVE) {
            return match directive.as_str() {
                Some("replace") => {
                    patch.remove(DIRECTIVE);
                    match clean(Value::Object(patch)) {
                        Value::Object(map) => Ok(map),
                        _ => Ok(Map::new()),
                    }
                }
                // The map itself is emptied (the key stays), as in apimachinery.
                Some("delete") => Ok(Map::new()),
                _ => Err(PatchError::UnknownPatchType {
                    directive: directive
                        .as_str()
                        .map_or_else(|| compact(directive), str::to_owned),
                    map: compact(&patch),
                }),
            };
        }

        if let Some(retain) = patch.remove(RETAIN_KEYS) {
            let Value::Array(retain) = retain else {
                return Err(PatchError::BadRetainKeys);
            };
            let retained: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
            let unlisted_patch_key = patch.iter().any(|(key, value)| {
                !value.is_null()
                    && !key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
                    && !key.starts_with(SET_ELEMENT_ORDER)
                    && !retained.contains(&key.as_str())
            });
            if unlisted_patch_key {
                return Err(PatchError::BadRetainKeys);
            }
            original.retain(|key, _| retained.contains(&key.as_str()));
        }

        // `$setElementOrder/<field>`: merge that field's list now and order it as told.
        let order_keys: Vec<String> = patch
            .keys()
            .filter(|key| key.starts_with(SET_ELEMENT_ORDER))
            .cloned()
            .collect();
        for order_key in order_keys {
            let Some(Value::Array(order)) = patch.remove(&order_key) else {
                return Err(PatchError::BadSetElementOrder);
            };
            let field = &order_key[SET_ELEMENT_ORDER.len()..];
            if field.is_empty() {
                return Err(PatchError::BadSetElementOrder);
            }
            let field_path = child_path(path, field);
            let strategy = list_strategy(self.kind, &field_path);
            let server = match original.get(field) {
                None => None,
                Some(Value::Array(list)) => Some(list.clone()),
                Some(_) => return Err(PatchError::BadSetElementOrder),
            };
            let patch_list = match patch.remove(field) {
                None => None,
                Some(Value::Array(list)) => Some(list),
                Some(_) => return Err(PatchError::BadSetElementOrder),
            };
            let merged = match (server.clone(), patch_list) {
                (None, None) => continue,
                (Some(server), None) => server,
                (None, Some(patch_list)) => match clean(Value::Array(patch_list)) {
                    Value::Array(list) => list,
                    _ => Vec::new(),
                },
                (Some(server), Some(patch_list)) => {
                    self.merge_list(server, patch_list, strategy, &field_path)?
                }
            };
            let merge_key = match strategy {
                ListStrategy::MergeByKey(key) => Some(key),
                _ => None,
            };
            let ordered = order_like_kubernetes(
                merged,
                &order,
                server.as_deref().unwrap_or_default(),
                merge_key,
            );
            original.insert(field.to_owned(), Value::Array(ordered));
        }

        // Plain keys first, then `$deleteFromPrimitiveList/` (additions, then deletions).
        let (deletions, plain): (Vec<_>, Vec<_>) = patch
            .into_iter()
            .partition(|(key, _)| key.starts_with(DELETE_FROM_PRIMITIVE_LIST));
        for (key, value) in plain {
            if key.starts_with('$') {
                // Unknown directives would be dropped by the typed decode.
                continue;
            }
            let field_path = child_path(path, &key);
            if value.is_null() {
                original.remove(&key);
                continue;
            }
            let merged = match (original.remove(&key), value) {
                (Some(Value::Object(server)), Value::Object(patch)) => {
                    Value::Object(self.merge_map(server, patch, &field_path)?)
                }
                (Some(Value::Array(server)), Value::Array(patch)) => {
                    let strategy = list_strategy(self.kind, &field_path);
                    Value::Array(self.merge_list(server, patch, strategy, &field_path)?)
                }
                (_, value) => clean(value),
            };
            original.insert(key, merged);
        }
        for (key, value) in deletions {
            let field = &key[DELETE_FROM_PRIMITIVE_LIST.len()..];
            if field.is_empty() {
                return Err(PatchError::BadPrimitiveList);
            }
            let Value::Array(to_delete) = value else {
                return Err(PatchError::BadPrimitiveList);
            };
            let field_path = child_path(path, field);
            match (
                original.get_mut(field),
                list_strategy(self.kind, &field_path),
            ) {
                (Some(Value::Array(list)), ListStrategy::MergeScalars) => {
                    list.retain(|item| !to_delete.contains(item));
                }
                // On a list that does not merge, apimachinery takes the patch list as is.
                (Some(Value::Array(_)), _) => {
                    original.insert(field.to_owned(), Value::Array(to_delete));
                }
                // Nothing to delete from.
                _ => {}
            }
        }
        Ok(original)
    }

    fn merge_list(
        &self,
        server: Vec<Value>,
        patch: Vec<Value>,
        strategy: ListStrategy,
        path: &str,
    ) -> Result<Vec<Value>, PatchError> {
        let merge_key = match strategy {
            ListStrategy::Replace => {
                return match clean(Value::Array(patch)) {
                    Value::Array(list) => Ok(list),
                    _ => Ok(Vec::new()),
                };
            }
            ListStrategy::MergeScalars => None,
            ListStrategy::MergeByKey(key) => Some(key),
        };
        if server.is_empty() && patch.is_empty() {
            return Ok(server);
        }
        check_element_types(&server, &patch)?;
        let holds_objects = server.iter().chain(&patch).any(Value::is_object);

        let Some(merge_key) = merge_key.filter(|_| holds_objects) else {
            if holds_objects {
                return Err(PatchError::IncompatibleList {
                    message: "cannot merge lists without merge key for type map".to_owned(),
                });
            }
            // A set of scalars: union, then ordered.
            let mut merged = server.clone();
            for item in &patch {
                if !merged.contains(item) {
                    merged.push(item.clone());
                }
            }
            return Ok(order_like_kubernetes(merged, &patch, &server, None));
        };

        // Special elements: `$patch: delete` removes by key, `$patch: replace` replaces.
        let mut server = server;
        let mut plain = Vec::new();
        let mut replace = false;
        for item in patch {
            let Some(directive) = item.get(DIRECTIVE) else {
                plain.push(item);
                continue;
            };
            match directive.as_str() {
                Some("delete") => {
                    let Some(key_value) = item.get(merge_key) else {
                        return Err(no_merge_key(&item, merge_key));
                    };
                    server.retain(|existing| existing.get(merge_key) != Some(key_value));
                }
                Some("replace") => replace = true,
                Some("merge") => return Err(PatchError::MergeDirectiveInList),
                _ => {
                    return Err(PatchError::UnknownPatchType {
                        directive: directive
                            .as_str()
                            .map_or_else(|| compact(directive), str::to_owned),
                        map: compact(&item),
                    });
                }
            }
        }
        if replace {
            return match clean(Value::Array(plain)) {
                Value::Array(list) => Ok(list),
                _ => Ok(Vec::new()),
            };
        }

        let server_order = server.clone();
        let mut merged = server;
        for item in &plain {
            let Some(key_value) = item.get(merge_key) else {
                return Err(no_merge_key(item, merge_key));
            };
            let position = merged
                .iter()
                .position(|existing| existing.get(merge_key) == Some(key_value));
            match (position, item) {
                (Some(index), Value::Object(patch_map)) => {
                    let existing = std::mem::take(&mut merged[index]);
                    let Value::Object(existing) = existing else {
                        return Err(no_merge_key(&existing, merge_key));
                    };
                    merged[index] =
                        Value::Object(self.merge_map(existing, patch_map.clone(), path)?);
                }
                _ => merged.push(clean(item.clone())),
            }
        }
        Ok(order_like_kubernetes(
            merged,
            &plain,
            &server_order,
            Some(merge_key),
        ))
    }
}

fn no_merge_key(element: &Value, merge_key: &str) -> PatchError {
    PatchError::NoMergeKey {
        element: compact(element),
        merge_key: merge_key.to_owned(),
    }
}

/// All elements of both lists must have the same JSON type, and not be lists.
fn check_element_types(server: &[Value], patch: &[Value]) -> Result<(), PatchError> {
    let kind = |value: &Value| match value {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(_) => 2,
        Value::String(_) => 3,
        Value::Array(_) => 4,
        Value::Object(_) => 5,
    };
    let mut first = None;
    for item in server.iter().chain(patch) {
        let this = kind(item);
        if this == 4 {
            return Err(PatchError::ListOfLists);
        }
        match first {
            None => first = Some(this),
            Some(previous) if previous != this => {
                return Err(PatchError::IncompatibleList {
                    message: format!(
                        "list element types are not identical: [{} {}]",
                        compact(&server),
                        compact(&patch)
                    ),
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// apimachinery's `normalizeElementOrder`: the elements named by `patch_order` come in that
/// order, the server-only elements keep their server order, and the two are interleaved so
/// that a server-only element precedes a patch element only when it preceded it on the
/// server (a new element therefore lands before the server-only ones that follow).
fn order_like_kubernetes(
    merged: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    merge_key: Option<&str>,
) -> Vec<Value> {
    let identity = |value: &Value| -> Value {
        match merge_key {
            Some(key) => value.get(key).cloned().unwrap_or(Value::Null),
            None => value.clone(),
        }
    };
    let position = |list: &[Value], value: &Value| -> Option<usize> {
        let id = identity(value);
        list.iter().position(|item| identity(item) == id)
    };
    let (mut from_patch, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|item| position(patch_order, item).is_some());
    from_patch.sort_by_key(|item| position(patch_order, item).unwrap_or(usize::MAX));
    server_only.sort_by_key(|item| position(server_order, item).unwrap_or(usize::MAX));

    let mut result = Vec::with_capacity(from_patch.len() + server_only.len());
    let mut server_only = server_only.into_iter().peekable();
    let mut from_patch = from_patch.into_iter().peekable();
    loop {
        let take_server = match (server_only.peek(), from_patch.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(left), Some(right)) => matches!(
                (position(server_order, left), position(server_order, right)),
                (Some(l), Some(r)) if l < r
            ),
        };
        let next = if take_server {
            server_only.next()
        } else {
            from_patch.next()
        };
        result.extend(next);
    }
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn smp(kind: &str, original: Value, patch: Value) -> Value {
        strategic_merge_patch(kind, &original, &patch)
            .unwrap_or_else(|e| panic!("patch {patch} failed: {e}"))
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let node = json!({
            "metadata": {"name": "n", "labels": {"a": "1", "b": "2"}, "annotations": {"x": "y"}},
            "spec": {"unschedulable": false}
        });
        let patched = smp(
            "Node",
            node,
            json!({
                "metadata": {"labels": {"a": null, "c": "3"}, "annotations": null},
                "spec": {"unschedulable": true}
            }),
        );
        assert_eq!(
            patched,
            json!({
                "metadata": {"name": "n", "labels": {"b": "2", "c": "3"}},
                "spec": {"unschedulable": true}
            })
        );
    }

    #[test]
    fn node_taints_are_replaced_not_merged() {
        let node = json!({"spec": {"taints": [
            {"key": "a", "effect": "NoSchedule"},
            {"key": "b", "effect": "NoExecute"}
        ]}});
        let patched = smp(
            "Node",
            node,
            json!({"spec": {"taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(
            patched["spec"]["taints"],
            json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
        );
        assert_eq!(list_strategy("Node", "spec.taints"), ListStrategy::Replace);
    }

    #[test]
    fn conditions_merge_by_type_in_place() {
        let node = json!({"status": {"conditions": [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": "False", "reason": "KubeletNotReady"}
        ]}});
        let patched = smp(
            "Node",
            node,
            json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}),
        );
        assert_eq!(
            patched["status"]["conditions"],
            json!([
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"}
            ])
        );
        // New conditions are placed first (apimachinery's ordering of patch elements).
        let pod = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let patched = smp(
            "Pod",
            pod,
            json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}}),
        );
        assert_eq!(
            patched["status"]["conditions"],
            json!([
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
                {"type": "Ready", "status": "True"}
            ])
        );
    }

    #[test]
    fn element_order_follows_apimachinery() {
        // Server [A, B, C]; the patch names D (new) then B (existing).
        let pdb = json!({"status": {"conditions": [
            {"type": "A"}, {"type": "B"}, {"type": "C"}
        ]}});
        let patched = smp(
            "PodDisruptionBudget",
            pdb,
            json!({"status": {"conditions": [{"type": "D"}, {"type": "B", "status": "x"}]}}),
        );
        let order: Vec<&str> = patched["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(order, ["D", "A", "B", "C"]);
        assert_eq!(
            patched["status"]["conditions"][2],
            json!({"type": "B", "status": "x"})
        );
    }

    #[test]
    fn set_element_order_reorders_the_merged_list() {
        let node = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"},
            {"type": "MemoryPressure", "status": "False"},
            {"type": "DiskPressure", "status": "False"}
        ]}});
        let patched = smp(
            "Node",
            node,
            json!({"status": {
                "$setElementOrder/conditions": [
                    {"type": "MemoryPressure"}, {"type": "DiskPressure"}, {"type": "Ready"}
                ],
                "conditions": [{"type": "Ready", "status": "True"}]
            }}),
        );
        assert_eq!(
            patched["status"]["conditions"],
            json!([
                {"type": "MemoryPressure", "status": "False"},
                {"type": "DiskPressure", "status": "False"},
                {"type": "Ready", "status": "True"}
            ])
        );
    }

    #[test]
    fn owner_references_merge_by_uid_and_finalizers_as_a_set() {
        let pod = json!({"metadata": {
            "ownerReferences": [{"uid": "1", "kind": "ReplicaSet", "name": "a"}],
            "finalizers": ["x", "y"]
        }});
        let patched = smp(
            "Pod",
            pod,
            json!({"metadata": {
                "ownerReferences": [{"uid": "1", "controller": true}, {"uid": "2", "kind": "Node", "name": "n"}],
                "finalizers": ["y", "z"],
                "$deleteFromPrimitiveList/finalizers": ["x"]
            }}),
        );
        assert_eq!(
            patched["metadata"]["ownerReferences"],
            json!([
                {"uid": "1", "kind": "ReplicaSet", "name": "a", "controller": true},
                {"uid": "2", "kind": "Node", "name": "n"}
            ])
        );
        assert_eq!(patched["metadata"]["finalizers"], json!(["y", "z"]));
    }

    #[test]
    fn containers_merge_by_name_recursively() {
        let pod = json!({"spec": {"containers": [
            {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}], "args": ["x"]},
            {"name": "sidecar", "image": "side:1"}
        ]}});
        let patched = smp(
            "Pod",
            pod,
            json!({"spec": {"containers": [
                {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}], "args": ["y"]}
            ]}}),
        );
        assert_eq!(
            patched["spec"]["containers"],
            json!([
                {"name": "app", "image": "app:2",
                 "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}],
                 "args": ["y"]},
                {"name": "sidecar", "image": "side:1"}
            ])
        );
        // Pod templates of workloads follow the pod's rules.
        let deployment = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}}}});
        let patched = smp(
            "Deployment",
            deployment,
            json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "2"}]}}}}),
        );
        assert_eq!(
            patched["spec"]["template"]["spec"]["containers"],
            json!([{"name": "a", "image": "1"}, {"name": "b", "image": "2"}])
        );
        // Tolerations are atomic.
        let pod = json!({"spec": {"tolerations": [{"key": "a"}]}});
        let patched = smp("Pod", pod, json!({"spec": {"tolerations": [{"key": "b"}]}}));
        assert_eq!(patched["spec"]["tolerations"], json!([{"key": "b"}]));
    }

    #[test]
    fn patch_directives() {
        // `$patch: delete` in a merged list removes by key.
        let node = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}});
        let patched = smp(
            "Node",
            node.clone(),
            json!({"status": {"conditions": [{"type": "A", "$patch": "delete"}]}}),
        );
        assert_eq!(patched["status"]["conditions"], json!([{"type": "B"}]));
        // `$patch: replace` in a list replaces the whole list.
        let patched = smp(
            "Node",
            node.clone(),
            json!({"status": {"conditions": [{"$patch": "replace"}, {"type": "C"}]}}),
        );
        assert_eq!(patched["status"]["conditions"], json!([{"type": "C"}]));
        // `$patch: replace` on a map replaces the map.
        let cm = json!({"data": {"a": "1", "b": "2"}});
        let patched = smp(
            "ConfigMap",
            cm.clone(),
            json!({"data": {"$patch": "replace", "c": "3"}}),
        );
        assert_eq!(patched, json!({"data": {"c": "3"}}));
        // `$patch: delete` on a map empties it.
        let patched = smp(
            "ConfigMap",
            cm.clone(),
            json!({"data": {"$patch": "delete"}}),
        );
        assert_eq!(patched, json!({"data": {}}));
        // `$retainKeys` clears the keys it does not list.
        let pod = json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}});
        let patched = smp(
            "Pod",
            pod,
            json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}]}}),
        );
        assert_eq!(
            patched["spec"]["volumes"],
            json!([{"name": "v", "hostPath": {"path": "/x"}}])
        );
    }

    #[test]
    fn new_values_are_stored_without_directives_or_nulls() {
        let patched = smp(
            "Pod",
            json!({"metadata": {"name": "p"}}),
            json!({"metadata": {"labels": {"a": "1", "b": null}},
                   "status": {"conditions": [{"type": "A"}, {"type": "B", "$patch": "delete"}]}}),
        );
        assert_eq!(
            patched,
            json!({"metadata": {"name": "p", "labels": {"a": "1"}}, "status": {"conditions": [{"type": "A"}]}})
        );
    }

    #[test]
    fn malformed_patches_are_refused() {
        let node =
            json!({"status": {"conditions": [{"type": "A"}]}, "metadata": {"finalizers": ["a"]}});
        let cases: Vec<(Value, PatchError)> = vec![
            (
                json!({"status": {"conditions": [{"status": "True"}]}}),
                PatchError::NoMergeKey {
                    element: "{\"status\":\"True\"}".to_owned(),
                    merge_key: "type".to_owned(),
                },
            ),
            (
                json!({"status": {"$patch": "merge"}}),
                PatchError::UnknownPatchType {
                    directive: "merge".to_owned(),
                    map: "{\"$patch\":\"merge\"}".to_owned(),
                },
            ),
            (
                json!({"status": {"conditions": [{"type": "A", "$patch": "merge"}]}}),
                PatchError::MergeDirectiveInList,
            ),
            (
                json!({"metadata": {"$retainKeys": ["name"], "labels": {"a": "b"}}}),
                PatchError::BadRetainKeys,
            ),
            (
                json!({"metadata": {"$retainKeys": "name"}}),
                PatchError::BadRetainKeys,
            ),
            (
                json!({"metadata": {"$setElementOrder/finalizers": "a"}}),
                PatchError::BadSetElementOrder,
            ),
            (
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
                PatchError::BadPrimitiveList,
            ),
            (
                json!({"metadata": {"finalizers": [["a"]]}}),
                PatchError::ListOfLists,
            ),
        ];
        for (patch, expected) in cases {
            let error = strategic_merge_patch("Node", &node, &patch).unwrap_err();
            assert_eq!(error, expected, "{patch}");
        }
        assert_eq!(
            strategic_merge_patch("Node", &node, &json!([1])).unwrap_err(),
            PatchError::BadJsonDocument
        );
        assert_eq!(PatchError::BadRetainKeys.status_code(), 400);
        assert_eq!(PatchError::ListOfLists.status_code(), 422);
        assert!(
            strategic_merge_patch("Node", &node, &json!({"metadata": {"finalizers": [1]}}))
                .unwrap_err()
                .to_string()
                .starts_with("list element types are not identical")
        );
    }

    #[test]
    fn unknown_kinds_behave_like_json_merge_patch() {
        let original = json!({"spec": {"list": [1, 2], "map": {"a": 1, "b": 2}}, "metadata": {"finalizers": ["a"]}});
        let patch = json!({"spec": {"list": [3], "map": {"a": null, "c": 3}}, "metadata": {"finalizers": ["b"]}});
        // Metadata keeps its strategies (finalizers merge as a set; the new one comes first).
        let expected = json!({"spec": {"list": [3], "map": {"b": 2, "c": 3}}, "metadata": {"finalizers": ["b", "a"]}});
        assert_eq!(smp("Widget", original.clone(), patch.clone()), expected);
        assert!(!has_strategic_schema("Widget"));
        assert!(has_strategic_schema("Node"));
        // Plain JSON merge patch replaces every list, finalizers included.
        assert_eq!(
            json_merge_patch(&original, &patch),
            json!({"spec": {"list": [3], "map": {"b": 2, "c": 3}}, "metadata": {"finalizers": ["b"]}})
        );
        assert_eq!(json_merge_patch(&json!({"a": 1}), &json!("x")), json!("x"));
        assert_eq!(
            json_merge_patch(&json!(1), &json!({"a": {"b": null, "c": 1}})),
            json!({"a": {"c": 1}})
        );
    }

    /// A tiny deterministic generator of JSON documents for the equivalence test.
    struct Documents(u64);

    impl Documents {
        fn next(&mut self) -> u64 {
            // xorshift64
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn pick(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// Objects over keys a..d, lists of scalars, scalars and (outside lists) nulls.
        fn value(&mut self, depth: u32, in_list: bool) -> Value {
            let choice = if depth == 0 {
                self.pick(4)
            } else {
                self.pick(7)
            };
            match choice {
                0 => json!(self.pick(3)),
                1 => json!(["x", "y", "z"][usize::try_from(self.pick(3)).unwrap()]),
                2 if !in_list => Value::Null,
                2 | 3 => json!(self.pick(2) == 0),
                4 => Value::Array((0..self.pick(3)).map(|_| self.value(0, true)).collect()),
                _ => {
                    let mut map = Map::new();
                    for _ in 0..self.pick(4) {
                        let key = ["a", "b", "c", "d"][usize::try_from(self.pick(4)).unwrap()];
                        let value = self.value(depth - 1, in_list);
                        map.insert(key.to_owned(), value);
                    }
                    Value::Object(map)
                }
            }
        }

        fn object(&mut self) -> Value {
            loop {
                if let value @ Value::Object(_) = self.value(3, false) {
                    return value;
                }
            }
        }
    }

    #[test]
    fn without_list_strategies_it_is_a_json_merge_patch() {
        let mut documents = Documents(0x9e37_79b9_7f4a_7c15);
        for round in 0..2000 {
            let original = documents.object();
            let patch = documents.object();
            let strategic = strategic_merge_patch("Widget", &original, &patch).unwrap();
            let merge = json_merge_patch(&original, &patch);
            assert_eq!(
                strategic, merge,
                "round {round}: {original} patched with {patch}"
            );
        }
    }

    #[test]
    fn strategies_by_path() {
        let cases = [
            (
                "Pod",
                "metadata.ownerReferences",
                ListStrategy::MergeByKey("uid"),
            ),
            ("Pod", "spec.containers", ListStrategy::MergeByKey("name")),
            (
                "Pod",
                "spec.containers.ports",
                ListStrategy::MergeByKey("containerPort"),
            ),
            ("Pod", "status.conditions", ListStrategy::MergeByKey("type")),
            ("Pod", "status.containerStatuses", ListStrategy::Replace),
            ("Node", "status.addresses", ListStrategy::MergeByKey("type")),
            ("Node", "spec.podCIDRs", ListStrategy::MergeScalars),
            (
                "PodDisruptionBudget",
                "status.conditions",
                ListStrategy::MergeByKey("type"),
            ),
            (
                "PodDisruptionBudget",
                "spec.selector.matchExpressions",
                ListStrategy::Replace,
            ),
            (
                "DaemonSet",
                "spec.template.metadata.finalizers",
                ListStrategy::MergeScalars,
            ),
            (
                "DaemonSet",
                "spec.template.spec.volumes",
                ListStrategy::MergeByKey("name"),
            ),
            ("Event", "series", ListStrategy::Replace),
            (
                "ConfigMap",
                "metadata.finalizers",
                ListStrategy::MergeScalars,
            ),
        ];
        for (kind, path, expected) in cases {
            assert_eq!(list_strategy(kind, path), expected, "{kind} {path}");
        }
    }
}
