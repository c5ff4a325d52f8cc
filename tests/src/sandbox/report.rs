//! The sandbox's printed final state: `aws-auth` and the access entries, then the nodes and
//! the pods like `kubectl get ... -o wide`.

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use node_manager::lifecycle::node::is_ready;

use super::world::{EXCLUDE_FROM_LB, Sandbox};
use crate::fixtures;

impl Sandbox {
    /// Prints the final `aws-auth`, nodes and pods, like `kubectl get ... -o wide`.
    pub fn print_final_state(&self) {
        self.print_access();
        print_nodes(&self.server.store().list::<Node>());
        let mut pods = self.server.store().list::<Pod>();
        pods.sort_by_key(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()));
        print_pods(&pods);
    }

    /// `aws-auth`'s `mapRoles`, and the access entries when the cluster uses them.
    fn print_access(&self) {
        println!("\n--- kube-system/aws-auth (mapRoles) ---");
        match self
            .server
            .store()
            .find::<ConfigMap>("kube-system", "aws-auth")
        {
            Some(cm) => println!(
                "{}",
                cm.data
                    .as_ref()
                    .and_then(|d| d.get("mapRoles"))
                    .map(String::as_str)
                    .unwrap_or("(no mapRoles)")
            ),
            None => println!("(no aws-auth ConfigMap)"),
        }
        if self.uses_access_entries() {
            println!("--- access entries ---");
            for entry in self.aws.eks().access_entries(&self.scenario.cluster) {
                println!("{entry:?}");
            }
        }
    }
}

fn print_nodes(nodes: &[Node]) {
    println!("\n--- nodes ---");
    println!("{:<45} {:<28} LABELS", "NAME", "STATUS");
    for node in nodes {
        let mut status = if is_ready(node) { "Ready" } else { "NotReady" }.to_owned();
        if node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
        {
            status.push_str(",SchedulingDisabled");
        }
        let excluded = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(EXCLUDE_FROM_LB))
            .map(|v| format!("{EXCLUDE_FROM_LB}={v}"))
            .unwrap_or_default();
        println!(
            "{:<45} {:<28} {excluded}",
            node.metadata.name.as_deref().unwrap_or_default(),
            status
        );
    }
}

fn print_pods(pods: &[Pod]) {
    println!("\n--- pods ---");
    println!(
        "{:<12} {:<34} {:<6} {:<12} NODE",
        "NAMESPACE", "NAME", "READY", "STATUS"
    );
    for pod in pods {
        let status = if pod.metadata.deletion_timestamp.is_some() {
            "Terminating".to_owned()
        } else {
            pod.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default()
        };
        println!(
            "{:<12} {:<34} {:<6} {:<12} {}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
            if fixtures::pod_is_ready(pod) {
                "1/1"
            } else {
                "0/1"
            },
            status,
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or_default()
        );
    }
}
