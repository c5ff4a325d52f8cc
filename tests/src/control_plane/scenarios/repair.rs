//! Node repair of a node whose kubelet died: `node-repair` (on its schedule) sees the node
//! Healthy, then NotReady and Waiting, then past the threshold marks its instance unhealthy;
//! Auto Scaling replaces it and the terminating hook drains the dead node without waiting for
//! deletions its kubelet will never confirm.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::nginx::{nginx_pods, seed_nginx};
use super::{Played, next_notification, response};
use crate::aws::FakeAutoScalingGroup;
use crate::control_plane::ControlPlaneError;
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::{CLUSTER, GROUP, RunningFunction, Target};

/// The repair threshold: `minRepairWaitTimeMins` 0.025, 1.5 s.
const REPAIR_CONFIG: &str = r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 0.025, "repairAction": "Replace"}]}"#;

pub async fn play(bin: &Path) -> Result<Played, ControlPlaneError> {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::NodeRepair, Target::TerminatingHook])
        .env("REPAIR_CONFIG", REPAIR_CONFIG)
        .env("STUCK_POD_SECONDS", "1")
        .start(bin)
        .await?;
    w.aws.autoscaling().add_group(
        FakeAutoScalingGroup::new(GROUP)
            .tag("eks:cluster-name", CLUSTER)
            .availability_zones(&["eu-west-1a"])
            .health_check_grace_period(Duration::ZERO),
    );
    let admin = w.plane.admin_client().await?;
    seed_nginx(&w, &admin, 1).await?;
    let mut played = Played::on(&w);
    let repair = w.function(Target::NodeRepair);
    expect_repair(
        &mut played,
        repair,
        &w.node,
        "Healthy",
        "while its kubelet runs",
    )
    .await?;
    played.line(format!("the kubelet of {} dies", w.node));
    w.kubelets.kill(&w.node).await?;
    expect_repair(
        &mut played,
        repair,
        &w.node,
        "Waiting",
        "before the threshold",
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let mut topic = w.aws.sns().subscribe(&w.topic).map_err(setup)?;
    expect_repair(&mut played, repair, &w.node, "Repair", "past the threshold").await?;
    let marked = w.aws.requests_for("SetInstanceHealth").len();
    played.expect(
        "its instance marked unhealthy once",
        marked == 1,
        format!("{marked} SetInstanceHealth requests"),
    );
    w.aws
        .autoscaling()
        .wait_for_health_replacement(&w.instance, Duration::from_secs(5))
        .await
        .ok_or_else(|| setup("no replacement of the unhealthy instance within 5 s"))?;
    let terminating = loop {
        let event = next_notification(&mut topic).await?;
        if event.to_string().contains("EC2_INSTANCE_TERMINATING") {
            break event;
        }
    };
    played.line(format!("Auto Scaling replaces {}", w.instance));
    let started = Instant::now();
    let answer = response(w.function(Target::TerminatingHook), &terminating).await?;
    let took = started.elapsed();
    played.expect(
        "the terminating hook drained the dead node within 15 s",
        answer["records"][0]["outcome"] == "Completed" && took < Duration::from_secs(15),
        format!("after {took:?}: {answer}"),
    );
    let pods = nginx_pods(&admin).await;
    let on_dead_node: Vec<_> = pods.iter().filter(|p| p.node == w.node).collect();
    played.expect(
        "every one of its pods evicted and left Terminating (nothing else removes a dead kubelet's pods)",
        !on_dead_node.is_empty() && on_dead_node.iter().all(|p| p.terminating),
        format!("{pods:#?}"),
    );
    Ok(played)
}

/// Invokes `node-repair` as its schedule does and expects `outcome` for `node`.
async fn expect_repair(
    played: &mut Played,
    repair: &RunningFunction,
    node: &str,
    outcome: &str,
    when: &str,
) -> Result<(), ControlPlaneError> {
    let answer = response(repair, &scheduled_event()).await?;
    let seen = answer["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == node))
        .map(|n| n["outcome"].clone());
    played.expect(
        format!("node-repair finds the node {outcome} {when}"),
        seen.as_ref().is_some_and(|o| o == outcome),
        &answer,
    );
    Ok(())
}

/// What EventBridge sends on a schedule; node-repair needs none of it.
fn scheduled_event() -> Value {
    json!({
        "version": "0", "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event", "source": "aws.events", "account": "111111111111",
        "time": "2026-11-24T02:00:00Z", "region": "eu-west-1",
        "resources": ["arn:aws:events:eu-west-1:111111111111:rule/node-repair"], "detail": {}
    })
}

fn setup(error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::setup("the repair scenario", error)
}
