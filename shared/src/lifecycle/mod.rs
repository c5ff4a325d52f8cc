//! Auto Scaling lifecycle notifications: what a message means ([`notification`]), whether it
//! is ours ([`scope`]), the hooks' settings ([`settings`]), the skeleton both hook functions
//! share ([`handler`]: context, invocation, per-record loop), how a long wait is carried across
//! invocations ([`continuation`]) and which Node an instance is ([`node`]).
//!
//! Shared by the terminating hook (`drain`) and the launching hook (`launch`).

#[cfg(feature = "runtime")]
pub mod connection;
#[cfg(feature = "runtime")]
pub mod continuation;
#[cfg(feature = "runtime")]
pub mod handler;
#[cfg(feature = "runtime")]
pub mod node;
pub mod notification;
#[cfg(feature = "runtime")]
pub mod scope;
#[cfg(feature = "runtime")]
pub mod settings;
