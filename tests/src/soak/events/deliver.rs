//! Plays a seed's timeline on its world: what AWS says changes, events are delivered to the
//! terminating hook in process (duplicates of one event at the same time run concurrently),
//! an invocation that fails is retried as Lambda retries an asynchronous one, continuations
//! the drain publishes are delivered, and brownouts come and go.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use node_manager::aws::AwsErrorKind;
use node_manager::aws::ScheduledInstanceEvent;
use node_manager::drain::Invocation;
use node_manager::instance_notice::handle_terminating_hook_event;
use node_manager::lifecycle::budget::InvocationBudget;
use node_manager::node_marks::refresh::{mark_node, refresh_marks_of, unmark_node};
use serde_json::{Value, json};

use super::check::{LIFECYCLE_NOT_DRAINED, Violation};
use super::plan::{Delivery, Member, Step, Truth};
use super::world::{EventWorld, GROUP};
use crate::fixtures::lifecycle_notification;
use crate::kube::{FaultAction, FaultId, FaultRule};
use crate::soak::corpus::{self, Target};

pub const REFRESH_ID: &str = "0d4a5c7e-1111-4222-8333-9444455556aa";
/// Lambda retries a failed asynchronous invocation twice.
const LAMBDA_RETRIES: u32 = 2;

/// What playing a timeline came to.
#[derive(Debug, Default)]
pub struct Played {
    pub invocations: usize,
    pub failed_invocations: usize,
    pub continuations: usize,
    pub brownouts: usize,
    /// Every pod seen, and its node (to tell where an eviction came from).
    pub pods: BTreeMap<String, String>,
    /// What was seen wrong while playing (a lifecycle action completed with pods left).
    pub violations: Vec<Violation>,
}

/// An invocation to make: the event and how many times Lambda has tried it.
struct Pending {
    event: Value,
    attempt: u32,
}

/// Plays the timeline of one seed.
pub struct Player<'w> {
    world: &'w EventWorld,
    starts: BTreeMap<String, Timestamp>,
    brownout: Option<(usize, Vec<FaultId>)>,
    retries: Vec<Pending>,
    completed: usize,
    pub played: Played,
}

impl<'w> Player<'w> {
    pub fn new(world: &'w EventWorld) -> Self {
        Self {
            world,
            starts: BTreeMap::new(),
            brownout: None,
            retries: Vec::new(),
            completed: 0,
            played: Played::default(),
        }
    }

    /// Plays `steps` in order, then lets what was in flight land: the brownout ends, failed
    /// invocations are retried and continuations delivered until none is left.
    pub async fn play(&mut self, steps: &[Step]) {
        let mut i = 0;
        while i < steps.len() {
            // Copies of one event at the same time run concurrently.
            let mut j = i + 1;
            while j < steps.len() && steps[j] == steps[i] && matches!(steps[i], Step::Deliver(_)) {
                j += 1;
            }
            self.step(&steps[i], j - i).await;
            self.after_step().await;
            i = j;
        }
        self.end_brownout();
        for _ in 0..20 {
            let retries = std::mem::take(&mut self.retries);
            let continuations = self.continuations();
            self.played.continuations += continuations.len();
            if retries.is_empty() && continuations.is_empty() {
                break;
            }
            for pending in retries.into_iter().chain(continuations) {
                self.invoke(pending).await;
                self.after_step().await;
            }
        }
    }

    async fn step(&mut self, step: &Step, copies: usize) {
        match step {
            Step::Truth(truth) => self.apply(truth).await,
            Step::Brownout(steps) => self.start_brownout(*steps),
            Step::Deliver(delivery) => {
                let events: Vec<Value> = (0..copies)
                    .filter_map(|_| self.event_of(delivery))
                    .collect();
                match delivery {
                    Delivery::RefreshStart | Delivery::RefreshEnd => {
                        for _ in 0..copies {
                            self.refresh_function(delivery).await;
                        }
                    }
                    _ => {
                        self.played.invocations += events.len();
                        let pending = events
                            .into_iter()
                            .map(|event| Pending { event, attempt: 0 });
                        let runs = pending.map(|p| self.invoke_once(p));
                        let failed: Vec<Option<Pending>> = futures::future::join_all(runs).await;
                        let failed: Vec<Pending> = failed.into_iter().flatten().collect();
                        self.played.failed_invocations += failed.len();
                        self.retries.extend(failed);
                    }
                }
            }
        }
    }

