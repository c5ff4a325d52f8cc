//! Instance refreshes end to end in the fake: batches and healthy capacity, skipped
//! matching instances, cancel, retention, events. A responder task plays the functions:
//! it lets each lifecycle action wait a little (so a whole batch waits together), counts
//! the group's in-service instances meanwhile, and completes the action.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use node_manager::aws::LifecycleActionResult;

use super::{FakeAutoScalingGroup, FakeLifecycleHook, FakeRefreshPreferences};
use super::{InstanceRefreshStatus, LifecycleTransition, operations};
use crate::account::FakeAccount;
use crate::aws::{EventPattern, FakeAws, InstanceState, lock};

pub(super) const GROUP: &str = "eks-nodes";
const END: Duration = Duration::from_secs(10);
/// How long the responder lets an action wait before completing it.
const HOLD: Duration = Duration::from_millis(40);

pub(super) async fn fake() -> FakeAws {
    FakeAws::start(FakeAccount::reference()).await.unwrap()
}

/// A group of `desired` in-service instances launched with template version 1, then moved
/// to version 2 (a node update); with both hooks when `hooks`. Returns the old instance ids.
pub(super) fn group(aws: &FakeAws, group: FakeAutoScalingGroup, hooks: bool) -> Vec<String> {
    let autoscaling = aws.autoscaling();
    let desired = group.desired_capacity;
    autoscaling.add_group(
        group
            .availability_zones(&["eu-west-1a", "eu-west-1b"])
            .launch_template("lt-0abc", "nodes", "1"),
    );
    if hooks {
        autoscaling
            .add_hook(GROUP, FakeLifecycleHook::launching("launch"))
            .unwrap();
        autoscaling
            .add_hook(GROUP, FakeLifecycleHook::terminating("terminate"))
            .unwrap();
    }
    let old: Vec<String> = (0..desired).map(|n| format!("i-0000000{n}")).collect();
    for id in &old {
        aws.ec2().add_running_instance(id);
        autoscaling.add_instance(GROUP, id, "eu-west-1a").unwrap();
    }
    autoscaling.set_launch_template_version(GROUP, "2").unwrap();
    old
}

pub(super) fn nodes(desired: u32) -> FakeAutoScalingGroup {
    FakeAutoScalingGroup::new(GROUP).size(0, desired, 10)
}

pub(super) fn in_service(aws: &FakeAws) -> Vec<String> {
    let state = lock(&aws.shared.autoscaling.state);
    state.groups[GROUP]
        .instances
        .iter()
        .filter(|(_, i)| i.lifecycle_state == "InService")
        .map(|(id, _)| id.clone())
        .collect()
}

type Decide = fn(LifecycleTransition) -> LifecycleActionResult;

/// The group's instances in one look: in service, launching (`Pending:Wait`) and
/// terminating (`Terminating:Wait`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    in_service: usize,
    launching: usize,
    terminating: usize,
}

/// Completes every lifecycle action of the group once it has waited `HOLD`, with the
/// result `decide` gives; returns what it saw, one sample per look.
pub(super) fn respond(aws: &FakeAws, decide: Decide) -> Arc<Mutex<Vec<Sample>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (shared, samples) = (Arc::clone(&aws.shared), Arc::clone(&seen));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let due: Vec<(String, String, LifecycleTransition)> = {
                let state = lock(&shared.autoscaling.state);
                let count = |wanted: &str| {
                    state.groups[GROUP]
                        .instances
                        .values()
                        .filter(|i| i.lifecycle_state == wanted)
                        .count()
                };
                lock(&samples).push(Sample {
                    in_service: count("InService"),
                    launching: count("Pending:Wait"),
                    terminating: count("Terminating:Wait"),
                });
                state
                    .active
                    .iter()
                    .filter(|a| a.started.elapsed() >= HOLD)
                    .map(|a| (a.hook_name.clone(), a.instance_id.clone(), a.transition))
                    .collect()
            };
            for (hook, instance, transition) in due {
                let params = [
                    ("AutoScalingGroupName", GROUP),
                    ("LifecycleHookName", hook.as_str()),
                    ("InstanceId", instance.as_str()),
                    ("LifecycleActionResult", decide(transition).as_str()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
                operations::dispatch(&shared, "CompleteLifecycleAction", &params).unwrap();
            }
        }
    });
    seen
}

