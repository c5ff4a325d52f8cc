//! One seed's world: the fake API server (with `infra/rbac.yaml` and each function's own
//! identity: the terminating and launching hooks, the instance refresh function, node
//! repair), a node per instance with a PDB-guarded workload spread over them, and the shared
//! crate's in-memory Auto Scaling, EC2 and SNS, which the soak sets to what AWS says (each
//! function's view of Auto Scaling kept in step: lifecycle states, the group's configuration
//! and refresh, membership and health).

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
pub const GROUP: &str = "eks-soak-events-ng-1";
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
/// The instance refresh that runs in a seed with refreshed instances.
pub const REFRESH_ID: &str = "0d4a5c7e-1111-4222-8333-9444455556aa";
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
    /// The group's configuration as the soak sets it (read without the fakes' faults).
    group: std::sync::Mutex<GroupConfiguration>,
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
        ("DRAIN_TIMEOUT_SECONDS", "20"),
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

/// The group's terminating hook (the drain) and launching hook (out of the warm pool).
fn add_hooks(autoscaling: &InMemoryAutoScaling) {
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
            GROUP,
            LifecycleHook {
                name: name.into(),
                transition: transition.into(),
                heartbeat_timeout: Duration::from_secs(300),
                global_timeout: Duration::from_secs(3600),
                default_result,
            },
        );
    }
    autoscaling.set_hook_target(GROUP, HOOK, &lifecycle_topic());
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
        autoscaling.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
        add_hooks(&autoscaling);
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
        health.add_group(GROUP, &[("eks:cluster-name", CLUSTER)], Duration::ZERO);
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
            group: std::sync::Mutex::default(),
            skip_matching: true,
            rebalance_drains,
            fleet,
        };
        world.configure_group();
        world.register_fleet().await;
        world
    }

    /// The group as `DescribeAutoScalingGroups` reports it to the instance refresh function:
    /// this cluster's, on version 2 of its template, its initial instances launched an hour
    /// ago.
    fn configure_group(&self) {
        let hour_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600);
        let instances: Vec<ConfiguredInstance> = self
            .fleet
            .iter()
            .filter(|m| initial(m))
            .map(configured)
            .collect();
        for instance in &instances {
            self.refreshes
                .put_launch_time(&instance.instance_id, hour_ago);
            self.health.set_launch_time(&instance.instance_id, hour_ago);
            self.health.add_instance(GROUP, &instance.instance_id);
        }
        self.refreshes.put_launch_template(LaunchTemplateVersions {
            id: TEMPLATE_ID.into(),
            name: "soak-nodes".into(),
            default_version: 2,
            latest_version: 2,
        });
        let group = GroupConfiguration {
            name: GROUP.into(),
            tags: [("eks:cluster-name".to_owned(), CLUSTER.to_owned())].into(),
            desired_capacity: u32::try_from(instances.len()).unwrap_or(u32::MAX),
            launch_template: Some(template("2")),
            instances,
            ..GroupConfiguration::default()
        };
        self.refreshes.put_group(group.clone());
        *self
            .group
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = group;
    }

    /// What both fakes say of the group's refresh: `status`, started at `started`.
    pub fn set_refresh(&self, status: &str, started: jiff::Timestamp) {
        self.autoscaling
            .set_refresh_status(GROUP, REFRESH_ID, status);
        self.refreshes.put_refresh(InstanceRefreshDescription {
            instance_refresh_id: REFRESH_ID.into(),
            auto_scaling_group_name: GROUP.into(),
            status: status.into(),
            start_time: Some(started),
            min_healthy_percentage: Some(90),
            max_healthy_percentage: Some(100),
            skip_matching: self.skip_matching,
            ..InstanceRefreshDescription::default()
        });
    }

    /// The group's instance `instance_id` is now in `state` (`None`: it left the group),
    /// for both fakes.
    pub fn set_group_state(&self, instance_id: &str, state: Option<&str>) {
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
            self.health.set_instance(GROUP, instance_id, state, health);
        } else {
            self.health.remove_instance(instance_id);
        }
        let mut group = self
            .group
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        group.instances.retain(|i| i.instance_id != instance_id);
        if let (Some(state), Some(member)) = (state, self.member(instance_id)) {
            group.instances.push(ConfiguredInstance {
                lifecycle_state: state.into(),
                ..configured(member)
            });
        }
        group.desired_capacity = u32::try_from(group.instances.len()).unwrap_or(u32::MAX);
        self.refreshes.put_group(group.clone());
    }

    /// EC2 reports now as the instance's `LaunchTime` (its last start: a launch, or a start
    /// after a stop).
    pub fn started_now(&self, member: &Member) {
        let now = jiff::Timestamp::now();
        self.refreshes.put_launch_time(&member.instance_id, now);
        self.health.set_launch_time(&member.instance_id, now);
    }

    /// A replacement comes into service: EC2 launched it now, its node registers Ready.
    pub fn launch(&self, member: &Member) {
        self.started_now(member);
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
                auto_scaling_group: Some(GROUP.into()),
                spot_request_id: member.spot_request(),
                private_dns_name: Some(member.node.clone()),
            },
        );
    }

    /// The lifecycle state Auto Scaling reports for `instance_id` (read without faults).
    pub fn autoscaling_state(&self, instance_id: &str) -> Option<String> {
        let group = self
            .group
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match group
            .instances
            .iter()
            .find(|i| i.instance_id == instance_id)
        {
            Some(instance) => Some(instance.lifecycle_state.clone()),
            None => self.member(instance_id).map(|_| "Terminated".to_owned()),
        }
    }

    /// Whether the refresh replaces `member` (its node may carry the refresh's marks).
    pub fn refresh_replaces(&self, member: &Member) -> bool {
        member.fate.is_refreshed() || (!self.skip_matching && initial(member))
    }

    pub fn member(&self, instance_id: &str) -> Option<&Member> {
        self.fleet.iter().find(|m| m.instance_id == instance_id)
    }

    /// Whether any instance of the fleet has `fate`.
    pub fn any(&self, fate: impl Fn(&Fate) -> bool) -> bool {
        self.fleet.iter().any(|m| fate(&m.fate))
    }
}
