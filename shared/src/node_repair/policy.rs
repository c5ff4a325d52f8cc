//! What counts as broken, how long it may stay broken, what repairs it, and when repairs stop
//! for a group: EKS's node auto repair defaults, overridable through one JSON setting
//! (`REPAIR_CONFIG`) shaped like EKS's `NodeRepairConfig`.
//!
//! ```json
//! {
//!   "maxUnhealthyNodeThresholdPercentage": 20,
//!   "maxParallelNodesRepairedCount": 1,
//!   "nodeRepairConfigOverrides": [
//!     {"nodeMonitoringCondition": "AcceleratedHardwareReady", "nodeUnhealthyReason": "NvidiaXID31Error",
//!      "minRepairWaitTimeMins": 5, "repairAction": "Replace"}
//!   ]
//! }
//! ```
//!
//! Differences from EKS, on purpose: `nodeUnhealthyReason` may be left out (the override then
//! covers every reason of the condition, including `Ready`, which has no agent reasons), and
//! `minRepairWaitTimeMins` may be fractional (tests scale the 30 minutes down to seconds).

use std::time::Duration;

use serde::Deserialize;

/// What a repair does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
pub enum RepairAction {
    /// `SetInstanceHealth Unhealthy`: the group terminates the instance (our terminating hook
    /// drains it) and launches a replacement (our launching hook completes it once Ready).
    Replace,
    /// `RebootInstances`; a node still failing after the wait is replaced.
    Reboot,
    /// Reported, never acted on (`DiskPressure`, `MemoryPressure`: the kubelet evicts).
    NoAction,
}

impl RepairAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replace => "Replace",
            Self::Reboot => "Reboot",
            Self::NoAction => "NoAction",
        }
    }
}

/// One rule: a condition (and optionally one reason) that is unhealthy, for how long it may
/// stay so, and the action.
#[derive(Debug, Clone, PartialEq)]
pub struct ConditionRule {
    pub condition: String,
    /// `None`: any reason.
    pub reason: Option<String>,
    pub wait: Duration,
    pub action: RepairAction,
}

/// A limit of the safety rules, with EKS's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Count(u32),
    Percentage(u32),
}

impl Limit {
    /// The number of nodes `of` this limit allows (a percentage rounds down, at least 1 for
    /// the parallel limit is the caller's business).
    pub fn of(self, total: usize) -> usize {
        match self {
            Self::Count(n) => n as usize,
            Self::Percentage(p) => total * p as usize / 100,
        }
    }
}

/// Group sizes up to this are exempt from a percentage unhealthy threshold (EKS: repair
/// stops for groups with *more than five* nodes when more than 20% are unhealthy; one broken
/// node of three is 33% and must still be repaired).
pub(crate) const PERCENTAGE_THRESHOLD_MIN_GROUP: usize = 5;

/// The whole policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RepairPolicy {
    /// Repairs stop for a group when more of its nodes than this are unhealthy.
    pub max_unhealthy: Limit,
    /// At most this many repairs of a group at once (in flight ones included).
    pub max_parallel: Limit,
    /// Overrides first (reason-specific before condition-wide), then the defaults.
    pub rules: Vec<ConditionRule>,
}

/// EKS's default waits.
const READY_WAIT: Duration = Duration::from_secs(30 * 60);
const ACCELERATED_WAIT: Duration = Duration::from_secs(10 * 60);

impl Default for RepairPolicy {
    fn default() -> Self {
        let rule = |condition: &str, wait, action| ConditionRule {
            condition: condition.to_owned(),
            reason: None,
            wait,
            action,
        };
        Self {
            max_unhealthy: Limit::Percentage(20),
            // EKS documents no default; one repair per group at a time is the cautious pace
            // (the next starts once the replacement of the first is under way).
            max_parallel: Limit::Count(1),
            rules: vec![
                rule("Ready", READY_WAIT, RepairAction::Replace),
                rule("KernelReady", READY_WAIT, RepairAction::Replace),
                rule("NetworkingReady", READY_WAIT, RepairAction::Replace),
                rule("StorageReady", READY_WAIT, RepairAction::Replace),
                rule("ContainerRuntimeReady", READY_WAIT, RepairAction::Replace),
                rule(
                    "AcceleratedHardwareReady",
                    ACCELERATED_WAIT,
                    RepairAction::Reboot,
                ),
                rule("DiskPressure", Duration::ZERO, RepairAction::NoAction),
                rule("MemoryPressure", Duration::ZERO, RepairAction::NoAction),
            ],
        }
    }
}

