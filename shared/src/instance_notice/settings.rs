//! The terminating hook's settings for instance notices (documented in `docs/settings.md`).

use std::time::Duration;

use crate::lifecycle::settings::seconds;
use crate::settings::{SettingsError, SettingsSource};

/// `REBALANCE_ACTION`: what a rebalance recommendation does to the instance's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebalanceAction {
    /// Take the node out of service (load balancers, cordon) and wait for the termination
    /// that Capacity Rebalancing starts once the replacement is up; its lifecycle drain then
    /// moves the pods. What a managed node group does: its pods move once, to a node that
    /// is ready for them.
    Cordon,
    /// Cordon and drain at once (pods move before any replacement exists).
    Drain,
    /// Leave the node alone.
    Nothing,
}

impl RebalanceAction {
    fn parse(raw: &str) -> Option<Self> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "cordon" => Some(Self::Cordon),
            "drain" => Some(Self::Drain),
            "none" => Some(Self::Nothing),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticeSettings {
    /// `REBALANCE_ACTION` (`cordon`).
    pub rebalance_action: RebalanceAction,
    /// `REBALANCE_UNDO_SECONDS` (1800): a rebalance cordon or drain that no interruption or
    /// termination followed within this time is undone by the sweep.
    pub rebalance_undo_after: Duration,
    /// `MAINTENANCE_DRAIN_MARGIN_SECONDS` (3600): how long before a scheduled maintenance's
    /// start its instance's node is drained.
    pub maintenance_margin: Duration,
    /// `AWS_REGION` (set by Lambda): events from another region are not acted on, as those
    /// from another account are not. `None` (a local run without it) skips the check.
    pub region: Option<String>,
}

impl NoticeSettings {
    /// The settings the reconciler decides with.
    pub fn reconcile_policy(&self) -> crate::reconcile::Policy {
        crate::reconcile::Policy {
            maintenance_margin: self.maintenance_margin,
            rebalance_undo: self.rebalance_undo_after,
        }
    }

    pub fn from_source(source: &(impl SettingsSource + ?Sized)) -> Result<Self, SettingsError> {
        let rebalance_action = match source.value("REBALANCE_ACTION") {
            None => RebalanceAction::Cordon,
            Some(raw) => RebalanceAction::parse(&raw).ok_or(SettingsError::Invalid {
                name: "REBALANCE_ACTION",
                value: raw,
                expected: "cordon, drain or none",
            })?,
        };
        Ok(Self {
            rebalance_action,
            rebalance_undo_after: seconds(
                source,
                "REBALANCE_UNDO_SECONDS",
                Duration::from_secs(1800),
            )?,
            maintenance_margin: seconds(
                source,
                "MAINTENANCE_DRAIN_MARGIN_SECONDS",
                Duration::from_secs(3600),
            )?,
            region: source.value("AWS_REGION").filter(|r| !r.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::BTreeMap;

    fn source(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_and_overrides() {
        let defaults = NoticeSettings::from_source(&source(&[])).unwrap();
        assert_eq!(defaults.rebalance_action, RebalanceAction::Cordon);
        assert_eq!(defaults.rebalance_undo_after, Duration::from_secs(1800));
        assert_eq!(defaults.maintenance_margin, Duration::from_secs(3600));
        let set = NoticeSettings::from_source(&source(&[
            ("REBALANCE_ACTION", " Drain "),
            ("REBALANCE_UNDO_SECONDS", "60"),
            ("MAINTENANCE_DRAIN_MARGIN_SECONDS", "600"),
        ]))
        .unwrap();
        assert_eq!(set.rebalance_action, RebalanceAction::Drain);
        assert_eq!(set.rebalance_undo_after, Duration::from_secs(60));
        assert_eq!(set.maintenance_margin, Duration::from_secs(600));
        assert_eq!(
            NoticeSettings::from_source(&source(&[("REBALANCE_ACTION", "none")]))
                .unwrap()
                .rebalance_action,
            RebalanceAction::Nothing
        );
        let error =
            NoticeSettings::from_source(&source(&[("REBALANCE_ACTION", "evict")])).unwrap_err();
        assert!(error.to_string().contains("REBALANCE_ACTION"), "{error}");
    }
}
