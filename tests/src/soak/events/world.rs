//! One seed's world: the fake API server (with `infra/rbac.yaml` and each function's own
//! identity: the terminating and launching hooks, the instance refresh function, node
//! repair), a node per instance of one or two Auto Scaling groups with a PDB-guarded workload
//! spread over them (each pod requests CPU, so the nodes' room is finite and counted), and the
//! shared crate's in-memory Auto Scaling, EC2 and SNS, which the soak sets to what AWS says
//! (each function's view of Auto Scaling kept in step: lifecycle states, each group's
//! configuration and refresh, membership and health).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::in_memory::{
    InMemoryAutoScaling, InMemoryInstanceHealth, InMemoryInstanceRefreshes, InMemoryInstances,
    InMemoryNotifications,
};
use node_manager::aws::{
    ConfiguredInstance, GroupConfiguration, InstanceFacts, InstanceRefreshDescription,
    LaunchTemplateRef, LaunchTemplateVersions, LifecycleActionResult, LifecycleHook,
};
use node_manager::drain::Drainer;
use node_manager::instance_refresh::handler::RefreshContext;
use node_manager::instance_refresh::settings::RefreshSettings;
use node_manager::launch::Launcher;
use node_manager::lifecycle::handler::Clients;
use node_manager::lifecycle::settings::{DrainSettings, LaunchSettings};
use node_manager::node_repair::run::RepairContext;
use node_manager::node_repair::settings::RepairSettings;

use super::plan::{Fate, Member, initial};
use crate::fixtures::{self, Workload};
use crate::identity::function_client;
use crate::kube::FakeApiServer;
use crate::soak::corpus::{self, Target};

pub const CLUSTER: &str = "soak-events";
/// The seeds' Auto Scaling groups: the first in every seed, the second in half of them.
pub const GROUPS: [&str; 2] = ["eks-soak-events-ng-1", "eks-soak-events-ng-2"];
pub const HOOK: &str = "Terminate-LC-Hook";
pub const LAUNCH_HOOK: &str = "Launch-LC-Hook";
/// How long a rebalance cordon holds before the reconciler may undo it.
pub const REBALANCE_UNDO: Duration = Duration::from_secs(1);
/// How long a drain's lease lasts without renewal.
pub const LEASE: Duration = Duration::from_secs(1);
/// How long before a maintenance its drain is due.
pub const MAINTENANCE_MARGIN: Duration = Duration::from_secs(3600);
const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/rbac.yaml");

pub type SoakDrainer =
    Drainer<Clients<kube::Client, InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications>>;
pub type SoakLauncher =
    Launcher<Clients<kube::Client, InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications>>;
/// Node repair's context: its own identity, Auto Scaling's membership and health, EC2's
/// launch times and reboots.
pub type SoakRepair = RepairContext<kube::Client, InMemoryInstanceHealth, InMemoryInstanceHealth>;
/// The instance refresh function's context: its own identity, Auto Scaling's refreshes and
/// group configuration, EC2's launch times and templates.
pub type SoakRefresh =
    RefreshContext<kube::Client, InMemoryInstanceRefreshes, InMemoryInstanceRefreshes>;
/// The instance refresh of each group of [`GROUPS`] (in a seed with refreshed instances).
pub const REFRESH_IDS: [&str; 2] = [
    "0d4a5c7e-1111-4222-8333-9444455556aa",
    "0d4a5c7e-2222-4333-8444-9555566667bb",
];
/// The CPU each pod of the workload requests: a node (the kit's allocatable 3,920m) takes
/// four, and holds about two at the start, so room for moved pods is counted and can run
/// out.
pub const WEB_CPU_MILLIS: u64 = 900;
const TEMPLATE_ID: &str = "lt-0500a0e7e7";