    /// One invocation; a failure is queued for Lambda's retry.
    async fn invoke(&mut self, pending: Pending) {
        self.played.invocations += 1;
        if let Some(failed) = self.invoke_once(pending).await {
            self.played.failed_invocations += 1;
            self.retries.push(failed);
        }
    }

    async fn invoke_once(&self, pending: Pending) -> Option<Pending> {
        let invocation = Invocation {
            request_id: format!("soak-{}", uuid_like()),
            function_account: Some("111111111111".into()),
            budget: InvocationBudget::new(Duration::from_secs(30), Duration::ZERO),
        };
        let result =
            handle_terminating_hook_event(&self.world.drainer, pending.event.clone(), &invocation)
                .await;
        match result {
            Ok(_) => None,
            Err(error) if pending.attempt < LAMBDA_RETRIES => {
                tracing::info!(%error, attempt = pending.attempt, "soak: invocation failed, Lambda retries it");
                Some(Pending {
                    event: pending.event,
                    attempt: pending.attempt + 1,
                })
            }
            Err(error) => {
                tracing::info!(%error, "soak: invocation failed its last retry: the event is lost");
                None
            }
        }
    }

    /// Bookkeeping after every step: counts, pods seen, completions checked, brownout clock.
    async fn after_step(&mut self) {
        for pod in self.world.server.store().list::<Pod>() {
            if let (Some(name), Some(node)) = (
                pod.metadata.name.clone(),
                pod.spec.and_then(|s| s.node_name),
            ) {
                self.played.pods.insert(name, node);
            }
        }
        self.check_new_completions();
        if let Some((left, _)) = &mut self.brownout {
            *left = left.saturating_sub(1);
            if *left == 0 {
                self.end_brownout();
            }
        }
    }

