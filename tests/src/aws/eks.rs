//! Fake EKS (restJson1): clusters, node groups and access entries.
//!
//! Access entries follow EKS's rules: only on clusters whose authentication mode includes
//! `API`, one per principal (`ResourceInUseException`), node types (`EC2_LINUX`,
//! `EC2_WINDOWS`) map to `system:node:{{EC2PrivateDNSName}}` in `system:nodes` and take no
//! username or groups. The fake EKS is also the [`AccessEntryLookup`] the fake API server's
//! authenticator consults, so an entry created through the API grants access to the cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::Method;
use serde_json::{Value, json};

use super::protocol::{self, ApiError, Reply};
use super::{FakeAwsError, ParsedRequest, Shared, lock};
use crate::account::{AccessEntryLookup, KubernetesIdentity};

/// The username EKS gives node access entries.
pub const NODE_USERNAME: &str = "system:node:{{EC2PrivateDNSName}}";

/// A cluster as a test declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeCluster {
    pub name: String,
    /// `https://...` API server endpoint.
    pub endpoint: String,
    /// Base64 of the CA bundle PEM (`certificateAuthority.data`).
    pub certificate_authority_data: String,
    /// `CONFIG_MAP`, `API_AND_CONFIG_MAP`, `API`; `None`: the cluster reports no
    /// `accessConfig` (created before access entries existed), which EKS treats as
    /// `CONFIG_MAP`.
    pub authentication_mode: Option<String>,
    pub status: String,
    pub version: String,
    pub role_arn: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl FakeCluster {
    /// An `ACTIVE` Kubernetes 1.33 cluster in `API_AND_CONFIG_MAP` mode.
    pub fn new(name: &str, endpoint: &str, certificate_authority_data: &str) -> Self {
        Self {
            name: name.to_owned(),
            endpoint: endpoint.to_owned(),
            certificate_authority_data: certificate_authority_data.to_owned(),
            authentication_mode: Some("API_AND_CONFIG_MAP".to_owned()),
            status: "ACTIVE".to_owned(),
            version: "1.33".to_owned(),
            role_arn: None,
            tags: BTreeMap::new(),
        }
    }

    pub fn authentication_mode(mut self, mode: Option<&str>) -> Self {
        self.authentication_mode = mode.map(str::to_owned);
        self
    }

    pub fn status(mut self, status: &str) -> Self {
        self.status = status.to_owned();
        self
    }

    fn allows_access_entries(&self) -> bool {
        matches!(
            self.authentication_mode.as_deref(),
            Some("API" | "API_AND_CONFIG_MAP")
        )
    }
}

/// A managed node group as a test declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeNodegroup {
    pub name: String,
    pub node_role: String,
    /// `AL2_x86_64`, `AL2023_x86_64_STANDARD`, `WINDOWS_CORE_2022_x86_64`, `CUSTOM`, ...
    pub ami_type: String,
    pub status: String,
    pub auto_scaling_groups: Vec<String>,
    pub instance_types: Vec<String>,
    pub capacity_type: String,
    pub min_size: u32,
    pub max_size: u32,
    pub desired_size: u32,
    pub labels: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
}

impl FakeNodegroup {
    /// An `ACTIVE` `AL2023_x86_64_STANDARD` on-demand node group.
    pub fn new(name: &str, node_role: &str) -> Self {
        Self {
            name: name.to_owned(),
            node_role: node_role.to_owned(),
            ami_type: "AL2023_x86_64_STANDARD".to_owned(),
            status: "ACTIVE".to_owned(),
            auto_scaling_groups: Vec::new(),
            instance_types: vec!["m5.large".to_owned()],
            capacity_type: "ON_DEMAND".to_owned(),
            min_size: 1,
            max_size: 3,
            desired_size: 2,
            labels: BTreeMap::new(),
            tags: BTreeMap::new(),
        }
    }

    pub fn ami_type(mut self, ami_type: &str) -> Self {
        self.ami_type = ami_type.to_owned();
        self
    }

    pub fn status(mut self, status: &str) -> Self {
        self.status = status.to_owned();
        self
    }

    pub fn auto_scaling_group(mut self, name: &str) -> Self {
        self.auto_scaling_groups.push(name.to_owned());
        self
    }
}

