//! Warm pools: instances launched into a group's pool wait there stopped, hibernated or
//! running; scale-out starts one from the pool, and scale-in with reuse sends one back.

use super::{FakeAutoScaling, LifecycleNotice, LifecycleTransition, Route};
use crate::aws::FakeAwsError;

/// The state instances wait in while in a group's warm pool (`PoolState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmPoolState {
    Stopped,
    Running,
    Hibernated,
}

impl WarmPoolState {
    /// The Auto Scaling lifecycle state of an instance waiting in the pool.
    pub fn lifecycle_state(self) -> &'static str {
        match self {
            Self::Stopped => "Warmed:Stopped",
            Self::Running => "Warmed:Running",
            Self::Hibernated => "Warmed:Hibernated",
        }
    }

    /// Its name in a `WarmPoolConfiguration` (`PoolState`).
    pub(super) fn pool_state(self) -> &'static str {
        match self {
            Self::Stopped => "Stopped",
            Self::Running => "Running",
            Self::Hibernated => "Hibernated",
        }
    }

    /// What EC2 reports for it (a hibernated instance is `stopped` in EC2).
    pub(super) fn ec2_state(self) -> crate::aws::ec2::InstanceState {
        match self {
            Self::Running => crate::aws::ec2::InstanceState::Running,
            Self::Stopped | Self::Hibernated => crate::aws::ec2::InstanceState::Stopped,
        }
    }
}

impl FakeAutoScaling {
    /// Gives the group a warm pool whose instances wait in `state` (`PutWarmPool`).
    pub fn set_warm_pool(&self, group_name: &str, state: WarmPoolState) {
        self.state().warm_pools.insert(group_name.to_owned(), state);
    }

    /// Launches `instance_id` into the group's warm pool: it waits in `Warmed:Pending:Wait`
    /// (notification `EC2` -> `WarmPool`); once completed it is stopped, hibernated or kept
    /// running as the pool's state says, and not in service.
    pub fn launch_into_warm_pool(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        self.start_routed_action(
            group_name,
            instance_id,
            LifecycleTransition::Launching,
            Route {
                origin: "EC2",
                destination: Route::WARM_POOL,
                wait_state: "Warmed:Pending:Wait",
            },
        )
    }

    /// Scale-out from the warm pool: the pooled instance starts (EC2 `running`) and waits in
    /// `Pending:Wait` (notification `WarmPool` -> `AutoScalingGroup`), then goes in service.
    pub fn launch_from_warm_pool(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        crate::aws::ec2::set_state_of(
            &self.shared,
            instance_id,
            crate::aws::ec2::InstanceState::Running,
        );
        self.start_routed_action(
            group_name,
            instance_id,
            LifecycleTransition::Launching,
            Route {
                origin: Route::WARM_POOL,
                destination: "AutoScalingGroup",
                wait_state: "Pending:Wait",
            },
        )
    }

    /// Scale-in with instance reuse: the in-service instance goes back to the warm pool
    /// instead of terminating. The terminating hook pauses it in `Warmed:Pending:Wait`
    /// (notification `AutoScalingGroup` -> `WarmPool`); once completed it waits in the pool.
    pub fn scale_in_to_warm_pool(
        &self,
        group_name: &str,
        instance_id: &str,
    ) -> Result<LifecycleNotice, FakeAwsError> {
        self.start_routed_action(
            group_name,
            instance_id,
            LifecycleTransition::Terminating,
            Route {
                origin: "AutoScalingGroup",
                destination: Route::WARM_POOL,
                wait_state: "Warmed:Pending:Wait",
            },
        )
    }
}
