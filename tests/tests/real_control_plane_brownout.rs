//! A brownout through API Priority and Fairness on the real control plane: the terminating
//! hook's identity is put in a priority level of one seat that rejects (429 with
//! `Retry-After`) what does not fit, on an apiserver started with a small
//! `--max-requests-inflight`, and 20 nodes are terminated at once, each lifecycle
//! notification in its own function process. Every drain must still complete exactly once, in
//! its first invocation (a request the server keeps throttling past its time bound is tried
//! again within the invocation, not left to Lambda's retry), with no PodDisruptionBudget
//! broken; the test reports how many 429s the brownout gave.
//!
//! Skipped with a printed line when `SKIP_REAL_CONTROL_PLANE_TESTS=1` and the plane is not
//! built.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use node_manager::aws::LifecycleActionResult;
use node_manager_testkit::control_plane::binaries_or_skip;
use node_manager_testkit::control_plane::workload::{
    GuardedDeployment, available_by_app, evictions_per_pod, live_pods_on, set_cordoned,
    wait_for_available,
};
use node_manager_testkit::control_plane::world::{RealFunctionWorld, apply_manifest};
use node_manager_testkit::e2e::Target;
use node_manager_testkit::kube::AuditEvent;

const DRAINED: usize = 20;
const SURVIVORS: usize = 2;
const DEPLOYMENTS: usize = 4;
const REPLICAS: usize = 5;
const HOOK_USER: &str = "terminating-hook";

/// What the brownout's priority level does with a request that finds no free seat.
#[derive(Debug, Clone, Copy)]
enum LimitResponse {
    /// One queue of 8; what does not fit in it is rejected.
    Queue,
    /// No queue: rejected at once.
    Reject,
}

impl LimitResponse {
    fn yaml(self) -> &'static str {
        match self {
            Self::Queue => {
                "type: Queue
      queuing:
        queues: 1
        handSize: 1
        queueLengthLimit: 8"
            }
            Self::Reject => "type: Reject",
        }
    }
}

/// Three seats for the hook's user (6 shares of the 90 seats the flags give), nothing lent or
/// borrowed, and `limit`: what does not fit is rejected with 429 and `Retry-After`.
fn brownout_manifest(limit: LimitResponse) -> String {
    let limit = limit.yaml();
    format!(
        "apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata:
  name: brownout
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 6
    lendablePercent: 0
    borrowingLimitPercent: 0
    limitResponse:
      {limit}
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: brownout
spec:
  priorityLevelConfiguration:
    name: brownout
  matchingPrecedence: 100
  distinguisherMethod:
    type: ByUser
  rules:
  - subjects:
    - kind: User
      user:
        name: {HOOK_USER}
    resourceRules:
    - verbs: ['*']
      apiGroups: ['*']
      resources: ['*']
      namespaces: ['*']
      clusterScope: true
    nonResourceRules:
    - verbs: ['*']
      nonResourceURLs: ['*']
"
    )
}

/// The fewest pods of any Deployment available at once, sampled until stopped; `None`
/// until a sample was taken (no sample proves nothing, so it must not pass).
type Fewest = Arc<Mutex<Option<usize>>>;