/// An access entry as EKS stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeAccessEntry {
    pub principal_arn: String,
    /// `STANDARD`, `EC2_LINUX`, `EC2_WINDOWS`, `FARGATE_LINUX`, `HYBRID_LINUX`.
    pub entry_type: String,
    pub username: String,
    pub kubernetes_groups: Vec<String>,
    pub access_entry_arn: String,
    pub tags: BTreeMap<String, String>,
    created_at: f64,
}

struct ClusterRecord {
    cluster: FakeCluster,
    arn: String,
    created_at: f64,
    nodegroups: BTreeMap<String, (FakeNodegroup, String, f64)>,
    access_entries: BTreeMap<String, FakeAccessEntry>,
}

#[derive(Default)]
pub(crate) struct EksState {
    clusters: BTreeMap<String, ClusterRecord>,
}

fn now_epoch_seconds() -> f64 {
    // Epoch milliseconds fit an f64 exactly for the next few hundred thousand years.
    #[allow(clippy::cast_precision_loss)]
    let millis = jiff::Timestamp::now().as_millisecond() as f64;
    millis / 1000.0
}

/// Handle on the fake EKS.
#[derive(Clone)]
pub struct FakeEks {
    shared: Arc<Shared>,
}

impl FakeEks {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn arn(&self, resource: &str) -> String {
        let account = &self.shared.account;
        format!(
            "arn:{}:eks:{}:{}:{resource}",
            account.partition, account.region, account.account_id
        )
    }

    /// Adds (or replaces, keeping its node groups and entries) a cluster.
    pub fn add_cluster(&self, cluster: FakeCluster) {
        let arn = self.arn(&format!("cluster/{}", cluster.name));
        let mut state = lock(&self.shared.eks);
        match state.clusters.get_mut(&cluster.name) {
            Some(record) => record.cluster = cluster,
            None => {
                state.clusters.insert(
                    cluster.name.clone(),
                    ClusterRecord {
                        cluster,
                        arn,
                        created_at: now_epoch_seconds(),
                        nodegroups: BTreeMap::new(),
                        access_entries: BTreeMap::new(),
                    },
                );
            }
        }
    }

    pub fn remove_cluster(&self, name: &str) -> bool {
        lock(&self.shared.eks).clusters.remove(name).is_some()
    }

    pub fn set_authentication_mode(
        &self,
        cluster: &str,
        mode: Option<&str>,
    ) -> Result<(), FakeAwsError> {
        let mut state = lock(&self.shared.eks);
        let record = state
            .clusters
            .get_mut(cluster)
            .ok_or_else(|| FakeAwsError::UnknownCluster(cluster.to_owned()))?;
        record.cluster.authentication_mode = mode.map(str::to_owned);
        Ok(())
    }

    /// Adds (or replaces) a node group of `cluster`.
    pub fn add_nodegroup(
        &self,
        cluster: &str,
        nodegroup: FakeNodegroup,
    ) -> Result<(), FakeAwsError> {
        let arn = self.arn(&format!(
            "nodegroup/{cluster}/{}/{}",
            nodegroup.name,
            protocol::uuid_v4()
        ));
        let mut state = lock(&self.shared.eks);
        let record = state
            .clusters
            .get_mut(cluster)
            .ok_or_else(|| FakeAwsError::UnknownCluster(cluster.to_owned()))?;
        record.nodegroups.insert(
            nodegroup.name.clone(),
            (nodegroup, arn, now_epoch_seconds()),
        );
        Ok(())
    }

    /// Removes a node group; `false` when it did not exist.
    pub fn remove_nodegroup(&self, cluster: &str, name: &str) -> bool {
        lock(&self.shared.eks)
            .clusters
            .get_mut(cluster)
            .is_some_and(|record| record.nodegroups.remove(name).is_some())
    }