    /// A lifecycle action completes only once its node is drained.
    fn check_new_completions(&mut self) {
        let completions = self.world.autoscaling.completions();
        for completion in &completions[self.completed..] {
            let Some(member) = self.world.member(&completion.action.instance_id) else {
                continue;
            };
            let left: Vec<String> = self
                .world
                .server
                .store()
                .list::<Pod>()
                .into_iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&member.node)
                })
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| p.metadata.name)
                .collect();
            if !left.is_empty() {
                self.played.violations.push(Violation {
                    invariant: LIFECYCLE_NOT_DRAINED,
                    detail: format!(
                        "{}: completed with pods left: {}",
                        member.instance_id,
                        left.join(", ")
                    ),
                });
            }
        }
        self.completed = completions.len();
    }

    fn continuations(&self) -> Vec<Pending> {
        let published = self.world.notifications.drain();
        let base = corpus::fresh_lifecycle_event(Target::TerminatingHook);
        published
            .into_iter()
            .map(|m| Pending {
                event: corpus::with_message(&base, &m.message),
                attempt: 0,
            })
            .collect()
    }

    fn start_brownout(&mut self, steps: usize) {
        self.end_brownout();
        self.played.brownouts += 1;
        let faults = self.world.server.faults();
        let ids = vec![
            faults.add(
                FaultRule::new(FaultAction::TooManyRequests {
                    retry_after_seconds: 0,
                })
                .probability(0.3),
            ),
            faults.add(FaultRule::new(FaultAction::ServiceUnavailable).probability(0.1)),
            faults.add(FaultRule::new(FaultAction::InternalError).probability(0.05)),
        ];
        let notices = &self.world.instances.notices.faults;
        notices.fail("DescribeInstances", AwsErrorKind::Transient, 2);
        notices.fail("DescribeSpotInstanceRequests", AwsErrorKind::Transient, 1);
        notices.fail("DescribeInstanceStatus", AwsErrorKind::Transient, 1);
        let autoscaling = &self.world.autoscaling.faults;
        autoscaling.fail("RecordLifecycleActionHeartbeat", AwsErrorKind::Transient, 1);
        autoscaling.fail("DescribeAutoScalingInstances", AwsErrorKind::Transient, 1);
        autoscaling.fail("CompleteLifecycleAction", AwsErrorKind::Transient, 1);
        self.brownout = Some((steps, ids));
    }

    fn end_brownout(&mut self) {
        if let Some((_, ids)) = self.brownout.take() {
            for id in ids {
                self.world.server.faults().remove(id);
            }
        }
        self.world.instances.notices.faults.clear();
        self.world.instances.faults.clear();
        self.world.autoscaling.faults.clear();
        self.world.notifications.faults.clear();
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:012}", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Player<'_> {
    /// What AWS says changes.
    async fn apply(&mut self, truth: &Truth) {
        let w = self.world;
        let member = |id: &str| w.member(id).cloned();
        match truth {
            Truth::Terminating(id) => {
                if let Some(m) = member(id) {
                    w.autoscaling.start_action(&m.action());
                    w.autoscaling.set_lifecycle_state(id, "Terminating:Wait");
                }
            }
            Truth::SpotMarked(id) => {
                if let Some(request) = member(id).and_then(|m| m.spot_request()) {
                    w.instances
                        .notices
                        .set_spot_status(&request, "marked-for-termination");
                }
            }
            Truth::SpotTerminated(id) => {
                if let Some(m) = member(id) {
                    self.terminate(&m).await;
                }
            }
            Truth::Stopping(id) => self.set_state(id, "stopped"),
            Truth::StartedAgain(id) => self.set_state(id, "running"),
            Truth::Scheduled { instance, soon } => {
                let ahead = if *soon { 600 } else { 2 * 86_400 };
                let starts = Timestamp::from_second(Timestamp::now().as_second() + ahead)
                    .unwrap_or_else(|_| Timestamp::now());
                self.starts.insert(instance.clone(), starts);
                w.instances
                    .notices
                    .set_schedule(instance, vec![retirement(starts, "")]);
            }
            Truth::Cancelled(id) => {
                if let Some(starts) = self.starts.get(id) {
                    w.instances
                        .notices
                        .set_schedule(id, vec![retirement(*starts, "[Canceled] ")]);
                }
            }
            Truth::RefreshRuns => w
                .autoscaling
                .set_refresh_status(GROUP, REFRESH_ID, "InProgress"),
            Truth::RefreshOver => w
                .autoscaling
                .set_refresh_status(GROUP, REFRESH_ID, "Successful"),
        }
    }

    fn set_state(&self, id: &str, state: &str) {
        if let Some(m) = self.world.member(id) {
            self.world.set_state(m, state);
        }
    }

    /// The instance is gone: EC2 says terminated, its node and pods go.
    pub async fn terminate(&self, member: &Member) {
        let w = self.world;
        w.set_state(member, "terminated");
        w.autoscaling
            .set_lifecycle_state(&member.instance_id, "Terminated");
        let store = w.server.store();
        for pod in store.list::<Pod>() {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&member.node) {
                let _ = store.remove::<Pod>(
                    pod.metadata.namespace.as_deref().unwrap_or(""),
                    pod.metadata.name.as_deref().unwrap_or(""),
                );
            }
        }
        let _ = store.remove::<Node>("", &member.node);
    }

    /// The instance refresh function's start and end, on the refresh's proof: the start marks
    /// the refreshed members' nodes while Auto Scaling reports the refresh running, the end
    /// removes its marks once it does not.
    async fn refresh_function(&mut self, delivery: &Delivery) {
        let w = self.world;
        let status = w.autoscaling_refresh_status().await;
        let runs = status
            .as_deref()
            .is_some_and(node_manager::reconcile::desired::refresh_in_progress);
        let nodes: Api<Node> = Api::all(w.client.clone());
        for member in w
            .fleet
            .iter()
            .filter(|m| matches!(m.fate, super::plan::Fate::Refreshed { .. }))
        {
            let Ok(Some(node)) = nodes.get_opt(&member.node).await else {
                continue;
            };
            // The refresh function's invocation, and Lambda's retries of it.
            for _ in 0..=LAMBDA_RETRIES {
                self.played.invocations += 1;
                let written = match delivery {
                    Delivery::RefreshStart if runs => mark_node(
                        &nodes,
                        node.clone(),
                        REFRESH_ID,
                        GROUP,
                        &member.instance_id,
                        node_manager::node_marks::refresh::MarkAs::OutOfService { taint: None },
                    )
                    .await
                    .map(|_| ()),
                    Delivery::RefreshEnd if !runs && refresh_marks_of(&node).is_some() => {
                        unmark_node(&nodes, node.clone(), REFRESH_ID)
                            .await
                            .map(|_| ())
                    }
                    _ => Ok(()),
                };
                if written.is_ok() {
                    break;
                }
                self.played.failed_invocations += 1;
            }
        }
    }

    /// The event EventBridge or SNS delivers for `delivery` (`None` for the refresh
    /// function's own events).
    fn event_of(&self, delivery: &Delivery) -> Option<Value> {
        let w = self.world;
        Some(match delivery {
            Delivery::Lifecycle(id) => {
                lifecycle_notification(Target::TerminatingHook, &w.member(id)?.action())
            }
            Delivery::SpotWarning(id) => ec2_event(
                "EC2 Spot Instance Interruption Warning",
                id,
                json!({"instance-id": id, "instance-action": "terminate"}),
            ),
            Delivery::Rebalance(id) => ec2_event(
                "EC2 Instance Rebalance Recommendation",
                id,
                json!({"instance-id": id}),
            ),
            Delivery::Stopping(id) => ec2_event(
                "EC2 Instance State-change Notification",
                id,
                json!({"instance-id": id, "state": "stopping"}),
            ),
            Delivery::Health { instance, .. } => {
                health_event(instance, *self.starts.get(instance)?)
            }
            Delivery::Tick => tick(),
            Delivery::RefreshStart | Delivery::RefreshEnd => return None,
        })
    }
}

