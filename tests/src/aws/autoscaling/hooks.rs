//! Lifecycle hooks as a test declares them, the transitions they pause, and the records
//! of their actions (the notice sent, each heartbeat, the end).

use std::time::Duration;

use node_manager::aws::LifecycleActionResult;

/// Auto Scaling's cap on a lifecycle action's total wait.
const MAX_GLOBAL_TIMEOUT: Duration = Duration::from_secs(48 * 3600);

/// The instance transition a hook pauses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LifecycleTransition {
    Launching,
    Terminating,
}

impl LifecycleTransition {
    /// `autoscaling:EC2_INSTANCE_LAUNCHING` / `autoscaling:EC2_INSTANCE_TERMINATING`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Launching => "autoscaling:EC2_INSTANCE_LAUNCHING",
            Self::Terminating => "autoscaling:EC2_INSTANCE_TERMINATING",
        }
    }

    pub(super) fn word(self) -> &'static str {
        match self {
            Self::Launching => "LAUNCHING",
            Self::Terminating => "TERMINATING",
        }
    }

    pub(super) fn wait_state(self) -> &'static str {
        match self {
            Self::Launching => "Pending:Wait",
            Self::Terminating => "Terminating:Wait",
        }
    }
}

impl std::fmt::Display for LifecycleTransition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lifecycle hook. Defaults are AWS's: heartbeat 3600 s, default result `ABANDON`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLifecycleHook {
    pub name: String,
    pub transition: LifecycleTransition,
    /// As declared (and reported); runs scaled by the time scale.
    pub heartbeat_timeout: Duration,
    /// `None`: `min(100 × heartbeat, 48 h)`, as AWS computes it.
    pub global_timeout: Option<Duration>,
    pub default_result: LifecycleActionResult,
    /// The SNS topic the notification goes to (delivered when the fake SNS has it).
    pub notification_target_arn: Option<String>,
    pub role_arn: Option<String>,
    pub notification_metadata: Option<String>,
}

impl FakeLifecycleHook {
    pub fn new(name: &str, transition: LifecycleTransition) -> Self {
        Self {
            name: name.to_owned(),
            transition,
            heartbeat_timeout: Duration::from_secs(3600),
            global_timeout: None,
            default_result: LifecycleActionResult::Abandon,
            notification_target_arn: None,
            role_arn: None,
            notification_metadata: None,
        }
    }

    pub fn launching(name: &str) -> Self {
        Self::new(name, LifecycleTransition::Launching)
    }

    pub fn terminating(name: &str) -> Self {
        Self::new(name, LifecycleTransition::Terminating)
    }

    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    pub fn global_timeout(mut self, timeout: Duration) -> Self {
        self.global_timeout = Some(timeout);
        self
    }

    pub fn default_result(mut self, result: LifecycleActionResult) -> Self {
        self.default_result = result;
        self
    }

    pub fn notification_target(mut self, topic_arn: &str) -> Self {
        self.notification_target_arn = Some(topic_arn.to_owned());
        self
    }

    pub fn role(mut self, role_arn: &str) -> Self {
        self.role_arn = Some(role_arn.to_owned());
        self
    }

    pub fn metadata(mut self, metadata: &str) -> Self {
        self.notification_metadata = Some(metadata.to_owned());
        self
    }

    /// The global timeout AWS applies.
    pub fn effective_global_timeout(&self) -> Duration {
        self.global_timeout
            .unwrap_or_else(|| (self.heartbeat_timeout * 100).min(MAX_GLOBAL_TIMEOUT))
    }
}

/// The lifecycle notification Auto Scaling sent when an action started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleNotice {
    /// The notification JSON exactly as Auto Scaling publishes it (the SNS `Message`).
    pub message: String,
    /// The SNS subject Auto Scaling uses.
    pub subject: String,
    pub token: String,
    pub group_name: String,
    pub hook_name: String,
    pub instance_id: String,
    pub transition: LifecycleTransition,
    /// The topic it was delivered to, when the hook has a target the fake SNS knows.
    pub delivered_to: Option<String>,
}

/// How a lifecycle action ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletedBy {
    /// `CompleteLifecycleAction`.
    Call,
    /// No heartbeat or completion within the heartbeat timeout: default result applied.
    HeartbeatTimeout,
    /// The global timeout passed: default result applied.
    GlobalTimeout,
}

/// The end of one lifecycle action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleCompletion {
    pub group_name: String,
    pub hook_name: String,
    pub instance_id: String,
    pub token: String,
    pub transition: LifecycleTransition,
    pub result: LifecycleActionResult,
    pub by: CompletedBy,
    /// Heartbeats recorded for the action.
    pub heartbeats: u32,
    /// Real time since the action started.
    pub after: Duration,
}

/// One accepted `RecordLifecycleActionHeartbeat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatRecord {
    pub group_name: String,
    pub hook_name: String,
    pub instance_id: String,
    pub token: String,
    /// Real time since the action started.
    pub after: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_global_timeout_is_100_heartbeats_capped_at_48_hours() {
        let short = FakeLifecycleHook::terminating("h").heartbeat_timeout(Duration::from_secs(60));
        assert_eq!(short.effective_global_timeout(), Duration::from_secs(6000));
        let long = FakeLifecycleHook::terminating("h").heartbeat_timeout(Duration::from_secs(7200));
        assert_eq!(long.effective_global_timeout(), MAX_GLOBAL_TIMEOUT);
        let set = short.global_timeout(Duration::from_secs(90));
        assert_eq!(set.effective_global_timeout(), Duration::from_secs(90));
    }
}
