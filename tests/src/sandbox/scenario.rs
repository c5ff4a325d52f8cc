//! The sandbox's scenario file: a cluster to seed and the lifecycle steps to play on it.
//!
//! YAML (field names camelCase). Every field but `name`, `nodegroups` and `steps` has a
//! default, so a scenario says only what it changes; see `tests/scenarios/*.yaml`.

use serde::Deserialize;

use crate::sandbox::SandboxError;

/// The scenario the sandbox plays when none is given: `tests/scenarios/reference.yaml`.
pub const REFERENCE_SCENARIO: &str = include_str!("../../scenarios/reference.yaml");

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "default_cluster")]
    pub cluster: String,
    #[serde(default = "default_region")]
    pub region: String,
    #[serde(default = "default_account")]
    pub account_id: String,
    /// `CONFIG_MAP`, `API_AND_CONFIG_MAP` or `API`.
    #[serde(default = "default_mode")]
    pub authentication_mode: String,
    #[serde(default)]
    pub timings: Timings,
    /// Extra environment for every function (settings such as `DRAIN_FORCE`).
    #[serde(default)]
    pub function_env: std::collections::BTreeMap<String, String>,
    /// Lambda scales out: a lifecycle notification that arrives while the hook's processes
    /// are all busy runs in a new process (cold) instead of waiting for one. Off by default:
    /// one process per function, deliveries one after the other.
    #[serde(default)]
    pub concurrent_invocations: bool,
    /// Auto Scaling's instance refresh events reach the `instance-refresh` function (the
    /// EventBridge rule of the stack). On by default; off shows a refresh without it.
    #[serde(default = "yes")]
    pub refresh_events: bool,
    /// EC2's Spot interruption warnings, rebalance recommendations and state changes, and
    /// AWS Health's scheduled changes reach `terminating-hook` (the stack's
    /// `InstanceNoticeEventsRule` and `ScheduledMaintenanceEventsRule`). On by default; off
    /// shows a stack without them, where only lifecycle notifications drain nodes.
    #[serde(default = "yes")]
    pub instance_notice_events: bool,
    /// The fake kubelets report the images they pulled and the fake scheduler weighs them
    /// (kube-scheduler's ImageLocality) as a cluster does. On by default; off: the least
    /// loaded node only, as if every image were too small to count.
    #[serde(default = "yes")]
    pub prefer_cached_images: bool,
    /// The cluster's one Service of type LoadBalancer: an instance-mode target group every
    /// Ready node's instance is registered with (delay `timings.deregistrationDelaySeconds`).
    /// On by default; off: the nodes are behind no load balancer.
    #[serde(default = "yes")]
    pub load_balancer: bool,
    pub nodegroups: Vec<NodegroupSpec>,
    #[serde(default)]
    pub workloads: Vec<Workload>,
    pub steps: Vec<Step>,
}

fn default_cluster() -> String {
    "ironman-2022".to_owned()
}
fn default_region() -> String {
    "eu-west-1".to_owned()
}
fn default_account() -> String {
    "111111111111".to_owned()
}
fn default_mode() -> String {
    "CONFIG_MAP".to_owned()
}

