//! One seed's world: the fake API server (with `infra/rbac.yaml` and the terminating hook's
//! identity), a node per instance with a PDB-guarded workload spread over them, and the
//! shared crate's in-memory Auto Scaling, EC2 and SNS, which the soak sets to what AWS says.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use node_manager::aws::in_memory::{InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications};
use node_manager::aws::{InstanceFacts, LifecycleActionResult, LifecycleHook};
use node_manager::drain::Drainer;
use node_manager::lifecycle::handler::Clients;
use node_manager::lifecycle::settings::DrainSettings;

use super::plan::{Fate, Member};
use crate::fixtures::{self, Workload};
use crate::identity::function_client;
use crate::kube::FakeApiServer;

pub const CLUSTER: &str = "soak-events";
pub const GROUP: &str = "eks-soak-events-ng-1";
pub const HOOK: &str = "Terminate-LC-Hook";
/// How long a rebalance cordon holds before the reconciler may undo it.
pub const REBALANCE_UNDO: Duration = Duration::from_secs(1);
/// How long a drain's lease lasts without renewal.
pub const LEASE: Duration = Duration::from_secs(1);
/// How long before a maintenance its drain is due.
pub const MAINTENANCE_MARGIN: Duration = Duration::from_secs(3600);
const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/rbac.yaml");

pub type SoakDrainer =
    Drainer<Clients<kube::Client, InMemoryAutoScaling, InMemoryInstances, InMemoryNotifications>>;

/// The world one seed plays in.
pub struct EventWorld {
    pub server: FakeApiServer,
    pub autoscaling: InMemoryAutoScaling,
    pub instances: InMemoryInstances,
    pub notifications: InMemoryNotifications,
    /// The terminating hook's identity.
    pub client: kube::Client,
    pub drainer: SoakDrainer,
    pub fleet: Vec<Member>,
}

/// The terminating hook's settings in the soak: scaled-down timings, no force.
fn settings() -> DrainSettings {
    let undo = REBALANCE_UNDO.as_secs().to_string();
    let lease = LEASE.as_secs().to_string();
    let margin = MAINTENANCE_MARGIN.as_secs().to_string();
    let env: Vec<(&str, &str)> = vec![
        ("CLUSTER_NAME", CLUSTER),
        ("SETTLE_SECONDS", "0.05"),
        ("DRAIN_TIMEOUT_SECONDS", "20"),
        ("EVICTION_BACKOFF_SECONDS", "0.05"),
        ("EVICTION_BACKOFF_MAX_SECONDS", "0.2"),
        ("DRAIN_LEASE_SECONDS", &lease),
        ("HAND_OVER_MARGIN_SECONDS", "0"),
        ("REBALANCE_UNDO_SECONDS", &undo),
        ("MAINTENANCE_DRAIN_MARGIN_SECONDS", &margin),
    ];
    // The soak's own constants: a failure here is a bug of the soak.
    DrainSettings::from_source(env.as_slice()).unwrap_or_else(|e| panic!("soak settings: {e}"))
}

impl EventWorld {
    /// The cluster of `fleet`, every node Ready and the workload running.
    pub async fn start(fleet: Vec<Member>) -> Self {
        let server = FakeApiServer::builder()
            .cluster_name(CLUSTER)
            .start()
            .await
            .unwrap_or_else(|e| panic!("fake API server: {e}"));
        server
            .apply_manifest_file(std::path::Path::new(RBAC))
            .unwrap_or_else(|e| panic!("rbac: {e}"));
        let client = function_client(&server, "terminating-hook")
            .await
            .unwrap_or_else(|e| panic!("client: {e}"));
        let autoscaling = InMemoryAutoScaling::new();
        autoscaling.add_group(GROUP, &[("eks:cluster-name", CLUSTER)]);
        autoscaling.add_hook(
            GROUP,
            LifecycleHook {
                name: HOOK.into(),
                transition: "autoscaling:EC2_INSTANCE_TERMINATING".into(),
                heartbeat_timeout: Duration::from_secs(300),
                global_timeout: Duration::from_secs(3600),
                default_result: LifecycleActionResult::Continue,
            },
        );
        let instances = InMemoryInstances::default();
        let notifications = InMemoryNotifications::default();
        let drainer = Drainer::new(
            client.clone(),
            autoscaling.clone(),
            instances.clone(),
            notifications.clone(),
            settings(),
        );
        let world = Self {
            server,
            autoscaling,
            instances,
            notifications,
            client,
            drainer,
            fleet,
        };
        world.register_fleet().await;
        world
    }

    async fn register_fleet(&self) {
        for member in &self.fleet {
            self.instances.add(&member.instance_id, &member.node);
            self.set_running(member);
            self.autoscaling
                .set_lifecycle_state(&member.instance_id, "InService");
            self.server
                .register_node(&member.node, &member.provider_id(), Some(Duration::ZERO))
                .unwrap_or_else(|e| panic!("register {}: {e}", member.node));
        }
        let replicas = i32::try_from(self.fleet.len() * 2).unwrap_or(4);
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

    pub fn member(&self, instance_id: &str) -> Option<&Member> {
        self.fleet.iter().find(|m| m.instance_id == instance_id)
    }

    /// Whether any instance of the fleet has `fate`.
    pub fn any(&self, fate: impl Fn(&Fate) -> bool) -> bool {
        self.fleet.iter().any(|m| fate(&m.fate))
    }
}
