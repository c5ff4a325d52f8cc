//! Lifecycle actions and hooks for the lifecycle modules' unit tests.

use std::time::Duration;

use crate::aws::{LifecycleActionRef, LifecycleActionResult, LifecycleHook};

pub fn action() -> LifecycleActionRef {
    LifecycleActionRef {
        auto_scaling_group_name: "asg".into(),
        lifecycle_hook_name: "Launch-LC-Hook".into(),
        instance_id: "i-0a1b2c3d4e5f60718".into(),
        token: "tok".into(),
    }
}

pub fn hook(heartbeat_secs: u64, global_secs: u64) -> LifecycleHook {
    LifecycleHook {
        name: "Launch-LC-Hook".into(),
        transition: "autoscaling:EC2_INSTANCE_LAUNCHING".into(),
        heartbeat_timeout: Duration::from_secs(heartbeat_secs),
        global_timeout: Duration::from_secs(global_secs),
        default_result: LifecycleActionResult::Abandon,
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A hook whose timings are in milliseconds, so waits run in real time quickly.
pub(crate) fn fast_hook(heartbeat_ms: u64, global_ms: u64) -> LifecycleHook {
    LifecycleHook {
        heartbeat_timeout: ms(heartbeat_ms),
        global_timeout: ms(global_ms),
        ..hook(0, 0)
    }
}
