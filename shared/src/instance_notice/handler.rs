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
use super::settings::RebalanceAction;
use super::sweep::sweep;
use crate::aws::{
    AwsError, GroupActivity, InstanceFacts, InstanceNotices, InstanceNoticesBatch,
    ScheduledInstanceEvent, marked_for_interruption,
};
use crate::cluster::ClusterAccessError;
use crate::cluster::connection::KubeConnection;
use crate::diagnostic::{FunctionError, diagnostic};
use crate::drain::notice::{NoticeDrainOutcome, NoticeDrainRequest};
use crate::drain::{DrainError, Drainer};
use crate::lifecycle::handler::{HookClients, Invocation};
use crate::lifecycle::node::{NodeLookupError, find_node_indexed, node_managed_node_group};
use crate::lifecycle::scope::{ScopeDecision, managed_node_group};
use crate::lifecycle::settings::DrainSettings;
use crate::node_marks::checkpoint::{InstanceNotice, NoticeKind, notice_action};
use crate::node_marks::maintenance::{
    MaintenanceRecord, PlannedMaintenance, ScheduledEventRef, announced_event, drain_from,
    plan_maintenance,
};
use crate::reconcile::converge::drop_maintenance_plan;
use crate::reconcile::run::reconcile_node;
use crate::reconcile::{KnownInstances, NodeMarks, after_event};

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
    /// Something to do on the instance's node.
    OnNode(NodePlan),
    /// Nothing to do: the outcome's name and why.
    Nothing(&'static str, String),
}

/// What to do on the instance's node.
enum NodePlan {
    /// Drain (or cordon) now for this notice, until `deadline`.
    Act {
        notice: InstanceNotice,
        deadline: Timestamp,
    },
    /// Scheduled maintenance far enough ahead: drain from `drain_from`.
    Later(PlannedMaintenance),
    /// AWS Health says a scheduled change is over: the node's marks are reconciled now, by
    /// the same rule as on the schedule (a drain for that EC2 event, once EC2 no longer lists
    /// it as pending and the node is Ready again, is undone; a drain for another event stays).
    Reconcile,
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
    pub(super) async fn instance(
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
        let (group, facts, plan) = match checked {
            Checked::LeftAlone(name, reason) => {
                tracing::info!(step = "foreign_instance", outcome = name, %reason, "not an instance this function drains: left alone");
                return Ok(outcome(name, Some(reason)));
            }
            Checked::Ours { group, facts, plan } => (group, facts, plan),
        };
        let plan = match plan {
            Plan::Nothing(name, why) => {
                tracing::info!(
                    step = "no_action",
                    why,
                    "nothing to do for this instance event"
                );
                return Ok(outcome(name, Some(why)));
            }
            Plan::OnNode(plan) => plan,
        };
        let Some((client, node)) = self
            .client_and_node(instance_id, facts.private_dns_name.as_deref())
            .await?
        else {
            return Ok(outcome("NoNode", None));
        };
        if let Some(nodegroup) = node_managed_node_group(&node) {
            let reason =
                format!("the node belongs to EKS managed node group {nodegroup}: EKS handles it");
            tracing::info!(step = "managed_node_group", %reason, "left to EKS's node manager");
            return Ok(outcome("ManagedNodeGroup", Some(reason)));
        }
        let found = NodeMarks::of(&node);
        let drains = matches!(plan, NodePlan::Act { .. });
        let known = found
            .instance_id
            .clone()
            .map(|id| KnownInstances::from([(id, facts)]));
        let (name, detail) = match plan {
            NodePlan::Act { notice, deadline } => {
                let target = NoticeTarget {
                    client: &client,
                    group: &group,
                    instance_id,
                };
                self.act(target, node, &notice, deadline, invocation)
                    .await?
            }
            NodePlan::Later(planned) => {
                plan_later(&client, node, &group, instance_id, &planned).await?
            }
            NodePlan::Reconcile => {
                return Ok(self
                    .reconcile_now(&client, &found, known.as_ref(), outcome)
                    .await);
            }
        };
        self.reconcile_after(&client, &found, drains, known.as_ref())
            .await;
        Ok(outcome(name, detail))
    }

    /// The node's other marks checked right after the event, not at the next scheduled
    /// run; the instance's facts the event just read are not asked again.
    async fn reconcile_after(
        &self,
        client: &kube::Client,
        found: &NodeMarks,
        event_drained: bool,
        known: Option<&KnownInstances>,
    ) {
        let context = &self.drainer.context;
        let (instances, autoscaling) = (&context.instances, &context.autoscaling);
        let policy = context.settings.notices.reconcile_policy();
        after_event(
            client,
            instances,
            autoscaling,
            policy,
            found,
            event_drained,
            known,
        )
        .await;
    }

