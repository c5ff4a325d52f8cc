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
//! - [`run`]: one scheduled run, the story: list the nodes → keep ours → decide per group →
//!   act → report.
//! - [`scope`]: which nodes are ours (not a managed node group's, not Karpenter's, on an
//!   instance of one of our Auto Scaling groups) and what the run saw of them.
//! - [`policy`]: conditions, waits, actions and safety limits (EKS's defaults, overridable).
//! - [`decision`]: the pure decision.
//! - [`act`]: the repairs (record on the node, AWS action) and their Events.
//! - [`report`]: the run's answer, its error, its log lines and metrics.
//! - [`memory`]: the repair record on the Node.
//! - [`settings`]: the environment, read once at start-up.

pub mod act;
pub mod decision;
pub mod memory;
pub mod policy;
pub mod report;
pub mod run;
pub mod scope;
pub mod settings;

/// The function name used for metrics and as the Events' reporting controller.
pub const FUNCTION_NAME: &str = "node-repair";
