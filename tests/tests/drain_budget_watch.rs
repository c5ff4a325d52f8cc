//! PDB-paced drains: an eviction a PodDisruptionBudget refused is retried when the watched
//! budget allows it, not on the timer; without `watch` on poddisruptionbudgets the timer
//! backoff paces the retries instead (the watch is asked for once, not again).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use node_manager::aws::in_memory::{InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications};
use node_manager::aws::{LifecycleActionRef, LifecycleActionResult, LifecycleHook};
use node_manager::drain::{DeliveryOutcome, DrainEnd, Drainer, Invocation};
use node_manager::lifecycle::budget::InvocationBudget;
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::DrainSettings;
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use node_manager_testkit::soak::corpus;
use serde_json::{Value, json};

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-paced-ng";
const INSTANCE: &str = "i-07e9ea9eb19a67337";
const NODE: &str = "ip-192-168-12-34.eu-west-1.compute.internal";
const OTHER_NODE: &str = "ip-192-168-77-8.eu-west-1.compute.internal";
const TOKEN: &str = "0b6a3c1e-2d4f-4a5b-9c8d-7e6f5a4b3c2d";
/// Pods of the one ReplicaSet on the drained node, all behind `maxUnavailable: 1`.
const REPLICAS: usize = 4;

/// The shipped RBAC, optionally without the rule granting `watch` on poddisruptionbudgets.
fn rbac(without_pdb_watch: bool) -> Vec<Value> {
    let text = std::fs::read_to_string(corpus::repository_root().join("infra/rbac.yaml")).unwrap();
    let mut documents: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    if without_pdb_watch {
        let mut removed = 0;
        for doc in &mut documents {
            if let Some(rules) = doc["rules"].as_array_mut() {
                let before = rules.len();
                rules.retain(|r| {
                    !(r["resources"] == json!(["poddisruptionbudgets"])
                        && r["verbs"] == json!(["watch"]))
                });
                removed += before - rules.len();
            }
        }
        assert_eq!(removed, 1, "the shipped RBAC has one PDB watch rule");
    }
    documents
}

struct Outcome {
    drained: bool,
    elapsed: Duration,
    refused: usize,
    watch_forbidden: usize,
    violations: usize,
}

