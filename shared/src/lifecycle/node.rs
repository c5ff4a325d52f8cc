//! Which Kubernetes Node an EC2 instance is.
//!
//! On EKS a node is named after the instance's private DNS name, so one EC2 call and one GET
//! usually find it. The name alone is not proof (names are reused after an instance is gone,
//! and some clusters name nodes differently), so the node's `spec.providerID`
//! (`aws:///<az>/<instance-id>`) must name the instance; when it does not, a paged scan of
//! the nodes by providerID decides.

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{Api, ListParams};

use crate::aws::{AwsError, Instances};
use crate::cluster::pages::Pages;

use crate::retry::{RetryPolicy, with_retries};

/// Nodes read per page of the fallback scan.
const SCAN_PAGE_SIZE: u32 = 500;

/// A lookup that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NodeLookupError {
    #[error("cannot read nodes from the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Aws(#[from] AwsError),
}

/// The instance id a provider ID names: `aws:///eu-west-1a/i-0abc` -> `i-0abc`.
pub(crate) fn instance_id_from_provider_id(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("aws://")?;
    let last = rest.rsplit('/').next()?;
    last.starts_with("i-").then_some(last)
}

/// Whether the node's `spec.providerID` names `instance_id`.
pub(crate) fn node_provider_id_matches(node: &Node, instance_id: &str) -> bool {
    node_instance_id(node) == Some(instance_id)
}

/// The instance a node says it runs on, from its `spec.providerID`.
pub fn node_instance_id(node: &Node) -> Option<&str> {
    node.spec
        .as_ref()
        .and_then(|spec| spec.provider_id.as_deref())
        .and_then(instance_id_from_provider_id)
}

/// Whether `node`, found under the instance's private DNS name, is the instance's node: its
/// providerID names the instance, or it has none yet (a node that has only just registered).
pub(crate) fn is_node_of_instance(node: &Node, instance_id: &str) -> bool {
    let provider_id = node
        .spec
        .as_ref()
        .and_then(|spec| spec.provider_id.as_deref());
    match provider_id {
        None | Some("") => true,
        Some(_) => node_provider_id_matches(node, instance_id),
    }
}

/// The node's `Ready` condition, if it reports one.
pub fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// Whether the node's `Ready` condition is `True`.
pub fn is_ready(node: &Node) -> bool {
    ready_condition(node).is_some_and(|c| c.status == "True")
}

/// The instance's private DNS name, `None` when EC2 does not know it or cannot be asked (the
/// scan still finds the node then).
pub async fn private_dns_name(instances: &impl Instances, instance_id: &str) -> Option<String> {
    match with_retries(&RetryPolicy::AWS_CALL, || {
        instances.private_dns_name(instance_id)
    })
    .await
    {
        Ok(name) => name.filter(|n| !n.is_empty()),
        Err(error) => {
            tracing::warn!(
                instance_id,
                error = %error,
                "cannot read the instance's private DNS name; looking for its node by providerID"
            );
            None
        }
    }
}

/// The Node of `instance_id`, `Ok(None)` when the cluster has none.
pub async fn find_node(
    client: &kube::Client,
    instances: &impl Instances,
    instance_id: &str,
) -> Result<Option<Node>, NodeLookupError> {
    let nodes: Api<Node> = Api::all(client.clone());
    if let Some(name) = private_dns_name(instances, instance_id).await
        && let Some(node) = nodes.get_opt(&name).await?
    {
        if is_node_of_instance(&node, instance_id) {
            return Ok(Some(node));
        }
        tracing::info!(
            instance_id,
            node = %name,
            provider_id = ?node_instance_id(&node),
            "the node named after the instance's DNS name belongs to another instance; scanning by providerID"
        );
    }
    scan_by_provider_id(&nodes, instance_id).await
}

/// The label EKS puts on the nodes of a managed node group (value: the node group's name).
pub const MANAGED_NODEGROUP_LABEL: &str = "eks.amazonaws.com/nodegroup";

/// The managed node group a node belongs to, from its label.
pub fn node_managed_node_group(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get(MANAGED_NODEGROUP_LABEL)
        .map(String::as_str)
}

/// Which node each instance is, as the last full scan saw it: nodes not named after their
/// instance's DNS name are found without scanning again for [`NODE_INDEX_MAX_AGE`], so a
/// burst of instance notices costs one scan, not one per notice.
#[derive(Debug, Default)]
pub struct NodeIndex {
    scanned: std::sync::Mutex<Option<ScannedNodes>>,
}

#[derive(Debug)]
struct ScannedNodes {
    at: tokio::time::Instant,
    /// Instance id → node name.
    names: std::collections::HashMap<String, String>,
}

