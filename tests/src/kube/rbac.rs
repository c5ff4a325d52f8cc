//! RBAC authorization as kube-apiserver's RBAC authorizer evaluates it
//! (`plugin/pkg/auth/authorizer/rbac`, `pkg/registry/rbac/validation`), over a snapshot of
//! the ClusterRoles, ClusterRoleBindings, Roles and RoleBindings the fake server stores.
//!
//! What it decides, like the real one:
//! - a request is allowed when some rule reachable by the user allows it; nothing denies;
//! - ClusterRoleBindings grant their ClusterRole everywhere; RoleBindings grant their Role
//!   (of the binding's namespace) or ClusterRole only in the binding's namespace, and so never
//!   a cluster-scoped request;
//! - subjects: `User` by name, `Group` by membership, `ServiceAccount` by the username
//!   `system:serviceaccount:<namespace>:<name>` (namespace defaulting to the binding's);
//! - a rule matches on verbs (`*`), API groups (`*`), resources (`*`, `pods/eviction`,
//!   `*/status`), resource names (a rule with names never matches a request without a name:
//!   `list`, `watch`, `create`), and non-resource URLs (`*`, `/healthz`, `/apis/*`);
//! - aggregated ClusterRoles (`aggregationRule`) get the rules of the ClusterRoles their
//!   selectors match, as the aggregation controller would fill them in.
//!
//! `system:masters` bypasses authorization in the real server before RBAC runs: the caller
//! checks [`is_superuser`] first.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusDetails};

use super::selectors::{LabelQuery, object_labels};

/// The group whose members the real API server never asks RBAC about.
pub const SUPERUSER_GROUP: &str = "system:masters";

/// The authenticated identity (`user.Info`). Real servers add `system:authenticated` to
/// every authenticated user's groups; so should the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
}

/// What a request does (`authorizer.Attributes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// `""` for the core group.
    pub api_group: String,
    /// Plural resource name (`pods`).
    pub resource: String,
    /// `eviction`, `status`, ...
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    /// The object's name; for list/watch the real server fills it from a
    /// `fieldSelector=metadata.name=<name>`.
    pub name: Option<String>,
    /// Set for non-resource requests (`/version`, `/apis`): the resource fields are ignored.
    pub path: Option<String>,
}

impl RequestAttributes {
    fn is_resource_request(&self) -> bool {
        self.path.is_none()
    }

    fn subresource(&self) -> &str {
        self.subresource.as_deref().unwrap_or_default()
    }

    fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// `pods` or `pods/eviction`.
    fn combined_resource(&self) -> String {
        match self.subresource() {
            "" => self.resource.clone(),
            sub => format!("{}/{sub}", self.resource),
        }
    }
}

/// Whether the real API server skips authorization for this user.
pub fn is_superuser(user: &UserInfo) -> bool {
    user.groups.iter().any(|group| group == SUPERUSER_GROUP)
}

/// An allowed request and the binding that allowed it (for the audit log's
/// `authorization.k8s.io/reason` annotation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// `RBAC: allowed by ClusterRoleBinding "x" of ClusterRole "y" to Group "z"`.
    pub reason: String,
}

/// A refused request: renders the real `403 Forbidden` Status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Denial {
    /// The full Status message, e.g. `pods "web-0" is forbidden: User "alice" cannot create
    /// resource "pods/eviction" in API group "" in the namespace "shop"`.
    pub message: String,
    /// `details.group` (the request's API group).
    pub group: String,
    /// `details.kind` (the request's resource, without subresource).
    pub kind: String,
    /// `details.name`.
    pub name: String,
}

