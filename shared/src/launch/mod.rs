//! The launching hook: complete an instance's launch lifecycle action once its node has
//! registered and is Ready.
//!
//! Auto Scaling holds a launching instance in `Pending:Wait` until the hook completes, so a
//! group does not count an instance as in service (and does not move on to the next one in
//! an instance refresh) before it can run pods. The wait is bounded by the launch timeout,
//! counted from the notification's own time so a continuation keeps the original deadline;
//! after it the configured result is given (CONTINUE keeps the instance, ABANDON makes Auto
//! Scaling replace it). The node is only read and given Events, with one exception: a node
//! coming back from a warm pool gets the scale-in's drain undone ([`warm_pool`]). A launch
//! into a warm pool completes without waiting for a node (see README "Warm pools").

//!
//! The story of one launch is [`Launcher`]'s (`launcher.rs`); waiting for the node is
//! `wait.rs`, the completions `completion.rs`, log lines, Events and metrics `signals.rs`;
//! the per-record loop is the hooks' shared skeleton ([`crate::lifecycle::handler`]).

mod completion;
mod launcher;
pub mod readiness;
pub mod report;
mod signals;
mod wait;
pub mod warm_pool;

pub use launcher::Launcher;
pub use report::{LaunchError, LaunchOutcome, LaunchReport, RecordReport};

/// The function name used for metrics and as the Events' reporting controller.
pub const FUNCTION_NAME: &str = "launching-hook";
