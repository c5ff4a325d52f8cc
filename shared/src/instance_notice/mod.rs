//! What AWS announces about an instance outside any lifecycle hook: a Spot interruption
//! warning, a rebalance recommendation, an instance stopping, scheduled maintenance (AWS
//! Health). The terminating hook receives these EventBridge events next to its lifecycle
//! notifications, because acting on them is its drain, on the same checkpoint: one drain per
//! node whatever mix of notices and notifications arrives.
//!
//! [`event`] parses and checks; [`handler`] decides ownership, confirms with EC2 and acts
//! (a drain planned for later is kept by [`crate::node_marks::maintenance`]); [`sweep`] runs the reconciler
//! ([`crate::reconcile`]) and the drains it finds due on the stack's schedule. The drain itself is [`crate::drain::notice`].

pub mod event;
#[cfg(feature = "runtime")]
pub mod handler;
#[cfg(feature = "runtime")]
pub mod settings;
#[cfg(feature = "runtime")]
pub mod sweep;

#[cfg(feature = "runtime")]
pub use handler::{NoticeError, NoticeHandler, NoticeReport};

#[cfg(feature = "runtime")]
pub use route::{TerminatingHookError, TerminatingHookResponse, handle_terminating_hook_event};

#[cfg(feature = "runtime")]
mod route {
    use serde_json::Value;

    use super::{NoticeError, NoticeHandler, NoticeReport};
    use crate::aws::{GroupActivity, InstanceNoticesBatch};
    use crate::diagnostic::{FunctionError, diagnostic};
    use crate::drain::{DrainError, DrainReport, Drainer, Invocation};
    use crate::lifecycle::handler::{HookClients, HookHandler};

    /// The terminating hook's response: a lifecycle notification's or an instance event's.
    #[derive(Debug, serde::Serialize)]
    #[serde(untagged)]
    pub enum TerminatingHookResponse {
        Lifecycle(DrainReport),
        Notice(NoticeReport),
    }

    #[derive(Debug, thiserror::Error)]
    pub enum TerminatingHookError {
        #[error(transparent)]
        Lifecycle(#[from] DrainError),
        #[error(transparent)]
        Notice(#[from] NoticeError),
    }

    impl FunctionError for TerminatingHookError {
        fn kind(&self) -> &'static str {
            match self {
                Self::Lifecycle(error) => error.kind(),
                Self::Notice(error) => error.kind(),
            }
        }
    }

    impl From<TerminatingHookError> for lambda_runtime::Diagnostic {
        fn from(error: TerminatingHookError) -> Self {
            diagnostic(&error)
        }
    }

    /// Sends an instance event (EC2, AWS Health, the schedule) to the notice handler and
    /// anything else to the lifecycle drain.
    pub async fn handle_terminating_hook_event<C: HookClients>(
        drainer: &Drainer<C>,
        payload: Value,
        invocation: &Invocation,
    ) -> Result<TerminatingHookResponse, TerminatingHookError>
    where
        C::Instances: InstanceNoticesBatch,
        C::AutoScaling: GroupActivity,
    {
        if super::event::is_notice_event(&payload) {
            let handler = NoticeHandler { drainer };
            Ok(TerminatingHookResponse::Notice(
                Box::pin(handler.handle(&payload, invocation)).await?,
            ))
        } else {
            Ok(TerminatingHookResponse::Lifecycle(
                Box::pin(drainer.handle_invocation(payload, invocation)).await?,
            ))
        }
    }
}