impl Denial {
    fn new(user: &UserInfo, attributes: &RequestAttributes, errors: &[String]) -> Self {
        let what = if let Some(path) = &attributes.path {
            format!(
                "User {:?} cannot {} path {path:?}",
                user.username, attributes.verb
            )
        } else {
            let scope = match attributes.namespace() {
                "" => "at the cluster scope".to_owned(),
                namespace => format!("in the namespace {namespace:?}"),
            };
            format!(
                "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
                user.username,
                attributes.verb,
                attributes.combined_resource(),
                attributes.api_group
            )
        };
        // Like the RBAC authorizer, explain bindings that point at missing roles.
        let what = match errors {
            [] => what,
            [one] => format!("{what}: RBAC: {one}"),
            many => format!("{what}: RBAC: [{}]", many.join(", ")),
        };
        let (group, kind, name) = if attributes.is_resource_request() {
            (
                attributes.api_group.clone(),
                attributes.resource.clone(),
                attributes.name().to_owned(),
            )
        } else {
            (String::new(), String::new(), String::new())
        };
        // apimachinery's NewForbidden: `<resource>[.<group>] ["<name>"] is forbidden: ...`.
        let message = if kind.is_empty() {
            format!("forbidden: {what}")
        } else {
            let qualified = if group.is_empty() {
                kind.clone()
            } else {
                format!("{kind}.{group}")
            };
            if name.is_empty() {
                format!("{qualified} is forbidden: {what}")
            } else {
                format!("{qualified} {name:?} is forbidden: {what}")
            }
        };
        Self {
            message,
            group,
            kind,
            name,
        }
    }

    /// The `metav1.Status` body of the 403.
    pub fn to_status(&self) -> Status {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Status {
            code: Some(403),
            details: Some(StatusDetails {
                group: non_empty(&self.group),
                kind: non_empty(&self.kind),
                name: non_empty(&self.name),
                ..Default::default()
            }),
            message: Some(self.message.clone()),
            metadata: Default::default(),
            reason: Some("Forbidden".to_owned()),
            status: Some("Failure".to_owned()),
        }
    }
}

/// Where a binding's rules come from, resolved at construction.
#[derive(Debug, Clone)]
struct ResolvedBinding {
    /// `ClusterRoleBinding "x" of ClusterRole "y"` / `RoleBinding "x/ns" of Role "y"`.
    description: String,
    /// `None` for a ClusterRoleBinding.
    namespace: Option<String>,
    subjects: Vec<Subject>,
    /// `Err`: the role is missing (the message the real authorizer reports).
    rules: Result<Vec<PolicyRule>, String>,
}

/// RBAC over a snapshot of the RBAC objects. Cheap to rebuild when they change.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    bindings: Vec<ResolvedBinding>,
}

impl Authorizer {
    pub fn from_objects(
        cluster_roles: &[ClusterRole],
        cluster_role_bindings: &[ClusterRoleBinding],
        roles: &[Role],
        role_bindings: &[RoleBinding],
    ) -> Self {
        let cluster_rules = effective_cluster_role_rules(cluster_roles);
        let role_rules: BTreeMap<(String, String), Vec<PolicyRule>> = roles
            .iter()
            .map(|role| {
                (
                    (
                        role.metadata.namespace.clone().unwrap_or_default(),
                        role.metadata.name.clone().unwrap_or_default(),
                    ),
                    role.rules.clone().unwrap_or_default(),
                )
            })
            .collect();
        let resolve = |role_ref: &RoleRef,
                       namespace: Option<&str>|
         -> Result<Vec<PolicyRule>, String> {
            match (role_ref.kind.as_str(), namespace) {
                ("ClusterRole", _) => cluster_rules.get(&role_ref.name).cloned().ok_or_else(|| {
                    format!(
                        "clusterrole.rbac.authorization.k8s.io {:?} not found",
                        role_ref.name
                    )
                }),
                ("Role", Some(namespace)) => role_rules
                    .get(&(namespace.to_owned(), role_ref.name.clone()))
                    .cloned()
                    .ok_or_else(|| {
                        format!(
                            "role.rbac.authorization.k8s.io {:?} not found",
                            role_ref.name
                        )
                    }),
                (kind, _) => Err(format!("unsupported role reference kind: {kind:?}")),
            }
        };
        let mut bindings = Vec::new();
        for binding in cluster_role_bindings {
            bindings.push(ResolvedBinding {
                description: format!(
                    "ClusterRoleBinding {:?} of {} {:?}",
                    binding.metadata.name.as_deref().unwrap_or_default(),
                    binding.role_ref.kind,
                    binding.role_ref.name
                ),
                namespace: None,
                subjects: binding.subjects.clone().unwrap_or_default(),
                rules: resolve(&binding.role_ref, None),
            });
        }
        for binding in role_bindings {
            let namespace = binding.metadata.namespace.clone().unwrap_or_default();
            bindings.push(ResolvedBinding {
                description: format!(
                    "RoleBinding {:?} of {} {:?}",
                    format!(
                        "{}/{namespace}",
                        binding.metadata.name.as_deref().unwrap_or_default()
                    ),
                    binding.role_ref.kind,
                    binding.role_ref.name
                ),
                rules: resolve(&binding.role_ref, Some(&namespace)),
                namespace: Some(namespace),
                subjects: binding.subjects.clone().unwrap_or_default(),
            });
        }
        Self { bindings }
    }

