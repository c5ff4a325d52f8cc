//! Node repair's memory, kept on the Node: the last action, when, and how many repairs the
//! node has had. A schedule that runs every minute must not reboot a node again while the
//! first reboot takes effect, and a node still failing after its reboot is replaced; the Node
//! is the one place every run sees, and the record goes with it.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::policy::RepairAction;

/// The Node annotation holding the [`RepairRecord`] as JSON.
pub const REPAIR_ANNOTATION: &str = "open-node-manager.io/repair";

/// The last repair of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairRecord {
    pub action: RepairAction,
    pub at: Timestamp,
    /// Repairs so far (1 for the first).
    pub attempt: u32,
    /// The condition (and reason) that was repaired, for people reading the node.
    pub condition: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl RepairRecord {
    /// The record of a node's annotations; an unreadable one counts as absent (it only ever
    /// delays nothing: the node is then treated as never repaired).
    pub fn from_annotation(value: Option<&str>) -> Option<Self> {
        serde_json::from_str(value?).ok()
    }

    pub fn to_annotation(&self) -> String {
        // Serializing plain strings, numbers and a timestamp cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trips_and_ignores_garbage() {
        let record = RepairRecord {
            action: RepairAction::Reboot,
            at: "2026-11-24T02:00:00Z".parse().unwrap(),
            attempt: 1,
            condition: "AcceleratedHardwareReady".into(),
            reason: Some("NvidiaXID31Error".into()),
        };
        let text = record.to_annotation();
        assert!(text.contains("\"action\":\"Reboot\""), "{text}");
        assert_eq!(RepairRecord::from_annotation(Some(&text)), Some(record));
        assert_eq!(RepairRecord::from_annotation(Some("{")), None);
        assert_eq!(RepairRecord::from_annotation(None), None);
    }
}
