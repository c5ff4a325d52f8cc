#![allow(clippy::unwrap_used)]
use super::*;
use crate::aws::SCHEDULED_EVENT_CODES;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).unwrap()
}

fn event(id: &str, code: &str, not_before: i64, description: &str) -> ScheduledInstanceEvent {
    ScheduledInstanceEvent {
        id: Some(id.into()),
        code: code.into(),
        not_before: Some(at(not_before)),
        description: description.into(),
    }
}

#[test]
fn every_scheduled_event_code_has_a_health_type_code_that_carries_it() {
    for code in SCHEDULED_EVENT_CODES {
        let type_code = health_type_code(code).unwrap();
        assert!(
            scheduled_change(type_code)
                .unwrap()
                .ec2_codes
                .contains(&code),
            "{code}"
        );
    }
    assert_eq!(health_type_code("instance-launch"), None);
}

#[test]
fn what_each_scheduled_change_does_to_the_instance() {
    use EventEffect::*;
    for (type_code, effect) in [
        ("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", Ends),
        ("AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED", Ends),
        ("AWS_EC2_INSTANCE_RETIREMENT_EXPEDITED", Ends),
        ("AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_EXPEDITED", Ends),
        ("AWS_EC2_INSTANCE_STOP_SCHEDULED", Ends),
        (
            "AWS_EC2_INSTANCE_REBOOT_FLEXIBLE_MAINTENANCE_SCHEDULED",
            Reboots,
        ),
        ("AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED", Reboots),
        (
            "AWS_EC2_PERSISTENT_INSTANCE_POWER_MAINTENANCE_SCHEDULED",
            Reboots,
        ),
        ("AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED", RunsOn),
    ] {
        assert_eq!(
            scheduled_change(type_code).unwrap().effect,
            effect,
            "{type_code}"
        );
    }
    // EC2's code alone: `system-maintenance` may be power maintenance, which reboots.
    assert_eq!(effect_of("system-maintenance", None), Reboots);
    assert_eq!(effect_of("instance-retirement", None), Ends);
    // A type code that does not carry the event's code says nothing about it.
    assert_eq!(
        effect_of(
            "instance-retirement",
            Some("AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED")
        ),
        Ends
    );
}

// Issue #43 item 4: an AWS Health type code outside the old closed list (an EBS-backed
// instance's retirement, power maintenance, an expedited retirement, or one AWS adds later)
// used to be answered "EC2 lists no pending scheduled event", and the instance was stopped
// with its pods on it.
#[test]
fn every_health_type_code_finds_its_event_in_ec2s_schedule() {
    let schedule = [
        event(
            "instance-event-1",
            "instance-stop",
            1000,
            "The instance is running on degraded hardware",
        ),
        event(
            "instance-event-2",
            "system-maintenance",
            5000,
            "Scheduled power maintenance",
        ),
    ];
    for type_code in [
        "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED",
        "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_EXPEDITED",
        "AWS_EC2_INSTANCE_RETIREMENT_EXPEDITED",
        "AWS_EC2_INSTANCE_STOP_SCHEDULED",
    ] {
        let found = announced_event(&schedule, type_code, Some(at(1000)));
        assert_eq!(
            found.and_then(|e| e.id.as_deref()),
            Some("instance-event-1"),
            "{type_code}"
        );
    }
    for type_code in [
        "AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED",
        "AWS_EC2_PERSISTENT_INSTANCE_POWER_MAINTENANCE_SCHEDULED",
    ] {
        let found = announced_event(&schedule, type_code, Some(at(5000)));
        assert_eq!(
            found.and_then(|e| e.id.as_deref()),
            Some("instance-event-2"),
            "{type_code}"
        );
    }
    // A type code the table does not list: EC2's event nearest its start.
    let unlisted = announced_event(&schedule, "AWS_EC2_SOMETHING_NEW_SCHEDULED", Some(at(4900)));
    assert_eq!(
        unlisted.and_then(|e| e.id.as_deref()),
        Some("instance-event-2")
    );
    // A reboot is never taken for a retirement, whatever the times.
    let reboot_only = [event("instance-event-3", "instance-reboot", 1000, "")];
    assert_eq!(
        announced_event(
            &reboot_only,
            "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            Some(at(1000))
        ),
        None
    );
}

// Issue #43 item 3: a record names its own EC2 event; no other event keeps or ends it.
#[test]
fn a_record_finds_only_its_own_event_while_ec2_lists_it_as_pending() {
    let reboot = ScheduledEventRef {
        id: Some("instance-event-1".into()),
        code: "instance-reboot".into(),
        health_type_code: Some("AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED".into()),
    };
    let pending = [
        event(
            "instance-event-1",
            "instance-reboot",
            1000,
            "scheduled reboot",
        ),
        event(
            "instance-event-9",
            "instance-reboot",
            900_000,
            "another reboot, ten days later",
        ),
    ];
    assert_eq!(
        reboot
            .find_pending(&pending, None)
            .and_then(|e| e.id.as_deref()),
        Some("instance-event-1")
    );
    let completed = [
        event(
            "instance-event-1",
            "instance-reboot",
            1000,
            "[Completed] scheduled reboot",
        ),
        event(
            "instance-event-9",
            "instance-reboot",
            900_000,
            "another reboot, ten days later",
        ),
    ];
    assert_eq!(
        reboot.find_pending(&completed, None),
        None,
        "another event is not it"
    );
    let gone = [event("instance-event-9", "instance-reboot", 900_000, "")];
    assert_eq!(reboot.find_pending(&gone, None), None);
    // Where EC2 gives no ids, the same code nearest the start stands for it.
    let without_ids = [ScheduledInstanceEvent {
        id: None,
        ..pending[0].clone()
    }];
    assert!(reboot.find_pending(&without_ids, Some(at(1000))).is_some());
}

#[test]
fn a_plan_written_before_it_named_its_event_is_matched_by_its_type_code() {
    let legacy: MaintenanceRecord = serde_json::from_str(
        r#"{"typeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","instanceId":"i-0a1b2c3d4e5f60718",
            "autoScalingGroupName":"ng","startsAt":"2023-11-14T22:30:00Z","drainFrom":"2023-11-14T21:30:00Z"}"#,
    )
    .unwrap();
    assert_eq!(legacy.event, None);
    let schedule = [
        event("instance-event-1", "instance-reboot", 0, ""),
        event("instance-event-2", "instance-retirement", 1000, ""),
    ];
    let found = legacy.pending_event(&schedule).unwrap();
    assert_eq!(found.id.as_deref(), Some("instance-event-2"));
    assert_eq!(
        legacy.event_ref(found).health_type_code.as_deref(),
        Some("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED")
    );
}