    /// Seeds an access entry (no validation; use the API for EKS's rules).
    pub fn add_access_entry(
        &self,
        cluster: &str,
        principal_arn: &str,
        entry_type: &str,
        username: Option<&str>,
        kubernetes_groups: &[&str],
    ) -> Result<FakeAccessEntry, FakeAwsError> {
        let mut state = lock(&self.shared.eks);
        let record = state
            .clusters
            .get_mut(cluster)
            .ok_or_else(|| FakeAwsError::UnknownCluster(cluster.to_owned()))?;
        let entry = new_entry(
            &self.shared,
            cluster,
            principal_arn,
            entry_type,
            username.map(str::to_owned),
            kubernetes_groups.iter().map(|g| (*g).to_owned()).collect(),
            BTreeMap::new(),
        );
        record
            .access_entries
            .insert(principal_arn.to_owned(), entry.clone());
        Ok(entry)
    }

    /// The cluster's access entries, by principal ARN.
    pub fn access_entries(&self, cluster: &str) -> Vec<FakeAccessEntry> {
        lock(&self.shared.eks)
            .clusters
            .get(cluster)
            .map(|record| record.access_entries.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn access_entry(&self, cluster: &str, principal_arn: &str) -> Option<FakeAccessEntry> {
        lock(&self.shared.eks)
            .clusters
            .get(cluster)
            .and_then(|record| record.access_entries.get(principal_arn).cloned())
    }
}

impl AccessEntryLookup for FakeEks {
    fn kubernetes_identity(
        &self,
        cluster_name: &str,
        principal_arn: &str,
    ) -> Option<KubernetesIdentity> {
        let state = lock(&self.shared.eks);
        let record = state.clusters.get(cluster_name)?;
        if !record.cluster.allows_access_entries() {
            return None;
        }
        let entry = record.access_entries.get(principal_arn)?;
        Some(match entry.entry_type.as_str() {
            "EC2_LINUX" | "EC2_WINDOWS" => KubernetesIdentity {
                username: NODE_USERNAME.to_owned(),
                groups: vec!["system:nodes".to_owned()],
            },
            _ => KubernetesIdentity {
                username: entry.username.clone(),
                groups: entry.kubernetes_groups.clone(),
            },
        })
    }
}

fn new_entry(
    shared: &Shared,
    cluster: &str,
    principal_arn: &str,
    entry_type: &str,
    username: Option<String>,
    kubernetes_groups: Vec<String>,
    tags: BTreeMap<String, String>,
) -> FakeAccessEntry {
    let account = &shared.account;
    // arn:aws:iam::111111111111:role/path/name → role/111111111111/path/name
    let principal_part = principal_arn
        .rsplit_once(':')
        .map(|(head, resource)| {
            let principal_account = head.rsplit(':').next().unwrap_or(&account.account_id);
            match resource.split_once('/') {
                Some((kind, rest)) => format!("{kind}/{principal_account}/{rest}"),
                None => resource.to_owned(),
            }
        })
        .unwrap_or_default();
    let default_username = match entry_type {
        "EC2_LINUX" | "EC2_WINDOWS" => NODE_USERNAME.to_owned(),
        "FARGATE_LINUX" => "system:node:{{SessionName}}".to_owned(),
        "HYBRID_LINUX" => "system:node:{{SessionName}}".to_owned(),
        _ => principal_arn.to_owned(),
    };
    FakeAccessEntry {
        principal_arn: principal_arn.to_owned(),
        entry_type: entry_type.to_owned(),
        username: username.unwrap_or(default_username),
        kubernetes_groups,
        access_entry_arn: format!(
            "arn:{}:eks:{}:{}:access-entry/{cluster}/{principal_part}/{}",
            account.partition,
            account.region,
            account.account_id,
            protocol::uuid_v4()
        ),
        tags,
        created_at: now_epoch_seconds(),
    }
}

pub(crate) fn operation_name(method: &Method, segments: &[String]) -> &'static str {
    let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
    match (method, parts.as_slice()) {
        (&Method::GET, ["clusters", _]) => "DescribeCluster",
        (&Method::GET, ["clusters", _, "node-groups"]) => "ListNodegroups",
        (&Method::GET, ["clusters", _, "node-groups", _]) => "DescribeNodegroup",
        (&Method::POST, ["clusters", _, "access-entries"]) => "CreateAccessEntry",
        (&Method::GET, ["clusters", _, "access-entries"]) => "ListAccessEntries",
        (&Method::GET, ["clusters", _, "access-entries", ..]) => "DescribeAccessEntry",
        (&Method::DELETE, ["clusters", _, "access-entries", ..]) => "DeleteAccessEntry",
        _ => "",
    }
}

pub(crate) fn path_params(segments: &[String]) -> BTreeMap<String, String> {
    let mut params = BTreeMap::new();
    if let Some(cluster) = segments.get(1) {
        params.insert("clusterName".to_owned(), cluster.clone());
    }
    match segments.get(2).map(String::as_str) {
        Some("node-groups") => {
            if let Some(name) = segments.get(3) {
                params.insert("nodegroupName".to_owned(), name.clone());
            }
        }
        Some("access-entries") if segments.len() > 3 => {
            params.insert("principalArn".to_owned(), segments[3..].join("/"));
        }
        _ => {}
    }
    params
}

pub(crate) fn dispatch(
    shared: &Shared,
    operation: &str,
    request: &ParsedRequest,
) -> Result<Reply, ApiError> {
    let params = path_params(&request.segments);
    let cluster_name = params.get("clusterName").cloned().unwrap_or_default();
    let mut state = lock(&shared.eks);
    let record = state.clusters.get_mut(&cluster_name);
    if operation.is_empty() {
        return Err(ApiError::new(
            404,
            "UnknownOperationException",
            "The requested operation is not supported by the fake EKS endpoint.",
        ));
    }
    let record = record.ok_or_else(|| {
        ApiError::new(
            404,
            "ResourceNotFoundException",
            format!("No cluster found for name: {cluster_name}."),
        )
        .with_field("clusterName", cluster_name.clone())
    })?;
    match operation {
        "DescribeCluster" => Ok(Reply::Json(200, json!({ "cluster": cluster_json(record) }))),
        "ListNodegroups" => {
            let names: Vec<String> = record.nodegroups.keys().cloned().collect();
            let (page, next) = paginate(&names, &request.query)?;
            Ok(Reply::Json(
                200,
                json!({ "nodegroups": page, "nextToken": next }),
            ))
        }
        "DescribeNodegroup" => {
            let name = params.get("nodegroupName").cloned().unwrap_or_default();
            let (nodegroup, arn, created_at) = record.nodegroups.get(&name).ok_or_else(|| {
                ApiError::new(
                    404,
                    "ResourceNotFoundException",
                    format!("No node group found for name: {name}."),
                )
                .with_field("clusterName", cluster_name.clone())
                .with_field("nodegroupName", name.clone())
            })?;
            Ok(Reply::Json(
                200,
                json!({ "nodegroup": nodegroup_json(&cluster_name, nodegroup, arn, *created_at, &record.cluster.version) }),
            ))
        }
        _ => access_entries(shared, operation, record, &params, request),
    }
}

fn access_entries(
    shared: &Shared,
    operation: &str,
    record: &mut ClusterRecord,
    params: &BTreeMap<String, String>,
    request: &ParsedRequest,
) -> Result<Reply, ApiError> {
    if !record.cluster.allows_access_entries() {
        return Err(ApiError::new(
            400,
            "InvalidRequestException",
            "The cluster's authentication mode must be set to one of [API, API_AND_CONFIG_MAP] to perform this operation.",
        )
        .with_field("clusterName", record.cluster.name.clone()));
    }
    let cluster_name = record.cluster.name.clone();
    let not_found = || {
        ApiError::new(
            404,
            "ResourceNotFoundException",
            "The specified principalArn could not be found. You can view your available access entries with 'list-access-entries'.",
        )
        .with_field("clusterName", cluster_name.clone())
    };
    match operation {
        "ListAccessEntries" => {
            let arns: Vec<String> = record.access_entries.keys().cloned().collect();
            let (page, next) = paginate(&arns, &request.query)?;
            Ok(Reply::Json(
                200,
                json!({ "accessEntries": page, "nextToken": next }),
            ))
        }
        "DescribeAccessEntry" => {
            let principal = params.get("principalArn").cloned().unwrap_or_default();
            let entry = record
                .access_entries
                .get(&principal)
                .ok_or_else(not_found)?;
            Ok(Reply::Json(
                200,
                json!({ "accessEntry": entry_json(&cluster_name, entry) }),
            ))
        }
        "DeleteAccessEntry" => {
            let principal = params.get("principalArn").cloned().unwrap_or_default();
            record
                .access_entries
                .remove(&principal)
                .ok_or_else(not_found)?;
            Ok(Reply::Json(200, json!({})))
        }
        "CreateAccessEntry" => {
            let body: Value = serde_json::from_slice(&request.body).map_err(|e| {
                ApiError::new(
                    400,
                    "InvalidParameterException",
                    format!("invalid JSON body: {e}"),
                )
            })?;
            let entry = validate_new_entry(shared, &cluster_name, &body)?;
            if record.access_entries.contains_key(&entry.principal_arn) {
                return Err(ApiError::new(
                    409,
                    "ResourceInUseException",
                    "The specified access entry resource is already in use on this cluster.",
                )
                .with_field("clusterName", cluster_name.clone()));
            }
            let json = entry_json(&cluster_name, &entry);
            record
                .access_entries
                .insert(entry.principal_arn.clone(), entry);
            Ok(Reply::Json(200, json!({ "accessEntry": json })))
        }
        _ => Err(ApiError::new(
            404,
            "UnknownOperationException",
            "The requested operation is not supported by the fake EKS endpoint.",
        )),
    }
}

/// Whether `arn` is an IAM role or user ARN (`arn:<partition>:iam::<12 digits>:role/...`).
fn is_iam_principal_arn(arn: &str) -> bool {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    matches!(
        parts.as_slice(),
        ["arn", partition, "iam", "", account, resource]
            if partition.starts_with("aws")
                && account.len() == 12
                && account.bytes().all(|b| b.is_ascii_digit())
                && (resource.starts_with("role/") || resource.starts_with("user/"))
                && resource.len() > 5
    )
}

fn validate_new_entry(
    shared: &Shared,
    cluster: &str,
    body: &Value,
) -> Result<FakeAccessEntry, ApiError> {
    let invalid = |message: String| {
        ApiError::new(400, "InvalidParameterException", message).with_field("clusterName", cluster)
    };
    let principal = body
        .get("principalArn")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("principalArn is required.".to_owned()))?;
    if !is_iam_principal_arn(principal) {
        return Err(invalid(format!(
            "The specified principalArn is invalid: {principal} is not an IAM role or user ARN."
        )));
    }
    let entry_type = body
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("STANDARD");
    if !matches!(
        entry_type,
        "STANDARD" | "EC2_LINUX" | "EC2_WINDOWS" | "FARGATE_LINUX" | "HYBRID_LINUX"
    ) {
        return Err(invalid(format!(
            "The type {entry_type} is invalid. Valid types are STANDARD, EC2_LINUX, EC2_WINDOWS, FARGATE_LINUX, HYBRID_LINUX."
        )));
    }
    let username = body
        .get("username")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let groups: Vec<String> = body
        .get("kubernetesGroups")
        .and_then(Value::as_array)
        .map(|groups| {
            groups
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if entry_type != "STANDARD" && (username.is_some() || !groups.is_empty()) {
        return Err(invalid(format!(
            "username and kubernetesGroups can't be specified for an access entry of type {entry_type}."
        )));
    }
    if let Some(group) = groups.iter().find(|g| g.starts_with("system:")) {
        return Err(invalid(format!(
            "The kubernetes group name {group} is invalid, it can not start with system:"
        )));
    }
    let tags: BTreeMap<String, String> = body
        .get("tags")
        .and_then(Value::as_object)
        .map(|tags| {
            tags.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    Ok(new_entry(
        shared, cluster, principal, entry_type, username, groups, tags,
    ))
}

/// One page of `items` for `maxResults` (1..=100, default 100) and an opaque `nextToken`.
fn paginate(
    items: &[String],
    query: &BTreeMap<String, String>,
) -> Result<(Vec<String>, Option<String>), ApiError> {
    let invalid = |message: &str| ApiError::new(400, "InvalidParameterException", message);
    let max = match query.get("maxResults") {
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| invalid("maxResults must be between 1 and 100."))?,
        None => 100,
    };
    let start = match query.get("nextToken") {
        Some(token) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(token)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .and_then(|s| {
                    s.strip_prefix("offset:")
                        .and_then(|n| n.parse::<usize>().ok())
                })
                .filter(|n| *n <= items.len())
                .ok_or_else(|| invalid("The nextToken provided is invalid."))?
        }
        None => 0,
    };
    let end = (start + max).min(items.len());
    let next = (end < items.len()).then(|| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("offset:{end}"))
    });
    Ok((items[start..end].to_vec(), next))
}