impl RepairPolicy {
    /// The rule for a condition in a given reason: a reason-specific override, else a
    /// condition-wide override, else the default; `None` for conditions we do not watch.
    pub fn rule_for(&self, condition: &str, reason: Option<&str>) -> Option<&ConditionRule> {
        let of_condition = || self.rules.iter().filter(move |r| r.condition == condition);
        of_condition()
            .find(|r| r.reason.is_some() && r.reason.as_deref() == reason)
            .or_else(|| of_condition().find(|r| r.reason.is_none()))
    }

    /// Parses `REPAIR_CONFIG`; every problem is named.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut policy = Self::default();
        policy.max_unhealthy = one_limit(
            raw.max_unhealthy_node_threshold_count,
            raw.max_unhealthy_node_threshold_percentage,
            "maxUnhealthyNodeThreshold",
        )?
        .unwrap_or(policy.max_unhealthy);
        policy.max_parallel = one_limit(
            raw.max_parallel_nodes_repaired_count,
            raw.max_parallel_nodes_repaired_percentage,
            "maxParallelNodesRepaired",
        )?
        .unwrap_or(policy.max_parallel);
        let mut overrides = Vec::new();
        for (index, o) in raw.node_repair_config_overrides.into_iter().enumerate() {
            let condition = o.node_monitoring_condition.trim().to_owned();
            if condition.is_empty() {
                return Err(format!(
                    "nodeRepairConfigOverrides[{index}].nodeMonitoringCondition is empty"
                ));
            }
            let wait = match o.min_repair_wait_time_mins {
                Some(m) if m.is_finite() && m >= 0.0 => Duration::try_from_secs_f64(m * 60.0)
                    .map_err(|_| {
                        format!(
                            "nodeRepairConfigOverrides[{index}].minRepairWaitTimeMins is too large"
                        )
                    })?,
                Some(m) => {
                    return Err(format!(
                        "nodeRepairConfigOverrides[{index}].minRepairWaitTimeMins={m} must be a number of minutes, not negative"
                    ));
                }
                None => {
                    return Err(format!(
                        "nodeRepairConfigOverrides[{index}].minRepairWaitTimeMins is required"
                    ));
                }
            };
            let reason = o
                .node_unhealthy_reason
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty());
            if overrides
                .iter()
                .any(|r: &ConditionRule| r.condition == condition && r.reason == reason)
            {
                return Err(format!(
                    "nodeRepairConfigOverrides[{index}] repeats condition {condition} reason {}",
                    reason.as_deref().unwrap_or("(any)")
                ));
            }
            overrides.push(ConditionRule {
                condition,
                reason,
                wait,
                action: o.repair_action,
            });
        }
        overrides.extend(policy.rules);
        policy.rules = overrides;
        Ok(policy)
    }
}

