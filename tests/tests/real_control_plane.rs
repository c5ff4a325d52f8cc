//! The end-to-end scenarios on a real Kubernetes control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler; built by `scripts/control-plane.sh build`): the
//! built function binaries authenticate with EKS tokens through the TokenReview webhook, run
//! under the shipped `infra/rbac.yaml` and the real authorizer, and meet the real eviction API,
//! disruption controller, ReplicaSet controller and scheduler. kwok plays the kubelets.
//!
//! Each scenario lives in the test kit (`control_plane::scenarios`), where `sandbox
//! --real-control-plane` plays it too; its test here plays it and fails unless every
//! expectation held, naming those that did not.
//!
//! Without the binaries these tests fail saying how to build them, unless
//! `SKIP_REAL_CONTROL_PLANE_TESTS=1` (then they print a line and pass).
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use node_manager_testkit::control_plane::kwok::KWOK_VERSION;
use node_manager_testkit::control_plane::scenarios::identity::{eks_token, status_code, whoami};
use node_manager_testkit::control_plane::scenarios::nginx::{OTHER_NODE, REPLICAS};
use node_manager_testkit::control_plane::scenarios::{RealScenario, play_as_test};
use node_manager_testkit::control_plane::world::RealFunctionWorld;
use node_manager_testkit::control_plane::{KUBERNETES_VERSION, binaries_or_skip, provenance_of};
use node_manager_testkit::e2e::{CLUSTER, GROUP, Target};
use node_manager_testkit::fixtures::{self, Workload};
use node_manager_testkit::soak::corpus::repository_root;
use serde_json::json;

#[test]
fn the_test_kit_and_the_build_script_pin_the_same_kubernetes_version() {
    let script =
        std::fs::read_to_string(repository_root().join("scripts/control-plane.sh")).unwrap();
    assert!(
        script
            .lines()
            .any(|l| l == format!("KUBERNETES_VERSION={KUBERNETES_VERSION}")),
        "scripts/control-plane.sh must build {KUBERNETES_VERSION}"
    );
    let module =
        std::fs::read_to_string(repository_root().join("tests/control-plane/go.mod")).unwrap();
    assert!(module.contains(&format!("k8s.io/kubernetes {KUBERNETES_VERSION}")));
    assert!(
        script
            .lines()
            .any(|l| l == format!("KWOK_VERSION={KWOK_VERSION}")),
        "scripts/control-plane.sh must build kwok {KWOK_VERSION}"
    );
}

