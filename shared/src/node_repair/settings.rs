//! Node repair's settings, read once at start-up; a bad value stops the function with an
//! error naming it (Lambda reports an init error) instead of repairing with a guess.

use crate::settings::{ClusterScope, SettingsError, SettingsSource};

use super::policy::RepairPolicy;

/// A setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepairSettingsError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("environment variable REPAIR_CONFIG is invalid: {0}")]
    Config(String),
}

/// The function's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RepairSettings {
    /// `CLUSTER_NAME` (required) and `ADDITIONAL_CLUSTER_NAMES`.
    pub cluster: ClusterScope,
    /// `AUTO_SCALING_GROUP_NAMES`: groups served even without a cluster tag (the hooks' rule).
    pub allowed_groups: Vec<String>,
    /// `REPAIR_DRY_RUN` (false): decide and report, never act, write nothing.
    pub dry_run: bool,
    /// `REPAIR_CONFIG` (EKS's defaults): limits and overrides, see [`RepairPolicy`].
    pub policy: RepairPolicy,
    /// `OUT_OF_SERVICE_TAINT` (true): a node replaced or rebooted while its kubelet is silent
    /// and EC2 shows its instance stopped or impaired gets
    /// `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` first
    /// ([`crate::node_marks::shutdown`]).
    pub out_of_service_taint: bool,
    /// `AWS_LAMBDA_FUNCTION_NAME` (set by Lambda): the reporting instance of the Events on
    /// the nodes (unset: the function's own name).
    pub function_name: Option<String>,
}

impl RepairSettings {
    pub fn from_source(
        source: &(impl SettingsSource + ?Sized),
    ) -> Result<Self, RepairSettingsError> {
        let policy = match source.value("REPAIR_CONFIG") {
            None => RepairPolicy::default(),
            Some(text) => RepairPolicy::from_json(&text).map_err(RepairSettingsError::Config)?,
        };
        Ok(Self {
            cluster: ClusterScope::from_source(source)?,
            allowed_groups: source.list("AUTO_SCALING_GROUP_NAMES"),
            dry_run: source.flag("REPAIR_DRY_RUN", false)?,
            policy,
            out_of_service_taint: source.flag("OUT_OF_SERVICE_TAINT", true)?,
            function_name: source.value("AWS_LAMBDA_FUNCTION_NAME"),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c")];
        let settings = RepairSettings::from_source(env).unwrap();
        assert!(!settings.dry_run);
        assert_eq!(settings.policy, RepairPolicy::default());

        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c"), ("REPAIR_DRY_RUN", "maybe")];
        let error = RepairSettings::from_source(env).unwrap_err().to_string();
        assert!(error.contains("REPAIR_DRY_RUN"), "{error}");
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "c"),
            ("REPAIR_CONFIG", r#"{"maxParallelNodesRepairedCount": 0}"#),
        ];
        let error = RepairSettings::from_source(env).unwrap_err().to_string();
        assert!(
            error.contains("REPAIR_CONFIG") && error.contains("at least 1"),
            "{error}"
        );
        let env: &[(&str, &str)] = &[("REPAIR_DRY_RUN", "true")];
        let error = RepairSettings::from_source(env).unwrap_err().to_string();
        assert!(error.contains("CLUSTER_NAME"), "{error}");
    }

    #[test]
    fn the_lambda_function_name_is_read_at_start_up() {
        let env: &[(&str, &str)] = &[("CLUSTER_NAME", "c")];
        assert_eq!(
            RepairSettings::from_source(env).unwrap().function_name,
            None
        );
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "c"),
            ("AWS_LAMBDA_FUNCTION_NAME", "prod-node-repair"),
        ];
        assert_eq!(
            RepairSettings::from_source(env)
                .unwrap()
                .function_name
                .as_deref(),
            Some("prod-node-repair")
        );
    }
}
