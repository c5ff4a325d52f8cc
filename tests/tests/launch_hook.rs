//! The launching hook end to end, in process: `node_manager::launch::Launcher` with the real SDK
//! adapters against the fake AWS endpoints, and a real `kube::Client` (EKS token signed with
//! the function role's credentials, mapped by an access entry to the shipped RBAC group)
//! against the fake API server.
#![allow(clippy::unwrap_used)]

use node_manager::lifecycle::handler::Clients;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams};
use node_manager::aws::LifecycleActionResult;
use node_manager::aws::sdk::{SdkAutoScaling, SdkEks, SdkInstances, SdkNotifications};
use node_manager::cluster::ClusterAccess;
use node_manager::cluster::connection::EksConnection;
use node_manager::launch::{self, LaunchOutcome, Launcher};
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::LaunchSettings;
use node_manager_testkit::account::FakeAccount;
use node_manager_testkit::aws::{
    FakeAutoScalingGroup, FakeAws, FakeCluster, FakeLifecycleHook, SnsSubscription,
};
use node_manager_testkit::kube::{FakeApiServer, SimulationTimings};
use node_manager_testkit::soak::corpus;
use serde_json::Value;

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
const INSTANCE: &str = "i-0a1b2c3d4e5f60718";
const FUNCTION_GROUP: &str = "open-node-manager:launching-hook";

type Context =
    Launcher<Clients<EksConnection<SdkEks>, SdkAutoScaling, SdkInstances, SdkNotifications>>;

struct Scenario {
    aws: FakeAws,
    server: FakeApiServer,
    topic: String,
    subscription: SnsSubscription,
    ctx: Context,
    dns_name: String,
}

fn rbac_manifest() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/rbac.yaml")
}

/// A cluster with the shipped RBAC, a tagged group with a launch hook (heartbeat timeout
/// `heartbeat`), a running instance, and the function wired as it is in Lambda.
async fn scenario(settings: &[(&str, &str)], heartbeat: Duration) -> Scenario {
    let account = FakeAccount::reference();
    let credentials = account.add_role_credentials("launching-hook");
    let aws = FakeAws::start(account.clone()).await.unwrap();
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .account(account.clone())
        .access_entries(Arc::new(aws.eks()))
        .simulation(SimulationTimings::real_time())
        .start()
        .await
        .unwrap();
    server.apply_manifest_file(&rbac_manifest()).unwrap();
    aws.eks()
        .add_cluster(FakeCluster::new(CLUSTER, server.url(), &server.ca_data()));
    aws.eks()
        .add_access_entry(
            CLUSTER,
            &credentials.principal_arn,
            "STANDARD",
            None,
            &[FUNCTION_GROUP],
        )
        .unwrap();

    let topic = aws.sns().create_topic("eks-asg-lifecycle-hook-topic");
    let subscription = aws.sns().subscribe(&topic).unwrap();
    aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .availability_zones(&["eu-west-1a"])
            .tag("eks:cluster-name", CLUSTER),
    );
    aws.autoscaling()
        .add_hook(
            GROUP,
            FakeLifecycleHook::launching("Launch-LC-Hook")
                .heartbeat_timeout(heartbeat)
                .notification_target(&topic),
        )
        .unwrap();
    let dns_name = aws.ec2().add_running_instance(INSTANCE).private_dns_name;

    let sdk_config = aws.sdk_config(&credentials).await;
    let mut env: Vec<(&str, &str)> = vec![("CLUSTER_NAME", CLUSTER)];
    env.extend_from_slice(settings);
    let settings = LaunchSettings::from_source(env.as_slice()).unwrap();
    let no_override: &[(&str, &str)] = &[];
    let access =
        ClusterAccess::new(&sdk_config, CLUSTER, launch::FUNCTION_NAME).with_settings(no_override);
    let ctx = Launcher::new(
        EksConnection {
            access,
            eks: SdkEks::new(&sdk_config),
        },
        SdkAutoScaling::new(&sdk_config),
        SdkInstances::new(&sdk_config),
        SdkNotifications::new(&sdk_config),
        settings,
    );
    Scenario {
        aws,
        server,
        topic,
        subscription,
        ctx,
        dns_name,
    }
}

