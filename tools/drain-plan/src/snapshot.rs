//! What the plan is made from: the node, its pods, the budgets of their namespaces and the
//! volumes attached to the node, read with get and list only.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::ListParams;
use node_manager::drain::budgets;
use node_manager::drain::volumes::pod_claims;
use node_manager::lifecycle::node::node_instance_id;

/// Which node to plan: by name, or by the EC2 instance it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Node(String),
    /// `i-...`: the node whose providerID names it (or a node of that name).
    Instance(String),
}

impl Target {
    /// A node name (a DNS subdomain: lower-case letters, digits, `-` and `.`) or an instance
    /// id; anything else is refused before any call.
    pub fn parse(text: &str) -> Result<Self, SnapshotError> {
        let text = text.trim();
        let valid = !text.is_empty()
            && text.len() <= 253
            && text
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && !text.starts_with(['-', '.'])
            && !text.ends_with(['-', '.']);
        if !valid {
            return Err(SnapshotError::BadTarget(text.to_owned()));
        }
        let is_instance = text
            .strip_prefix("i-")
            .is_some_and(|hex| !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()));
        Ok(if is_instance {
            Self::Instance(text.to_owned())
        } else {
            Self::Node(text.to_owned())
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "{0:?} is neither a node name nor an EC2 instance id (i-...): lower-case letters, digits, '-' and '.' only"
    )]
    BadTarget(String),
    #[error("no node {0}")]
    NoNode(String),
    #[error("no node runs on instance {0} (no node's spec.providerID names it)")]
    NoNodeOfInstance(String),
    #[error("cannot {what}: {source}")]
    Kubernetes {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

fn failed(what: &'static str) -> impl FnOnce(kube::Error) -> SnapshotError {
    move |source| SnapshotError::Kubernetes { what, source }
}

/// The node, its pods and the budgets of their namespaces, as listed now.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub node: Node,
    pub pods: Vec<Pod>,
    pub budgets: Vec<PodDisruptionBudget>,
    /// The volumes attached to the node; `None` when the attachments cannot be listed (no
    /// grant, or the API not served).
    pub volumes: Option<NodeVolumes>,
    /// The cluster's load balancers routing to the node's instance, when asked
    /// (`--load-balancers-of`).
    pub load_balancers: Option<Vec<crate::load_balancers::RoutingLoadBalancer>>,
}

/// The node's `VolumeAttachment`s and the volumes its pods' claims are bound to.
#[derive(Debug, Clone, Default)]
pub struct NodeVolumes {
    pub attachments: Vec<VolumeAttachment>,
    /// (namespace, claim) → the persistent volume it is bound to (read only when the node has
    /// attachments).
    pub claims: BTreeMap<(String, String), String>,
}

impl Snapshot {
    pub async fn gather(client: &kube::Client, target: &Target) -> Result<Self, SnapshotError> {
        let node = find_node(client, target).await?;
        let name = node.metadata.name.clone().unwrap_or_default();
        // The drain's own view: every pod bound to the node, all namespaces.
        let pods: Api<Pod> = Api::all(client.clone());
        let pods = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
            .await
            .map_err(failed("list the node's pods"))?
            .items;
        let namespaces: BTreeSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.namespace.as_deref())
            .collect();
        let mut all_budgets = Vec::new();
        for namespace in namespaces {
            all_budgets.extend(
                budgets::list(client, namespace)
                    .await
                    .map_err(failed("list PodDisruptionBudgets"))?,
            );
        }
        let volumes = node_volumes(client, &name, &pods).await?;
        Ok(Self {
            node,
            pods,
            budgets: all_budgets,
            volumes,
            load_balancers: None,
        })
    }
}

/// The attachments naming `node` and the volumes of its pods' claims; `None` without the
/// grant to list attachments.
async fn node_volumes(
    client: &kube::Client,
    node: &str,
    pods: &[Pod],
) -> Result<Option<NodeVolumes>, SnapshotError> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let attachments: Vec<VolumeAttachment> = match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter(|a| a.spec.node_name == node)
            .collect(),
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 404 => {
            return Ok(None);
        }
        Err(error) => return Err(failed("list VolumeAttachments")(error)),
    };
    let mut claims = BTreeMap::new();
    if !attachments.is_empty() {
        for (namespace, claim) in pod_claims(pods) {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
            let bound = api
                .get_opt(&claim)
                .await
                .map_err(failed("get PersistentVolumeClaims"))?
                .and_then(|c| c.spec?.volume_name);
            if let Some(volume) = bound {
                claims.insert((namespace, claim), volume);
            }
        }
    }
    Ok(Some(NodeVolumes {
        attachments,
        claims,
    }))
}

async fn find_node(client: &kube::Client, target: &Target) -> Result<Node, SnapshotError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let (Target::Node(name) | Target::Instance(name)) = target;
    if let Some(node) = nodes.get_opt(name).await.map_err(failed("get the node"))? {
        return Ok(node);
    }
    match target {
        Target::Node(name) => Err(SnapshotError::NoNode(name.clone())),
        Target::Instance(id) => nodes
            .list(&ListParams::default())
            .await
            .map_err(failed("list nodes"))?
            .items
            .into_iter()
            .find(|n| node_instance_id(n) == Some(id.as_str()))
            .ok_or_else(|| SnapshotError::NoNodeOfInstance(id.clone())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn node_names_and_instance_ids_are_told_apart_and_bad_input_is_refused() {
        assert_eq!(
            Target::parse("ip-10-0-1-23.eu-west-1.compute.internal").unwrap(),
            Target::Node("ip-10-0-1-23.eu-west-1.compute.internal".into())
        );
        assert_eq!(
            Target::parse(" i-0abc123 ").unwrap(),
            Target::Instance("i-0abc123".into())
        );
        // A resource-name node (i-....region.compute.internal) is a node name.
        assert_eq!(
            Target::parse("i-0abc123.eu-west-1.compute.internal").unwrap(),
            Target::Node("i-0abc123.eu-west-1.compute.internal".into())
        );
        for bad in [
            "",
            "Node1",
            "a/b",
            "n,spec.x=y",
            "-n",
            "n.",
            &"a".repeat(254),
        ] {
            let error = Target::parse(bad).unwrap_err().to_string();
            assert!(error.contains("neither a node name"), "{bad}: {error}");
        }
    }
}