/// The provenance check refuses a binary that is not the pinned one (planted: a folder of
/// stand-ins, one reporting another Kubernetes release), and names it; it needs no plane.
#[test]
fn a_control_plane_binary_of_another_release_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("onm-provenance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let etcd = std::fs::read_to_string(repository_root().join("tests/control-plane/go.mod"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("go.etcd.io/etcd/server/v3 v")
                .map(|v| v.split_whitespace().next().unwrap_or_default().to_owned())
        })
        .unwrap();
    let write = |name: &str, says: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\necho '{says}'\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write("etcd", &format!("etcd Version: {etcd}"));
    write(
        "kube-apiserver",
        &format!("Kubernetes {KUBERNETES_VERSION}"),
    );
    write(
        "kube-controller-manager",
        &format!("Kubernetes {KUBERNETES_VERSION}"),
    );
    write("kube-scheduler", "Kubernetes v1.35.0");
    write("kubectl", &format!("Client Version: {KUBERNETES_VERSION}"));
    let refused = provenance_of(&dir).unwrap_err();
    assert!(refused.contains("kube-scheduler reports"), "{refused}");
    write(
        "kube-scheduler",
        &format!("Kubernetes {KUBERNETES_VERSION}"),
    );
    write("kubectl", "Client Version: v1.32.4");
    let refused = provenance_of(&dir).unwrap_err();
    assert!(refused.contains("kubectl reports"), "{refused}");
    write("kubectl", &format!("Client Version: {KUBERNETES_VERSION}"));
    write("kwok", "kwok version v0.7.0 go1.26.8 (linux/amd64)");
    let refused = provenance_of(&dir).unwrap_err();
    assert!(refused.contains("kwok reports"), "{refused}");
    write(
        "kwok",
        &format!("kwok version {KWOK_VERSION} go1.26.8 (linux/amd64)"),
    );
    assert_eq!(provenance_of(&dir), Ok(()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The drain (`control_plane::scenarios::drain`): label and cordon before the evictions,
/// evictions only, each pod once, the budget held, the pods moved by the real controllers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_hook_drains_a_node_of_a_real_cluster() {
    play_as_test(
        "terminating_hook_drains_a_node_of_a_real_cluster",
        RealScenario::Drain,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eks_tokens_authenticate_through_aws_auth_and_the_shipped_rbac_is_enforced() {
    let Some(bin) = binaries_or_skip(
        "eks_tokens_authenticate_through_aws_auth_and_the_shipped_rbac_is_enforced",
    ) else {
        return;
    };
    let w = RealFunctionWorld::builder()
        .functions(&[])
        .start(&bin)
        .await
        .unwrap();
    let admin = w.plane.admin_client().await.unwrap();
    let role = w.aws.account().add_role_credentials("drain-operator");
    let token = eks_token(&role, CLUSTER).unwrap();
    let client = w.plane.client_with_token(token.expose()).await.unwrap();

    // A valid token of an unmapped role: 401 from the real API server.
    let refused = whoami(&client).await.unwrap_err();
    assert_eq!(status_code(&refused), Some(401), "{refused}");

    // Mapped through aws-auth (as the operator's guide does for the function's role).
    let mapping = format!(
        "- rolearn: {}\n  username: terminating-hook\n  groups: [\"open-node-manager:terminating-hook\"]\n",
        role.principal_arn
    );
    Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
        .patch(
            "aws-auth",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"mapRoles": mapping}})),
        )
        .await
        .unwrap();
    let (username, groups) = whoami(&client).await.unwrap();
    assert_eq!(username, "terminating-hook");
    assert!(
        groups.contains(&"open-node-manager:terminating-hook".to_owned())
            && groups.contains(&"system:authenticated".to_owned()),
        "{groups:?}"
    );

    // infra/rbac.yaml as shipped, under the real authorizer: nodes may be listed, secrets not.
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let forbidden = Api::<Secret>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(status_code(&forbidden), Some(403), "{forbidden}");

    // A token for another cluster is refused by the webhook.
    let other = eks_token(&role, "another-cluster").unwrap();
    let stranger = w.plane.client_with_token(other.expose()).await.unwrap();
    assert_eq!(
        status_code(&whoami(&stranger).await.unwrap_err()),
        Some(401)
    );
}

/// Node group auth (`control_plane::scenarios::nodegroup_auth`): the node's token refused
/// before the mapping, `system:node:<name>` in the node groups after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodegroup_auth_maps_the_node_role_so_nodes_authenticate_on_a_real_cluster() {
    play_as_test(
        "nodegroup_auth_maps_the_node_role_so_nodes_authenticate_on_a_real_cluster",
        RealScenario::NodegroupAuth,
    )
    .await;
}

/// The drain above on the test kit's fake API server, for the figures side by side (the fake's
/// timing is its own: its kubelet and controllers emulation replaces pods on a fixed delay).
/// Needs no control plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_drain_on_the_fake_api_server_for_comparison() {
    use node_manager_testkit::e2e::FunctionWorld;
    let w = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance("i-0b1c2d3e4f5061728")
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "0.5")
        .env("DRAIN_TIMEOUT_SECONDS", "20")
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
        .start()
        .await;
    let store = w.server.store();
    let nginx = Workload::new("default", "nginx")
        .replicas(REPLICAS as i32)
        .grace_period_seconds(Some(5));
    store.create(&nginx.deployment()).unwrap();
    store
        .create(&fixtures::pdb_max_unavailable(
            "default",
            "nginx",
            json!(1),
            &[("app", "nginx")],
        ))
        .unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("the replicas Ready", Duration::from_secs(10), |store| {
            store
                .list::<Pod>()
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node))
                .filter(|p| fixtures::pod_is_ready(p))
                .count()
                == REPLICAS
        })
        .await
        .unwrap();
    w.server
        .register_node(
            OTHER_NODE,
            "aws:///eu-west-1b/i-0fffeeeedddd11112",
            Some(Duration::ZERO),
        )
        .unwrap();
    let mut subscription = w.aws.sns().subscribe(&w.topic).unwrap();
    w.aws
        .autoscaling()
        .terminate_instance(GROUP, &w.instance)
        .unwrap();
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let started = Instant::now();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&event)
        .await;
    let took = started.elapsed();
    // Completed after a drain that emptied the node (not at its deadline), each replica
    // evicted once.
    let summary = answer["records"][0]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with("completed CONTINUE (Drained,"),
        "{answer}"
    );
    assert_eq!(w.aws.autoscaling().completions().len(), 1);
    let left = store
        .list::<Pod>()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.metadata.namespace.as_deref() == Some("default"))
        .count();
    assert_eq!(left, 0, "pods left on the drained node");
    let accepted: Vec<String> = w
        .server
        .audit()
        .subresource_requests("pods", "eviction")
        .iter()
        .filter(|e| e.code() == 201)
        .map(|e| e.name().to_owned())
        .collect();
    let once: std::collections::BTreeSet<&String> = accepted.iter().collect();
    assert_eq!(
        (accepted.len(), once.len()),
        (REPLICAS, REPLICAS),
        "{accepted:?}"
    );
    let requests = w.server.audit().by_user("terminating-hook");
    let rejected = requests
        .iter()
        .filter(|e| e.subresource() == "eviction" && e.code() == 429)
        .count();
    println!(
        "drain on the fake API server: {took:?}, {} requests ({rejected} evictions refused by the budget)",
        requests.len()
    );
}

