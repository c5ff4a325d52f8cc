//! The eviction arithmetic of the fake API server, checked against cases worked out from the
//! Kubernetes documentation ("Specifying a Disruption Budget for your Application",
//! "Disruptions", the `PodDisruptionBudgetSpec` API reference):
//! - integer and percentage `minAvailable` / `maxUnavailable`, percentages rounded up
//!   ("7 pods, minAvailable 50%: 4 pods must be available"; "maxUnavailable 30% of a single
//!   replica still allows disrupting it");
//! - unhealthy (not Ready) pods under `IfHealthyBudget` and `AlwaysAllow`;
//! - a pod covered by more than one PDB (500);
//! - an empty selector, which covers every pod of the namespace.
//!
//! Each case builds pods and one or more PDBs, lets the disruption controller logic compute
//! the status, then evicts pods one by one as `kubectl drain` would, re-running the
//! controller after each eviction, and compares the outcome with the documented one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use node_manager_testkit::kube::disruption::{ControllerScale, compute_pdb_status};
use node_manager_testkit::kube::eviction::{
    AllowedBecause, EvictionDecision, MULTIPLE_BUDGETS_MESSAGE, TOO_MANY_REQUESTS_MESSAGE,
    evaluate_eviction,
};

const NAMESPACE: &str = "shop";

/// A namespace with pods of ReplicaSets (one per app label) and PDBs, and a clock.
struct Namespace {
    pods: Vec<Pod>,
    pdbs: Vec<PodDisruptionBudget>,
    replicas: BTreeMap<String, i32>,
    now: Timestamp,
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Evicted(AllowedBecause),
    /// HTTP code and, for a 429, the cause message.
    Refused(u16, String),
}

impl Namespace {
    fn new() -> Self {
        Self {
            pods: Vec::new(),
            pdbs: Vec::new(),
            replicas: BTreeMap::new(),
            now: Timestamp::from_second(1_800_000_000).unwrap(),
        }
    }

    /// `ready` Ready pods and `unready` Running-but-not-Ready pods of app `app`, owned by a
    /// ReplicaSet whose desired scale is `ready + unready`.
    fn app(mut self, app: &str, ready: usize, unready: usize) -> Self {
        for index in 0..ready + unready {
            self.pods
                .push(pod(&format!("{app}-{index}"), app, index < ready));
        }
        self.replicas.insert(
            format!("uid-{app}"),
            i32::try_from(ready + unready).unwrap(),
        );
        self
    }

    fn pdb(mut self, name: &str, app: Option<&str>, budget: Budget) -> Self {
        self.pdbs.push(budget_for(name, app, budget));
        self
    }

    /// One sync of the disruption controller for every PDB.
    fn sync(&mut self) {
        let replicas = self.replicas.clone();
        let scale = move |reference: &OwnerReference| {
            replicas.get(&reference.uid).map(|n| ControllerScale {
                uid: reference.uid.clone(),
                replicas: *n,
            })
        };
        for index in 0..self.pdbs.len() {
            let update = compute_pdb_status(&self.pdbs[index], &self.pods, &scale, self.now);
            self.pdbs[index].status = Some(update.status);
        }
    }

