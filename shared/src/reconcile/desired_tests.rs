#![allow(clippy::unwrap_used)]
use super::*;
use crate::node_marks::checkpoint::{OutOfService, notice_action};
use crate::node_marks::maintenance::ScheduledEventRef;

const INSTANCE: &str = "i-0a1b2c3d4e5f60718";
const REFRESH: &str = "c613620e-07e2-4ed2-a9e2-ef8258911ade";
const POLICY: Policy = Policy {
    maintenance_margin: Duration::from_secs(3600),
    rebalance_undo: Duration::from_secs(1800),
};

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).unwrap()
}

fn marks() -> NodeMarks {
    NodeMarks {
        node: "ip-10-0-1-17.eu-west-1.compute.internal".into(),
        instance_id: Some(INSTANCE.into()),
        checkpoint: None,
        refresh: None,
        maintenance: None,
        shutdown: None,
        labelled: true,
        ready: true,
    }
}

fn running(spot: bool) -> AwsFacts {
    AwsFacts {
        instance: Fact::Known(Some(InstanceFacts {
            state: Some("running".into()),
            auto_scaling_group: Some("ng".into()),
            spot_request_id: spot.then(|| "sir-1".to_owned()),
            private_dns_name: None,
        })),
        lifecycle_state: Fact::Known(Some("InService".into())),
        ..AwsFacts::default()
    }
}

fn refresh_marks() -> RefreshMarks {
    RefreshMarks {
        instance_refresh_id: REFRESH.into(),
        auto_scaling_group_name: "ng".into(),
        instance_id: INSTANCE.into(),
        marked_at: at(0),
        out_of_service: OutOfService {
            labelled: true,
            cordoned: true,
            taint: None,
        },
        outdated_only: false,
    }
}

/// A notice drain's record as the drain leaves it when its invocation runs out of time:
/// lease released, not completed.
fn notice_record(kind: NoticeKind, cordon_only: bool, deadline: i64) -> DrainCheckpoint {
    let mut checkpoint = DrainCheckpoint::start(
        &notice_action("ng", INSTANCE),
        at(0),
        Duration::ZERO,
        "req-1",
        Duration::from_secs(60),
    );
    checkpoint.deadline = at(deadline);
    checkpoint.notice = Some(InstanceNotice {
        kind,
        received_at: at(0),
        instance_ends_at: (kind != NoticeKind::RebalanceRecommendation).then(|| at(deadline)),
        cordon_only,
        scheduled_event: None,
    });
    checkpoint.out_of_service = Some(OutOfService {
        labelled: true,
        cordoned: true,
        taint: None,
    });
    checkpoint.released(at(10))
}

fn plan(starts_at: i64) -> MaintenanceRecord {
    MaintenanceRecord {
        type_code: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".into(),
        instance_id: INSTANCE.into(),
        auto_scaling_group_name: "ng".into(),
        starts_at: at(starts_at),
        drain_from: at(starts_at - 3600),
        event: None,
    }
}

fn scheduled(not_before: i64, description: &str) -> ScheduledInstanceEvent {
    ScheduledInstanceEvent {
        id: None,
        code: "instance-retirement".into(),
        not_before: Some(at(not_before)),
        description: description.into(),
    }
}

fn names(actions: &[Action]) -> Vec<&'static str> {
    actions.iter().map(Action::name).collect()
}

// Item 5: a refresh's marks go once Auto Scaling no longer reports the refresh running.

