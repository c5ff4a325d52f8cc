//! `kubectl drain-plan` (the built `kubectl-drain_plan` binary) against the fake cluster, as
//! an operator with only the read-only RBAC docs/operating.md gives, and then the built
//! terminating hook draining the same node: the plan must say what the drain then does (the
//! same pods evicted, the same pods and budgets in the way at the deadline, critical pods
//! last, DaemonSet pods left).
//!
//! Uses the binaries as built: run `cargo build --workspace --bins --tests` after changing them.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use node_manager_testkit::binaries::function_binary;
use node_manager_testkit::e2e::{FunctionWorld, Target};
use node_manager_testkit::fixtures::running_on;
use node_manager_testkit::fixtures::{self, Workload};
use node_manager_testkit::kube::Store;
use serde_json::Value;

/// Not the terminating fixture's instance.
const INSTANCE: &str = "i-0b1c2d3e4f5061728";
const DRAIN_TIMEOUT_SECONDS: &str = "10";

fn allowed(store: &Store, name: &str) -> Option<i32> {
    store
        .list::<PodDisruptionBudget>()
        .into_iter()
        .find(|b| b.metadata.name.as_deref() == Some(name))
        .and_then(|b| b.status)
        .map(|s| s.disruptions_allowed)
}

/// The reference node with the EKS system pods, 4 nginx pods under a budget allowing one
/// disruption and 2 db pods under a budget allowing none; a second node to move to.
async fn world() -> FunctionWorld {
    let w = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.05")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "0.2")
        .env("DRAIN_TIMEOUT_SECONDS", DRAIN_TIMEOUT_SECONDS)
        .env("HAND_OVER_MARGIN_SECONDS", "5")
        .log_level("info")
        .json_logs()
        .start()
        .await;
    let store = w.server.store();
    fixtures::create_eks_system_workloads(store).unwrap();
    for (name, replicas) in [("nginx", 4), ("db", 2)] {
        let workload = Workload::new("default", name)
            .replicas(replicas)
            .grace_period_seconds(None);
        store.create(&workload.deployment()).unwrap();
    }
    store
        .create(&fixtures::pdb_max_unavailable(
            "default",
            "nginx",
            serde_json::json!(1),
            &[("app", "nginx")],
        ))
        .unwrap();
    store
        .create(&fixtures::pdb_min_available(
            "default",
            "db",
            2,
            &[("app", "db")],
        ))
        .unwrap();
    let node = w.node.clone();
    w.server
        .wait_for(
            "the pods run and the budgets are counted",
            Duration::from_secs(10),
            |store| {
                running_on(store, &node, "nginx-") == 4
                    && running_on(store, &node, "db-") == 2
                    && running_on(store, &node, "coredns-") == 1
                    && allowed(store, "nginx") == Some(1)
                    && allowed(store, "db") == Some(0)
            },
        )
        .await
        .unwrap();
    w.add_room_node();
    w
}

/// The operator's RBAC, as docs/operating.md gives it (the YAML block of its drain-plan
/// section).
fn documented_rbac() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operating.md");
    let guide = std::fs::read_to_string(path).unwrap();
    let section = &guide[guide
        .find("kubectl drain-plan`")
        .expect("the drain-plan section")..];
    let block = &section[section.find("```yaml\n").expect("its RBAC block") + 8..];
    block[..block.find("```").unwrap()].to_owned()
}

/// Runs the plugin as a member of `open-node-manager:operators`, with only `args` and the
/// drain's deadline setting.
async fn drain_plan(w: &FunctionWorld, args: &[&str]) -> (bool, String, String) {
    drain_plan_with(w, args, &[]).await
}

