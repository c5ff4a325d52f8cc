//! The lifecycle hooks' settings, read once at start-up from the environment.
//!
//! Defaults follow what EKS does for managed node groups (15 minutes to drain, 60 seconds to
//! settle, CONTINUE when time runs out) so a self-managed group behaves the same out of the
//! box. Durations are in seconds and may be fractional (`0.05`), which lets tests scale a
//! whole scenario down without a second code path.

use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

use crate::aws::LifecycleActionResult;
use crate::settings::{ClusterScope, SettingsError, SettingsSource};

/// Settings both hook functions share.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleSettings {
    /// `CLUSTER_NAME` (required) and `ADDITIONAL_CLUSTER_NAMES`.
    pub cluster: ClusterScope,
    /// `AUTO_SCALING_GROUP_NAMES`: groups acted on even without a cluster tag
    /// (comma-separated). Empty by default: only tagged groups are ours.
    pub allowed_groups: Vec<String>,
    /// `HAND_OVER_MARGIN_SECONDS` (30): how long before the invocation's deadline the work
    /// stops and the notification is handed to a fresh invocation.
    pub hand_over_margin: Duration,
    /// `CONTINUATION_TOPIC_ARN` (unset): where a notification that arrived through
    /// EventBridge is published to continue; SNS deliveries go back to their own topic.
    pub continuation_topic_arn: Option<String>,
}

impl LifecycleSettings {
    pub fn from_source(source: &(impl SettingsSource + ?Sized)) -> Result<Self, SettingsError> {
        Ok(Self {
            cluster: ClusterScope::from_source(source)?,
            allowed_groups: source.list("AUTO_SCALING_GROUP_NAMES"),
            hand_over_margin: seconds(source, "HAND_OVER_MARGIN_SECONDS", Duration::from_secs(30))?,
            continuation_topic_arn: source.value("CONTINUATION_TOPIC_ARN"),
        })
    }
}

/// The terminating hook's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainSettings {
    pub lifecycle: LifecycleSettings,
    /// `DRAIN_TIMEOUT_SECONDS` (900): how long after the drain started pods may still be
    /// evicted; EKS's figure.
    pub drain_timeout: Duration,
    /// `SETTLE_SECONDS` (60): wait after the node is empty, so the service controller takes
    /// the node out of load balancers before the instance goes.
    pub settle: Duration,
    /// `EVICTION_CONCURRENCY` (16): evictions in flight at once.
    pub eviction_concurrency: usize,
    /// `EVICTION_BACKOFF_SECONDS` (1): first retry spacing of a refused eviction.
    pub eviction_backoff: Duration,
    /// `EVICTION_BACKOFF_MAX_SECONDS` (30): cap of that spacing, also of a `Retry-After`.
    pub eviction_backoff_max: Duration,
    /// `DRAIN_LEASE_SECONDS` (60): how long an invocation's claim on a node's drain lasts
    /// without renewal.
    pub lease_duration: Duration,
    /// `DRAIN_FORCE` (false): at the deadline, delete the pods that could not be evicted
    /// (bypassing PodDisruptionBudgets).
    pub force: bool,
    /// `DRAIN_TIMEOUT_RESULT` (CONTINUE): the lifecycle result when the deadline passes
    /// without force (or force could not delete every pod).
    pub timeout_result: DrainTimeoutResult,
    /// `POD_GRACE_PERIOD_SECONDS` (unset: each pod's own `terminationGracePeriodSeconds`).
    pub pod_grace_period: Option<Duration>,
    /// `NODE_TAINT` (unset): a taint put on the node with the cordon, `key[=value]:Effect`.
    pub taint: Option<TaintSetting>,
    /// `STUCK_POD_SECONDS` (60): how long past its deletion deadline (grace period end) a
    /// pod being deleted still holds the drain, and how long a node may be NotReady before
    /// its pods being deleted stop holding it (a dead kubelet never confirms a deletion).
    pub stuck_pod_after: Duration,
    /// `LOAD_BALANCER_WAIT` (true): once the node is empty, wait until the cluster's load
    /// balancers no longer route to the instance (bounded by `SETTLE_SECONDS` plus each
    /// one's deregistration delay) instead of waiting `SETTLE_SECONDS` only.
    pub load_balancer_wait: bool,
    /// `VOLUME_DETACH_SECONDS` (300): how long after the node is empty the drain waits for
    /// its volumes to detach (no `VolumeAttachment` naming the node); `0` does not wait.
    pub volume_detach: Duration,
    /// `DRAIN_BLOCKED_REPORT_SECONDS` (180): once the drain has run this long with pods
    /// left (or, its pods gone, volumes or load balancers still in the way), a `DrainBlocked`
    /// Event names them and what holds them, then at most this often; `0` never.
    pub blocked_report: Duration,
    /// `OUT_OF_SERVICE_TAINT` (true): a drain whose node's kubelet is silent with pods stuck
    /// terminating puts `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` on it
    /// ([`crate::node_marks::shutdown`]).
    pub out_of_service_taint: bool,
    /// Spot interruptions, rebalance recommendations, scheduled maintenance.
    pub notices: crate::instance_notice::settings::NoticeSettings,
}