    fn status(&self, pdb: &str) -> (i32, i32, i32, i32) {
        let pdb = self
            .pdbs
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(pdb))
            .unwrap();
        let s = pdb.status.as_ref().unwrap();
        (
            s.expected_pods,
            s.desired_healthy,
            s.current_healthy,
            s.disruptions_allowed,
        )
    }

    /// Evicts like the API server: the PDB write, then the pod is gone (its grace period
    /// over), then the controller catches up.
    fn evict(&mut self, name: &str) -> Outcome {
        let pod = self
            .pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .unwrap()
            .clone();
        self.now = self.now.checked_add(SignedDuration::from_secs(1)).unwrap();
        let outcome = match evaluate_eviction(&pod, name, &self.pdbs, self.now) {
            EvictionDecision::Allow(allowance) => {
                if let Some(spend) = allowance.budget_spend {
                    let pdb = self
                        .pdbs
                        .iter_mut()
                        .find(|p| p.metadata.name.as_deref() == Some(spend.pdb_name.as_str()))
                        .unwrap();
                    pdb.status = Some(spend.status);
                }
                self.pods
                    .retain(|p| p.metadata.name.as_deref() != Some(name));
                Outcome::Evicted(allowance.because)
            }
            EvictionDecision::Refuse(refusal) => {
                if refusal.code == 429 {
                    assert_eq!(refusal.message, TOO_MANY_REQUESTS_MESSAGE);
                    assert_eq!(refusal.causes[0].0, "DisruptionBudget");
                }
                if refusal.code == 500 {
                    assert_eq!(refusal.message, MULTIPLE_BUDGETS_MESSAGE);
                }
                let cause = refusal
                    .causes
                    .first()
                    .map(|(_, message)| message.clone())
                    .unwrap_or_default();
                Outcome::Refused(refusal.code, cause)
            }
        };
        self.sync();
        outcome
    }

    /// Evicts the named pods in order; returns how many were evicted before the first refusal.
    fn drain(&mut self, names: &[&str]) -> usize {
        names
            .iter()
            .take_while(|name| matches!(self.evict(name), Outcome::Evicted(_)))
            .count()
    }

    fn set_ready(&mut self, name: &str) {
        let pod = self
            .pods
            .iter_mut()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .unwrap();
        pod.status = Some(running_status(true));
        self.sync();
    }

    fn add_pod(&mut self, name: &str, app: &str, ready: bool) {
        self.pods.push(pod(name, app, ready));
        self.sync();
    }
}

#[derive(Clone)]
enum Budget {
    MinAvailable(IntOrString),
    MaxUnavailable(IntOrString),
    MinAvailableAlwaysAllow(IntOrString),
}

fn int(n: i32) -> IntOrString {
    IntOrString::Int(n)
}

fn percent(text: &str) -> IntOrString {
    IntOrString::String(text.to_owned())
}