/// [`drain_plan`] with `env` besides (AWS credentials, say).
async fn drain_plan_with(
    w: &FunctionWorld,
    args: &[&str],
    env: &[(String, String)],
) -> (bool, String, String) {
    let token = w
        .server
        .add_static_token("operator", &["open-node-manager:operators"]);
    let kubeconfig = std::env::temp_dir().join(format!(
        "drain-plan-{}-{}.kubeconfig",
        std::process::id(),
        w.server.address().port()
    ));
    std::fs::write(
        &kubeconfig,
        w.server
            .kubeconfig_yaml_with_user(&format!("    token: {token}\n")),
    )
    .unwrap();
    let output = tokio::process::Command::new(function_binary("kubectl-drain_plan"))
        .args(args)
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("DRAIN_TIMEOUT_SECONDS", DRAIN_TIMEOUT_SECONDS)
        .envs(env.iter().cloned())
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_file(&kubeconfig);
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn names(values: &Value) -> BTreeSet<String> {
    values
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The names inside `(PodDisruptionBudget X)` of a note.
fn budgets_named(note: &str) -> BTreeSet<String> {
    note.split("(PodDisruptionBudget ")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(name, _)| name.to_owned()))
        .collect()
}

#[tokio::test]
async fn the_plan_of_a_node_is_what_its_drain_then_does() {
    let w = world().await;
    w.server.store().apply_yaml(&documented_rbac()).unwrap();

    // Bad input: a clear error and no call.
    let (ok, _, stderr) = drain_plan(&w, &["no/such node"]).await;
    assert!(!ok && stderr.contains("neither a node name"), "{stderr}");

    // By instance id, through the node's providerID.
    let (ok, stdout, stderr) = drain_plan(&w, &[INSTANCE, "-o", "json"]).await;
    assert!(ok, "{stderr}");
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(plan["node"]["name"], w.node.as_str());
    let evict = &plan["evict"];
    let tier_of = |prefix: &str| -> BTreeSet<&str> {
        evict
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"].as_str().unwrap().starts_with(prefix))
            .map(|p| p["tier"].as_str().unwrap())
            .collect()
    };
    assert_eq!(tier_of("nginx-"), ["ordinary"].into());
    assert_eq!(tier_of("db-"), ["ordinary"].into());
    assert_eq!(tier_of("coredns-"), ["critical"].into());
    assert_eq!(
        evict.as_array().unwrap().last().unwrap()["tier"],
        "critical",
        "critical last"
    );
    let left = names(&plan["left"]);
    assert!(
        left.iter().any(|n| n.starts_with("aws-node-"))
            && left.iter().any(|n| n.starts_with("kube-proxy-")),
        "{left:?}"
    );
    let blocking: BTreeSet<String> = plan["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["blocksNow"] == true)
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(blocking, ["db".to_owned()].into());
    assert_eq!(plan["estimate"]["reachesDeadline"], true);
    assert_eq!(plan["estimate"]["deadlineSeconds"], 10);
    let blocked = names(&plan["estimate"]["blocked"]);
    let all_evicted = names(evict);
    let critical: BTreeSet<String> = all_evicted
        .iter()
        .filter(|n| n.starts_with("coredns-"))
        .cloned()
        .collect();

    // The table says the same.
    let (ok, table, stderr) = drain_plan(&w, &[&w.node]).await;
    assert!(ok, "{stderr}");
    assert!(
        table.contains("default/db") && table.contains("BLOCKS"),
        "{table}"
    );
    assert!(
        table.contains("The drain would reach its deadline"),
        "{table}"
    );

    // The drain.
    let (_subscription, event) = w.start_termination().await;
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&event)
        .await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let summary = answer["records"][0]["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("PodEvictionFailure"), "{answer}");

    // Evicted: every pod of the plan but the blocked ones and the tier after them.
    let evicted: BTreeSet<String> = w
        .server
        .audit()
        .subresource_requests("pods", "eviction")
        .into_iter()
        .filter(|e| (200..300).contains(&e.code()))
        .map(|e| e.name().to_owned())
        .collect();
    let expected: BTreeSet<String> = all_evicted
        .difference(&blocked)
        .filter(|n| !critical.contains(*n))
        .cloned()
        .collect();
    assert_eq!(evicted, expected);
    // Nothing the plan leaves was asked to leave.
    let asked: BTreeSet<String> = w
        .server
        .audit()
        .subresource_requests("pods", "eviction")
        .into_iter()
        .map(|e| e.name().to_owned())
        .collect();
    assert!(
        asked.is_subset(&all_evicted),
        "{asked:?} vs {all_evicted:?}"
    );
    // In the way at the deadline: the blocked pods, with the blocking budget, and the
    // critical pods that waited for them.
    let notes: Vec<String> = w
        .server
        .store()
        .list::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("PodEvictionFailure"))
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    let note = &notes[0];
    for pod in blocked.iter().chain(&critical) {
        assert!(note.contains(pod.as_str()), "{pod} missing from {note}");
    }
    assert_eq!(budgets_named(note), blocking, "{note}");
}

