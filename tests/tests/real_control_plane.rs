//! The end-to-end scenarios on a real Kubernetes control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler; built by `scripts/control-plane.sh build`): the
//! built function binaries authenticate with EKS tokens through the TokenReview webhook, run
//! under the shipped `infra/rbac.yaml` and the real authorizer, and meet the real eviction API,
//! disruption controller, ReplicaSet controller and scheduler. The test kit plays the kubelets.
//!
//! Without the binaries these tests fail saying how to build them, unless
//! `SKIP_REAL_CONTROL_PLANE_TESTS=1` (then they print a line and pass).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use node_manager::aws::LifecycleActionResult;
use node_manager_testkit::control_plane::workload::writes_of;
use node_manager_testkit::control_plane::world::RealFunctionWorld;
use node_manager_testkit::control_plane::{KUBERNETES_VERSION, binaries_or_skip};
use node_manager_testkit::e2e::{GROUP, Target};
use node_manager_testkit::fixtures::{self, Workload};
use node_manager_testkit::kube::AuditEvent;
use node_manager_testkit::soak::corpus::repository_root;
use serde_json::{Value, json};

const OTHER_NODE: &str = "ip-10-0-9-9.eu-west-1.compute.internal";
const EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
const REPLICAS: usize = 4;

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
}

/// Pods of the `nginx` Deployment: (name, node, ready, terminating).
async fn nginx_pods(client: &kube::Client) -> Vec<(String, String, bool, bool)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let Ok(list) = pods.list(&ListParams::default().labels("app=nginx")).await else {
        return Vec::new();
    };
    list.items
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
                fixtures::pod_is_ready(p),
                p.metadata.deletion_timestamp.is_some(),
            )
        })
        .collect()
}