fn lambda_context(timeout: Duration) -> lambda_runtime::Context {
    let mut context = lambda_runtime::Context::default();
    context.request_id = "lambda-request".into();
    context.invoked_function_arn =
        "arn:aws:lambda:eu-west-1:111111111111:function:launching-hook".into();
    let deadline = SystemTime::now() + timeout;
    context.deadline = u64::try_from(
        deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    context
}

impl Scenario {
    /// Launches the instance; returns the SNS event Auto Scaling's notification became.
    async fn launch(&mut self) -> Value {
        self.aws
            .autoscaling()
            .launch_instance(GROUP, INSTANCE)
            .unwrap();
        self.subscription
            .next_event(Duration::from_secs(5))
            .await
            .expect("the launch notification reaches the topic")
    }

    fn provider_id(&self) -> String {
        format!("aws:///eu-west-1a/{INSTANCE}")
    }

    /// Writes by the function to nodes: must be none (a launching node is only read).
    fn node_writes(&self) -> Vec<String> {
        self.server
            .audit()
            .filter(|e| {
                e.resource() == "nodes" && !matches!(e.verb.as_str(), "get" | "list" | "watch")
            })
            .iter()
            .map(|e| e.line())
            .collect()
    }

    async fn node_events(&self, reason: &str) -> Vec<KubeEvent> {
        let client = self.server.admin_client().await.unwrap();
        let events: Api<KubeEvent> = Api::all(client);
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                        == Some(self.dns_name.as_str())
            })
            .collect()
    }
}

#[tokio::test]
async fn node_registering_late_is_completed_once_ready() {
    let mut s = scenario(
        &[("LAUNCH_TIMEOUT_SECONDS", "20")],
        Duration::from_secs(300),
    )
    .await;
    let event = s.launch().await;
    let registered_after = Duration::from_millis(400);
    let ready_after = Duration::from_millis(600);
    let server_store_node = {
        let dns_name = s.dns_name.clone();
        let provider_id = s.provider_id();
        let simulation = s.server.simulation().clone();
        tokio::spawn(async move {
            tokio::time::sleep(registered_after).await;
            simulation
                .register_node(&dns_name, &provider_id, Some(ready_after))
                .unwrap();
        })
    };
    let started = std::time::Instant::now();
    let report = s
        .ctx
        .handle(event, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    server_store_node.await.unwrap();
    let elapsed = started.elapsed();

    match &report.records[0].outcome {
        LaunchOutcome::Completed { node, .. } => assert_eq!(node, &s.dns_name),
        other => panic!("expected Completed, got {other:?}"),
    }
    assert!(
        elapsed >= registered_after + ready_after,
        "completed after {elapsed:?}, before the node was Ready"
    );
    let completions = s.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);
    assert_eq!(completions[0].instance_id, INSTANCE);
    assert_eq!(
        s.aws
            .autoscaling()
            .instance_state(GROUP, INSTANCE)
            .as_deref(),
        Some("InService")
    );
    assert!(s.node_writes().is_empty(), "{:?}", s.node_writes());
    assert_eq!(s.node_events("LaunchCompleted").await.len(), 1);
    // The wait used a watch, not a poll loop of GETs.
    let node_reads = s
        .server
        .audit()
        .filter(|e| e.resource() == "nodes" && e.verb == "get");
    assert!(node_reads.len() <= 1, "{} node GETs", node_reads.len());
    assert!(
        !s.server
            .audit()
            .filter(|e| e.resource() == "nodes" && e.verb == "watch")
            .is_empty()
    );
}

