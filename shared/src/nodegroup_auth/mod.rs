//! The node role's `aws-auth` mapping or access entry.

pub mod access_entry;
pub mod aws_auth;
pub mod event;
pub mod fake;
pub mod handler;
pub mod kube_store;
pub mod role_arn;
pub mod role_mapping;
pub mod settings;