#[test]
fn refresh_marks_stay_while_the_refresh_runs_and_go_when_it_ended_or_is_unknown() {
    let node = NodeMarks {
        refresh: Some(refresh_marks()),
        ..marks()
    };
    for status in ["Pending", "InProgress", "Cancelling", "Baking"] {
        let facts = AwsFacts {
            refresh_status: Fact::Known(Some(status.into())),
            ..running(false)
        };
        assert_eq!(desired(&node, &facts, &POLICY, at(100)), vec![], "{status}");
    }
    // Issue #43 item 5: this test used to keep the marks through `RollbackInProgress`. A
    // rollback keeps exactly the outdated instances and replaces the new ones, so a lost
    // `Rollback Started` kept the nodes that stay cordoned for the whole rollback.
    for status in [
        "RollbackInProgress",
        "Successful",
        "Failed",
        "Cancelled",
        "RollbackSuccessful",
        "RollbackFailed",
    ] {
        let facts = AwsFacts {
            refresh_status: Fact::Known(Some(status.into())),
            ..running(false)
        };
        let actions = desired(&node, &facts, &POLICY, at(100));
        assert_eq!(
            actions,
            vec![Action::RemoveRefreshMarks {
                refresh_id: REFRESH.into(),
                why: format!("instance refresh {REFRESH} is {status}"),
            }]
        );
    }
    let gone = AwsFacts {
        refresh_status: Fact::Known(None),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &gone, &POLICY, at(100))),
        ["RefreshMarksRemoved"]
    );
    let unanswered = AwsFacts {
        refresh_status: Fact::Unknown("DescribeInstanceRefreshes timed out".into()),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &unanswered, &POLICY, at(100))),
        ["Unchecked"],
        "no answer removes nothing"
    );
}

// Item 6: a rebalance cordon is not undone under a refresh that still runs.

#[test]
fn an_expired_rebalance_cordon_is_kept_while_a_refresh_of_the_node_runs() {
    let node = NodeMarks {
        checkpoint: Some(notice_record(
            NoticeKind::RebalanceRecommendation,
            true,
            1800,
        )),
        refresh: Some(refresh_marks()),
        ..marks()
    };
    let refreshing = AwsFacts {
        refresh_status: Fact::Known(Some("InProgress".into())),
        ..running(true)
    };
    assert_eq!(desired(&node, &refreshing, &POLICY, at(2000)), vec![]);
    let ended = AwsFacts {
        refresh_status: Fact::Known(Some("Successful".into())),
        ..running(true)
    };
    assert_eq!(
        names(&desired(&node, &ended, &POLICY, at(2000))),
        ["RefreshMarksRemoved", "RebalanceCordonUndone"]
    );
}

#[test]
fn a_refresh_that_only_marked_the_node_outdated_keeps_no_rebalance_cordon() {
    let node = NodeMarks {
        checkpoint: Some(notice_record(
            NoticeKind::RebalanceRecommendation,
            true,
            1800,
        )),
        refresh: Some(RefreshMarks {
            outdated_only: true,
            out_of_service: OutOfService::default(),
            ..refresh_marks()
        }),
        ..marks()
    };
    let refreshing = AwsFacts {
        refresh_status: Fact::Known(Some("InProgress".into())),
        ..running(true)
    };
    assert_eq!(
        names(&desired(&node, &refreshing, &POLICY, at(2000))),
        ["RebalanceCordonUndone"],
        "the refresh did not cordon the node: the expired rebalance cordon goes"
    );
}

#[test]
fn a_rebalance_cordon_is_undone_after_its_time_unless_the_instance_is_leaving() {
    let node = NodeMarks {
        checkpoint: Some(notice_record(
            NoticeKind::RebalanceRecommendation,
            true,
            1800,
        )),
        ..marks()
    };
    assert_eq!(desired(&node, &running(true), &POLICY, at(1799)), vec![]);
    assert_eq!(
        names(&desired(&node, &running(true), &POLICY, at(1800))),
        ["RebalanceCordonUndone"]
    );
    let terminating = AwsFacts {
        lifecycle_state: Fact::Known(Some("Terminating:Wait".into())),
        ..running(true)
    };
    assert_eq!(desired(&node, &terminating, &POLICY, at(1800)), vec![]);
    let stopped = AwsFacts {
        instance: Fact::Known(Some(InstanceFacts {
            state: Some("stopped".into()),
            ..InstanceFacts::default()
        })),
        ..running(true)
    };
    assert_eq!(desired(&node, &stopped, &POLICY, at(1800)), vec![]);
    let unanswered = AwsFacts {
        lifecycle_state: Fact::Unknown("throttled".into()),
        ..running(true)
    };
    assert_eq!(
        names(&desired(&node, &unanswered, &POLICY, at(1800))),
        ["Unchecked"]
    );
}

// Item 3: a notice drain its invocation abandoned is resumed while its reason stands.

