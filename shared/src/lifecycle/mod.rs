//! Auto Scaling lifecycle notifications: what a message means ([`notification`]), whether it
//! is ours ([`scope`]), the hooks' settings ([`settings`]), how a long wait is carried across
//! invocations ([`continuation`]) and which Node an instance is ([`node`]).
//!
//! Shared by the terminating hook (`drain`) and the launching hook (`launch`).

pub mod connection;
pub mod continuation;
pub mod node;
pub mod notification;
pub mod scope;
pub mod settings;