/// Timings, scaled down so a scenario runs in seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Timings {
    /// The drain's settle period (EKS: 60 s).
    pub settle_seconds: f64,
    /// The drain deadline (EKS: 15 min).
    pub drain_timeout_seconds: f64,
    /// How long the launch hook waits for Ready (default 10 min).
    pub launch_timeout_seconds: f64,
    /// A new node registers this long after its instance launched...
    pub node_register_seconds: f64,
    /// ...and turns Ready this long after registering.
    pub node_ready_seconds: f64,
    /// A scheduled pod is Running and Ready after this long.
    pub pod_start_seconds: f64,
    /// Grace periods last this fraction of their declared seconds.
    pub grace_period_scale: f64,
    /// The functions' Lambda timeout (deadline of each invocation).
    pub function_timeout_seconds: f64,
    /// The lifecycle hooks' heartbeat timeout, as declared (not scaled).
    pub heartbeat_timeout_seconds: u64,
    /// A volume no pod on its node uses any more is detached this long after (the CSI
    /// driver's detach).
    pub volume_detach_seconds: f64,
    /// The cluster's target group lets a deregistered instance's connections drain this long
    /// (AWS's default: 300).
    pub deregistration_delay_seconds: f64,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            settle_seconds: 1.0,
            drain_timeout_seconds: 20.0,
            launch_timeout_seconds: 15.0,
            node_register_seconds: 1.0,
            node_ready_seconds: 1.0,
            pod_start_seconds: 1.0,
            grace_period_scale: 0.02,
            function_timeout_seconds: 60.0,
            heartbeat_timeout_seconds: 300,
            volume_detach_seconds: 1.0,
            deregistration_delay_seconds: 4.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodegroupSpec {
    pub name: String,
    /// The Auto Scaling group behind the node group.
    pub auto_scaling_group: String,
    /// The node role's name (the ARN is built from the account).
    pub node_role: String,
    #[serde(default = "default_ami")]
    pub ami_type: String,
    /// Nodes running when the scenario starts.
    #[serde(default)]
    pub nodes: usize,
    /// Tag the group for the cluster (`eks:cluster-name`); false makes it a foreign group.
    #[serde(default = "yes")]
    pub tagged_for_cluster: bool,
    /// The group's warm pool, by the state its instances wait in: `Stopped`, `Running` or
    /// `Hibernated` (none by default).
    #[serde(default)]
    pub warm_pool: Option<String>,
    /// The group's instance lifecycle policy retains an instance whose terminating
    /// lifecycle action ends ABANDON (`TerminateHookAbandon: retain`).
    #[serde(default)]
    pub retain_on_abandon: bool,
    /// The group's instances are Spot instances (EC2 reports a Spot request for each), which
    /// EC2 may interrupt.
    #[serde(default)]
    pub spot: bool,
    /// A self-managed node group (what this project's hooks serve): its Auto Scaling group
    /// and instances carry no `eks:nodegroup-name` tag and its nodes eksctl's
    /// `alpha.eksctl.io/nodegroup-name` label instead of EKS's `eks.amazonaws.com/nodegroup`.
    /// By default the sandbox labels node groups like managed ones (which instance notices
    /// and node repair leave to EKS).
    #[serde(default)]
    pub self_managed: bool,
    /// The Auto Scaling group's termination policies (`NewestInstance` makes an instance
    /// refresh replace the newest instances first; by default the oldest go first).
    #[serde(default)]
    pub termination_policies: Vec<String>,
    /// How many availability zones the group spans (1–3: the region's `a`, `b`, `c`).
    #[serde(default = "three")]
    pub zones: usize,
}

impl NodegroupSpec {
    /// The group's availability zones in `region`.
    pub fn availability_zones(&self, region: &str) -> Vec<String> {
        ['a', 'b', 'c']
            .iter()
            .take(self.zones.clamp(1, 3))
            .map(|letter| format!("{region}{letter}"))
            .collect()
    }

    /// The node label naming the node group: EKS's for a managed node group, eksctl's for
    /// a self-managed one.
    pub fn node_label(&self) -> &'static str {
        if self.self_managed {
            "alpha.eksctl.io/nodegroup-name"
        } else {
            "eks.amazonaws.com/nodegroup"
        }
    }
}

fn default_ami() -> String {
    "AL2_x86_64".to_owned()
}
fn yes() -> bool {
    true
}
fn three() -> usize {
    3
}

/// A workload placed on the seeded nodes.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// `Deployment` or `DaemonSet`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub replicas: usize,
    /// For each replica, the index of the seeded node it runs on (round-robin if absent).
    #[serde(default)]
    pub placement: Vec<usize>,
    #[serde(default)]
    pub priority_class_name: Option<String>,
    #[serde(default)]
    pub pdb: Option<PdbSpec>,
    /// The pods' container image (by default one of the workload's own).
    #[serde(default)]
    pub image: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PdbSpec {
    #[serde(default)]
    pub min_available: Option<i32>,
    #[serde(default)]
    pub max_unavailable: Option<i32>,
}