#[test]
fn an_abandoned_spot_drain_is_resumed_until_its_deadline_while_the_request_is_marked() {
    let record = notice_record(NoticeKind::SpotInterruption, false, 120);
    let node = NodeMarks {
        checkpoint: Some(record.clone()),
        ..marks()
    };
    let marked = AwsFacts {
        spot_status: Fact::Known(Some("marked-for-termination".into())),
        ..running(true)
    };
    assert_eq!(
        desired(&node, &marked, &POLICY, at(60)),
        vec![Action::ResumeNoticeDrain {
            notice: record.notice.clone().unwrap(),
            group: "ng".into(),
            instance_id: INSTANCE.into(),
            deadline: at(120),
        }]
    );
    assert_eq!(
        desired(&node, &marked, &POLICY, at(120)),
        vec![],
        "past its deadline"
    );
    // Someone runs it: nothing to do.
    let held = NodeMarks {
        checkpoint: Some(record.renewed("req-2", at(50), Duration::from_secs(60))),
        ..marks()
    };
    assert_eq!(desired(&held, &marked, &POLICY, at(60)), vec![]);
    // Completed: not resumed.
    let mut done = record.clone();
    done.completed_at = Some(at(40));
    let completed = NodeMarks {
        checkpoint: Some(done),
        ..marks()
    };
    assert_eq!(desired(&completed, &marked, &POLICY, at(60)), vec![]);
    // EC2 no longer marks the request while the instance runs on: undone.
    let fulfilled = AwsFacts {
        spot_status: Fact::Known(Some("fulfilled".into())),
        ..running(true)
    };
    assert_eq!(
        names(&desired(&node, &fulfilled, &POLICY, at(60))),
        ["NoticeDrainUndone"]
    );
    // The instance is gone: its node goes with it.
    let gone = AwsFacts {
        instance: Fact::Known(None),
        ..marked
    };
    assert_eq!(desired(&node, &gone, &POLICY, at(60)), vec![]);
}

#[test]
fn an_abandoned_maintenance_drain_resumes_while_the_event_is_pending() {
    let node = NodeMarks {
        checkpoint: Some(notice_record(NoticeKind::ScheduledMaintenance, false, 900)),
        ..marks()
    };
    let pending = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(
            900,
            "The instance is running on degraded hardware",
        )]),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &pending, &POLICY, at(100))),
        ["NoticeDrainResumed"]
    );
    let cancelled = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(
            900,
            "[Canceled] The instance is running on degraded hardware",
        )]),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &cancelled, &POLICY, at(100))),
        ["NoticeDrainUndone"]
    );
}

/// A lifecycle drain's record as the drain leaves it once it completed its action.
fn lifecycle_record() -> DrainCheckpoint {
    let action = crate::aws::LifecycleActionRef {
        auto_scaling_group_name: "ng".into(),
        lifecycle_hook_name: "hook".into(),
        instance_id: INSTANCE.into(),
        token: "t".into(),
    };
    let mut record = DrainCheckpoint::start(
        &action,
        at(0),
        Duration::from_secs(900),
        "req-1",
        Duration::from_secs(60),
    )
    .released(at(10));
    record.out_of_service = Some(OutOfService {
        labelled: true,
        cordoned: true,
        taint: None,
    });
    record
}

#[test]
fn a_lifecycle_drain_record_stays_while_its_action_can_be_pending() {
    let mut record = lifecycle_record();
    record.notice = Some(InstanceNotice {
        kind: NoticeKind::SpotInterruption,
        received_at: at(0),
        instance_ends_at: Some(at(120)),
        cordon_only: false,
        scheduled_event: None,
    });
    let node = NodeMarks {
        checkpoint: Some(record),
        ..marks()
    };
    for state in [
        "Terminating:Wait",
        "Terminating:Proceed",
        "Terminating:Retained",
        "Warmed:Pending:Wait",
        "Warmed:Stopped",
        "Pending:Wait",
    ] {
        let facts = AwsFacts {
            lifecycle_state: Fact::Known(Some(state.into())),
            ..running(true)
        };
        assert_eq!(desired(&node, &facts, &POLICY, at(60)), vec![], "{state}");
    }
    let unanswered = AwsFacts {
        lifecycle_state: Fact::Unknown("throttled".into()),
        ..running(true)
    };
    assert_eq!(
        names(&desired(&node, &unanswered, &POLICY, at(60))),
        ["Unchecked"]
    );
}

