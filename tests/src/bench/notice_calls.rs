//! What one instance notice costs AWS and the API server as the cluster grows: the built
//! `terminating-hook` binary answers rebalance recommendations (the default `cordon` action:
//! proof, scope, node lookup, one conditional write) for Spot instances of the cluster's group
//! in clusters of N nodes, some of them for instances whose node is not named after their DNS
//! name or that have no node at all (the lookups that fall back to the cluster's nodes).
//!
//! Counted per event: the EC2 and Auto Scaling requests the fake AWS received, the Kubernetes
//! requests of the `terminating-hook` identity (audit log), and of those the node lists.

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use crate::aws::FakeInstance;
use crate::e2e::{FunctionWorld, GROUP, Target};

/// Notices sent per kind of instance.
const EVENTS: usize = 3;
const ZONE: &str = "eu-west-1a";

/// One cluster size's cost per event, for instances whose node is named after their DNS
/// name (EKS's convention), named otherwise, and without a node.
#[derive(Debug, Clone)]
pub struct NoticeCalls {
    pub nodes: usize,
    pub named: EventCost,
    pub renamed: EventCost,
    pub nodeless: EventCost,
}

/// Requests per event (averaged over [`EVENTS`] events).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventCost {
    pub describe_instances: f64,
    pub describe_groups: f64,
    pub kube_requests: f64,
    pub node_lists: f64,
    pub outcome: String,
}

impl EventCost {
    /// Table cells: DescribeInstances, DescribeAutoScalingGroups, Kubernetes requests, node
    /// lists, outcome.
    pub fn cells(&self) -> String {
        format!(
            "{:.2} | {:.2} | {:.2} | {:.2} | {}",
            self.describe_instances,
            self.describe_groups,
            self.kube_requests,
            self.node_lists,
            self.outcome
        )
    }
}

struct Counts {
    describe_instances: usize,
    describe_groups: usize,
    kube_requests: usize,
    node_lists: usize,
}

fn counts(w: &FunctionWorld) -> Counts {
    let function = w
        .server
        .audit()
        .filter(|e| e.user.username == "terminating-hook");
    Counts {
        describe_instances: w.aws.requests_for("DescribeInstances").len(),
        describe_groups: w.aws.requests_for("DescribeAutoScalingGroups").len(),
        kube_requests: function.len(),
        node_lists: function
            .iter()
            .filter(|e| e.verb == "list" && e.resource() == "nodes")
            .count(),
    }
}

fn filler_node(index: usize) -> Node {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("ip-10-3-{}-{}.eu-west-1.compute.internal", index / 250, index % 250),
            "labels": {"kubernetes.io/os": "linux", "topology.kubernetes.io/zone": ZONE},
        },
        "spec": {"providerID": format!("aws:///{ZONE}/i-0f{index:015x}")},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .expect("a valid node")
}

/// A Spot instance of the cluster's group, with a node under `node_name` (none: no node).
fn add_instance(w: &FunctionWorld, instance_id: &str, node_name: Option<&str>) {
    w.aws.ec2().add_instance(
        FakeInstance::new(instance_id, "eu-west-1")
            .availability_zone(ZONE)
            .spot(),
    );
    w.aws
        .autoscaling()
        .add_instance(GROUP, instance_id, ZONE)
        .expect("instance added");
    if let Some(name) = node_name {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"providerID": format!("aws:///{ZONE}/{instance_id}")},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("a valid node");
        w.server.store().create(&node).expect("node created");
    }
}

/// Sends a rebalance recommendation for each instance; the cost per event.
async fn cost_of(w: &FunctionWorld, instances: &[String]) -> Result<EventCost, String> {
    let lambda = w.function(Target::TerminatingHook);
    let before = counts(w);
    let mut outcomes = Vec::new();
    for instance in instances {
        let event = w
            .aws
            .interruptions()
            .rebalance_recommendation(instance)
            .map_err(|e| e.to_string())?;
        let answer = lambda.response_to(&event).await;
        let outcome = answer["instances"][0]["outcome"]
            .as_str()
            .ok_or_else(|| format!("no outcome for {instance}: {answer}"))?
            .to_owned();
        outcomes.push(outcome);
    }
    let after = counts(w);
    outcomes.dedup();
    let per = |a: usize, b: usize| (a - b) as f64 / instances.len() as f64;
    Ok(EventCost {
        describe_instances: per(after.describe_instances, before.describe_instances),
        describe_groups: per(after.describe_groups, before.describe_groups),
        kube_requests: per(after.kube_requests, before.kube_requests),
        node_lists: per(after.node_lists, before.node_lists),
        outcome: outcomes.join("/"),
    })
}

/// The cost per notice in a cluster of `nodes` nodes.
pub async fn notice_calls(nodes: usize) -> Result<NoticeCalls, String> {
    let w = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .env("DRAIN_LEASE_SECONDS", "2")
        .start()
        .await;
    let store = w.server.store();
    for index in 0..nodes {
        store
            .create(&filler_node(index))
            .map_err(|e| e.to_string())?;
    }
    let ids = |kind: u8| -> Vec<String> {
        (0..EVENTS)
            .map(|i| format!("i-0{kind:x}{i:015x}"))
            .collect()
    };
    let (named, renamed, nodeless) = (ids(0xa), ids(0xb), ids(0xc));
    for id in &named {
        let dns = FakeInstance::new(id, "eu-west-1").private_dns_name;
        add_instance(&w, id, Some(&dns));
    }
    for (i, id) in renamed.iter().enumerate() {
        add_instance(&w, id, Some(&format!("worker-custom-{i}")));
    }
    for id in &nodeless {
        add_instance(&w, id, None);
    }
    Ok(NoticeCalls {
        nodes,
        named: cost_of(&w, &named).await?,
        renamed: cost_of(&w, &renamed).await?,
        nodeless: cost_of(&w, &nodeless).await?,
    })
}
