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
//! - [`aws`]: small traits over the AWS calls the domain makes, their SDK adapters and
//!   in-memory fakes.
//!
//! Not here: Lambda wiring (the `functions/` crates) and the fake cluster (the test kit).

pub mod aws;
pub mod cluster;
pub mod drain;
pub mod launch;
pub mod lifecycle;
pub mod nodegroup_auth;
pub mod settings;
pub mod telemetry;