fn cluster_json(record: &ClusterRecord) -> Value {
    let cluster = &record.cluster;
    let mut value = json!({
        "name": cluster.name,
        "arn": record.arn,
        "createdAt": record.created_at,
        "version": cluster.version,
        "endpoint": cluster.endpoint,
        "roleArn": cluster.role_arn,
        "resourcesVpcConfig": {
            "subnetIds": [],
            "securityGroupIds": [],
            "endpointPublicAccess": true,
            "endpointPrivateAccess": true,
            "publicAccessCidrs": ["0.0.0.0/0"]
        },
        "kubernetesNetworkConfig": { "serviceIpv4Cidr": "172.20.0.0/16", "ipFamily": "ipv4" },
        "status": cluster.status,
        "certificateAuthority": { "data": cluster.certificate_authority_data },
        "platformVersion": "eks.1",
        "tags": cluster.tags,
    });
    if let (Some(mode), Some(object)) = (&cluster.authentication_mode, value.as_object_mut()) {
        object.insert(
            "accessConfig".to_owned(),
            json!({ "bootstrapClusterCreatorAdminPermissions": true, "authenticationMode": mode }),
        );
    }
    value
}

fn nodegroup_json(
    cluster: &str,
    nodegroup: &FakeNodegroup,
    arn: &str,
    created_at: f64,
    version: &str,
) -> Value {
    json!({
        "nodegroupName": nodegroup.name,
        "nodegroupArn": arn,
        "clusterName": cluster,
        "version": version,
        "releaseVersion": format!("{version}.0-20250101"),
        "createdAt": created_at,
        "modifiedAt": created_at,
        "status": nodegroup.status,
        "capacityType": nodegroup.capacity_type,
        "scalingConfig": {
            "minSize": nodegroup.min_size,
            "maxSize": nodegroup.max_size,
            "desiredSize": nodegroup.desired_size
        },
        "instanceTypes": nodegroup.instance_types,
        "subnets": [],
        "amiType": nodegroup.ami_type,
        "nodeRole": nodegroup.node_role,
        "labels": nodegroup.labels,
        "resources": {
            "autoScalingGroups": nodegroup.auto_scaling_groups.iter().map(|name| json!({ "name": name })).collect::<Vec<_>>()
        },
        "diskSize": 20,
        "health": { "issues": [] },
        "updateConfig": { "maxUnavailable": 1 },
        "tags": nodegroup.tags,
    })
}

