//! The sandbox's main job on the real control plane (`sandbox --real-control-plane`): a node
//! of a group with a terminating hook is scaled in while a Deployment with a PDB runs on it;
//! the terminating hook drains it through the real eviction API, the real ReplicaSet
//! controller recreates the evicted pods and kube-scheduler puts them on the other node.
//! Prints what happened and whether each expectation held.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::world::RealFunctionWorld;
use super::{ControlPlaneError, KUBERNETES_VERSION};
use crate::e2e::{GROUP, Target};
use crate::fixtures::{self, Workload};

const OTHER_NODE: &str = "ip-10-0-9-9.eu-west-1.compute.internal";
const REPLICAS: usize = 4;

/// Plays the drain; `Ok(true)` when every expectation held.
pub async fn play(bin: &Path) -> Result<bool, ControlPlaneError> {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "0.5")
        .start(bin)
        .await?;
    println!(
        "real control plane {KUBERNETES_VERSION} ready in {:.1} s ({})",
        w.plane.ready_after().as_secs_f64(),
        w.plane.url()
    );
    let admin = w.plane.admin_client().await?;
    w.kubelets
        .register_node(
            OTHER_NODE,
            "aws:///eu-west-1a/i-0fffeeeedddd11112",
            "eu-west-1a",
            true,
        )
        .await?;
    seed(&admin).await?;
    wait(&admin, &w.node, "4 replicas Ready on the drained node").await?;
    uncordon(&admin, OTHER_NODE).await?;
    println!("scale-in of {} (node {})", w.instance, w.node);
    let mut topic = w
        .aws
        .sns()
        .subscribe(&w.topic)
        .map_err(|e| setup("SNS", e))?;
    w.aws
        .autoscaling()
        .terminate_instance(GROUP, &w.instance)
        .map_err(|e| setup("scale-in", e))?;
    let event = topic
        .next_event(Duration::from_secs(5))
        .await
        .ok_or_else(|| setup("the lifecycle notification", "none within 5 s"))?;
    let started = Instant::now();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&event)
        .await;
    println!(
        "terminating-hook answered in {:.2} s: {}",
        started.elapsed().as_secs_f64(),
        answer["records"][0]["outcome"]
    );
    let replaced = wait(&admin, OTHER_NODE, "the replicas Ready on the other node").await;
    let audit = w.plane.audit();
    let hook = RealFunctionWorld::username(Target::TerminatingHook);
    let evictions = audit
        .iter()
        .filter(|e| e.user.username == hook && e.subresource() == "eviction")
        .collect::<Vec<_>>();
    let checks = [
        (
            "the lifecycle action completed once with CONTINUE",
            w.aws.autoscaling().completions().len() == 1,
        ),
        (
            "every pod evicted once (429s from the budget retried)",
            evictions.iter().filter(|e| e.code() == 201).count() == REPLICAS,
        ),
        (
            "the ReplicaSet and kube-scheduler moved every replica",
            replaced.is_ok(),
        ),
    ];
    for (what, held) in &checks {
        println!("{} {what}", if *held { "✓" } else { "✗" });
    }
    Ok(checks.iter().all(|(_, held)| *held))
}

async fn seed(admin: &kube::Client) -> Result<(), ControlPlaneError> {
    let web = Workload::new("default", "web")
        .replicas(REPLICAS as i32)
        .grace_period_seconds(Some(5));
    Api::<Deployment>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &web.deployment())
        .await
        .map_err(|e| setup("the Deployment", e))?;
    let budget = fixtures::pdb_max_unavailable("default", "web", json!(1), &[("app", "web")]);
    Api::<PodDisruptionBudget>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &budget)
        .await
        .map_err(|e| setup("the PDB", e))?;
    Ok(())
}

/// Waits (20 s at most) until the replicas are Ready on `node` and the budget allows one.
async fn wait(admin: &kube::Client, node: &str, what: &str) -> Result<(), ControlPlaneError> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let ready = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter(|p| fixtures::pod_is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .count();
        let allows = budgets
            .get("web")
            .await
            .ok()
            .and_then(|b| b.status)
            .is_some_and(|s| s.disruptions_allowed == 1);
        if ready == REPLICAS && allows {
            println!("{what}");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(setup(what, "not within 20 s"))
}

async fn uncordon(admin: &kube::Client, node: &str) -> Result<(), ControlPlaneError> {
    Api::<Node>::all(admin.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": false}})),
        )
        .await
        .map_err(|e| setup("uncordoning", e))?;
    Ok(())
}

fn setup(what: &str, error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::Setup {
        what: what.to_owned(),
        detail: error.to_string(),
    }
}