impl EventWorld {
    async fn autoscaling_refresh_status(&self) -> Option<String> {
        use node_manager::aws::GroupActivity;
        self.autoscaling
            .instance_refresh_status(GROUP, REFRESH_ID)
            .await
            .ok()
            .flatten()
    }
}

fn retirement(starts: Timestamp, prefix: &str) -> ScheduledInstanceEvent {
    ScheduledInstanceEvent {
        code: "instance-retirement".into(),
        not_before: Some(starts),
        description: format!("{prefix}The instance is running on degraded hardware"),
    }
}

fn now_second() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now())
}

fn ec2_event(detail_type: &str, instance: &str, detail: Value) -> Value {
    json!({
        "version": "0", "id": format!("soak-{}", uuid_like()),
        "detail-type": detail_type, "source": "aws.ec2", "account": "111111111111",
        "time": now_second().to_string(), "region": "eu-west-1",
        "resources": [format!("arn:aws:ec2:eu-west-1:111111111111:instance/{instance}")],
        "detail": detail,
    })
}

fn health_event(instance: &str, starts: Timestamp) -> Value {
    let start = jiff::fmt::rfc2822::to_string(&starts.to_zoned(jiff::tz::TimeZone::UTC))
        .unwrap_or_default()
        .replace("+0000", "GMT");
    json!({
        "version": "0", "id": format!("soak-{}", uuid_like()), "detail-type": "AWS Health Event",
        "source": "aws.health", "account": "111111111111", "time": now_second().to_string(),
        "region": "eu-west-1", "resources": [instance],
        "detail": {
            "eventArn": "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/soak",
            "service": "EC2", "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange", "startTime": start,
            "affectedEntities": [{"entityValue": instance}],
        }
    })
}

/// The schedule's event, as EventBridge Scheduler sends it.
pub fn tick() -> Value {
    json!({"version": "0", "id": format!("soak-{}", uuid_like()), "detail-type": "Scheduled Event",
           "source": "aws.events", "account": "111111111111", "time": now_second().to_string(),
           "region": "eu-west-1", "resources": [], "detail": {}})
}

/// One schedule tick, as the last step of a seed; whether it succeeded.
pub async fn final_tick(world: &EventWorld) -> Result<(), String> {
    let invocation = Invocation {
        request_id: "soak-final-tick".into(),
        function_account: Some("111111111111".into()),
        budget: InvocationBudget::new(Duration::from_secs(60), Duration::ZERO),
    };
    handle_terminating_hook_event(&world.drainer, tick(), &invocation)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