// Issue #43 item 1. This test used to assert that a lifecycle record is never the
// reconciler's (`a_lifecycle_drain_record_is_its_actions_not_the_reconcilers`): a node back
// from the warm pool whose launch was lost then stayed cordoned for good.
#[test]
fn a_lifecycle_drain_record_goes_once_auto_scaling_put_the_instance_back_in_service() {
    let mut record = lifecycle_record();
    record.to_warm_pool_at = Some(at(30));
    let node = NodeMarks {
        checkpoint: Some(record.clone()),
        ..marks()
    };
    let actions = desired(&node, &running(false), &POLICY, at(600));
    assert_eq!(names(&actions), ["LifecycleDrainUndone"]);
    let Action::UndoDrainRecord { record: undone, .. } = &actions[0] else {
        unreachable!()
    };
    assert_eq!(**undone, record, "exactly the record decided on");

    // This asserted that a node not Ready keeps the record. The launching hook ends it at
    // its launch timeout with `CONTINUE`, Ready or not (the instance goes into service either
    // way: issue #24 item 3), so the reconciler, seeing the same transition after the fact,
    // decides it the same way now: one rule for the end of a lifecycle drain's record
    // (`lifecycle_drain_ends`, issue #43's "no second rule for any transition").
    let not_ready = NodeMarks {
        ready: false,
        ..node.clone()
    };
    assert_eq!(
        desired(&not_ready, &running(false), &POLICY, at(600)),
        desired(&node, &running(false), &POLICY, at(600))
    );
    let stopped = AwsFacts {
        instance: Fact::Known(Some(InstanceFacts {
            state: Some("stopped".into()),
            ..InstanceFacts::default()
        })),
        ..running(false)
    };
    assert_eq!(desired(&node, &stopped, &POLICY, at(600)), vec![]);
    let held = NodeMarks {
        checkpoint: Some(record.renewed("req-2", at(590), Duration::from_secs(60))),
        ..node.clone()
    };
    assert_eq!(
        desired(&held, &running(false), &POLICY, at(600)),
        vec![],
        "a drain at work is its invocation's"
    );
    let other_instance = NodeMarks {
        instance_id: Some("i-0ffffffffffffffff".into()),
        ..node
    };
    assert_eq!(
        names(&desired(&other_instance, &running(false), &POLICY, at(600))),
        Vec::<&str>::new()
    );
}

/// The launching hook (a launch out of the warm pool completing) and the reconciler (the
/// instance listed `InService`, EC2 running) end a lifecycle drain's record by one rule:
/// for every node, the same record ends or stays.
#[test]
fn the_launch_and_the_sweep_end_a_lifecycle_record_alike() {
    let record = lifecycle_record();
    let node = NodeMarks {
        checkpoint: Some(record.clone()),
        ..marks()
    };
    let variants = [
        node.clone(),
        NodeMarks {
            ready: false,
            ..node.clone()
        },
        NodeMarks {
            checkpoint: Some(record.renewed("req-2", at(590), Duration::from_secs(60))),
            ..node.clone()
        },
        NodeMarks {
            instance_id: Some("i-0ffffffffffffffff".into()),
            ..node.clone()
        },
        NodeMarks {
            checkpoint: None,
            ..node
        },
    ];
    let ended = |actions: Vec<Action>| -> Vec<DrainCheckpoint> {
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::UndoDrainRecord { record, .. } => Some(*record),
                _ => None,
            })
            .collect()
    };
    for variant in variants {
        let by_launch = ended(
            crate::reconcile::desired::at_return_from_warm_pool(&variant, at(600))
                .into_iter()
                .collect(),
        );
        let by_sweep = ended(desired(&variant, &running(false), &POLICY, at(600)));
        assert_eq!(by_launch, by_sweep, "{variant:?}");
    }
}

