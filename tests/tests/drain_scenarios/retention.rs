//! A drain that fails (pods left at its deadline) under `DRAIN_TIMEOUT_RESULT=RETAIN` or
//! `ABANDON`: the completion follows the group's instance retention, and the reports say
//! whether the instance and its node are kept.

use super::*;
use node_manager::aws::AwsErrorKind;

/// The only PodEvictionFailure Event's note.
fn eviction_failure_note(s: &Scenario) -> String {
    let failure = s.events_with_reason("PodEvictionFailure");
    assert_eq!(failure.len(), 1, "{failure:#?}");
    failure[0].note.clone().unwrap_or_default()
}

/// The drain of the blocked cluster with a 2 s deadline and `timeout_result`.
async fn failed_drain(s: &Scenario, timeout_result: &str) -> DrainReport {
    let drainer = s.drainer(&[
        ("DRAIN_TIMEOUT_SECONDS", "2"),
        ("DRAIN_TIMEOUT_RESULT", timeout_result),
    ]);
    drain_terminating(&drainer, "req-1", Duration::from_secs(60))
        .await
        .unwrap()
}

fn completed_as(report: &DrainReport) -> (LifecycleActionResult, InstanceFate) {
    let (result, stuck, instance) = eviction_failure(report);
    assert_eq!(stuck.len(), 5, "{stuck:?}");
    (result, instance)
}

#[tokio::test]
async fn retain_on_a_retaining_group_abandons_and_keeps_the_node_cordoned() {
    let s = blocked_cluster(false).await;
    s.autoscaling.set_retains_abandoned_instances(GROUP, true);
    let report = failed_drain(&s, "RETAIN").await;
    assert_eq!(
        completed_as(&report),
        (LifecycleActionResult::Abandon, InstanceFate::Retained)
    );
    assert!(
        report.records[0].summary.contains("instance retained"),
        "{:?}",
        report.records
    );
    completed_once(&s, LifecycleActionResult::Abandon);
    let note = eviction_failure_note(&s);
    for expected in [
        "default/nginx-",
        "Completing the lifecycle action with ABANDON",
        &format!("group {GROUP} retains abandoned instances"),
        &format!("instance {INSTANCE} and this node are kept (Terminating:Retained)"),
        "TerminateInstanceInAutoScalingGroup",
    ] {
        assert!(note.contains(expected), "{expected:?} missing from {note}");
    }
    // The node stays as the drain left it, for inspection: cordoned, its pods still there,
    // and the completion on its checkpoint (a redelivery finds the drain done).
    let node = s.server.store().find::<Node>("", NODE).unwrap();
    assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(s.running_pods_on(NODE, "nginx-"), 4);
    assert!(s.checkpoint().unwrap().completed_at.is_some());
    let completed = s.events_with_reason("LifecycleActionCompleted");
    let completed_note = completed[0].note.clone().unwrap_or_default();
    assert!(
        completed_note.contains("ABANDON") && completed_note.contains("kept"),
        "{completed_note}"
    );
}

#[tokio::test]
async fn retain_on_a_group_that_does_not_retain_continues() {
    let s = blocked_cluster(false).await;
    s.autoscaling.set_retains_abandoned_instances(GROUP, false);
    let report = failed_drain(&s, "RETAIN").await;
    assert_eq!(
        completed_as(&report),
        (LifecycleActionResult::Continue, InstanceFate::Terminates)
    );
    completed_once(&s, LifecycleActionResult::Continue);
    let note = eviction_failure_note(&s);
    assert!(
        note.contains("Completing the lifecycle action with CONTINUE")
            && note.contains(&format!(
                "group {GROUP} does not retain abandoned instances"
            ))
            && note.contains(&format!("instance {INSTANCE} terminates")),
        "{note}"
    );
}

#[tokio::test]
async fn retain_abandons_when_the_group_cannot_be_read() {
    let s = blocked_cluster(false).await;
    s.autoscaling.set_retains_abandoned_instances(GROUP, true);
    let drainer = s.drainer(&[
        ("DRAIN_TIMEOUT_SECONDS", "2"),
        ("DRAIN_TIMEOUT_RESULT", "RETAIN"),
    ]);
    // DescribeAutoScalingGroups fails once the drain is under way (the scope check before it
    // reads the group too): at the deadline the retention cannot be read.
    let drain = drain_terminating(&drainer, "req-1", Duration::from_secs(60));
    let break_describe = async {
        s.wait_until("the drain started", || s.checkpoint().is_some())
            .await;
        s.autoscaling
            .faults
            .fail("DescribeAutoScalingGroups", AwsErrorKind::AccessDenied, 100);
    };
    let (report, ()) = tokio::join!(drain, break_describe);
    let report = report.unwrap();
    // Unknown retention: ABANDON, which keeps the instance where the group retains (as
    // here) and terminates it like CONTINUE where it does not.
    assert_eq!(
        completed_as(&report),
        (LifecycleActionResult::Abandon, InstanceFate::Unknown)
    );
    completed_once(&s, LifecycleActionResult::Abandon);
    let note = eviction_failure_note(&s);
    assert!(
        note.contains("Completing the lifecycle action with ABANDON")
            && note.contains("could not be read")
            && note.contains("AccessDenied")
            && note.contains("kept if the group retains abandoned instances"),
        "{note}"
    );
}

#[tokio::test]
async fn abandon_says_whether_the_instance_is_kept() {
    let s = blocked_cluster(false).await;
    let report = failed_drain(&s, "ABANDON").await;
    assert_eq!(
        completed_as(&report),
        (LifecycleActionResult::Abandon, InstanceFate::Terminates)
    );
    completed_once(&s, LifecycleActionResult::Abandon);
    let note = eviction_failure_note(&s);
    assert!(
        note.contains("Completing the lifecycle action with ABANDON")
            && note.contains(&format!("instance {INSTANCE} terminates")),
        "{note}"
    );
}
