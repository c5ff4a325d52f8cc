//! The shipped RBAC manifest (`infra/rbac.yaml`): it parses into Kubernetes types, its
//! bindings are complete, and each function's own group gets exactly the access that function
//! uses (the test kit's fake API server authorizes every scenario with this same file, so a
//! missing verb fails the scenarios and an extra one fails here). No function's identity can
//! reach what another function needs: the hooks cannot touch aws-auth, nodegroup-auth cannot
//! read pods, evict, or patch nodes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/rbac.yaml");
const TERMINATING_GROUP: &str = "open-node-manager:terminating-hook";
const LAUNCHING_GROUP: &str = "open-node-manager:launching-hook";
const NODEGROUP_AUTH_GROUP: &str = "open-node-manager:nodegroup-auth";
const FORCE_DELETE_GROUP: &str = "open-node-manager:force-delete";
const NODE_REPAIR_GROUP: &str = "open-node-manager:node-repair";
const INSTANCE_REFRESH_GROUP: &str = "open-node-manager:instance-refresh";

/// Every object of the manifest, typed.
#[derive(Debug, Default)]
struct Manifest {
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
}

fn parse_manifest(text: &str) -> Result<Manifest, String> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("not YAML: {e}"))?;
    let mut manifest = Manifest::default();
    for (index, document) in documents.into_iter().enumerate() {
        let kind = document["kind"].as_str().unwrap_or_default().to_owned();
        let api_version = document["apiVersion"].as_str().unwrap_or_default();
        if api_version != "rbac.authorization.k8s.io/v1" {
            return Err(format!("document {index}: apiVersion {api_version:?}"));
        }
        let typed = |e: serde_json::Error| format!("document {index} ({kind}): {e}");
        match kind.as_str() {
            "ClusterRole" => manifest
                .cluster_roles
                .push(serde_json::from_value(document).map_err(typed)?),
            "ClusterRoleBinding" => manifest
                .cluster_role_bindings
                .push(serde_json::from_value(document).map_err(typed)?),
            "Role" => manifest
                .roles
                .push(serde_json::from_value(document).map_err(typed)?),
            "RoleBinding" => manifest
                .role_bindings
                .push(serde_json::from_value(document).map_err(typed)?),
            other => return Err(format!("document {index}: unexpected kind {other:?}")),
        }
    }
    Ok(manifest)
}

fn shipped() -> Manifest {
    let text = std::fs::read_to_string(MANIFEST).expect("infra/rbac.yaml is readable");
    parse_manifest(&text).expect("infra/rbac.yaml parses into RBAC types")
}

/// One permission: where (`*` = cluster-wide), API group, resource, verb, and the resource
/// names it is limited to (empty = any name).
type Grant = (String, String, String, String, Vec<String>);

fn expand(scope: &str, rules: &[PolicyRule]) -> BTreeSet<Grant> {
    let mut grants = BTreeSet::new();
    for rule in rules {
        let names = rule.resource_names.clone().unwrap_or_default();
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    grants.insert((
                        scope.to_owned(),
                        group.clone(),
                        resource.clone(),
                        verb.clone(),
                        names.clone(),
                    ));
                }
            }
        }
    }
    grants
}

/// What a member of `group` may do, following the manifest's bindings.
fn grants_of(manifest: &Manifest, group: &str) -> BTreeSet<Grant> {
    let is_member = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects
            .iter()
            .flatten()
            .any(|s| s.kind == "Group" && s.name == group)
    };
    let cluster_role = |name: &str| {
        manifest
            .cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
    };
    let mut grants = BTreeSet::new();
    for binding in &manifest.cluster_role_bindings {
        if is_member(&binding.subjects) {
            let role = cluster_role(&binding.role_ref.name).expect("bound ClusterRole exists");
            grants.extend(expand("*", role.rules.as_deref().unwrap_or_default()));
        }
    }
    for binding in &manifest.role_bindings {
        if !is_member(&binding.subjects) {
            continue;
        }
        let namespace = binding.metadata.namespace.clone().expect("namespaced");
        let rules = match binding.role_ref.kind.as_str() {
            "ClusterRole" => cluster_role(&binding.role_ref.name)
                .expect("bound ClusterRole exists")
                .rules
                .clone(),
            _ => manifest
                .roles
                .iter()
                .find(|r| {
                    r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str())
                        && r.metadata.namespace == binding.metadata.namespace
                })
                .expect("bound Role exists in the binding's namespace")
                .rules
                .clone(),
        };
        grants.extend(expand(&namespace, rules.as_deref().unwrap_or_default()));
    }
    grants
}