impl DrainSettings {
    pub fn from_source(source: &(impl SettingsSource + ?Sized)) -> Result<Self, SettingsError> {
        let eviction_concurrency = source.parsed(
            "EVICTION_CONCURRENCY",
            16usize,
            "a whole number of at least 1",
        )?;
        if eviction_concurrency == 0 {
            return Err(SettingsError::Invalid {
                name: "EVICTION_CONCURRENCY",
                value: "0".to_owned(),
                expected: "a whole number of at least 1",
            });
        }
        Ok(Self {
            lifecycle: LifecycleSettings::from_source(source)?,
            drain_timeout: seconds(source, "DRAIN_TIMEOUT_SECONDS", Duration::from_secs(900))?,
            settle: seconds(source, "SETTLE_SECONDS", Duration::from_secs(60))?,
            eviction_concurrency,
            eviction_backoff: seconds(source, "EVICTION_BACKOFF_SECONDS", Duration::from_secs(1))?,
            eviction_backoff_max: seconds(
                source,
                "EVICTION_BACKOFF_MAX_SECONDS",
                Duration::from_secs(30),
            )?,
            lease_duration: seconds(source, "DRAIN_LEASE_SECONDS", Duration::from_secs(60))?,
            force: source.flag("DRAIN_FORCE", false)?,
            timeout_result: drain_timeout_result(source, "DRAIN_TIMEOUT_RESULT")?,
            pod_grace_period: optional_seconds(source, "POD_GRACE_PERIOD_SECONDS")?,
            taint: node_taint(source)?,
            stuck_pod_after: seconds(source, "STUCK_POD_SECONDS", Duration::from_secs(60))?,
            load_balancer_wait: source.flag("LOAD_BALANCER_WAIT", true)?,
            volume_detach: seconds(source, "VOLUME_DETACH_SECONDS", Duration::from_secs(300))?,
            blocked_report: seconds(
                source,
                "DRAIN_BLOCKED_REPORT_SECONDS",
                Duration::from_secs(180),
            )?,
            out_of_service_taint: source.flag("OUT_OF_SERVICE_TAINT", true)?,
            notices: crate::instance_notice::settings::NoticeSettings::from_source(source)?,
        })
    }
}

/// `DRAIN_TIMEOUT_RESULT`: how the lifecycle action of a drain that failed (pods left at the
/// deadline) is completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainTimeoutResult {
    /// CONTINUE: the instance terminates with the pods still on it (what EKS does).
    Continue,
    /// ABANDON: the instance terminates too, unless its group retains abandoned instances.
    Abandon,
    /// ABANDON when the group retains abandoned instances (the instance and its node are kept
    /// for inspection), CONTINUE otherwise: never an ABANDON that would terminate anyway.
    Retain,
}

