//! # node-manager-testkit
//!
//! A faithful fake EKS for tests and the local sandbox: a Kubernetes API server ([`kube`])
//! served over real HTTP(S) with EKS-style authentication and RBAC, fake AWS endpoints
//! ([`aws`]) that the real SDK clients reach through `AWS_ENDPOINT_URL`, and a local Lambda
//! Runtime API ([`lambda_api`]) that runs the built function binaries as Lambda does.
//! [`e2e`] puts them together into one deployment of the three functions for the end-to-end
//! tests. [`control_plane`] runs a real Kubernetes control plane (built by
//! `scripts/control-plane.sh build`) for the scenarios that must hold against upstream Kubernetes.
//!
//! Not for production: nothing here is compiled into a Lambda function.

pub mod account;
pub mod aws;
pub mod bench;
pub mod binaries;
pub mod control_plane;
pub mod e2e;
pub mod fixtures;
pub mod identity;
pub mod kube;
pub mod lambda_api;
pub mod lambda_rie;
pub mod sandbox;
pub mod service_controller;
pub mod soak;
pub mod token_verifier;