fn grant(scope: &str, group: &str, resource: &str, verbs: &[&str], names: &[&str]) -> Vec<Grant> {
    verbs
        .iter()
        .map(|verb| {
            (
                scope.to_owned(),
                group.to_owned(),
                resource.to_owned(),
                (*verb).to_owned(),
                names.iter().map(|n| (*n).to_owned()).collect(),
            )
        })
        .collect()
}

#[test]
fn every_document_is_a_named_rbac_object_of_the_project() {
    let manifest = shipped();
    // terminating-hook, launching-hook, force-delete, node-repair, instance-refresh;
    // nodegroup-auth's is a Role.
    assert_eq!(manifest.cluster_roles.len(), 5);
    assert_eq!(manifest.cluster_role_bindings.len(), 5);
    assert_eq!(manifest.roles.len(), 1);
    assert_eq!(manifest.role_bindings.len(), 1);
    let names = manifest
        .cluster_roles
        .iter()
        .map(|o| &o.metadata)
        .chain(manifest.cluster_role_bindings.iter().map(|o| &o.metadata))
        .chain(manifest.roles.iter().map(|o| &o.metadata))
        .chain(manifest.role_bindings.iter().map(|o| &o.metadata))
        .map(|m| m.name.clone().expect("every object is named"));
    for name in names {
        assert!(name.starts_with("open-node-manager"), "{name}");
    }
    for role in &manifest.roles {
        assert_eq!(role.metadata.namespace.as_deref(), Some("kube-system"));
    }
}

#[test]
fn the_parser_rejects_what_is_not_rbac() {
    let wrong_kind = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n";
    assert!(parse_manifest(wrong_kind).is_err());
    let bad_rules = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
                     metadata: {name: x}\nrules: everything\n";
    let err = parse_manifest(bad_rules).unwrap_err();
    assert!(err.contains("document 0 (ClusterRole)"), "{err}");
    let two = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: a}\n\
               ---\napiVersion: rbac.authorization.k8s.io/v1beta1\nkind: Role\nmetadata: {name: b}\n";
    let err = parse_manifest(two).unwrap_err();
    assert!(err.contains("document 1"), "{err}");
}

#[test]
fn every_binding_names_a_role_of_the_manifest_and_a_project_group() {
    let manifest = shipped();
    let cluster_roles: BTreeSet<_> = manifest
        .cluster_roles
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    for binding in &manifest.cluster_role_bindings {
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        assert_eq!(binding.role_ref.api_group, "rbac.authorization.k8s.io");
        assert!(cluster_roles.contains(&binding.role_ref.name));
        for subject in binding.subjects.iter().flatten() {
            assert_eq!(subject.kind, "Group");
            assert!(
                subject.name.starts_with("open-node-manager:"),
                "{}",
                subject.name
            );
        }
    }
    for binding in &manifest.role_bindings {
        assert_eq!(binding.role_ref.kind, "Role");
        let role = manifest
            .roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str()))
            .expect("bound Role exists");
        assert_eq!(role.metadata.namespace, binding.metadata.namespace);
        let groups: Vec<_> = binding.subjects.iter().flatten().map(|s| &s.name).collect();
        assert_eq!(groups, [NODEGROUP_AUTH_GROUP]);
    }
}

fn assert_exactly(group: &str, expected: &[Vec<Grant>]) {
    let actual = grants_of(&shipped(), group);
    let expected: BTreeSet<Grant> = expected.iter().flatten().cloned().collect();
    let missing: Vec<_> = expected.difference(&actual).collect();
    let extra: Vec<_> = actual.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{group}: missing {missing:?}, extra {extra:?}"
    );
}

#[test]
fn the_terminating_hook_gets_exactly_what_it_uses() {
    assert_exactly(
        TERMINATING_GROUP,
        &[
            // No watch: the drain reads its node by name or by list, and watches only pods
            // and budgets.
            grant("*", "", "nodes", &["get", "list", "patch"], &[]),
            grant("*", "", "pods", &["get", "list", "watch"], &[]),
            grant("*", "", "pods/eviction", &["create"], &[]),
            grant("*", "policy", "poddisruptionbudgets", &["list"], &[]),
            // PDB-paced drains: retry when the refusing budget allows (issue #20).
            grant("*", "policy", "poddisruptionbudgets", &["watch"], &[]),
            // The wait for the node's volumes (issue #45): a list, no watch; the claims of
            // the pods that stay.
            grant("*", "storage.k8s.io", "volumeattachments", &["list"], &[]),
            grant("*", "", "persistentvolumeclaims", &["get"], &[]),
            grant("*", "events.k8s.io", "events", &["create", "patch"], &[]),
        ],
    );
}

