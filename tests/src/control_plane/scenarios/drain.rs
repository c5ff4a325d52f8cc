//! The lifecycle drain: a node of a group with a terminating hook is scaled in while the
//! `nginx` Deployment with a PDB runs on it; the built `terminating-hook` drains it through
//! the real eviction API (the budget refusing with 429 in waves), the real ReplicaSet
//! controller recreates the evicted pods and kube-scheduler puts them on the other node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use node_manager::aws::LifecycleActionResult;
use serde_json::Value;

use super::nginx::{AvailabilityWatch, OTHER_NODE, REPLICAS, seed_nginx, wait_for_pods};
use super::{Played, QUICK_DRAIN, next_notification, response};
use crate::control_plane::ControlPlaneError;
use crate::control_plane::workload::{evictions_per_pod, writes_of};
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::{GROUP, Target};
use crate::kube::AuditEvent;

/// How long into the drain it first says what it waits for.
const BLOCKED_REPORT_SECONDS: &str = "2";

/// The label's name as sent (not the code's constant: a typo there must show here).
const EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

pub async fn play(bin: &Path) -> Result<Played, ControlPlaneError> {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .envs(&QUICK_DRAIN)
        // Say what the drain waits for while the budget paces it (its waves take seconds).
        .env("DRAIN_BLOCKED_REPORT_SECONDS", BLOCKED_REPORT_SECONDS)
        .start(bin)
        .await?;
    let mut played = Played::on(&w);
    played.line(format!("its memory (kB): {:?}", w.plane.memory_kib()));
    let admin = w.plane.admin_client().await?;
    let seeded = seed_nginx(&w, &admin, 5).await?;
    played.line(format!(
        "{REPLICAS} replicas Ready on {}; {OTHER_NODE} opened",
        w.node
    ));
    let watch = AvailabilityWatch::start(admin.clone());
    let mut topic = w.aws.sns().subscribe(&w.topic).map_err(setup)?;
    played.line(format!("scale-in of {} (node {})", w.instance, w.node));
    w.aws
        .autoscaling()
        .terminate_instance(GROUP, &w.instance)
        .map_err(setup)?;
    let event = next_notification(&mut topic).await?;
    let started = Instant::now();
    let answer = response(w.function(Target::TerminatingHook), &event).await?;
    let took = started.elapsed();
    watch.expect_budget_held(&mut played);
    played.expect(
        "the terminating hook answered Completed",
        answer["records"][0]["outcome"] == "Completed",
        &answer,
    );
    let completions = w.aws.autoscaling().completions();
    played.expect(
        "the lifecycle action completed once, with CONTINUE, for the scaled-in instance",
        completions.len() == 1
            && completions[0].result == LifecycleActionResult::Continue
            && completions[0].instance_id == w.instance,
        format!("{completions:?}"),
    );
    expect_the_drain_trail(&mut played, &w.plane.audit(), &seeded, took);
    expect_it_said_why_it_waited(&mut played, &admin, &w.node).await;
    let moved = wait_for_pods(
        &admin,
        "the replicas Ready on the other node",
        Duration::from_secs(20),
        |pods| pods.len() == REPLICAS && pods.iter().all(|p| p.ready && p.node == OTHER_NODE),
    )
    .await;
    played.expect(
        "the ReplicaSet controller recreated every pod and kube-scheduler put it on the other node",
        moved.is_ok(),
        moved.err().map(|e| e.to_string()).unwrap_or_default(),
    );
    Ok(played)
}

/// The `DrainBlocked` Event on the node, written through the real events API under the
/// shipped RBAC: it names pods of the node and, for each, the budget that refused it (with
/// what its status allowed) or that it is terminating. (Which one depends on the moment:
/// the real disruption controller counts a replacement Ready on the other node, so two
/// seconds in, the evicted pods are often all still terminating, their 5 s grace periods
/// running, while the budget held.)
async fn expect_it_said_why_it_waited(played: &mut Played, admin: &kube::Client, node: &str) {
    use k8s_openapi::api::events::v1::Event;
    let events: kube::Api<Event> = kube::Api::all(admin.clone());
    let notes: Vec<String> = events
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DrainBlocked"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .filter_map(|e| e.note)
        .collect();
    if let Some(note) = notes.first() {
        played.line(format!("DrainBlocked: {note}"));
    }
    let explained = |note: &str| {
        let Some((_, pods)) = note.split_once("pod(s): ") else {
            return false;
        };
        pods.split("; ").all(|pod| {
            pod.starts_with("default/nginx-")
                && (pod.ends_with(" (terminating)")
                    || pod.contains(" (PodDisruptionBudget nginx allows "))
        })
    };
    played.expect(
        "after 2 s the drain said what it waited for: each nginx pod, held by budget nginx or terminating",
        !notes.is_empty() && notes.iter().all(|n| explained(n)),
        format!("{notes:?}"),
    );
}

/// From the audit log: the node labelled and cordoned before the first eviction, evictions
/// only (never a pod deletion), each seeded pod evicted exactly once; prints the drain's time
/// and requests.
fn expect_the_drain_trail(
    played: &mut Played,
    audit: &[AuditEvent],
    seeded: &BTreeSet<String>,
    took: Duration,
) {
    let user = RealFunctionWorld::username(Target::TerminatingHook);
    let writes = writes_of(audit, user);
    let trail = writes
        .iter()
        .map(AuditEvent::line)
        .collect::<Vec<_>>()
        .join("\n");
    let label = node_patch(&writes, |p| {
        p["metadata"]["labels"][EXCLUDE_FROM_LB] == "true"
    });
    let cordon = node_patch(&writes, |p| p["spec"]["unschedulable"] == true);
    let first_eviction = writes.iter().position(|e| e.subresource() == "eviction");
    played.expect(
        "the node labelled and cordoned before the first eviction",
        matches!((label, cordon, first_eviction), (Some(l), Some(c), Some(e)) if l < e && c < e),
        format!("label at {label:?}, cordon at {cordon:?}, first eviction at {first_eviction:?}:\n{trail}"),
    );
    played.expect(
        "evictions only: the drain deleted no pod",
        !writes
            .iter()
            .any(|e| e.verb == "delete" && e.resource() == "pods"),
        &trail,
    );
    let evicted = evictions_per_pod(audit, user);
    played.expect(
        "every pod of the node evicted exactly once (the budget's 429s retried)",
        evicted.keys().eq(seeded.iter()) && evicted.values().all(|n| *n == 1),
        format!("accepted evictions per pod {evicted:?}, seeded {seeded:?}:\n{trail}"),
    );
    let requests: BTreeMap<&str, usize> =
        audit
            .iter()
            .filter(|e| e.user.username == user)
            .fold(BTreeMap::new(), |mut counts, e| {
                *counts.entry(e.audit_id.as_str()).or_default() += 1;
                counts
            });
    let refused = writes
        .iter()
        .filter(|e| e.subresource() == "eviction" && e.code() == 429)
        .count();
    played.line(format!(
        "drain on the real control plane: {:.2} s, {} requests ({refused} evictions refused by the budget)",
        took.as_secs_f64(),
        requests.len()
    ));
}

fn node_patch(writes: &[AuditEvent], sets: impl Fn(&Value) -> bool) -> Option<usize> {
    writes.iter().position(|e| {
        e.resource() == "nodes"
            && e.verb == "patch"
            && (200..300).contains(&e.code())
            && e.request_object.as_ref().is_some_and(&sets)
    })
}

fn setup(error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::setup("the drain scenario", error)
}