#[tokio::test]
async fn node_already_ready_is_completed_at_once() {
    let mut s = scenario(&[], Duration::from_secs(300)).await;
    s.server
        .register_node(&s.dns_name, &s.provider_id(), Some(Duration::ZERO))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let event = s.launch().await;
    let report = s
        .ctx
        .handle(event.clone(), &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(matches!(
        report.records[0].outcome,
        LaunchOutcome::Completed { .. }
    ));
    // A duplicate delivery finds the action done: success, no second completion.
    let again = s
        .ctx
        .handle(event, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(
        matches!(
            again.records[0].outcome,
            LaunchOutcome::AlreadyCompleted { .. }
        ),
        "{again:?}"
    );
    assert_eq!(s.aws.autoscaling().completions().len(), 1);
}

#[tokio::test]
async fn node_that_never_registers_gets_the_timeout_result() {
    let mut s = scenario(
        &[
            ("LAUNCH_TIMEOUT_SECONDS", "1"),
            ("LAUNCH_TIMEOUT_RESULT", "ABANDON"),
        ],
        Duration::from_secs(300),
    )
    .await;
    let event = s.launch().await;
    let started = std::time::Instant::now();
    let report = s
        .ctx
        .handle(event, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(
        report.records[0].outcome,
        LaunchOutcome::TimedOut {
            result: "ABANDON".into(),
            node: None,
            restored: None
        }
    );
    let completions = s.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0].result, LifecycleActionResult::Abandon);
    assert!(s.node_writes().is_empty());
}

#[tokio::test]
async fn node_registered_but_never_ready_times_out_with_continue() {
    let mut s = scenario(&[("LAUNCH_TIMEOUT_SECONDS", "1")], Duration::from_secs(300)).await;
    s.server
        .register_node(
            &s.dns_name,
            &s.provider_id(),
            Some(Duration::from_secs(3600)),
        )
        .unwrap();
    let event = s.launch().await;
    let report = s
        .ctx
        .handle(event, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        report.records[0].outcome,
        LaunchOutcome::TimedOut {
            result: "CONTINUE".into(),
            node: Some(s.dns_name.clone()),
            restored: None
        }
    );
    assert_eq!(
        s.aws.autoscaling().completions()[0].result,
        LifecycleActionResult::Continue
    );
    assert_eq!(s.node_events("LaunchTimedOut").await.len(), 1);
    assert!(s.node_writes().is_empty());
}

#[tokio::test]
async fn a_wait_longer_than_an_invocation_is_handed_over_and_keeps_its_deadline() {
    // Invocations of 2 s with a 0.5 s margin; the node turns Ready 3 s after launch.
    let mut s = scenario(
        &[
            ("LAUNCH_TIMEOUT_SECONDS", "20"),
            ("HAND_OVER_MARGIN_SECONDS", "0.5"),
        ],
        Duration::from_secs(300),
    )
    .await;
    let first_event = s.launch().await;
    s.server
        .register_node(
            &s.dns_name,
            &s.provider_id(),
            Some(Duration::from_millis(3000)),
        )
        .unwrap();
    let invocation = Duration::from_millis(2000);

    let mut event = first_event;
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        let report = s
            .ctx
            .handle(event.clone(), &lambda_context(invocation))
            .await
            .unwrap();
        let outcome = report.records[0].outcome.clone();
        outcomes.push(outcome.clone());
        if !matches!(outcome, LaunchOutcome::HandedOver { .. }) {
            break;
        }
        event = s
            .subscription
            .next_event(Duration::from_secs(5))
            .await
            .expect("the hand-over republished the notification");
    }
    assert!(
        matches!(outcomes[0], LaunchOutcome::HandedOver { continuation: 1 }),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes.last(), Some(LaunchOutcome::Completed { .. })),
        "{outcomes:?}"
    );
    assert_eq!(s.aws.autoscaling().completions().len(), 1);
    assert!(!s.aws.autoscaling().heartbeats().is_empty());
    // The republished message went to the hook's topic and kept the original time.
    let published: Vec<_> = s
        .aws
        .sns()
        .published()
        .into_iter()
        .filter(|p| p.topic_arn == s.topic)
        .collect();
    assert!(published.len() >= 2, "{published:?}");
    let original: Value = serde_json::from_str(&published[0].message).unwrap();
    let continued: Value = serde_json::from_str(&published[1].message).unwrap();
    assert_eq!(original["Time"], continued["Time"]);
    assert_eq!(continued["NodeManagerContinuation"], 1);
}