#[test]
fn the_launching_hook_gets_exactly_what_it_uses() {
    assert_exactly(
        LAUNCHING_GROUP,
        &[
            grant("*", "", "nodes", &["get", "list", "watch", "patch"], &[]),
            grant("*", "events.k8s.io", "events", &["create", "patch"], &[]),
        ],
    );
}

#[test]
fn nodegroup_auth_gets_exactly_what_it_uses() {
    assert_exactly(
        NODEGROUP_AUTH_GROUP,
        &[
            grant(
                "kube-system",
                "",
                "configmaps",
                &["get", "update"],
                &["aws-auth"],
            ),
            // RBAC cannot limit create by name; the function only creates aws-auth.
            grant("kube-system", "", "configmaps", &["create"], &[]),
            grant(
                "kube-system",
                "events.k8s.io",
                "events",
                &["create", "patch"],
                &[],
            ),
        ],
    );
}

#[test]
fn the_hooks_cannot_touch_aws_auth_and_nodegroup_auth_cannot_touch_nodes_or_pods() {
    let manifest = shipped();
    for group in [
        TERMINATING_GROUP,
        LAUNCHING_GROUP,
        FORCE_DELETE_GROUP,
        NODE_REPAIR_GROUP,
        INSTANCE_REFRESH_GROUP,
    ] {
        let configmaps: Vec<_> = grants_of(&manifest, group)
            .into_iter()
            .filter(|(_, _, resource, _, _)| resource == "configmaps")
            .collect();
        assert!(
            configmaps.is_empty(),
            "{group} reaches ConfigMaps: {configmaps:?}"
        );
    }
    let auth = grants_of(&manifest, NODEGROUP_AUTH_GROUP);
    let reach: Vec<_> = auth
        .iter()
        .filter(|(_, _, resource, _, _)| resource.starts_with("pods") || resource == "nodes")
        .collect();
    assert!(reach.is_empty(), "nodegroup-auth reaches {reach:?}");
    assert!(
        auth.iter().all(|(scope, ..)| scope == "kube-system"),
        "nodegroup-auth must hold nothing cluster-wide: {auth:?}"
    );
}

#[test]
fn node_repair_gets_exactly_what_it_uses() {
    // No pods, no evictions, no deletes: replacing a node is Auto Scaling's SetInstanceHealth.
    assert_exactly(
        NODE_REPAIR_GROUP,
        &[
            grant("*", "", "nodes", &["list", "patch"], &[]),
            grant("*", "events.k8s.io", "events", &["create", "patch"], &[]),
        ],
    );
}

#[test]
fn instance_refresh_gets_exactly_what_it_uses() {
    // Nodes, and the pods list the room rule reads their requests from: no evictions, no
    // Events, no get (a conflict re-reads by list).
    assert_exactly(
        INSTANCE_REFRESH_GROUP,
        &[
            grant("*", "", "nodes", &["list", "patch"], &[]),
            grant("*", "", "pods", &["list"], &[]),
        ],
    );
}

#[test]
fn deleting_pods_needs_the_separate_force_group() {
    let manifest = shipped();
    for group in [
        TERMINATING_GROUP,
        LAUNCHING_GROUP,
        NODEGROUP_AUTH_GROUP,
        NODE_REPAIR_GROUP,
        INSTANCE_REFRESH_GROUP,
    ] {
        let grants = grants_of(&manifest, group);
        assert!(
            !grants.iter().any(|(_, _, _, verb, _)| verb == "delete"),
            "{group} must not delete anything"
        );
    }
    let force: Vec<_> = grants_of(&manifest, FORCE_DELETE_GROUP)
        .into_iter()
        .collect();
    assert_eq!(force, grant("*", "", "pods", &["delete"], &[]));
}

#[test]
fn nothing_is_granted_by_wildcard_or_to_escalate() {
    let manifest = shipped();
    let rules = manifest
        .cluster_roles
        .iter()
        .filter_map(|r| r.rules.as_ref())
        .chain(manifest.roles.iter().filter_map(|r| r.rules.as_ref()))
        .flatten();
    for rule in rules {
        let words = rule
            .verbs
            .iter()
            .chain(rule.resources.iter().flatten())
            .chain(rule.api_groups.iter().flatten());
        for word in words {
            assert_ne!(word, "*", "{rule:?}");
            assert!(
                ![
                    "bind",
                    "escalate",
                    "impersonate",
                    "secrets",
                    "deletecollection"
                ]
                .contains(&word.as_str()),
                "{rule:?}"
            );
        }
        assert!(rule.non_resource_urls.is_none(), "{rule:?}");
    }
    for role in &manifest.cluster_roles {
        assert!(role.aggregation_rule.is_none());
    }
}