/// Waits until `condition` holds; on a timeout, panics naming `what` with the nginx pods.
async fn wait_until<F, Fut>(client: &kube::Client, what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !condition().await {
        if Instant::now() >= deadline {
            let pods = nginx_pods(client).await;
            panic!(
                "timed out waiting for {what}; nginx pods (name, node, ready, terminating): {pods:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Samples, every 20 ms until stopped, the fewest nginx pods Ready and not terminating.
fn watch_available(client: kube::Client) -> (Arc<Mutex<usize>>, tokio::task::JoinHandle<()>) {
    let fewest = Arc::new(Mutex::new(usize::MAX));
    let task = tokio::spawn({
        let fewest = fewest.clone();
        async move {
            loop {
                let pods = nginx_pods(&client).await;
                let available = pods
                    .iter()
                    .filter(|(_, _, ready, gone)| *ready && !gone)
                    .count();
                {
                    let mut fewest = fewest.lock().unwrap();
                    *fewest = (*fewest).min(available);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    (fewest, task)
}

fn node_patch(writes: &[AuditEvent], sets: impl Fn(&Value) -> bool) -> Option<usize> {
    writes.iter().position(|e| {
        e.resource() == "nodes"
            && e.verb == "patch"
            && (200..300).contains(&e.code())
            && e.request_object.as_ref().is_some_and(&sets)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_hook_drains_a_node_of_a_real_cluster() {
    let Some(bin) = binaries_or_skip("terminating_hook_drains_a_node_of_a_real_cluster") else {
        return;
    };
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "0.5")
        .start(&bin)
        .await
        .unwrap();
    println!(
        "control plane {KUBERNETES_VERSION} ready in {:?}; memory (kB): {:?}",
        w.plane.ready_after(),
        w.plane.memory_kib()
    );
    let admin = w.plane.admin_client().await.unwrap();

    // The second node exists cordoned until every replica runs on the first.
    w.kubelets
        .register_node(
            OTHER_NODE,
            "aws:///eu-west-1b/i-0fffeeeedddd11112",
            "eu-west-1b",
            true,
        )
        .await
        .unwrap();
    let nginx = Workload::new("default", "nginx")
        .replicas(REPLICAS as i32)
        .grace_period_seconds(Some(5));
    Api::<Deployment>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &nginx.deployment())
        .await
        .unwrap();
    let budget = fixtures::pdb_max_unavailable("default", "nginx", json!(1), &[("app", "nginx")]);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "default");
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .unwrap();
    let node = w.node.clone();
    wait_until(
        &admin,
        "the replicas Ready on the first node",
        Duration::from_secs(20),
        || {
            let (admin, node) = (admin.clone(), node.clone());
            async move {
                let pods = nginx_pods(&admin).await;
                pods.len() == REPLICAS && pods.iter().all(|(_, n, ready, _)| *ready && *n == node)
            }
        },
    )
    .await;
    // The disruption controller computes the budget's status asynchronously.
    wait_until(
        &admin,
        "the budget allowing one disruption",
        Duration::from_secs(10),
        || {
            let budgets = budgets.clone();
            async move {
                budgets
                    .get("nginx")
                    .await
                    .ok()
                    .and_then(|b| b.status)
                    .is_some_and(|s| {
                        s.disruptions_allowed == 1 && s.current_healthy == REPLICAS as i32
                    })
            }
        },
    )
    .await;
    Api::<Node>::all(admin.clone())
        .patch(
            OTHER_NODE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": false}})),
        )
        .await
        .unwrap();
    let evicted: BTreeSet<String> = nginx_pods(&admin).await.into_iter().map(|p| p.0).collect();

    let (fewest_available, sampler) = watch_available(admin.clone());
    let mut subscription = w.aws.sns().subscribe(&w.topic).unwrap();
    w.aws
        .autoscaling()
        .terminate_instance(GROUP, &w.instance)
        .unwrap();
    let event = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let drain_started = Instant::now();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&event)
        .await;
    let drain_took = drain_started.elapsed();
    sampler.abort();
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");

    // Exactly one CONTINUE.
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);
    assert_eq!(completions[0].instance_id, w.instance);

    // Label and cordon before the first eviction; evictions only, never a pod deletion.
    let audit = w.plane.audit();
    let user = RealFunctionWorld::username(Target::TerminatingHook);
    let writes = writes_of(&audit, user);
    let trail = writes
        .iter()
        .map(AuditEvent::line)
        .collect::<Vec<_>>()
        .join("\n");
    let label = node_patch(&writes, |p| {
        p["metadata"]["labels"][EXCLUDE_FROM_LB] == "true"
    })
    .unwrap_or_else(|| panic!("no label patch:\n{trail}"));
    let cordon = node_patch(&writes, |p| p["spec"]["unschedulable"] == true)
        .unwrap_or_else(|| panic!("no cordon patch:\n{trail}"));
    let first_eviction = writes
        .iter()
        .position(|e| e.subresource() == "eviction")
        .unwrap_or_else(|| panic!("no eviction:\n{trail}"));
    assert!(label < first_eviction && cordon < first_eviction, "{trail}");
    assert!(
        !writes
            .iter()
            .any(|e| e.verb == "delete" && e.resource() == "pods"),
        "the drain deleted a pod:\n{trail}"
    );
    let accepted: BTreeSet<String> = writes
        .iter()
        .filter(|e| e.subresource() == "eviction" && (200..300).contains(&e.code()))
        .map(|e| e.name().to_owned())
        .collect();
    assert_eq!(accepted, evicted, "{trail}");

    // The budget held throughout: never fewer than replicas - maxUnavailable available.
    let fewest = *fewest_available.lock().unwrap();
    assert!(
        fewest >= REPLICAS - 1,
        "only {fewest} replicas were available at one point:\n{trail}"
    );

    // The ReplicaSet controller recreated the evicted pods and the scheduler put them on the
    // other node.
    wait_until(
        &admin,
        "the replicas Ready on the other node",
        Duration::from_secs(20),
        || {
            let admin = admin.clone();
            async move {
                let pods = nginx_pods(&admin).await;
                pods.len() == REPLICAS
                    && pods
                        .iter()
                        .all(|(_, n, ready, _)| *ready && n == OTHER_NODE)
            }
        },
    )
    .await;

    let requests: BTreeMap<&str, usize> =
        audit
            .iter()
            .filter(|e| e.user.username == user)
            .fold(BTreeMap::new(), |mut counts, e| {
                *counts.entry(e.audit_id.as_str()).or_default() += 1;
                counts
            });
    let rejected = writes
        .iter()
        .filter(|e| e.subresource() == "eviction" && e.code() == 429)
        .count();
    println!(
        "drain on the real control plane: {drain_took:?}, {} requests ({rejected} evictions refused by the budget)",
        requests.len()
    );
}

/// The user the real API server sees for a client (`SelfSubjectReview`): its name and groups,
/// or the error.
async fn whoami(client: &kube::Client) -> Result<(String, Vec<String>), kube::Error> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review: SelfSubjectReview = serde_json::from_value(json!({})).unwrap();
    let answer = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let user = answer.status.and_then(|s| s.user_info).unwrap_or_default();
    Ok((
        user.username.unwrap_or_default(),
        user.groups.unwrap_or_default(),
    ))
}

fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
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
    let credentials = aws_credential_types::Credentials::new(
        &role.access_key_id,
        &role.secret_access_key,
        role.session_token.clone(),
        None,
        "test",
    );
    let token = node_manager::cluster::token::sign_token(
        &credentials,
        "eu-west-1",
        node_manager_testkit::e2e::CLUSTER,
        std::time::SystemTime::now(),
    )
    .unwrap();
    let client = w.plane.client_with_token(token.expose()).await.unwrap();

    // A valid token of an unmapped role: 401 from the real API server.
    let refused = whoami(&client).await.unwrap_err();
    assert_eq!(status_code(&refused), Some(401), "{refused}");

    // Mapped through aws-auth (as the operator's guide does for the function's role).
    let mapping = format!(
        "- rolearn: {}\n  username: terminating-hook\n  groups: [\"open-node-manager:terminating-hook\"]\n",
        role.principal_arn
    );
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), "kube-system")
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
    let forbidden =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap_err();
    assert_eq!(status_code(&forbidden), Some(403), "{forbidden}");

    // A token for another cluster is refused by the webhook.
    let other = node_manager::cluster::token::sign_token(
        &credentials,
        "eu-west-1",
        "another-cluster",
        std::time::SystemTime::now(),
    )
    .unwrap();
    let stranger = w.plane.client_with_token(other.expose()).await.unwrap();
    assert_eq!(
        status_code(&whoami(&stranger).await.unwrap_err()),
        Some(401)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodegroup_auth_maps_the_node_role_so_nodes_authenticate_on_a_real_cluster() {
    let Some(bin) = binaries_or_skip(
        "nodegroup_auth_maps_the_node_role_so_nodes_authenticate_on_a_real_cluster",
    ) else {
        return;
    };
    let w = RealFunctionWorld::builder()
        .functions(&[Target::NodegroupAuth])
        .authentication_mode("CONFIG_MAP")
        .start(&bin)
        .await
        .unwrap();
    // The node's instance profile role; EC2 names its sessions after the instance.
    let role_name = node_manager_testkit::e2e::NODE_ROLE
        .rsplit('/')
        .next()
        .unwrap();
    let role = w.aws.account().add_role_credentials(role_name);
    w.aws
        .account()
        .name_session(&role.access_key_id, &w.instance);
    let credentials = aws_credential_types::Credentials::new(
        &role.access_key_id,
        &role.secret_access_key,
        role.session_token.clone(),
        None,
        "test",
    );
    let token = node_manager::cluster::token::sign_token(
        &credentials,
        "eu-west-1",
        node_manager_testkit::e2e::CLUSTER,
        std::time::SystemTime::now(),
    )
    .unwrap();
    let node_client = w.plane.client_with_token(token.expose()).await.unwrap();

    // Before the node group is mapped, the node's token is refused.
    let refused = whoami(&node_client).await.unwrap_err();
    assert_eq!(status_code(&refused), Some(401), "{refused}");

    let answer = w
        .function(Target::NodegroupAuth)
        .response_to(&node_manager_testkit::soak::corpus::fixture(
            "eventbridge-create-nodegroup.json",
        ))
        .await;
    assert_eq!(answer["nodegroups"][0]["awsAuth"], "mapped", "{answer}");

    // After: the node is system:node:<its private DNS name> in the node groups, and the
    // Node authorizer lets it read its own Node.
    let (username, groups) = whoami(&node_client).await.unwrap();
    assert_eq!(username, format!("system:node:{}", w.node));
    for group in ["system:bootstrappers", "system:nodes"] {
        assert!(groups.contains(&group.to_owned()), "{groups:?}");
    }
    Api::<Node>::all(node_client.clone())
        .get(&w.node)
        .await
        .unwrap();
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
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(w.aws.autoscaling().completions().len(), 1);
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

/// Seeds the nginx Deployment (4 replicas, grace `grace`, a PDB `maxUnavailable: 1`) on the
/// world's node with [`OTHER_NODE`] cordoned, waits until the replicas are Ready and the budget
/// allows one disruption, then opens [`OTHER_NODE`]; returns the pods' names.
async fn seed_nginx(w: &RealFunctionWorld, admin: &kube::Client, grace: i64) -> BTreeSet<String> {
    w.kubelets
        .register_node(
            OTHER_NODE,
            "aws:///eu-west-1b/i-0fffeeeedddd11112",
            "eu-west-1b",
            true,
        )
        .await
        .unwrap();
    let nginx = Workload::new("default", "nginx")
        .replicas(REPLICAS as i32)
        .grace_period_seconds(Some(grace));
    Api::<Deployment>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &nginx.deployment())
        .await
        .unwrap();
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "default");
    budgets
        .create(
            &PostParams::default(),
            &fixtures::pdb_max_unavailable("default", "nginx", json!(1), &[("app", "nginx")]),
        )
        .await
        .unwrap();
    let node = w.node.clone();
    wait_until(admin, "the replicas Ready", Duration::from_secs(20), || {
        let (admin, node, budgets) = (admin.clone(), node.clone(), budgets.clone());
        async move {
            let pods = nginx_pods(&admin).await;
            let allowed = budgets
                .get("nginx")
                .await
                .ok()
                .and_then(|b| b.status)
                .is_some_and(|s| s.disruptions_allowed == 1);
            allowed
                && pods.len() == REPLICAS
                && pods.iter().all(|(_, n, ready, _)| *ready && *n == node)
        }
    })
    .await;
    Api::<Node>::all(admin.clone())
        .patch(
            OTHER_NODE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": false}})),
        )
        .await
        .unwrap();
    nginx_pods(admin).await.into_iter().map(|p| p.0).collect()
}

/// Accepted evictions by pod, with the grace periods they asked for.
fn accepted_evictions(audit: &[AuditEvent], user: &str) -> BTreeMap<String, Vec<Option<i64>>> {
    let mut by_pod: BTreeMap<String, Vec<Option<i64>>> = BTreeMap::new();
    for e in writes_of(audit, user)
        .iter()
        .filter(|e| e.subresource() == "eviction" && (200..300).contains(&e.code()))
    {
        let grace = e
            .request_object
            .as_ref()
            .and_then(|b| b["deleteOptions"]["gracePeriodSeconds"].as_i64());
        by_pod.entry(e.name().to_owned()).or_default().push(grace);
    }
    by_pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_drains_once_on_a_real_cluster() {
    use node_manager_testkit::aws::SpotInterruptionAction;
    let Some(bin) = binaries_or_skip("a_spot_interruption_drains_once_on_a_real_cluster") else {
        return;
    };
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .spot()
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "0.5")
        .env("DRAIN_LEASE_SECONDS", "2")
        .start(&bin)
        .await
        .unwrap();
    let admin = w.plane.admin_client().await.unwrap();
    let seeded = seed_nginx(&w, &admin, 300).await;
    let (fewest_available, sampler) = watch_available(admin.clone());
    let mut topic = w.aws.sns().subscribe(&w.topic).unwrap();
    let interruption = w
        .aws
        .interruptions()
        .spot_interruption_carried_out(
            &w.instance,
            SpotInterruptionAction::Terminate,
            Duration::from_secs(120),
        )
        .unwrap();
    let notification = topic.next_event(Duration::from_secs(5)).await.unwrap();
    let hook = w.function(Target::TerminatingHook);

    // The warning drains the node within its two minutes, the 300 s grace periods cut.
    let answer = hook.response_to(&interruption.warning).await;
    assert_eq!(answer["instances"][0]["outcome"], "Drained", "{answer}");
    // Then the hook's notification: the drain is not run again, the action completed once.
    let answer = hook.response_to(&notification).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    sampler.abort();
    let completions = w.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");

    let user = RealFunctionWorld::username(Target::TerminatingHook);
    let evicted = accepted_evictions(&w.plane.audit(), user);
    assert_eq!(
        evicted.keys().cloned().collect::<BTreeSet<_>>(),
        seeded,
        "{evicted:?}"
    );
    for (pod, graces) in &evicted {
        assert_eq!(graces.len(), 1, "{pod} evicted more than once: {graces:?}");
        let grace = graces[0].unwrap_or_default();
        assert!((1..=115).contains(&grace), "{pod}: grace {grace}");
    }
    let fewest = *fewest_available.lock().unwrap();
    assert!(
        fewest >= REPLICAS - 1,
        "only {fewest} replicas were available at one point"
    );
}

fn node_marks(node: &Node) -> (bool, bool, bool, bool) {
    use node_manager::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;
    use node_manager::node_marks::checkpoint::CHECKPOINT_ANNOTATION;
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LOAD_BALANCERS_LABEL));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "example.com/draining"));
    let recorded = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CHECKPOINT_ANNOTATION));
    (cordoned, labelled, tainted, recorded)
}

