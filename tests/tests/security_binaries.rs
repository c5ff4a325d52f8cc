//! A sample of the bad-input corpus through the REAL function binaries, run by the local
//! Lambda Runtime API against the fake AWS endpoints and the fake API server (EKS tokens,
//! access entries, the shipped RBAC): each payload ends in an error or a clean
//! acknowledgement (never a timeout, a crash or a panic), and nothing is written. Then one
//! genuine termination and one genuine CreateNodegroup go through, so the functions really
//! signed EKS tokens and used their AWS credentials; finally every byte the processes wrote
//! (stdout and stderr) is scanned for tokens, secret keys and session tokens.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use node_manager::aws::LifecycleActionResult;
use node_manager_testkit::account::{FakeAccount, FakeCredentials};
use node_manager_testkit::aws::{
    FakeAutoScalingGroup, FakeAws, FakeCluster, FakeInstance, FakeLifecycleHook, FakeNodegroup,
};
use node_manager_testkit::binaries::function_binary;
use node_manager_testkit::kube::FakeApiServer;
use node_manager_testkit::lambda_api::{FunctionSpec, InvocationOutcome, LambdaRuntimeApi};
use node_manager_testkit::soak::corpus::{self, BadPayload, Target};
use node_manager_testkit::soak::secrets::SecretScanner;
use serde_json::json;

const CLUSTER: &str = "ironman-2022";
const GROUP: &str = "eks-demo-ng-02c1ba5d-75b6-fbdf-4569-aa31827ad412";
const INSTANCE: &str = "i-07e9ea9eb19a67337";
const NODE: &str = "ip-192-168-12-34.eu-west-1.compute.internal";
const FUNCTIONS_GROUP: &str = "open-node-manager:functions";
const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
/// Every n-th payload of each corpus goes through the binary.
const SAMPLE_EVERY: usize = 9;

struct World {
    aws: FakeAws,
    server: FakeApiServer,
    functions: Vec<(Target, LambdaRuntimeApi, FakeCredentials)>,
}

async fn world() -> World {
    let account = FakeAccount::reference();
    let aws = FakeAws::start(account.clone()).await.unwrap();
    let server = FakeApiServer::builder()
        .cluster_name(CLUSTER)
        .account(account.clone())
        .access_entries(Arc::new(aws.eks()))
        .start()
        .await
        .unwrap();
    server
        .apply_manifest_file(&corpus::repository_root().join("infra/rbac.yaml"))
        .unwrap();
    aws.eks().add_cluster(
        FakeCluster::new(CLUSTER, server.url(), &server.ca_data())
            .authentication_mode(Some("API_AND_CONFIG_MAP")),
    );
    aws.eks()
        .add_nodegroup(
            CLUSTER,
            FakeNodegroup::new("demo-ng", &account.role_arn("demo-ng-node-role"))
                .ami_type("AL2_x86_64")
                .auto_scaling_group(GROUP),
        )
        .unwrap();
    let topic = aws.sns().create_topic("eks-asg-lifecycle-hook-topic");
    aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", CLUSTER)
            .availability_zones(&["eu-west-1a"]),
    );
    for hook in [
        FakeLifecycleHook::terminating("Terminate-LC-Hook"),
        FakeLifecycleHook::launching("Launch-LC-Hook"),
    ] {
        aws.autoscaling()
            .add_hook(
                GROUP,
                hook.heartbeat_timeout(Duration::from_secs(300))
                    .default_result(LifecycleActionResult::Continue)
                    .notification_target(&topic),
            )
            .unwrap();
    }
    aws.ec2().add_instance(
        FakeInstance::new(INSTANCE, "eu-west-1")
            .private_dns_name(NODE)
            .availability_zone("eu-west-1a"),
    );
    aws.autoscaling()
        .add_instance(GROUP, INSTANCE, "eu-west-1a")
        .unwrap();
    server
        .register_node(
            NODE,
            &format!("aws:///eu-west-1a/{INSTANCE}"),
            Some(Duration::ZERO),
        )
        .unwrap();

    let mut functions = Vec::new();
    for target in [
        Target::TerminatingHook,
        Target::LaunchingHook,
        Target::NodegroupAuth,
    ] {
        let name = target.function_name();
        let creds = account.add_role_credentials(&format!("open-node-manager-{name}"));
        aws.eks()
            .add_access_entry(
                CLUSTER,
                &creds.principal_arn,
                "STANDARD",
                Some(name),
                &[FUNCTIONS_GROUP],
            )
            .unwrap();
        let spec = FunctionSpec::new(name, function_binary(name))
            .envs(aws.environment(&creds))
            .env("CLUSTER_NAME", CLUSTER)
            .env("CONTINUATION_TOPIC_ARN", &topic)
            .env("SETTLE_SECONDS", "0")
            .env("DRAIN_TIMEOUT_SECONDS", "5")
            .env("LAUNCH_TIMEOUT_SECONDS", "2")
            .env("DELETE_WAIT_SECONDS", "1")
            .env("DELETE_POLL_SECONDS", "1")
            .env("HAND_OVER_MARGIN_SECONDS", "1")
            // The most verbose logging a function can be configured with: nothing it
            // logs may hold a credential.
            .env("RUST_LOG", "trace")
            .env("AWS_LAMBDA_LOG_LEVEL", "TRACE");
        let runtime = LambdaRuntimeApi::start_function(spec).await.unwrap();
        functions.push((target, runtime, creds));
    }
    World {
        aws,
        server,
        functions,
    }
}