// Issue #43 item 2: a rebalance drain (`REBALANCE_ACTION=drain`) is undone like a cordon once
// `REBALANCE_UNDO_SECONDS` passed without an interruption or a termination.
#[test]
fn a_rebalance_drain_no_interruption_followed_is_undone_after_its_time() {
    let mut record = notice_record(NoticeKind::RebalanceRecommendation, false, 900);
    record = record.finished(at(300), crate::node_marks::checkpoint::DrainResult::Drained);
    let node = NodeMarks {
        checkpoint: Some(record),
        ..marks()
    };
    assert_eq!(desired(&node, &running(true), &POLICY, at(1799)), vec![]);
    assert_eq!(
        names(&desired(&node, &running(true), &POLICY, at(1800))),
        ["RebalanceDrainUndone"]
    );
    for leaving in ["Terminating:Wait", "Warmed:Pending:Wait"] {
        let facts = AwsFacts {
            lifecycle_state: Fact::Known(Some(leaving.into())),
            ..running(true)
        };
        assert_eq!(
            desired(&node, &facts, &POLICY, at(1800)),
            vec![],
            "{leaving}"
        );
    }
    let marked = AwsFacts {
        spot_status: Fact::Known(Some("marked-for-termination".into())),
        ..running(true)
    };
    assert_eq!(
        names(&desired(&node, &marked, &POLICY, at(1800))),
        Vec::<&str>::new(),
        "a completed drain is not drained again, nor undone while EC2 interrupts"
    );
    let not_ready = NodeMarks {
        ready: false,
        ..node
    };
    assert_eq!(
        desired(&not_ready, &running(true), &POLICY, at(1800)),
        vec![]
    );
}

#[test]
fn an_abandoned_rebalance_drain_resumes_in_its_time_and_is_undone_after_it() {
    let node = NodeMarks {
        checkpoint: Some(notice_record(
            NoticeKind::RebalanceRecommendation,
            false,
            900,
        )),
        ..marks()
    };
    assert_eq!(
        names(&desired(&node, &running(true), &POLICY, at(100))),
        ["NoticeDrainResumed"]
    );
    assert_eq!(desired(&node, &running(true), &POLICY, at(1000)), vec![]);
    assert_eq!(
        names(&desired(&node, &running(true), &POLICY, at(1800))),
        ["RebalanceDrainUndone"]
    );
}

// Item 7: a maintenance plan follows EC2's schedule.

#[test]
fn a_cancelled_maintenance_is_not_drained_at_its_old_time() {
    let node = NodeMarks {
        maintenance: Some(plan(7200)),
        ..marks()
    };
    let cancelled = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(7200, "[Canceled] retirement")]),
        ..running(false)
    };
    let actions = desired(&node, &cancelled, &POLICY, at(3700));
    assert_eq!(names(&actions), ["MaintenancePlanDropped"]);
    let nothing_listed = AwsFacts {
        scheduled: Fact::Known(vec![]),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &nothing_listed, &POLICY, at(3700))),
        ["MaintenancePlanDropped"]
    );
}

#[test]
fn a_rescheduled_maintenance_is_moved_and_drained_at_its_new_time() {
    let node = NodeMarks {
        maintenance: Some(plan(7200)),
        ..marks()
    };
    let later = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(86_400, "retirement")]),
        ..running(false)
    };
    // At the old drain time: moved, not drained.
    assert_eq!(
        desired(&node, &later, &POLICY, at(3700)),
        vec![Action::ReplanMaintenance {
            record: plan(7200),
            starts_at: at(86_400),
            drain_from: at(82_800),
        }]
    );
    // Brought forward into the margin: moved and drained at once.
    let sooner = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(3000, "retirement")]),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &sooner, &POLICY, at(100))),
        ["MaintenancePlanMoved", "MaintenanceDrainDue"]
    );
}

#[test]
fn a_maintenance_plan_is_drained_when_due_dropped_when_started_or_on_another_instance() {
    let node = NodeMarks {
        maintenance: Some(plan(7200)),
        ..marks()
    };
    let pending = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(7200, "retirement")]),
        ..running(false)
    };
    assert_eq!(desired(&node, &pending, &POLICY, at(3599)), vec![]);
    assert_eq!(
        desired(&node, &pending, &POLICY, at(3600)),
        vec![Action::DrainForMaintenance {
            record: plan(7200),
            starts_at: at(7200),
            event: ScheduledEventRef {
                id: None,
                code: "instance-retirement".into(),
                health_type_code: Some("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".into()),
            },
        }]
    );
    assert_eq!(
        names(&desired(&node, &pending, &POLICY, at(7200))),
        ["MaintenancePlanDropped"]
    );
    let reused = NodeMarks {
        instance_id: Some("i-0ffffffffffffffff".into()),
        ..node.clone()
    };
    assert_eq!(
        names(&desired(&reused, &pending, &POLICY, at(100))),
        ["MaintenancePlanDropped"]
    );
    let unanswered = AwsFacts {
        scheduled: Fact::Unknown("DescribeInstanceStatus: throttled".into()),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &unanswered, &POLICY, at(3600))),
        ["Unchecked"]
    );
}