/// How long a scan answers for the cluster's nodes. A node registered since, under a name
/// other than its instance's DNS name, is found only by the next scan.
pub const NODE_INDEX_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// What the index says about an instance.
enum Indexed {
    /// The scan is too old (or none was made): scan again.
    Stale,
    /// The scan saw no node for the instance.
    NoNode,
    Named(String),
}

impl NodeIndex {
    fn lookup(&self, instance_id: &str) -> Indexed {
        let scanned = self
            .scanned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match scanned.as_ref() {
            Some(scan) if scan.at.elapsed() < NODE_INDEX_MAX_AGE => {
                match scan.names.get(instance_id) {
                    Some(name) => Indexed::Named(name.clone()),
                    None => Indexed::NoNode,
                }
            }
            _ => Indexed::Stale,
        }
    }

    fn remember(&self, names: std::collections::HashMap<String, String>) {
        *self
            .scanned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(ScannedNodes {
            at: tokio::time::Instant::now(),
            names,
        });
    }
}

/// The Node of `instance_id` whose private DNS name the caller already read
/// (`dns_name`), `Ok(None)` when the cluster has none: one GET when the node is named after
/// it; otherwise `index` (one GET), and a full scan only when the index is older than
/// [`NODE_INDEX_MAX_AGE`] or names a node that is no longer the instance's.
pub async fn find_node_indexed(
    client: &kube::Client,
    instance_id: &str,
    dns_name: Option<&str>,
    index: &NodeIndex,
) -> Result<Option<Node>, NodeLookupError> {
    let nodes: Api<Node> = Api::all(client.clone());
    if let Some(name) = dns_name.filter(|n| !n.is_empty())
        && let Some(node) = nodes.get_opt(name).await?
        && is_node_of_instance(&node, instance_id)
    {
        return Ok(Some(node));
    }
    match index.lookup(instance_id) {
        Indexed::NoNode => return Ok(None),
        Indexed::Named(name) => {
            if let Some(node) = nodes.get_opt(&name).await?
                && node_provider_id_matches(&node, instance_id)
            {
                return Ok(Some(node));
            }
        }
        Indexed::Stale => {}
    }
    let (found, names) = scan_all(&nodes, instance_id).await?;
    index.remember(names);
    Ok(found)
}

/// Pages through every node: the node of `instance_id` and every node's instance.
async fn scan_all(
    nodes: &Api<Node>,
    instance_id: &str,
) -> Result<(Option<Node>, std::collections::HashMap<String, String>), kube::Error> {
    let mut pages = Pages::new(nodes.clone(), ListParams::default().limit(SCAN_PAGE_SIZE));
    let mut names = std::collections::HashMap::new();
    let mut found = None;
    while let Some(page) = pages.next().await? {
        for node in page {
            if let (Some(instance), Some(name)) = (node_instance_id(&node), &node.metadata.name) {
                names.insert(instance.to_owned(), name.clone());
            }
            if found.is_none() && node_provider_id_matches(&node, instance_id) {
                found = Some(node);
            }
        }
    }
    Ok((found, names))
}

/// Pages through all nodes for the one whose providerID names `instance_id`: the fallback
/// when the node is not named after the instance's private DNS name.
pub(crate) async fn scan_by_provider_id(
    nodes: &Api<Node>,
    instance_id: &str,
) -> Result<Option<Node>, NodeLookupError> {
    let mut pages = Pages::new(nodes.clone(), ListParams::default().limit(SCAN_PAGE_SIZE));
    while let Some(page) = pages.next().await? {
        if let Some(node) = page
            .into_iter()
            .find(|node| node_provider_id_matches(node, instance_id))
        {
            return Ok(Some(node));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};

    fn node(provider_id: Option<&str>, ready: Option<&str>) -> Node {
        Node {
            spec: Some(NodeSpec {
                provider_id: provider_id.map(str::to_owned),
                ..NodeSpec::default()
            }),
            status: ready.map(|status| NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: status.into(),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn provider_ids() {
        assert_eq!(
            instance_id_from_provider_id("aws:///eu-west-1a/i-07e9ea9eb19a67337"),
            Some("i-07e9ea9eb19a67337")
        );
        assert_eq!(instance_id_from_provider_id("gce://p/z/i-1"), None);
        assert_eq!(instance_id_from_provider_id("aws:///eu-west-1a/"), None);
        let n = node(Some("aws:///eu-west-1a/i-1"), None);
        assert!(node_provider_id_matches(&n, "i-1"));
        assert!(!node_provider_id_matches(&n, "i-2"));
        assert!(is_node_of_instance(&node(None, None), "i-2"));
        assert!(!is_node_of_instance(&n, "i-2"));
    }

    #[test]
    fn readiness() {
        assert!(is_ready(&node(None, Some("True"))));
        assert!(!is_ready(&node(None, Some("False"))));
        assert!(!is_ready(&node(None, Some("Unknown"))));
        assert!(!is_ready(&node(None, None)));
    }
}
