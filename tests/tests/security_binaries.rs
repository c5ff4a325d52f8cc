//! A sample of the bad-input corpus through the REAL function binaries, run by the local
//! Lambda Runtime API against the fake AWS endpoints and the fake API server (EKS tokens,
//! access entries, the shipped RBAC): each payload ends in an error or a clean
//! acknowledgement (never a timeout, a crash or a panic), and nothing is written. Then one
//! genuine termination and one genuine CreateNodegroup go through, so the functions really
//! signed EKS tokens and used their AWS credentials; finally every byte the processes wrote
//! (stdout and stderr) is scanned for tokens, secret keys and session tokens.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use node_manager_testkit::e2e::{CLUSTER, FunctionWorld, GROUP, INSTANCE, RunningFunction, Target};
use node_manager_testkit::lambda_api::InvocationOutcome;
use node_manager_testkit::soak::corpus::{self, BadPayload};
use node_manager_testkit::soak::secrets::SecretScanner;
use serde_json::json;

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
/// Every n-th payload of each corpus goes through the binary.
const SAMPLE_EVERY: usize = 9;

fn sample(payloads: Vec<BadPayload>) -> Vec<BadPayload> {
    payloads
        .into_iter()
        .enumerate()
        .filter(|(i, p)| {
            i % SAMPLE_EVERY == 0 || p.name.starts_with("file/") || p.name.starts_with("other-")
        })
        .map(|(_, p)| p)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binaries_refuse_bad_input_without_effect_and_never_log_a_secret() {
    let w = FunctionWorld::builder().start().await;
    let mut problems = Vec::new();
    let mut tried = 0;
    for RunningFunction {
        target, runtime, ..
    } in &w.functions
    {
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
                e.user.username == target.function_name() && WRITE_VERBS.contains(&e.verb.as_str())
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
    println!(
        "binaries: {tried} payloads tried, {} problems",
        problems.len()
    );
    assert!(tried >= 60, "only {tried} payloads sampled");
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Genuine work, so the processes really hold and use tokens and credentials.
    let notice = w
        .aws
        .autoscaling()
        .terminate_instance(GROUP, INSTANCE)
        .unwrap();
    // The real envelope SNS delivers (the fixture's), carrying the fake Auto Scaling's notice.
    let mut event = corpus::with_message(
        &corpus::fixture("sns-lifecycle-terminating.json"),
        &notice.message,
    );
    event["Records"][0]["Sns"]["Subject"] = json!(notice.subject);
    let terminating = &w.function(Target::TerminatingHook).runtime;
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
    let auth = &w.function(Target::NodegroupAuth).runtime;
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

    for RunningFunction {
        target,
        runtime,
        credentials: creds,
    } in &w.functions
    {
        let output = runtime.output();
        assert!(
            !output.is_empty(),
            "{} wrote no log",
            target.function_name()
        );
        SecretScanner::new().with_credentials(creds).assert_clean(
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
