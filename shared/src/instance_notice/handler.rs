//! One instance event in, each affected instance decided: whose it is, whether EC2 confirms
//! what the event says, and what to do about it (drain now, cordon, plan a drain, nothing).
//!
//! Ownership comes from the instance: its `aws:autoscaling:groupName` tag (an `aws:` tag only
//! Auto Scaling sets) names the group, and the group must be this cluster's by the hooks'
//! rule ([`crate::lifecycle::scope`]). An instance in no group (Karpenter's, a standalone
//! one) is not ours: Karpenter handles its own interruptions.
//!
//! Nothing is written on the event's word alone: a Spot warning needs the instance's Spot
//! request marked for interruption, a rebalance recommendation a Spot instance, a stopping
//! notification an instance that is no longer running, a scheduled change a pending event
//! in EC2's own schedule (whose start time is used, not the event's).

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

use super::event::{Announcement, InstanceEvent, NoticeEvent, NoticeEventError, SPOT_NOTICE};
use super::maintenance::{
    MaintenanceRecord, PlannedMaintenance, clear_maintenance, plan_maintenance,
};
use super::settings::RebalanceAction;
use super::sweep::sweep;
use crate::aws::{AwsError, GroupActivity, InstanceNotices, InstanceNoticesBatch};
use crate::cluster::ClusterAccessError;
use crate::cluster::connection::KubeConnection;
use crate::diagnostic::{FunctionError, diagnostic};
use crate::drain::notice::{NoticeDrainOutcome, NoticeDrainRequest};
use crate::drain::{DrainError, Drainer};
use crate::lifecycle::handler::{HookClients, Invocation};
use crate::lifecycle::node::{NodeLookupError, find_node};
use crate::lifecycle::scope::ScopeDecision;
use crate::node_marks::checkpoint::{InstanceNotice, NoticeKind, notice_action};

/// How long EC2 calls that prove a notice may take in all: the drain they gate has two
/// minutes.
const PROOF_BOUND: Duration = Duration::from_secs(10);

/// What was done for one instance of an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceOutcome {
    pub instance_id: String,
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The Lambda response for an instance event or a sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NoticeReport {
    pub event: String,
    pub instances: Vec<InstanceOutcome>,
}

/// Why an instance event could not be handled (nothing was written for the failing part).
#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    #[error("malformed instance event: {0}")]
    Malformed(#[from] NoticeEventError),
    #[error("cannot reach the cluster's Kubernetes API: {0}")]
    Cluster(#[from] ClusterAccessError),
    #[error(
        "cannot check instance {instance_id} with EC2 or Auto Scaling (nothing was written): {source}"
    )]
    Aws {
        instance_id: String,
        #[source]
        source: AwsError,
    },
    #[error(
        "EC2 does not confirm the event for instance {instance_id} (nothing was written): {reason}"
    )]
    Unconfirmed { instance_id: String, reason: String },
    #[error(
        "EC2 did not answer within {PROOF_BOUND:?} about instance {instance_id} (nothing was written)"
    )]
    NoAnswer { instance_id: String },
    #[error("cannot find the node of instance {instance_id}: {source}")]
    NodeLookup {
        instance_id: String,
        #[source]
        source: NodeLookupError,
    },
    #[error(transparent)]
    Drain(#[from] DrainError),
    #[error("{} of the event's instances failed: {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Instances(Vec<NoticeError>),
}

impl FunctionError for NoticeError {
    fn kind(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "MalformedInstanceEvent",
            Self::Cluster(_) => "ClusterAccessFailed",
            Self::Aws { .. } => "InstanceCheckFailed",
            Self::Unconfirmed { .. } => "InstanceEventUnconfirmed",
            Self::NoAnswer { .. } => "InstanceCheckTimedOut",
            Self::NodeLookup { .. } => "NodeLookupFailed",
            Self::Drain(error) => error.kind(),
            Self::Instances(_) => "InstancesFailed",
        }
    }
}

impl From<NoticeError> for lambda_runtime::Diagnostic {
    fn from(error: NoticeError) -> Self {
        diagnostic(&error)
    }
}

/// What an instance's event comes to once confirmed.
enum Plan {
    /// Drain (or cordon) now for this notice, until `deadline`.
    Act {
        notice: InstanceNotice,
        deadline: Timestamp,
    },
    /// Scheduled maintenance far enough ahead: drain from `drain_from`.
    Later(PlannedMaintenance),
    /// Nothing to do; why.
    Nothing(&'static str, String),
}

/// Handles instance events and the sweep for the terminating hook.
pub struct NoticeHandler<'a, C: HookClients> {
    pub drainer: &'a Drainer<C>,
}