fn sample_fewest(pods: Api<Pod>) -> (Fewest, tokio::task::JoinHandle<()>) {
    let fewest: Fewest = Arc::new(Mutex::new(None));
    let task = tokio::spawn({
        let fewest = fewest.clone();
        async move {
            loop {
                let by_app = available_by_app(&pods, "brownout=yes").await;
                if by_app.len() == DEPLOYMENTS
                    && let Some(least) = by_app.values().min()
                {
                    let mut fewest = fewest.lock().unwrap();
                    *fewest = Some(fewest.map_or(*least, |f| f.min(*least)));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    (fewest, task)
}

/// Four Deployments of five replicas (a PDB `maxUnavailable: 1` each) spread by the
/// scheduler over the nodes to drain, the survivors cordoned until every pod is Ready.
async fn seed_workload(admin: &kube::Client) {
    for d in 0..DEPLOYMENTS {
        GuardedDeployment {
            namespace: "default",
            app: &format!("web-{d}"),
            replicas: REPLICAS,
            grace_seconds: 1,
            labels: &[("brownout", "yes")],
            budget: true,
        }
        .create(admin)
        .await
        .unwrap();
    }
    wait_for_available(
        admin,
        ("default", "brownout=yes"),
        (DEPLOYMENTS, REPLICAS),
        true,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
}

/// The 429s the hook's user met: (rejected by the brownout, refused by a budget).
fn refusals(audit: &[AuditEvent]) -> (usize, usize) {
    let refused: Vec<&AuditEvent> = audit
        .iter()
        .filter(|e| e.user.username == HOOK_USER && e.code() == 429)
        .collect();
    let by_budget = refused
        .iter()
        .filter(|e| e.subresource() == "eviction" && e.response_status.message.contains("budget"))
        .count();
    (refused.len() - by_budget, by_budget)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_drains_at_once_complete_under_an_apf_brownout() {
    let Some(bin) = binaries_or_skip("twenty_drains_at_once_complete_under_an_apf_brownout") else {
        return;
    };
    twenty_drains_at_once(&bin, LimitResponse::Queue).await;
}

/// The same with no queue: every request that finds the three seats taken gets its 429 at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_drains_at_once_complete_under_a_rejecting_apf_brownout() {
    let Some(bin) =
        binaries_or_skip("twenty_drains_at_once_complete_under_a_rejecting_apf_brownout")
    else {
        return;
    };
    twenty_drains_at_once(&bin, LimitResponse::Reject).await;
}

async fn twenty_drains_at_once(bin: &std::path::Path, limit: LimitResponse) {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .processes(DRAINED)
        .apiserver_flag("--max-requests-inflight=60")
        .apiserver_flag("--max-mutating-requests-inflight=30")
        .env("SETTLE_SECONDS", "0.1")
        .env("EVICTION_BACKOFF_SECONDS", "0.2")
        .env("EVICTION_BACKOFF_MAX_SECONDS", "1")
        .env("DRAIN_TIMEOUT_SECONDS", "40")
        .log_level(match limit {
            LimitResponse::Queue => "warn",
            LimitResponse::Reject => "info",
        })
        .start(bin)
        .await
        .unwrap();
    let admin = w.plane.admin_client().await.unwrap();
    apply_manifest(&admin, &brownout_manifest(limit))
        .await
        .unwrap();
    let (instances, drained_nodes, survivors) = seed_nodes(&w).await;
    seed_workload(&admin).await;
    for node in &survivors {
        set_cordoned(&admin, node, false).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let seeded: BTreeSet<String> = pods
        .list(&kube::api::ListParams::default().labels("brownout=yes"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(seeded.len(), DEPLOYMENTS * REPLICAS);
    let (fewest, sampler) = sample_fewest(pods.clone());

    let (took, tried_again) = drain_all_at_once(&w, &instances).await;
    sampler.abort();
    let completions = w.aws.autoscaling().completions();
    let completed: BTreeSet<&str> = completions.iter().map(|c| c.instance_id.as_str()).collect();
    assert_eq!(completions.len(), DRAINED, "{completions:?}");
    assert_eq!(completed.len(), DRAINED, "{completions:?}");
    assert!(
        completions
            .iter()
            .all(|c| c.result == LifecycleActionResult::Continue)
    );
    let fewest = fewest
        .lock()
        .unwrap()
        .expect("the availability sampler took no sample: nothing was checked");
    assert!(
        fewest >= REPLICAS - 1,
        "a budget was broken: only {fewest} pods of a Deployment were available at one point"
    );
    // Every seeded pod left through one accepted eviction, and no drained node keeps one.
    let evicted = evictions_per_pod(&w.plane.audit(), HOOK_USER);
    for pod in &seeded {
        assert_eq!(evicted.get(pod), Some(&1), "{pod}: evictions {evicted:?}");
    }
    let left: Vec<String> = live_pods_on(&pods, "brownout=yes", &drained_nodes)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(left.is_empty(), "still on drained nodes: {left:?}");
    report(&w, took, tried_again);
}

/// The 20 instances to drain (the world's first) with their nodes, and the 2 survivors'
/// nodes (cordoned).
async fn seed_nodes(w: &RealFunctionWorld) -> (Vec<String>, BTreeSet<String>, Vec<String>) {
    let mut instances = vec![w.instance.clone()];
    let mut drained_nodes = BTreeSet::from([w.node.clone()]);
    for i in 1..DRAINED {
        let id = format!("i-0b1c2d3e4f50617{i:02}");
        drained_nodes.insert(w.add_instance(&id, "eu-west-1a", false).await.unwrap());
        instances.push(id);
    }
    let mut survivors = Vec::new();
    for i in 0..SURVIVORS {
        let id = format!("i-0fffeeeedddd111{i:02}");
        survivors.push(w.add_instance(&id, "eu-west-1a", true).await.unwrap());
    }
    (instances, drained_nodes, survivors)
}

/// Terminates every instance at once and answers each notification in its own process;
/// every invocation must complete its drain (none fails, none hands over: the brownout ends
/// long before an invocation's time). Returns how long they took together, and how many
/// steps the invocations tried again after the server throttled them past a request's bound.
async fn drain_all_at_once(w: &RealFunctionWorld, instances: &[String]) -> (Duration, usize) {
    let (took, answers) = w
        .scale_in_at_once(instances, Duration::from_secs(60))
        .await
        .unwrap();
    let mut tried_again = 0;
    for answer in answers {
        // Completed after a drain that emptied the node, not at its deadline.
        let summary = answer.summary().unwrap();
        assert!(
            summary.starts_with("completed CONTINUE (Drained,"),
            "{summary}\n{}",
            answer.output
        );
        tried_again += answer
            .output
            .matches("trying it again within the invocation")
            .count();
    }
    (took, tried_again)
}

fn report(w: &RealFunctionWorld, took: Duration, tried_again: usize) {
    let audit = w.plane.audit();
    let (brownout, budget) = refusals(&audit);
    assert!(
        brownout > 0,
        "the brownout rejected nothing: it did not bite"
    );
    let requests = audit
        .iter()
        .filter(|e| e.user.username == HOOK_USER)
        .count();
    let evictions = evictions_per_pod(&audit, HOOK_USER);
    println!(
        "{DRAINED} drains at once under the APF brownout: {took:?}, {requests} requests, {brownout} rejected by APF (429), {budget} evictions refused by a budget, {} pods evicted ({} evictions), {tried_again} steps throttled past a request's bound tried again, no invocation failed",
        evictions.len(),
        evictions.values().sum::<usize>(),
    );
}
