//! The differences found between the test kit's API server and a real kube-apiserver, and
//! the answers the code depends on (eviction answers, conditional writes, field selectors,
//! list pages, a terminating namespace, RBAC decisions, a request APF sheds), each a check run against both: the fake on every run (one test per difference) and the real
//! control plane in one test that starts it once (skipped with a printed line when
//! `SKIP_REAL_CONTROL_PLANE_TESTS=1` and the plane is not built). A check that holds on the
//! real server and fails on the fake is a fake that lies.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams, WatchParams};
use node_manager_testkit::aws::FakeAws;
use node_manager_testkit::control_plane::binaries_or_skip;
use node_manager_testkit::control_plane::workload::GuardedDeployment;
use node_manager_testkit::control_plane::world::RealFunctionWorld;
use node_manager_testkit::e2e::{CLUSTER, FunctionWorld};
use node_manager_testkit::fixtures;
use node_manager_testkit::kube::rbac::{
    Authorizer as RbacAuthorizer, RequestAttributes, UserInfo as RbacUser,
};
use node_manager_testkit::kube::{AuditEvent, FaultAction, FaultRule, SimulationTimings};
use serde_json::json;

/// What a check needs of a cluster, fake or real.
struct Cluster<'a> {
    name: &'static str,
    admin: kube::Client,
    aws: &'a FakeAws,
    /// The seeded instance and its node.
    instance: String,
    node: String,
    /// A client presenting a token.
    client_with_token: Box<dyn Fn(String) -> kube::Client + 'a>,
    /// The audit log, one event per request (as the tests read it).
    audit: Box<dyn Fn() -> Vec<AuditEvent> + 'a>,
    /// The audit log as written, every stage of a request on its own.
    audit_log: Box<dyn Fn() -> Vec<AuditEvent> + 'a>,
    /// Adds a Ready, cordoned node for the instance named; returns the node's name.
    add_node: Box<dyn Fn(&str) -> String + 'a>,
    /// A client whose requests in the namespace named the server sheds as API Priority and
    /// Fairness does when their priority level has no seat (429).
    shed_in: Box<dyn Fn(&str) -> kube::Client + 'a>,
    /// Compacts the storage's history now (the fake); kube-apiserver does it on its own
    /// interval, so for the real one this does nothing and the check waits.
    compact: Box<dyn Fn() + 'a>,
    /// Restarts the API server, and returns once it is ready again.
    restart: Box<dyn Fn() + 'a>,
    /// Holds the disruption controller (`true`: the fake's is held, the real
    /// kube-controller-manager frozen) or lets it run on (`false`).
    hold_disruption_controller: Box<dyn Fn(bool) + 'a>,
}

async fn fake_cluster(w: &FunctionWorld) -> Cluster<'_> {
    let config = w.server.config_with_token("").await.unwrap();
    let admin = w.server.admin_client_without_retries().await.unwrap();
    let shedding_admin = admin.clone();
    Cluster {
        name: "fake",
        admin,
        aws: &w.aws,
        instance: w.instance.clone(),
        node: w.node.clone(),
        client_with_token: Box::new(move |token| {
            let mut config = config.clone();
            config.auth_info.token = Some(token.into());
            kube::Client::try_from(config).unwrap()
        }),
        audit: Box::new(|| w.server.audit().events()),
        audit_log: Box::new(|| w.server.audit().events()),
        add_node: Box::new(|instance| {
            let name = format!("node-{instance}");
            w.server
                .register_node(
                    &name,
                    &format!("aws:///eu-west-1a/{instance}"),
                    Some(Duration::ZERO),
                )
                .unwrap();
            w.server
                .store()
                .modify::<Node>("", &name, |n| {
                    n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
                })
                .unwrap();
            name
        }),
        shed_in: Box::new(move |namespace| {
            let throttled = FaultAction::TooManyRequests {
                retry_after_seconds: 1,
            };
            w.server
                .faults()
                .add(FaultRule::new(throttled).namespace(namespace));
            shedding_admin.clone()
        }),
        compact: Box::new(|| w.server.store().compact()),
        restart: Box::new(|| w.server.restart()),
        hold_disruption_controller: Box::new(|held| {
            w.server.simulation().hold_disruption_controller(held)
        }),
    }
}

fn real_cluster(w: &RealFunctionWorld, admin: kube::Client) -> Cluster<'_> {
    let handle = tokio::runtime::Handle::current();
    let nodes_handle = handle.clone();
    let shed_handle = handle.clone();
    let restart_handle = handle.clone();
    Cluster {
        name: "real",
        admin,
        aws: &w.aws,
        instance: w.instance.clone(),
        node: w.node.clone(),
        client_with_token: Box::new(move |token| {
            tokio::task::block_in_place(|| {
                handle.block_on(w.plane.client_with_token(&token)).unwrap()
            })
        }),
        audit: Box::new(|| w.plane.audit()),
        audit_log: Box::new(|| w.plane.audit_stages()),
        add_node: Box::new(move |instance| {
            tokio::task::block_in_place(|| {
                nodes_handle
                    .block_on(w.add_instance(instance, "eu-west-1a", true))
                    .unwrap()
            })
        }),
        shed_in: Box::new(move |namespace| {
            tokio::task::block_in_place(|| shed_handle.block_on(shed_the_node_agent(w, namespace)))
        }),
        compact: Box::new(|| {}),
        restart: Box::new(move || {
            tokio::task::block_in_place(|| restart_handle.block_on(w.plane.restart_apiserver()))
                .unwrap();
        }),
        hold_disruption_controller: Box::new(|held| {
            let signalled = if held {
                w.plane.pause("kube-controller-manager")
            } else {
                w.plane.resume("kube-controller-manager")
            };
            signalled.unwrap();
        }),
    }
}

/// The real plane sheds the node agent's requests in `namespace`: a priority level with the
/// fewest seats (no nominal share, nothing borrowed: one seat) that rejects what does not fit, and a flow schema
/// sending it those requests (the admin, in `system:masters`, is exempt from APF).
async fn shed_the_node_agent(w: &RealFunctionWorld, namespace: &str) -> kube::Client {
    use node_manager_testkit::control_plane::kubelet::NODE_AGENT;
    let manifest = format!(
        "apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata: {{name: no-seat}}
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 0
    lendablePercent: 0
    borrowingLimitPercent: 0
    limitResponse: {{type: Reject}}
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {{name: no-seat}}
spec:
  priorityLevelConfiguration: {{name: no-seat}}
  matchingPrecedence: 100
  rules:
  - subjects: [{{kind: User, user: {{name: {NODE_AGENT}}}}}]
    resourceRules:
    - {{verbs: ['*'], apiGroups: [''], resources: [configmaps, pods/eviction], namespaces: [{namespace}]}}
"
    );
    let admin = w.plane.admin_client().await.unwrap();
    node_manager_testkit::control_plane::world::apply_manifest(&admin, &manifest)
        .await
        .unwrap();
    w.plane.kubelet_client().await.unwrap()
}

async fn fake_world(timings: SimulationTimings) -> FunctionWorld {
    FunctionWorld::builder()
        .functions(&[])
        .simulation(timings)
        .start()
        .await
}

/// The fake's default timings with grace periods as long as they say (a check whose pod must
/// stay `Terminating` through it).
fn unscaled_grace() -> SimulationTimings {
    SimulationTimings {
        grace_period_scale: 1.0,
        ..SimulationTimings::default()
    }
}

fn status_of(error: &kube::Error) -> (u16, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.message.clone()),
        other => (0, other.to_string()),
    }
}

// --- (1) Nodes are created with the not-ready taint -------------------------------------