    /// A scheduled change AWS Health says is over: the node reconciled now; the outcome names
    /// what changed (`NothingToRestore` when nothing did: its drain's own event is still
    /// pending, the node is not Ready yet, or nothing of ours is on it).
    async fn reconcile_now(
        &self,
        client: &kube::Client,
        found: &NodeMarks,
        known: Option<&KnownInstances>,
        outcome: impl Fn(&str, Option<String>) -> InstanceOutcome,
    ) -> InstanceOutcome {
        let context = &self.drainer.context;
        let (instances, autoscaling) = (&context.instances, &context.autoscaling);
        let reconciled = reconcile_node(
            client,
            instances,
            autoscaling,
            context.settings.notices.reconcile_policy(),
            &found.node,
            known,
        )
        .await;
        let changed: Vec<_> = reconciled.outcomes.iter().filter(|o| !o.failed).collect();
        match changed.first() {
            None => outcome(
                "NothingToRestore",
                Some("the node's marks stand, or none of ours is on it".to_owned()),
            ),
            Some(first) => outcome(
                &first.action,
                Some(
                    changed
                        .iter()
                        .map(|o| o.outcome.as_str())
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
            ),
        }
    }

    /// Drains (or cordons) the node now; the outcome's name and detail.
    async fn act(
        &self,
        target: NoticeTarget<'_>,
        node: k8s_openapi::api::core::v1::Node,
        notice: &InstanceNotice,
        deadline: Timestamp,
        invocation: &Invocation,
    ) -> Result<(&'static str, Option<String>), NoticeError> {
        let drained = self
            .drain(
                target.client,
                node,
                target.group,
                target.instance_id,
                notice,
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
        Ok((drained.name(), detail))
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
        let plan = MaintenanceRecord::of(&node).filter(|plan| {
            notice.kind == NoticeKind::ScheduledMaintenance
                && (plan.event.is_none()
                    || notice.scheduled_event.is_none()
                    || plan.event == notice.scheduled_event)
        });
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
                drop_maintenance_plan(client, fresh, &record)
                    .await
                    .map_err(|source| kube_error(&name, source))?;
            }
        }
        Ok(drained)
    }

    /// The cluster's client and the instance's Node (found by `dns_name`, the instance's
    /// private DNS name, or by the node index); `None` when the instance has no node.
    async fn client_and_node(
        &self,
        instance_id: &str,
        dns_name: Option<&str>,
    ) -> Result<Option<(kube::Client, k8s_openapi::api::core::v1::Node)>, NoticeError> {
        let context = &self.drainer.context;
        let client = context.kube.client().await?;
        let node = find_node_indexed(&client, instance_id, dns_name, &context.nodes)
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
        if let Some(reason) = self.foreign_origin(event, invocation) {
            return Ok(Checked::LeftAlone("Foreign", reason));
        }
        let Some(facts) = context
            .instances
            .instance_facts(instance_id)
            .await
            .map_err(aws_error(instance_id))?
        else {
            return Ok(Checked::LeftAlone(
                "Foreign",
                "EC2 does not know the instance".to_owned(),
            ));
        };
        let Some(group) = facts.auto_scaling_group.clone() else {
            return Ok(Checked::LeftAlone(
                "Foreign",
                "the instance is in no Auto Scaling group".to_owned(),
            ));
        };
        if let Some(left) = self
            .foreign_group(event, &group, invocation)
            .await
            .map_err(aws_error(instance_id))?
        {
            return Ok(left);
        }
        let plan = self.plan(event, instance_id, &facts).await?;
        Ok(Checked::Ours { group, facts, plan })
    }

    /// Why an event from another account or region is not ours to act on, if it is.
    fn foreign_origin(&self, event: &InstanceEvent, invocation: &Invocation) -> Option<String> {
        if let Some(own) = invocation.function_account.as_deref()
            && own != event.account
        {
            return Some(format!(
                "the event is from account {}, not this function's",
                event.account
            ));
        }
        let own_region = self.drainer.context.settings.notices.region.as_deref();
        if let Some(own) = own_region
            && own != event.region
        {
            return Some(format!(
                "the event is from region {}, not this function's ({own})",
                event.region
            ));
        }
        None
    }