    /// Allows the request if a rule reachable by `user` allows it.
    pub fn authorize(
        &self,
        user: &UserInfo,
        attributes: &RequestAttributes,
    ) -> Result<Grant, Denial> {
        let mut errors = Vec::new();
        let request_namespace = attributes.namespace();
        for binding in &self.bindings {
            // RoleBindings only apply within their namespace.
            if let Some(namespace) = &binding.namespace
                && (request_namespace.is_empty() || namespace != request_namespace)
            {
                continue;
            }
            let binding_namespace = binding.namespace.as_deref().unwrap_or_default();
            let Some(subject) = binding
                .subjects
                .iter()
                .find(|subject| subject_matches(user, subject, binding_namespace))
            else {
                continue;
            };
            match &binding.rules {
                Ok(rules) => {
                    if rules.iter().any(|rule| rule_allows(rule, attributes)) {
                        return Ok(Grant {
                            reason: format!(
                                "RBAC: allowed by {} to {}",
                                binding.description,
                                describe_subject(subject, binding_namespace)
                            ),
                        });
                    }
                }
                Err(error) => errors.push(error.clone()),
            }
        }
        Err(Denial::new(user, attributes, &errors))
    }

    /// Every rule that applies to `user` in `namespace` (`None`: cluster-wide bindings
    /// only), as `SelfSubjectRulesReview` / `kubectl auth can-i --list` report them.
    pub fn rules_for(&self, user: &UserInfo, namespace: Option<&str>) -> Vec<PolicyRule> {
        let namespace = namespace.unwrap_or_default();
        self.bindings
            .iter()
            .filter(|binding| match &binding.namespace {
                None => true,
                Some(ns) => !namespace.is_empty() && ns == namespace,
            })
            .filter(|binding| {
                let binding_namespace = binding.namespace.as_deref().unwrap_or_default();
                binding
                    .subjects
                    .iter()
                    .any(|subject| subject_matches(user, subject, binding_namespace))
            })
            .filter_map(|binding| binding.rules.as_ref().ok())
            .flatten()
            .cloned()
            .collect()
    }
}

/// The rules of every ClusterRole, with aggregated roles filled from the roles their
/// `clusterRoleSelectors` match (transitively, ignoring cycles).
fn effective_cluster_role_rules(
    cluster_roles: &[ClusterRole],
) -> BTreeMap<String, Vec<PolicyRule>> {
    let by_name: BTreeMap<&str, &ClusterRole> = cluster_roles
        .iter()
        .map(|role| (role.metadata.name.as_deref().unwrap_or_default(), role))
        .collect();
    by_name
        .keys()
        .map(|name| {
            let mut visiting = BTreeSet::new();
            let mut rules = Vec::new();
            collect_rules(name, &by_name, cluster_roles, &mut visiting, &mut rules);
            ((*name).to_owned(), rules)
        })
        .collect()
}

fn collect_rules<'a>(
    name: &'a str,
    by_name: &BTreeMap<&'a str, &'a ClusterRole>,
    all: &'a [ClusterRole],
    visiting: &mut BTreeSet<&'a str>,
    rules: &mut Vec<PolicyRule>,
) {
    if !visiting.insert(name) {
        return;
    }
    let Some(role) = by_name.get(name) else {
        return;
    };
    let Some(aggregation) = &role.aggregation_rule else {
        for rule in role.rules.iter().flatten() {
            if !rules.contains(rule) {
                rules.push(rule.clone());
            }
        }
        return;
    };
    let selectors: Vec<LabelQuery> = aggregation
        .cluster_role_selectors
        .iter()
        .flatten()
        .filter_map(|selector| LabelQuery::from_label_selector(selector).ok())
        .collect();
    for candidate in all {
        let candidate_name = candidate.metadata.name.as_deref().unwrap_or_default();
        if candidate_name == name {
            continue;
        }
        let labels = object_labels(&candidate.metadata);
        if selectors.iter().any(|selector| selector.matches(labels)) {
            collect_rules(candidate_name, by_name, all, visiting, rules);
        }
    }
}

