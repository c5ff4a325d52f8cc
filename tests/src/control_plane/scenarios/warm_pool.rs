//! A node back from the warm pool: scaled in with reuse, the terminating hook drains the node
//! (cordon, label, taint, record) and the instance stops in the pool; launched from the pool,
//! the launching hook undoes exactly that in one conditional write.

use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::Value;

use super::{Played, next_notification, response};
use crate::aws::WarmPoolState;
use crate::control_plane::ControlPlaneError;
use crate::control_plane::workload::writes_of;
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::{GROUP, Target};
use crate::kube::AuditEvent;

const TAINT: &str = "example.com/draining";

pub async fn play(bin: &Path) -> Result<Played, ControlPlaneError> {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook, Target::LaunchingHook])
        .env("NODE_TAINT", &format!("{TAINT}=true:NoSchedule"))
        .env("SETTLE_SECONDS", "0.1")
        .env("LAUNCH_TIMEOUT_SECONDS", "20")
        .start(bin)
        .await?;
    let nodes: Api<Node> = Api::all(w.plane.admin_client().await?);
    let autoscaling = w.aws.autoscaling();
    let mut played = Played::on(&w);
    autoscaling.set_warm_pool(GROUP, WarmPoolState::Stopped);
    let mut topic = w.aws.sns().subscribe(&w.topic).map_err(setup)?;
    played.line(format!(
        "scale-in of {} into the warm pool (stopped)",
        w.instance
    ));
    autoscaling
        .scale_in_to_warm_pool(GROUP, &w.instance)
        .map_err(setup)?;
    let to_pool = next_notification(&mut topic).await?;
    let answer = response(w.function(Target::TerminatingHook), &to_pool).await?;
    played.expect(
        "the terminating hook drained the node into the pool",
        answer["records"][0]["outcome"] == "Completed",
        &answer,
    );
    let marks = node_marks(&nodes.get(&w.node).await.map_err(setup)?);
    played.expect(
        "the node cordoned, labelled, tainted and its drain recorded",
        marks == Marks::ALL,
        format!("{marks:?}"),
    );
    played.line(format!("{} launched from the warm pool", w.instance));
    autoscaling
        .launch_from_warm_pool(GROUP, &w.instance)
        .map_err(setup)?;
    let back = next_notification(&mut topic).await?;
    let answer = response(w.function(Target::LaunchingHook), &back).await?;
    expect_undone(&mut played, &answer);
    let marks = node_marks(&nodes.get(&w.node).await.map_err(setup)?);
    played.expect(
        "the node left with none of the drain's marks",
        marks == Marks::NONE,
        format!("{marks:?}"),
    );
    expect_one_conditional_write(&mut played, &w.plane.audit());
    let completions = w.aws.autoscaling().completions();
    played.expect(
        "both lifecycle actions completed",
        completions.len() == 2,
        format!("{completions:?}"),
    );
    Ok(played)
}

fn expect_undone(played: &mut Played, answer: &Value) {
    played.expect(
        "the launching hook completed the node's return",
        answer["records"][0]["outcome"] == "Completed",
        answer,
    );
    let restored = &answer["records"][0]["restored"];
    played.expect(
        "it says it uncordoned and unlabelled the node",
        restored["uncordoned"] == true && restored["unlabelled"] == true,
        answer,
    );
}

/// The launching hook undid the marks in one node patch, conditional on the node's
/// `resourceVersion`.
fn expect_one_conditional_write(played: &mut Played, audit: &[AuditEvent]) {
    let user = RealFunctionWorld::username(Target::LaunchingHook);
    let patches: Vec<AuditEvent> = writes_of(audit, user)
        .into_iter()
        .filter(|e| e.resource() == "nodes" && e.verb == "patch")
        .collect();
    let conditional = patches.first().is_some_and(|p| {
        p.request_object
            .as_ref()
            .is_some_and(|sent| sent["metadata"]["resourceVersion"].is_string())
    });
    played.expect(
        "undone in one node patch carrying the node's resourceVersion",
        patches.len() == 1 && conditional,
        format!("{patches:?}"),
    );
}

/// What the drain leaves on a node: cordoned, labelled out of load balancers, tainted,
/// recorded (the checkpoint annotation).
#[derive(Debug, PartialEq, Eq)]
struct Marks {
    cordoned: bool,
    labelled: bool,
    tainted: bool,
    recorded: bool,
}

impl Marks {
    const ALL: Self = Self {
        cordoned: true,
        labelled: true,
        tainted: true,
        recorded: true,
    };
    const NONE: Self = Self {
        cordoned: false,
        labelled: false,
        tainted: false,
        recorded: false,
    };
}

fn node_marks(node: &Node) -> Marks {
    use node_manager::node_marks::EXCLUDE_FROM_LOAD_BALANCERS_LABEL;
    use node_manager::node_marks::checkpoint::CHECKPOINT_ANNOTATION;
    let spec = node.spec.as_ref();
    let labels = node.metadata.labels.as_ref();
    let annotations = node.metadata.annotations.as_ref();
    Marks {
        cordoned: spec.and_then(|s| s.unschedulable) == Some(true),
        labelled: labels.is_some_and(|l| l.contains_key(EXCLUDE_FROM_LOAD_BALANCERS_LABEL)),
        tainted: spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TAINT)),
        recorded: annotations.is_some_and(|a| a.contains_key(CHECKPOINT_ANNOTATION)),
    }
}

fn setup(error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::setup("the warm pool scenario", error)
}
