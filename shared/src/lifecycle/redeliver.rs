//! Terminating actions nobody drains: their notification was lost (Lambda's retries of a
//! failing invocation are finite, an SNS delivery can fail), or their drain stopped and its
//! hand-over never arrived. Auto Scaling keeps such an action waiting until its hook's
//! heartbeat timeout, then terminates the instance with its pods on it.
//!
//! The sweep (the terminating hook's schedule) asks Auto Scaling which terminating actions
//! wait in the cluster's groups, for hooks that notify this stack's topic (nothing else says
//! a hook is ours), and publishes each one nobody drains to that topic again, as Auto
//! Scaling would have: a fresh invocation drains it like any notification. Auto Scaling
//! lists no token, so the message names the action by its instance
//! ([`crate::lifecycle::notification::FOUND_WAITING_FIELD`]); the drain proves the action
//! pending by a heartbeat naming the instance before it writes anything, and completes it by
//! the instance. A drain of the same action found at work is left alone; one already
//! completed too (Auto Scaling moves on).

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::notification::found_waiting_message;
#[cfg(doc)]
use crate::aws::GroupActivity;
use crate::aws::{LifecycleActionRef, Notifications, WaitingTermination};
use crate::node_marks::checkpoint::DrainCheckpoint;
use crate::retry::{RetryPolicy, with_retries};

/// What became of one waiting action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redelivery {
    pub instance_id: String,
    /// `Redelivered`, or `Failed` when it could not be published (the next run tries again).
    pub outcome: &'static str,
    pub detail: String,
}

/// Why the waiting `action` is published again, or `None` when a drain of it is at work or
/// done. `record`: the lifecycle drain record on the instance's node, if any.
pub fn why_redeliver(
    action: &LifecycleActionRef,
    record: Option<&DrainCheckpoint>,
    now: Timestamp,
) -> Option<&'static str> {
    let Some(record) = record else {
        return Some("no drain of it started: its notification was lost or never handled");
    };
    if !record.serves(action) {
        return Some("the node's drain record is of an earlier action: this one was not handled");
    }
    // A lease let go at a hand-over keeps its time: the continuation it published has that
    // long to land before the action counts as abandoned.
    let at_work = now < record.lease.expires_at();
    if record.completed_at.is_some() || at_work {
        return None;
    }
    Some("its drain stopped and nobody resumed it (a hand-over or a retry was lost)")
}

/// Publishes to `topic_arn` every action of `waiting` (found by
/// [`crate::aws::GroupActivity::waiting_terminations`] for the hooks that notify it) that no
/// drain (`drains`, by instance) works on or finished. One failed publish is reported and
/// the others go on.
pub async fn redeliver_waiting<N: Notifications>(
    notifications: &N,
    topic_arn: &str,
    waiting: Vec<WaitingTermination>,
    drains: &BTreeMap<String, DrainCheckpoint>,
) -> Vec<Redelivery> {
    let now = Timestamp::now();
    let mut out = Vec::new();
    for found in waiting {
        let action = &found.action;
        let Some(why) = why_redeliver(action, drains.get(&action.instance_id), now) else {
            continue;
        };
        let message = found_waiting_message(action, &found.account_id, now, found.into_warm_pool);
        let published = with_retries(&RetryPolicy::AWS_CALL, || {
            notifications.publish(topic_arn, None, &message)
        })
        .await;
        out.push(report(action, why, published.err()));
    }
    out
}

fn report(
    action: &LifecycleActionRef,
    why: &str,
    failed: Option<crate::aws::AwsError>,
) -> Redelivery {
    let hook = &action.lifecycle_hook_name;
    let group = &action.auto_scaling_group_name;
    match failed {
        None => {
            tracing::warn!(step = "redelivered", instance_id = %action.instance_id, asg = %group, hook = %hook, why, "a terminating action waits and nobody drains it: published again");
            Redelivery {
                instance_id: action.instance_id.clone(),
                outcome: "Redelivered",
                detail: format!("terminating action of hook {hook} of {group}: {why}"),
            }
        }
        Some(error) => {
            tracing::error!(step = "redeliver_failed", instance_id = %action.instance_id, %error, "could not publish a waiting terminating action again: the next run tries");
            Redelivery {
                instance_id: action.instance_id.clone(),
                outcome: "Failed",
                detail: format!("publishing the waiting action of hook {hook}: {error}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn action(token: &str) -> LifecycleActionRef {
        LifecycleActionRef {
            auto_scaling_group_name: "asg".into(),
            lifecycle_hook_name: "Terminate-LC-Hook".into(),
            instance_id: "i-07e9ea9eb19a67337".into(),
            token: token.into(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::MIN)
    }

    fn record(token: &str, holder: Option<&str>, completed: bool) -> DrainCheckpoint {
        let mut record = DrainCheckpoint::start(
            &action(token),
            at(0),
            Duration::from_secs(900),
            "req-1",
            Duration::from_secs(60),
        );
        record.lease.holder = holder.map(str::to_owned);
        record.completed_at = completed.then(|| at(30));
        record
    }

    #[test]
    fn a_waiting_action_is_published_again_only_when_no_drain_works_on_it() {
        let waiting = action("");
        let cases = [
            (None, at(10), true),
            // A drain at work (its lease live), or done: left alone.
            (Some(record("t", Some("req-1"), false)), at(10), false),
            (Some(record("", Some("req-1"), false)), at(10), false),
            (Some(record("t", None, true)), at(10), true),
            // Its lease ran out, or it let go and its hand-over never came.
            (Some(record("t", Some("req-1"), false)), at(61), true),
            // Handed over: its continuation has the lease's time to land.
            (Some(record("t", None, false)), at(10), false),
            (Some(record("t", None, false)), at(61), true),
        ];
        for (found, now, published) in cases {
            let why = why_redeliver(&waiting, found.as_ref(), now);
            assert_eq!(why.is_some(), published, "{found:?} at {now}: {why:?}");
        }
    }
}