fn subject_matches(user: &UserInfo, subject: &Subject, binding_namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => user.username == subject.name,
        "Group" => user.groups.contains(&subject.name),
        "ServiceAccount" => {
            let namespace = subject
                .namespace
                .as_deref()
                .filter(|ns| !ns.is_empty())
                .unwrap_or(binding_namespace);
            !namespace.is_empty()
                && user.username == format!("system:serviceaccount:{namespace}:{}", subject.name)
        }
        _ => false,
    }
}

fn describe_subject(subject: &Subject, binding_namespace: &str) -> String {
    if subject.kind == "ServiceAccount" {
        let namespace = subject
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .unwrap_or(binding_namespace);
        format!(
            "{} {:?}",
            subject.kind,
            format!("{}/{namespace}", subject.name)
        )
    } else {
        format!("{} {:?}", subject.kind, subject.name)
    }
}

/// Whether one policy rule allows the request (`rbac.RuleAllows`).
pub fn rule_allows(rule: &PolicyRule, attributes: &RequestAttributes) -> bool {
    let verb_matches = rule
        .verbs
        .iter()
        .any(|verb| verb == "*" || *verb == attributes.verb);
    if !verb_matches {
        return false;
    }
    let Some(path) = &attributes.path else {
        return resource_rule_matches(rule, attributes);
    };
    rule.non_resource_urls.iter().flatten().any(|url| {
        url == "*"
            || url == path
            || url
                .strip_suffix('*')
                .is_some_and(|prefix| path.starts_with(prefix))
    })
}

fn resource_rule_matches(rule: &PolicyRule, attributes: &RequestAttributes) -> bool {
    let group_matches = rule
        .api_groups
        .iter()
        .flatten()
        .any(|group| group == "*" || *group == attributes.api_group);
    let combined = attributes.combined_resource();
    let subresource = attributes.subresource();
    let resource_matches = rule.resources.iter().flatten().any(|resource| {
        resource == "*"
            || *resource == combined
            || (!subresource.is_empty()
                && resource
                    .strip_prefix("*/")
                    .is_some_and(|sub| sub == subresource))
    });
    let name_matches = match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => names.iter().any(|name| name == attributes.name()),
    };
    group_matches && resource_matches && name_matches
}