/// kube-apiserver's `TaintNodesByCondition` admission plugin puts
/// `node.kubernetes.io/not-ready:NoSchedule` on every node created through the API, whatever
/// the request said; the node lifecycle controller lifts it once the node is Ready.
async fn check_new_nodes_carry_the_not_ready_taint(cluster: &Cluster<'_>) {
    let nodes: Api<Node> = Api::all(cluster.admin.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "ip-10-0-77-7.eu-west-1.compute.internal"},
        "spec": {"providerID": "aws:///eu-west-1a/i-0777777777777777a",
                 "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]},
    }))
    .unwrap();
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    let taints: Vec<(String, String)> = created
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect();
    assert_eq!(
        taints,
        [
            ("dedicated".to_owned(), "NoSchedule".to_owned()),
            (
                "node.kubernetes.io/not-ready".to_owned(),
                "NoSchedule".to_owned()
            )
        ],
        "{}",
        cluster.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_new_nodes_carry_the_not_ready_taint_until_ready() {
    let w = fake_world(SimulationTimings::default()).await;
    check_new_nodes_carry_the_not_ready_taint(&fake_cluster(&w).await).await;
    // A kubelet's registration gets it too, and loses it once the node is Ready.
    let name = "ip-10-0-88-8.eu-west-1.compute.internal";
    w.server
        .register_node(
            name,
            "aws:///eu-west-1a/i-0888888888888888a",
            Some(Duration::from_millis(300)),
        )
        .unwrap();
    let registered: Node = w.server.store().get("", name).unwrap();
    assert_eq!(
        serde_json::to_value(registered.spec.and_then(|s| s.taints)).unwrap(),
        json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
    );
    w.server
        .wait_for("the node Ready", Duration::from_secs(5), |store| {
            store.get::<Node>("", name).is_ok_and(|n| {
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                ready && n.spec.and_then(|s| s.taints).unwrap_or_default().is_empty()
            })
        })
        .await
        .unwrap();
}

// --- (2) {{SessionName}} and {{EC2PrivateDNSName}} ---------------------------------------

/// aws-iam-authenticator fills `{{SessionName}}` with the role session's name and
/// `{{EC2PrivateDNSName}}` with the private DNS name of the instance the session is named
/// after (EC2 names an instance profile's sessions after the instance).
async fn check_session_templates_resolve(cluster: &Cluster<'_>) {
    let role = cluster
        .aws
        .account()
        .add_role_credentials("template-check-node-role");
    cluster
        .aws
        .account()
        .name_session(&role.access_key_id, &cluster.instance);
    let mapping = format!(
        "- rolearn: {}\n  username: system:node:{{{{EC2PrivateDNSName}}}}\n  groups: [\"system:nodes\", \"session:{{{{SessionName}}}}\"]\n",
        role.principal_arn
    );
    let aws_auth: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "aws-auth", "namespace": "kube-system"},
        "data": {"mapRoles": mapping},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(cluster.admin.clone(), "kube-system")
        .patch(
            "aws-auth",
            &PatchParams::apply("template-check").force(),
            &Patch::Apply(&aws_auth),
        )
        .await
        .unwrap();
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
        CLUSTER,
        std::time::SystemTime::now(),
    )
    .unwrap();
    let client = (cluster.client_with_token)(token.expose().to_owned());
    let (username, groups) = whoami(&client).await;
    assert_eq!(
        username,
        format!("system:node:{}", cluster.node),
        "{}",
        cluster.name
    );
    assert!(
        groups.contains(&format!("session:{}", cluster.instance)),
        "{}: {groups:?}",
        cluster.name
    );
}

async fn whoami(client: &kube::Client) -> (String, Vec<String>) {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review: SelfSubjectReview = serde_json::from_value(json!({})).unwrap();
    let answer = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let user = answer.status.and_then(|s| s.user_info).unwrap_or_default();
    (
        user.username.unwrap_or_default(),
        user.groups.unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_session_templates_resolve_as_aws_iam_authenticator_does() {
    let w = fake_world(SimulationTimings::default()).await;
    check_session_templates_resolve(&fake_cluster(&w).await).await;
}

// --- (3) The audit log counts a watch once ---------------------------------------------

/// A watch is one request in the audit log as the tests read it. Counted here from the log
/// itself, not through the kit's reader: the real log writes a watch at two stages
/// (`ResponseStarted`, `ResponseComplete`) under one `auditID`, the fake writes it once; the
/// requests are the distinct IDs, and the reader the tests use must give the same count.
async fn check_a_watch_is_one_request(cluster: &Cluster<'_>) {
    let namespace = "audit-check";
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.admin.clone(), namespace);
    let stream = config_maps
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap();
    // Until the server ends it (after a second).
    let _events: Vec<_> = futures::StreamExt::collect(stream).await;
    let ours = |e: &AuditEvent| {
        e.verb == "watch" && e.namespace() == namespace && e.user.username == "kubernetes-admin"
    };
    let started = Instant::now();
    loop {
        let logged: Vec<AuditEvent> = (cluster.audit_log)().into_iter().filter(ours).collect();
        let requests: std::collections::BTreeSet<&str> =
            logged.iter().map(|e| e.audit_id.as_str()).collect();
        if requests.len() == 1 || started.elapsed() > Duration::from_secs(3) {
            assert_eq!(requests.len(), 1, "{}: {logged:?}", cluster.name);
            let read = (cluster.audit)().into_iter().filter(ours).count();
            assert_eq!(read, 1, "{}: the tests' reader", cluster.name);
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_audit_log_counts_a_watch_once() {
    let w = fake_world(SimulationTimings::default()).await;
    check_a_watch_is_one_request(&fake_cluster(&w).await).await;
}

// --- (3b) Bookmarks come before a watch's deadline, not every second ----------------------

/// A watch with `allowWatchBookmarks` (kube-rs asks for them) and a 5 s timeout on a
/// namespace's Roles, one of which is created half a second in, gets that Role and then
/// bookmarks only in the last three seconds: the watch cache schedules one two seconds before
/// the deadline in buckets of a second (so it may come a second early, and once more), and
/// the others a minute apart, only once its resource moved past the watch's start. Each
/// carries a version no older than the Role's.
async fn check_bookmarks_come_before_the_deadline(cluster: &Cluster<'_>) {
    use futures::StreamExt as _;
    use k8s_openapi::api::rbac::v1::Role;
    use kube::api::WatchEvent;
    create_namespace(&cluster.admin, "bookmarks").await;
    // Roles: the controllers put a ConfigMap in every new namespace, but no Role.
    let roles: Api<Role> = Api::namespaced(cluster.admin.clone(), "bookmarks");
    let listed = roles.list(&ListParams::default()).await.unwrap();
    let from = listed.metadata.resource_version.unwrap();
    let started = Instant::now();
    let params = WatchParams::default().timeout(5);
    let mut stream = roles.watch(&params, &from).await.unwrap().boxed();
    let writer = roles.clone();
    let created = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let role = writer
            .create(&PostParams::default(), &empty_role("r"))
            .await;
        role.unwrap().metadata.resource_version.unwrap()
    });
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        if let WatchEvent::Bookmark(bookmark) = &event {
            seen.push((
                "bookmark",
                bookmark.metadata.resource_version.clone(),
                started.elapsed(),
            ));
        } else {
            seen.push((kind_of(&event), String::new(), started.elapsed()));
        }
    }
    let role_version: u64 = created.await.unwrap().parse().unwrap();
    let ([("added", _, _), bookmarks @ ..], 1..=2) = (&seen[..], seen.len().saturating_sub(1))
    else {
        panic!(
            "{}: the Role and one or two bookmarks expected, got {seen:?}",
            cluster.name
        );
    };
    for (kind, version, at) in bookmarks {
        assert_eq!(*kind, "bookmark", "{}: {seen:?}", cluster.name);
        assert!(
            version.parse::<u64>().unwrap() >= role_version,
            "{}: bookmark at {version}, Role at {role_version}",
            cluster.name
        );
        assert!(
            *at >= Duration::from_secs(2) && *at < Duration::from_secs(5),
            "{}: a bookmark came {at:?} into a 5 s watch",
            cluster.name
        );
    }
}

fn kind_of<K>(event: &kube::api::WatchEvent<K>) -> &'static str {
    match event {
        kube::api::WatchEvent::Added(_) => "added",
        kube::api::WatchEvent::Modified(_) => "modified",
        kube::api::WatchEvent::Deleted(_) => "deleted",
        kube::api::WatchEvent::Bookmark(_) => "bookmark",
        kube::api::WatchEvent::Error(_) => "error",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_bookmarks_come_before_the_deadline() {
    let w = fake_world(SimulationTimings::default()).await;
    check_bookmarks_come_before_the_deadline(&fake_cluster(&w).await).await;
}

// --- (3c) A watch across an API server's restart ------------------------------------------

/// Across a restart of the API server (kube-apiserver's rolling update; [`Cluster::restart`])
/// every watch is cut, and the new server's watch cache reaches back only to its start: a
/// watch resuming from a version before it is answered `ERROR` `410 Expired` ("too old
/// resource version"). The drain's watch of a node's pods (`drain::node_pods::NodePods`,
/// kube-runtime's watcher) lists again (a second list in the audit log) and sees a pod
/// deleted and one created after the restart.
async fn check_a_watch_across_a_restart(cluster: &Cluster<'_>) {
    use futures::StreamExt as _;
    use node_manager::drain::node_pods::NodePods;
    let namespace = "restarting";
    create_namespace(&cluster.admin, namespace).await;
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), namespace);
    let pod = |name: &str| fixtures::running_pod(namespace, name, &cluster.node, &[]);
    for name in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(name))
            .await
            .unwrap();
    }
    let mut watched = NodePods::watch(&cluster.admin, &cluster.node);
    wait_for_view(&mut watched, namespace, &["a", "b"], cluster.name).await;
    let roles: Api<k8s_openapi::api::rbac::v1::Role> =
        Api::namespaced(cluster.admin.clone(), namespace);
    let before = roles
        .create(&PostParams::default(), &empty_role("before"))
        .await
        .unwrap();
    let before = before.metadata.resource_version.unwrap();
    // The storage moves past `before`, so the new cache starts after it.
    roles
        .create(&PostParams::default(), &empty_role("after"))
        .await
        .unwrap();
    (cluster.restart)();
    let mut resumed = roles
        .watch(&WatchParams::default().timeout(5), &before)
        .await
        .unwrap()
        .boxed();
    match resumed.next().await {
        Some(Ok(kube::api::WatchEvent::Error(error))) => {
            assert_eq!(
                (error.code, error.reason.as_str()),
                (410, "Expired"),
                "{}",
                cluster.name
            );
            assert!(
                error.message.starts_with("too old resource version"),
                "{}: {}",
                cluster.name,
                error.message
            );
        }
        other => panic!(
            "{}: a watch from before the restart got {other:?}",
            cluster.name
        ),
    }
    let gone = kube::api::DeleteParams::default().grace_period(0);
    pods.delete("a", &gone).await.unwrap();
    pods.create(&PostParams::default(), &pod("c"))
        .await
        .unwrap();
    wait_for_view(&mut watched, namespace, &["b", "c"], cluster.name).await;
    let node_field = format!("spec.nodeName%3D{}", cluster.node);
    let lists = (cluster.audit)()
        .into_iter()
        .filter(|e| e.verb == "list" && e.request_uri.starts_with("/api/v1/pods?"))
        .filter(|e| e.request_uri.contains(&node_field))
        .count();
    assert_eq!(
        lists, 2,
        "{}: the watcher's lists of the node's pods",
        cluster.name
    );
}