/// The wait for volumes (`control_plane::scenarios::volumes`): the action is completed once
/// the drained pods' volumes are detached, not waiting for the volume of a pod that stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_its_pods_volumes_to_detach_on_a_real_cluster() {
    play_as_test(
        "a_drain_waits_for_its_pods_volumes_to_detach_on_a_real_cluster",
        RealScenario::Volumes,
    )
    .await;
}

/// A Spot interruption (`control_plane::scenarios::spot`): the warning drains once within
/// its two minutes, the notification completes the action once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_drains_once_on_a_real_cluster() {
    play_as_test(
        "a_spot_interruption_drains_once_on_a_real_cluster",
        RealScenario::Spot,
    )
    .await;
}

/// Scale-in with reuse then scale-out from the pool (`control_plane::scenarios::warm_pool`):
/// the launching hook undoes exactly the drain's marks in one conditional write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_the_warm_pool_gets_its_drain_undone_on_a_real_cluster() {
    play_as_test(
        "a_node_back_from_the_warm_pool_gets_its_drain_undone_on_a_real_cluster",
        RealScenario::WarmPool,
    )
    .await;
}

/// Node repair (`control_plane::scenarios::repair`): past the threshold the instance is
/// marked unhealthy, and the dead node is drained without waiting for its kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_kubelet_died_is_repaired_on_a_real_cluster() {
    play_as_test(
        "a_node_whose_kubelet_died_is_repaired_on_a_real_cluster",
        RealScenario::Repair,
    )
    .await;
}

fn run_sandbox(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .args(args)
        .output()
        .expect("the sandbox binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// `sandbox --real-control-plane` plays every scenario, and every expectation holds.
#[test]
fn the_sandbox_job_on_the_real_control_plane_holds_its_expectations() {
    if binaries_or_skip("the_sandbox_job_on_the_real_control_plane_holds_its_expectations")
        .is_none()
    {
        return;
    }
    let started = Instant::now();
    let (code, output) = run_sandbox(&["--real-control-plane"]);
    println!(
        "{output}
the whole sequence took {:?}",
        started.elapsed()
    );
    assert_eq!(code, Some(0), "{output}");
    for scenario in RealScenario::ALL {
        let name = scenario.name();
        assert!(
            output.contains(&format!("── {name}: ")),
            "{name} not played:\n{output}"
        );
        assert!(
            output.contains(&format!("✓ {name}: ")),
            "{name} did not hold:\n{output}"
        );
    }
    assert!(!output.contains('✗'), "{output}");
}

/// `--only` plays the scenarios named; an unknown name is refused before anything starts,
/// naming the scenarios there are. Needs no control plane.
#[test]
fn the_sandbox_refuses_an_unknown_real_plane_scenario() {
    let (code, output) = run_sandbox(&["--real-control-plane", "--only", "drain,drian"]);
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains("unknown scenario `drian`; the scenarios are nodegroup-auth, drain, volumes, spot, warm-pool, repair, refresh"),
        "{output}"
    );
    let (code, output) = run_sandbox(&["--only", "drain"]);
    assert_eq!(
        code,
        Some(2),
        "--only without --real-control-plane: {output}"
    );
}
