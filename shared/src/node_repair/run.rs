//! One scheduled run: read the Nodes, keep ours ([`scope`](super::scope)), decide per group
//! ([`decide_group`]), act ([`act`](super::act)), report ([`report`](super::report)).
//!
//! Requests per run: the Node list (pages of [`NODE_PAGE_SIZE`]), one
//! `DescribeAutoScalingInstances` per 50 instances, one `DescribeAutoScalingGroups` per 50
//! groups, one `DescribeInstances` per 200 in-service nodes with a bad condition (their
//! instances' launch times), and per repair one annotation patch, one AWS action and one Event. Nothing is
//! cached between runs: every decision rests on what this run saw.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde_json::Value;

use crate::aws::{InstanceHealth, RepairInstances};
use crate::cluster::connection::KubeConnection;
use crate::cluster::pages::Pages;

use super::act::Repairs;
use super::decision::decide_group;
use super::report::{NOT_OURS, RepairError, RepairReport, log_decision};
use super::scope;
use super::settings::RepairSettings;

/// Nodes per page of the list.
pub(crate) const NODE_PAGE_SIZE: u32 = 500;

/// Everything a run needs, built once per execution environment.
pub struct RepairContext<K, H, R> {
    pub kube: K,
    pub health: H,
    pub ec2: R,
    pub settings: RepairSettings,
}

/// Runs once. The event (an EventBridge schedule) carries nothing the run needs.
pub async fn handle<K, H, R>(
    ctx: &RepairContext<K, H, R>,
    _event: Value,
) -> Result<RepairReport, RepairError>
where
    K: KubeConnection,
    H: InstanceHealth,
    R: RepairInstances,
{
    let settings = &ctx.settings;
    let client = ctx.kube.client().await?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    // Boxed sub-futures keep this future's type shallow (the compiler's layout query depth).
    let (nodes, node_pages) = Box::pin(list_nodes(&nodes_api)).await?;

    let mut reports = Vec::new();
    let candidates = scope::candidates(&nodes, &mut reports);
    let memberships = Box::pin(scope::read_memberships(&ctx.health, &candidates)).await?;
    let mut groups = scope::our_groups(settings, candidates, &memberships, &mut reports);
    Box::pin(scope::read_launch_times(&ctx.ec2, &mut groups)).await?;

    let now = Timestamp::now();
    let mut repairs = Repairs::new(ctx, &nodes_api, &client, now);
    let mut summaries = Vec::new();
    for group in groups.values() {
        let decision = decide_group(&settings.policy, &group.observation, now);
        let summary = Box::pin(repairs.act_on_group(group, decision, &mut reports)).await;
        summary.emit_metrics(settings.dry_run);
        summaries.push(summary);
    }
    for report in reports.iter().filter(|r| r.outcome == NOT_OURS) {
        log_decision(report, settings.dry_run);
    }
    repairs.finish()?;

    reports.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(RepairReport {
        dry_run: settings.dry_run,
        nodes: reports,
        groups: summaries,
        node_pages,
    })
}

async fn list_nodes(api: &Api<Node>) -> Result<(Vec<Node>, u32), RepairError> {
    let mut pages = Pages::new(api.clone(), ListParams::default().limit(NODE_PAGE_SIZE));
    let mut nodes = Vec::new();
    let mut count = 0;
    while let Some(page) = pages.next().await.map_err(RepairError::ListNodes)? {
        count += 1;
        nodes.extend(page);
    }
    Ok((nodes, count))
}
