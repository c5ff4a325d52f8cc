//! Node updates by instance refresh: a group of N nodes carrying Deployments behind PDBs is
//! refreshed (launch before terminate, and terminate first), once with `instance-refresh`
//! receiving the refresh and instance events and once without, in fresh worlds. The figures
//! are what the fakes saw: evictions per pod on the outdated nodes, pods scheduled onto an
//! outdated node after the start, pods moved twice, Pending pod-seconds (how long the evicted
//! pods' replacements waited for a node), PDB violations and the time to the refresh's end. The
//! nodes report the images they pulled, and the fake scheduler weighs them as kube-scheduler
//! does (ImageLocality against topology spread and the resource scores): the old nodes hold
//! the images, which can send an evicted pod to the next outdated node when nothing marks it.

use crate::sandbox::Scenario;
use crate::sandbox::scenario::InstanceRefreshStep;
use crate::sandbox::steps::RefreshFigures;

use super::drain::start;

/// One measured refresh.
#[derive(Debug, Clone)]
pub struct RefreshRow {
    pub nodes: usize,
    /// Availability zones the group spans.
    pub zones: usize,
    pub launch_before_terminate: bool,
    pub with_instance_refresh: bool,
    pub figures: RefreshFigures,
}

/// The world: one group of `nodes` nodes over `zones` availability zones, `nodes`
/// Deployments of `nodes` replicas with `maxUnavailable: 1` (one pod of each per node, so
/// every node carries one pod of each), and the aws-node DaemonSet.
fn scenario(nodes: usize, zones: usize, refresh_events: bool) -> String {
    scenario_with(nodes, zones, refresh_events, REFRESH_TIMINGS, "")
}

/// The timings of the refresh benchmarks: drains, nodes and pods in fractions of a second.
const REFRESH_TIMINGS: &str = "settleSeconds: 0.2, drainTimeoutSeconds: 30, launchTimeoutSeconds: 20, nodeRegisterSeconds: 0.3, nodeReadySeconds: 0.3, podStartSeconds: 0.3, gracePeriodScale: 0.01, deregistrationDelaySeconds: 0";

/// [`scenario`] with its `timings` (the inside of the flow mapping) and `extra` top-level
/// lines.
fn scenario_with(
    nodes: usize,
    zones: usize,
    refresh_events: bool,
    timings: &str,
    extra: &str,
) -> String {
    let mut yaml = format!(
        "name: refresh-{nodes}\nrefreshEvents: {refresh_events}\ntimings: {{ {timings} }}\n{extra}nodegroups:\n  - {{ name: ng, autoScalingGroup: asg-refresh, nodeRole: NodeRole, nodes: {nodes}, zones: {zones} }}\nworkloads:\n  - {{ kind: DaemonSet, namespace: kube-system, name: aws-node }}\n"
    );
    for d in 0..nodes {
        let placement: Vec<String> = (0..nodes).map(|n| n.to_string()).collect();
        yaml.push_str(&format!(
            "  - {{ kind: Deployment, namespace: app, name: web-{d}, replicas: {nodes}, placement: [{}], pdb: {{ maxUnavailable: 1 }} }}\n",
            placement.join(", ")
        ));
    }
    yaml.push_str("steps: []\n");
    yaml
}

/// Refreshes a fresh group of `nodes` nodes over `zones` zones and measures it.
pub async fn instance_refresh(
    nodes: usize,
    zones: usize,
    launch_before_terminate: bool,
    with_instance_refresh: bool,
) -> Result<RefreshRow, String> {
    let yaml = scenario(nodes, zones, with_instance_refresh);
    Ok(RefreshRow {
        nodes,
        zones,
        launch_before_terminate,
        with_instance_refresh,
        figures: refresh_once(&yaml, launch_before_terminate).await?,
    })
}

/// What stands behind the nodes of a [`refresh_with_waits`] run, and how the drains wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleCase {
    /// `LOAD_BALANCER_WAIT=false`: every drain waits `SETTLE_SECONDS` after its node is empty
    /// (the nodes are behind the target group, which does not change that).
    FixedSettle,
    /// The drains wait for the load balancers routing to the instance: none here.
    NoLoadBalancer,
    /// The drains wait for the load balancers routing to the instance: one instance-mode
    /// target group with the run's deregistration delay.
    TargetGroup,
}

/// One refresh of [`refresh_with_waits`].
#[derive(Debug, Clone)]
pub struct SettleRow {
    pub case: SettleCase,
    pub figures: RefreshFigures,
}

/// A launch-before-terminate refresh of `nodes` nodes (one zone, with `instance-refresh`),
/// the drains settling as `case` says, with `settle` seconds (`SETTLE_SECONDS`) and a
/// target group deregistration delay of `delay` seconds.
pub async fn refresh_with_waits(
    nodes: usize,
    case: SettleCase,
    settle: f64,
    delay: f64,
) -> Result<SettleRow, String> {
    let timings = format!(
        "settleSeconds: {settle}, deregistrationDelaySeconds: {delay}, drainTimeoutSeconds: 300, functionTimeoutSeconds: 900, launchTimeoutSeconds: 20, nodeRegisterSeconds: 0.3, nodeReadySeconds: 0.3, podStartSeconds: 0.3, gracePeriodScale: 0.01"
    );
    let extra = match case {
        SettleCase::FixedSettle => "functionEnv: { LOAD_BALANCER_WAIT: \"false\" }\n",
        SettleCase::NoLoadBalancer => "loadBalancer: false\n",
        SettleCase::TargetGroup => "",
    };
    let yaml = scenario_with(nodes, 1, true, &timings, extra);
    Ok(SettleRow {
        case,
        figures: refresh_once(&yaml, true).await?,
    })
}

/// Refreshes group `ng` of scenario `yaml` in a fresh sandbox, launch before terminate
/// (MinHealthy 100 / MaxHealthy 110) or terminate first (Auto Scaling's defaults 90 / 100).
async fn refresh_once(yaml: &str, launch_before_terminate: bool) -> Result<RefreshFigures, String> {
    Scenario::from_yaml(yaml).map_err(|e| e.to_string())?;
    let sandbox = start(yaml).await?;
    let step = InstanceRefreshStep {
        nodegroup: "ng".to_owned(),
        min_healthy_percentage: if launch_before_terminate { 100 } else { 90 },
        max_healthy_percentage: if launch_before_terminate { 110 } else { 100 },
        // Auto Scaling's pause after a replacement is in service before the next batch.
        instance_warmup_seconds: 1.0,
        expect_status: "Successful".to_owned(),
        expect_no_pod_moved_twice: true,
    };
    let figures = sandbox.run_instance_refresh(&step).await;
    sandbox.shutdown().await;
    figures
}
