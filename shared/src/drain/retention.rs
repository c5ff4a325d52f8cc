//! How a failed drain's lifecycle action is completed, and what becomes of the instance.
//!
//! A drain fails when pods are left at its deadline. `DRAIN_TIMEOUT_RESULT` picks the result;
//! whether the instance is then kept depends on its group: Auto Scaling keeps an instance
//! whose terminating action ends ABANDON (state `Terminating:Retained`, outside the desired
//! capacity) only when the group's instance lifecycle policy says
//! `RetentionTriggers.TerminateHookAbandon: retain`. With `RETAIN` the drain asks the group
//! first and completes with ABANDON only when the instance (and its cordoned node) will be
//! kept for inspection, with CONTINUE when the group says it does not retain, and with ABANDON
//! when the group cannot be read (never worse: ABANDON terminates like CONTINUE where the
//! group does not retain); with `ABANDON` it asks too, so the report says what really happens.

use std::time::Duration;

use crate::aws::{AutoScaling, LifecycleActionRef, LifecycleActionResult};
use crate::lifecycle::settings::DrainTimeoutResult;

/// How long the deadline waits for Auto Scaling to say whether the group retains abandoned
/// instances: the answer sits between the deadline and the completion, so a hung call must
/// not hold the lifecycle action (the SDK's own retries are inside this bound).
pub const RETENTION_LOOKUP_BOUND: Duration = Duration::from_secs(5);

/// What becomes of the instance once the lifecycle action is completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceFate {
    /// The instance terminates (CONTINUE, or ABANDON on a group that does not retain).
    Terminates,
    /// ABANDON on a group that retains abandoned instances: instance and node are kept.
    Retained,
    /// ABANDON, but the group's retention could not be read: kept if the group retains.
    Unknown,
}

impl InstanceFate {
    /// For logs, metrics and the Lambda response.
    pub fn label(self) -> &'static str {
        match self {
            Self::Terminates => "Terminates",
            Self::Retained => "Retained",
            Self::Unknown => "RetentionUnknown",
        }
    }
}

/// The completion of a failed drain: the result sent, the instance's fate, and the sentence
/// the reports end with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedDrainCompletion {
    pub result: LifecycleActionResult,
    pub fate: InstanceFate,
    /// "Completing the lifecycle action with ...", with why the instance stays or goes.
    pub sentence: String,
}

/// What the group's retention lookup came to.
enum Retention {
    Retains,
    DoesNotRetain,
    GroupUnknown,
    Unreadable(String),
}

/// Decides how a failed drain of `action`'s instance is completed under `setting`, asking
/// Auto Scaling (within `bound`, [`RETENTION_LOOKUP_BOUND`] in the drain) whether the group
/// retains abandoned instances when the answer matters.
pub async fn complete_failed_drain(
    setting: DrainTimeoutResult,
    autoscaling: &impl AutoScaling,
    action: &LifecycleActionRef,
    bound: Duration,
) -> FailedDrainCompletion {
    if setting == DrainTimeoutResult::Continue {
        // CONTINUE never retains: nothing to ask.
        return FailedDrainCompletion {
            result: LifecycleActionResult::Continue,
            fate: InstanceFate::Terminates,
            sentence: "Completing the lifecycle action with CONTINUE.".to_owned(),
        };
    }
    let group = &action.auto_scaling_group_name;
    let lookup = tokio::time::timeout(bound, autoscaling.retains_abandoned_instances(group)).await;
    let retention = match lookup {
        Ok(Ok(Some(true))) => Retention::Retains,
        Ok(Ok(Some(false))) => Retention::DoesNotRetain,
        Ok(Ok(None)) => Retention::GroupUnknown,
        Ok(Err(error)) => Retention::Unreadable(error.to_string()),
        Err(_) => Retention::Unreadable(format!(
            "DescribeAutoScalingGroups got no answer within {} ms",
            bound.as_millis()
        )),
    };
    if let Retention::Unreadable(error) = &retention {
        tracing::warn!(step = "retention_unknown", asg = %group, %error, setting = setting.as_str(), "could not read whether the group retains abandoned instances");
    }
    decide(setting, retention, group, &action.instance_id)
}

