//! Plays a seed's timeline on its world: what AWS says changes, events are delivered in
//! process to the function they are for (the terminating hook, the instance refresh
//! function, node repair; the launching hook for instances out of the warm pool), duplicates
//! of one event at the same time concurrently; Auto Scaling terminates, pools or replaces what
//! the functions complete or mark,
//! an invocation that fails is retried as Lambda retries an asynchronous one, continuations
//! the drain publishes are delivered, and brownouts come and go.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::AwsErrorKind;
use node_manager::aws::ScheduledInstanceEvent;
use node_manager::drain::Invocation;
use node_manager::instance_notice::handle_terminating_hook_event;
use node_manager::instance_refresh::handler as refresh_handler;
use node_manager::lifecycle::budget::InvocationBudget;
use node_manager::lifecycle::notification::FOUND_WAITING_FIELD;
use node_manager::node_marks::refresh::refresh_marks_of;
use serde_json::{Value, json};

use super::check::{
    LIFECYCLE_NOT_DRAINED, REFRESH_MARK_ON_KEPT_NODE, REPAIR_BEYOND_LIMITS, REPAIR_MAX_PARALLEL,
    RoomView, Violation, budget_held, evictable_on, evictions_of, node_of, refresh_marks_have_room,
    repairs_in_flight,
};
use super::plan::{Delivery, Fate, Member, Step, Truth};
use super::world::{EventWorld, GROUPS, LAUNCH_HOOK, REFRESH_IDS};
use crate::fixtures::lifecycle_notification;
use crate::kube::{FaultAction, FaultId, FaultRule};
use crate::soak::corpus::{self, Target};

const ACCOUNT: &str = "111111111111";
/// Lambda retries a failed asynchronous invocation twice.
const LAMBDA_RETRIES: u32 = 2;

/// What playing a timeline came to.
#[derive(Debug, Default)]
pub struct Played {
    pub invocations: usize,
    pub failed_invocations: usize,
    pub continuations: usize,
    /// Of the continuations, the terminating actions the sweep found waiting with nobody
    /// draining them (their notification lost) and published again.
    pub redeliveries: usize,
    pub brownouts: usize,
    /// Steps after which invariant 9 was checked (a refresh took a node that accepted pods
    /// out of service).
    pub room_checks: usize,
    /// Every pod seen, and its node (to tell where an eviction came from).
    pub pods: BTreeMap<String, String>,
    /// What was seen wrong while playing (a lifecycle action completed with pods left).
    pub violations: Vec<Violation>,
}

/// The function an event is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Function {
    TerminatingHook,
    LaunchingHook,
    InstanceRefresh,
    NodeRepair,
}

/// An invocation to make: the function, the event and how many times Lambda has tried it.
struct Pending {
    function: Function,
    event: Value,
    attempt: u32,
}

/// Plays the timeline of one seed.
pub struct Player<'w> {
    world: &'w EventWorld,
    starts: BTreeMap<String, Timestamp>,
    /// When each group's refresh started (its `StartTime`), by group.
    refresh_started: BTreeMap<usize, Timestamp>,
    /// How many of node repair's `SetInstanceHealth` calls were seen.
    repairs_seen: usize,
    /// Instances stopped in the warm pool, to be launched out of it after the next step.
    pooled: Vec<Member>,
    rng: rand::rngs::StdRng,
    /// Nodes already reported carrying a refresh's mark they should not.
    wrongly_marked: std::collections::BTreeSet<String>,
    /// The cluster as invariant 9 reads it, as the last step left it; whether a lack of room
    /// was reported.
    room_before: RoomView,
    room_reported: bool,
    brownout: Option<(usize, Vec<FaultId>)>,
    retries: Vec<Pending>,
    completed: usize,
    pub played: Played,
}