#[test]
fn a_due_plan_and_its_abandoned_drain_are_one_drain() {
    let node = NodeMarks {
        maintenance: Some(plan(7200)),
        checkpoint: Some(notice_record(NoticeKind::ScheduledMaintenance, false, 7200)),
        ..marks()
    };
    let pending = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(7200, "retirement")]),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &pending, &POLICY, at(4000))),
        ["MaintenanceDrainDue"]
    );
}

#[test]
fn the_common_label_follows_the_marks() {
    let unlabelled = NodeMarks {
        labelled: false,
        maintenance: Some(plan(90_000)),
        ..marks()
    };
    let pending = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(90_000, "retirement")]),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&unlabelled, &pending, &POLICY, at(0))),
        ["MarkedLabelAdded"]
    );
    assert_eq!(
        names(&desired(&marks(), &running(false), &POLICY, at(0))),
        ["MarkedLabelRemoved"]
    );
}

// Issue 35, leftovers: a lost Spot warning, the plan's own event, after the maintenance.

#[test]
fn a_marked_spot_instance_whose_request_is_marked_for_interruption_is_drained() {
    let cordon = notice_record(NoticeKind::RebalanceRecommendation, true, 3600);
    for checkpoint in [None, Some(cordon)] {
        let node = NodeMarks {
            checkpoint: checkpoint.clone(),
            refresh: checkpoint.is_none().then(refresh_marks),
            ..marks()
        };
        for code in ["marked-for-termination", "marked-for-stop"] {
            let facts = AwsFacts {
                spot_status: Fact::Known(Some(code.into())),
                refresh_status: Fact::Known(Some("InProgress".into())),
                ..running(true)
            };
            let actions = desired(&node, &facts, &POLICY, at(60));
            let [
                Action::DrainForSpotInterruption {
                    notice,
                    group,
                    deadline,
                    ..
                },
            ] = actions.as_slice()
            else {
                panic!("{code} {checkpoint:?}: {actions:?}");
            };
            assert_eq!(notice.kind, NoticeKind::SpotInterruption);
            assert_eq!(group, "ng");
            assert_eq!(*deadline, at(180), "Spot's two minutes from now");
        }
        let fulfilled = AwsFacts {
            spot_status: Fact::Known(Some("fulfilled".into())),
            refresh_status: Fact::Known(Some("InProgress".into())),
            ..running(true)
        };
        assert_eq!(desired(&node, &fulfilled, &POLICY, at(60)), vec![]);
    }
}

#[test]
fn a_maintenance_plan_is_checked_against_its_own_event_not_another_codes() {
    let node = NodeMarks {
        maintenance: Some(plan(7200)),
        ..marks()
    };
    let reboot_sooner = ScheduledInstanceEvent {
        id: None,
        code: "instance-reboot".into(),
        ..scheduled(3000, "reboot")
    };
    let both = AwsFacts {
        scheduled: Fact::Known(vec![reboot_sooner.clone(), scheduled(7200, "retirement")]),
        ..running(false)
    };
    assert_eq!(
        desired(&node, &both, &POLICY, at(100)),
        vec![],
        "the retirement's plan stays at the retirement's time"
    );
    let only_the_reboot = AwsFacts {
        scheduled: Fact::Known(vec![reboot_sooner]),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &only_the_reboot, &POLICY, at(100))),
        ["MaintenancePlanDropped"],
        "the retirement was cancelled; a reboot is not it"
    );
}