fn always_continue(_: LifecycleTransition) -> LifecycleActionResult {
    LifecycleActionResult::Continue
}

fn first_completion(aws: &FakeAws) -> LifecycleTransition {
    aws.autoscaling().completions()[0].transition
}

#[tokio::test]
async fn launch_before_terminate_replaces_every_outdated_instance_above_capacity() {
    let aws = fake().await;
    let old = group(&aws, nodes(4).instance_maintenance_policy(100, 150), true);
    let launched = Arc::new(Mutex::new(Vec::new()));
    let terminated = Arc::new(Mutex::new(Vec::new()));
    let (l, t) = (Arc::clone(&launched), Arc::clone(&terminated));
    let autoscaling = aws.autoscaling();
    autoscaling.on_instance_launched(Arc::new(move |i| lock(&l).push(i.clone())));
    autoscaling.on_instance_terminated(Arc::new(move |id| lock(&t).push(id.to_owned())));
    let seen = respond(&aws, always_continue);

    let id = autoscaling
        .start_instance_refresh(GROUP, FakeRefreshPreferences::default())
        .unwrap();
    assert_eq!(
        autoscaling.wait_for_refresh_end(&id, END).await,
        Some(InstanceRefreshStatus::Successful)
    );

    let view = autoscaling.instance_refresh(&id).unwrap();
    assert_eq!(view.replaced_instance_ids, old, "oldest first, all of them");
    assert_eq!(view.launched_instance_ids.len(), 4);
    assert_eq!(
        (view.instances_to_update, view.percentage_complete),
        (4, 100)
    );
    assert_eq!(first_completion(&aws), LifecycleTransition::Launching);
    let mut now = in_service(&aws);
    now.sort();
    let mut new = view.launched_instance_ids.clone();
    new.sort();
    assert_eq!(now, new);
    let samples = lock(&seen).clone();
    assert!(samples.iter().all(|s| s.in_service >= 4), "{samples:?}");
    let most = |count: fn(&Sample) -> usize| samples.iter().map(count).max();
    // Batches of floor(4 × 150%) - 4 = 2, launched before any termination.
    assert_eq!(most(|s| s.launching), Some(2), "{samples:?}");
    assert_eq!(most(|s| s.terminating), Some(2), "{samples:?}");
    assert!(
        samples
            .iter()
            .all(|s| s.launching == 0 || s.terminating == 0),
        "{samples:?}"
    );
    let state = lock(&aws.shared.autoscaling.state);
    for instance in state.groups[GROUP].instances.values() {
        let template = instance.launch_template.as_ref().unwrap();
        assert_eq!(
            (template.id.as_str(), template.version.as_str()),
            ("lt-0abc", "2")
        );
    }
    drop(state);
    for id in &old {
        assert_eq!(
            aws.ec2().instance(id).unwrap().state,
            InstanceState::Terminated
        );
    }
    let zones: Vec<String> = lock(&launched)
        .iter()
        .map(|i| i.availability_zone.clone())
        .collect();
    assert!(zones.contains(&"eu-west-1a".to_owned()) && zones.contains(&"eu-west-1b".to_owned()));
    for instance in lock(&launched).iter() {
        let ec2 = aws.ec2().instance(&instance.instance_id).unwrap();
        assert_eq!(ec2.private_dns_name, instance.private_dns_name);
        assert_eq!(ec2.state, InstanceState::Running);
    }
    assert_eq!(*lock(&terminated), old);
}

