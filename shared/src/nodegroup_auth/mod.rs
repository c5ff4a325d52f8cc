//! The node role's `aws-auth` mapping or access entry: what EKS does for managed node groups
//! when they are created or deleted, for any node group, safely.
//!
//! - [`event`]: what an invocation asks for (CloudTrail via EventBridge, or a direct request),
//!   checked against this function's account, region and cluster.
//! - [`role_arn`]: the node role ARN, validated and stripped of its path for `aws-auth`.
//! - [`role_mapping`]: `mapRoles` parsed as the authenticator parses it, the one change a
//!   node role needs, and the rendering that keeps everything else (pure, no I/O).
//! - [`aws_auth`]: the read-merge-write loop with optimistic concurrency over the one store
//!   trait [`aws_auth::AwsAuthStore`]; [`kube_store`] is its Kubernetes implementation (over
//!   the cluster connection every function uses), [`in_memory`] the in-memory one.
//! - [`access_entry`]: the `EC2_LINUX` / `EC2_WINDOWS` access entry.
//! - [`handler`]: the function's logic ([`handler::NodegroupAuth`]), [`settings`] its settings.

#[cfg(feature = "runtime")]
pub mod access_entry;
#[cfg(feature = "runtime")]
pub mod aws_auth;
pub mod event;
#[cfg(feature = "runtime")]
pub mod handler;
#[cfg(any(feature = "fakes", all(test, feature = "runtime")))]
pub mod in_memory;
#[cfg(feature = "runtime")]
pub mod kube_store;
pub mod role_arn;
pub mod role_mapping;
#[cfg(feature = "runtime")]
pub mod settings;
