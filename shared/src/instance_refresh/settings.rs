//! The instance refresh function's settings, read once at start-up.

use crate::lifecycle::settings::{TaintSetting, node_taint};
use crate::settings::{ClusterScope, SettingsError, SettingsSource};

/// Settings of the instance refresh function. The group scope and the taint are the hooks'
/// (`docs/settings.md`): a refresh marks a node the way its drain will.
#[derive(Debug, Clone, PartialEq)]
pub struct RefreshSettings {
    pub cluster: ClusterScope,
    /// `AUTO_SCALING_GROUP_NAMES`: groups acted on even without a cluster tag.
    pub allowed_groups: Vec<String>,
    /// `NODE_TAINT`: put on the marked nodes with the cordon.
    pub taint: Option<TaintSetting>,
}

impl RefreshSettings {
    pub fn from_source(source: &(impl SettingsSource + ?Sized)) -> Result<Self, SettingsError> {
        Ok(Self {
            cluster: ClusterScope::from_source(source)?,
            allowed_groups: source.list("AUTO_SCALING_GROUP_NAMES"),
            taint: node_taint(source)?,
        })
    }
}
