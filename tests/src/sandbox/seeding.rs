//! Seeding a sandbox: the EKS cluster, its node groups' Auto Scaling groups with both hooks,
//! the lifecycle topic and the instances (AWS side); the functions' identities; and the nodes,
//! namespaces, workloads, pods and PDBs the scenario places (Kubernetes side).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::LifecycleActionResult;
use node_manager::lifecycle::node::node_instance_id;
use serde_json::json;

use super::SandboxError;
use super::scenario::{NodegroupSpec, Workload};
use super::timeline::Source;
use super::world::{FUNCTIONS, Sandbox, SimulatedNode, TOPIC_NAME, setup, warm_pool_state};
use crate::account::FakeCredentials;
use crate::aws::{
    FakeAutoScalingGroup, FakeCluster, FakeInstance, FakeLifecycleHook, FakeLoadBalancer,
    FakeNodegroup, FakeTargetGroup, LaunchedInstance,
};
use crate::fixtures;
use crate::kube::{NODE_ALLOCATABLE, NODE_CAPACITY, Store};
use crate::service_controller::ServiceController;

/// The launch template every sandbox group starts with (version 1); a node update publishes
/// version 2.
pub(super) const LAUNCH_TEMPLATE_ID: &str = "lt-0a1b2c3d4e5f60718";
pub(super) const LAUNCH_TEMPLATE_NAME: &str = "eks-nodes";

