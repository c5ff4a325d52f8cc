//! Pods annotated `karpenter.sh/do-not-disrupt: "true"`: never evicted, they hold the drain
//! until its deadline, where they are reported (or deleted with `DRAIN_FORCE`).

use super::*;
use node_manager::drain::plan::DO_NOT_DISRUPT_ANNOTATION;

const HELD: &str = "batch-0";

/// The reference cluster plus one running pod on the node that asks not to be disrupted.
async fn cluster_with_held_pod(force_group: bool) -> Scenario {
    let s = reference_cluster(force_group, 1).await;
    let mut pod = fixtures::running_pod("default", HELD, NODE, &[("app", "batch")]);
    pod.metadata.annotations =
        Some([(DO_NOT_DISRUPT_ANNOTATION.to_owned(), "true".to_owned())].into());
    if let Some(spec) = pod.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(1);
    }
    s.create(&pod);
    s
}

/// Every eviction request the function made for `name`, whatever the answer.
fn eviction_requests_for(s: &Scenario, name: &str) -> usize {
    s.server
        .audit()
        .subresource_requests("pods", "eviction")
        .iter()
        .filter(|e| e.user.username == "terminating-hook" && e.name() == name)
        .count()
}

#[tokio::test]
async fn a_do_not_disrupt_pod_is_never_evicted_and_fails_the_drain_at_its_deadline() {
    let s = cluster_with_held_pod(false).await;
    let drainer = s.drainer(&[("DRAIN_TIMEOUT_SECONDS", "4")]);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    let (result, stuck, _) = eviction_failure(&report);
    // The ordinary and the critical tiers were evicted around it; only the held pod is left.
    assert_eq!(
        stuck,
        &[format!(
            "default/{HELD} (do-not-disrupt: karpenter.sh/do-not-disrupt, never evicted)"
        )]
    );
    assert_eq!(result, LifecycleActionResult::Continue);
    completed_once(&s, LifecycleActionResult::Continue);
    let evicted = evicted_pod_names(&s);
    assert_eq!(
        evicted.iter().filter(|n| n.starts_with("nginx-")).count(),
        4,
        "{evicted:?}"
    );
    assert!(
        evicted.last().is_some_and(|n| n.starts_with("coredns-")),
        "{evicted:?}"
    );
    assert_eq!(eviction_requests_for(&s, HELD), 0);
    assert_eq!(s.running_pods_on(NODE, HELD), 1, "still running");
    assert!(s.function_requests().iter().all(|e| e.verb != "delete"));

    // Why the drain waited, while it waited, and at the deadline.
    let held = s.events_with_reason("DoNotDisrupt");
    assert_eq!(held.len(), 1, "{held:#?}");
    assert_eq!(held[0].type_.as_deref(), Some("Warning"));
    let note = held[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("default/{HELD}")) && note.contains("until the drain deadline"),
        "{note}"
    );
    let failure = s.events_with_reason("PodEvictionFailure");
    assert_eq!(failure.len(), 1);
    let note = failure[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("default/{HELD} (do-not-disrupt")),
        "{note}"
    );
}

#[tokio::test]
async fn with_force_a_do_not_disrupt_pod_is_deleted_at_the_deadline() {
    let s = cluster_with_held_pod(true).await;
    let drainer = s.drainer(&[("DRAIN_TIMEOUT_SECONDS", "4"), ("DRAIN_FORCE", "true")]);
    let report = drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap();
    let [
        DeliveryOutcome::Completed {
            drain: DrainEnd::Forced(deleted),
            ..
        },
    ] = report.outcomes.as_slice()
    else {
        panic!("{:?}", report.outcomes)
    };
    assert_eq!(deleted, &[format!("default/{HELD}")]);
    completed_once(&s, LifecycleActionResult::Continue);
    assert_eq!(eviction_requests_for(&s, HELD), 0, "deleted, never evicted");
    let deletes: Vec<AuditEvent> = s
        .function_requests()
        .into_iter()
        .filter(|e| e.verb == "delete" && e.resource() == "pods")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:#?}");
    assert_eq!(deletes[0].name(), HELD);
    assert!(
        s.pods_on(NODE)
            .iter()
            .all(|p| p.metadata.name.as_deref() != Some(HELD))
    );
}
