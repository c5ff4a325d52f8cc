//! # node-manager
//!
//! The library behind the node manager Lambda functions: everything an EKS node group gets
//! from EKS's hidden "node manager", for any node group.
//!
//! - [`cluster`]: find the cluster (`DescribeCluster`, or the environment for local runs) and
//!   reach its Kubernetes API with STS-presigned EKS tokens that refresh themselves.
//! - [`lifecycle`]: Auto Scaling lifecycle notifications: what a message means, whether it is
//!   ours, and how a long wait is carried across invocations.
//! - [`drain`]: labelling, cordoning and draining the node of a terminating instance.
//! - [`launch`]: completing the launch hook once the node is Ready.
//! - [`nodegroup_auth`]: the node role's `aws-auth` mapping or access entry.
//! - [`reconcile`]: keeping every mark of ours on a Node true to what AWS says now.
//! - [`node_repair`]: replacing or rebooting nodes whose health conditions stay bad.
//! - [`retry`]: the one retry policy and backoff curve.
//! - [`aws`]: small traits over the AWS calls the domain makes, their SDK adapters and
//!   in-memory implementations (those only with the `fakes` feature, for tests).
//! - [`diagnostic`]: the one way a function's error becomes its Lambda error type and message.
//!
//! Not here: Lambda wiring (the `functions/` crates) and the fake cluster (the test kit).
//!
//! ## The `runtime` feature
//!
//! On by default, and every crate of the workspace builds with it. Without it
//! (`default-features = false`) the crate is only the pure parsers of untrusted input: the
//! lifecycle notification ([`lifecycle::notification`]), the nodegroup-auth invocation
//! ([`nodegroup_auth::event`]), role ARNs and `mapRoles` ([`nodegroup_auth::role_mapping`]),
//! with the settings and AWS types they name. That is what the fuzz targets in `fuzz/` use:
//! their instrumented build then compiles serde and a YAML parser instead of the AWS SDKs,
//! Kubernetes client and Lambda runtime (two minutes instead of most of an hour).

pub mod aws;
#[cfg(feature = "runtime")]
pub mod cluster;
#[cfg(feature = "runtime")]
pub mod diagnostic;
#[cfg(feature = "runtime")]
pub mod drain;
pub mod instance_notice;
#[cfg(feature = "runtime")]
pub mod instance_refresh;
#[cfg(feature = "runtime")]
pub mod launch;
pub mod lifecycle;
/// What our functions leave on a Node (marks, checkpoint, Event pieces), shared by all three
/// that touch nodes.
#[cfg(feature = "runtime")]
pub mod node_marks;
#[cfg(feature = "runtime")]
pub mod node_repair;
pub mod nodegroup_auth;
#[cfg(feature = "runtime")]
pub mod reconcile;
#[cfg(feature = "runtime")]
pub mod retry;
pub mod settings;
#[cfg(feature = "runtime")]
pub mod telemetry;