fn running_status(ready: bool) -> PodStatus {
    PodStatus {
        phase: Some("Running".to_owned()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".to_owned(),
            status: if ready { "True" } else { "False" }.to_owned(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

fn pod(name: &str, app: &str, ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".to_owned(),
                kind: "ReplicaSet".to_owned(),
                name: app.to_owned(),
                uid: format!("uid-{app}"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        status: Some(running_status(ready)),
        ..Default::default()
    }
}

fn budget_for(name: &str, app: Option<&str>, budget: Budget) -> PodDisruptionBudget {
    let mut spec = PodDisruptionBudgetSpec {
        selector: Some(LabelSelector {
            match_labels: app.map(|app| BTreeMap::from([("app".to_owned(), app.to_owned())])),
            match_expressions: None,
        }),
        ..Default::default()
    };
    match budget {
        Budget::MinAvailable(value) => spec.min_available = Some(value),
        Budget::MaxUnavailable(value) => spec.max_unavailable = Some(value),
        Budget::MinAvailableAlwaysAllow(value) => {
            spec.min_available = Some(value);
            spec.unhealthy_pod_eviction_policy = Some("AlwaysAllow".to_owned());
        }
    }
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            generation: Some(1),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

fn names(app: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{app}-{i}")).collect()
}

/// (documented case, replicas, budget,
///  expected (expectedPods, desiredHealthy, currentHealthy, disruptionsAllowed),
///  evictions that succeed when draining every pod in turn)
type ArithmeticCase = (&'static str, usize, Budget, (i32, i32, i32, i32), usize);

#[test]
fn documented_budgets_allow_the_documented_number_of_evictions() {
    let cases: Vec<ArithmeticCase> = vec![
        // "if you have 7 Pods and you set minAvailable to "50%" ... Kubernetes rounds up ...
        // 4 Pods must be available."
        (
            "7 pods, minAvailable 50%",
            7,
            Budget::MinAvailable(percent("50%")),
            (7, 4, 7, 3),
            3,
        ),
        // "With a minAvailable of 5, evictions are allowed as long as they leave behind 5 or
        // more healthy pods."
        (
            "minAvailable 5 of 7",
            7,
            Budget::MinAvailable(int(5)),
            (7, 5, 7, 2),
            2,
        ),
        // "With a minAvailable of 30%, evictions are allowed as long as at least 30% of the
        // number of desired replicas are healthy." ceil(3.0) = 3 of 10.
        (
            "minAvailable 30% of 10",
            10,
            Budget::MinAvailable(percent("30%")),
            (10, 3, 10, 7),
            7,
        ),
        // ceil(0.3 * 7) = ceil(2.1) = 3 must stay.
        (
            "minAvailable 30% of 7",
            7,
            Budget::MinAvailable(percent("30%")),
            (7, 3, 7, 4),
            4,
        ),
        // "With a maxUnavailable of 5, evictions are allowed as long as there are at most 5
        // unhealthy replicas among the total number of desired replicas."
        (
            "maxUnavailable 5 of 10",
            10,
            Budget::MaxUnavailable(int(5)),
            (10, 5, 10, 5),
            5,
        ),
        // "With a maxUnavailable of 30%, evictions are allowed as long as the number of
        // unhealthy replicas does not exceed 30% of the total number of desired replicas
        // rounded up": ceil(0.3 * 10) = 3.
        (
            "maxUnavailable 30% of 10",
            10,
            Budget::MaxUnavailable(percent("30%")),
            (10, 7, 10, 3),
            3,
        ),
        // ceil(0.3 * 4) = ceil(1.2) = 2: "a disruption can exceed your defined maxUnavailable
        // percentage".
        (
            "maxUnavailable 30% of 4",
            4,
            Budget::MaxUnavailable(percent("30%")),
            (4, 2, 4, 2),
            2,
        ),
        // "If the total number of desired replicas is just one, that single replica is still
        // allowed for disruption, leading to an effective unavailability of 100%."
        (
            "maxUnavailable 30% of 1",
            1,
            Budget::MaxUnavailable(percent("30%")),
            (1, 0, 1, 1),
            1,
        ),
        // "you can prevent all voluntary evictions by specifying 100%" / "by specifying 0".
        (
            "minAvailable 100%",
            3,
            Budget::MinAvailable(percent("100%")),
            (3, 3, 3, 0),
            0,
        ),
        (
            "maxUnavailable 0",
            3,
            Budget::MaxUnavailable(int(0)),
            (3, 3, 3, 0),
            0,
        ),
        // A quorum of 3 (the ZooKeeper example): minAvailable 2 allows one at a time.
        (
            "zookeeper minAvailable 2 of 3",
            3,
            Budget::MinAvailable(int(2)),
            (3, 2, 3, 1),
            1,
        ),
        (
            "zookeeper maxUnavailable 1 of 3",
            3,
            Budget::MaxUnavailable(int(1)),
            (3, 2, 3, 1),
            1,
        ),
    ];
    for (name, replicas, budget, expected_status, expected_evictions) in cases {
        let mut namespace =
            Namespace::new()
                .app("web", replicas, 0)
                .pdb("web", Some("web"), budget);
        namespace.sync();
        assert_eq!(namespace.status("web"), expected_status, "{name}: status");
        let pods = names("web", replicas);
        let pods: Vec<&str> = pods.iter().map(String::as_str).collect();
        assert_eq!(
            namespace.drain(&pods),
            expected_evictions,
            "{name}: evictions"
        );
        // A drain stopped by the budget leaves exactly the desired number of healthy pods.
        if expected_evictions < replicas {
            let (_, desired, current, allowed) = namespace.status("web");
            assert_eq!(allowed, 0, "{name}: nothing left to spend");
            assert_eq!(current, desired, "{name}: healthy pods left");
        }
    }
}

/// The "Disruptions" walkthrough: a Deployment of 3 (pod-a on node-1, pod-b on node-2,
/// pod-c on node-3) with a PDB of minAvailable 2. Draining node-1 evicts pod-a; the
/// replacement pod-d is not Ready yet, so evicting pod-b blocks with a 429 until pod-d is
/// Ready, then succeeds.
#[test]
fn drain_walkthrough_blocks_until_the_replacement_is_ready() {
    let mut namespace = Namespace::new();
    for name in ["pod-a", "pod-b", "pod-c"] {
        namespace.pods.push(pod(name, "web", true));
    }
    namespace.replicas.insert("uid-web".to_owned(), 3);
    let mut namespace = namespace.pdb("web", Some("web"), Budget::MinAvailable(int(2)));
    namespace.sync();
    assert_eq!(namespace.status("web"), (3, 2, 3, 1));

    assert_eq!(
        namespace.evict("pod-a"),
        Outcome::Evicted(AllowedBecause::BudgetSpent)
    );
    namespace.add_pod("pod-d", "web", false);
    assert_eq!(namespace.status("web"), (3, 2, 2, 0));
    assert_eq!(
        namespace.evict("pod-b"),
        Outcome::Refused(
            429,
            "The disruption budget web needs 2 healthy pods and has 2 currently".to_owned()
        )
    );
    namespace.set_ready("pod-d");
    assert_eq!(namespace.status("web"), (3, 2, 3, 1));
    assert_eq!(
        namespace.evict("pod-b"),
        Outcome::Evicted(AllowedBecause::BudgetSpent)
    );
}

/// The same arithmetic seen from the eviction handler before the controller catches up:
/// the handler's own write (disruptionsAllowed - 1, disruptedPods) is what stops a second
/// eviction.
#[test]
fn the_handler_spends_its_own_budget_before_the_controller_syncs() {
    let mut namespace =
        Namespace::new()
            .app("web", 3, 0)
            .pdb("web", Some("web"), Budget::MinAvailable(int(2)));
    namespace.sync();
    let pod_a = namespace.pods[0].clone();
    let pod_b = namespace.pods[1].clone();
    let EvictionDecision::Allow(first) =
        evaluate_eviction(&pod_a, "web-0", &namespace.pdbs, namespace.now)
    else {
        panic!("first eviction allowed");
    };
    namespace.pdbs[0].status = Some(first.budget_spend.unwrap().status);
    let EvictionDecision::Refuse(second) =
        evaluate_eviction(&pod_b, "web-1", &namespace.pdbs, namespace.now)
    else {
        panic!("second eviction refused");
    };
    assert_eq!(second.code, 429);
    // Even if pod-a is never deleted, the controller keeps it out of currentHealthy while
    // the handler's promise (disruptedPods) holds.
    namespace.sync();
    assert_eq!(namespace.status("web"), (3, 2, 2, 0));
}

/// (documented case, ready, unready, budget, pod to evict, expected outcome)
type UnhealthyCase = (
    &'static str,
    usize,
    usize,
    Budget,
    &'static str,
    Result<AllowedBecause, u16>,
);

/// `unhealthyPodEvictionPolicy`: "IfHealthyBudget policy means that running pods, but not
/// yet healthy can be evicted only if the guarded application is not disrupted
/// (status.currentHealthy is at least equal to status.desiredHealthy)"; "AlwaysAllow ...
/// can be evicted regardless of whether the criteria in a PDB is met"; "Healthy pods will be
/// subject to the PDB for eviction."
#[test]
fn unhealthy_pods_follow_the_eviction_policy() {
    let cases: Vec<UnhealthyCase> = vec![
        (
            "IfHealthyBudget, application not disrupted: unready pod goes without spending",
            3,
            1,
            Budget::MinAvailable(int(3)),
            "web-3",
            Ok(AllowedBecause::UnhealthyPodWithinHealthyBudget),
        ),
        (
            "IfHealthyBudget, application disrupted: unready pod is protected",
            2,
            2,
            Budget::MinAvailable(int(3)),
            "web-3",
            Err(429),
        ),
        (
            "AlwaysAllow, application disrupted: unready pod goes anyway",
            2,
            2,
            Budget::MinAvailableAlwaysAllow(int(3)),
            "web-3",
            Ok(AllowedBecause::UnhealthyPodAlwaysAllowed),
        ),
        (
            "AlwaysAllow: a healthy pod is still subject to the budget",
            2,
            2,
            Budget::MinAvailableAlwaysAllow(int(3)),
            "web-0",
            Err(429),
        ),
        (
            "IfHealthyBudget, percentage: 4 of 5 Ready, minAvailable 80% (4): unready pod goes",
            4,
            1,
            Budget::MinAvailable(percent("80%")),
            "web-4",
            Ok(AllowedBecause::UnhealthyPodWithinHealthyBudget),
        ),
        (
            "maxUnavailable 1, one unready: healthy pod blocked (it would make two)",
            2,
            1,
            Budget::MaxUnavailable(int(1)),
            "web-0",
            Err(429),
        ),
        (
            "maxUnavailable 1, one unready: the unready pod itself goes",
            2,
            1,
            Budget::MaxUnavailable(int(1)),
            "web-2",
            Ok(AllowedBecause::UnhealthyPodWithinHealthyBudget),
        ),
    ];
    for (name, ready, unready, budget, victim, expected) in cases {
        let mut namespace =
            Namespace::new()
                .app("web", ready, unready)
                .pdb("web", Some("web"), budget);
        namespace.sync();
        let before = namespace.status("web");
        let outcome = namespace.evict(victim);
        match (outcome, expected) {
            (Outcome::Evicted(why), Ok(expected)) => {
                assert_eq!(why, expected, "{name}");
                if why != AllowedBecause::BudgetSpent {
                    // An unhealthy pod's eviction does not spend the budget.
                    assert_eq!(namespace.status("web").3, before.3, "{name}");
                }
            }
            (Outcome::Refused(code, _), Err(expected)) => assert_eq!(code, expected, "{name}"),
            (outcome, expected) => panic!("{name}: expected {expected:?}, got {outcome:?}"),
        }
    }
}

/// "The eviction subresource does not support" a pod covered by several budgets (500),
/// whatever the budgets allow; pods covered by only one of them are evicted normally.
#[test]
fn a_pod_covered_by_two_budgets_cannot_be_evicted() {
    let mut namespace = Namespace::new()
        .app("web", 3, 0)
        .app("db", 2, 0)
        .pdb("web", Some("web"), Budget::MaxUnavailable(int(3)))
        .pdb("everything", None, Budget::MaxUnavailable(int(5)));
    namespace.sync();
    assert_eq!(
        namespace.evict("web-0"),
        Outcome::Refused(500, String::new())
    );
    let mut namespace = Namespace::new()
        .app("web", 3, 0)
        .app("db", 2, 0)
        .pdb("web", Some("web"), Budget::MaxUnavailable(int(3)))
        .pdb("db", Some("db"), Budget::MaxUnavailable(int(1)));
    namespace.sync();
    assert_eq!(
        namespace.evict("db-0"),
        Outcome::Evicted(AllowedBecause::BudgetSpent)
    );
}

/// policy/v1: "An empty selector matches all pods in this namespace": one budget then
/// protects the pods of every app together, counting each ReplicaSet's scale once.
#[test]
fn an_empty_selector_budget_covers_the_whole_namespace() {
    let mut namespace = Namespace::new().app("web", 3, 0).app("db", 2, 0).pdb(
        "everything",
        None,
        Budget::MinAvailable(percent("60%")),
    );
    namespace.sync();
    // expected = 3 + 2 = 5; desired = ceil(0.6 * 5) = 3; healthy = 5; allowed = 2.
    assert_eq!(namespace.status("everything"), (5, 3, 5, 2));
    assert_eq!(namespace.drain(&["db-0", "web-0", "web-1"]), 2);
    assert_eq!(
        namespace.evict("db-1"),
        Outcome::Refused(
            429,
            "The disruption budget everything needs 3 healthy pods and has 3 currently".to_owned()
        )
    );
    // Pods of another namespace are not covered.
    let mut other = pod("web-x", "web", true);
    other.metadata.namespace = Some("other".to_owned());
    assert!(matches!(
        evaluate_eviction(&other, "web-x", &namespace.pdbs, namespace.now),
        EvictionDecision::Allow(allowance) if allowance.because == AllowedBecause::NoBudget
    ));
    // A pod already being deleted is not checked against the budget at all.
    let mut leaving = namespace.pods[0].clone();
    leaving.metadata.deletion_timestamp = Some(Time(namespace.now));
    let name = leaving.metadata.name.clone().unwrap();
    assert!(matches!(
        evaluate_eviction(&leaving, &name, &namespace.pdbs, namespace.now),
        EvictionDecision::Allow(allowance) if allowance.because == AllowedBecause::PodNotRunning
    ));
}