/// One step of the scenario, with what must be true after it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Step {
    /// CloudTrail `CreateNodegroup` through EventBridge to `nodegroup-auth`.
    CreateNodegroup(NodegroupStep),
    /// CloudTrail `DeleteNodegroup` through EventBridge to `nodegroup-auth`.
    DeleteNodegroup(NodegroupStep),
    /// A new instance launches; its launch hook notifies `launching-hook`.
    ScaleOut(ScaleOutStep),
    /// A seeded node's instance terminates; its hook notifies `terminating-hook`.
    ScaleIn(ScaleInStep),
    /// A seeded node's kubelet dies; a scheduled `node-repair` run replaces its instance
    /// (the hooks then drain it and complete its replacement's launch).
    RepairNode(RepairNodeStep),
    /// A new instance launches into the group's warm pool (`EC2` -> `WarmPool`).
    LaunchIntoWarmPool(WarmPoolStep),
    /// The instance waiting longest in the warm pool goes in service (`WarmPool` ->
    /// `AutoScalingGroup`); its kubelet registers (or re-registers) its node.
    ScaleOutFromWarmPool(WarmPoolStep),
    /// Scale-in with instance reuse: the instance that left the pool last goes back to it
    /// (`AutoScalingGroup` -> `WarmPool`) and is stopped.
    ScaleInToWarmPool(WarmPoolStep),
    /// A node update: the group's launch template gets a new version and an instance
    /// refresh replaces every instance through the lifecycle hooks; `instance-refresh`
    /// takes the outdated nodes out of service when it starts.
    InstanceRefresh(InstanceRefreshStep),
    /// EC2 interrupts a seeded Spot instance (terminate): the warning goes on the
    /// EventBridge bus and Auto Scaling terminates the instance at once through its
    /// terminating hook, so `terminating-hook` hears of it twice, together.
    SpotInterruption(SpotInterruptionStep),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpotInterruptionStep {
    pub nodegroup: String,
    /// Index of the seeded node whose instance is interrupted.
    #[serde(default)]
    pub node: usize,
    /// How long after the warning EC2 terminates the instance (EC2: two minutes, which is
    /// also what the function counts on).
    #[serde(default = "two_minutes")]
    pub notice_seconds: f64,
}