impl<C: HookClients> NoticeHandler<'_, C>
where
    C::Instances: InstanceNoticesBatch,
    C::AutoScaling: GroupActivity,
{
    /// Handles one event that [`super::event::is_notice_event`] accepted.
    pub async fn handle(
        &self,
        event: &Value,
        invocation: &Invocation,
    ) -> Result<NoticeReport, NoticeError> {
        let parsed = super::event::parse(event).inspect_err(|error| {
            tracing::error!(%error, "malformed instance event: nothing done");
        })?;
        let event = match parsed {
            NoticeEvent::Sweep => return sweep(self.drainer, invocation).await,
            NoticeEvent::Ignored(reason) => {
                tracing::info!(step = "ignored", reason, "instance event not acted on");
                return Ok(NoticeReport {
                    event: "Ignored".to_owned(),
                    instances: Vec::new(),
                });
            }
            NoticeEvent::Instance(event) => event,
        };
        let mut instances = Vec::new();
        let mut failures = Vec::new();
        for instance_id in &event.instance_ids {
            let span = tracing::info_span!("notice", instance_id = %instance_id, event_id = %event.id, node = tracing::field::Empty);
            let handled = tracing::Instrument::instrument(
                Box::pin(self.instance(&event, instance_id, invocation)),
                span,
            )
            .await;
            match handled {
                Ok(outcome) => instances.push(outcome),
                Err(error) => {
                    tracing::error!(instance_id, %error, "instance event failed");
                    failures.push(error);
                }
            }
        }
        if !failures.is_empty() {
            return Err(match failures.len() {
                1 => failures.remove(0),
                _ => NoticeError::Instances(failures),
            });
        }
        Ok(NoticeReport {
            event: announcement_name(&event.announcement).to_owned(),
            instances,
        })
    }

    /// One affected instance: ours, confirmed, then acted on.
    async fn instance(
        &self,
        event: &InstanceEvent,
        instance_id: &str,
        invocation: &Invocation,
    ) -> Result<InstanceOutcome, NoticeError> {
        let outcome = |outcome: &str, detail: Option<String>| InstanceOutcome {
            instance_id: instance_id.to_owned(),
            outcome: outcome.to_owned(),
            detail,
        };
        let checked = tokio::time::timeout(PROOF_BOUND, self.check(event, instance_id, invocation))
            .await
            .map_err(|_| NoticeError::NoAnswer {
                instance_id: instance_id.to_owned(),
            })??;
        let (group, plan) = match checked {
            Checked::Foreign(reason) => {
                tracing::info!(step = "foreign_instance", %reason, "not an instance of this cluster's node groups: left alone");
                return Ok(outcome("Foreign", Some(reason)));
            }
            Checked::Ours { group, plan } => (group, plan),
        };
        let (notice, deadline) = match plan {
            Plan::Nothing(name, why) => {
                tracing::info!(
                    step = "no_action",
                    why,
                    "nothing to do for this instance event"
                );
                return Ok(outcome(name, Some(why)));
            }
            Plan::Act { notice, deadline } => (notice, deadline),
            Plan::Later(planned) => {
                let Some((client, node)) = self.client_and_node(instance_id).await? else {
                    return Ok(outcome("NoNode", None));
                };
                let name = node.metadata.name.clone().unwrap_or_default();
                let written = plan_maintenance(&client, node, &group, instance_id, &planned)
                    .await
                    .map_err(|source| kube_error(&name, source))?;
                tracing::info!(step = "maintenance_planned", drain_from = %planned.drain_from, starts_at = %planned.starts_at, written, "scheduled maintenance recorded: the sweep drains the node from the given time");
                return Ok(outcome(
                    "MaintenancePlanned",
                    Some(format!("drain from {}", planned.drain_from)),
                ));
            }
        };
        let Some((client, node)) = self.client_and_node(instance_id).await? else {
            return Ok(outcome("NoNode", None));
        };
        let drained = self
            .drain(
                &client,
                node,
                &group,
                instance_id,
                &notice,
                deadline,
                invocation,
            )
            .await?;
        let detail = match &drained {
            NoticeDrainOutcome::PodsLeft { pods } => Some(pods.join(", ")),
            NoticeDrainOutcome::Drained { pods_evicted } => {
                Some(format!("{pods_evicted} pods evicted"))
            }
            _ => None,
        };
        Ok(outcome(drained.name(), detail))
    }

    /// Drains (or cordons) `node` for `notice`, with the Events written before returning.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn drain(
        &self,
        client: &kube::Client,
        node: k8s_openapi::api::core::v1::Node,
        group: &str,
        instance_id: &str,
        notice: &InstanceNotice,
        deadline: Timestamp,
        invocation: &Invocation,
    ) -> Result<NoticeDrainOutcome, NoticeError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        // A maintenance plan on the node is done with once the drain for it has run (a plan
        // left by a failed drain is drained again by the sweep).
        let plan = MaintenanceRecord::of(&node)
            .filter(|_| notice.kind == NoticeKind::ScheduledMaintenance);
        let events = self.drainer.events_queue(client, invocation);
        let action = notice_action(group, instance_id);
        let drained = self
            .drainer
            .drain_for_notice(NoticeDrainRequest {
                client,
                node,
                action: &action,
                notice,
                deadline,
                invocation,
                events: &events,
            })
            .await;
        events.flush().await;
        let drained = drained?;
        // A drain that ran out of time is resumed from its record by the next sweep: its plan
        // stays until then.
        let plan = plan.filter(|_| drained != NoticeDrainOutcome::OutOfTime);
        if let Some(record) = plan {
            let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
            let fresh = nodes
                .get_opt(&name)
                .await
                .map_err(|source| kube_error(&name, source))?;
            if let Some(fresh) = fresh {
                clear_maintenance(client, fresh, &record)
                    .await
                    .map_err(|source| kube_error(&name, source))?;
            }
        }
        Ok(drained)
    }

    /// The cluster's client and the instance's Node; `None` when the instance has no node.
    async fn client_and_node(
        &self,
        instance_id: &str,
    ) -> Result<Option<(kube::Client, k8s_openapi::api::core::v1::Node)>, NoticeError> {
        let client = self.drainer.context.kube.client().await?;
        let node = find_node(&client, &self.drainer.context.instances, instance_id)
            .await
            .map_err(|source| NoticeError::NodeLookup {
                instance_id: instance_id.to_owned(),
                source,
            })?;
        let Some(node) = node else {
            tracing::info!(step = "no_node", "the instance has no node: nothing to do");
            return Ok(None);
        };
        tracing::Span::current().record("node", node.metadata.name.as_deref().unwrap_or_default());
        Ok(Some((client, node)))
    }

    /// Whose the instance is, and what EC2 confirms of the event.
    async fn check(
        &self,
        event: &InstanceEvent,
        instance_id: &str,
        invocation: &Invocation,
    ) -> Result<Checked, NoticeError> {
        let context = &self.drainer.context;
        let aws = |source| NoticeError::Aws {
            instance_id: instance_id.to_owned(),
            source,
        };
        let unconfirmed = |reason: String| NoticeError::Unconfirmed {
            instance_id: instance_id.to_owned(),
            reason,
        };
        if let Some(own) = invocation.function_account.as_deref()
            && own != event.account
        {
            return Ok(Checked::Foreign(format!(
                "the event is from account {}, not this function's",
                event.account
            )));
        }
        let Some(facts) = context
            .instances
            .instance_facts(instance_id)
            .await
            .map_err(aws)?
        else {
            return Ok(Checked::Foreign(
                "EC2 does not know the instance".to_owned(),
            ));
        };
        let Some(group) = facts.auto_scaling_group.clone() else {
            return Ok(Checked::Foreign(
                "the instance is in no Auto Scaling group".to_owned(),
            ));
        };
        let scope = context
            .scope
            .decide_for_account(
                &context.autoscaling,
                invocation.function_account.as_deref(),
                &event.account,
                &group,
                &event.id,
            )
            .await
            .map_err(aws)?;
        if let ScopeDecision::Foreign(reason) = scope {
            return Ok(Checked::Foreign(format!("group {group}: {reason}")));
        }
        let now = Timestamp::now();
        let settings = &self.drainer.context.settings;
        let plan = match &event.announcement {
            Announcement::SpotInterruption { action } => {
                let status = match &facts.spot_request_id {
                    None => return Err(unconfirmed("the instance is not a Spot instance".into())),
                    Some(request) => context
                        .instances
                        .spot_request_status(request)
                        .await
                        .map_err(aws)?,
                };
                if !status
                    .as_deref()
                    .is_some_and(|s| s.starts_with("marked-for-"))
                {
                    return Err(unconfirmed(format!(
                        "its Spot request's status is {}, not marked for interruption",
                        status.as_deref().unwrap_or("unknown")
                    )));
                }
                let ends_at = later(event.time, SPOT_NOTICE);
                if now >= ends_at {
                    Plan::Nothing(
                        "Past",
                        format!("the interruption ({action}) was due at {ends_at}"),
                    )
                } else {
                    Plan::Act {
                        notice: notice(NoticeKind::SpotInterruption, now, Some(ends_at)),
                        deadline: ends_at,
                    }
                }
            }
            Announcement::RebalanceRecommendation => {
                if facts.spot_request_id.is_none() {
                    return Err(unconfirmed("the instance is not a Spot instance".into()));
                }
                match settings.notices.rebalance_action {
                    RebalanceAction::Nothing => {
                        Plan::Nothing("Ignored", "REBALANCE_ACTION=none".to_owned())
                    }
                    RebalanceAction::Cordon => Plan::Act {
                        notice: InstanceNotice {
                            cordon_only: true,
                            ..notice(NoticeKind::RebalanceRecommendation, now, None)
                        },
                        deadline: later(now, settings.notices.rebalance_undo_after),
                    },
                    RebalanceAction::Drain => Plan::Act {
                        notice: notice(NoticeKind::RebalanceRecommendation, now, None),
                        deadline: later(now, settings.drain_timeout),
                    },
                }
            }
            Announcement::Stopping { state } => {
                let current = facts.state.as_deref().unwrap_or("unknown");
                if current == "running" || current == "pending" {
                    return Err(unconfirmed(format!(
                        "the event says {state}, EC2 says {current}"
                    )));
                }
                let ends_at = later(event.time, SPOT_NOTICE);
                Plan::Act {
                    notice: notice(NoticeKind::InstanceStopping, now, Some(ends_at)),
                    deadline: ends_at.max(later(now, Duration::from_secs(10))),
                }
            }
            Announcement::ScheduledChange {
                type_code,
                starts_at,
            } => {
                let scheduled = context
                    .instances
                    .scheduled_events(instance_id)
                    .await
                    .map_err(aws)?;
                let Some(first) = scheduled
                    .iter()
                    .filter(|e| e.is_pending())
                    .filter_map(|e| e.not_before.or(*starts_at))
                    .min()
                else {
                    return Ok(Checked::Ours {
                        group,
                        plan: Plan::Nothing(
                            "NotScheduled",
                            format!(
                                "EC2 lists no pending scheduled event ({type_code}): completed or cancelled"
                            ),
                        ),
                    });
                };
                let drain_from = first
                    .checked_sub(settings.notices.maintenance_margin)
                    .unwrap_or(first);
                if now >= first {
                    Plan::Nothing("Past", format!("{type_code} started at {first}"))
                } else if now >= drain_from {
                    let (notice, deadline) = maintenance_drain(first, now, settings.drain_timeout);
                    Plan::Act { notice, deadline }
                } else {
                    Plan::Later(PlannedMaintenance {
                        type_code: type_code.clone(),
                        starts_at: first,
                        drain_from,
                    })
                }
            }
        };
        Ok(Checked::Ours { group, plan })
    }
}