/// `REPLICAS` pods of one ReplicaSet on NODE behind `maxUnavailable: 1`, replacements Ready
/// 50 ms after they are scheduled on OTHER_NODE; drained with the given timer backoff.
async fn paced_drain(without_pdb_watch: bool, backoff: (&str, &str)) -> Outcome {
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .simulation(SimulationTimings {
            grace_period_scale: 0.002,
            pod_start_delay: Duration::from_millis(50),
            node_ready_after: Duration::ZERO,
            ..SimulationTimings::default()
        })
        .start()
        .await
        .unwrap();
    for doc in rbac(without_pdb_watch) {
        server.store().apply_value(doc).unwrap();
    }
    for (node, instance) in [(NODE, INSTANCE), (OTHER_NODE, "i-0aaaabbbbccccdddd")] {
        server
            .register_node(
                node,
                &format!("aws:///eu-west-1a/{instance}"),
                Some(Duration::ZERO),
            )
            .unwrap();
    }
    server
        .wait_for("nodes", Duration::from_secs(5), |s| {
            s.list::<Node>().len() == 2
        })
        .await
        .unwrap();
    let cordon = |unschedulable: bool| {
        server
            .store()
            .modify::<Node>("", OTHER_NODE, |n| {
                n.spec.get_or_insert_with(Default::default).unschedulable = Some(unschedulable);
            })
            .unwrap();
    };
    cordon(true);
    server
        .store()
        .apply_yaml(&format!(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {{name: web, namespace: default}}\nspec:\n  replicas: {REPLICAS}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers: [{{name: web, image: nginx}}]\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: web, namespace: default}}\nspec:\n  maxUnavailable: 1\n  selector: {{matchLabels: {{app: web}}}}\n"
        ))
        .unwrap();
    server
        .wait_for("the pods run on the node", Duration::from_secs(5), |s| {
            let running = s
                .list::<Pod>()
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE))
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            running == REPLICAS
                && s.find::<PodDisruptionBudget>("default", "web")
                    .and_then(|b| b.status)
                    .is_some_and(|st| st.disruptions_allowed == 1)
        })
        .await
        .unwrap();
    cordon(false);
    server.audit().clear();
    server.disruption_log().clear();

    let token =
        server.add_static_token("terminating-hook", &["open-node-manager:terminating-hook"]);
    let mut config = server.config_with_token(&token).await.unwrap();
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    let autoscaling = InMemoryAutoScaling::new();
    autoscaling.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
    autoscaling.add_hook(
        GROUP,
        LifecycleHook {
            name: "Terminate-LC-Hook".into(),
            transition: "autoscaling:EC2_INSTANCE_TERMINATING".into(),
            heartbeat_timeout: Duration::from_secs(300),
            global_timeout: Duration::from_secs(3600),
            default_result: LifecycleActionResult::Abandon,
        },
    );
    autoscaling.start_action(&LifecycleActionRef {
        auto_scaling_group_name: GROUP.into(),
        lifecycle_hook_name: "Terminate-LC-Hook".into(),
        instance_id: INSTANCE.into(),
        token: TOKEN.into(),
    });
    let instances = InMemoryInstances::default();
    instances.add(INSTANCE, NODE);
    let settings = DrainSettings::from_source(
        [
            ("CLUSTER_NAME", CLUSTER),
            ("SETTLE_SECONDS", "0"),
            ("DRAIN_TIMEOUT_SECONDS", "20"),
            ("EVICTION_BACKOFF_SECONDS", backoff.0),
            ("EVICTION_BACKOFF_MAX_SECONDS", backoff.1),
            ("DRAIN_LEASE_SECONDS", "5"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
        ]
        .as_slice(),
    )
    .unwrap();
    let drainer = Drainer::new(
        client,
        autoscaling.clone(),
        instances,
        InMemoryNotifications::default(),
        settings,
    );
    let invocation = Invocation {
        request_id: "paced".into(),
        function_account: Some("111111111111".into()),
        budget: InvocationBudget::new(Duration::from_secs(30), Duration::ZERO),
    };
    let base = corpus::fresh_lifecycle_event(corpus::Target::TerminatingHook);
    let mut message = corpus::message_of(&base);
    message["AutoScalingGroupName"] = json!(GROUP);
    message["EC2InstanceId"] = json!(INSTANCE);
    message["LifecycleHookName"] = json!("Terminate-LC-Hook");
    message["LifecycleActionToken"] = json!(TOKEN);
    let event = corpus::with_message(&base, &message.to_string());
    let started = Instant::now();
    let report = drainer.handle_invocation(event, &invocation).await.unwrap();
    let elapsed = started.elapsed();
    let audit = server.audit();
    let outcome = Outcome {
        drained: matches!(
            report.outcomes.as_slice(),
            [DeliveryOutcome::Completed {
                drain: DrainEnd::Drained,
                ..
            }]
        ),
        elapsed,
        refused: audit
            .subresource_requests("pods", "eviction")
            .iter()
            .filter(|e| e.code() == 429)
            .count(),
        watch_forbidden: audit
            .filter(|e| {
                e.resource() == "poddisruptionbudgets" && e.verb == "watch" && e.code() == 403
            })
            .len(),
        violations: server
            .disruption_log()
            .evictions()
            .iter()
            .filter(|r| !r.broken_budgets().is_empty())
            .count(),
    };
    server.shutdown();
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_evictions_are_retried_when_the_budget_allows_not_on_the_timer() {
    // A timer backoff of 10 s: every wave would take that long if the timer paced them.
    let outcome = paced_drain(false, ("10", "10")).await;
    assert!(outcome.drained, "the node was drained");
    assert_eq!(outcome.violations, 0, "no eviction broke the budget");
    assert_eq!(outcome.watch_forbidden, 0);
    // REPLICAS - 1 waves wait for a replacement (~50 ms each); one timer retry alone would
    // cost 5 s or more.
    assert!(
        outcome.elapsed < Duration::from_secs(4),
        "paced by the budget, not the timer: {:?}",
        outcome.elapsed
    );
    // Each refused pod is retried once per status that allows it, not in a loop.
    assert!(
        outcome.refused <= 3 * REPLICAS,
        "{} refusals for {REPLICAS} pods",
        outcome.refused
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_watch_permission_the_timer_paces_the_retries() {
    let outcome = paced_drain(true, ("0.05", "0.1")).await;
    assert!(outcome.drained, "the timer still drains the node");
    assert_eq!(outcome.violations, 0);
    assert_eq!(
        outcome.watch_forbidden, 1,
        "the watch is asked for once; after the 403 the drain stops asking"
    );
    assert!(outcome.refused > 0, "evictions were refused and retried");
}