fn entry_json(cluster: &str, entry: &FakeAccessEntry) -> Value {
    json!({
        "clusterName": cluster,
        "principalArn": entry.principal_arn,
        "kubernetesGroups": entry.kubernetes_groups,
        "accessEntryArn": entry.access_entry_arn,
        "createdAt": entry.created_at,
        "modifiedAt": entry.created_at,
        "tags": entry.tags,
        "username": entry.username,
        "type": entry.entry_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principal_arns_must_be_iam_roles_or_users() {
        assert!(is_iam_principal_arn("arn:aws:iam::111111111111:role/node"));
        assert!(is_iam_principal_arn(
            "arn:aws-cn:iam::111111111111:user/a/b"
        ));
        assert!(!is_iam_principal_arn(
            "arn:aws:sts::111111111111:assumed-role/node/s"
        ));
        assert!(!is_iam_principal_arn("arn:aws:iam::1111:role/node"));
        assert!(!is_iam_principal_arn("node"));
    }

    #[test]
    fn pages_chain_through_next_tokens() {
        let items: Vec<String> = (0..5).map(|i| i.to_string()).collect();
        let mut query = BTreeMap::from([("maxResults".to_owned(), "2".to_owned())]);
        let mut seen = Vec::new();
        loop {
            let (page, next) = paginate(&items, &query).expect("page");
            seen.extend(page);
            match next {
                Some(token) => query.insert("nextToken".to_owned(), token),
                None => break,
            };
        }
        assert_eq!(seen, items);
        query.insert("nextToken".to_owned(), "garbage".to_owned());
        assert!(paginate(&items, &query).is_err());
    }
}
