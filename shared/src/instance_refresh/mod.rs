//! Node updates through EC2 Auto Scaling instance refresh, the way a managed node group
//! updates: when a refresh starts, the nodes it will replace are taken out of service at
//! once, so that pods evicted from one outdated node land on new nodes and are not evicted
//! again from the next; when it ends, our marks are undone on the nodes that stay.
//!
//! The drain itself stays the terminating hook's: Auto Scaling runs the group's lifecycle
//! hooks for every instance a refresh replaces, and the drain takes over the marks this
//! module recorded ([`crate::node_marks::refresh`]). This module only reads Auto Scaling and
//! writes Nodes.
//!
//! [`event`] reads the EventBridge event, [`plan`] decides which nodes to mark (the rule is
//! documented there and in `docs/instance-refresh.md`; [`matching`] is `SkipMatching`'s
//! comparison), [`handler`] proves the event with Auto Scaling and writes (`marking`).

pub mod event;
pub mod handler;
mod marking;
pub mod matching;
pub mod plan;
pub mod settings;

/// The function's name, in metrics and the Kubernetes user agent.
pub const FUNCTION_NAME: &str = "instance-refresh";