impl fmt::Display for RequestAttributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{} {path}", self.verb),
            None => write!(
                f,
                "{} {}.{} {}/{}",
                self.verb,
                self.combined_resource(),
                self.api_group,
                self.namespace(),
                self.name()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use k8s_openapi::api::rbac::v1::AggregationRule;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(strings(groups)),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            ..Default::default()
        }
    }

    fn named(mut rule: PolicyRule, names: &[&str]) -> PolicyRule {
        rule.resource_names = Some(names.iter().map(|s| (*s).to_owned()).collect());
        rule
    }

    fn urls(paths: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            non_resource_urls: Some(paths.iter().map(|s| (*s).to_owned()).collect()),
            verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    fn cluster_role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
        ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            rules: Some(rules),
            aggregation_rule: None,
        }
    }

    fn role(namespace: &str, name: &str, rules: Vec<PolicyRule>) -> Role {
        Role {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            rules: Some(rules),
        }
    }

    fn subject(kind: &str, name: &str) -> Subject {
        Subject {
            api_group: (kind != "ServiceAccount").then(|| "rbac.authorization.k8s.io".to_owned()),
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: None,
        }
    }

    fn role_ref(kind: &str, name: &str) -> RoleRef {
        RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
        }
    }

    fn cluster_binding(name: &str, role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
        ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            role_ref: role_ref("ClusterRole", role),
            subjects: Some(subjects),
        }
    }

    fn binding(
        namespace: &str,
        name: &str,
        role_ref: RoleRef,
        subjects: Vec<Subject>,
    ) -> RoleBinding {
        RoleBinding {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            role_ref,
            subjects: Some(subjects),
        }
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: name.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    /// `verb group/resource[/sub] [ns] [name]`, e.g. `create /pods/eviction shop web-0`.
    fn request(
        verb: &str,
        group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> RequestAttributes {
        let (resource, subresource) = match resource.split_once('/') {
            Some((resource, sub)) => (resource, Some(sub.to_owned())),
            None => (resource, None),
        };
        RequestAttributes {
            verb: verb.to_owned(),
            api_group: group.to_owned(),
            resource: resource.to_owned(),
            subresource,
            namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
            name: (!name.is_empty()).then(|| name.to_owned()),
            path: None,
        }
    }

    /// The objects of a drain-capable cluster: a ClusterRole for the functions' group,
    /// a namespaced Role, and bindings of each kind.
    fn authorizer() -> Authorizer {
        let drainer = cluster_role(
            "drainer",
            vec![
                rule(&[""], &["nodes"], &["get", "list", "watch", "patch"]),
                rule(&[""], &["pods"], &["get", "list"]),
                rule(&[""], &["pods/eviction"], &["create"]),
                rule(&["policy"], &["poddisruptionbudgets"], &["list"]),
                named(
                    rule(&[""], &["configmaps"], &["get", "update"]),
                    &["aws-auth"],
                ),
                urls(&["/healthz", "/apis/*"], &["get"]),
            ],
        );
        let status_writer = cluster_role(
            "status-writer",
            vec![rule(&["*"], &["*/status"], &["update"])],
        );
        let event_writer = cluster_role(
            "event-writer",
            vec![rule(
                &["", "events.k8s.io"],
                &["events"],
                &["create", "patch"],
            )],
        );
        let viewer = role(
            "shop",
            "viewer",
            vec![rule(&[""], &["*"], &["get", "list", "watch"])],
        );
        Authorizer::from_objects(
            &[drainer, status_writer, event_writer],
            &[
                cluster_binding(
                    "drainers",
                    "drainer",
                    vec![subject("Group", "open-node-manager:functions")],
                ),
                cluster_binding("status", "status-writer", vec![subject("User", "kubelet")]),
            ],
            &[viewer],
            &[
                binding(
                    "shop",
                    "view",
                    role_ref("Role", "viewer"),
                    vec![subject("User", "alice")],
                ),
                binding(
                    "shop",
                    "events",
                    role_ref("ClusterRole", "event-writer"),
                    vec![
                        Subject {
                            namespace: Some("tools".to_owned()),
                            ..subject("ServiceAccount", "recorder")
                        },
                        subject("ServiceAccount", "local"),
                    ],
                ),
            ],
        )
    }

    #[test]
    fn requests_are_decided_like_kubernetes_rbac() {
        let functions = user(
            "arn:aws:sts::1:assumed-role/fn/x",
            &["open-node-manager:functions", "system:authenticated"],
        );
        let alice = user("alice", &["system:authenticated"]);
        let kubelet = user("kubelet", &[]);
        let recorder = user("system:serviceaccount:tools:recorder", &[]);
        let local = user("system:serviceaccount:shop:local", &[]);
        let elsewhere = user("system:serviceaccount:other:local", &[]);
        let mallory = user("mallory", &["system:authenticated"]);
        let cases: Vec<(&str, &UserInfo, RequestAttributes, bool)> = vec![
            (
                "cluster grant, cluster scope",
                &functions,
                request("patch", "", "nodes", "", "ip-10-0-0-1"),
                true,
            ),
            (
                "cluster grant, list",
                &functions,
                request("list", "", "nodes", "", ""),
                true,
            ),
            (
                "cluster grant, verb missing",
                &functions,
                request("delete", "", "nodes", "", "n"),
                false,
            ),
            (
                "cluster grant in any namespace",
                &functions,
                request("get", "", "pods", "kube-system", "p"),
                true,
            ),
            (
                "subresource must be named",
                &functions,
                request("create", "", "pods/eviction", "shop", "web-0"),
                true,
            ),
            (
                "resource rule does not cover subresource",
                &functions,
                request("get", "", "pods/log", "shop", "web-0"),
                false,
            ),
            (
                "subresource rule does not cover resource",
                &kubelet,
                request("update", "", "pods", "shop", "web-0"),
                false,
            ),
            (
                "*/status covers any status",
                &kubelet,
                request("update", "", "nodes/status", "", "n"),
                true,
            ),
            (
                "*/status in another group",
                &kubelet,
                request("update", "apps", "deployments/status", "shop", "d"),
                true,
            ),
            (
                "*/status is not */scale",
                &kubelet,
                request("update", "apps", "deployments/scale", "shop", "d"),
                false,
            ),
            (
                "group must match",
                &functions,
                request("list", "policy", "pods", "shop", ""),
                false,
            ),
            (
                "pdbs in policy group",
                &functions,
                request("list", "policy", "poddisruptionbudgets", "", ""),
                true,
            ),
            (
                "resourceNames match the name",
                &functions,
                request("get", "", "configmaps", "kube-system", "aws-auth"),
                true,
            ),
            (
                "resourceNames exclude other names",
                &functions,
                request("get", "", "configmaps", "kube-system", "other"),
                false,
            ),
            (
                "resourceNames never match list",
                &functions,
                request("list", "", "configmaps", "kube-system", ""),
                false,
            ),
            (
                "resourceNames never match create",
                &functions,
                request("create", "", "configmaps", "kube-system", ""),
                false,
            ),
            (
                "resourceNames match update of that name",
                &functions,
                request("update", "", "configmaps", "kube-system", "aws-auth"),
                true,
            ),
            (
                "role binding in its namespace",
                &alice,
                request("list", "", "pods", "shop", ""),
                true,
            ),
            (
                "role binding, * resource",
                &alice,
                request("get", "", "secrets", "shop", "s"),
                true,
            ),
            (
                "role binding not elsewhere",
                &alice,
                request("list", "", "pods", "default", ""),
                false,
            ),
            (
                "role binding never cluster scope",
                &alice,
                request("list", "", "pods", "", ""),
                false,
            ),
            (
                "role binding verb",
                &alice,
                request("delete", "", "pods", "shop", "p"),
                false,
            ),
            (
                "service account by explicit namespace",
                &recorder,
                request("create", "", "events", "shop", ""),
                true,
            ),
            (
                "service account defaults to binding namespace",
                &local,
                request("patch", "events.k8s.io", "events", "shop", "e"),
                true,
            ),
            (
                "service account of another namespace",
                &elsewhere,
                request("create", "", "events", "shop", ""),
                false,
            ),
            (
                "nobody",
                &mallory,
                request("get", "", "pods", "shop", "p"),
                false,
            ),
        ];
        let authorizer = authorizer();
        for (name, who, attributes, allowed) in cases {
            let decision = authorizer.authorize(who, &attributes);
            assert_eq!(
                decision.is_ok(),
                allowed,
                "{name}: {attributes} -> {decision:?}"
            );
        }
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix() {
        let functions = user("fn", &["open-node-manager:functions"]);
        let authorizer = authorizer();
        let path = |verb: &str, path: &str| RequestAttributes {
            verb: verb.to_owned(),
            path: Some(path.to_owned()),
            ..Default::default()
        };
        assert!(
            authorizer
                .authorize(&functions, &path("get", "/healthz"))
                .is_ok()
        );
        assert!(
            authorizer
                .authorize(&functions, &path("get", "/apis/policy/v1"))
                .is_ok()
        );
        assert!(
            authorizer
                .authorize(&functions, &path("get", "/apis"))
                .is_err(),
            "/apis/* needs the slash"
        );
        assert!(
            authorizer
                .authorize(&functions, &path("get", "/version"))
                .is_err()
        );
        assert!(
            authorizer
                .authorize(&functions, &path("post", "/healthz"))
                .is_err()
        );
        let denial = authorizer
            .authorize(&functions, &path("get", "/version"))
            .unwrap_err();
        assert_eq!(
            denial.message,
            "forbidden: User \"fn\" cannot get path \"/version\""
        );
        // A resource rule never grants a path.
        let everything = Authorizer::from_objects(
            &[cluster_role("all", vec![rule(&["*"], &["*"], &["*"])])],
            &[cluster_binding("all", "all", vec![subject("User", "root")])],
            &[],
            &[],
        );
        assert!(
            everything
                .authorize(&user("root", &[]), &path("get", "/version"))
                .is_err()
        );
        assert!(
            everything
                .authorize(
                    &user("root", &[]),
                    &request("delete", "apps", "deployments", "x", "y")
                )
                .is_ok()
        );
    }

    #[test]
    fn denials_carry_the_real_forbidden_message() {
        let authorizer = authorizer();
        let alice = user("alice", &[]);
        let cases = [
            (
                request("create", "", "pods/eviction", "default", "web-0"),
                "pods \"web-0\" is forbidden: User \"alice\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"default\"",
            ),
            (
                request("list", "", "nodes", "", ""),
                "nodes is forbidden: User \"alice\" cannot list resource \"nodes\" in API group \"\" at the cluster scope",
            ),
            (
                request("patch", "", "nodes", "", "ip-10-0-0-1"),
                "nodes \"ip-10-0-0-1\" is forbidden: User \"alice\" cannot patch resource \"nodes\" in API group \"\" at the cluster scope",
            ),
            (
                request("list", "policy", "poddisruptionbudgets", "shop2", ""),
                "poddisruptionbudgets.policy is forbidden: User \"alice\" cannot list resource \"poddisruptionbudgets\" in API group \"policy\" in the namespace \"shop2\"",
            ),
        ];
        for (attributes, message) in cases {
            let denial = authorizer.authorize(&alice, &attributes).unwrap_err();
            assert_eq!(denial.message, message);
            let status = denial.to_status();
            assert_eq!(status.code, Some(403));
            assert_eq!(status.reason.as_deref(), Some("Forbidden"));
            let details = status.details.unwrap();
            assert_eq!(details.kind.as_deref(), Some(attributes.resource.as_str()));
            assert_eq!(details.name, attributes.name);
            assert_eq!(
                details.group,
                (!attributes.api_group.is_empty()).then(|| attributes.api_group.clone())
            );
        }
    }

    #[test]
    fn grants_name_the_binding_that_allowed() {
        let grant = authorizer()
            .authorize(
                &user("fn", &["open-node-manager:functions"]),
                &request("list", "", "nodes", "", ""),
            )
            .unwrap();
        assert_eq!(
            grant.reason,
            "RBAC: allowed by ClusterRoleBinding \"drainers\" of ClusterRole \"drainer\" to Group \"open-node-manager:functions\""
        );
        let grant = authorizer()
            .authorize(
                &user("system:serviceaccount:shop:local", &[]),
                &request("create", "", "events", "shop", ""),
            )
            .unwrap();
        assert_eq!(
            grant.reason,
            "RBAC: allowed by RoleBinding \"events/shop\" of ClusterRole \"event-writer\" to ServiceAccount \"local/shop\""
        );
    }

    #[test]
    fn missing_roles_are_explained_in_the_denial() {
        let authorizer = Authorizer::from_objects(
            &[],
            &[cluster_binding(
                "ghost",
                "does-not-exist",
                vec![subject("User", "bob")],
            )],
            &[],
            &[binding(
                "shop",
                "ghost",
                role_ref("Role", "gone"),
                vec![subject("User", "bob")],
            )],
        );
        let denial = authorizer
            .authorize(&user("bob", &[]), &request("get", "", "pods", "shop", "p"))
            .unwrap_err();
        assert_eq!(
            denial.message,
            "pods \"p\" is forbidden: User \"bob\" cannot get resource \"pods\" in API group \"\" in the namespace \"shop\": RBAC: [clusterrole.rbac.authorization.k8s.io \"does-not-exist\" not found, role.rbac.authorization.k8s.io \"gone\" not found]"
        );
        let denial = authorizer
            .authorize(&user("bob", &[]), &request("list", "", "nodes", "", ""))
            .unwrap_err();
        assert!(denial.message.ends_with(
            ": RBAC: clusterrole.rbac.authorization.k8s.io \"does-not-exist\" not found"
        ));
        // Someone the bindings do not name gets the plain message.
        let denial = authorizer
            .authorize(&user("carol", &[]), &request("list", "", "nodes", "", ""))
            .unwrap_err();
        assert!(!denial.message.contains("RBAC"));
    }

    #[test]
    fn a_role_binding_cannot_reach_a_role_of_another_namespace() {
        let authorizer = Authorizer::from_objects(
            &[],
            &[],
            &[role(
                "other",
                "viewer",
                vec![rule(&[""], &["pods"], &["list"])],
            )],
            &[binding(
                "shop",
                "view",
                role_ref("Role", "viewer"),
                vec![subject("User", "alice")],
            )],
        );
        assert!(
            authorizer
                .authorize(
                    &user("alice", &[]),
                    &request("list", "", "pods", "shop", "")
                )
                .is_err()
        );
        assert!(
            authorizer
                .authorize(
                    &user("alice", &[]),
                    &request("list", "", "pods", "other", "")
                )
                .is_err()
        );
    }

    #[test]
    fn aggregated_cluster_roles_collect_the_selected_rules() {
        let labelled = |name: &str, label: &str, rules: Vec<PolicyRule>| ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(BTreeMap::from([(label.to_owned(), "true".to_owned())])),
                ..Default::default()
            },
            ..cluster_role(name, rules)
        };
        let aggregate = |name: &str, label: &str| ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(BTreeMap::from([("parent".to_owned(), "true".to_owned())])),
                ..Default::default()
            },
            // Stale rules stored on an aggregated role are replaced, as the controller does.
            rules: Some(vec![rule(&[""], &["secrets"], &["get"])]),
            aggregation_rule: Some(AggregationRule {
                cluster_role_selectors: Some(vec![LabelSelector {
                    match_labels: Some(BTreeMap::from([(label.to_owned(), "true".to_owned())])),
                    match_expressions: None,
                }]),
            }),
        };
        let authorizer = Authorizer::from_objects(
            &[
                aggregate("view", "aggregate-to-view"),
                labelled(
                    "pods-view",
                    "aggregate-to-view",
                    vec![rule(&[""], &["pods"], &["get"])],
                ),
                labelled(
                    "nodes-view",
                    "aggregate-to-view",
                    vec![rule(&[""], &["nodes"], &["list"])],
                ),
                labelled(
                    "unrelated",
                    "other",
                    vec![rule(&[""], &["configmaps"], &["get"])],
                ),
                aggregate("super-view", "parent"),
            ],
            &[
                cluster_binding("view", "view", vec![subject("User", "viewer")]),
                cluster_binding("super", "super-view", vec![subject("User", "super")]),
            ],
            &[],
            &[],
        );
        let viewer = user("viewer", &[]);
        assert!(
            authorizer
                .authorize(&viewer, &request("get", "", "pods", "shop", "p"))
                .is_ok()
        );
        assert!(
            authorizer
                .authorize(&viewer, &request("list", "", "nodes", "", ""))
                .is_ok()
        );
        assert!(
            authorizer
                .authorize(&viewer, &request("get", "", "configmaps", "shop", "c"))
                .is_err()
        );
        assert!(
            authorizer
                .authorize(&viewer, &request("get", "", "secrets", "shop", "s"))
                .is_err()
        );
        // Aggregation is transitive (super-view aggregates view, which aggregates the rest).
        assert!(
            authorizer
                .authorize(&user("super", &[]), &request("list", "", "nodes", "", ""))
                .is_ok()
        );
        assert_eq!(authorizer.rules_for(&viewer, None).len(), 2);
    }

    #[test]
    fn superusers_and_rule_listing() {
        assert!(is_superuser(&user("admin", &["system:masters"])));
        assert!(!is_superuser(&user(
            "system:masters",
            &["system:authenticated"]
        )));
        let authorizer = authorizer();
        let alice = user("alice", &[]);
        assert!(authorizer.rules_for(&alice, None).is_empty());
        assert_eq!(authorizer.rules_for(&alice, Some("shop")).len(), 1);
        let functions = user("fn", &["open-node-manager:functions"]);
        assert_eq!(authorizer.rules_for(&functions, Some("shop")).len(), 6);
    }
}
