//! Waiting for a launching instance's Node to register and turn Ready.
//!
//! A watch (list, then watch; resumed with backoff when the connection drops) rather than a
//! poll loop: the node shows up and changes condition whenever the kubelet says so, and the
//! function reacts at that moment. The watch selects the one node by name
//! (`fieldSelector=metadata.name=<name>`): on EKS a node is named after its instance's
//! private DNS name, which EC2 gives, so a launch never lists or watches the whole cluster.
//! Where nodes are named otherwise, a paged scan by providerID, first after a quarter of the
//! launch timeout (at most [`NAME_FALLBACK_FIRST`]) and then at doubling intervals while no
//! node has shown up under the name, finds the node's real name and the watch moves to it.
//! Only when EC2 cannot give the DNS name does the wait watch every node. The instance's
//! node is recognised by its providerID, or by the DNS name while the providerID is not set
//! yet. The launching node is only read, never written.

use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::lifecycle::node::{
    is_node_of_instance, is_ready, node_provider_id_matches, scan_by_provider_id,
};

/// The longest wait before the first scan by providerID for a node not seen under the
/// instance's DNS name (most nodes register under it well within this).
pub(crate) const NAME_FALLBACK_FIRST: Duration = Duration::from_secs(30);
/// The longest interval between later scans.
const NAME_FALLBACK_MAX_INTERVAL: Duration = Duration::from_secs(240);

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
pub(crate) fn is_instance_node(node: &Node, instance_id: &str, dns_name: Option<&str>) -> bool {
    node_provider_id_matches(node, instance_id)
        || (dns_name.is_some()
            && node.metadata.name.as_deref() == dns_name
            && is_node_of_instance(node, instance_id))
}

/// Resolves with the instance's node once it is Ready; runs until then (bound it with a
/// timeout). `dns_name` is the name the node is expected under; `launch_timeout` paces the
/// fallback scan by providerID. Watch errors are logged and the watch resumes with backoff.
pub(crate) async fn wait_until_ready(
    client: &kube::Client,
    instance_id: &str,
    dns_name: Option<&str>,
    launch_timeout: Duration,
    sighting: &NodeSighting,
) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(dns_name) = dns_name else {
        tracing::info!(
            instance_id,
            "the instance's private DNS name is unknown: watching every node for its providerID"
        );
        return watch_until_ready(
            &nodes,
            watcher::Config::default(),
            instance_id,
            None,
            sighting,
        )
        .await;
    };
    let mut name = dns_name.to_owned();
    let first_scan = (launch_timeout / 4).min(NAME_FALLBACK_FIRST);
    loop {
        let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let watch = watch_until_ready(&nodes, by_name, instance_id, Some(dns_name), sighting);
        let elsewhere = named_elsewhere(&nodes, instance_id, &name, first_scan, sighting);
        let other = tokio::select! {
            node = watch => return node,
            other = elsewhere => other,
        };
        tracing::info!(
            instance_id,
            expected = %name,
            node = %other,
            "the instance's node is not named after its private DNS name; watching it under its own name"
        );
        name = other;
    }
}

/// Resolves with the name of the instance's node when a scan by providerID finds it under
/// another name than `name`; scans only while the wait has seen no node under `name`.
async fn named_elsewhere(
    nodes: &Api<Node>,
    instance_id: &str,
    name: &str,
    first_scan: Duration,
    sighting: &NodeSighting,
) -> String {
    let mut interval = first_scan.max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(NAME_FALLBACK_MAX_INTERVAL);
        if sighting.node().is_some() {
            continue;
        }
        match scan_by_provider_id(nodes, instance_id).await {
            Ok(Some(node)) => {
                if let Some(found) = node.metadata.name
                    && found != name
                {
                    return found;
                }
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(
                instance_id,
                error = %error,
                "scanning the nodes by providerID failed; trying again later"
            ),
        }
    }
}

/// The watch of the nodes `config` selects until the instance's node is Ready.
async fn watch_until_ready(
    nodes: &Api<Node>,
    config: watcher::Config,
    instance_id: &str,
    dns_name: Option<&str>,
    sighting: &NodeSighting,
) -> Node {
    let mut events = std::pin::pin!(watcher::watcher(nodes.clone(), config).default_backoff());
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
