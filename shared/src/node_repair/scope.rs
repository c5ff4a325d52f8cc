//! Which nodes are ours, and what this run saw of them.
//!
//! A node is ours when it runs on an EC2 instance of an Auto Scaling group these functions
//! serve (the hooks' scope rules: the allow-list, else a tag naming this cluster). Managed
//! node groups' and Karpenter's nodes are left alone: EKS and Karpenter repair them. Every
//! node left out gets a `NotOurs` report saying why.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;

use crate::aws::{GroupHealthSettings, GroupInstance, InstanceHealth, RepairInstances};
use crate::lifecycle::node::node_instance_id;
use crate::lifecycle::scope::{ScopeDecision, decide_by_tags};
use crate::node_marks::checkpoint::drain_holds;

use super::decision::{GroupObservation, NodeObservation, ObservedCondition, needs_launch_time};
use super::memory::{REPAIR_ANNOTATION, RepairRecord};
use super::report::{NodeReport, RepairError, not_ours};
use super::settings::RepairSettings;

/// The label EKS puts on the nodes of a managed node group (which EKS repairs itself).
pub(crate) const MANAGED_NODEGROUP_LABEL: &str = "eks.amazonaws.com/nodegroup";
/// The label Karpenter puts on its nodes (Karpenter repairs them itself).
pub(crate) const KARPENTER_NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";

/// A node that may be ours: it runs on an EC2 instance and no other repairer claims it.
pub(super) struct Candidate<'a> {
    node: &'a Node,
    instance_id: String,
}

/// The Auto Scaling side of the candidates: each instance's group, each group's settings.
pub(super) struct Memberships {
    instances: BTreeMap<String, GroupInstance>,
    groups: BTreeMap<String, GroupHealthSettings>,
}

/// One of our groups as observed, with the Nodes its observations were read from (same order).
pub(super) struct ObservedGroup<'a> {
    pub observation: GroupObservation,
    pub nodes: Vec<&'a Node>,
}

/// Keeps the nodes on an EC2 instance that neither EKS nor Karpenter repairs; reports the
/// others as not ours.
pub(super) fn candidates<'a>(
    nodes: &'a [Node],
    reports: &mut Vec<NodeReport>,
) -> Vec<Candidate<'a>> {
    let mut candidates = Vec::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.as_ref();
        if let Some(ng) = labels.and_then(|l| l.get(MANAGED_NODEGROUP_LABEL)) {
            reports.push(not_ours(
                &name,
                format!(
                    "managed node group {ng} (label {MANAGED_NODEGROUP_LABEL}): EKS repairs it"
                ),
            ));
        } else if let Some(pool) = labels.and_then(|l| l.get(KARPENTER_NODEPOOL_LABEL)) {
            reports.push(not_ours(&name, format!("Karpenter node pool {pool} (label {KARPENTER_NODEPOOL_LABEL}): Karpenter repairs it")));
        } else if let Some(instance) = node_instance_id(node) {
            candidates.push(Candidate {
                node,
                instance_id: instance.to_owned(),
            });
        } else {
            reports.push(not_ours(
                &name,
                "spec.providerID names no EC2 instance".to_owned(),
            ));
        }
    }
    candidates
}

