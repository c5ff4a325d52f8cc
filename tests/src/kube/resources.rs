//! The resource types the fake API server serves, with what discovery says about them.
//!
//! One table drives routing, discovery documents, error messages (`pods "x" not found`,
//! `deployments.apps "x" ...`) and the kinds written on responses, so they cannot disagree.

use serde_json::{Value, json};

/// One served resource (a group/version/plural), as discovery describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    /// API group, `""` for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// URL segment, e.g. `pods`.
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Whether a `status` subresource exists (then updates of the main resource keep the
    /// stored status, and `/status` updates keep everything else).
    pub has_status: bool,
    /// The storage this version is served from: two served versions of one resource share a
    /// key (only `events` and `events.k8s.io/events` differ in shape, and are kept apart).
    pub storage: &'static str,
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl ResourceType {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The name errors use: `pods`, `deployments.apps`.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The `APIResource` entries discovery lists for this resource and its subresources.
    pub fn discovery_entries(&self) -> Vec<Value> {
        let mut entries = vec![json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": if self.storage == REVIEW { &["create"][..] } else { VERBS },
            "shortNames": self.short_names,
            "storageVersionHash": "",
        })];
        if self.has_status {
            entries.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if self.plural == "pods" && self.group.is_empty() {
            // kubectl drain reads group/version here to choose the Eviction version.
            entries.push(json!({
                "name": "pods/eviction",
                "singularName": "",
                "namespaced": true,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }));
        }
        entries
    }
}

macro_rules! resource {
    ($group:expr, $version:expr, $plural:expr, $singular:expr, $kind:expr, $namespaced:expr, $short:expr, $status:expr, $storage:expr) => {
        ResourceType {
            group: $group,
            version: $version,
            plural: $plural,
            singular: $singular,
            kind: $kind,
            namespaced: $namespaced,
            short_names: $short,
            has_status: $status,
            storage: $storage,
        }
    };
}

/// The storage key of create-only reviews, answered from the request and never stored.
pub const REVIEW: &str = "";

/// Every resource served, in discovery order.
pub static RESOURCES: &[ResourceType] = &[
    resource!(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        true,
        "namespaces"
    ),
    resource!(
        "",
        "v1",
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        true,
        "nodes"
    ),
    resource!("", "v1", "pods", "pod", "Pod", true, &["po"], true, "pods"),
    resource!(
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        false,
        "configmaps"
    ),
    resource!(
        "",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
        "events"
    ),
    resource!(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        false,
        "serviceaccounts"
    ),
    resource!(
        "events.k8s.io",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
        "events"
    ),
    resource!(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        true,
        "poddisruptionbudgets.policy"
    ),
    resource!(
        "apps",
        "v1",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        &["ds"],
        true,
        "daemonsets.apps"
    ),
    resource!(
        "apps",
        "v1",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
        &["rs"],
        true,
        "replicasets.apps"
    ),
    resource!(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["deploy"],
        true,
        "deployments.apps"
    ),
    resource!(
        "apps",
        "v1",
        "statefulsets",
        "statefulset",
        "StatefulSet",
        true,
        &["sts"],
        true,
        "statefulsets.apps"
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        &[],
        false,
        "clusterroles.rbac.authorization.k8s.io"
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
        false,
        "clusterrolebindings.rbac.authorization.k8s.io"
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
        &[],
        false,
        "roles.rbac.authorization.k8s.io"
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        &[],
        false,
        "rolebindings.rbac.authorization.k8s.io"
    ),
    resource!(
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "selfsubjectreview",
        "SelfSubjectReview",
        false,
        &[],
        false,
        REVIEW
    ),
    resource!(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        "SelfSubjectAccessReview",
        false,
        &[],
        false,
        REVIEW
    ),
    resource!(
        "",
        "v1",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
        "persistentvolumeclaims"
    ),
    resource!(
        "",
        "v1",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        true,
        "persistentvolumes"
    ),
    resource!(
        "storage.k8s.io",
        "v1",
        "volumeattachments",
        "volumeattachment",
        "VolumeAttachment",
        false,
        &[],
        true,
        "volumeattachments.storage.k8s.io"
    ),
    resource!(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        false,
        "leases.coordination.k8s.io"
    ),
];

/// Group versions that serve no resources of their own but accept subresource requests
/// (`policy/v1beta1` Evictions are posted to `/api/v1/.../pods/x/eviction` anyway).
pub static GROUP_VERSIONS: &[(&str, &[&str])] = &[
    ("apps", &["v1"]),
    ("events.k8s.io", &["v1"]),
    ("policy", &["v1"]),
    ("rbac.authorization.k8s.io", &["v1"]),
    ("coordination.k8s.io", &["v1"]),
    ("storage.k8s.io", &["v1"]),
    ("authentication.k8s.io", &["v1"]),
    ("authorization.k8s.io", &["v1"]),
];

/// The resource served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource of a kind in a group/version (`apiVersion` + `kind` of a manifest).
pub fn find_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.kind == kind)
}

/// The resources of one group/version, for `/api/v1` and `/apis/<g>/<v>`.
pub fn in_group_version(group: &str, version: &str) -> impl Iterator<Item = &'static ResourceType> {
    RESOURCES
        .iter()
        .filter(move |r| r.group == group && r.version == version)
}