impl DrainTimeoutResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Continue => "CONTINUE",
            Self::Abandon => "ABANDON",
            Self::Retain => "RETAIN",
        }
    }

    /// Parses `CONTINUE`, `ABANDON` or `RETAIN` (case-insensitive).
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_uppercase().as_str() {
            "RETAIN" => Some(Self::Retain),
            other => match LifecycleActionResult::parse(other)? {
                LifecycleActionResult::Continue => Some(Self::Continue),
                LifecycleActionResult::Abandon => Some(Self::Abandon),
            },
        }
    }
}

/// The launching hook's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchSettings {
    pub lifecycle: LifecycleSettings,
    /// `LAUNCH_TIMEOUT_SECONDS` (600): how long after Auto Scaling started the launch the
    /// node may take to register and turn Ready.
    pub launch_timeout: Duration,
    /// `LAUNCH_TIMEOUT_RESULT` (CONTINUE): the result after the timeout; ABANDON makes Auto
    /// Scaling replace instances that never join.
    pub timeout_result: LifecycleActionResult,
    /// `WARM_POOL_WAIT_FOR_NODE` (false): a launch into a warm pool waits for the node to be
    /// Ready like any launch, for pools whose instances join the cluster while pooled. By
    /// default it completes as soon as the instance runs: a pooled instance is stopped (or
    /// kept out of the cluster) and its node would never turn Ready.
    pub warm_pool_wait_for_node: bool,
    /// `AWS_LAMBDA_FUNCTION_NAME` (set by Lambda): the reporting instance of the Events on
    /// the node (unset: the function's own name).
    pub function_name: Option<String>,
}

impl LaunchSettings {
    pub fn from_source(source: &(impl SettingsSource + ?Sized)) -> Result<Self, SettingsError> {
        Ok(Self {
            lifecycle: LifecycleSettings::from_source(source)?,
            launch_timeout: seconds(source, "LAUNCH_TIMEOUT_SECONDS", Duration::from_secs(600))?,
            timeout_result: result(source, "LAUNCH_TIMEOUT_RESULT")?,
            warm_pool_wait_for_node: source.flag("WARM_POOL_WAIT_FOR_NODE", false)?,
            function_name: source.value("AWS_LAMBDA_FUNCTION_NAME"),
        })
    }
}

/// A taint to add to a draining node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintSetting {
    pub key: String,
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl TaintSetting {
    /// Parses `key[=value]:Effect`, the notation of `kubectl taint`.
    pub fn parse(text: &str) -> Option<Self> {
        let (key_value, effect) = text.trim().rsplit_once(':')?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return None;
        }
        let (key, value) = match key_value.split_once('=') {
            Some((key, value)) => (key, Some(value.to_owned())),
            None => (key_value, None),
        };
        if key.is_empty() || key.contains(char::is_whitespace) {
            return None;
        }
        Some(Self {
            key: key.to_owned(),
            value,
            effect: effect.to_owned(),
        })
    }

    pub fn to_taint(&self) -> Taint {
        Taint {
            key: self.key.clone(),
            value: self.value.clone(),
            effect: self.effect.clone(),
            time_added: None,
        }
    }
}

/// `NODE_TAINT`: the taint that goes with the cordon, wherever one of our functions cordons
/// (the drain, the instance refresh).
pub(crate) fn node_taint(
    source: &(impl SettingsSource + ?Sized),
) -> Result<Option<TaintSetting>, SettingsError> {
    let Some(value) = source.value("NODE_TAINT") else {
        return Ok(None);
    };
    // NoExecute is refused: the taint manager would delete every pod that does not
    // tolerate it at once, bypassing PodDisruptionBudgets and the tiers.
    TaintSetting::parse(&value)
        .filter(|t| t.effect != "NoExecute")
        .map(Some)
        .ok_or(SettingsError::Invalid {
            name: "NODE_TAINT",
            value,
            expected: "key[=value]:Effect with Effect NoSchedule or PreferNoSchedule (NoExecute would make the taint manager delete the pods, bypassing PodDisruptionBudgets)",
        })
}