/// Scale-in with reuse then scale-out from the pool: the terminating hook drains the node
/// (cordon, label, taint, record), the instance stops in the pool; back in service, the
/// launching hook undoes exactly that in one conditional write, on the real API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_the_warm_pool_gets_its_drain_undone_on_a_real_cluster() {
    use node_manager_testkit::aws::WarmPoolState;
    let Some(bin) =
        binaries_or_skip("a_node_back_from_the_warm_pool_gets_its_drain_undone_on_a_real_cluster")
    else {
        return;
    };
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook, Target::LaunchingHook])
        .env("NODE_TAINT", "example.com/draining=true:NoSchedule")
        .env("SETTLE_SECONDS", "0.1")
        .env("LAUNCH_TIMEOUT_SECONDS", "20")
        .start(&bin)
        .await
        .unwrap();
    let admin = w.plane.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let autoscaling = w.aws.autoscaling();
    autoscaling.set_warm_pool(GROUP, WarmPoolState::Stopped);
    let mut subscription = w.aws.sns().subscribe(&w.topic).unwrap();
    autoscaling
        .scale_in_to_warm_pool(GROUP, &w.instance)
        .unwrap();
    let to_pool = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&to_pool)
        .await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert_eq!(
        node_marks(&nodes.get(&w.node).await.unwrap()),
        (true, true, true, true)
    );

    autoscaling
        .launch_from_warm_pool(GROUP, &w.instance)
        .unwrap();
    let back = subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let answer = w.function(Target::LaunchingHook).response_to(&back).await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    let restored = &answer["records"][0]["restored"];
    assert_eq!(restored["uncordoned"], true, "{answer}");
    assert_eq!(restored["unlabelled"], true, "{answer}");
    assert_eq!(
        node_marks(&nodes.get(&w.node).await.unwrap()),
        (false, false, false, false)
    );
    let user = RealFunctionWorld::username(Target::LaunchingHook);
    let patches: Vec<AuditEvent> = writes_of(&w.plane.audit(), user)
        .into_iter()
        .filter(|e| e.resource() == "nodes" && e.verb == "patch")
        .collect();
    assert_eq!(patches.len(), 1, "{patches:?}");
    let sent = patches[0].request_object.clone().unwrap_or(Value::Null);
    assert!(sent["metadata"]["resourceVersion"].is_string(), "{sent}");
    assert_eq!(w.aws.autoscaling().completions().len(), 2);
}

