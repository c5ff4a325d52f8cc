//! The hook functions of a soak, in process: the real `Drainer` and launch handler with
//! settings for a fast scenario, both publishing hand-overs to one in-memory topic.

use node_manager::lifecycle::handler::Clients;
use std::time::Duration;

use node_manager::aws::in_memory::{InMemoryInstances, InMemoryNotifications};
use node_manager::drain::{Drainer, Invocation};
use node_manager::launch::Launcher;
use node_manager::lifecycle::budget::InvocationBudget;
use node_manager::lifecycle::handler::HookHandler;
use node_manager::lifecycle::settings::{DrainSettings, LaunchSettings};
use rand::Rng;
use serde_json::Value;

use super::setup::Soak;
use super::watched::WatchedAutoScaling;
use super::{ACCOUNT, CLUSTER, TOPIC};
use crate::soak::corpus::Target;

/// How long a drain may take before its deadline result, in seconds.
pub(super) const DRAIN_TIMEOUT_SECONDS: f64 = 4.0;

type SoakDrainer =
    Drainer<Clients<kube::Client, WatchedAutoScaling, InMemoryInstances, InMemoryNotifications>>;
type SoakLauncher =
    Launcher<Clients<kube::Client, WatchedAutoScaling, InMemoryInstances, InMemoryNotifications>>;

/// The terminating and launching hooks, and the topic their hand-overs go to.
pub(super) struct Functions {
    drainer: SoakDrainer,
    launcher: SoakLauncher,
    pub(super) notifications: InMemoryNotifications,
}

impl Functions {
    /// Both hooks with the scenario's clients; whether the drain records Events is drawn.
    pub(super) fn new(
        soak: &mut Soak,
        drain_client: kube::Client,
        launch_client: kube::Client,
    ) -> Self {
        let drain_timeout = format!("{DRAIN_TIMEOUT_SECONDS}");
        let drain_settings = DrainSettings::from_source(
            [
                ("CLUSTER_NAME", CLUSTER),
                ("SETTLE_SECONDS", "0"),
                ("DRAIN_TIMEOUT_SECONDS", drain_timeout.as_str()),
                ("EVICTION_BACKOFF_SECONDS", "0.02"),
                ("EVICTION_BACKOFF_MAX_SECONDS", "0.1"),
                ("DRAIN_LEASE_SECONDS", "0.5"),
                ("STUCK_POD_SECONDS", "0.3"),
                ("HAND_OVER_MARGIN_SECONDS", "0"),
                ("CONTINUATION_TOPIC_ARN", TOPIC),
                ("DRAIN_FORCE", if soak.force { "true" } else { "false" }),
            ]
            .as_slice(),
        )
        .expect("drain settings");
        let notifications = InMemoryNotifications::default();
        let mut drainer = Drainer::new(
            drain_client,
            soak.autoscaling(),
            soak.instances.clone(),
            notifications.clone(),
            drain_settings,
        );
        drainer.record_events = soak.rng.random_bool(0.5);
        let launch_settings = LaunchSettings::from_source(
            [
                ("CLUSTER_NAME", CLUSTER),
                ("LAUNCH_TIMEOUT_SECONDS", "5"),
                ("HAND_OVER_MARGIN_SECONDS", "0"),
                ("CONTINUATION_TOPIC_ARN", TOPIC),
            ]
            .as_slice(),
        )
        .expect("launch settings");
        let launcher = Launcher::new(
            launch_client,
            soak.autoscaling(),
            soak.instances.clone(),
            notifications.clone(),
            launch_settings,
        );
        Self {
            drainer,
            launcher,
            notifications,
        }
    }

    /// One invocation of `target`'s function with `event` and `budget` of time left; whether
    /// it succeeded.
    pub(super) async fn invoke(
        &self,
        target: Target,
        event: Value,
        request_id: String,
        budget: Duration,
    ) -> bool {
        match target {
            Target::TerminatingHook => {
                let invocation = Invocation {
                    request_id,
                    function_account: Some(ACCOUNT.into()),
                    budget: InvocationBudget::new(budget, Duration::ZERO),
                };
                self.drainer
                    .handle_invocation(event, &invocation)
                    .await
                    .is_ok()
            }
            _ => {
                let mut ctx = lambda_runtime::Context::default();
                ctx.request_id = request_id;
                ctx.invoked_function_arn =
                    format!("arn:aws:lambda:eu-west-1:{ACCOUNT}:function:launching-hook");
                ctx.deadline = u64::try_from(
                    (std::time::SystemTime::now() + budget)
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis(),
                )
                .unwrap_or(u64::MAX);
                self.launcher.handle(event, &ctx).await.is_ok()
            }
        }
    }
}