    /// Why `group` is left alone, if it is: not this cluster's, or an EKS managed node
    /// group's (EKS's node manager drains those; two drainers on one node fight).
    async fn foreign_group(
        &self,
        event: &InstanceEvent,
        group: &str,
        invocation: &Invocation,
    ) -> Result<Option<Checked>, AwsError> {
        let context = &self.drainer.context;
        let tags = context
            .scope
            .recent_tags(&context.autoscaling, group)
            .await?;
        let decision = context.scope.decide_with_tags(
            invocation.function_account.as_deref(),
            &event.account,
            group,
            tags.as_ref(),
        );
        if let ScopeDecision::Foreign(reason) = decision {
            return Ok(Some(Checked::LeftAlone(
                "Foreign",
                format!("group {group}: {reason}"),
            )));
        }
        Ok(tags.as_ref().and_then(managed_node_group).map(|nodegroup| {
            Checked::LeftAlone(
                "ManagedNodeGroup",
                format!("group {group} is EKS managed node group {nodegroup}'s: EKS handles it"),
            )
        }))
    }

    /// What the event comes to for the instance, once EC2 confirms it.
    async fn plan(
        &self,
        event: &InstanceEvent,
        instance_id: &str,
        facts: &InstanceFacts,
    ) -> Result<Plan, NoticeError> {
        let now = Timestamp::now();
        let settings = &self.drainer.context.settings;
        match &event.announcement {
            Announcement::SpotInterruption { action } => {
                self.confirm_spot_interruption(instance_id, facts).await?;
                Ok(spot_plan(event.time, action, now))
            }
            Announcement::RebalanceRecommendation => {
                if facts.spot_request_id.is_none() {
                    return Err(unconfirmed(
                        instance_id,
                        "the instance is not a Spot instance",
                    ));
                }
                Ok(rebalance_plan(settings, now))
            }
            Announcement::Stopping { state } => {
                stopping_plan(event.time, instance_id, facts, state, now)
            }
            Announcement::ScheduledChange {
                type_code,
                starts_at,
                closed,
            } => {
                // A change AWS Health closed is the reconciler's to check (it asks EC2's
                // schedule itself).
                if *closed {
                    return Ok(Plan::OnNode(NodePlan::Reconcile));
                }
                let scheduled = self
                    .drainer
                    .context
                    .instances
                    .scheduled_events(instance_id)
                    .await
                    .map_err(aws_error(instance_id))?;
                Ok(maintenance_plan(
                    &scheduled, type_code, *starts_at, settings, now,
                ))
            }
        }
    }

    /// EC2 must have marked the instance's Spot request for interruption.
    async fn confirm_spot_interruption(
        &self,
        instance_id: &str,
        facts: &InstanceFacts,
    ) -> Result<(), NoticeError> {
        let Some(request) = &facts.spot_request_id else {
            return Err(unconfirmed(
                instance_id,
                "the instance is not a Spot instance",
            ));
        };
        let status = self
            .drainer
            .context
            .instances
            .spot_request_status(request)
            .await
            .map_err(aws_error(instance_id))?;
        if status.as_deref().is_some_and(marked_for_interruption) {
            return Ok(());
        }
        Err(unconfirmed(
            instance_id,
            &format!(
                "its Spot request's status is {}, not marked for interruption",
                status.as_deref().unwrap_or("unknown")
            ),
        ))
    }
}

/// The client and names a drain for one instance works with.
struct NoticeTarget<'a> {
    client: &'a kube::Client,
    group: &'a str,
    instance_id: &'a str,
}

/// A Spot interruption warning sent at `sent_at`: drained until the instance goes.
fn spot_plan(sent_at: Timestamp, action: &str, now: Timestamp) -> Plan {
    let ends_at = later(sent_at, SPOT_NOTICE);
    if now >= ends_at {
        return Plan::Nothing(
            "Past",
            format!("the interruption ({action}) was due at {ends_at}"),
        );
    }
    Plan::OnNode(NodePlan::Act {
        notice: notice(NoticeKind::SpotInterruption, now, Some(ends_at)),
        deadline: ends_at,
    })
}

/// A rebalance recommendation, as `REBALANCE_ACTION` says.
fn rebalance_plan(settings: &DrainSettings, now: Timestamp) -> Plan {
    let (notice, deadline) = match settings.notices.rebalance_action {
        RebalanceAction::Nothing => {
            return Plan::Nothing("Ignored", "REBALANCE_ACTION=none".to_owned());
        }
        RebalanceAction::Cordon => (
            InstanceNotice {
                cordon_only: true,
                ..notice(NoticeKind::RebalanceRecommendation, now, None)
            },
            later(now, settings.notices.rebalance_undo_after),
        ),
        RebalanceAction::Drain => (
            notice(NoticeKind::RebalanceRecommendation, now, None),
            later(now, settings.drain_timeout),
        ),
    };
    Plan::OnNode(NodePlan::Act { notice, deadline })
}