fn decide(
    setting: DrainTimeoutResult,
    retention: Retention,
    group: &str,
    instance_id: &str,
) -> FailedDrainCompletion {
    let kept = || FailedDrainCompletion {
        result: LifecycleActionResult::Abandon,
        fate: InstanceFate::Retained,
        sentence: format!(
            "Completing the lifecycle action with ABANDON: group {group} retains abandoned instances, so instance {instance_id} and this node are kept (Terminating:Retained) for you to inspect; terminate it with TerminateInstanceInAutoScalingGroup when done."
        ),
    };
    let why_not = match &retention {
        Retention::Retains => return kept(),
        Retention::DoesNotRetain => format!(
            "group {group} does not retain abandoned instances (its InstanceLifecyclePolicy lacks RetentionTriggers.TerminateHookAbandon: retain)"
        ),
        Retention::GroupUnknown => format!("Auto Scaling does not know group {group}"),
        Retention::Unreadable(error) => {
            format!("whether group {group} retains abandoned instances could not be read ({error})")
        }
    };
    match (setting, retention) {
        // Unknown retention completes ABANDON for RETAIN as for ABANDON: where the group
        // retains, the instance is kept as asked; where it does not, ABANDON terminates it
        // exactly as CONTINUE would. CONTINUE could only lose the instance RETAIN keeps.
        (DrainTimeoutResult::Abandon | DrainTimeoutResult::Retain, Retention::Unreadable(_)) => {
            FailedDrainCompletion {
                result: LifecycleActionResult::Abandon,
                fate: InstanceFate::Unknown,
                sentence: format!(
                    "Completing the lifecycle action with ABANDON: {why_not}; instance {instance_id} is kept if the group retains abandoned instances, terminated otherwise."
                ),
            }
        }
        (DrainTimeoutResult::Abandon, _) => FailedDrainCompletion {
            result: LifecycleActionResult::Abandon,
            fate: InstanceFate::Terminates,
            sentence: format!(
                "Completing the lifecycle action with ABANDON: {why_not}, so instance {instance_id} terminates."
            ),
        },
        // RETAIN that cannot retain completes as CONTINUE: an ABANDON would only end the
        // instance the same way while reporting a failure to Auto Scaling.
        _ => FailedDrainCompletion {
            result: LifecycleActionResult::Continue,
            fate: InstanceFate::Terminates,
            sentence: format!(
                "Completing the lifecycle action with CONTINUE (DRAIN_TIMEOUT_RESULT is RETAIN, but {why_not}), so instance {instance_id} terminates."
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::aws::AwsErrorKind;
    use crate::aws::in_memory::InMemoryAutoScaling;

    fn action() -> LifecycleActionRef {
        LifecycleActionRef {
            auto_scaling_group_name: "asg".into(),
            lifecycle_hook_name: "hook".into(),
            instance_id: "i-1".into(),
            token: "t".into(),
        }
    }

    async fn completion(
        setting: DrainTimeoutResult,
        retains: Option<bool>,
        fault: bool,
    ) -> FailedDrainCompletion {
        let autoscaling = InMemoryAutoScaling::new();
        if let Some(retains) = retains {
            autoscaling.add_group("asg", &[]);
            autoscaling.set_retains_abandoned_instances("asg", retains);
        }
        if fault {
            autoscaling
                .faults
                .fail("DescribeAutoScalingGroups", AwsErrorKind::AccessDenied, 1);
        }
        complete_failed_drain(setting, &autoscaling, &action(), RETENTION_LOOKUP_BOUND).await
    }

    #[tokio::test]
    async fn retain_abandons_only_where_the_group_keeps_the_instance() {
        use DrainTimeoutResult::*;
        use InstanceFate::*;
        use LifecycleActionResult as R;
        for (setting, retains, fault, result, fate) in [
            (Retain, Some(true), false, R::Abandon, Retained),
            (Retain, Some(false), false, R::Continue, Terminates),
            (Retain, None, false, R::Continue, Terminates),
            (Retain, Some(true), true, R::Abandon, Unknown),
            (Abandon, Some(true), false, R::Abandon, Retained),
            (Abandon, Some(false), false, R::Abandon, Terminates),
            (Abandon, Some(true), true, R::Abandon, Unknown),
            (Continue, Some(true), false, R::Continue, Terminates),
        ] {
            let done = completion(setting, retains, fault).await;
            assert_eq!(
                (done.result, done.fate),
                (result, fate),
                "{setting:?} {retains:?} {fault}: {}",
                done.sentence
            );
            assert!(
                done.sentence.starts_with(&format!(
                    "Completing the lifecycle action with {}",
                    result.as_str()
                )),
                "{}",
                done.sentence
            );
        }
        let kept = completion(Retain, Some(true), false).await.sentence;
        assert!(
            kept.contains("i-1") && kept.contains("Terminating:Retained"),
            "{kept}"
        );
        let failed = completion(Retain, Some(true), true).await.sentence;
        assert!(failed.contains("could not be read"), "{failed}");
    }

    #[tokio::test]
    async fn a_lookup_without_answer_is_given_up_on() {
        struct Hung;
        impl AutoScaling for Hung {
            async fn complete_lifecycle_action(
                &self,
                _: &LifecycleActionRef,
                _: LifecycleActionResult,
            ) -> Result<crate::aws::CompletionOutcome, crate::aws::AwsError> {
                unreachable!()
            }
            async fn record_lifecycle_action_heartbeat(
                &self,
                _: &LifecycleActionRef,
            ) -> Result<crate::aws::HeartbeatOutcome, crate::aws::AwsError> {
                unreachable!()
            }
            async fn describe_lifecycle_hook(
                &self,
                _: &str,
                _: &str,
            ) -> Result<Option<crate::aws::LifecycleHook>, crate::aws::AwsError> {
                unreachable!()
            }
            async fn group_tags(
                &self,
                _: &str,
            ) -> Result<Option<std::collections::BTreeMap<String, String>>, crate::aws::AwsError>
            {
                unreachable!()
            }
            async fn retains_abandoned_instances(
                &self,
                _: &str,
            ) -> Result<Option<bool>, crate::aws::AwsError> {
                std::future::pending().await
            }
        }
        let bound = Duration::from_millis(50);
        let done = complete_failed_drain(DrainTimeoutResult::Retain, &Hung, &action(), bound).await;
        assert_eq!(
            (done.result, done.fate),
            (LifecycleActionResult::Abandon, InstanceFate::Unknown)
        );
        assert!(done.sentence.contains("no answer"), "{}", done.sentence);
    }
}