/// The world one seed plays in.
pub struct EventWorld {
    pub server: FakeApiServer,
    pub autoscaling: InMemoryAutoScaling,
    pub instances: InMemoryInstances,
    pub notifications: InMemoryNotifications,
    /// The terminating hook's identity.
    pub client: kube::Client,
    pub drainer: SoakDrainer,
    /// The launching hook (instances back from the warm pool), its own identity.
    pub launcher: SoakLauncher,
    /// Auto Scaling and EC2 as the instance refresh function reads them (kept in step with
    /// `autoscaling` and `instances`, which the terminating hook reads).
    pub refreshes: InMemoryInstanceRefreshes,
    pub refresh: SoakRefresh,
    /// Auto Scaling and EC2 as node repair reads them (kept in step with the others).
    pub health: InMemoryInstanceHealth,
    pub repair: SoakRepair,
    /// Whether the refresh skips matching instances (default): only the refreshed instances
    /// are outdated; without, every instance launched before the start is.
    pub skip_matching: bool,
    /// `REBALANCE_ACTION=drain` (odd seeds): a rebalance recommendation drains its node.
    pub rebalance_drains: bool,
    /// Each group's configuration as the soak sets it (read without the fakes' faults), in
    /// the order of [`GROUPS`].
    groups: std::sync::Mutex<Vec<GroupConfiguration>>,
    pub fleet: Vec<Member>,
}

/// The group's launch template at `version`: refreshed instances run version 1, every other
/// one the version 2 the refresh applies (it skips matching instances).
fn template(version: &str) -> LaunchTemplateRef {
    LaunchTemplateRef {
        id: Some(TEMPLATE_ID.into()),
        name: Some("soak-nodes".into()),
        version: Some(version.into()),
    }
}

fn configured(member: &Member) -> ConfiguredInstance {
    let version = if member.fate.is_refreshed() { "1" } else { "2" };
    ConfiguredInstance {
        instance_id: member.instance_id.clone(),
        lifecycle_state: "InService".into(),
        instance_type: Some("m5.large".into()),
        launch_template: Some(template(version)),
        protected_from_scale_in: false,
    }
}

/// The terminating hook's settings in the soak: scaled-down timings, no force;
/// `REBALANCE_ACTION=drain` when `rebalance_drains`, else the default (`cordon`).
fn settings(rebalance_drains: bool) -> DrainSettings {
    let undo = REBALANCE_UNDO.as_secs().to_string();
    let lease = LEASE.as_secs().to_string();
    let margin = MAINTENANCE_MARGIN.as_secs().to_string();
    let topic = lifecycle_topic();
    let env: Vec<(&str, &str)> = vec![
        ("CLUSTER_NAME", CLUSTER),
        ("CONTINUATION_TOPIC_ARN", &topic),
        ("SETTLE_SECONDS", "0.05"),
        ("DRAIN_TIMEOUT_SECONDS", "8"),
        ("EVICTION_BACKOFF_SECONDS", "0.05"),
        ("EVICTION_BACKOFF_MAX_SECONDS", "0.2"),
        ("DRAIN_LEASE_SECONDS", &lease),
        ("HAND_OVER_MARGIN_SECONDS", "0"),
        ("REBALANCE_UNDO_SECONDS", &undo),
        ("MAINTENANCE_DRAIN_MARGIN_SECONDS", &margin),
        (
            "REBALANCE_ACTION",
            if rebalance_drains { "drain" } else { "cordon" },
        ),
    ];
    // The soak's own constants: a failure here is a bug of the soak.
    DrainSettings::from_source(env.as_slice()).unwrap_or_else(|e| panic!("soak settings: {e}"))
}

/// A client signed in as `function`.
async fn identity(server: &FakeApiServer, function: &str) -> kube::Client {
    function_client(server, function)
        .await
        .unwrap_or_else(|e| panic!("{function} client: {e}"))
}

/// The topic the group's terminating hook notifies: the one its notifications arrive from
/// (the SNS fixture's), where the sweep publishes an action found waiting again.
fn lifecycle_topic() -> String {
    let event = corpus::fresh_lifecycle_event(Target::TerminatingHook);
    event["Records"][0]["Sns"]["TopicArn"]
        .as_str()
        .unwrap_or_else(|| panic!("the SNS fixture names its topic: {event}"))
        .to_owned()
}