enum Checked {
    Foreign(String),
    Ours { group: String, plan: Plan },
}

pub(super) fn notice(
    kind: NoticeKind,
    now: Timestamp,
    instance_ends_at: Option<Timestamp>,
) -> InstanceNotice {
    InstanceNotice {
        kind,
        received_at: now,
        instance_ends_at,
        cordon_only: false,
    }
}

/// The notice and deadline of a drain for scheduled maintenance starting at `starts_at`:
/// over by the start, and no longer than a drain may take.
pub(super) fn maintenance_drain(
    starts_at: Timestamp,
    now: Timestamp,
    drain_timeout: Duration,
) -> (InstanceNotice, Timestamp) {
    (
        notice(NoticeKind::ScheduledMaintenance, now, Some(starts_at)),
        starts_at.min(later(now, drain_timeout)),
    )
}

/// A Kubernetes error about node `name`, as the drain reports it.
pub(super) fn kube_error(name: &str, source: kube::Error) -> NoticeError {
    NoticeError::Drain(DrainError::Kubernetes {
        node: name.to_owned(),
        source,
    })
}

pub(super) fn later(at: Timestamp, by: Duration) -> Timestamp {
    at.checked_add(by).unwrap_or(Timestamp::MAX)
}

fn announcement_name(announcement: &Announcement) -> &'static str {
    match announcement {
        Announcement::SpotInterruption { .. } => "SpotInterruptionWarning",
        Announcement::RebalanceRecommendation => "RebalanceRecommendation",
        Announcement::Stopping { .. } => "InstanceStopping",
        Announcement::ScheduledChange { .. } => "ScheduledChange",
    }
}