fn two_minutes() -> f64 {
    120.0
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceRefreshStep {
    pub nodegroup: String,
    /// `MinHealthyPercentage` (Auto Scaling's default 90).
    #[serde(default = "ninety")]
    pub min_healthy_percentage: u32,
    /// `MaxHealthyPercentage`: above 100 launches before terminating (default 100).
    #[serde(default = "one_hundred")]
    pub max_healthy_percentage: u32,
    /// `InstanceWarmup` in seconds.
    #[serde(default)]
    pub instance_warmup_seconds: f64,
    /// How the refresh must end: `Successful`, `Failed`, `Cancelled`.
    #[serde(default = "successful")]
    pub expect_status: String,
    /// No pod may be evicted from an outdated node that it was scheduled onto after the
    /// refresh started (the ping-pong the start's cordon prevents).
    #[serde(default = "yes")]
    pub expect_no_pod_moved_twice: bool,
}

fn ninety() -> u32 {
    90
}
fn one_hundred() -> u32 {
    100
}
fn successful() -> String {
    "Successful".to_owned()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepairNodeStep {
    pub nodegroup: String,
    /// Index of the seeded node whose kubelet dies.
    pub node: usize,
    /// How long ago the node went NotReady, in minutes (31: past EKS's 30-minute wait).
    #[serde(default = "thirty_one")]
    pub not_ready_minutes: f64,
}

fn thirty_one() -> f64 {
    31.0
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WarmPoolStep {
    pub nodegroup: String,
    /// Kubernetes Event reasons that must appear on the node.
    #[serde(default)]
    pub expect_node_events: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodegroupStep {
    pub nodegroup: String,
    /// Whether the node role must be mapped afterwards (aws-auth or access entry).
    #[serde(default = "yes")]
    pub expect_role_mapped: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScaleOutStep {
    pub nodegroup: String,
    /// Whether the new node ever registers with the cluster.
    #[serde(default = "yes")]
    pub node_joins: bool,
    /// `CONTINUE` or `ABANDON`.
    #[serde(default = "continue_result")]
    pub expect_result: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScaleInStep {
    pub nodegroup: String,
    /// Index of the seeded node whose instance terminates.
    pub node: usize,
    #[serde(default = "continue_result")]
    pub expect_result: String,
    /// Whether every pod but DaemonSet pods must be gone from the node afterwards.
    #[serde(default = "yes")]
    pub expect_drained: bool,
    /// Kubernetes Event reasons that must appear on the node.
    #[serde(default)]
    pub expect_node_events: Vec<String>,
}

fn continue_result() -> String {
    "CONTINUE".to_owned()
}

impl Scenario {
    pub fn from_yaml(text: &str) -> Result<Self, SandboxError> {
        let scenario: Self = serde_saphyr::from_str(text)
            .map_err(|e| SandboxError::Scenario(format!("cannot read the scenario: {e}")))?;
        scenario.validate()?;
        Ok(scenario)
    }

    pub fn reference() -> Result<Self, SandboxError> {
        Self::from_yaml(REFERENCE_SCENARIO)
    }

    /// Checks the references between parts, so a typo fails before anything starts.
    fn validate(&self) -> Result<(), SandboxError> {
        let bad = |msg: String| Err(SandboxError::Scenario(msg));
        let seeded: usize = self.nodegroups.iter().map(|n| n.nodes).sum();
        if let Some(group) = self.nodegroups.iter().find(|g| !(1..=3).contains(&g.zones)) {
            return bad(format!(
                "node group {}: zones must be 1, 2 or 3, not {}",
                group.name, group.zones
            ));
        }
        for workload in &self.workloads {
            if !matches!(workload.kind.as_str(), "Deployment" | "DaemonSet") {
                return bad(format!(
                    "workload {}/{}: kind must be Deployment or DaemonSet, not {:?}",
                    workload.namespace, workload.name, workload.kind
                ));
            }
            if let Some(&index) = workload.placement.iter().find(|&&i| i >= seeded) {
                return bad(format!(
                    "workload {}/{}: placement names node {index}, but only {seeded} nodes are seeded",
                    workload.namespace, workload.name
                ));
            }
        }
        for step in &self.steps {
            let group = match step {
                Step::CreateNodegroup(s) | Step::DeleteNodegroup(s) => &s.nodegroup,
                Step::ScaleOut(s) => &s.nodegroup,
                Step::ScaleIn(s) => &s.nodegroup,
                Step::RepairNode(s) => &s.nodegroup,
                Step::InstanceRefresh(s) => &s.nodegroup,
                Step::SpotInterruption(s) => &s.nodegroup,
                Step::LaunchIntoWarmPool(s)
                | Step::ScaleOutFromWarmPool(s)
                | Step::ScaleInToWarmPool(s) => &s.nodegroup,
            };
            let Some(spec) = self.nodegroups.iter().find(|n| &n.name == group) else {
                return bad(format!(
                    "a step names node group {group:?}, which the scenario does not define"
                ));
            };
            if let Step::RepairNode(s) = step
                && s.node >= spec.nodes
            {
                return bad(format!(
                    "repairNode names node {} of {group}, which has {} seeded nodes",
                    s.node, spec.nodes
                ));
            }
            let warm_pool_step = matches!(
                step,
                Step::LaunchIntoWarmPool(_)
                    | Step::ScaleOutFromWarmPool(_)
                    | Step::ScaleInToWarmPool(_)
            );
            if warm_pool_step && spec.warm_pool.is_none() {
                return bad(format!(
                    "a warm-pool step names node group {group}, which has no warmPool"
                ));
            }
            if let Step::SpotInterruption(s) = step {
                if !spec.spot {
                    return bad(format!(
                        "spotInterruption names node group {group}, which is not spot: true"
                    ));
                }
                if s.node >= spec.nodes {
                    return bad(format!(
                        "spotInterruption names node {} of {group}, which has {} seeded nodes",
                        s.node, spec.nodes
                    ));
                }
            }
            if let Step::ScaleIn(s) = step
                && s.node >= spec.nodes
            {
                return bad(format!(
                    "scaleIn names node {} of {group}, which has {} seeded nodes",
                    s.node, spec.nodes
                ));
            }
        }
        for spec in &self.nodegroups {
            if let Some(state) = &spec.warm_pool
                && !matches!(state.as_str(), "Stopped" | "Running" | "Hibernated")
            {
                return bad(format!(
                    "node group {}: warmPool must be Stopped, Running or Hibernated, not {state:?}",
                    spec.name
                ));
            }
        }
        if !matches!(
            self.authentication_mode.as_str(),
            "CONFIG_MAP" | "API_AND_CONFIG_MAP" | "API"
        ) {
            return bad(format!(
                "authenticationMode must be CONFIG_MAP, API_AND_CONFIG_MAP or API, not {:?}",
                self.authentication_mode
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn shipped_scenarios_parse() {
        for text in [
            REFERENCE_SCENARIO,
            include_str!("../../scenarios/pdb-blocked.yaml"),
            include_str!("../../scenarios/access-entries.yaml"),
            include_str!("../../scenarios/warm-pool.yaml"),
            include_str!("../../scenarios/instance-refresh.yaml"),
            include_str!("../../scenarios/instance-refresh-failed.yaml"),
            include_str!("../../scenarios/spot-interruption.yaml"),
        ] {
            let scenario = Scenario::from_yaml(text).unwrap();
            assert!(!scenario.steps.is_empty(), "{}", scenario.name);
        }
    }

    #[test]
    fn warm_pool_steps_need_a_group_with_a_warm_pool() {
        let text = "name: x\nnodegroups:\n  - { name: ng, autoScalingGroup: asg, nodeRole: r }\nsteps:\n  - launchIntoWarmPool: { nodegroup: ng }\n";
        let err = Scenario::from_yaml(text).unwrap_err();
        assert!(err.to_string().contains("no warmPool"), "{err}");
        let text = "name: x\nnodegroups:\n  - { name: ng, autoScalingGroup: asg, nodeRole: r, warmPool: Frozen }\nsteps: []\n";
        let err = Scenario::from_yaml(text).unwrap_err();
        assert!(err.to_string().contains("Frozen"), "{err}");
    }

    #[test]
    fn a_spot_interruption_needs_a_spot_group_and_a_seeded_node() {
        let step = "steps:\n  - spotInterruption: { nodegroup: ng, node: 1 }\n";
        let on_demand = format!(
            "name: x\nnodegroups:\n  - {{ name: ng, autoScalingGroup: asg, nodeRole: r, nodes: 2 }}\n{step}"
        );
        let err = Scenario::from_yaml(&on_demand).unwrap_err();
        assert!(err.to_string().contains("not spot"), "{err}");
        let one_node = format!(
            "name: x\nnodegroups:\n  - {{ name: ng, autoScalingGroup: asg, nodeRole: r, nodes: 1, spot: true }}\n{step}"
        );
        let err = Scenario::from_yaml(&one_node).unwrap_err();
        assert!(err.to_string().contains("1 seeded nodes"), "{err}");
        let fine = one_node.replace("node: 1", "node: 0");
        let scenario = Scenario::from_yaml(&fine).unwrap();
        let Step::SpotInterruption(step) = &scenario.steps[0] else {
            panic!("{:?}", scenario.steps);
        };
        assert_eq!(step.notice_seconds, 120.0);
    }

    #[test]
    fn a_step_naming_an_unknown_group_is_refused() {
        let text = "name: x\nnodegroups: []\nsteps:\n  - scaleOut: { nodegroup: ghost }\n";
        let err = Scenario::from_yaml(text).unwrap_err();
        assert!(err.to_string().contains("ghost"), "{err}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let text = "name: x\nnodegroups: []\nsteps: []\nsurprise: 1\n";
        assert!(Scenario::from_yaml(text).is_err());
    }
}