/// A group's terminating hook (the drain) and launching hook (out of the warm pool).
fn add_hooks(autoscaling: &InMemoryAutoScaling, group: &str) {
    for (name, transition, default_result) in [
        (
            HOOK,
            "autoscaling:EC2_INSTANCE_TERMINATING",
            LifecycleActionResult::Continue,
        ),
        (
            LAUNCH_HOOK,
            "autoscaling:EC2_INSTANCE_LAUNCHING",
            LifecycleActionResult::Abandon,
        ),
    ] {
        autoscaling.add_hook(
            group,
            LifecycleHook {
                name: name.into(),
                transition: transition.into(),
                heartbeat_timeout: Duration::from_secs(300),
                global_timeout: Duration::from_secs(3600),
                default_result,
            },
        );
    }
    autoscaling.set_hook_target(group, HOOK, &lifecycle_topic());
}

/// The launching hook, with its own topic: a launch's continuation is no drain's.
async fn launcher(
    server: &FakeApiServer,
    autoscaling: &InMemoryAutoScaling,
    instances: &InMemoryInstances,
) -> SoakLauncher {
    let settings = LaunchSettings::from_source(
        [
            ("CLUSTER_NAME", CLUSTER),
            ("LAUNCH_TIMEOUT_SECONDS", "10"),
            ("HAND_OVER_MARGIN_SECONDS", "0"),
        ]
        .as_slice(),
    )
    .unwrap_or_else(|e| panic!("launch settings: {e}"));
    Launcher::new(
        identity(server, "launching-hook").await,
        autoscaling.clone(),
        instances.clone(),
        InMemoryNotifications::default(),
        settings,
    )
}

impl EventWorld {
    /// The cluster of `fleet`, every node Ready and the workload running (rebalance
    /// recommendations cordon).
    pub async fn start(fleet: Vec<Member>) -> Self {
        Self::start_with(fleet, false).await
    }

    /// [`Self::start`], with `REBALANCE_ACTION=drain` when `rebalance_drains`.
    pub async fn start_with(fleet: Vec<Member>, rebalance_drains: bool) -> Self {
        let server = FakeApiServer::builder()
            .cluster_name(CLUSTER)
            .start()
            .await
            .unwrap_or_else(|e| panic!("fake API server: {e}"));
        server
            .apply_manifest_file(std::path::Path::new(RBAC))
            .unwrap_or_else(|e| panic!("rbac: {e}"));
        let client = identity(&server, "terminating-hook").await;
        let autoscaling = InMemoryAutoScaling::new();
        for group in GROUPS {
            autoscaling.add_group(group, &[("eks:cluster-name", CLUSTER)]);
            add_hooks(&autoscaling, group);
        }
        let instances = InMemoryInstances::default();
        let notifications = InMemoryNotifications::default();
        let drainer = Drainer::new(
            client.clone(),
            autoscaling.clone(),
            instances.clone(),
            notifications.clone(),
            settings(rebalance_drains),
        );
        let launcher = launcher(&server, &autoscaling, &instances).await;
        let refreshes = InMemoryInstanceRefreshes::default();
        let refresh = RefreshContext {
            kube: identity(&server, "instance-refresh").await,
            autoscaling: refreshes.clone(),
            ec2: refreshes.clone(),
            settings: RefreshSettings::from_source([("CLUSTER_NAME", CLUSTER)].as_slice())
                .unwrap_or_else(|e| panic!("refresh settings: {e}")),
        };
        let health = InMemoryInstanceHealth::new();
        for group in GROUPS {
            health.add_group(group, &[("eks:cluster-name", CLUSTER)], Duration::ZERO);
        }
        let repair = RepairContext {
            kube: identity(&server, "node-repair").await,
            health: health.clone(),
            ec2: health.clone(),
            settings: RepairSettings::from_source([("CLUSTER_NAME", CLUSTER)].as_slice())
                .unwrap_or_else(|e| panic!("repair settings: {e}")),
        };
        let world = Self {
            server,
            autoscaling,
            instances,
            notifications,
            client,
            drainer,
            launcher,
            refresh,
            refreshes,
            health,
            repair,
            groups: std::sync::Mutex::default(),
            skip_matching: true,
            rebalance_drains,
            fleet,
        };
        world.configure_groups();
        world.register_fleet().await;
        world
    }

