//! Field selectors (`fieldSelector=spec.nodeName=n1,status.phase!=Succeeded`).
//!
//! The real server supports a fixed set of fields per resource and refuses any other with
//! `400 field label not supported: <field>`; a client that relies on an unsupported field
//! must fail here as it would against a real cluster.

use serde_json::Value;

use super::resources::ResourceType;
use super::status::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    field: String,
    equals: bool,
    value: String,
}

/// A parsed field selector: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldQuery {
    requirements: Vec<FieldRequirement>,
}

/// Fields every resource supports.
const COMMON: &[&str] = &["metadata.name", "metadata.namespace"];

fn supported_fields(resource: &ResourceType) -> &'static [&'static str] {
    match (resource.group, resource.plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "namespaces") => &["status.phase"],
        ("", "events") | ("events.k8s.io", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("apps", "replicasets") => &["status.replicas"],
        _ => &[],
    }
}

impl FieldQuery {
    /// Parses and validates a selector for `resource`.
    pub fn parse(selector: &str, resource: &ResourceType) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equals, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{selector}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !COMMON.contains(&field) && !supported_fields(resource).contains(&field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                equals,
                value: value.trim().to_owned(),
            });
        }
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether a stored object (JSON) of `resource` satisfies every requirement.
    pub fn matches(&self, resource: &ResourceType, object: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let actual = field_value(resource, object, &r.field);
            (actual == r.value) == r.equals
        })
    }
}

/// The string form of a field, as the server's field-set functions produce it: absent
/// fields are `""`, booleans `true`/`false`.
fn field_value(resource: &ResourceType, object: &Value, field: &str) -> String {
    // events.k8s.io/v1 stores `regarding` where core/v1 has `involvedObject`; the server keeps
    // one storage and accepts the core field names on both.
    let mapped;
    let field = if resource.group == "events.k8s.io" {
        mapped = match field {
            "source" => "deprecatedSource".to_owned(),
            "reportingComponent" => "reportingController".to_owned(),
            other => other.replacen("involvedObject.", "regarding.", 1),
        };
        mapped.as_str()
    } else {
        field
    };
    let mut current = object;
    for segment in field.split('.') {
        match current.get(segment) {
            Some(next) => current = next,
            None => return String::new(),
        }
    }
    match current {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        Value::Object(map) if matches!(field, "source" | "deprecatedSource") => map
            .get("component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kube::resources::find;

    #[test]
    fn matches_pod_fields_and_rejects_unknown_ones() {
        let pods = find("", "v1", "pods").expect("pods served");
        let pod = json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let query = FieldQuery::parse("spec.nodeName=n1,status.phase!=Succeeded", pods)
            .expect("valid selector");
        assert!(query.matches(pods, &pod));
        let other = FieldQuery::parse("spec.nodeName==n2", pods).expect("valid selector");
        assert!(!other.matches(pods, &pod));
        let error = FieldQuery::parse("spec.unknown=x", pods).expect_err("unsupported field");
        assert_eq!(error.code, 400);
        assert_eq!(error.message, "field label not supported: spec.unknown");
    }
}
