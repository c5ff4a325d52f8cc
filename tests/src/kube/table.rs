//! Server-side printing (`meta.k8s.io/v1` `Table`), which `kubectl get` asks for.

use serde_json::{Value, json};

use super::resources::ResourceType;
use super::store::ListPage;

/// Whether the client asked for a Table (kubectl's `Accept: application/json;as=Table;...`).
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

fn column(name: &str, kind: &str, format: &str) -> Value {
    json!({ "name": name, "type": kind, "format": format, "description": name, "priority": 0 })
}

fn age(object: &Value) -> String {
    let created = object
        .get("metadata")
        .and_then(|m| m.get("creationTimestamp"))
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let Some(created) = created else {
        return "<unknown>".into();
    };
    let seconds = jiff::Timestamp::now().as_second() - created.as_second();
    match seconds {
        s if s < 120 => format!("{}s", s.max(0)),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn condition_true(object: &Value, kind: &str) -> bool {
    object
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(kind)
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

fn str_at<'a>(object: &'a Value, path: &[&str]) -> &'a str {
    let mut current = object;
    for segment in path {
        match current.get(segment) {
            Some(next) => current = next,
            None => return "",
        }
    }
    current.as_str().unwrap_or_default()
}

fn columns_and_cells(resource: &ResourceType, objects: &[Value]) -> (Vec<Value>, Vec<Vec<Value>>) {
    let name = |o: &Value| json!(str_at(o, &["metadata", "name"]));
    match (resource.group, resource.plural) {
        ("", "nodes") => (
            vec![
                column("Name", "string", "name"),
                column("Status", "string", ""),
                column("Roles", "string", ""),
                column("Age", "string", ""),
                column("Version", "string", ""),
            ],
            objects
                .iter()
                .map(|o| {
                    let mut status = if condition_true(o, "Ready") {
                        "Ready"
                    } else {
                        "NotReady"
                    }
                    .to_owned();
                    if o.get("spec")
                        .and_then(|s| s.get("unschedulable"))
                        .and_then(Value::as_bool)
                        == Some(true)
                    {
                        status.push_str(",SchedulingDisabled");
                    }
                    vec![
                        name(o),
                        json!(status),
                        json!("<none>"),
                        json!(age(o)),
                        json!(str_at(o, &["status", "nodeInfo", "kubeletVersion"])),
                    ]
                })
                .collect(),
        ),
        ("", "pods") => (
            vec![
                column("Name", "string", "name"),
                column("Ready", "string", ""),
                column("Status", "string", ""),
                column("Restarts", "string", ""),
                column("Age", "string", ""),
                column("Node", "string", ""),
            ],
            objects
                .iter()
                .map(|o| {
                    let containers = o
                        .get("spec")
                        .and_then(|s| s.get("containers"))
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    let ready = if condition_true(o, "Ready") {
                        containers
                    } else {
                        0
                    };
                    let status = if o
                        .get("metadata")
                        .and_then(|m| m.get("deletionTimestamp"))
                        .is_some()
                    {
                        "Terminating"
                    } else {
                        str_at(o, &["status", "phase"])
                    };
                    vec![
                        name(o),
                        json!(format!("{ready}/{containers}")),
                        json!(status),
                        json!("0"),
                        json!(age(o)),
                        json!(str_at(o, &["spec", "nodeName"])),
                    ]
                })
                .collect(),
        ),
        _ => (
            vec![
                column("Name", "string", "name"),
                column("Age", "string", ""),
            ],
            objects
                .iter()
                .map(|o| vec![name(o), json!(age(o))])
                .collect(),
        ),
    }
}

/// The single object (`get`) or a Table when the client asked for one.
pub fn maybe_table(
    resource: &ResourceType,
    accept: &str,
    mut objects: Vec<Value>,
    page: Option<&ListPage>,
    is_list: bool,
) -> Value {
    if !wants_table(accept) && !is_list {
        return objects.pop().unwrap_or_default();
    }
    let (columns, cells) = columns_and_cells(resource, &objects);
    let rows: Vec<Value> = objects
        .iter()
        .zip(cells)
        .map(|(object, cells)| {
            json!({
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": object.get("metadata").cloned().unwrap_or_default(),
                },
            })
        })
        .collect();
    let mut metadata = json!({});
    if let Some(page) = page {
        metadata["resourceVersion"] = json!(page.resource_version.to_string());
        if let Some(token) = &page.continue_token {
            metadata["continue"] = json!(token);
        }
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    })
}