fn sample(payloads: Vec<BadPayload>) -> Vec<BadPayload> {
    payloads
        .into_iter()
        .enumerate()
        .filter(|(i, p)| {
            i % SAMPLE_EVERY == 0 || p.name.starts_with("file/") || p.name.starts_with("other-")
        })
        // Known bug (BUGS.md): a well-formed notification naming an action that is not
        // pending is drained; tested in process by the ignored test.
        .filter(|(_, p)| {
            !(p.name.starts_with("forged/")
                || p.name.starts_with("hostile/LifecycleActionToken/")
                || p.name.starts_with("hostile/LifecycleHookName/"))
        })
        .map(|(_, p)| p)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binaries_refuse_bad_input_without_effect_and_never_log_a_secret() {
    let w = world().await;
    let mut problems = Vec::new();
    let mut tried = 0;
    for (target, runtime, _) in &w.functions {
        let payloads = match target {
            Target::NodegroupAuth => corpus::nodegroup_auth_corpus(),
            other => corpus::lifecycle_corpus(*other),
        };
        for payload in sample(payloads) {
            tried += 1;
            w.server.audit().clear();
            let outcome = runtime
                .invoke(&payload.event, Duration::from_secs(20))
                .await
                .unwrap();
            match &outcome {
                InvocationOutcome::Response(_) => {}
                InvocationOutcome::Error {
                    error_type,
                    error_message,
                } => {
                    if error_type.starts_with("Runtime.") || error_message.trim().is_empty() {
                        if problems.is_empty() {
                            problems.push(runtime.output().chars().take(3000).collect());
                        }
                        problems.push(format!(
                            "{}: {}: crashed or unclear error {error_type}: {error_message}",
                            target.function_name(),
                            payload.name
                        ));
                    }
                }
                InvocationOutcome::Timeout => problems.push(format!(
                    "{}: {}: timed out",
                    target.function_name(),
                    payload.name
                )),
            }
            let writes = w.server.audit().filter(|e| {
                e.user.username == target.function_name()
                    && WRITE_VERBS.contains(&e.verb.as_str())
            });
            for write in writes {
                problems.push(format!(
                    "{}: {}: wrote {}",
                    target.function_name(),
                    payload.name,
                    write.line()
                ));
            }
            if !w.aws.autoscaling().completions().is_empty() {
                problems.push(format!(
                    "{}: {}: completed a lifecycle action",
                    target.function_name(),
                    payload.name
                ));
            }
            let entries = w.aws.eks().access_entries(CLUSTER).len();
            if entries != 3 {
                problems.push(format!(
                    "{}: {}: {entries} access entries (3 seeded)",
                    target.function_name(),
                    payload.name
                ));
            }
        }
    }
    println!("binaries: {tried} payloads tried, {} problems", problems.len());
    assert!(tried >= 60, "only {tried} payloads sampled");
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Genuine work, so the processes really hold and use tokens and credentials.
    let notice = w.aws.autoscaling().terminate_instance(GROUP, INSTANCE).unwrap();
    let event = json!({"Records": [{
        "EventSource": "aws:sns", "EventVersion": "1.0",
        "EventSubscriptionArn": "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic:1",
        "Sns": {"Type": "Notification", "MessageId": "m-1",
                "TopicArn": "arn:aws:sns:eu-west-1:111111111111:eks-asg-lifecycle-hook-topic",
                "Subject": notice.subject, "Message": notice.message,
                "Timestamp": "2026-01-01T00:00:00.000Z", "MessageAttributes": {}}}]});
    let (_, terminating, _) = &w.functions[0];
    let outcome = terminating
        .invoke(&event, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        matches!(outcome, InvocationOutcome::Response(_)),
        "{outcome:?}\n{}",
        terminating.output()
    );
    assert_eq!(w.aws.autoscaling().completions().len(), 1);
    let (_, auth, _) = &w.functions[2];
    let outcome = auth
        .invoke(
            &corpus::fixture("eventbridge-create-nodegroup.json"),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome, InvocationOutcome::Response(_)),
        "{outcome:?}\n{}",
        auth.output()
    );
    let function_requests = w
        .server
        .audit()
        .filter(|e| e.user.username == "terminating-hook")
        .len();
    assert!(function_requests > 0, "the drain reached the API server");

    for (target, runtime, creds) in &w.functions {
        let output = runtime.output();
        assert!(!output.is_empty(), "{} wrote no log", target.function_name());
        SecretScanner::new()
            .with_credentials(creds)
            .assert_clean(
                &format!("{} process output", target.function_name()),
                &output,
            );
        assert!(
            !output.contains("panicked"),
            "{} panicked:\n{output}",
            target.function_name()
        );
    }
}
