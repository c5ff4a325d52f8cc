//! The reconciler: keeps every mark of ours on a Node true to what AWS says now.
//!
//! The functions act on events AWS delivers at least once and on a best-effort basis, and
//! each feature leaves its own marks on the Node (the drain's record, an instance refresh's
//! record, a rebalance cordon, a maintenance plan; see docs/node-marks.md). An event lost,
//! late, repeated or retried must not leave a node cordoned or drained for nothing, nor a
//! drain abandoned. So, on the terminating hook's schedule, the reconciler lists the nodes
//! that carry any mark of ours (by one label, [`crate::node_marks::MARKED_LABEL`]), asks AWS
//! about their instances in batches ([`facts`]), decides per node what its marks should
//! become ([`desired`], pure) and converges ([`converge`]): a mark whose reason is gone is
//! removed (only what we did, only where still in place), a drain whose reason stands but
//! which nobody runs is resumed (by the notice feature, [`crate::instance_notice::sweep`]).
//! One node that fails is reported and skipped; the others converge. After a feature handled
//! an event about a node, [`after_event`] reconciles that node alone, at once.

pub mod converge;
pub mod desired;
pub mod facts;
pub mod notice_kinds;
pub mod run;

pub use crate::node_marks::marks::NodeMarks;
pub use desired::{Action, AwsFacts, Fact, Policy, desired};
pub use facts::KnownInstances;
pub use run::after_event;
