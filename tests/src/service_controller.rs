//! The Kubernetes service controller's part in load balancing, between the fake API server
//! (or a real one) and the fake Elastic Load Balancing: the instance of every Ready node is registered with
//! the cluster's load balancers, and deregistered once its node is labelled
//! `node.kubernetes.io/exclude-from-external-load-balancers` or is gone, as the service
//! controller (and the AWS Load Balancer Controller, for instance targets) does.
//!
//! It looks at the nodes every [`SYNC_INTERVAL`], where the real controllers react to node
//! changes within seconds: close enough for a drain that waits for the load balancers' own
//! deregistration delay.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use node_manager::lifecycle::node::{is_ready, node_instance_id};
use node_manager::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;

use crate::aws::{FakeElb, FakeLoadBalancer};
use crate::kube::Store;

/// How often the nodes are looked at.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(50);

/// Keeps `load_balancers`' registrations in line with the nodes of `store` until dropped.
pub struct ServiceController {
    task: tokio::task::JoinHandle<()>,
    load_balancers: Vec<FakeLoadBalancer>,
}

impl Drop for ServiceController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where the controller reads the nodes: the fake API server's store, or a real API server.
#[derive(Clone)]
pub enum NodeSource {
    Fake(Store),
    Cluster(kube::Client),
}

impl NodeSource {
    /// The nodes now; `None` when a real API server did not answer (the pass is skipped).
    async fn nodes(&self) -> Option<Vec<Node>> {
        match self {
            Self::Fake(store) => Some(store.list::<Node>()),
            Self::Cluster(client) => kube::Api::<Node>::all(client.clone())
                .list(&Default::default())
                .await
                .ok()
                .map(|list| list.items),
        }
    }
}

impl ServiceController {
    pub fn start(store: Store, elb: FakeElb, load_balancers: Vec<FakeLoadBalancer>) -> Self {
        Self::start_on(NodeSource::Fake(store), elb, load_balancers)
    }

    /// The same, reading the nodes from `source`.
    pub fn start_on(
        source: NodeSource,
        elb: FakeElb,
        load_balancers: Vec<FakeLoadBalancer>,
    ) -> Self {
        let served = load_balancers.clone();
        let task = tokio::spawn(async move {
            let mut registered = BTreeSet::new();
            loop {
                if let Some(nodes) = source.nodes().await {
                    sync(&nodes, &elb, &served, &mut registered);
                }
                tokio::time::sleep(SYNC_INTERVAL).await;
            }
        });
        Self {
            task,
            load_balancers,
        }
    }

    /// The load balancers it registers nodes with.
    pub fn load_balancers(&self) -> &[FakeLoadBalancer] {
        &self.load_balancers
    }
}

/// One pass: registers the instances of nodes that should take traffic and were not
/// registered yet, deregisters those that no longer should.
fn sync(
    nodes: &[Node],
    elb: &FakeElb,
    load_balancers: &[FakeLoadBalancer],
    registered: &mut BTreeSet<String>,
) {
    let serving: BTreeSet<String> = nodes
        .iter()
        .filter(|node| takes_traffic(node))
        .filter_map(|node| node_instance_id(node).map(str::to_owned))
        .collect();
    for instance in serving.difference(registered) {
        for lb in load_balancers {
            elb.register(lb, instance);
        }
    }
    for instance in registered.difference(&serving) {
        for lb in load_balancers {
            elb.deregister(lb, instance);
        }
    }
    *registered = serving;
}

/// Ready and not excluded from load balancers.
fn takes_traffic(node: &Node) -> bool {
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(EXCLUDE_FROM_LOAD_BALANCERS_LABEL));
    is_ready(node) && !excluded
}