#[tokio::test]
async fn the_plan_shows_the_volumes_attached_to_the_node_and_which_the_drain_waits_for() {
    let w = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .start()
        .await;
    let store = w.server.store();
    store.apply_yaml(&documented_rbac()).unwrap();
    store
        .apply_yaml(&format!(
            r#"---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data-db-0, namespace: default}}
spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}, volumeName: pv-db-0}}
---
apiVersion: v1
kind: Pod
metadata: {{name: db-0, namespace: default}}
spec:
  nodeName: {node}
  containers: [{{name: db, image: postgres}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data-db-0}}}}]
"#,
            node = w.node
        ))
        .unwrap();
    let node = w.node.clone();
    w.server
        .wait_for("the volume is attached", Duration::from_secs(10), |store| {
            store
                .list::<k8s_openapi::api::storage::v1::VolumeAttachment>()
                .iter()
                .any(|a| {
                    a.spec.node_name == node
                        && a.spec.source.persistent_volume_name.as_deref() == Some("pv-db-0")
                })
        })
        .await
        .unwrap();
    let (ok, stdout, stderr) = drain_plan(&w, &[&w.node, "-o", "json"]).await;
    assert!(ok, "{stderr}");
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    let volumes = plan["volumes"].as_array().expect("volumes listed");
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(volumes[0]["volume"], "pv-db-0");
    assert_eq!(volumes[0]["pods"][0]["name"], "db-0");
    assert_eq!(volumes[0]["waitedFor"], true);
    let (ok, table, stderr) = drain_plan(&w, &[&w.node]).await;
    assert!(ok, "{stderr}");
    assert!(
        table
            .lines()
            .any(|l| l.contains("pv-db-0") && l.contains("default/db-0") && l.ends_with("yes")),
        "{table}"
    );
}

#[tokio::test]
async fn with_load_balancers_the_plan_names_those_routing_to_the_instance() {
    use node_manager_testkit::aws::{FakeLoadBalancer, FakeTargetGroup};
    use node_manager_testkit::e2e::CLUSTER;
    let w = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .instance(INSTANCE)
        .start()
        .await;
    w.server.store().apply_yaml(&documented_rbac()).unwrap();
    let elb = w.aws.elb();
    let web = elb.add_target_group(FakeTargetGroup::of_cluster("k8s-web", CLUSTER));
    elb.add_target_group(FakeTargetGroup::of_cluster("k8s-other", CLUSTER));
    elb.register(&FakeLoadBalancer::TargetGroup(web), INSTANCE);
    let credentials = w.aws.account().add_role_credentials("operator");
    let aws_env = w.aws.environment(&credentials);
    let args = [
        w.node.as_str(),
        "--load-balancers-of",
        CLUSTER,
        "-o",
        "json",
    ];
    let (ok, stdout, stderr) = drain_plan_with(&w, &args, &aws_env).await;
    assert!(ok, "{stderr}");
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    let routing = plan["loadBalancers"].as_array().expect("asked");
    assert_eq!(routing.len(), 1, "{routing:?}");
    assert!(
        routing[0]["name"]
            .as_str()
            .unwrap()
            .contains("targetgroup/k8s-web/")
    );
    assert_eq!(routing[0]["state"], "registered");
    assert_eq!(routing[0]["deregistrationDelaySeconds"], 300);
    let (ok, table, stderr) = drain_plan_with(&w, &args[..3], &aws_env).await;
    assert!(ok, "{stderr}");
    assert!(
        table.lines().any(|l| l.contains("targetgroup/k8s-web/")
            && l.contains("registered")
            && l.ends_with("300s")),
        "{table}"
    );
    // Not asked: not shown.
    let (ok, stdout, _) = drain_plan(&w, &[&w.node, "-o", "json"]).await;
    assert!(ok);
    assert!(
        serde_json::from_str::<Value>(&stdout)
            .unwrap()
            .get("loadBalancers")
            .is_none()
    );
}