    /// The groups as `DescribeAutoScalingGroups` reports them to the instance refresh
    /// function: this cluster's, on version 2 of their template, their initial instances
    /// launched an hour ago.
    fn configure_groups(&self) {
        let hour_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600);
        self.refreshes.put_launch_template(LaunchTemplateVersions {
            id: TEMPLATE_ID.into(),
            name: "soak-nodes".into(),
            default_version: 2,
            latest_version: 2,
        });
        let mut groups = Vec::new();
        for (index, name) in GROUPS.iter().enumerate() {
            let instances: Vec<ConfiguredInstance> = self
                .fleet
                .iter()
                .filter(|m| m.group == index && initial(m))
                .map(configured)
                .collect();
            for instance in &instances {
                self.refreshes
                    .put_launch_time(&instance.instance_id, hour_ago);
                self.health.set_launch_time(&instance.instance_id, hour_ago);
                self.health.add_instance(name, &instance.instance_id);
            }
            let group = GroupConfiguration {
                name: (*name).into(),
                tags: [("eks:cluster-name".to_owned(), CLUSTER.to_owned())].into(),
                desired_capacity: u32::try_from(instances.len()).unwrap_or(u32::MAX),
                launch_template: Some(template("2")),
                instances,
                ..GroupConfiguration::default()
            };
            self.refreshes.put_group(group.clone());
            groups.push(group);
        }
        *self.groups_lock() = groups;
    }

    fn groups_lock(&self) -> std::sync::MutexGuard<'_, Vec<GroupConfiguration>> {
        self.groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What both fakes say of `group`'s refresh: `status`, started at `started`.
    pub fn set_refresh(&self, group: usize, status: &str, started: jiff::Timestamp) {
        let (name, id) = (GROUPS[group], REFRESH_IDS[group]);
        self.autoscaling.set_refresh_status(name, id, status);
        self.refreshes.put_refresh(InstanceRefreshDescription {
            instance_refresh_id: id.into(),
            auto_scaling_group_name: name.into(),
            status: status.into(),
            start_time: Some(started),
            min_healthy_percentage: Some(90),
            max_healthy_percentage: Some(100),
            skip_matching: self.skip_matching,
            ..InstanceRefreshDescription::default()
        });
    }

    /// The instance `instance_id` is now in `state` in its group (`None`: it left the group),
    /// for both fakes.
    pub fn set_group_state(&self, instance_id: &str, state: Option<&str>) {
        let Some(member) = self.member(instance_id) else {
            return;
        };
        if let Some(state) = state {
            self.autoscaling.set_lifecycle_state(instance_id, state);
            let health = if self
                .health
                .marked_unhealthy()
                .iter()
                .any(|i| i == instance_id)
            {
                "UNHEALTHY"
            } else {
                "HEALTHY"
            };
            self.health
                .set_instance(member.group_name(), instance_id, state, health);
        } else {
            self.health.remove_instance(instance_id);
        }
        let mut groups = self.groups_lock();
        let Some(group) = groups.get_mut(member.group) else {
            return;
        };
        group.instances.retain(|i| i.instance_id != instance_id);
        if let Some(state) = state {
            group.instances.push(ConfiguredInstance {
                lifecycle_state: state.into(),
                ..configured(member)
            });
        }
        group.desired_capacity = u32::try_from(group.instances.len()).unwrap_or(u32::MAX);
        self.refreshes.put_group(group.clone());
    }

    /// The instance started again after a stop: EC2 reports now as its `LaunchTime` (node
    /// repair's view); its first launch (the instance refresh function's) stays.
    pub fn started_now(&self, member: &Member) {
        self.health
            .set_launch_time(&member.instance_id, jiff::Timestamp::now());
    }

    /// A replacement comes into service: EC2 launched it now, its node registers Ready.
    pub fn launch(&self, member: &Member) {
        let now = jiff::Timestamp::now();
        self.refreshes.put_launch_time(&member.instance_id, now);
        self.health.set_launch_time(&member.instance_id, now);
        self.register(member);
        self.set_group_state(&member.instance_id, Some("InService"));
    }

    fn register(&self, member: &Member) {
        self.instances.add(&member.instance_id, &member.node);
        self.set_running(member);
        self.autoscaling
            .set_lifecycle_state(&member.instance_id, "InService");
        self.server
            .register_node(&member.node, &member.provider_id(), Some(Duration::ZERO))
            .unwrap_or_else(|e| panic!("register {}: {e}", member.node));
    }

    async fn register_fleet(&self) {
        let initial: Vec<&Member> = self.fleet.iter().filter(|m| initial(m)).collect();
        for member in &initial {
            self.register(member);
        }
        let replicas = i32::try_from(initial.len() * 2).unwrap_or(4);
        let web = Workload::new("default", "web")
            .replicas(replicas)
            .container("web", "nginx")
            .cpu_request_millis(WEB_CPU_MILLIS)
            .grace_period_seconds(Some(0));
        let store = self.server.store();
        store
            .create(&web.deployment())
            .unwrap_or_else(|e| panic!("{e}"));
        store
            .create(&fixtures::pdb_max_unavailable(
                "default",
                "web",
                serde_json::json!(1),
                &[("app", "web")],
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        let wanted = replicas as usize;
        self.server
            .wait_for("the workload runs", Duration::from_secs(20), |store| {
                store
                    .list::<Pod>()
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count()
                    >= wanted
                    && store
                        .list::<Node>()
                        .iter()
                        .all(node_manager::lifecycle::node::is_ready)
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// EC2 reports `member`'s instance running.
    pub fn set_running(&self, member: &Member) {
        self.set_state(member, "running");
    }

    /// EC2 reports `member`'s instance in `state`.
    pub fn set_state(&self, member: &Member, state: &str) {
        self.instances.notices.set_facts(
            &member.instance_id,
            InstanceFacts {
                state: Some(state.into()),
                auto_scaling_group: Some(member.group_name().into()),
                spot_request_id: member.spot_request(),
                private_dns_name: Some(member.node.clone()),
            },
        );
    }

    /// The lifecycle state Auto Scaling reports for `instance_id` (read without faults).
    pub fn autoscaling_state(&self, instance_id: &str) -> Option<String> {
        let member = self.member(instance_id)?;
        let groups = self.groups_lock();
        match groups
            .get(member.group)
            .and_then(|g| g.instances.iter().find(|i| i.instance_id == instance_id))
        {
            Some(instance) => Some(instance.lifecycle_state.clone()),
            None => Some("Terminated".to_owned()),
        }
    }

    /// Whether its group's refresh replaces `member` (its node may carry that refresh's
    /// marks): a refreshed instance, or, without `SkipMatching`, any of the group's initial
    /// instances when the group refreshes.
    pub fn refresh_replaces(&self, member: &Member) -> bool {
        let group_refreshes = self
            .fleet
            .iter()
            .any(|m| m.group == member.group && m.fate.is_refreshed());
        member.fate.is_refreshed() || (!self.skip_matching && initial(member) && group_refreshes)
    }

    pub fn member(&self, instance_id: &str) -> Option<&Member> {
        self.fleet.iter().find(|m| m.instance_id == instance_id)
    }

    /// Whether any instance of the fleet has `fate`.
    pub fn any(&self, fate: impl Fn(&Fate) -> bool) -> bool {
        self.fleet.iter().any(|m| fate(&m.fate))
    }
}