/// Waits (30 s at most) until the watch's view of `namespace` is exactly `names`.
async fn wait_for_view(
    watched: &mut node_manager::drain::node_pods::NodePods,
    namespace: &str,
    names: &[&str],
    cluster: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen: Vec<String> = watched
            .pods()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        if watched.is_synced() && seen == names {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{cluster}: the watch saw {seen:?}, not {names:?}"
        );
        let _ = tokio::time::timeout(left, watched.changed()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_watches_across_a_restart_as_kube_apiserver_does() {
    let w = fake_world(SimulationTimings::default()).await;
    check_a_watch_across_a_restart(&fake_cluster(&w).await).await;
}

// --- (4) A budget's status lags -----------------------------------------------------------

/// The disruption controller computes a budget's status asynchronously: an eviction a budget
/// covers is refused with 429 while the budget's status has not observed its generation (the
/// cause: "still being processed by the server"), and accepted once the controller caught
/// up. The controller is held while the budget is created, so the first eviction meets the
/// lag on both servers whatever their timing; let run on, it accepts one within 10 s.
async fn check_budget_status_lags(cluster: &Cluster<'_>) {
    let admin = &cluster.admin;
    GuardedDeployment {
        namespace: "default",
        app: "lagging",
        replicas: 2,
        grace_seconds: 30,
        labels: &[],
        budget: false,
    }
    .create(admin)
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let ready = wait_ready_pods(&pods, "app=lagging", 2).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "default");
    (cluster.hold_disruption_controller)(true);
    let created = budgets
        .create(
            &PostParams::default(),
            &fixtures::pdb_max_unavailable("default", "lagging", json!(1), &[("app", "lagging")]),
        )
        .await;
    let first = pods.evict(&ready[0], &EvictParams::default()).await;
    (cluster.hold_disruption_controller)(false);
    created.unwrap();
    let error = first.expect_err("an eviction met a budget whose status was never computed");
    let (code, message) = status_of(&error);
    assert_eq!(code, 429, "{}: {message}", cluster.name);
    let causes = causes_of(&error);
    assert!(
        causes.contains("The disruption budget lagging is still being processed by the server."),
        "{}: {message}; causes {causes}",
        cluster.name
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match pods.evict(&ready[0], &EvictParams::default()).await {
            Ok(_) => break,
            Err(error) if Instant::now() < deadline => {
                assert_eq!(status_of(&error).0, 429, "{}: {error}", cluster.name);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("{}: still refused after 10 s: {error}", cluster.name),
        }
    }
}

/// The messages of an API error's `details.causes`, joined.
fn causes_of(error: &kube::Error) -> String {
    let kube::Error::Api(status) = error else {
        return String::new();
    };
    let causes = status.details.as_ref().map(|d| d.causes.as_slice());
    causes
        .unwrap_or_default()
        .iter()
        .map(|c| c.message.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

async fn wait_ready_pods(pods: &Api<Pod>, selector: &str, count: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap();
        let ready: Vec<String> = list
            .items
            .iter()
            .filter(|p| fixtures::pod_is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        if ready.len() >= count {
            return ready;
        }
        assert!(
            Instant::now() < deadline,
            "pods {selector} not Ready: {ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_budget_status_lags_its_inputs() {
    let w = fake_world(SimulationTimings::default()).await;
    check_budget_status_lags(&fake_cluster(&w).await).await;
}

// --- (5) Pods need their service account ---------------------------------------------------

/// The `ServiceAccount` admission plugin: a pod runs as a service account of its namespace
/// (`default` when it names none, filled in) and is refused (403) when that account does not
/// exist.
async fn check_pods_need_their_service_account(cluster: &Cluster<'_>) {
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "default");
    let pod = |name: &str, account: Option<&str>| -> Pod {
        let mut spec = json!({"containers": [{"name": "app", "image": "nginx"}]});
        if let Some(account) = account {
            spec["serviceAccountName"] = json!(account);
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    let refused = pods
        .create(&PostParams::default(), &pod("orphan", Some("missing")))
        .await
        .unwrap_err();
    let (code, message) = status_of(&refused);
    assert_eq!(code, 403, "{}: {message}", cluster.name);
    assert!(
        message.contains("serviceaccount \"missing\" not found"),
        "{}: {message}",
        cluster.name
    );
    let created = pods
        .create(&PostParams::default(), &pod("plain", None))
        .await
        .unwrap();
    assert_eq!(
        created.spec.and_then(|s| s.service_account_name).as_deref(),
        Some("default"),
        "{}",
        cluster.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_pods_need_their_service_account() {
    let w = fake_world(SimulationTimings::default()).await;
    check_pods_need_their_service_account(&fake_cluster(&w).await).await;
}

// --- (6) The scheduler weighs its scores -------------------------------------------------

/// The image every pod of this check runs: no other check's pods hold it.
const PLACED_IMAGE: &str = "public.ecr.aws/docker/library/busybox:1.37";

/// kube-scheduler weighs its default profile's scores; it neither takes a node that holds a
/// pod's image outright nor simply the emptiest. Two fresh nodes, `holder` and `empty`, every
/// other node cordoned:
/// 1. `other` (one replica) runs on `holder`, which then reports its image;
/// 2. the first replica of `web` (same image) goes to `holder` too: ImageLocality (a 500 MB
///    image on one node in a few) outweighs the one pod `holder` has more;
/// 3. `web`'s second replica goes to `empty`: spreading `web` (PodTopologySpread, weight 2)
///    now outweighs the image.
///
/// A scheduler taking the emptiest node fails step 2; one preferring the image outright fails
/// step 3.
async fn check_placement_weighs_image_against_spread(cluster: &Cluster<'_>) {
    let admin = &cluster.admin;
    let nodes: Api<Node> = Api::all(admin.clone());
    cordon_every_node(&nodes).await;
    let holder = (cluster.add_node)("i-0a1a1a1a1a1a1a1a1");
    let empty = (cluster.add_node)("i-0b2b2b2b2b2b2b2b2");
    for node in [&holder, &empty] {
        let zone = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "eu-west-1a"}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&zone))
            .await
            .unwrap();
    }
    set_unschedulable(&nodes, &holder, false).await;
    deploy(admin, "other", 1).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    assert_eq!(
        nodes_of(&pods, "app=other", 1).await,
        std::slice::from_ref(&holder),
        "{}",
        cluster.name
    );
    wait_image_reported(&nodes, &holder).await;
    set_unschedulable(&nodes, &empty, false).await;
    deploy(admin, "web", 1).await;
    assert_eq!(
        nodes_of(&pods, "app=web", 1).await,
        std::slice::from_ref(&holder),
        "{}: the node holding the image wins over the emptier one",
        cluster.name
    );
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    let two = json!({"spec": {"replicas": 2}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&two))
        .await
        .unwrap();
    let mut placed = nodes_of(&pods, "app=web", 2).await;
    placed.sort();
    let mut expected = vec![holder.clone(), empty.clone()];
    expected.sort();
    assert_eq!(
        placed, expected,
        "{}: spreading the Deployment wins over the image",
        cluster.name
    );
}

/// Cordons every node there is: a placement check then sees only the nodes it adds.
async fn cordon_every_node(nodes: &Api<Node>) {
    for node in nodes.list(&ListParams::default()).await.unwrap().items {
        set_unschedulable(nodes, node.metadata.name.as_deref().unwrap(), true).await;
    }
}

async fn set_unschedulable(nodes: &Api<Node>, node: &str, unschedulable: bool) {
    let patch = json!({"spec": {"unschedulable": unschedulable}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn deploy(admin: &kube::Client, app: &str, replicas: i32) {
    let deployment = fixtures::Workload::new("default", app)
        .replicas(replicas)
        .container("app", PLACED_IMAGE)
        .deployment();
    Api::<Deployment>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
}

/// The nodes of the `count` Ready pods `selector` selects, once there are that many.
async fn nodes_of(pods: &Api<Pod>, selector: &str, count: usize) -> Vec<String> {
    wait_ready_pods(pods, selector, count).await;
    pods.list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect()
}

async fn wait_image_reported(nodes: &Api<Node>, node: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reported = nodes.get(node).await.unwrap().status.and_then(|s| s.images);
        let holds = reported.into_iter().flatten().any(|image| {
            image
                .names
                .unwrap_or_default()
                .iter()
                .any(|name| name == PLACED_IMAGE)
        });
        if holds {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{node} never reported {PLACED_IMAGE}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_placement_weighs_image_against_spread() {
    let w = fake_world(SimulationTimings::default()).await;
    check_placement_weighs_image_against_spread(&fake_cluster(&w).await).await;
}

// --- (7) A node takes only the pods it has room for -------------------------------------

/// kube-scheduler's NodeResourcesFit filter: a node does not take a pod whose requests exceed
/// what its pods have not requested yet of its allocatable, and the pod stays Pending. One
/// fresh node (every other cordoned), a Deployment of two replicas each asking for 3 CPUs:
/// one runs, the other is left Pending.
async fn check_a_node_takes_only_what_fits(cluster: &Cluster<'_>) {
    let admin = &cluster.admin;
    let nodes: Api<Node> = Api::all(admin.clone());
    cordon_every_node(&nodes).await;
    let roomy = (cluster.add_node)("i-0c3c3c3c3c3c3c3c3");
    set_unschedulable(&nodes, &roomy, false).await;
    let mut deployment = fixtures::Workload::new("default", "big")
        .replicas(2)
        .container("app", PLACED_IMAGE)
        .deployment();
    let template = deployment
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap();
    template.containers[0].resources =
        Some(serde_json::from_value(json!({"requests": {"cpu": "3"}})).unwrap());
    Api::<Deployment>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    assert_eq!(
        nodes_of(&pods, "app=big", 1).await,
        [roomy],
        "{}",
        cluster.name
    );
    // Long enough for a scheduler to have placed the second one, had it room.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let unbound: Vec<String> = pods
        .list(&ListParams::default().labels("app=big"))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(
        unbound.len(),
        1,
        "{}: one replica stays Pending",
        cluster.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_a_node_takes_only_what_fits() {
    let w = fake_world(SimulationTimings::default()).await;
    check_a_node_takes_only_what_fits(&fake_cluster(&w).await).await;
}

// --- (8) List pages -------------------------------------------------------------------------

/// Paged lists as the code reads them (the refresh function's pods, the reconciler's nodes):
/// five Roles `page-1`..`page-5` in a namespace of their own (nothing else creates Roles
/// there, as the controllers do ConfigMaps and ServiceAccounts), `paging=yes` on 1, 2 and 4.
/// - No selector, `limit=2`: two items, a continue token, `remainingItemCount` 3.
/// - `paging=yes`, `limit=2`: `page-1`, `page-2` and a token, no `remainingItemCount` (the
///   server would have to read every key to count matches); the next page `page-4` and no
///   token (the keys after it do not match, and the page is not full).
async fn check_list_pages(cluster: &Cluster<'_>) {
    create_namespace(&cluster.admin, "paging").await;
    let roles: Api<k8s_openapi::api::rbac::v1::Role> =
        Api::namespaced(cluster.admin.clone(), "paging");
    for (i, selected) in [(1, "yes"), (2, "yes"), (3, "no"), (4, "yes"), (5, "no")] {
        let role = serde_json::from_value(json!({
            "metadata": {"name": format!("page-{i}"), "labels": {"paging": selected}},
            "rules": [],
        }))
        .unwrap();
        roles.create(&PostParams::default(), &role).await.unwrap();
    }
    let names = |list: &kube::core::ObjectList<k8s_openapi::api::rbac::v1::Role>| {
        list.items
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect::<Vec<_>>()
    };
    let all = roles.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&all), ["page-1", "page-2"], "{}", cluster.name);
    assert!(all.metadata.continue_.is_some(), "{}", cluster.name);
    assert_eq!(
        all.metadata.remaining_item_count,
        Some(3),
        "{}",
        cluster.name
    );
    let selected = ListParams::default().labels("paging=yes").limit(2);
    let first = roles.list(&selected).await.unwrap();
    assert_eq!(names(&first), ["page-1", "page-2"], "{}", cluster.name);
    assert_eq!(
        first.metadata.remaining_item_count, None,
        "{}",
        cluster.name
    );
    let token = first.metadata.continue_.clone().expect("a continue token");
    let second = roles
        .list(&selected.clone().continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second), ["page-4"], "{}", cluster.name);
    assert_eq!(
        second.metadata.continue_.filter(|t| !t.is_empty()),
        None,
        "{}",
        cluster.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_list_pages_as_kube_apiserver_does() {
    let w = fake_world(SimulationTimings::default()).await;
    check_list_pages(&fake_cluster(&w).await).await;
}

// --- (8b) A list's pages keep its revision; an expired token names the rest -------------------

/// The pages after a list's first are read at its revision: in namespace `continuing`,
/// Roles `r-1`..`r-5`; after the first page (`r-1`, `r-2`), `r-2a` is created and `r-3`
/// deleted, and the next page is still `r-3`, `r-4`. Once the revision is compacted (the
/// fake: [`Cluster::compact`]; kube-apiserver every few seconds under this test's
/// `--etcd-compaction-interval`, learnt by its cache within 15 s) the token is refused with
/// `410 Expired` and a token for the rest at the latest state (`r-2a`, `r-4`, `r-5`), which
/// the code's own pager follows (`cluster::pages::Pages`).
async fn check_pages_keep_their_revision_until_it_expires(cluster: &Cluster<'_>) {
    use k8s_openapi::api::rbac::v1::Role;
    use node_manager::cluster::pages::Pages;
    create_namespace(&cluster.admin, "continuing").await;
    let roles: Api<Role> = Api::namespaced(cluster.admin.clone(), "continuing");
    let create = |name: &str| {
        let role = empty_role(name);
        let roles = roles.clone();
        async move { roles.create(&PostParams::default(), &role).await.unwrap() }
    };
    for i in 1..=5 {
        create(&format!("r-{i}")).await;
    }
    let names = |roles: &[Role]| -> Vec<String> {
        roles
            .iter()
            .filter_map(|r| r.metadata.name.clone())
            .collect()
    };
    let first = roles.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first.items), ["r-1", "r-2"], "{}", cluster.name);
    let token = first.metadata.continue_.clone().expect("a continue token");
    create("r-2a").await;
    roles.delete("r-3", &Default::default()).await.unwrap();
    let at_first = ListParams::default().limit(2).continue_token(&token);
    let second = roles.list(&at_first).await.unwrap();
    assert_eq!(
        names(&second.items),
        ["r-3", "r-4"],
        "{}: at the first page's revision",
        cluster.name
    );
    (cluster.compact)();
    let expired = wait_for_expiry(&roles, &at_first, cluster.name).await;
    assert_eq!(
        (expired.code, expired.reason.as_str()),
        (410, "Expired"),
        "{}",
        cluster.name
    );
    assert!(
        expired
            .message
            .starts_with("The provided continue parameter is too old"),
        "{}: {}",
        cluster.name,
        expired.message
    );
    let rest = expired
        .metadata
        .and_then(|m| m.continue_)
        .expect("a token for the rest");
    let latest = roles
        .list(&ListParams::default().limit(2).continue_token(&rest))
        .await
        .unwrap();
    assert_eq!(
        names(&latest.items),
        ["r-2a", "r-4"],
        "{}: the rest at the latest state",
        cluster.name
    );
    let mut pages = Pages::new(roles.clone(), at_first);
    let mut followed = Vec::new();
    while let Some(page) = pages.next().await.unwrap() {
        followed.extend(names(&page));
    }
    assert_eq!(
        followed,
        ["r-2a", "r-4", "r-5"],
        "{}: the pager",
        cluster.name
    );
}

/// Lists with `params` until the server refuses its token as expired (60 s at most).
async fn wait_for_expiry<K>(api: &Api<K>, params: &ListParams, cluster: &str) -> kube::core::Status
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let started = Instant::now();
    loop {
        match api.list(params).await {
            Err(kube::Error::Api(status)) => return *status,
            Err(other) => panic!("{cluster}: {other}"),
            Ok(_) => {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "{cluster}: the token never expired"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// A Role granting nothing: an object no controller creates or touches, for the checks of
/// lists and watches.
fn empty_role(name: &str) -> k8s_openapi::api::rbac::v1::Role {
    serde_json::from_value(json!({"metadata": {"name": name}, "rules": []})).unwrap()
}

async fn create_namespace(admin: &kube::Client, name: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_pages_keep_their_revision_until_it_expires() {
    let w = fake_world(SimulationTimings::default()).await;
    check_pages_keep_their_revision_until_it_expires(&fake_cluster(&w).await).await;
}

// --- (9) Eviction answers, as the drain reads them -----------------------------------------

/// The three pods of [`check_eviction_answers`] (`guarded` behind one budget, `twice` behind
/// two, `free` behind none) in namespace `evictions`, running; their UIDs by name.
async fn seed_eviction_pods(
    cluster: &Cluster<'_>,
) -> std::collections::BTreeMap<&'static str, String> {
    let admin = &cluster.admin;
    create_namespace(admin, "evictions").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "evictions");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "evictions");
    let mut uids = std::collections::BTreeMap::new();
    for (name, app) in [("guarded", "guarded"), ("twice", "twice"), ("free", "free")] {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": cluster.node, "containers": [{"name": "c", "image": "nginx"}]},
        }))
        .unwrap();
        let created = pods.create(&PostParams::default(), &pod).await.unwrap();
        uids.insert(name, created.metadata.uid.unwrap());
    }
    for (name, app) in [
        ("guarded", "guarded"),
        ("twice-a", "twice"),
        ("twice-b", "twice"),
    ] {
        let budget = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        }))
        .unwrap();
        budgets
            .create(&PostParams::default(), &budget)
            .await
            .unwrap();
    }
    // A pod not yet running is evicted without asking its budgets (both servers): wait.
    let started = Instant::now();
    loop {
        let running = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{}: pods not running",
            cluster.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    uids
}

/// The answers the drain's eviction code classifies (`drain/eviction.rs`), through that code
/// itself: a pod a budget protects (429, the budget named in `details.causes`), a pod two
/// budgets select (500 "more than one PodDisruptionBudget"), a pod that is gone (404), a pod
/// whose UID is not the one asked for (409, the precondition). Pods bound to the seeded node
/// in a namespace of their own.
async fn check_eviction_answers(cluster: &Cluster<'_>) {
    use node_manager::drain::eviction::{EvictionOutcome, evict};
    use node_manager::drain::plan::PodKey;
    let uids = seed_eviction_pods(cluster).await;
    let key = |name: &str, uid: &str| PodKey {
        namespace: "evictions".into(),
        name: name.into(),
        uid: uid.into(),
    };
    let client = &cluster.admin;
    match evict(client, &key("guarded", &uids["guarded"]), None).await {
        EvictionOutcome::BlockedByBudget { budgets, .. } => {
            assert_eq!(budgets, ["guarded"], "{}", cluster.name);
        }
        other => panic!("{}: a guarded pod's eviction: {other:?}", cluster.name),
    }
    let twice = evict(client, &key("twice", &uids["twice"]), None).await;
    assert!(
        matches!(twice, EvictionOutcome::MultipleBudgets { .. }),
        "{}: {twice:?}",
        cluster.name
    );
    let gone = evict(client, &key("missing", "0000"), None).await;
    assert_eq!(gone, EvictionOutcome::Gone, "{}", cluster.name);
    let other_uid = evict(client, &key("free", "not-its-uid"), None).await;
    assert!(
        matches!(other_uid, EvictionOutcome::Conflict { .. }),
        "{}: {other_uid:?}",
        cluster.name
    );
    // The one free pod is evicted, once.
    let free = evict(client, &key("free", &uids["free"]), None).await;
    assert_eq!(free, EvictionOutcome::Accepted, "{}", cluster.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_eviction_answers_read_as_kube_apiservers() {
    let w = fake_world(SimulationTimings::default()).await;
    check_eviction_answers(&fake_cluster(&w).await).await;
}

// --- (9b) Evictions of pods that are not Ready, or already leaving -------------------------

/// A pod in namespace `unhealthy` bound to the cluster's node, labelled `app=<name>`, once
/// Running, then reported not Ready (its readiness probe's first run is ten minutes away, so
/// no kubelet turns it Ready meanwhile); returns its key.
async fn running_unready_pod(
    cluster: &Cluster<'_>,
    name: &str,
) -> node_manager::drain::plan::PodKey {
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "unhealthy");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"nodeName": cluster.node, "containers": [{"name": "c", "image": "nginx",
                 "readinessProbe": {"initialDelaySeconds": 600,
                                    "exec": {"command": ["true"]}}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let started = Instant::now();
    let uid = loop {
        let pod = pods.get(name).await.unwrap();
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            break pod.metadata.uid.unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{}: not running",
            cluster.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let now = jiff::Timestamp::now().to_string();
    let unready = json!({"status": {"conditions": [
        {"type": "Ready", "status": "False", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "False", "lastTransitionTime": now},
    ]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&unready))
        .await
        .unwrap();
    node_manager::drain::plan::PodKey {
        namespace: "unhealthy".into(),
        name: name.into(),
        uid,
    }
}

/// A budget `minAvailable: 1` over `app=<name>` (with `policy` as its
/// `unhealthyPodEvictionPolicy`), once the disruption controller has computed its status.
async fn observed_budget(cluster: &Cluster<'_>, name: &str, policy: Option<&str>) {
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(cluster.admin.clone(), "unhealthy");
    let budget = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}},
                 "unhealthyPodEvictionPolicy": policy},
    }))
    .unwrap();
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let budget = budgets.get(name).await.unwrap();
        let observed = budget.status.as_ref().and_then(|s| s.observed_generation);
        if observed.is_some() && observed == budget.metadata.generation {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{}: {name} not observed",
            cluster.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Through the drain's eviction code: a pod that is not Ready under a budget with no healthy
/// pod is refused by default (`IfHealthyBudget`) and evicted with `AlwaysAllow`; a pod already
/// being deleted is evicted without asking its budget, even one that allows nothing.
async fn check_unready_and_leaving_evictions(cluster: &Cluster<'_>) {
    use node_manager::drain::eviction::{EvictionOutcome, evict};
    create_namespace(&cluster.admin, "unhealthy").await;
    let by_default = running_unready_pod(cluster, "by-default").await;
    let always = running_unready_pod(cluster, "always").await;
    let leaving = running_unready_pod(cluster, "leaving").await;
    observed_budget(cluster, "by-default", None).await;
    observed_budget(cluster, "always", Some("AlwaysAllow")).await;
    observed_budget(cluster, "leaving", None).await;
    let refused = evict(&cluster.admin, &by_default, None).await;
    assert!(
        matches!(refused, EvictionOutcome::BlockedByBudget { .. }),
        "{}: an unready pod under IfHealthyBudget: {refused:?}",
        cluster.name
    );
    let allowed = evict(&cluster.admin, &always, None).await;
    assert_eq!(
        allowed,
        EvictionOutcome::Accepted,
        "{}: AlwaysAllow",
        cluster.name
    );
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "unhealthy");
    pods.delete("leaving", &Default::default()).await.unwrap();
    let again = evict(&cluster.admin, &leaving, None).await;
    assert_eq!(
        again,
        EvictionOutcome::Accepted,
        "{}: a pod already leaving",
        cluster.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_evicts_unready_and_leaving_pods_as_kube_apiserver_does() {
    // Grace periods as long as they say: the leaving pod's 30 s must outlast the check.
    let w = fake_world(unscaled_grace()).await;
    check_unready_and_leaving_evictions(&fake_cluster(&w).await).await;
}

// --- (10) Conditional writes and field selectors, as the code uses them ----------------------

/// Every read-modify-write of a Node sends a merge patch carrying the `resourceVersion` it read
/// (`node_marks::patch_recomputing`): a stale one must answer 409, the current one succeed;
/// then the field selectors ([`check_field_selectors`]).
async fn check_conditional_writes_and_field_selectors(cluster: &Cluster<'_>) {
    let nodes: Api<Node> = Api::all(cluster.admin.clone());
    let node = nodes.get(&cluster.node).await.unwrap();
    let read = node.metadata.resource_version.clone().unwrap();
    let label = |value: &str, version: &str| json!({"metadata": {"resourceVersion": version, "labels": {"agree/conditional": value}}});
    nodes
        .patch(
            &cluster.node,
            &PatchParams::default(),
            &Patch::Merge(&label("one", &read)),
        )
        .await
        .unwrap();
    let stale = nodes
        .patch(
            &cluster.node,
            &PatchParams::default(),
            &Patch::Merge(&label("two", &read)),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(&stale).0, 409, "{}: {stale}", cluster.name);
    let now = nodes.get(&cluster.node).await.unwrap();
    assert_eq!(
        now.metadata.labels.unwrap()["agree/conditional"],
        "one",
        "{}: the stale write changed the node",
        cluster.name
    );
    check_field_selectors(cluster).await;
}

/// The drain lists a node's pods by `spec.nodeName`, and a function that may only list nodes
/// reads one by `metadata.name`: both field selectors select exactly those objects.
async fn check_field_selectors(cluster: &Cluster<'_>) {
    let nodes: Api<Node> = Api::all(cluster.admin.clone());
    let by_name = nodes
        .list(&ListParams::default().fields(&format!("metadata.name={}", cluster.node)))
        .await
        .unwrap();
    let names: Vec<_> = by_name
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert_eq!(
        names,
        std::slice::from_ref(&cluster.node),
        "{}",
        cluster.name
    );
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "default");
    for (name, node) in [
        ("on-node", cluster.node.as_str()),
        ("elsewhere", "no-such-node"),
    ] {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": format!("selected-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let on_node = Api::<Pod>::all(cluster.admin.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", cluster.node)))
        .await
        .unwrap();
    let names: Vec<_> = on_node
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert!(
        names.contains(&"selected-on-node".to_owned()),
        "{}: {names:?}",
        cluster.name
    );
    assert!(
        !names.contains(&"selected-elsewhere".to_owned()),
        "{}: {names:?}",
        cluster.name
    );
    assert!(
        on_node
            .items
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                == Some(cluster.node.as_str())),
        "{}",
        cluster.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_conditional_writes_and_field_selectors_as_kube_apiserver() {
    let w = fake_world(SimulationTimings::default()).await;
    check_conditional_writes_and_field_selectors(&fake_cluster(&w).await).await;
}

// --- All of them on the real control plane --------------------------------------------------

// --- (11) A namespace being deleted -------------------------------------------------------

/// A deleted namespace stays `Terminating` while its pods end their grace (the namespace
/// controller deletes them gracefully), and meanwhile refuses new content: an eviction of its
/// pod answers 403 with the `NamespaceTerminating` cause, which the drain's eviction code
/// reads as "the namespace's deletion removes the pod", and so does any create.
async fn check_a_terminating_namespace(cluster: &Cluster<'_>) {
    use k8s_openapi::api::core::v1::Namespace;
    use node_manager::drain::eviction::{EvictionOutcome, evict};
    use node_manager::drain::plan::PodKey;
    create_namespace(&cluster.admin, "leaving").await;
    let namespaces: Api<Namespace> = Api::all(cluster.admin.clone());
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "leaving");
    let uid = create_running_pod(cluster, &pods, "slow").await;
    let deleted = namespaces
        .delete("leaving", &Default::default())
        .await
        .unwrap();
    let phase = |n: &Namespace| n.status.as_ref().and_then(|s| s.phase.clone());
    let answered = deleted.left().map(|n| phase(&n));
    assert_eq!(
        answered,
        Some(Some("Terminating".into())),
        "{}",
        cluster.name
    );
    let key = PodKey {
        namespace: "leaving".into(),
        name: "slow".into(),
        uid,
    };
    let outcome = evict(&cluster.admin, &key, None).await;
    assert_eq!(
        outcome,
        EvictionOutcome::NamespaceTerminating,
        "{}",
        cluster.name
    );
    let map: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.admin.clone(), "leaving");
    let refused = configmaps.create(&PostParams::default(), &map).await;
    let (code, message) = status_of(&refused.unwrap_err());
    assert_eq!(code, 403, "{}: {message}", cluster.name);
    // The pod ends its grace (30 s) inside the namespace, which is still there.
    let still = namespaces.get("leaving").await.unwrap();
    assert_eq!(
        phase(&still).as_deref(),
        Some("Terminating"),
        "{}",
        cluster.name
    );
}

/// A pod bound to the cluster's node with 30 s of grace, once Running; returns its UID.
async fn create_running_pod(cluster: &Cluster<'_>, pods: &Api<Pod>, name: &str) -> String {
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": cluster.node, "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "c", "image": "nginx"}]},
    }))
    .unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let started = Instant::now();
    loop {
        let pod = pods.get(name).await.unwrap();
        if pod.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            return uid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{}: not running",
            cluster.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_namespaces_terminate_as_kube_apiserver_does() {
    // Grace periods as long as they say: the pod's 30 s must outlast the check.
    let w = fake_world(unscaled_grace()).await;
    check_a_terminating_namespace(&fake_cluster(&w).await).await;
}

// --- (12) API Priority and Fairness sheds load ---------------------------------------------

/// A request API Priority and Fairness sheds: 429 with `Retry-After` in whole seconds (what
/// the client's retry layer, `cluster/server_retry.rs`, reads as its floor) and a line of
/// plain text, not a `Status` (kube-apiserver's filter answers before any API machinery, so
/// nothing may read a shed request's body as one); an eviction shed so is, through the drain's
/// own code, a transient refusal that waits the server's seconds.
async fn check_a_shed_request(cluster: &Cluster<'_>) {
    use node_manager::drain::eviction::{EvictionOutcome, evict};
    use node_manager::drain::plan::PodKey;
    let client = (cluster.shed_in)("shed");
    let response = first_shed(cluster.name, &client).await;
    let header = response.headers().get("retry-after").cloned();
    let seconds: u64 = header
        .and_then(|h| h.to_str().ok()?.parse().ok())
        .unwrap_or_else(|| panic!("{}: no Retry-After in seconds", cluster.name));
    assert!(seconds >= 1, "{}: Retry-After {seconds}", cluster.name);
    let content_type = response.headers().get("content-type").cloned();
    let content_type = content_type.and_then(|v| v.to_str().ok().map(str::to_owned));
    assert_eq!(
        content_type.as_deref(),
        Some("text/plain; charset=utf-8"),
        "{}",
        cluster.name
    );
    let body = response.into_body().collect_bytes().await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&body),
        "Too many requests, please try again later.\n",
        "{}",
        cluster.name
    );
    let key = PodKey {
        namespace: "shed".into(),
        name: "any".into(),
        uid: "0000".into(),
    };
    // Evictions sent together, as for requests: the shed ones are transient, with the wait.
    let started = Instant::now();
    let shed = loop {
        let outcomes = futures::future::join_all((0..40).map(|_| evict(&client, &key, None)));
        let mut outcomes = outcomes.await.into_iter();
        if let Some(shed) = outcomes.find(|o| matches!(o, EvictionOutcome::Transient { .. })) {
            break shed;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{}: no eviction shed",
            cluster.name
        );
    };
    assert!(
        shed.retry_after() >= Some(Duration::from_secs(1)),
        "{}: {shed:?}",
        cluster.name
    );
}

/// The first of `client`'s requests the server sheds. The real plane's APF controller takes
/// up a new flow schema within moments, and its priority level holds the least it can (one
/// seat): requests sent together overflow it.
async fn first_shed(name: &str, client: &kube::Client) -> http::Response<kube::client::Body> {
    let started = Instant::now();
    loop {
        let send = || {
            let request = http::Request::get("/api/v1/namespaces/shed/configmaps")
                .body(Vec::new())
                .unwrap();
            client.send(request.map(Into::into))
        };
        let answers = futures::future::join_all((0..40).map(|_| send())).await;
        let mut answers = answers.into_iter().map(Result::unwrap);
        if let Some(shed) = answers.find(|r| r.status() == 429) {
            return shed;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{name}: never shed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_sheds_a_request_as_api_priority_and_fairness_does() {
    let w = fake_world(SimulationTimings::default()).await;
    check_a_shed_request(&fake_cluster(&w).await).await;
}

// --- (13) RBAC decisions ------------------------------------------------------------------

/// One question to an authorizer: may a member of `group` make a request with `attributes`?
#[derive(Debug)]
struct Question {
    group: String,
    attributes: RequestAttributes,
}

/// The shipped `infra/rbac.yaml`, document by document.
fn shipped_rbac() -> Vec<serde_json::Value> {
    let path = node_manager_testkit::soak::corpus::repository_root().join("infra/rbac.yaml");
    serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every group the manifest binds, asking for every grant of the manifest (its own and every
/// other function's): cluster-wide, in `kube-system` and in `default`; a grant limited to
/// names is asked for its name and for another. These are the decisions the minimal-RBAC
/// proof (`security_rbac_minimal`, run on the fake's authorizer) leans on.
fn rbac_questions(documents: &[serde_json::Value]) -> Vec<Question> {
    let strings = |value: &serde_json::Value| -> Vec<String> {
        let items = value.as_array().into_iter().flatten();
        items
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let groups: std::collections::BTreeSet<String> = documents
        .iter()
        .flat_map(|d| d["subjects"].as_array().cloned().unwrap_or_default())
        .filter(|subject| subject["kind"] == "Group")
        .filter_map(|subject| subject["name"].as_str().map(str::to_owned))
        .collect();
    let rules: Vec<&serde_json::Value> = documents
        .iter()
        .flat_map(|d| d["rules"].as_array().into_iter().flatten())
        .collect();
    let mut questions = Vec::new();
    for group in &groups {
        for rule in &rules {
            let names = strings(&rule["resourceNames"]);
            let mut asked: Vec<Option<String>> = names.into_iter().map(Some).collect();
            asked.push(if asked.is_empty() {
                None
            } else {
                Some("another".into())
            });
            for api_group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    let (resource, subresource) = match resource.split_once('/') {
                        Some((r, sub)) => (r.to_owned(), Some(sub.to_owned())),
                        None => (resource, None),
                    };
                    for verb in strings(&rule["verbs"]) {
                        for namespace in [None, Some("kube-system"), Some("default")] {
                            for name in &asked {
                                questions.push(Question {
                                    group: group.clone(),
                                    attributes: RequestAttributes {
                                        verb: verb.clone(),
                                        api_group: api_group.clone(),
                                        resource: resource.clone(),
                                        subresource: subresource.clone(),
                                        namespace: namespace.map(str::to_owned),
                                        name: name.clone(),
                                        path: None,
                                    },
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    questions
}

/// The manifest's objects of `kind`.
fn of_kind<T: serde::de::DeserializeOwned>(documents: &[serde_json::Value], kind: &str) -> Vec<T> {
    let matching = documents.iter().filter(|d| d["kind"] == kind);
    matching
        .map(|d| serde_json::from_value(d.clone()).unwrap())
        .collect()
}

/// The fake's RBAC authorizer over the manifest (what the fake API server runs per request).
fn fake_decisions(documents: &[serde_json::Value], questions: &[Question]) -> Vec<bool> {
    let authorizer = RbacAuthorizer::from_objects(
        &of_kind(documents, "ClusterRole"),
        &of_kind(documents, "ClusterRoleBinding"),
        &of_kind(documents, "Role"),
        &of_kind(documents, "RoleBinding"),
    );
    let user = |group: &str| RbacUser {
        username: "rbac-probe".into(),
        groups: vec![group.to_owned(), "system:authenticated".into()],
    };
    questions
        .iter()
        .map(|q| authorizer.authorize(&user(&q.group), &q.attributes).is_ok())
        .collect()
}

/// kube-apiserver's authorizer (`Node,RBAC`), asked through `SubjectAccessReview`.
async fn real_decisions(admin: &kube::Client, questions: &[Question]) -> Vec<bool> {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let mut decisions = Vec::new();
    for q in questions {
        let a = &q.attributes;
        let review = serde_json::from_value(json!({
            "spec": {"user": "rbac-probe", "groups": [q.group, "system:authenticated"],
                     "resourceAttributes": {"verb": a.verb, "group": a.api_group,
                        "resource": a.resource, "subresource": a.subresource,
                        "namespace": a.namespace, "name": a.name}},
        }))
        .unwrap();
        let answered = reviews
            .create(&PostParams::default(), &review)
            .await
            .unwrap();
        decisions.push(answered.status.is_some_and(|s| s.allowed));
    }
    decisions
}

/// What the manifest means, asked of `decisions` (true where allowed): each function may do
/// its own work and not another's.
fn check_the_manifests_intent(name: &str, questions: &[Question], decisions: &[bool]) {
    let decided = |group: &str, verb: &str, resource: &str, namespace: &str, object: &str| {
        let found = questions.iter().zip(decisions).find(|(q, _)| {
            let a = &q.attributes;
            let combined = match &a.subresource {
                Some(sub) => format!("{}/{sub}", a.resource),
                None => a.resource.clone(),
            };
            q.group == format!("open-node-manager:{group}")
                && a.verb == verb
                && combined == resource
                && a.namespace.as_deref().unwrap_or_default() == namespace
                && a.name.as_deref().unwrap_or_default() == object
        });
        *found
            .unwrap_or_else(|| panic!("{name}: no question {group} {verb} {resource}"))
            .1
    };
    let expected = [
        (
            ("terminating-hook", "create", "pods/eviction", "default", ""),
            true,
        ),
        (("terminating-hook", "delete", "pods", "default", ""), false),
        (("force-delete", "delete", "pods", "default", ""), true),
        (
            ("launching-hook", "create", "pods/eviction", "default", ""),
            false,
        ),
        (("node-repair", "patch", "nodes", "", ""), true),
        (("node-repair", "get", "pods", "", ""), false),
        (
            (
                "nodegroup-auth",
                "update",
                "configmaps",
                "kube-system",
                "aws-auth",
            ),
            true,
        ),
        (
            (
                "nodegroup-auth",
                "update",
                "configmaps",
                "kube-system",
                "another",
            ),
            false,
        ),
        (
            ("nodegroup-auth", "get", "configmaps", "default", "aws-auth"),
            false,
        ),
    ];
    for ((group, verb, resource, namespace, object), allowed) in expected {
        assert_eq!(
            decided(group, verb, resource, namespace, object),
            allowed,
            "{name}: {group} {verb} {resource} in {namespace:?} {object:?}"
        );
    }
}

#[test]
fn fake_rbac_decides_what_the_shipped_manifest_means() {
    let documents = shipped_rbac();
    let questions = rbac_questions(&documents);
    check_the_manifests_intent("fake", &questions, &fake_decisions(&documents, &questions));
}

/// Every question asked of both authorizers: the real one must mean what the manifest means
/// and answer every question as the fake's does.
async fn check_rbac_decisions_agree(admin: &kube::Client) {
    let documents = shipped_rbac();
    let questions = rbac_questions(&documents);
    let real = real_decisions(admin, &questions).await;
    check_the_manifests_intent("real", &questions, &real);
    let fake = fake_decisions(&documents, &questions);
    let differ: Vec<String> = questions
        .iter()
        .zip(real.iter().zip(&fake))
        .filter(|(_, (real, fake))| real != fake)
        .map(|(q, (real, _))| format!("{} {:?}: real allowed={real}", q.group, q.attributes))
        .collect();
    println!(
        "RBAC: {} decisions compared, {} differ",
        questions.len(),
        differ.len()
    );
    assert!(
        differ.is_empty(),
        "the authorizers differ:\n{}",
        differ.join("\n")
    );
}

/// What a check's panic said (its assertion's message).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// How often the real test's kube-apiserver compacts etcd (default: five minutes).
const COMPACTION_INTERVAL: &str = "5s";

/// A check of `fake_and_real_agree`, on one cluster.
type Check<'c> = std::pin::Pin<Box<dyn Future<Output = ()> + 'c>>;

/// Every check, named, in the order the real test runs them: the placement checks last, as
/// they cordon every node the other checks use.
fn every_check<'c>(cluster: &'c Cluster<'c>) -> Vec<(&'static str, Check<'c>)> {
    vec![
        (
            "new nodes carry the not-ready taint",
            Box::pin(check_new_nodes_carry_the_not_ready_taint(cluster)),
        ),
        (
            "session templates resolve",
            Box::pin(check_session_templates_resolve(cluster)),
        ),
        (
            "a watch is one request",
            Box::pin(check_a_watch_is_one_request(cluster)),
        ),
        (
            "bookmarks come before the deadline",
            Box::pin(check_bookmarks_come_before_the_deadline(cluster)),
        ),
        (
            "a watch across a restart",
            Box::pin(check_a_watch_across_a_restart(cluster)),
        ),
        (
            "pods need their service account",
            Box::pin(check_pods_need_their_service_account(cluster)),
        ),
        ("list pages", Box::pin(check_list_pages(cluster))),
        (
            "pages keep their revision until it expires",
            Box::pin(check_pages_keep_their_revision_until_it_expires(cluster)),
        ),
        (
            "eviction answers",
            Box::pin(check_eviction_answers(cluster)),
        ),
        ("a shed request", Box::pin(check_a_shed_request(cluster))),
        (
            "RBAC decisions",
            Box::pin(check_rbac_decisions_agree(&cluster.admin)),
        ),
        (
            "a terminating namespace",
            Box::pin(check_a_terminating_namespace(cluster)),
        ),
        (
            "evictions of unready and leaving pods",
            Box::pin(check_unready_and_leaving_evictions(cluster)),
        ),
        (
            "conditional writes and field selectors",
            Box::pin(check_conditional_writes_and_field_selectors(cluster)),
        ),
        (
            "budget status lags its inputs",
            Box::pin(check_budget_status_lags(cluster)),
        ),
        (
            "placement weighs image against spread",
            Box::pin(check_placement_weighs_image_against_spread(cluster)),
        ),
        (
            "a node takes only what fits",
            Box::pin(check_a_node_takes_only_what_fits(cluster)),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_api_server_passes_every_check_the_fake_does() {
    let Some(bin) = binaries_or_skip("the_real_api_server_passes_every_check_the_fake_does") else {
        return;
    };
    // Compactions every few seconds, so that a continue token expires within the check.
    let w = RealFunctionWorld::builder()
        .functions(&[])
        .apiserver_flag(&format!("--etcd-compaction-interval={COMPACTION_INTERVAL}"))
        .start(&bin)
        .await
        .unwrap();
    let admin = w.plane.admin_client().await.unwrap();
    let cluster = real_cluster(&w, admin);
    // Every check runs and every failure is reported: the first must not hide the rest.
    let mut failed = Vec::new();
    for (name, check) in every_check(&cluster) {
        use futures::FutureExt as _;
        let started = Instant::now();
        if let Err(panic) = std::panic::AssertUnwindSafe(check).catch_unwind().await {
            failed.push(format!("{name}: {}", panic_message(&*panic)));
        }
        println!("real control plane: {name}: {:.1?}", started.elapsed());
    }
    assert!(
        failed.is_empty(),
        "the real API server failed {} check(s):\n{}",
        failed.len(),
        failed.join("\n")
    );
}
