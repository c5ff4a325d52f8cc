//! Each kind of instance notice's rules, in one table ([`rules`]): whether its drain is
//! involuntary for the pods, which of the instance's facts the reconciler asks AWS for to
//! learn again whether the notice stands, and whether it does. A new kind is one entry here
//! (and its variant of [`NoticeKind`]); how a notice is confirmed before anything is done
//! depends on what its event carries and stays with the event
//! (`instance_notice::handler`).

use jiff::Timestamp;

use super::desired::{AwsFacts, Policy, leaving};
use crate::aws::{ScheduledInstanceEvent, marked_for_interruption};
use crate::node_marks::checkpoint::{InstanceNotice, NoticeKind};

/// Whether a notice stands: `Ok(Ok(()))` AWS still reports what it announced, `Ok(Err(why))`
/// it no longer does, `Err(why)` AWS could not be asked this time.
pub type Stands = Result<Result<(), String>, String>;

/// What one kind of notice means.
pub struct KindRules {
    /// Whether AWS takes the instance whatever the pods ask, so pods annotated
    /// `karpenter.sh/do-not-disrupt` are evicted like the others.
    pub involuntary: fn(&InstanceNotice) -> bool,
    /// Whether the reconciler asks for the instance's Spot request status.
    pub needs_spot_status: bool,
    /// Whether the reconciler asks for the instance's scheduled events.
    pub needs_schedule: bool,
    /// Whether the notice stands, from the instance's facts (its EC2 state and group
    /// lifecycle state are always asked; the rule is applied only once EC2 answered).
    pub stands: fn(&InstanceNotice, &AwsFacts, &Policy, Timestamp) -> Stands,
}

/// The rules of `kind`.
pub fn rules(kind: NoticeKind) -> &'static KindRules {
    match kind {
        NoticeKind::SpotInterruption => &SPOT_INTERRUPTION,
        NoticeKind::InstanceStopping => &INSTANCE_STOPPING,
        NoticeKind::ScheduledMaintenance => &SCHEDULED_MAINTENANCE,
        NoticeKind::RebalanceRecommendation => &REBALANCE_RECOMMENDATION,
    }
}

/// `EC2 Spot Instance Interruption Warning`: EC2 takes the instance in two minutes; the
/// notice stands while the Spot request is marked for interruption or the instance no longer
/// runs.
const SPOT_INTERRUPTION: KindRules = KindRules {
    involuntary: always,
    needs_spot_status: true,
    needs_schedule: false,
    stands: spot_interruption_stands,
};

/// `EC2 Instance State-change Notification` (stopping, shutting down): stands while the
/// instance is not running again.
const INSTANCE_STOPPING: KindRules = KindRules {
    involuntary: always,
    needs_spot_status: false,
    needs_schedule: false,
    stands: stopping_stands,
};

/// An AWS Health scheduled change: stands while EC2 lists its own event as pending;
/// involuntary unless the event neither stops nor restarts the instance (network
/// maintenance).
const SCHEDULED_MAINTENANCE: KindRules = KindRules {
    involuntary: maintenance_involuntary,
    needs_spot_status: false,
    needs_schedule: true,
    stands: maintenance_stands,
};

/// `EC2 Instance Rebalance Recommendation`: only advice (the instance stays until Auto
/// Scaling replaces it, if ever), so voluntary; stands for `REBALANCE_UNDO_SECONDS`, then
/// only while an interruption or a termination followed.
const REBALANCE_RECOMMENDATION: KindRules = KindRules {
    involuntary: never,
    needs_spot_status: true,
    needs_schedule: false,
    stands: rebalance_stands,
};

fn always(_: &InstanceNotice) -> bool {
    true
}

fn never(_: &InstanceNotice) -> bool {
    false
}

/// A scheduled retirement, stop, reboot or power maintenance takes the instance down; a
/// record without its event (written by an earlier release) is taken for one that does.
fn maintenance_involuntary(notice: &InstanceNotice) -> bool {
    notice
        .scheduled_event
        .as_ref()
        .is_none_or(|event| event.effect().involuntary())
}

/// The instance's EC2 state, `unknown` when EC2 does not say.
fn instance_state(facts: &AwsFacts) -> Result<String, String> {
    Ok(facts
        .instance
        .known()?
        .as_ref()
        .and_then(|i| i.state.clone())
        .unwrap_or_else(|| "unknown".to_owned()))
}

