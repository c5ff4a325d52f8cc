//! Discovery documents (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`), the legacy
//! (non-aggregated) shapes that kubectl and kube-rs fall back to.

use serde_json::{Value, json};

use super::resources::{self, GROUP_VERSIONS};

/// The Kubernetes version the fake claims to be.
pub const SERVER_MINOR: &str = "33";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": SERVER_MINOR,
        "gitVersion": format!("v1.{SERVER_MINOR}.0-eks-fake"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-05-01T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

fn group(name: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({ "groupVersion": format!("{name}/{v}"), "version": v }))
        .collect();
    json!({
        "name": name,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or_default(),
    })
}

pub fn groups() -> Value {
    let groups: Vec<Value> = GROUP_VERSIONS
        .iter()
        .map(|(name, versions)| group(name, versions))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

pub fn api_group(name: &str) -> Option<Value> {
    let (name, versions) = GROUP_VERSIONS.iter().find(|(g, _)| *g == name)?;
    let mut group = group(name, versions);
    group["kind"] = json!("APIGroup");
    group["apiVersion"] = json!("v1");
    Some(group)
}

/// The `APIResourceList` of a group version, `None` if it is not served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served = group.is_empty() && version == "v1"
        || GROUP_VERSIONS
            .iter()
            .any(|(g, versions)| *g == group && versions.contains(&version));
    if !served {
        return None;
    }
    let entries: Vec<Value> = resources::in_group_version(group, version)
        .flat_map(|r| r.discovery_entries())
        .collect();
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    }))
}