fn one_limit(
    count: Option<u32>,
    percentage: Option<u32>,
    name: &str,
) -> Result<Option<Limit>, String> {
    match (count, percentage) {
        (Some(_), Some(_)) => Err(format!(
            "{name}Count and {name}Percentage cannot both be set"
        )),
        (Some(0), None) => Err(format!("{name}Count must be at least 1")),
        (Some(n), None) => Ok(Some(Limit::Count(n))),
        (None, Some(p)) if !(1..=100).contains(&p) => {
            Err(format!("{name}Percentage must be between 1 and 100"))
        }
        (None, Some(p)) => Ok(Some(Limit::Percentage(p))),
        (None, None) => Ok(None),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    max_unhealthy_node_threshold_count: Option<u32>,
    max_unhealthy_node_threshold_percentage: Option<u32>,
    max_parallel_nodes_repaired_count: Option<u32>,
    max_parallel_nodes_repaired_percentage: Option<u32>,
    #[serde(default)]
    node_repair_config_overrides: Vec<RawOverride>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawOverride {
    node_monitoring_condition: String,
    node_unhealthy_reason: Option<String>,
    min_repair_wait_time_mins: Option<f64>,
    repair_action: RepairAction,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_are_eks_defaults() {
        let policy = RepairPolicy::default();
        let ready = policy.rule_for("Ready", Some("KubeletNotReady")).unwrap();
        assert_eq!(ready.wait, Duration::from_secs(1800));
        assert_eq!(ready.action, RepairAction::Replace);
        let gpu = policy
            .rule_for("AcceleratedHardwareReady", Some("NvidiaXID31Error"))
            .unwrap();
        assert_eq!(gpu.wait, Duration::from_secs(600));
        assert_eq!(
            policy.rule_for("DiskPressure", None).unwrap().action,
            RepairAction::NoAction
        );
        assert!(policy.rule_for("PIDPressure", None).is_none());
        assert_eq!(policy.max_unhealthy, Limit::Percentage(20));
    }

    #[test]
    fn overrides_by_reason_win_over_condition_wide_ones_and_defaults() {
        let policy = RepairPolicy::from_json(
            r#"{"maxParallelNodesRepairedPercentage": 50,
                "nodeRepairConfigOverrides": [
                  {"nodeMonitoringCondition": "NetworkingReady", "nodeUnhealthyReason": "IPAMDNotRunning",
                   "minRepairWaitTimeMins": 5, "repairAction": "Reboot"},
                  {"nodeMonitoringCondition": "NetworkingReady", "minRepairWaitTimeMins": 0.5, "repairAction": "NoAction"}
                ]}"#,
        )
        .unwrap();
        let ipamd = policy
            .rule_for("NetworkingReady", Some("IPAMDNotRunning"))
            .unwrap();
        assert_eq!(
            (ipamd.wait, ipamd.action),
            (Duration::from_secs(300), RepairAction::Reboot)
        );
        let other = policy
            .rule_for("NetworkingReady", Some("InterfaceNotUp"))
            .unwrap();
        assert_eq!(
            (other.wait, other.action),
            (Duration::from_secs(30), RepairAction::NoAction)
        );
        // Untouched conditions keep the defaults.
        assert_eq!(
            policy.rule_for("Ready", None).unwrap().wait,
            Duration::from_secs(1800)
        );
        assert_eq!(policy.max_parallel, Limit::Percentage(50));
        assert_eq!(policy.max_unhealthy, Limit::Percentage(20));
    }

    #[test]
    fn malformed_settings_are_named() {
        for (text, expected) in [
            ("not json", "expected"),
            (
                r#"{"maxUnhealthyNodeThresholdCount": 3, "maxUnhealthyNodeThresholdPercentage": 20}"#,
                "cannot both be set",
            ),
            (
                r#"{"maxParallelNodesRepairedPercentage": 0}"#,
                "between 1 and 100",
            ),
            (r#"{"maxParallelNodesRepairedCount": 0}"#, "at least 1"),
            (r#"{"maxUnhealthyNodeThresholdCount": -1}"#, "invalid value"),
            (r#"{"maxUnhealthy": 3}"#, "unknown field"),
            (
                r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 1, "repairAction": "Explode"}]}"#,
                "unknown variant",
            ),
            (
                r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "repairAction": "Replace"}]}"#,
                "minRepairWaitTimeMins is required",
            ),
            (
                r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": -2, "repairAction": "Replace"}]}"#,
                "not negative",
            ),
            (
                r#"{"nodeRepairConfigOverrides": [{"nodeMonitoringCondition": " ", "minRepairWaitTimeMins": 1, "repairAction": "Replace"}]}"#,
                "is empty",
            ),
            (
                r#"{"nodeRepairConfigOverrides": [
                    {"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 1, "repairAction": "Replace"},
                    {"nodeMonitoringCondition": "Ready", "minRepairWaitTimeMins": 2, "repairAction": "Reboot"}]}"#,
                "repeats",
            ),
        ] {
            let error = RepairPolicy::from_json(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