#[tokio::test]
async fn terminate_first_keeps_the_minimum_healthy_percentage_in_service() {
    let aws = fake().await;
    let old = group(&aws, nodes(4), true);
    let seen = respond(&aws, always_continue);
    let autoscaling = aws.autoscaling();
    let id = autoscaling
        .start_instance_refresh(
            GROUP,
            FakeRefreshPreferences::default().healthy_percentage(50, 100),
        )
        .unwrap();
    assert_eq!(
        autoscaling.wait_for_refresh_end(&id, END).await,
        Some(InstanceRefreshStatus::Successful)
    );
    assert_eq!(first_completion(&aws), LifecycleTransition::Terminating);
    let samples = lock(&seen).clone();
    assert_eq!(
        samples.iter().map(|s| s.in_service).min(),
        Some(2),
        "ceil(4 × 50%) = 2: {samples:?}"
    );
    assert_eq!(
        autoscaling
            .instance_refresh(&id)
            .unwrap()
            .replaced_instance_ids,
        old
    );
    assert_eq!(in_service(&aws).len(), 4);
    assert!(in_service(&aws).iter().all(|id| !old.contains(id)));
}

#[tokio::test]
async fn skip_matching_leaves_instances_already_on_the_desired_template() {
    let aws = fake().await;
    let old = group(&aws, nodes(2), false);
    let autoscaling = aws.autoscaling();
    for id in ["i-00000010", "i-00000011"] {
        autoscaling.add_instance(GROUP, id, "eu-west-1b").unwrap();
    }
    let id = autoscaling
        .start_instance_refresh(GROUP, FakeRefreshPreferences::default().skip_matching(true))
        .unwrap();
    assert_eq!(
        autoscaling.wait_for_refresh_end(&id, END).await,
        Some(InstanceRefreshStatus::Successful)
    );
    let view = autoscaling.instance_refresh(&id).unwrap();
    assert_eq!(
        (view.instances_to_update, view.replaced_instance_ids),
        (2, old)
    );
    let now = in_service(&aws);
    assert!(now.contains(&"i-00000010".to_owned()) && now.contains(&"i-00000011".to_owned()));

    // Without SkipMatching (AWS's default) every instance is replaced.
    let again = autoscaling
        .start_instance_refresh(GROUP, FakeRefreshPreferences::default())
        .unwrap();
    autoscaling.wait_for_refresh_end(&again, END).await;
    assert_eq!(
        autoscaling
            .instance_refresh(&again)
            .unwrap()
            .instances_to_update,
        4
    );
}

