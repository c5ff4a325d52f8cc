//! `aws-auth` under concurrency: many `CreateNodegroup` events for different roles at once,
//! each in its own function process (as Lambda runs concurrent events), against a large
//! `mapRoles`; then the cost of a redelivery that has nothing to do.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use crate::lambda_api::{InvocationOutcome, LambdaRuntimeApi};
use crate::sandbox::{Sandbox, Scenario};

#[derive(Debug, Clone)]
pub struct AwsAuthFigures {
    pub existing_entries: usize,
    pub concurrent_events: usize,
    /// First event sent → last response (cold processes: includes their start).
    pub wall: Duration,
    /// `409 Conflict` answers to `aws-auth` writes, each retried by re-reading.
    pub conflicts: usize,
    /// Successful `aws-auth` writes.
    pub writes: usize,
    /// Whether every new role is mapped exactly once and every old entry kept.
    pub all_present_once: bool,
    /// Kubernetes requests a redelivered (already applied) event made, by verb.
    pub redelivery_requests: BTreeMap<String, usize>,
}

/// `concurrent` node groups created at once against a `mapRoles` of `existing` entries.
pub async fn aws_auth_concurrency(
    existing: usize,
    concurrent: usize,
) -> Result<AwsAuthFigures, String> {
    let mut yaml = String::from(
        "name: aws-auth-bench\ndescription: concurrent CreateNodegroup events\nnodegroups:\n",
    );
    for i in 0..concurrent {
        yaml.push_str(&format!(
            "  - {{ name: ng-{i:02}, autoScalingGroup: asg-{i:02}, nodeRole: bench-role-{i:02} }}\n"
        ));
    }
    yaml.push_str("steps: []\n");
    let scenario = Scenario::from_yaml(&yaml).map_err(|e| e.to_string())?;
    let sandbox = Sandbox::start(scenario, false)
        .await
        .map_err(|e| e.to_string())?;
    let store = sandbox.server().store();
    store
        .modify::<ConfigMap>("kube-system", "aws-auth", |cm| {
            let roles = cm
                .data
                .get_or_insert_with(Default::default)
                .entry("mapRoles".to_owned())
                .or_default();
            for i in 0..existing {
                roles.push_str(&format!(
                    "- rolearn: arn:aws:iam::111111111111:role/existing-team-role-{i:04}\n  username: team-{i:04}\n  groups:\n    - team-{i:04}-viewers\n"
                ));
            }
        })
        .map_err(|e| e.to_string())?;
    let spec = sandbox
        .function_spec("nodegroup-auth")
        .ok_or("no nodegroup-auth spec")?;
    let mut processes = Vec::with_capacity(concurrent);
    for _ in 0..concurrent {
        processes.push(
            LambdaRuntimeApi::start_function(spec.clone())
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let events: Vec<Value> = (0..concurrent)
        .map(|i| sandbox.nodegroup_event_payload("CreateNodegroup", &format!("ng-{i:02}")))
        .collect();
    sandbox.server().audit().clear();
    let started = Instant::now();
    let outcomes = futures::future::join_all(
        processes
            .iter()
            .zip(&events)
            .map(|(process, event)| process.invoke(event, Duration::from_secs(60))),
    )
    .await;
    let wall = started.elapsed();
    for outcome in outcomes {
        match outcome.map_err(|e| e.to_string())? {
            InvocationOutcome::Response(_) => {}
            other => return Err(format!("a CreateNodegroup event failed: {other:?}")),
        }
    }
    let audit = sandbox.server().audit();
    let writes_to_aws_auth = |code: u16| {
        audit
            .filter(|e| {
                e.name() == "aws-auth"
                    && matches!(e.verb.as_str(), "update" | "patch" | "create")
                    && e.code() == code
            })
            .len()
    };
    let conflicts = writes_to_aws_auth(409);
    let writes = writes_to_aws_auth(200) + writes_to_aws_auth(201);

    let map_roles = store
        .find::<ConfigMap>("kube-system", "aws-auth")
        .and_then(|cm| cm.data)
        .and_then(|d| d.get("mapRoles").cloned())
        .unwrap_or_default();
    let entries: Vec<BTreeMap<String, Value>> =
        serde_saphyr::from_str(&map_roles).map_err(|e| e.to_string())?;
    let count = |arn: &str| {
        entries
            .iter()
            .filter(|e| e.get("rolearn").and_then(Value::as_str) == Some(arn))
            .count()
    };
    let all_present_once = (0..concurrent)
        .all(|i| count(&format!("arn:aws:iam::111111111111:role/bench-role-{i:02}")) == 1)
        && (0..existing).all(|i| {
            count(&format!(
                "arn:aws:iam::111111111111:role/existing-team-role-{i:04}"
            )) == 1
        });

    audit.clear();
    processes[0]
        .invoke(&events[0], Duration::from_secs(60))
        .await
        .map_err(|e| e.to_string())?;
    let mut redelivery_requests = BTreeMap::new();
    for event in audit.events() {
        *redelivery_requests.entry(event.verb.clone()).or_insert(0) += 1;
    }
    for process in &processes {
        process.kill().await;
    }
    sandbox.shutdown().await;
    Ok(AwsAuthFigures {
        existing_entries: existing,
        concurrent_events: concurrent,
        wall,
        conflicts,
        writes,
        all_present_once,
        redelivery_requests,
    })
}
