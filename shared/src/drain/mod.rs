//! Draining the node of a terminating instance, the way EKS managed node groups do.
//!
//! [`Drainer::handle`] takes one Lambda event; for each terminating notification of this
//! cluster's groups it:
//! 1. finds the instance's Node (none: completes at once) — [`crate::lifecycle::node`];
//! 2. takes the drain on the Node, or resumes it, or leaves it to the invocation already on
//!    it — [`lease`] over the checkpoint annotation ([`crate::node_marks::checkpoint`]);
//! 3. in the same write, excludes the node from external load balancers, cordons it,
//!    optionally taints it — [`crate::node_marks::out_of_service`];
//! 4. decides which pods leave, in which tier, which stay — [`plan`];
//! 5. evicts them within a concurrency bound, retrying refusals with [`backoff`] —
//!    [`eviction`], [`eviction_queue`] — retrying pods a PodDisruptionBudget refused when the
//!    budget allows ([`budget_watch`]) — and watches them go with one watch — [`node_pods`];
//!    while pods keep it waiting, says which and why ([`blocked`]);
//!    a node whose kubelet is silent with pods stuck terminating gets Kubernetes'
//!    out-of-service taint, so they and their volumes are freed now ([`dead_node`]);
//! 6. at the deadline, reports the pods and budgets in the way ([`stuck`], [`budgets`]) or
//!    deletes them ([`force`]), as [`deadline`] decides;
//! 7. waits until the cluster's load balancers no longer route to the instance
//!    ([`load_balancers`]; the settle period when they cannot be read) and for the node's
//!    volumes to detach ([`volumes`]), then completes the
//!    lifecycle action — [`session`], [`drainer`] (`finish.rs`);
//!    a drain that failed, as `DRAIN_TIMEOUT_RESULT` and the group's instance retention
//!    say — [`retention`];
//! 8. before the invocation runs out, hands over to a fresh one
//!    ([`crate::lifecycle::hand_over`]).
//!
//! What the user sees: Kubernetes [`events`], JSON log lines (one per step, field `step`)
//! and [`metrics`]; the Lambda response and errors: [`report`].
//!
//! Not here: parsing notifications, deciding whether a group is ours, heartbeats and
//! hand-over mechanics — [`crate::lifecycle`].

pub mod backoff;
pub mod blocked;
pub mod budget_watch;
pub mod budgets;
mod dead_node;
pub mod deadline;
pub mod drainer;
pub mod events;
pub mod eviction;
pub mod eviction_queue;
mod eviction_round;
mod finish;
pub mod force;
pub mod lease;
pub mod load_balancers;
pub mod metrics;
pub mod node_pods;
pub mod notice;
pub mod plan;
pub mod report;
pub mod retention;
pub mod session;
pub mod stuck;
pub mod volumes;

pub use crate::lifecycle::handler::Invocation;
pub use drainer::{Drainer, FUNCTION_NAME};
pub use report::{DeliveryOutcome, DrainEnd, DrainError, DrainReport, RecordReport};
pub use retention::InstanceFate;
