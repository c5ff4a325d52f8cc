//! Instance retention: the instance lifecycle policy keeps an instance whose terminating
//! lifecycle action ends ABANDON (by call or by timeout); without it, or on CONTINUE, the
//! instance terminates as before.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use node_manager::aws::LifecycleActionResult;

use super::refresh_tests::{GROUP, fake};
use super::{FakeAutoScalingGroup, FakeLifecycleHook, operations};
use crate::aws::{FakeAws, InstanceState, lock};

const INSTANCE: &str = "i-0123456789abcdef0";

/// A group with one in-service instance and a terminating hook, which starts its action.
fn terminating(aws: &FakeAws, retain: Option<bool>, default_result: LifecycleActionResult) {
    let mut group = FakeAutoScalingGroup::new(GROUP).size(0, 1, 2);
    if let Some(retain) = retain {
        group = group.retain_on_abandon(retain);
    }
    let autoscaling = aws.autoscaling();
    autoscaling.set_time_scale(0.001);
    autoscaling.add_group(group);
    autoscaling
        .add_hook(
            GROUP,
            FakeLifecycleHook::terminating("terminate")
                .heartbeat_timeout(Duration::from_secs(30))
                .default_result(default_result),
        )
        .unwrap();
    aws.ec2().add_running_instance(INSTANCE);
    autoscaling
        .add_instance(GROUP, INSTANCE, "eu-west-1a")
        .unwrap();
    autoscaling.terminate_instance(GROUP, INSTANCE).unwrap();
}

fn complete(aws: &FakeAws, result: LifecycleActionResult) {
    let params = [
        ("AutoScalingGroupName", GROUP),
        ("LifecycleHookName", "terminate"),
        ("InstanceId", INSTANCE),
        ("LifecycleActionResult", result.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    operations::dispatch(&aws.shared, "CompleteLifecycleAction", &params).unwrap();
}

fn ec2_state(aws: &FakeAws) -> InstanceState {
    aws.ec2().instance(INSTANCE).unwrap().state
}

#[tokio::test]
async fn an_abandoned_termination_is_retained_when_the_policy_says_retain() {
    let aws = fake().await;
    terminating(&aws, Some(true), LifecycleActionResult::Continue);
    complete(&aws, LifecycleActionResult::Abandon);
    let autoscaling = aws.autoscaling();
    assert_eq!(
        autoscaling.instance_state(GROUP, INSTANCE).as_deref(),
        Some("Terminating:Retained")
    );
    assert_eq!(autoscaling.retained_instances(GROUP), [INSTANCE]);
    assert_eq!(ec2_state(&aws), InstanceState::Running);
}

#[tokio::test]
async fn a_timed_out_termination_defaulting_to_abandon_is_retained() {
    let aws = fake().await;
    terminating(&aws, Some(true), LifecycleActionResult::Abandon);
    let autoscaling = aws.autoscaling();
    let completion = autoscaling
        .wait_for_completion(INSTANCE, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(completion.result, LifecycleActionResult::Abandon);
    assert_eq!(autoscaling.retained_instances(GROUP), [INSTANCE]);
    assert_eq!(ec2_state(&aws), InstanceState::Running);
}

#[tokio::test]
async fn without_retention_an_abandoned_termination_still_terminates() {
    for retain in [None, Some(false)] {
        let aws = fake().await;
        let terminated = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&terminated);
        aws.autoscaling()
            .on_instance_terminated(Arc::new(move |id| lock(&seen).push(id.to_owned())));
        terminating(&aws, retain, LifecycleActionResult::Continue);
        complete(&aws, LifecycleActionResult::Abandon);
        assert_eq!(aws.autoscaling().instance_state(GROUP, INSTANCE), None);
        assert!(aws.autoscaling().retained_instances(GROUP).is_empty());
        assert_eq!(ec2_state(&aws), InstanceState::Terminated);
        assert_eq!(*lock(&terminated), [INSTANCE], "{retain:?}");
    }
}

#[tokio::test]
async fn retention_does_not_apply_to_a_continued_termination() {
    let aws = fake().await;
    terminating(&aws, Some(true), LifecycleActionResult::Continue);
    complete(&aws, LifecycleActionResult::Continue);
    assert_eq!(aws.autoscaling().instance_state(GROUP, INSTANCE), None);
    assert_eq!(ec2_state(&aws), InstanceState::Terminated);
}