impl<'w> Player<'w> {
    pub fn new(world: &'w EventWorld, seed: u64) -> Self {
        use rand::SeedableRng;
        let store = world.server.store();
        Self {
            room_before: RoomView::of(&store.list::<Node>(), &store.list::<Pod>()),
            room_reported: false,
            pooled: Vec::new(),
            repairs_seen: 0,
            rng: rand::rngs::StdRng::seed_from_u64(seed ^ 0x3a_97),
            world,
            starts: BTreeMap::new(),
            refresh_started: BTreeMap::new(),
            wrongly_marked: Default::default(),
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
            self.return_from_pool().await;
            i = j;
        }
        self.end_brownout();
        self.settle().await;
    }

    /// Lets what is in flight land: failed invocations are retried and what the functions
    /// published (continuations, the sweep's re-deliveries) delivered, until none is left.
    pub async fn settle(&mut self) {
        for _ in 0..20 {
            self.return_from_pool().await;
            let retries = std::mem::take(&mut self.retries);
            let continuations = self.continuations();
            self.played.continuations += continuations.len();
            self.played.redeliveries += continuations
                .iter()
                .filter(|p| p.event.to_string().contains(FOUND_WAITING_FIELD))
                .count();
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
                let function = function_of(delivery);
                let events: Vec<Value> = (0..copies)
                    .filter_map(|_| self.event_of(delivery))
                    .collect();
                self.played.invocations += events.len();
                let pending = events.into_iter().map(|event| Pending {
                    function,
                    event,
                    attempt: 0,
                });
                let runs = pending.map(|p| self.invoke_once(p));
                let failed: Vec<Option<Pending>> = futures::future::join_all(runs).await;
                let failed: Vec<Pending> = failed.into_iter().flatten().collect();
                self.played.failed_invocations += failed.len();
                self.retries.extend(failed);
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
        let result = match pending.function {
            Function::TerminatingHook => {
                let invocation = Invocation {
                    request_id: format!("soak-{}", uuid_like()),
                    function_account: Some(ACCOUNT.into()),
                    budget: InvocationBudget::new(Duration::from_secs(30), Duration::ZERO),
                };
                handle_terminating_hook_event(
                    &self.world.drainer,
                    pending.event.clone(),
                    &invocation,
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
            }
            Function::LaunchingHook => {
                use node_manager::lifecycle::handler::HookHandler;
                let invocation = Invocation {
                    request_id: format!("soak-{}", uuid_like()),
                    function_account: Some(ACCOUNT.into()),
                    budget: InvocationBudget::new(Duration::from_secs(30), Duration::ZERO),
                };
                let launcher = &self.world.launcher;
                Box::pin(launcher.handle_invocation(pending.event.clone(), &invocation))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            Function::NodeRepair => {
                let run = node_manager::node_repair::run::handle(
                    &self.world.repair,
                    pending.event.clone(),
                );
                Box::pin(run).await.map(|_| ()).map_err(|e| e.to_string())
            }
            Function::InstanceRefresh => {
                let handled =
                    refresh_handler::handle(&self.world.refresh, &pending.event, Some(ACCOUNT));
                Box::pin(handled)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        };
        match result {
            Ok(()) => None,
            Err(error) if pending.attempt < LAMBDA_RETRIES => {
                tracing::info!(%error, attempt = pending.attempt, "soak: invocation failed, Lambda retries it");
                Some(Pending {
                    attempt: pending.attempt + 1,
                    ..pending
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
        for (member, hook) in self.check_new_completions() {
            if hook == LAUNCH_HOOK {
                self.world
                    .set_group_state(&member.instance_id, Some("InService"));
            } else if member.fate.is_warm_pool_return() {
                self.send_to_pool(&member);
            } else {
                self.terminate(&member).await;
                // Auto Scaling's `EC2 Instance Terminate Successful`, for the refresh function.
                self.retries.push(Pending {
                    function: Function::InstanceRefresh,
                    event: instance_event(TERMINATED, &member),
                    attempt: 0,
                });
            }
        }
        self.check_refresh_marks();
        self.check_refresh_room();
        self.replace_repaired().await;
        if let Some((left, _)) = &mut self.brownout {
            *left = left.saturating_sub(1);
            if *left == 0 {
                self.end_brownout();
            }
        }
    }

    /// A refresh marks only the nodes it replaces (never a replacement, nor a node that
    /// stays), whatever order its events come in: checked after every step.
    fn check_refresh_marks(&mut self) {
        for node in self.world.server.store().list::<Node>() {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            let member = self.world.fleet.iter().find(|m| m.node == name);
            let replaced = member.is_some_and(|m| self.world.refresh_replaces(m));
            if replaced || refresh_marks_of(&node).is_none() || self.wrongly_marked.contains(&name)
            {
                continue;
            }
            self.played.violations.push(Violation {
                invariant: REFRESH_MARK_ON_KEPT_NODE,
                detail: format!(
                    "{name} ({:?}): marked by the instance refresh, which does not replace it",
                    member.map(|m| &m.fate)
                ),
            });
            self.wrongly_marked.insert(name);
        }
    }

    /// Refreshes take a node that accepted pods out of service only with room for the pods
    /// of every node they took out of service (invariant 9), checked after every step against
    /// the room the step began with.
    fn check_refresh_room(&mut self) {
        let store = self.world.server.store();
        let now = RoomView::of(&store.list::<Node>(), &store.list::<Pod>());
        let newly_taken = now.newly_taken(&self.room_before);
        if !newly_taken.is_empty() {
            self.played.room_checks += 1;
            if !self.room_reported
                && let Some(violation) =
                    refresh_marks_have_room(&self.room_before, &now, &newly_taken)
            {
                self.played.violations.push(violation);
                self.room_reported = true;
            }
        }
        self.room_before = now;
    }

    /// A terminating lifecycle action completes only once its node is drained; the members
    /// whose action completed since the last look, and the action's hook.
    fn check_new_completions(&mut self) -> Vec<(Member, String)> {
        let completions = self.world.autoscaling.completions();
        let mut done = Vec::new();
        for completion in &completions[self.completed..] {
            let Some(member) = self.world.member(&completion.action.instance_id) else {
                continue;
            };
            let hook = completion.action.lifecycle_hook_name.clone();
            done.push((member.clone(), hook.clone()));
            if hook == LAUNCH_HOOK {
                continue;
            }
            let left = evictable_on(self.world, &member.node);
            // A budget that refused to the end is honoured, not broken: the drain ran out of
            // time as `kubectl drain` would (a managed node group's PodEvictionFailure).
            if !left.iter().all(|pod| budget_held(self.world, pod)) {
                self.played.violations.push(Violation {
                    invariant: LIFECYCLE_NOT_DRAINED,
                    detail: format!(
                        "{}: completed with pods left: {}; cordoned then: {}",
                        member.instance_id,
                        eviction_answers(self.world, &left),
                        cordoned_nodes(self.world)
                    ),
                });
            }
        }
        self.completed = completions.len();
        done
    }

    fn continuations(&self) -> Vec<Pending> {
        let published = self.world.notifications.drain();
        let base = corpus::fresh_lifecycle_event(Target::TerminatingHook);
        published
            .into_iter()
            .map(|m| Pending {
                function: Function::TerminatingHook,
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
        let refreshes = &self.world.refreshes.faults;
        refreshes.fail("DescribeInstanceRefreshes", AwsErrorKind::Transient, 1);
        refreshes.fail("DescribeAutoScalingGroups", AwsErrorKind::Transient, 1);
        refreshes.fail("DescribeInstances", AwsErrorKind::Transient, 1);
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
        self.world.refreshes.faults.clear();
    }
}

/// `event` (an SNS lifecycle notification) with the route `origin -> destination`.
fn with_route(event: &Value, origin: &str, destination: &str) -> Value {
    let mut message = corpus::message_of(event);
    message["Origin"] = json!(origin);
    message["Destination"] = json!(destination);
    corpus::with_message(event, &message.to_string())
}

impl Player<'_> {
    /// Node repair marked instances unhealthy: each repair must be of a broken node and
    /// within EKS's limit (one instance of a group replaced at a time); Auto Scaling then starts the
    /// instance's terminating lifecycle action, whose notification reaches the terminating
    /// hook.
    async fn replace_repaired(&mut self) {
        let marked = self.world.health.marked_unhealthy();
        let new: Vec<String> = marked[self.repairs_seen.min(marked.len())..].to_vec();
        self.repairs_seen = marked.len();
        for id in new {
            let w = self.world;
            let member = w.member(&id).cloned();
            let in_flight = member
                .as_ref()
                .map(|m| repairs_in_flight(w, m.group))
                .unwrap_or_default();
            if in_flight.len() > REPAIR_MAX_PARALLEL
                || !member.as_ref().is_some_and(|m| m.fate == Fate::Unhealthy)
            {
                self.played.violations.push(Violation {
                    invariant: REPAIR_BEYOND_LIMITS,
                    detail: format!(
                        "{id} ({:?}) marked unhealthy with {} replacements in flight: {in_flight:?}",
                        member.as_ref().map(|m| &m.fate),
                        in_flight.len()
                    ),
                });
            }
            let Some(member) = member else { continue };
            w.autoscaling.start_action(&member.action());
            w.set_group_state(&id, Some("Terminating:Wait"));
            let event = lifecycle_notification(Target::TerminatingHook, &member.action());
            self.invoke(Pending {
                function: Function::TerminatingHook,
                event,
                attempt: 0,
            })
            .await;
        }
    }

    /// The instance's terminating action into the warm pool completed: Auto Scaling stops
    /// it (`Warmed:Stopped`), its node turns NotReady; it leaves the pool after the next step.
    fn send_to_pool(&mut self, member: &Member) {
        let w = self.world;
        w.set_state(member, "stopped");
        w.instances.set_state(&member.instance_id, "stopped");
        w.set_group_state(&member.instance_id, Some("Warmed:Stopped"));
        let _ = w.server.stop_node(&member.node);
        self.pooled.push(member.clone());
    }

    /// Every pooled instance is launched out of the warm pool: it runs again, its kubelet
    /// re-registers the node under its old name (Ready a moment later), and Auto Scaling's
    /// launching notification (`WarmPool -> AutoScalingGroup`) reaches the launching hook,
    /// once or twice at once; or, when the launch is lost, never: the hook's timeout puts
    /// the instance in service with its default result.
    async fn return_from_pool(&mut self) {
        use rand::Rng;
        for member in std::mem::take(&mut self.pooled) {
            let w = self.world;
            let action = member.launch_action();
            w.autoscaling.start_action(&action);
            w.set_running(&member);
            w.started_now(&member);
            w.instances.set_state(&member.instance_id, "running");
            w.set_group_state(&member.instance_id, Some("Pending:Wait"));
            let ready_after = Duration::from_millis(self.rng.random_range(0..300));
            let _ = w
                .server
                .restart_node(&member.node, &member.provider_id(), Some(ready_after));
            if member.fate == (Fate::WarmPoolReturn { launch_lost: true }) {
                w.autoscaling.time_out_action(&action);
                w.set_group_state(&member.instance_id, Some("InService"));
                self.after_step().await;
                continue;
            }
            let event = with_route(
                &lifecycle_notification(Target::LaunchingHook, &action),
                "WarmPool",
                "AutoScalingGroup",
            );
            let copies = if self.rng.random_bool(0.25) { 2 } else { 1 };
            self.played.invocations += copies;
            let runs = (0..copies).map(|_| {
                self.invoke_once(Pending {
                    function: Function::LaunchingHook,
                    event: event.clone(),
                    attempt: 0,
                })
            });
            let failed: Vec<Pending> = futures::future::join_all(runs)
                .await
                .into_iter()
                .flatten()
                .collect();
            self.played.failed_invocations += failed.len();
            self.retries.extend(failed);
            self.after_step().await;
        }
    }
}

/// Each pod with the answers its evictions got, in order (`-` for none asked), so a
/// violation says what held the pod: its budget, an injected fault, nothing at all.
fn eviction_answers(world: &EventWorld, pods: &[String]) -> String {
    let described: Vec<String> = pods
        .iter()
        .map(|pod| {
            let answers: Vec<String> = evictions_of(world, pod)
                .iter()
                .map(|e| match &e.injected_fault {
                    Some(fault) => format!("{} ({fault})", e.response_status.code),
                    None => e.response_status.code.to_string(),
                })
                .collect();
            let answers = if answers.is_empty() {
                "-".to_owned()
            } else {
                answers.join(" ")
            };
            format!("{pod} [{answers}]")
        })
        .collect();
    described.join(", ")
}

/// The cordoned nodes and the marks of ours they carry, for a violation's detail.
fn cordoned_nodes(world: &EventWorld) -> String {
    let described: Vec<String> = world
        .server
        .store()
        .list::<Node>()
        .iter()
        .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
        .map(|n| {
            let marks = node_manager::reconcile::NodeMarks::of(n);
            format!(
                "{} (drain record: {}, refresh record: {}, maintenance plan: {})",
                marks.node,
                marks.checkpoint.is_some(),
                marks.refresh.is_some(),
                marks.maintenance.is_some()
            )
        })
        .collect();
    described.join(", ")
}

fn function_of(delivery: &Delivery) -> Function {
    match delivery {
        Delivery::RepairRun => Function::NodeRepair,
        Delivery::RefreshStart(_)
        | Delivery::RefreshCheckpoint(_)
        | Delivery::RefreshEnd(..)
        | Delivery::InstanceLaunched(_) => Function::InstanceRefresh,
        _ => Function::TerminatingHook,
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
                    let state = if m.fate.is_warm_pool_return() {
                        "Warmed:Pending:Wait"
                    } else {
                        "Terminating:Wait"
                    };
                    w.set_group_state(id, Some(state));
                }
            }
            Truth::KubeletDies(id) => {
                if let Some(m) = member(id) {
                    let since = Timestamp::now() - jiff::SignedDuration::from_secs(40 * 60);
                    let _ = w.server.kill_kubelet_since(&m.node, since);
                }
            }
            Truth::Launched(id) => {
                if let Some(m) = member(id) {
                    w.launch(&m);
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
            Truth::StartedAgain(id) => {
                self.set_state(id, "running");
                if let Some(m) = member(id) {
                    w.started_now(&m);
                }
            }
            Truth::Scheduled { instance, soon } => {
                let ahead = if *soon { 600 } else { 2 * 86_400 };
                let starts = Timestamp::from_second(Timestamp::now().as_second() + ahead)
                    .unwrap_or_else(|_| Timestamp::now());
                self.starts.insert(instance.clone(), starts);
                w.instances
                    .notices
                    .set_schedule(instance, self.schedule_of(instance, starts, ""));
            }
            Truth::Cancelled(id) => {
                if let Some(starts) = self.starts.get(id) {
                    let schedule = self.schedule_of(id, *starts, "[Canceled] ");
                    w.instances.notices.set_schedule(id, schedule);
                }
            }
            Truth::RefreshRuns(group) => {
                // EC2 reports launch times to the second: the start is a second after the
                // fleet's launch, and replacements launch after it.
                let started = now_second();
                self.refresh_started.insert(*group, started);
                w.set_refresh(*group, "InProgress", started);
            }
            Truth::RefreshOver(group, status) => {
                let started = self.refresh_started.get(group).copied();
                w.set_refresh(*group, status, started.unwrap_or_else(now_second));
            }
        }
    }

    /// EC2's schedule for `instance`: its retirement at `starts` (`prefix` `[Canceled] ` once
    /// cancelled) and, for a member with `another`, an unrelated reboot ten days after it
    /// that stays pending.
    fn schedule_of(
        &self,
        instance: &str,
        starts: Timestamp,
        prefix: &str,
    ) -> Vec<ScheduledInstanceEvent> {
        let mut events = vec![retirement(starts, prefix)];
        let another = self
            .world
            .member(instance)
            .is_some_and(|m| matches!(m.fate, Fate::Maintenance { another: true, .. }));
        if another {
            let later = Timestamp::from_second(starts.as_second() + 10 * 86_400).unwrap_or(starts);
            events.push(ScheduledInstanceEvent {
                id: Some(format!("instance-event-{}", &instance[2..])),
                code: "instance-reboot".into(),
                not_before: Some(later),
                description: "The instance is scheduled for a reboot".into(),
            });
        }
        events
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
        w.set_group_state(&member.instance_id, None);
        let store = w.server.store();
        for pod in store.list::<Pod>() {
            if node_of(&pod) == Some(&member.node) {
                let _ = store.remove::<Pod>(
                    pod.metadata.namespace.as_deref().unwrap_or(""),
                    pod.metadata.name.as_deref().unwrap_or(""),
                );
            }
        }
        let _ = store.remove::<Node>("", &member.node);
    }

    /// The event EventBridge or SNS delivers for `delivery`.
    fn event_of(&self, delivery: &Delivery) -> Option<Value> {
        let w = self.world;
        Some(match delivery {
            Delivery::Lifecycle(id) => {
                let member = w.member(id)?;
                let event = lifecycle_notification(Target::TerminatingHook, &member.action());
                if member.fate.is_warm_pool_return() {
                    with_route(&event, "AutoScalingGroup", "WarmPool")
                } else {
                    event
                }
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
            Delivery::Tick | Delivery::RepairRun => tick(),
            Delivery::RefreshStart(group) => refresh_event("Started", *group),
            Delivery::RefreshCheckpoint(group) => refresh_event("Checkpoint Reached", *group),
            Delivery::RefreshEnd(group, outcome) => refresh_event(outcome, *group),
            Delivery::InstanceLaunched(id) => instance_event(LAUNCHED, w.member(id)?),
        })
    }
}

const LAUNCHED: &str = "EC2 Instance Launch Successful";
const TERMINATED: &str = "EC2 Instance Terminate Successful";

fn group_arn(group: &str) -> String {
    format!(
        "arn:aws:autoscaling:eu-west-1:{ACCOUNT}:autoScalingGroup:5f0e7e7e-0000-4000-8000-000000000035:autoScalingGroupName/{group}"
    )
}

/// `EC2 Auto Scaling Instance Refresh {what}` of `group`'s refresh, as Auto Scaling sends it
/// to EventBridge.
fn refresh_event(what: &str, group: usize) -> Value {
    let (name, id) = (GROUPS[group], REFRESH_IDS[group]);
    json!({
        "version": "0", "id": format!("soak-{}", uuid_like()),
        "detail-type": format!("EC2 Auto Scaling Instance Refresh {what}"),
        "source": "aws.autoscaling", "account": ACCOUNT, "time": now_second().to_string(),
        "region": "eu-west-1", "resources": [group_arn(name)],
        "detail": {"InstanceRefreshId": id, "AutoScalingGroupName": name},
    })
}

/// `EC2 Instance Launch Successful` or `EC2 Instance Terminate Successful` of `member`.
fn instance_event(detail_type: &str, member: &Member) -> Value {
    let now = now_second().to_string();
    let (instance, group) = (&member.instance_id, member.group_name());
    json!({
        "version": "0", "id": format!("soak-{}", uuid_like()), "detail-type": detail_type,
        "source": "aws.autoscaling", "account": ACCOUNT, "time": now, "region": "eu-west-1",
        "resources": [group_arn(group), format!("arn:aws:ec2:eu-west-1:{ACCOUNT}:instance/{instance}")],
        "detail": {
            "StatusCode": "InProgress", "AutoScalingGroupName": group,
            "ActivityId": format!("soak-activity-{}", uuid_like()), "RequestId": "soak",
            "EC2InstanceId": instance, "StartTime": now, "EndTime": now,
            "Cause": "an instance refresh, in the soak", "Details": {"Subnet ID": "subnet-0soak"},
        }
    })
}

fn retirement(starts: Timestamp, prefix: &str) -> ScheduledInstanceEvent {
    ScheduledInstanceEvent {
        id: None,
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
