//! The terminating hook's scheduled run (the sweep: the reconciler, then the drains it finds
//! due) at fleet scale, through the built binary, the fake API server and the fake AWS
//! endpoints with a latency on every AWS call and every list of nodes (issue #43 item 10): a
//! fleet-wide maintenance marks thousands of nodes, and every plan must still be decided
//! (none left `Unchecked` for want of an answer) inside the schedule's period.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::aws::{AwsFault, FakeInstance, ScheduledEventCode, Service};
use crate::e2e::{FunctionWorld, GROUP, Target};
use crate::fixtures;
use crate::kube::{FaultAction, FaultRule};

/// The sweep's schedule period (`rate(5 minutes)` in the template): a run must end within it.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(300);

/// The AWS operations the sweep makes, in the order reported.
pub const SWEEP_OPERATIONS: [&str; 5] = [
    "DescribeInstances",
    "DescribeAutoScalingInstances",
    "DescribeInstanceStatus",
    "DescribeSpotInstanceRequests",
    "DescribeInstanceRefreshes",
];

/// One measured sweep.
#[derive(Debug, Clone)]
pub struct SweepRow {
    pub nodes: usize,
    pub marked: usize,
    pub due: usize,
    pub latency: Duration,
    pub wall: Duration,
    pub aws_calls: BTreeMap<&'static str, usize>,
    pub node_lists: usize,
    pub peak_rss_kib: Option<u64>,
    /// Marks left `Unchecked` (no answer from AWS this run).
    pub unchecked: usize,
    /// Due plans drained in this run.
    pub drained: usize,
}

impl SweepRow {
    pub fn aws_total(&self) -> usize {
        self.aws_calls.values().sum()
    }
}

/// A sweep over `nodes` nodes of which `marked` carry a maintenance plan for a retirement
/// EC2 scheduled (`due` of them due now, the others a week ahead), with `latency` on every AWS
/// call and on every list of nodes.
pub async fn sweep_at_scale(
    nodes: usize,
    marked: usize,
    due: usize,
    latency: Duration,
) -> SweepRow {
    let w = FunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .env("SETTLE_SECONDS", "0.1")
        .env("DRAIN_TIMEOUT_SECONDS", "60")
        .start()
        .await;
    let seeding = Instant::now();
    seed(&w, nodes, marked, due);
    tracing::debug!(nodes, seeded_in = ?seeding.elapsed(), "sweep bench seeded");
    for service in [Service::Ec2, Service::AutoScaling] {
        w.aws
            .faults()
            .inject(AwsFault::latency(latency).on_service(service));
    }
    w.server.faults().add(
        FaultRule::new(FaultAction::Latency(latency))
            .verb("list")
            .resource("nodes"),
    );
    let aws_before = w.aws.requests().len();
    let lambda = w.function(Target::TerminatingHook);
    let started = Instant::now();
    let answer = lambda
        .runtime
        .invoke(&fixtures::schedule_tick(), SWEEP_PERIOD)
        .await;
    let wall = started.elapsed();
    let answer = match answer {
        Ok(crate::lambda_api::InvocationOutcome::Response(answer)) => answer,
        other => panic!(
            "the sweep did not answer: {other:?}\n{}",
            lambda.runtime.output()
        ),
    };
    let requests = w.aws.requests();
    let mut aws_calls = BTreeMap::new();
    for operation in SWEEP_OPERATIONS {
        let count = requests[aws_before..]
            .iter()
            .filter(|r| r.operation == operation)
            .count();
        aws_calls.insert(operation, count);
    }
    let node_lists = w
        .server
        .audit()
        .filter(|e| {
            e.user.username == "terminating-hook" && e.verb == "list" && e.resource() == "nodes"
        })
        .len();
    SweepRow {
        nodes,
        marked,
        due,
        latency,
        wall,
        aws_calls,
        node_lists,
        peak_rss_kib: lambda.runtime.peak_rss_kib(),
        unchecked: count_outcomes(&answer, "Unchecked"),
        drained: count_outcomes(&answer, "Drained"),
    }
}

fn count_outcomes(answer: &Value, outcome: &str) -> usize {
    answer["instances"].as_array().map_or(0, |all| {
        all.iter().filter(|o| o["outcome"] == outcome).count()
    })
}

/// `nodes` nodes besides the world's own; the first `marked` have an instance in the group
/// with a retirement EC2 scheduled, and the plan the terminating hook would have written for
/// it (the first `due` of them due now).
fn seed(w: &FunctionWorld, nodes: usize, marked: usize, due: usize) {
    let store = w.server.store();
    let (ec2, autoscaling, interruptions) =
        (w.aws.ec2(), w.aws.autoscaling(), w.aws.interruptions());
    // EC2 reports times to the second: a plan records what EC2 said.
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).expect("now");
    for i in 0..nodes.saturating_sub(1) {
        let instance = format!("i-{:017x}", i + 1);
        let name = format!("ip-10-2-{}-{}.eu-west-1.compute.internal", i / 250, i % 250);
        let mut node = fixtures::node(&name, &format!("aws:///eu-west-1a/{instance}"));
        if i < marked {
            ec2.add_instance(
                FakeInstance::new(&instance, "eu-west-1")
                    .availability_zone("eu-west-1a")
                    .private_dns_name(&name),
            );
            autoscaling
                .add_instance(GROUP, &instance, "eu-west-1a")
                .expect("the world's group");
            let starts_at = if i < due {
                now + jiff::SignedDuration::from_mins(30)
            } else {
                now + jiff::SignedDuration::from_hours(24 * 7)
            };
            let ends_at = starts_at + jiff::SignedDuration::from_hours(1);
            interruptions
                .schedule_maintenance(
                    &instance,
                    ScheduledEventCode::InstanceRetirement,
                    starts_at,
                    ends_at,
                )
                .expect("an instance EC2 knows");
            let event_id = ec2
                .instance(&instance)
                .and_then(|i| {
                    i.scheduled_events
                        .last()
                        .map(|e| e.instance_event_id.clone())
                })
                .unwrap_or_default();
            mark_planned(&mut node, &instance, Some(&event_id), starts_at);
        }
        store.create(&node).expect("a new node");
    }
}

/// The maintenance plan the terminating hook writes for a retirement of `instance` starting
/// at `starts_at` (EC2's event `event_id`; `None`: a plan written before plans named their
/// event), on `node`.
pub fn mark_planned(
    node: &mut k8s_openapi::api::core::v1::Node,
    instance: &str,
    event_id: Option<&str>,
    starts_at: jiff::Timestamp,
) {
    let mut record = json!({
        "typeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", "instanceId": instance,
        "autoScalingGroupName": GROUP, "startsAt": starts_at.to_string(),
        "drainFrom": (starts_at - jiff::SignedDuration::from_hours(1)).to_string(),
    });
    if let Some(id) = event_id {
        record["event"] = json!({"id": id, "code": "instance-retirement",
                                 "healthTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED"});
    }
    let labels = node.metadata.labels.get_or_insert_default();
    labels.insert("open-node-manager.io/maintenance".into(), "planned".into());
    labels.insert("open-node-manager.io/marked".into(), "true".into());
    node.metadata.annotations.get_or_insert_default().insert(
        "open-node-manager.io/maintenance".into(),
        record.to_string(),
    );
}