/// An instance stopping or shutting down, which EC2 must no longer list as running.
fn stopping_plan(
    sent_at: Timestamp,
    instance_id: &str,
    facts: &InstanceFacts,
    state: &str,
    now: Timestamp,
) -> Result<Plan, NoticeError> {
    let current = facts.state.as_deref().unwrap_or("unknown");
    if current == "running" || current == "pending" {
        return Err(unconfirmed(
            instance_id,
            &format!("the event says {state}, EC2 says {current}"),
        ));
    }
    let ends_at = later(sent_at, SPOT_NOTICE);
    Ok(Plan::OnNode(NodePlan::Act {
        notice: notice(NoticeKind::InstanceStopping, now, Some(ends_at)),
        deadline: ends_at.max(later(now, Duration::from_secs(10))),
    }))
}

/// An upcoming scheduled change: the EC2 event it announces (see [`announced_event`])
/// drained now when within the margin, planned otherwise; the plan and the drain name that
/// event.
fn maintenance_plan(
    scheduled: &[ScheduledInstanceEvent],
    type_code: &str,
    starts_at: Option<Timestamp>,
    settings: &DrainSettings,
    now: Timestamp,
) -> Plan {
    let announced = announced_event(scheduled, type_code, starts_at);
    let Some((event, first)) = announced.and_then(|e| Some((e, e.not_before.or(starts_at)?)))
    else {
        return Plan::Nothing(
            "NotScheduled",
            format!("EC2 lists no pending scheduled event of {type_code}: completed or cancelled"),
        );
    };
    let event = ScheduledEventRef::of(event, Some(type_code));
    let drain_from = drain_from(first, settings.notices.maintenance_margin);
    if now >= first {
        return Plan::Nothing("Past", format!("{type_code} started at {first}"));
    }
    if now >= drain_from {
        let (notice, deadline) = maintenance_drain(first, event, now, settings.drain_timeout);
        return Plan::OnNode(NodePlan::Act { notice, deadline });
    }
    Plan::OnNode(NodePlan::Later(PlannedMaintenance {
        type_code: type_code.to_owned(),
        event,
        starts_at: first,
        drain_from,
    }))
}

/// Records the planned maintenance on the node; the outcome's name and detail.
async fn plan_later(
    client: &kube::Client,
    node: k8s_openapi::api::core::v1::Node,
    group: &str,
    instance_id: &str,
    planned: &PlannedMaintenance,
) -> Result<(&'static str, Option<String>), NoticeError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let written = plan_maintenance(client, node, group, instance_id, planned)
        .await
        .map_err(|source| kube_error(&name, source))?;
    tracing::info!(step = "maintenance_planned", drain_from = %planned.drain_from, starts_at = %planned.starts_at, written, "scheduled maintenance recorded: the sweep drains the node from the given time");
    Ok((
        "MaintenancePlanned",
        Some(format!("drain from {}", planned.drain_from)),
    ))
}

fn aws_error(instance_id: &str) -> impl Fn(AwsError) -> NoticeError + '_ {
    move |source| NoticeError::Aws {
        instance_id: instance_id.to_owned(),
        source,
    }
}

fn unconfirmed(instance_id: &str, reason: &str) -> NoticeError {
    NoticeError::Unconfirmed {
        instance_id: instance_id.to_owned(),
        reason: reason.to_owned(),
    }
}

// Made once per instance of an event and consumed at once: size does not matter.
#[allow(clippy::large_enum_variant)]
enum Checked {
    /// Not this function's to act on: the outcome's name and why.
    LeftAlone(&'static str, String),
    Ours {
        group: String,
        facts: InstanceFacts,
        plan: Plan,
    },
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
        scheduled_event: None,
    }
}

/// The notice and deadline of a drain for the scheduled `event` starting at `starts_at`:
/// over by the start, and no longer than a drain may take.
pub(super) fn maintenance_drain(
    starts_at: Timestamp,
    event: ScheduledEventRef,
    now: Timestamp,
    drain_timeout: Duration,
) -> (InstanceNotice, Timestamp) {
    let notice = InstanceNotice {
        scheduled_event: Some(event),
        ..notice(NoticeKind::ScheduledMaintenance, now, Some(starts_at))
    };
    (notice, starts_at.min(later(now, drain_timeout)))
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
