//! Node updates through EC2 Auto Scaling instance refresh, the way a managed node group
//! updates: while a refresh runs, the nodes it will replace are taken out of service as far
//! as the capacity it does not replace can take their pods ([`room`]), so that pods evicted
//! from one outdated node land on new nodes and are not evicted again from the next, and
//! always have a place; when it ends, our marks are undone on the nodes that stay.
//!
//! The drain itself stays the terminating hook's: Auto Scaling runs the group's lifecycle
//! hooks for every instance a refresh replaces, and the drain takes over the marks this
//! module recorded ([`crate::node_marks::refresh`]). This module only reads Auto Scaling and
//! writes Nodes.
//!
//! [`event`] reads the EventBridge event, [`plan`] decides which instances the refresh
//! replaces ([`matching`] is `SkipMatching`'s comparison), [`room`] how many of their nodes
//! to mark now (from [`capacity`]: what Nodes and Pods say about room; the rule is
//! documented there and in `docs/instance-refresh.md`), [`handler`] proves the event with
//! Auto Scaling and writes (`marking`).

pub mod capacity;
pub mod event;
pub mod handler;
mod marking;
pub mod matching;
pub mod plan;
pub mod room;
pub mod settings;

/// The function's name, in metrics and the Kubernetes user agent.
pub const FUNCTION_NAME: &str = "instance-refresh";
