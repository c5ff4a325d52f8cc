//! `--load-balancers-of`: the cluster's load balancers that route to the node's instance, found
//! and asked the way the drain does (the same SDK adapter and cluster tags).

use k8s_openapi::api::core::v1::Node;
use node_manager::aws::http_client::load_sdk_config;
use node_manager::aws::load_balancing::SdkLoadBalancers;
use node_manager::aws::{InstanceRouting, LoadBalancers};
use node_manager::lifecycle::node::node_instance_id;
use serde::Serialize;

use crate::PlanError;

/// A load balancer routing to the instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingLoadBalancer {
    /// `target group targetgroup/<name>/<id>` or `classic load balancer <name>`.
    pub name: String,
    /// `registered` (not deregistered yet) or `draining` (its connections draining).
    pub state: &'static str,
    /// Its deregistration delay (connection draining timeout).
    pub deregistration_delay_seconds: u64,
}

/// The load balancers of `cluster` routing to `node`'s instance now.
pub async fn routing_to(node: &Node, cluster: &str) -> Result<Vec<RoutingLoadBalancer>, PlanError> {
    let instance = node_instance_id(node).ok_or_else(|| {
        PlanError::LoadBalancers("the node's providerID names no EC2 instance".to_owned())
    })?;
    let client = SdkLoadBalancers::new(&load_sdk_config().await);
    let failed = |e: node_manager::aws::AwsError| PlanError::LoadBalancers(e.to_string());
    let mut routing = Vec::new();
    for lb in client
        .cluster_load_balancers(cluster)
        .await
        .map_err(failed)?
    {
        let state = match client.routing(&lb, instance).await.map_err(failed)? {
            InstanceRouting::NotRouted => continue,
            InstanceRouting::Registered => "registered",
            InstanceRouting::Draining => "draining",
        };
        let delay = client.deregistration_delay(&lb).await.map_err(failed)?;
        routing.push(RoutingLoadBalancer {
            name: lb.to_string(),
            state,
            deregistration_delay_seconds: delay.as_secs(),
        });
    }
    Ok(routing)
}
