//! Waiting for a launching instance's Node to register and turn Ready.
//!
//! One watch on the nodes (list, then watch; resumed with backoff when the connection drops)
//! rather than a poll loop: the node shows up and changes condition whenever the kubelet
//! says so, and the function reacts at that moment. The instance's node is recognised by its
//! providerID, or by the instance's private DNS name while the providerID is not set yet.
//! The launching node is only read, never written.

use std::sync::Mutex;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::lifecycle::node::{is_node_of_instance, is_ready, node_provider_id_matches};

/// What the wait has seen of the instance's node so far (read after a timeout to report
/// whether the node registered at all).
#[derive(Debug, Default)]
pub struct NodeSighting {
    last: Mutex<Option<Node>>,
}

impl NodeSighting {
    /// The instance's node as last seen, `None` when it never registered (or was deleted).
    pub fn node(&self) -> Option<Node> {
        self.lock().clone()
    }

    pub(crate) fn record(&self, node: Option<Node>) {
        *self.lock() = node;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Node>> {
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether `node` is the node of `instance_id`, whose private DNS name is `dns_name`.
pub fn is_instance_node(node: &Node, instance_id: &str, dns_name: Option<&str>) -> bool {
    node_provider_id_matches(node, instance_id)
        || (dns_name.is_some()
            && node.metadata.name.as_deref() == dns_name
            && is_node_of_instance(node, instance_id))
}

/// Resolves with the instance's node once it is Ready; runs until then (bound it with a
/// timeout). Watch errors are logged and the watch resumes with backoff.
pub async fn wait_until_ready(
    client: &kube::Client,
    instance_id: &str,
    dns_name: Option<&str>,
    sighting: &NodeSighting,
) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut events =
        std::pin::pin!(watcher::watcher(nodes, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(node) | Event::InitApply(node)) => {
                if !is_instance_node(&node, instance_id, dns_name) {
                    continue;
                }
                let ready = is_ready(&node);
                tracing::debug!(
                    instance_id,
                    node = node.metadata.name.as_deref().unwrap_or_default(),
                    ready,
                    "saw the instance's node"
                );
                sighting.record(Some(node.clone()));
                if ready {
                    return node;
                }
            }
            Ok(Event::Delete(node)) => {
                if is_instance_node(&node, instance_id, dns_name) {
                    sighting.record(None);
                }
            }
            Ok(Event::Init | Event::InitDone) => {}
            Err(error) => tracing::warn!(
                instance_id,
                error = %error,
                "watching nodes failed; resuming with backoff"
            ),
        }
    }
    // The backoff keeps the watch alive forever; should it ever end, wait for the caller's
    // timeout rather than report a node that is not Ready.
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn node(name: &str, provider_id: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: provider_id.map(str::to_owned),
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn recognises_the_instance_node() {
        let dns = Some("ip-10-0-1-10.eu-west-1.compute.internal");
        let by_provider = node("custom-name", Some("aws:///eu-west-1a/i-1"));
        assert!(is_instance_node(&by_provider, "i-1", dns));
        let by_name_only = node("ip-10-0-1-10.eu-west-1.compute.internal", None);
        assert!(is_instance_node(&by_name_only, "i-1", dns));
        assert!(!is_instance_node(&by_name_only, "i-1", None));
        let reused_name = node(
            "ip-10-0-1-10.eu-west-1.compute.internal",
            Some("aws:///eu-west-1a/i-0"),
        );
        assert!(!is_instance_node(&reused_name, "i-1", dns));
        assert!(!is_instance_node(&node("other", None), "i-1", dns));
    }
}