#[tokio::test]
async fn a_cancelled_refresh_stops_after_the_batch_in_flight() {
    let aws = fake().await;
    let old = group(&aws, nodes(4), true);
    let autoscaling = aws.autoscaling();
    let id = autoscaling
        .start_instance_refresh(
            GROUP,
            FakeRefreshPreferences::default().healthy_percentage(50, 100),
        )
        .unwrap();
    // The first batch (two instances) waits in Terminating:Wait until the responder starts.
    for _ in 0..100 {
        if old
            .iter()
            .filter(|id| autoscaling.has_active_action(id))
            .count()
            == 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(autoscaling.cancel_instance_refresh(GROUP).unwrap(), id);
    assert_eq!(
        autoscaling.instance_refresh(&id).unwrap().status,
        InstanceRefreshStatus::Cancelling
    );
    respond(&aws, always_continue);
    assert_eq!(
        autoscaling.wait_for_refresh_end(&id, END).await,
        Some(InstanceRefreshStatus::Cancelled)
    );
    let view = autoscaling.instance_refresh(&id).unwrap();
    assert_eq!(view.replaced_instance_ids, old[..2]);
    assert_eq!(
        view.launched_instance_ids.len(),
        2,
        "the batch's replacements launch"
    );
    let now = in_service(&aws);
    assert_eq!(now.len(), 4);
    assert!(
        old[2..].iter().all(|id| now.contains(id)),
        "the rest stay: {now:?}"
    );
    assert!(autoscaling.cancel_instance_refresh(GROUP).is_err());
}

#[tokio::test]
async fn an_abandoned_termination_with_retention_keeps_the_instance_and_fails_the_refresh() {
    let aws = fake().await;
    let old = group(&aws, nodes(2).retain_on_abandon(true), true);
    respond(&aws, |transition| match transition {
        LifecycleTransition::Launching => LifecycleActionResult::Continue,
        LifecycleTransition::Terminating => LifecycleActionResult::Abandon,
    });
    let autoscaling = aws.autoscaling();
    let id = autoscaling
        .start_instance_refresh(
            GROUP,
            FakeRefreshPreferences::default().healthy_percentage(50, 100),
        )
        .unwrap();
    assert_eq!(
        autoscaling.wait_for_refresh_end(&id, END).await,
        Some(InstanceRefreshStatus::Failed)
    );
    let view = autoscaling.instance_refresh(&id).unwrap();
    assert_eq!(
        view.status_reason.as_deref(),
        Some(
            format!(
                "instance {} was retained: its terminating lifecycle action was abandoned",
                old[0]
            )
            .as_str()
        )
    );
    assert_eq!(autoscaling.retained_instances(GROUP), [old[0].clone()]);
    assert_eq!(
        aws.ec2().instance(&old[0]).unwrap().state,
        InstanceState::Running
    );
    assert_eq!(
        autoscaling.instance_state(GROUP, &old[1]).as_deref(),
        Some("InService")
    );
}

#[tokio::test]
async fn an_abandoned_launch_fails_the_refresh_naming_the_instance() {
    let aws = fake().await;
    group(&aws, nodes(2), true);
    respond(&aws, |_| LifecycleActionResult::Abandon);
    let autoscaling = aws.autoscaling();
    let id = autoscaling
        .start_instance_refresh(
            GROUP,
            FakeRefreshPreferences::default().healthy_percentage(100, 150),
        )
        .unwrap();
    assert_eq!(
        autoscaling.wait_for_refresh_end(&id, END).await,
        Some(InstanceRefreshStatus::Failed)
    );
    let view = autoscaling.instance_refresh(&id).unwrap();
    let reason = view.status_reason.unwrap();
    assert!(reason.contains(&view.launched_instance_ids[0]), "{reason}");
    assert!(view.replaced_instance_ids.is_empty());
}

#[tokio::test]
async fn refresh_events_go_to_eventbridge_started_then_each_instance_then_succeeded() {
    let aws = fake().await;
    group(&aws, nodes(1), false);
    let mut events = aws.eventbridge().subscribe(EventPattern {
        sources: vec!["aws.autoscaling".to_owned()],
        detail_types: Vec::new(),
    });
    let autoscaling = aws.autoscaling();
    let id = autoscaling
        .start_instance_refresh(GROUP, FakeRefreshPreferences::default())
        .unwrap();
    autoscaling.wait_for_refresh_end(&id, END).await;
    let arn = lock(&aws.shared.autoscaling.state).groups[GROUP]
        .arn
        .clone();
    let view = autoscaling.instance_refresh(&id).unwrap();
    let (old, new) = (
        &view.replaced_instance_ids[0],
        &view.launched_instance_ids[0],
    );
    let mut types = Vec::new();
    while let Some(event) = events.next_event(Duration::from_millis(50)).await {
        assert_eq!(event["resources"][0], arn.as_str());
        assert_eq!(event["detail"]["AutoScalingGroupName"], GROUP);
        let detail_type = event["detail-type"].as_str().unwrap().to_owned();
        if detail_type.starts_with("EC2 Instance ") {
            let instance = if detail_type.contains("Launch") {
                new
            } else {
                old
            };
            assert_eq!(event["detail"]["EC2InstanceId"], instance.as_str());
            assert!(
                event["resources"][1]
                    .as_str()
                    .unwrap()
                    .ends_with(instance.as_str())
            );
        } else {
            assert_eq!(event["detail"]["InstanceRefreshId"], id.as_str());
        }
        types.push(detail_type);
    }
    // Terminate first (Auto Scaling's default): the old instance leaves, then its
    // replacement comes in service.
    assert_eq!(
        types,
        [
            "EC2 Auto Scaling Instance Refresh Started",
            "EC2 Instance Terminate Successful",
            "EC2 Instance Launch Successful",
            "EC2 Auto Scaling Instance Refresh Succeeded"
        ]
    );
}