#[test]
fn after_the_maintenance_our_cordon_stays_until_the_node_is_ready_then_goes() {
    let mut record = notice_record(NoticeKind::ScheduledMaintenance, false, 900);
    record.completed_at = Some(at(800));
    let not_ready = NodeMarks {
        checkpoint: Some(record.clone()),
        ready: false,
        ..marks()
    };
    let completed = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(900, "[Completed] reboot")]),
        ..running(false)
    };
    assert_eq!(desired(&not_ready, &completed, &POLICY, at(1000)), vec![]);
    let ready = NodeMarks {
        ready: true,
        ..not_ready.clone()
    };
    assert_eq!(
        names(&desired(&ready, &completed, &POLICY, at(1000))),
        ["RestoredAfterMaintenance"]
    );
    // Still pending (under way), or the instance did not come back: kept.
    let pending = AwsFacts {
        scheduled: Fact::Known(vec![scheduled(900, "reboot")]),
        ..running(false)
    };
    assert_eq!(desired(&ready, &pending, &POLICY, at(1000)), vec![]);
    let stopped = AwsFacts {
        instance: Fact::Known(Some(InstanceFacts {
            state: Some("stopped".into()),
            auto_scaling_group: Some("ng".into()),
            spot_request_id: None,
            private_dns_name: None,
        })),
        ..completed.clone()
    };
    assert_eq!(desired(&ready, &stopped, &POLICY, at(1000)), vec![]);
    // A Spot drain completed while the request is still marked: kept.
    let mut spot = notice_record(NoticeKind::SpotInterruption, false, 900);
    spot.completed_at = Some(at(800));
    let spot_node = NodeMarks {
        checkpoint: Some(spot),
        ..ready
    };
    let marked = AwsFacts {
        spot_status: Fact::Known(Some("marked-for-termination".into())),
        ..running(true)
    };
    assert_eq!(desired(&spot_node, &marked, &POLICY, at(1000)), vec![]);
}

// Found by the event soak: a stopped instance started again kept our cordon for good.

#[test]
fn a_completed_notice_drain_is_undone_once_the_instance_runs_again_and_its_node_is_ready() {
    let mut record = notice_record(NoticeKind::InstanceStopping, false, 120);
    record.completed_at = Some(at(100));
    let ready = NodeMarks {
        checkpoint: Some(record.clone()),
        ..marks()
    };
    assert_eq!(
        names(&desired(&ready, &running(false), &POLICY, at(1000))),
        ["NoticeDrainUndone"]
    );
    let not_ready = NodeMarks {
        ready: false,
        ..ready.clone()
    };
    assert_eq!(
        desired(&not_ready, &running(false), &POLICY, at(1000)),
        vec![]
    );
    let stopped = AwsFacts {
        instance: Fact::Known(Some(InstanceFacts {
            state: Some("stopped".into()),
            auto_scaling_group: Some("ng".into()),
            spot_request_id: None,
            private_dns_name: None,
        })),
        ..running(false)
    };
    assert_eq!(desired(&ready, &stopped, &POLICY, at(1000)), vec![]);
}

fn event(id: &str, code: &str, not_before: i64, description: &str) -> ScheduledInstanceEvent {
    ScheduledInstanceEvent {
        id: Some(id.into()),
        code: code.into(),
        not_before: Some(at(not_before)),
        description: description.into(),
    }
}

/// A completed drain for EC2's scheduled event `id` (`code`), as the drain records it.
fn maintenance_drained_for(id: &str, code: &str, type_code: &str) -> DrainCheckpoint {
    let mut record = notice_record(NoticeKind::ScheduledMaintenance, false, 600);
    let notice = record.notice.as_mut().unwrap();
    notice.scheduled_event = Some(ScheduledEventRef {
        id: Some(id.into()),
        code: code.into(),
        health_type_code: Some(type_code.into()),
    });
    record.finished(at(300), crate::node_marks::checkpoint::DrainResult::Drained)
}

// Issue #43 item 3 (a): a reboot is done, an unrelated event ten days later is pending: the
// node used to stay cordoned until that one completed too.
#[test]
fn a_maintenance_drain_ends_with_its_own_event_not_with_every_event() {
    let node = NodeMarks {
        checkpoint: Some(maintenance_drained_for(
            "instance-event-1",
            "instance-reboot",
            "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
        )),
        ..marks()
    };
    let facts = |events| AwsFacts {
        scheduled: Fact::Known(events),
        ..running(false)
    };
    let later = event(
        "instance-event-2",
        "instance-reboot",
        864_000,
        "ten days later",
    );
    let reboot_pending = facts(vec![
        event("instance-event-1", "instance-reboot", 600, "reboot"),
        later.clone(),
    ]);
    assert_eq!(desired(&node, &reboot_pending, &POLICY, at(700)), vec![]);
    let reboot_done = facts(vec![
        event(
            "instance-event-1",
            "instance-reboot",
            600,
            "[Completed] reboot",
        ),
        later,
    ]);
    assert_eq!(
        names(&desired(&node, &reboot_done, &POLICY, at(700))),
        ["RestoredAfterMaintenance"]
    );
}

