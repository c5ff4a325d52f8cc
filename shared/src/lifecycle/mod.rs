//! Auto Scaling lifecycle notifications: what a message means ([`notification`]), whether it
//! is ours ([`scope`]), the hooks' settings ([`settings`]), the skeleton both hook functions
//! share ([`handler`]: context, invocation, per-record loop), which Node an instance is
//! ([`node`]), and how a long wait is carried across invocations: the time an invocation may
//! use ([`budget`]), the hook's timeouts ([`hook_timings`]; like group scope, re-read per action
//! and after [`recent::MAX_AGE`]), heartbeats that keep the action
//! alive ([`heartbeat`]), and the hand-over to a fresh invocation or the completion
//! ([`hand_over`]); and the terminating actions nobody drains, published again by the sweep
//! ([`redeliver`]).
//!
//! Shared by the terminating hook (`drain`) and the launching hook (`launch`).

#[cfg(feature = "runtime")]
pub mod budget;
#[cfg(feature = "runtime")]
pub mod hand_over;
#[cfg(feature = "runtime")]
pub mod handler;
#[cfg(feature = "runtime")]
pub mod heartbeat;
#[cfg(feature = "runtime")]
pub mod hook_timings;
#[cfg(feature = "runtime")]
pub mod node;
pub mod notification;
#[cfg(feature = "runtime")]
pub mod recent;
#[cfg(feature = "runtime")]
pub mod redeliver;
#[cfg(feature = "runtime")]
pub mod scope;
#[cfg(feature = "runtime")]
pub mod settings;
#[cfg(all(test, feature = "runtime"))]
mod test_support;