fn spot_interruption_stands(
    _: &InstanceNotice,
    facts: &AwsFacts,
    _: &Policy,
    _: Timestamp,
) -> Stands {
    let state = instance_state(facts)?;
    Ok(match facts.spot_status.known()? {
        Some(status) if marked_for_interruption(status) => Ok(()),
        _ if state != "running" => Ok(()),
        status => Err(format!(
            "the Spot request is {}, no longer marked for interruption",
            status.as_deref().unwrap_or("unknown")
        )),
    })
}

fn stopping_stands(_: &InstanceNotice, facts: &AwsFacts, _: &Policy, _: Timestamp) -> Stands {
    let state = instance_state(facts)?;
    Ok(match state.as_str() {
        "running" | "pending" => Err(format!("the instance is {state} again")),
        _ => Ok(()),
    })
}

/// A maintenance drain's reason is its own EC2 event: it stands while EC2 lists that event
/// as pending, whatever other events the instance has (an unrelated event must not keep the
/// node out of service, nor the end of one end a drain for another). A record written before
/// the event was kept stands while any event is pending.
fn maintenance_stands(
    notice: &InstanceNotice,
    facts: &AwsFacts,
    _: &Policy,
    _: Timestamp,
) -> Stands {
    let scheduled = facts.scheduled.known()?;
    let pending = match &notice.scheduled_event {
        Some(event) => event
            .find_pending(scheduled, notice.instance_ends_at)
            .is_some(),
        None => scheduled.iter().any(ScheduledInstanceEvent::is_pending),
    };
    if pending {
        return Ok(Ok(()));
    }
    Ok(Err(match &notice.scheduled_event {
        Some(event) => format!(
            "EC2 no longer lists {} {} as pending: completed or cancelled",
            event.code,
            event.id.as_deref().unwrap_or("(no id)")
        ),
        None => "EC2 lists no pending scheduled event: completed or cancelled".to_owned(),
    }))
}

/// EC2 has no call that reads a recommendation again, and AWS documents that an
/// interruption may never follow one: it stands for `REBALANCE_UNDO_SECONDS`, then only an
/// interruption (the Spot request marked) or a termination keeps the node out.
fn rebalance_stands(
    notice: &InstanceNotice,
    facts: &AwsFacts,
    policy: &Policy,
    now: Timestamp,
) -> Stands {
    let until = notice
        .received_at
        .checked_add(policy.rebalance_undo)
        .unwrap_or(Timestamp::MAX);
    let interrupted = facts
        .spot_status
        .known()?
        .as_deref()
        .is_some_and(marked_for_interruption);
    Ok(if now < until || interrupted || leaving(facts)? {
        Ok(())
    } else {
        Err(format!(
            "no interruption or termination followed the rebalance recommendation by {until}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::aws::InstanceFacts;
    use crate::reconcile::desired::Fact;

    const KINDS: [NoticeKind; 4] = [
        NoticeKind::SpotInterruption,
        NoticeKind::InstanceStopping,
        NoticeKind::ScheduledMaintenance,
        NoticeKind::RebalanceRecommendation,
    ];

    /// A kind's rule reads only the facts the table has the reconciler ask for: with a fact
    /// not asked (`Unknown`), its answer is "could not be asked" exactly when the table says
    /// the kind needs that fact.
    #[test]
    fn each_kind_asks_for_the_facts_its_rule_reads() {
        let policy = Policy {
            maintenance_margin: Duration::from_secs(900),
            rebalance_undo: Duration::from_secs(600),
        };
        let received_at = Timestamp::UNIX_EPOCH;
        let now = Timestamp::from_second(86_400).unwrap_or(Timestamp::MAX);
        let running = Fact::Known(Some(InstanceFacts {
            state: Some("running".into()),
            ..InstanceFacts::default()
        }));
        let why = "not asked".to_owned();
        for kind in KINDS {
            let rule = rules(kind);
            let notice = InstanceNotice {
                kind,
                received_at,
                instance_ends_at: None,
                cordon_only: false,
                scheduled_event: None,
            };
            let without_spot = AwsFacts {
                instance: running.clone(),
                spot_status: Fact::Unknown(why.clone()),
                ..AwsFacts::default()
            };
            let without_schedule = AwsFacts {
                instance: running.clone(),
                scheduled: Fact::Unknown(why.clone()),
                ..AwsFacts::default()
            };
            let asked = |facts: &AwsFacts| (rule.stands)(&notice, facts, &policy, now).is_ok();
            assert_eq!(!asked(&without_spot), rule.needs_spot_status, "{kind:?}");
            assert_eq!(!asked(&without_schedule), rule.needs_schedule, "{kind:?}");
        }
    }
}
