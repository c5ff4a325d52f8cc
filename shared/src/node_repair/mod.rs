//! Node auto-repair for any node group: what EKS's node manager does for managed node groups
//! (replace or reboot nodes whose health conditions stay bad), for the Auto Scaling groups
//! these functions serve.
//!
//! Run on a schedule. Each run lists the Nodes, keeps those of this cluster's Auto Scaling
//! groups (the hooks' scope rules; managed node groups' and Karpenter's nodes have their own
//! repair and are left alone), decides per group with [`decision::decide_group`] (pure), and
//! acts: `Replace` marks the instance unhealthy so its group terminates it (our terminating
//! hook drains it) and launches a replacement (our launching hook completes it); `Reboot`
//! reboots it. The node remembers its last repair in an annotation ([`memory`]).
//!
//! - [`policy`]: conditions, waits, actions and safety limits (EKS's defaults, overridable).
//! - [`decision`]: the pure decision.
//! - [`memory`]: the repair record on the Node.
//! - [`settings`]: the environment.
//! - [`run`]: one scheduled run: read, decide, act, report.

pub mod decision;
pub mod memory;
pub mod policy;
pub mod run;
pub mod settings;

/// The function name used for metrics and as the Events' reporting controller.
pub const FUNCTION_NAME: &str = "node-repair";