#[tokio::test]
async fn other_clusters_group_and_test_notification_touch_nothing() {
    let mut s = scenario(&[], Duration::from_secs(300)).await;
    s.aws
        .autoscaling()
        .add_group(FakeAutoScalingGroup::new("other-asg").tag("eks:cluster-name", "someone-else"));
    s.aws
        .autoscaling()
        .add_hook(
            "other-asg",
            FakeLifecycleHook::launching("Launch-LC-Hook").notification_target(&s.topic),
        )
        .unwrap();
    s.aws
        .autoscaling()
        .launch_instance("other-asg", "i-0b1b2c3d4e5f60719")
        .unwrap();
    let event = s
        .subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let report = s
        .ctx
        .handle(event, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(matches!(
        report.records[0].outcome,
        LaunchOutcome::NotOurs { .. }
    ));

    s.aws
        .autoscaling()
        .send_test_notification(GROUP, "Launch-LC-Hook")
        .unwrap();
    let test_event = s
        .subscription
        .next_event(Duration::from_secs(5))
        .await
        .unwrap();
    let report = s
        .ctx
        .handle(test_event, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(report.records[0].outcome, LaunchOutcome::TestNotification);

    assert!(s.aws.autoscaling().completions().is_empty());
    assert!(s.aws.autoscaling().has_active_action("i-0b1b2c3d4e5f60719"));
    // No Kubernetes request at all was needed.
    let function_requests = s
        .server
        .audit()
        .filter(|e| e.user.groups.iter().any(|g| g == FUNCTION_GROUP));
    assert!(function_requests.is_empty(), "{function_requests:?}");
}

#[tokio::test]
async fn unknown_transition_and_malformed_message_touch_nothing() {
    let mut s = scenario(&[], Duration::from_secs(300)).await;
    let event = s.launch().await;
    let message = corpus::message_of(&event);

    let mut unknown = event.clone();
    let mut edited = message.clone();
    edited["LifecycleTransition"] = "autoscaling:EC2_INSTANCE_WARMED".into();
    unknown["Records"][0]["Sns"]["Message"] = edited.to_string().into();
    let report = s
        .ctx
        .handle(unknown, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        report.records[0].outcome,
        LaunchOutcome::UnknownTransition {
            transition: "autoscaling:EC2_INSTANCE_WARMED".into()
        }
    );

    let mut malformed = event;
    let mut edited = message;
    edited["Time"] = "yesterday".into();
    malformed["Records"][0]["Sns"]["Message"] = edited.to_string().into();
    let error = s
        .ctx
        .handle(malformed, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("record 0") && error.contains("Time=\"yesterday\""),
        "{error}"
    );

    assert!(s.aws.autoscaling().completions().is_empty());
    assert!(s.aws.autoscaling().heartbeats().is_empty());
    assert!(s.aws.autoscaling().has_active_action(INSTANCE));
    let function_requests = s
        .server
        .audit()
        .filter(|e| e.user.groups.iter().any(|g| g == FUNCTION_GROUP));
    assert!(function_requests.is_empty(), "{function_requests:?}");
}

#[tokio::test]
async fn heartbeats_keep_a_short_hook_alive_while_waiting() {
    // A 1 s heartbeat timeout: without heartbeats Auto Scaling would give up after 1 s.
    let mut s = scenario(&[("LAUNCH_TIMEOUT_SECONDS", "20")], Duration::from_secs(1)).await;
    let event = s.launch().await;
    s.server
        .register_node(
            &s.dns_name,
            &s.provider_id(),
            Some(Duration::from_millis(2500)),
        )
        .unwrap();
    let report = s
        .ctx
        .handle(event, &lambda_context(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(
        matches!(report.records[0].outcome, LaunchOutcome::Completed { .. }),
        "{report:?}"
    );
    let completions = s.aws.autoscaling().completions();
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0].result, LifecycleActionResult::Continue);
    assert_eq!(
        completions[0].by,
        node_manager_testkit::aws::CompletedBy::Call,
        "{completions:?}"
    );
    assert!(
        s.aws.autoscaling().heartbeats().len() >= 3,
        "{:?}",
        s.aws.autoscaling().heartbeats()
    );
}

#[tokio::test]
async fn concurrent_duplicate_deliveries_complete_once() {
    let mut s = scenario(
        &[("LAUNCH_TIMEOUT_SECONDS", "20")],
        Duration::from_secs(300),
    )
    .await;
    let event = s.launch().await;
    s.server
        .register_node(
            &s.dns_name,
            &s.provider_id(),
            Some(Duration::from_millis(500)),
        )
        .unwrap();
    let context = lambda_context(Duration::from_secs(60));
    let (a, b, c) = tokio::join!(
        s.ctx.handle(event.clone(), &context),
        s.ctx.handle(event.clone(), &context),
        s.ctx.handle(event, &context),
    );
    let outcomes: Vec<LaunchOutcome> = [a, b, c]
        .into_iter()
        .map(|report| report.unwrap().records[0].outcome.clone())
        .collect();
    let completed = outcomes
        .iter()
        .filter(|o| matches!(o, LaunchOutcome::Completed { .. }))
        .count();
    let already = outcomes
        .iter()
        .filter(|o| matches!(o, LaunchOutcome::AlreadyCompleted { .. }))
        .count();
    assert_eq!((completed, already), (1, 2), "{outcomes:?}");
    assert_eq!(s.aws.autoscaling().completions().len(), 1);
    assert!(s.node_writes().is_empty());
}
