//! Fidelity check: an independent client, the real kubectl, against the fake API server.
//!
//! `kubectl drain` of a node whose pods are protected by a PDB must behave as on a real
//! cluster: evictions refused with 429 are retried until the replacements are Ready
//! elsewhere, DaemonSet pods stay. Requires `kubectl` on PATH (CI installs it); set
//! `SKIP_KUBECTL_TESTS=1` to skip where it cannot be installed.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use node_manager_testkit::fixtures;
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};

const WEB: &[(&str, &str)] = &[("app", "web")];
const AGENT: &[(&str, &str)] = &[("app", "agent")];

/// `None` when kubectl is absent and skipping was asked for; panics when it is absent
/// otherwise, so CI cannot pass by accident.
fn kubectl() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("kubectl"))
            .find(|candidate| candidate.is_file())
    });
    match found {
        Some(path) => Some(path),
        None if std::env::var("SKIP_KUBECTL_TESTS").as_deref() == Ok("1") => {
            eprintln!("kubectl not on PATH: skipped (SKIP_KUBECTL_TESTS=1)");
            None
        }
        None => panic!(
            "kubectl is not on PATH: install it (apt-get install -y kubernetes-client) or set SKIP_KUBECTL_TESTS=1"
        ),
    }
}

async fn run(kubectl: &PathBuf, kubeconfig: &PathBuf, args: &[&str]) -> (bool, String) {
    let output = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test]
async fn kubectl_gets_cordons_and_drains_a_pdb_protected_node() {
    let Some(kubectl) = kubectl() else {
        return;
    };
    let server = FakeApiServer::builder()
        .simulation(SimulationTimings {
            pod_start_delay: Duration::from_millis(300),
            ..SimulationTimings::default()
        })
        .start()
        .await
        .unwrap();
    let store = server.store();
    store.create(&fixtures::ready_node("n1")).unwrap();
    store.create(&fixtures::ready_node("n2")).unwrap();
    store
        .create(&fixtures::daemon_set("kube-system", "agent", AGENT))
        .unwrap();
    let rs: ReplicaSet = store
        .create(&fixtures::replica_set("default", "web", 2, WEB))
        .unwrap();
    store
        .create(&fixtures::owned_by(
            fixtures::running_pod("default", "web-a", "n1", WEB),
            &rs,
        ))
        .unwrap();
    store
        .create(&fixtures::owned_by(
            fixtures::with_empty_dir(fixtures::running_pod("default", "web-b", "n1", WEB)),
            &rs,
        ))
        .unwrap();
    store
        .create(&fixtures::pdb_min_available("default", "web", 1, WEB))
        .unwrap();
    server
        .wait_for(
            "DaemonSet pods Running and the PDB synced",
            Duration::from_secs(3),
            |s| {
                let agents = s
                    .list::<Pod>()
                    .into_iter()
                    .filter(|p| {
                        p.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with("agent-"))
                    })
                    .filter(|p| {
                        p.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Running")
                    })
                    .count();
                let allowed = s
                    .get::<PodDisruptionBudget>("default", "web")
                    .ok()
                    .and_then(|p| p.status)
                    .is_some_and(|st| st.disruptions_allowed == 1);
                agents == 2 && allowed
            },
        )
        .await
        .unwrap();

    let kubeconfig =
        std::env::temp_dir().join(format!("fake-kube-{}.kubeconfig", server.address().port()));
    server.write_kubeconfig(&kubeconfig).unwrap();

    let (ok, out) = run(&kubectl, &kubeconfig, &["get", "nodes"]).await;
    assert!(ok, "kubectl get nodes failed: {out}");
    assert!(
        out.contains("n1") && out.contains("n2") && out.contains("Ready"),
        "{out}"
    );

    let (ok, out) = run(&kubectl, &kubeconfig, &["cordon", "n1"]).await;
    assert!(ok, "kubectl cordon failed: {out}");
    let node: Node = store.get("", "n1").unwrap();
    assert_eq!(node.spec.unwrap().unschedulable, Some(true));

    let (ok, out) = run(
        &kubectl,
        &kubeconfig,
        &[
            "drain",
            "n1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=60s",
        ],
    )
    .await;
    assert!(ok, "kubectl drain failed: {out}");
    let _ = std::fs::remove_file(&kubeconfig);

    let left_on_n1: Vec<String> = store
        .list::<Pod>()
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n1"))
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert_eq!(
        left_on_n1.len(),
        1,
        "only the DaemonSet pod stays: {left_on_n1:?}"
    );
    assert!(left_on_n1[0].starts_with("agent-"));
    assert!(store.list::<DaemonSet>().len() == 1);
    let web_on_n2 = store
        .list_in::<Pod>("default")
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n2"))
        .count();
    assert_eq!(web_on_n2, 2, "both web pods were replaced on n2");
    let evictions = server.audit().subresource_requests("pods", "eviction");
    assert!(
        evictions.iter().any(|e| e.code() == 429),
        "the PDB must have refused one eviction: {:#?}",
        server.audit().lines()
    );
    assert_eq!(evictions.iter().filter(|e| e.code() == 201).count(), 2);
    assert!(
        evictions
            .iter()
            .all(|e| e.user_agent.starts_with("kubectl"))
    );
}