/// A duration in seconds, fractions allowed, never negative.
pub fn seconds(
    source: &(impl SettingsSource + ?Sized),
    name: &'static str,
    default: Duration,
) -> Result<Duration, SettingsError> {
    Ok(optional_seconds(source, name)?.unwrap_or(default))
}

fn optional_seconds(
    source: &(impl SettingsSource + ?Sized),
    name: &'static str,
) -> Result<Option<Duration>, SettingsError> {
    let Some(value) = source.value(name) else {
        return Ok(None);
    };
    value
        .parse::<f64>()
        .ok()
        .filter(|secs| *secs >= 0.0)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .map(Some)
        .ok_or(SettingsError::Invalid {
            name,
            value,
            expected: "a number of seconds (fractions allowed), not negative",
        })
}

fn result(
    source: &(impl SettingsSource + ?Sized),
    name: &'static str,
) -> Result<LifecycleActionResult, SettingsError> {
    match source.value(name) {
        None => Ok(LifecycleActionResult::Continue),
        Some(value) => LifecycleActionResult::parse(&value).ok_or(SettingsError::Invalid {
            name,
            value,
            expected: "CONTINUE or ABANDON",
        }),
    }
}

fn drain_timeout_result(
    source: &(impl SettingsSource + ?Sized),
    name: &'static str,
) -> Result<DrainTimeoutResult, SettingsError> {
    match source.value(name) {
        None => Ok(DrainTimeoutResult::Continue),
        Some(value) => DrainTimeoutResult::parse(&value).ok_or(SettingsError::Invalid {
            name,
            value,
            expected: "CONTINUE, ABANDON or RETAIN",
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn defaults_are_the_eks_figures() {
        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "ironman-2022")];
        let drain = DrainSettings::from_source(env).unwrap();
        assert_eq!(drain.drain_timeout, Duration::from_secs(900));
        assert_eq!(drain.settle, Duration::from_secs(60));
        assert_eq!(drain.eviction_concurrency, 16);
        assert!(!drain.force);
        assert_eq!(drain.timeout_result, DrainTimeoutResult::Continue);
        assert_eq!(drain.pod_grace_period, None);
        assert_eq!(drain.taint, None);
        assert_eq!(drain.stuck_pod_after, Duration::from_secs(60));
        assert_eq!(drain.volume_detach, Duration::from_secs(300));
        assert_eq!(drain.blocked_report, Duration::from_secs(180));
        assert_eq!(drain.lifecycle.hand_over_margin, Duration::from_secs(30));
        assert!(drain.lifecycle.allowed_groups.is_empty());
        let launch = LaunchSettings::from_source(env).unwrap();
        assert_eq!(launch.launch_timeout, Duration::from_secs(600));
        assert_eq!(launch.timeout_result, LifecycleActionResult::Continue);
        assert!(!launch.warm_pool_wait_for_node);
    }

    #[test]
    fn warm_pool_wait_for_node_is_a_flag() {
        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c"), ("WARM_POOL_WAIT_FOR_NODE", "true")];
        assert!(
            LaunchSettings::from_source(env)
                .unwrap()
                .warm_pool_wait_for_node
        );
        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c"), ("WARM_POOL_WAIT_FOR_NODE", "maybe")];
        let err = LaunchSettings::from_source(env).unwrap_err().to_string();
        assert!(err.contains("WARM_POOL_WAIT_FOR_NODE"), "{err}");
    }

    #[test]
    fn the_lambda_function_name_is_read_at_start_up() {
        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c")];
        assert_eq!(
            LaunchSettings::from_source(env).unwrap().function_name,
            None
        );
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "c"),
            ("AWS_LAMBDA_FUNCTION_NAME", "prod-launching-hook"),
        ];
        assert_eq!(
            LaunchSettings::from_source(env)
                .unwrap()
                .function_name
                .as_deref(),
            Some("prod-launching-hook")
        );
    }

    #[test]
    fn values_are_read_and_bad_ones_named() {
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "c"),
            ("LAUNCH_TIMEOUT_SECONDS", "0.25"),
            ("LAUNCH_TIMEOUT_RESULT", "abandon"),
            ("AUTO_SCALING_GROUP_NAMES", "a, b"),
            (
                "CONTINUATION_TOPIC_ARN",
                "arn:aws:sns:eu-west-1:111111111111:t",
            ),
            ("NODE_TAINT", "node-manager/draining=true:NoSchedule"),
            ("POD_GRACE_PERIOD_SECONDS", "5"),
            ("DRAIN_FORCE", "true"),
        ];
        let launch = LaunchSettings::from_source(env).unwrap();
        assert_eq!(launch.launch_timeout, Duration::from_millis(250));
        assert_eq!(launch.timeout_result, LifecycleActionResult::Abandon);
        assert_eq!(launch.lifecycle.allowed_groups, vec!["a", "b"]);
        assert!(launch.lifecycle.continuation_topic_arn.is_some());
        let drain = DrainSettings::from_source(env).unwrap();
        assert!(drain.force);
        assert_eq!(drain.pod_grace_period, Some(Duration::from_secs(5)));
        let taint = drain.taint.unwrap().to_taint();
        assert_eq!(taint.key, "node-manager/draining");
        assert_eq!(taint.value.as_deref(), Some("true"));
        assert_eq!(taint.effect, "NoSchedule");

        for (name, value) in [
            ("LAUNCH_TIMEOUT_SECONDS", "-1"),
            ("LAUNCH_TIMEOUT_RESULT", "maybe"),
            ("SETTLE_SECONDS", "soon"),
            ("NODE_TAINT", "key=value:Sometimes"),
            ("NODE_TAINT", "node-manager/draining=true:NoExecute"),
            ("STUCK_POD_SECONDS", "a minute"),
            ("EVICTION_CONCURRENCY", "0"),
        ] {
            let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c"), (name, value)];
            let err = if name.starts_with("LAUNCH") {
                LaunchSettings::from_source(env).unwrap_err()
            } else {
                DrainSettings::from_source(env).unwrap_err()
            };
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn drain_timeout_result_takes_retain_and_the_lifecycle_results() {
        for (value, expected) in [
            ("RETAIN", DrainTimeoutResult::Retain),
            (" retain ", DrainTimeoutResult::Retain),
            ("abandon", DrainTimeoutResult::Abandon),
            ("CONTINUE", DrainTimeoutResult::Continue),
        ] {
            let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c"), ("DRAIN_TIMEOUT_RESULT", value)];
            assert_eq!(
                DrainSettings::from_source(env).unwrap().timeout_result,
                expected,
                "{value}"
            );
        }
        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c"), ("DRAIN_TIMEOUT_RESULT", "KEEP")];
        let err = DrainSettings::from_source(env).unwrap_err().to_string();
        assert!(
            err.contains("DRAIN_TIMEOUT_RESULT") && err.contains("RETAIN"),
            "{err}"
        );
        // RETAIN is the drain's own word: the launching hook's result stays a lifecycle result.
        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c"), ("LAUNCH_TIMEOUT_RESULT", "RETAIN")];
        assert!(LaunchSettings::from_source(env).is_err());
    }

    #[test]
    fn taint_without_value() {
        let taint = TaintSetting::parse("draining:NoExecute").unwrap();
        assert_eq!(taint.value, None);
        assert_eq!(TaintSetting::parse("nocolon"), None);
        assert_eq!(TaintSetting::parse(":NoSchedule"), None);
    }
}