impl Sandbox {
    /// Each function has its own IAM role, mapped to the functions' Kubernetes group the way
    /// the operator's guide says: an `aws-auth` entry and/or a STANDARD access entry.
    pub(super) fn grant_function_identities(
        &self,
    ) -> Result<BTreeMap<&'static str, FakeCredentials>, SandboxError> {
        let mut credentials = BTreeMap::new();
        let mut map_roles = String::new();
        for function in FUNCTIONS {
            let role = format!("open-node-manager-{function}");
            let creds = self.account.add_role_credentials(&role);
            map_roles.push_str(&format!(
                "- rolearn: {}\n  username: open-node-manager:{function}\n  groups:\n    - open-node-manager:{function}\n",
                creds.principal_arn
            ));
            if self.uses_access_entries() {
                self.aws
                    .eks()
                    .add_access_entry(
                        &self.scenario.cluster,
                        &creds.principal_arn,
                        "STANDARD",
                        Some(&format!("open-node-manager:{function}")),
                        &[format!("open-node-manager:{function}").as_str()],
                    )
                    .map_err(setup("access entry for a function role"))?;
            }
            credentials.insert(function, creds);
        }
        if self.uses_config_map() {
            self.server
                .store()
                .apply_value(json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": { "name": "aws-auth", "namespace": "kube-system" },
                    "data": { "mapRoles": map_roles, "mapUsers": "[]\n" },
                }))
                .map_err(setup("aws-auth"))?;
        }
        Ok(credentials)
    }

    /// The cluster, its node groups, their Auto Scaling groups with both hooks, the lifecycle
    /// topic, and an EC2 instance per seeded node.
    pub(super) fn seed_aws(&mut self) -> Result<(), SandboxError> {
        let eks = self.aws.eks();
        eks.add_cluster(
            FakeCluster::new(
                &self.scenario.cluster,
                self.server.url(),
                &self.server.ca_data(),
            )
            .authentication_mode(Some(self.mode())),
        );
        self.aws.sns().create_topic(TOPIC_NAME);
        for (group_index, spec) in self.scenario.nodegroups.clone().iter().enumerate() {
            self.seed_nodegroup(spec)?;
            let mut nodes = Vec::new();
            let seeded_at = jiff::Timestamp::now();
            for _ in 0..spec.nodes {
                let index = self
                    .next_instance
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let node = self.new_node(group_index, index);
                // A seeded node's instance ran before the sandbox started playing (an hour,
                // say): what a refresh started now finds in the group was launched before it.
                // One second apart, in the order they joined the group, as a group that
                // scaled out one instance at a time: `LaunchTime` then orders them as Auto
                // Scaling's join order does, and nothing has to fall back to instance ids.
                let launched = seeded_at - jiff::SignedDuration::from_hours(1)
                    + jiff::SignedDuration::from_secs(i64::from(index));
                self.add_instance(spec, &node, launched)?;
                nodes.push(node);
            }
            self.nodes.insert(spec.name.clone(), nodes);
        }
        Ok(())
    }

    /// The cluster's one Service of type LoadBalancer: an instance-mode target group (AWS
    /// Load Balancer Controller) every Ready node's instance is registered with, which the
    /// drains wait for (`LOAD_BALANCER_WAIT`).
    pub(super) fn start_service_controller(&mut self) {
        let elb = self.aws.elb();
        let delay = Duration::from_secs_f64(self.scenario.timings.deregistration_delay_seconds);
        let web = elb.add_target_group(
            FakeTargetGroup::of_cluster("k8s-default-web", &self.scenario.cluster).delay(delay),
        );
        self.service_controller = Some(ServiceController::start(
            self.server.store().clone(),
            elb,
            vec![FakeLoadBalancer::TargetGroup(web)],
        ));
    }

    /// Node group `spec` in EKS, and its Auto Scaling group with a warm pool if it has one
    /// and both lifecycle hooks notifying the topic.
    fn seed_nodegroup(&self, spec: &NodegroupSpec) -> Result<(), SandboxError> {
        let cluster = &self.scenario.cluster;
        self.aws
            .eks()
            .add_nodegroup(
                cluster,
                FakeNodegroup::new(&spec.name, &self.role_arn(spec))
                    .ami_type(&spec.ami_type)
                    .auto_scaling_group(&spec.auto_scaling_group),
            )
            .map_err(setup("node group"))?;
        let zones = spec.availability_zones(&self.scenario.region);
        let zones: Vec<&str> = zones.iter().map(String::as_str).collect();
        let mut group = FakeAutoScalingGroup::new(&spec.auto_scaling_group);
        if !spec.self_managed {
            group = group.tag("eks:nodegroup-name", &spec.name);
        }
        let mut group = group
            .launch_template(LAUNCH_TEMPLATE_ID, LAUNCH_TEMPLATE_NAME, "1")
            .retain_on_abandon(spec.retain_on_abandon)
            .availability_zones(&zones)
            // The seeded nodes are minutes old in the story, not seconds.
            .health_check_grace_period(Duration::ZERO);
        let policies: Vec<&str> = spec
            .termination_policies
            .iter()
            .map(String::as_str)
            .collect();
        group = group.termination_policies(&policies);
        if spec.tagged_for_cluster {
            group = group.tag("eks:cluster-name", cluster);
        }
        let autoscaling = self.aws.autoscaling();
        autoscaling.add_group(group);
        if let Some(state) = warm_pool_state(spec) {
            autoscaling.set_warm_pool(&spec.auto_scaling_group, state);
        }
        let heartbeat = Duration::from_secs(self.scenario.timings.heartbeat_timeout_seconds);
        for hook in [
            FakeLifecycleHook::launching("Launch-LC-Hook"),
            FakeLifecycleHook::terminating("Terminate-LC-Hook"),
        ] {
            autoscaling
                .add_hook(
                    &spec.auto_scaling_group,
                    hook.heartbeat_timeout(heartbeat)
                        .default_result(LifecycleActionResult::Continue)
                        .notification_target(&self.topic_arn()),
                )
                .map_err(setup("lifecycle hook"))?;
        }
        Ok(())
    }

    /// What the cloud does around instances Auto Scaling launches and terminates on its own
    /// (an instance refresh): a launched instance's kubelet registers its node (labelled like
    /// the seeded ones), and a terminated instance's Node is deleted, as the cloud controller
    /// manager does.
    pub(super) fn follow_instances(&self) {
        let autoscaling = self.aws.autoscaling();
        let runtime = tokio::runtime::Handle::current();
        let simulation = self.server.simulation().clone();
        let store = self.server.store().clone();
        let timeline = self.timeline.clone();
        let timings = self.scenario.timings.clone();
        let groups: BTreeMap<String, (String, &'static str)> = self
            .scenario
            .nodegroups
            .iter()
            .map(|n| {
                (
                    n.auto_scaling_group.clone(),
                    (n.name.clone(), n.node_label()),
                )
            })
            .collect();
        let ec2 = self.aws.ec2();
        let spot_groups: BTreeSet<String> = self
            .scenario
            .nodegroups
            .iter()
            .filter(|n| n.spot)
            .map(|n| n.auto_scaling_group.clone())
            .collect();
        autoscaling.on_instance_launched(Arc::new(move |instance: &LaunchedInstance| {
            // A Spot group's launches are Spot instances too (Auto Scaling asked EC2 for
            // Spot capacity), which the fake EC2 created On-Demand.
            if spot_groups.contains(&instance.group_name)
                && let Some(launched) = ec2.instance(&instance.instance_id)
            {
                ec2.add_instance(launched.spot());
            }
            let simulation = simulation.clone();
            let store = store.clone();
            let timeline = timeline.clone();
            let name = instance.private_dns_name.clone();
            let provider_id = format!(
                "aws:///{}/{}",
                instance.availability_zone, instance.instance_id
            );
            let (nodegroup, node_label) = groups
                .get(&instance.group_name)
                .cloned()
                .unwrap_or_default();
            let zone = instance.availability_zone.clone();
            let register_after = Duration::from_secs_f64(timings.node_register_seconds);
            let ready_after = Duration::from_secs_f64(timings.node_ready_seconds);
            runtime.spawn(async move {
                tokio::time::sleep(register_after).await;
                let registered = simulation
                    .register_node(&name, &provider_id, Some(ready_after))
                    .map(|_| ());
                let labelled = store.modify::<Node>("", &name, |node| {
                    let labels = node.metadata.labels.get_or_insert_default();
                    labels.insert(node_label.to_owned(), nodegroup);
                    labels.insert("topology.kubernetes.io/zone".to_owned(), zone);
                });
                timeline.record(
                    Source::Note,
                    match (registered, labelled) {
                        (Ok(()), Ok(_)) => format!("kubelet on {name} registers the node"),
                        (Err(e), _) => format!("node {name} could not register: {e}"),
                        (_, Err(e)) => format!("node {name} could not be labelled: {e}"),
                    },
                );
            });
        }));
        self.follow_terminations();
    }

    /// A terminated instance's kubelet is gone at once; the cloud node lifecycle controller
    /// deletes its Node on its next pass, not at once: as long after as a new one takes to
    /// register.
    fn follow_terminations(&self) {
        let runtime = tokio::runtime::Handle::current();
        let simulation = self.server.simulation().clone();
        let store = self.server.store().clone();
        let timeline = self.timeline.clone();
        let removal_delay = Duration::from_secs_f64(self.scenario.timings.node_register_seconds);
        let terminated = move |instance_id: &str| {
            let (store, timeline) = (store.clone(), timeline.clone());
            let Some(name) = store
                .list::<Node>()
                .into_iter()
                .find(|n| node_instance_id(n) == Some(instance_id))
                .and_then(|n| n.metadata.name)
            else {
                return;
            };
            if let Err(error) = simulation.kill_kubelet(&name) {
                tracing::debug!(%error, "the terminated instance's node is gone already");
            }
            let instance_id = instance_id.to_owned();
            runtime.spawn(async move {
                tokio::time::sleep(removal_delay).await;
                let deleted = store.delete::<Node>("", &name);
                timeline.record(
                    Source::Note,
                    match deleted {
                        Ok(()) => format!("instance {instance_id} terminated: node {name} deleted"),
                        Err(e) => format!("node {name} could not be deleted: {e}"),
                    },
                );
            });
        };
        self.aws
            .autoscaling()
            .on_instance_terminated(Arc::new(terminated));
    }

    /// The EC2 instance behind `node`, launched at `launched`, in service in node group
    /// `spec`'s Auto Scaling group.
    pub(super) fn add_instance(
        &self,
        spec: &NodegroupSpec,
        node: &SimulatedNode,
        launched: jiff::Timestamp,
    ) -> Result<(), SandboxError> {
        let mut instance = FakeInstance::new(&node.instance_id, &self.scenario.region)
            .private_dns_name(&node.name)
            .availability_zone(&node.availability_zone)
            .launch_time(launched);
        if !spec.self_managed {
            instance = instance.tag("eks:nodegroup-name", &spec.name);
        }
        self.aws
            .ec2()
            .add_instance(if spec.spot { instance.spot() } else { instance });
        self.aws
            .autoscaling()
            .add_instance(
                &spec.auto_scaling_group,
                &node.instance_id,
                &node.availability_zone,
            )
            .map_err(setup("Auto Scaling instance"))
    }

    /// Nodes, namespaces and workloads, with pods placed as the scenario says.
    pub(super) fn seed_cluster(&self) -> Result<(), SandboxError> {
        let store = self.server.store();
        for (nodegroup, nodes) in &self.nodes {
            let node_label = self
                .scenario
                .nodegroups
                .iter()
                .find(|n| &n.name == nodegroup)
                .map_or("eks.amazonaws.com/nodegroup", NodegroupSpec::node_label);
            for node in nodes {
                let mut object = fixtures::with_labels(
                    fixtures::node(&node.name, &node.provider_id()),
                    &[
                        (node_label, nodegroup),
                        ("topology.kubernetes.io/zone", &node.availability_zone),
                        ("node.kubernetes.io/instance-type", "m5.large"),
                    ],
                );
                // What their kubelets reported, as the nodes that join later report it.
                let status = object.status.get_or_insert_default();
                status.capacity = serde_json::from_value(NODE_CAPACITY.to_value()).ok();
                status.allocatable = serde_json::from_value(NODE_ALLOCATABLE.to_value()).ok();
                store.create(&object).map_err(setup("node"))?;
            }
        }
        let seeded: Vec<&SimulatedNode> = self.nodes.values().flatten().collect();
        for workload in &self.scenario.workloads {
            seed_workload(store, workload, &seeded)?;
        }
        Ok(())
    }

    /// Waits (up to ten seconds) for every seeded pod to be Ready.
    pub(super) async fn wait_for_seeded_pods(&self) {
        for _ in 0..200 {
            let pods = self.server.store().list::<Pod>();
            if !pods.is_empty() && pods.iter().all(fixtures::pod_is_ready) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `workload`'s namespace, controller(s), pods on the `seeded` nodes it is placed on, and PDB.
fn seed_workload(
    store: &Store,
    workload: &Workload,
    seeded: &[&SimulatedNode],
) -> Result<(), SandboxError> {
    let ns = workload.namespace.as_str();
    if store.get_value("v1", "Namespace", "", ns).is_err() {
        store
            .apply_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .map_err(setup("namespace"))?;
    }
    let image = workload
        .image
        .clone()
        .unwrap_or_else(|| format!("public.ecr.aws/sandbox/{}:latest", workload.name));
    let pods = fixtures::Workload::new(ns, &workload.name)
        .container(&workload.name, &image)
        .priority_class_name(workload.priority_class_name.as_deref());
    if workload.kind == "DaemonSet" {
        store
            .create(&pods.daemon_set())
            .map_err(setup("DaemonSet"))?;
        return Ok(());
    }
    seed_deployment(store, workload, &pods, seeded)?;
    if let Some(pdb) = &workload.pdb {
        let budget = fixtures::pdb(
            ns,
            &workload.name,
            &[("app", &workload.name)],
            pdb.min_available.map(|min| json!(min)),
            pdb.max_unavailable.map(|max| json!(max)),
        );
        store
            .create(&budget)
            .map_err(setup("PodDisruptionBudget"))?;
    }
    Ok(())
}

/// A Deployment, its ReplicaSet and their pods, each on the node the scenario places it on.
fn seed_deployment(
    store: &Store,
    workload: &Workload,
    pods: &fixtures::Workload,
    seeded: &[&SimulatedNode],
) -> Result<(), SandboxError> {
    let ns = workload.namespace.as_str();
    // Zero replicas until the pods are placed (below): the simulated controllers run
    // meanwhile, and would otherwise create pods of their own for the replicas not seeded
    // yet, wherever their scheduler likes.
    let unscaled = pods.clone().replicas(0);
    let deployment = store
        .create(&unscaled.deployment())
        .map_err(setup("Deployment"))?;
    let rs_name = format!("{}-7c5ddbdf54", workload.name);
    let replica_set = store
        .create(&fixtures::owned_by(
            unscaled.replica_set_named(&rs_name),
            &deployment,
        ))
        .map_err(setup("ReplicaSet"))?;
    for replica in 0..workload.replicas {
        let node_index = workload
            .placement
            .get(replica)
            .copied()
            .unwrap_or(replica % seeded.len().max(1));
        let Some(node) = seeded.get(node_index) else {
            return Err(SandboxError::Scenario(format!(
                "workload {ns}/{} has no node to run on",
                workload.name
            )));
        };
        let name = format!("{rs_name}-{}", pod_suffix(&workload.name, replica));
        store
            .create(&fixtures::owned_by(
                pods.running_pod(&name, &node.name),
                &replica_set,
            ))
            .map_err(setup("pod"))?;
    }
    let replicas = i32::try_from(workload.replicas).unwrap_or(i32::MAX);
    store
        .modify::<ReplicaSet>(ns, &rs_name, |rs| {
            rs.spec.get_or_insert_default().replicas = Some(replicas);
        })
        .map_err(setup("ReplicaSet"))?;
    store
        .modify::<Deployment>(ns, &workload.name, |d| {
            d.spec.get_or_insert_default().replicas = Some(replicas);
        })
        .map_err(setup("Deployment"))?;
    Ok(())
}

/// A stable, pod-name-like suffix for replica `index` of `workload`.
fn pod_suffix(workload: &str, index: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let seed = workload.bytes().fold(index.wrapping_mul(31), |acc, b| {
        acc.wrapping_mul(131).wrapping_add(b as usize)
    });
    (0..5)
        .map(|i| ALPHABET[(seed >> (i * 5)) % ALPHABET.len()] as char)
        .collect()
}