// Issue #43 item 3 (b): a node drained for a pending retirement used to be put back in
// service by another, completed event's end.
#[test]
fn another_events_completion_does_not_end_a_drain_for_a_pending_retirement() {
    let node = NodeMarks {
        checkpoint: Some(maintenance_drained_for(
            "instance-event-7",
            "instance-retirement",
            "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED",
        )),
        ..marks()
    };
    let facts = AwsFacts {
        scheduled: Fact::Known(vec![
            event(
                "instance-event-3",
                "system-reboot",
                100,
                "[Completed] host reboot",
            ),
            event(
                "instance-event-7",
                "instance-retirement",
                90_000,
                "retirement",
            ),
        ]),
        ..running(false)
    };
    assert_eq!(desired(&node, &facts, &POLICY, at(700)), vec![]);
}

#[test]
fn a_plan_follows_its_own_event_by_id() {
    let record = MaintenanceRecord {
        event: Some(ScheduledEventRef {
            id: Some("instance-event-2".into()),
            code: "instance-reboot".into(),
            health_type_code: Some("AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED".into()),
        }),
        type_code: "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED".into(),
        ..plan(7200)
    };
    let node = NodeMarks {
        maintenance: Some(record.clone()),
        ..marks()
    };
    // Another reboot, sooner, is not this plan's: it is left alone (the sweep plans it).
    let other_sooner = AwsFacts {
        scheduled: Fact::Known(vec![
            event(
                "instance-event-1",
                "instance-reboot",
                5000,
                "another reboot",
            ),
            event("instance-event-2", "instance-reboot", 7200, "this reboot"),
        ]),
        ..running(false)
    };
    assert_eq!(desired(&node, &other_sooner, &POLICY, at(100)), vec![]);
    let cancelled = AwsFacts {
        scheduled: Fact::Known(vec![
            event(
                "instance-event-1",
                "instance-reboot",
                5000,
                "another reboot",
            ),
            event(
                "instance-event-2",
                "instance-reboot",
                7200,
                "[Canceled] this reboot",
            ),
        ]),
        ..running(false)
    };
    assert_eq!(
        names(&desired(&node, &cancelled, &POLICY, at(100))),
        ["MaintenancePlanDropped"]
    );
    let due = desired(&node, &other_sooner, &POLICY, at(3600));
    let Some(Action::DrainForMaintenance { event, .. }) = due.first() else {
        panic!("{due:?}")
    };
    assert_eq!(
        Some(event),
        record.event.as_ref(),
        "the drain names the plan's event"
    );
}

// Issue #45 item 3: the out-of-service taint stays while the kubelet is gone and is lifted
// once the node is Ready again.

#[test]
fn the_out_of_service_taint_is_lifted_once_the_node_is_ready_again() {
    let record = crate::node_marks::shutdown::ShutdownRecord {
        by: "node-repair".into(),
        at: at(0),
        why: "instance stopped".into(),
    };
    let silent = NodeMarks {
        shutdown: Some(record.clone()),
        ready: false,
        ..marks()
    };
    assert_eq!(desired(&silent, &running(false), &POLICY, at(100)), vec![]);
    let back = NodeMarks {
        ready: true,
        ..silent
    };
    let actions = desired(&back, &running(false), &POLICY, at(100));
    assert!(
        matches!(actions.as_slice(), [Action::LiftShutdownTaint { record: r, .. }] if *r == record),
        "{actions:?}"
    );
    // Its record alone keeps the common label on.
    let unlabelled = NodeMarks {
        labelled: false,
        ..back
    };
    assert!(
        desired(&unlabelled, &running(false), &POLICY, at(100)).contains(&Action::AddMarkedLabel)
    );
}