/// Reads the candidates' group memberships (`DescribeAutoScalingInstances`) and their
/// groups' tags and grace periods (`DescribeAutoScalingGroups`); no request for nothing.
pub(super) async fn read_memberships(
    health: &impl InstanceHealth,
    candidates: &[Candidate<'_>],
) -> Result<Memberships, RepairError> {
    let ids: Vec<String> = candidates.iter().map(|c| c.instance_id.clone()).collect();
    let instances: BTreeMap<String, GroupInstance> = if ids.is_empty() {
        BTreeMap::new()
    } else {
        health
            .describe_group_instances(&ids)
            .await
            .map_err(RepairError::Describe)?
            .into_iter()
            .map(|m| (m.instance_id.clone(), m))
            .collect()
    };
    let group_names: Vec<String> = instances
        .values()
        .map(|m| m.auto_scaling_group_name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let groups = if group_names.is_empty() {
        BTreeMap::new()
    } else {
        health
            .describe_group_health_settings(&group_names)
            .await
            .map_err(RepairError::Describe)?
            .into_iter()
            .map(|g| (g.name.clone(), g))
            .collect()
    };
    Ok(Memberships { instances, groups })
}

/// Groups the candidates by Auto Scaling group, keeping the groups that are ours; reports
/// the others' nodes as not ours.
pub(super) fn our_groups<'a>(
    settings: &RepairSettings,
    candidates: Vec<Candidate<'a>>,
    memberships: &Memberships,
    reports: &mut Vec<NodeReport>,
) -> BTreeMap<String, ObservedGroup<'a>> {
    let mut observed: BTreeMap<String, ObservedGroup<'a>> = BTreeMap::new();
    for Candidate { node, instance_id } in candidates {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(membership) = memberships.instances.get(&instance_id) else {
            let mut report = not_ours(&name, "instance is in no Auto Scaling group".to_owned());
            report.instance_id = Some(instance_id);
            reports.push(report);
            continue;
        };
        let group_name = &membership.auto_scaling_group_name;
        let Some(group) = memberships.groups.get(group_name) else {
            let mut report = not_ours(&name, format!("Auto Scaling group {group_name} not found"));
            report.instance_id = Some(instance_id);
            reports.push(report);
            continue;
        };
        if let ScopeDecision::Foreign(reason) = group_scope(settings, group) {
            let mut report = not_ours(&name, format!("Auto Scaling group {group_name}: {reason}"));
            report.instance_id = Some(instance_id);
            report.auto_scaling_group = Some(group_name.clone());
            reports.push(report);
            continue;
        }
        let entry = observed
            .entry(group_name.clone())
            .or_insert_with(|| ObservedGroup {
                observation: GroupObservation {
                    name: group_name.clone(),
                    health_check_grace_period: group.health_check_grace_period,
                    nodes: Vec::new(),
                },
                nodes: Vec::new(),
            });
        entry
            .observation
            .nodes
            .push(observe(node, name, instance_id, membership));
        entry.nodes.push(node);
    }
    observed
}

/// Fills in the instance's last launch (EC2 `LaunchTime`) of the nodes whose decision may
/// depend on it: a node back from a stopped warm pool was created and turned NotReady long
/// ago, but its grace period and repair wait start when its instance started again. One
/// `DescribeInstances` per 200 such nodes; none in a healthy cluster.
pub(super) async fn read_launch_times(
    ec2: &impl RepairInstances,
    groups: &mut BTreeMap<String, ObservedGroup<'_>>,
) -> Result<(), RepairError> {
    let wanted: Vec<String> = groups
        .values()
        .flat_map(|g| &g.observation.nodes)
        .filter(|n| needs_launch_time(n))
        .map(|n| n.instance_id.clone())
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let times = ec2
        .launch_times(&wanted)
        .await
        .map_err(RepairError::Describe)?;
    for node in groups.values_mut().flat_map(|g| &mut g.observation.nodes) {
        if let Some(at) = times.get(&node.instance_id) {
            node.launched_at = Some(*at);
        }
    }
    Ok(())
}

/// The hooks' scope rules: the allow-list, else a tag naming this cluster.
fn group_scope(settings: &RepairSettings, group: &GroupHealthSettings) -> ScopeDecision {
    if settings.allowed_groups.contains(&group.name) {
        ScopeDecision::Ours {
            evidence: "AUTO_SCALING_GROUP_NAMES".to_owned(),
        }
    } else {
        decide_by_tags(&settings.cluster, &group.tags)
    }
}

/// What the decision needs of a node: its conditions, its instance's state, its drain and
/// its last repair.
fn observe(
    node: &Node,
    name: String,
    instance_id: String,
    membership: &GroupInstance,
) -> NodeObservation {
    let annotations = node.metadata.annotations.as_ref();
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|conditions| {
            conditions
                .iter()
                .map(|c| ObservedCondition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone().filter(|r| !r.is_empty()),
                    last_transition: c.last_transition_time.as_ref().map(|t| t.0),
                })
                .collect()
        })
        .unwrap_or_default();
    NodeObservation {
        node: name,
        instance_id,
        created_at: node.metadata.creation_timestamp.as_ref().map(|t| t.0),
        launched_at: None,
        conditions,
        lifecycle_state: membership.lifecycle_state.clone(),
        health_status: membership.health_status.clone(),
        draining: drain_holds(node),
        last_repair: RepairRecord::from_annotation(
            annotations
                .and_then(|a| a.get(REPAIR_ANNOTATION))
                .map(String::as_str),
        ),
    }
}