/// What EventBridge sends on a schedule; node-repair needs none of it.
fn scheduled_event() -> Value {
    json!({
        "version": "0", "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event", "source": "aws.events", "account": "111111111111",
        "time": "2026-11-24T02:00:00Z", "region": "eu-west-1",
        "resources": ["arn:aws:events:eu-west-1:111111111111:rule/node-repair"], "detail": {}
    })
}

fn repair_outcome(answer: &Value, node: &str) -> String {
    answer["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == node))
        .map(|n| n["outcome"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("{node} missing from {answer}"))
}

/// A node whose kubelet died is repaired on the real cluster: past the threshold its
/// instance is marked unhealthy, and the terminating hook drains the dead node without
/// waiting for the deletions its kubelet will never confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_kubelet_died_is_repaired_on_a_real_cluster() {
    use node_manager_testkit::aws::FakeAutoScalingGroup;
    let Some(bin) = binaries_or_skip("a_node_whose_kubelet_died_is_repaired_on_a_real_cluster")
    else {
        return;
    };
    let w = RealFunctionWorld::builder()
        .functions(&[Target::NodeRepair, Target::TerminatingHook])
        .env(
            "REPAIR_CONFIG",
            r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 0.025, "repairAction": "Replace"}]}"#,
        )
        .env("STUCK_POD_SECONDS", "1")
        .start(&bin)
        .await
        .unwrap();
    w.aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", node_manager_testkit::e2e::CLUSTER)
            .availability_zones(&["eu-west-1a"])
            .health_check_grace_period(Duration::ZERO),
    );
    let admin = w.plane.admin_client().await.unwrap();
    seed_nginx(&w, &admin, 1).await;
    let repair = w.function(Target::NodeRepair);
    let answer = repair.response_to(&scheduled_event()).await;
    assert_eq!(repair_outcome(&answer, &w.node), "Healthy", "{answer}");

    w.kubelets.kill(&w.node).await.unwrap();
    let answer = repair.response_to(&scheduled_event()).await;
    assert_eq!(repair_outcome(&answer, &w.node), "Waiting", "{answer}");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let mut topic = w.aws.sns().subscribe(&w.topic).unwrap();
    let answer = repair.response_to(&scheduled_event()).await;
    assert_eq!(repair_outcome(&answer, &w.node), "Repair", "{answer}");
    assert_eq!(w.aws.requests_for("SetInstanceHealth").len(), 1);

    w.aws
        .autoscaling()
        .wait_for_health_replacement(&w.instance, Duration::from_secs(5))
        .await
        .unwrap();
    let terminating = loop {
        let event = topic.next_event(Duration::from_secs(5)).await.unwrap();
        if event.to_string().contains("EC2_INSTANCE_TERMINATING") {
            break event;
        }
    };
    let started = Instant::now();
    let answer = w
        .function(Target::TerminatingHook)
        .response_to(&terminating)
        .await;
    assert_eq!(answer["records"][0]["outcome"], "Completed", "{answer}");
    assert!(started.elapsed() < Duration::from_secs(15), "{answer}");
    // Evicted, and left Terminating: nothing else removes a dead kubelet's pods.
    let pods = nginx_pods(&admin).await;
    assert!(
        pods.iter()
            .any(|(_, node, _, terminating)| *node == w.node && *terminating),
        "{pods:?}"
    );
}

/// `sandbox --real-control-plane` plays its drain and every expectation holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_job_on_the_real_control_plane_holds_its_expectations() {
    let Some(bin) =
        binaries_or_skip("the_sandbox_job_on_the_real_control_plane_holds_its_expectations")
    else {
        return;
    };
    assert!(
        node_manager_testkit::control_plane::sandbox_job::play(&bin)
            .await
            .unwrap()
    );
}
