//! AWS SDK adapters for the traits in [`crate::aws`].
//!
//! Thin: one SDK call per trait method, and one place ([`classify`]) that turns an SDK error
//! into an [`AwsError`] whose kind the domain acts on. The SDK's own standard retry strategy
//! (throttling, 5xx, transport errors; three attempts) applies underneath.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use aws_types::SdkConfig;

use super::*;
use crate::lifecycle::notification::LifecycleTransition;

/// The text Auto Scaling answers with when the lifecycle action is already completed,
/// abandoned or expired (a `ValidationError`).
const NO_ACTIVE_LIFECYCLE_ACTION: &str = "No active Lifecycle Action found";

/// Error codes that mean "try again later".
const TRANSIENT_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "RequestThrottledException",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "InternalFailure",
    "InternalError",
    "InternalErrorException",
    "ServerException",
];

const ACCESS_DENIED_CODES: &[&str] = &[
    "AccessDenied",
    "AccessDeniedException",
    "UnauthorizedOperation",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "ExpiredToken",
    "ExpiredTokenException",
    "AuthFailure",
    "SignatureDoesNotMatch",
];

const NOT_FOUND_CODES: &[&str] = &[
    "ResourceNotFoundException",
    "NotFoundException",
    "InvalidInstanceID.NotFound",
    "NoSuchEntity",
];

const INVALID_CODES: &[&str] = &[
    "ValidationError",
    "ValidationException",
    "InvalidParameterException",
    "InvalidParameterValue",
    "InvalidParameter",
    "InvalidRequestException",
    "InvalidInstanceID.Malformed",
];

/// What a service error code (or, without a known one, the HTTP status) means to a caller.
pub(crate) fn kind_of(code: Option<&str>, status: u16) -> AwsErrorKind {
    match code {
        Some(c) if TRANSIENT_CODES.contains(&c) => AwsErrorKind::Transient,
        Some(c) if ACCESS_DENIED_CODES.contains(&c) => AwsErrorKind::AccessDenied,
        Some(c) if NOT_FOUND_CODES.contains(&c) => AwsErrorKind::NotFound,
        Some("ResourceInUseException") => AwsErrorKind::AlreadyExists,
        Some(c) if INVALID_CODES.contains(&c) => AwsErrorKind::Invalid,
        _ if status == 429 || status >= 500 => AwsErrorKind::Transient,
        _ if status == 401 || status == 403 => AwsErrorKind::AccessDenied,
        _ if status == 404 => AwsErrorKind::NotFound,
        _ => AwsErrorKind::Other,
    }
}

/// Folds an SDK error into an [`AwsError`] the domain can act on.
pub(crate) fn classify<E>(operation: &'static str, error: SdkError<E, HttpResponse>) -> AwsError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &error {
        SdkError::ServiceError(service_error) => {
            let status = service_error.raw().status().as_u16();
            let code = service_error.err().code().map(str::to_owned);
            let message = service_error
                .err()
                .message()
                .map(str::to_owned)
                .unwrap_or_else(|| DisplayErrorContext(&error).to_string());
            let kind = kind_of(code.as_deref(), status);
            AwsError {
                operation,
                kind,
                code,
                message,
            }
        }
        SdkError::ConstructionFailure(_) => AwsError::new(
            operation,
            AwsErrorKind::Invalid,
            DisplayErrorContext(&error).to_string(),
        ),
        _ => AwsError::new(
            operation,
            AwsErrorKind::Transport,
            DisplayErrorContext(&error).to_string(),
        ),
    }
}

/// An SDK client built when the first call needs it.
///
/// Building one costs about 0.2 ms of start-up each (its endpoint rules' partition table is
/// parsed and its runtime plugins assembled): four per function, measured at 0.8 ms of the
/// terminating hook's 1.5 ms in `main` (BENCHMARKS.md §1). A function that takes an event
/// without calling a service (a test notification; SNS, which only a hand-over calls) never
/// pays for that client, and the others pay once, on their first call.
// One per SDK client per process: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum OnFirstUse<C> {
    /// Given ready-made (tests, adapters given a client).
    Ready(C),
    Later {
        built: std::sync::OnceLock<C>,
        config: SdkConfig,
        build: fn(&SdkConfig) -> C,
    },
}

impl<C> OnFirstUse<C> {
    pub fn new(config: &SdkConfig, build: fn(&SdkConfig) -> C) -> Self {
        Self::Later {
            built: std::sync::OnceLock::new(),
            config: config.clone(),
            build,
        }
    }

    pub fn ready(client: C) -> Self {
        Self::Ready(client)
    }

    pub fn get(&self) -> &C {
        match self {
            Self::Ready(client) => client,
            Self::Later {
                built,
                config,
                build,
            } => built.get_or_init(|| build(config)),
        }
    }
}

/// Auto Scaling through `aws-sdk-autoscaling`.
#[derive(Debug, Clone)]
pub struct SdkAutoScaling {
    client: OnFirstUse<aws_sdk_autoscaling::Client>,
}

impl SdkAutoScaling {
    /// The client is built when the first call needs it (see [`OnFirstUse`]).
    pub fn new(config: &SdkConfig) -> Self {
        Self {
            client: OnFirstUse::new(config, aws_sdk_autoscaling::Client::new),
        }
    }

    pub fn from_client(client: aws_sdk_autoscaling::Client) -> Self {
        Self {
            client: OnFirstUse::ready(client),
        }
    }

    fn client(&self) -> &aws_sdk_autoscaling::Client {
        self.client.get()
    }
}

fn is_no_active_action(error: &AwsError) -> bool {
    error.kind == AwsErrorKind::Invalid && error.message.contains(NO_ACTIVE_LIFECYCLE_ACTION)
}

impl SdkAutoScaling {
    /// The group named `group_name` (`DescribeAutoScalingGroups`), `None` when it does not
    /// exist.
    async fn describe_group(
        &self,
        group_name: &str,
    ) -> Result<Option<aws_sdk_autoscaling::types::AutoScalingGroup>, AwsError> {
        let output = self
            .client()
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(group_name)
            .send()
            .await
            .map_err(|e| classify("DescribeAutoScalingGroups", e))?;
        Ok(output
            .auto_scaling_groups
            .unwrap_or_default()
            .into_iter()
            .find(|g| g.auto_scaling_group_name() == Some(group_name)))
    }
}

/// A group's tags as a map.
fn tags_of(group: &aws_sdk_autoscaling::types::AutoScalingGroup) -> BTreeMap<String, String> {
    group
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?.to_owned(), t.value().unwrap_or("").to_owned())))
        .collect()
}

impl AutoScaling for SdkAutoScaling {
    async fn complete_lifecycle_action(
        &self,
        action: &LifecycleActionRef,
        result: LifecycleActionResult,
    ) -> Result<CompletionOutcome, AwsError> {
        let sent = self
            .client()
            .complete_lifecycle_action()
            .auto_scaling_group_name(&action.auto_scaling_group_name)
            .lifecycle_hook_name(&action.lifecycle_hook_name)
            .instance_id(&action.instance_id)
            .set_lifecycle_action_token(token_of(action))
            .lifecycle_action_result(result.as_str())
            .send()
            .await;
        match sent {
            Ok(_) => Ok(CompletionOutcome::Completed),
            Err(e) => {
                let error = classify("CompleteLifecycleAction", e);
                if is_no_active_action(&error) {
                    Ok(CompletionOutcome::NoActiveAction)
                } else {
                    Err(error)
                }
            }
        }
    }

    async fn record_lifecycle_action_heartbeat(
        &self,
        action: &LifecycleActionRef,
    ) -> Result<HeartbeatOutcome, AwsError> {
        let sent = self
            .client()
            .record_lifecycle_action_heartbeat()
            .auto_scaling_group_name(&action.auto_scaling_group_name)
            .lifecycle_hook_name(&action.lifecycle_hook_name)
            .instance_id(&action.instance_id)
            .set_lifecycle_action_token(token_of(action))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(HeartbeatOutcome::Recorded),
            Err(e) => {
                let error = classify("RecordLifecycleActionHeartbeat", e);
                if is_no_active_action(&error) {
                    Ok(HeartbeatOutcome::NoActiveAction)
                } else {
                    Err(error)
                }
            }
        }
    }

    async fn describe_lifecycle_hook(
        &self,
        group_name: &str,
        hook_name: &str,
    ) -> Result<Option<LifecycleHook>, AwsError> {
        let hooks = self.lifecycle_hooks(group_name, Some(hook_name)).await?;
        let Some(hook) = hooks
            .iter()
            .find(|h| h.lifecycle_hook_name() == Some(hook_name))
        else {
            return Ok(None);
        };
        // Auto Scaling's documented defaults when a field is absent.
        let heartbeat = hook.heartbeat_timeout().unwrap_or(3600).max(0) as u64;
        let global = hook
            .global_timeout()
            .map(|g| g.max(0) as u64)
            .unwrap_or_else(|| (heartbeat * 100).min(172_800));
        Ok(Some(LifecycleHook {
            name: hook_name.to_owned(),
            transition: hook.lifecycle_transition().unwrap_or_default().to_owned(),
            heartbeat_timeout: Duration::from_secs(heartbeat),
            global_timeout: Duration::from_secs(global),
            default_result: hook
                .default_result()
                .and_then(LifecycleActionResult::parse)
                .unwrap_or(LifecycleActionResult::Abandon),
        }))
    }

    async fn group_tags(
        &self,
        group_name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, AwsError> {
        Ok(self.describe_group(group_name).await?.as_ref().map(tags_of))
    }

    async fn retains_abandoned_instances(
        &self,
        group_name: &str,
    ) -> Result<Option<bool>, AwsError> {
        Ok(self
            .describe_group(group_name)
            .await?
            .as_ref()
            .map(retains_abandoned_instances))
    }
}

/// Whether `group`'s instance lifecycle policy keeps instances whose terminating action ends
/// ABANDON (`RetentionTriggers.TerminateHookAbandon = retain`; absent means terminate).
fn retains_abandoned_instances(group: &aws_sdk_autoscaling::types::AutoScalingGroup) -> bool {
    group
        .instance_lifecycle_policy()
        .and_then(|p| p.retention_triggers())
        .and_then(|t| t.terminate_hook_abandon())
        .is_some_and(|action| action.as_str() == "retain")
}

/// EC2 through `aws-sdk-ec2`.
#[derive(Debug, Clone)]
pub struct SdkInstances {
    client: OnFirstUse<aws_sdk_ec2::Client>,
}

impl SdkInstances {
    /// The client is built when the first call needs it (see [`OnFirstUse`]).
    pub fn new(config: &SdkConfig) -> Self {
        Self {
            client: OnFirstUse::new(config, aws_sdk_ec2::Client::new),
        }
    }

    pub fn from_client(client: aws_sdk_ec2::Client) -> Self {
        Self {
            client: OnFirstUse::ready(client),
        }
    }

    fn client(&self) -> &aws_sdk_ec2::Client {
        self.client.get()
    }
}

impl SdkInstances {
    /// `DescribeInstances` of one instance; `None` when EC2 does not know it.
    async fn describe(
        &self,
        instance_id: &str,
    ) -> Result<Option<aws_sdk_ec2::types::Instance>, AwsError> {
        let output = match self
            .client()
            .describe_instances()
            .instance_ids(instance_id)
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) => {
                let error = classify("DescribeInstances", e);
                return match error.kind {
                    AwsErrorKind::NotFound => Ok(None),
                    _ => Err(error),
                };
            }
        };
        Ok(output
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.instance_id() == Some(instance_id))
            .cloned())
    }
}

impl SdkInstances {
    /// `DescribeInstanceStatus` of one instance, stopped ones included; `None` when EC2 does
    /// not know it.
    async fn instance_status(
        &self,
        instance_id: &str,
    ) -> Result<Option<aws_sdk_ec2::types::InstanceStatus>, AwsError> {
        let output = match self
            .client()
            .describe_instance_status()
            .instance_ids(instance_id)
            .include_all_instances(true)
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) => {
                let error = classify("DescribeInstanceStatus", e);
                return match error.kind {
                    AwsErrorKind::NotFound => Ok(None),
                    _ => Err(error),
                };
            }
        };
        Ok(output
            .instance_statuses()
            .iter()
            .find(|s| s.instance_id() == Some(instance_id))
            .cloned())
    }
}

impl Instances for SdkInstances {
    async fn private_dns_name(&self, instance_id: &str) -> Result<Option<String>, AwsError> {
        Ok(self
            .describe(instance_id)
            .await?
            .and_then(|i| i.private_dns_name)
            .filter(|name| !name.is_empty()))
    }

    async fn instance_state(&self, instance_id: &str) -> Result<Option<String>, AwsError> {
        Ok(self
            .describe(instance_id)
            .await?
            .and_then(|i| i.state)
            .and_then(|state| state.name)
            .map(|name| name.as_str().to_owned()))
    }
}

impl InstanceNotices for SdkInstances {
    async fn instance_facts(&self, instance_id: &str) -> Result<Option<InstanceFacts>, AwsError> {
        Ok(self.describe(instance_id).await?.as_ref().map(facts_of))
    }

    async fn spot_request_status(&self, spot_request_id: &str) -> Result<Option<String>, AwsError> {
        let output = match self
            .client()
            .describe_spot_instance_requests()
            .spot_instance_request_ids(spot_request_id)
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) => {
                let error = classify("DescribeSpotInstanceRequests", e);
                return match error.kind {
                    AwsErrorKind::NotFound => Ok(None),
                    _ => Err(error),
                };
            }
        };
        Ok(output
            .spot_instance_requests()
            .iter()
            .find(|r| r.spot_instance_request_id() == Some(spot_request_id))
            .and_then(|r| r.status())
            .and_then(|s| s.code())
            .map(str::to_owned))
    }

    async fn scheduled_events(
        &self,
        instance_id: &str,
    ) -> Result<Vec<ScheduledInstanceEvent>, AwsError> {
        Ok(self
            .instance_status(instance_id)
            .await?
            .map(|status| status.events().iter().map(scheduled_event_of).collect())
            .unwrap_or_default())
    }
}

/// The facts [`InstanceNotices::instance_facts`] reads from one described instance.
fn facts_of(instance: &aws_sdk_ec2::types::Instance) -> InstanceFacts {
    InstanceFacts {
        state: instance
            .state()
            .and_then(|s| s.name())
            .map(|n| n.as_str().to_owned()),
        auto_scaling_group: instance
            .tags()
            .iter()
            .find(|t| t.key() == Some("aws:autoscaling:groupName"))
            .and_then(|t| t.value())
            .map(str::to_owned),
        spot_request_id: instance.spot_instance_request_id().map(str::to_owned),
        private_dns_name: instance
            .private_dns_name()
            .filter(|name| !name.is_empty())
            .map(str::to_owned),
    }
}

impl SdkInstances {
    /// Every Spot request `filter` selects, page by page.
    async fn spot_requests_where(
        &self,
        filter: aws_sdk_ec2::types::Filter,
    ) -> Result<Vec<aws_sdk_ec2::types::SpotInstanceRequest>, AwsError> {
        self.client()
            .describe_spot_instance_requests()
            .filters(filter)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| classify("DescribeSpotInstanceRequests", e))
    }
}

impl InstanceNoticesBatch for SdkInstances {
    /// By an `instance-id` filter (200 ids a call): an instance EC2 no longer knows is
    /// absent instead of failing the batch.
    async fn instances_facts(
        &self,
        instance_ids: &[String],
    ) -> Result<BTreeMap<String, InstanceFacts>, AwsError> {
        let mut out = BTreeMap::new();
        self.each_described_instance(instance_ids, |id, instance| {
            out.insert(id.to_owned(), facts_of(instance));
        })
        .await?;
        Ok(out)
    }

    /// By a `status-code` filter, every page.
    async fn interrupted_spot_instances(&self) -> Result<Vec<String>, AwsError> {
        use aws_sdk_ec2::types::Filter;
        let filter = Filter::builder()
            .name("status-code")
            .set_values(Some(
                SPOT_INTERRUPTION_CODES
                    .iter()
                    .map(|c| (*c).to_owned())
                    .collect(),
            ))
            .build();
        let requests = self.spot_requests_where(filter).await?;
        Ok(requests
            .iter()
            .filter_map(|r| r.instance_id().map(str::to_owned))
            .collect())
    }

    /// By an `event.code` filter, every page (running instances only: a stopped one has
    /// nothing left to drain).
    async fn instances_with_scheduled_events(
        &self,
    ) -> Result<BTreeMap<String, Vec<ScheduledInstanceEvent>>, AwsError> {
        use aws_sdk_ec2::types::Filter;
        let filter = Filter::builder()
            .name("event.code")
            .set_values(Some(
                SCHEDULED_EVENT_CODES
                    .iter()
                    .map(|c| (*c).to_owned())
                    .collect(),
            ))
            .build();
        let statuses = self
            .client()
            .describe_instance_status()
            .filters(filter)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| classify("DescribeInstanceStatus", e))?;
        let mut out: BTreeMap<String, Vec<ScheduledInstanceEvent>> = BTreeMap::new();
        for status in &statuses {
            if let Some(id) = status.instance_id() {
                out.entry(id.to_owned())
                    .or_default()
                    .extend(status.events().iter().map(scheduled_event_of));
            }
        }
        Ok(out)
    }

    /// By a `spot-instance-request-id` filter: an unknown request is absent.
    async fn spot_request_statuses(
        &self,
        spot_request_ids: &[String],
    ) -> Result<BTreeMap<String, String>, AwsError> {
        use aws_sdk_ec2::types::Filter;
        let mut out = BTreeMap::new();
        for batch in spot_request_ids.chunks(INSTANCE_FILTER_BATCH) {
            let filter = Filter::builder()
                .name("spot-instance-request-id")
                .set_values(Some(batch.to_vec()))
                .build();
            let requests = self.spot_requests_where(filter).await?;
            for request in &requests {
                let id = request.spot_instance_request_id();
                let code = request.status().and_then(|s| s.code());
                if let (Some(id), Some(code)) = (id, code) {
                    out.insert(id.to_owned(), code.to_owned());
                }
            }
        }
        Ok(out)
    }

    /// `InstanceIds` (100 a call; `DescribeInstanceStatus` has no `instance-id` filter), all
    /// states. The caller names only instances `DescribeInstances` just found.
    async fn scheduled_events_of(
        &self,
        instance_ids: &[String],
    ) -> Result<BTreeMap<String, Vec<ScheduledInstanceEvent>>, AwsError> {
        let mut out: BTreeMap<String, Vec<ScheduledInstanceEvent>> = instance_ids
            .iter()
            .map(|id| (id.clone(), Vec::new()))
            .collect();
        for batch in instance_ids.chunks(INSTANCE_STATUS_BATCH) {
            let output = self
                .client()
                .describe_instance_status()
                .set_instance_ids(Some(batch.to_vec()))
                .include_all_instances(true)
                .send()
                .await
                .map_err(|e| classify("DescribeInstanceStatus", e))?;
            for status in output.instance_statuses() {
                let Some(id) = status.instance_id() else {
                    continue;
                };
                out.entry(id.to_owned())
                    .or_default()
                    .extend(status.events().iter().map(scheduled_event_of));
            }
        }
        Ok(out)
    }
}

fn scheduled_event_of(event: &aws_sdk_ec2::types::InstanceStatusEvent) -> ScheduledInstanceEvent {
    ScheduledInstanceEvent {
        id: event.instance_event_id().map(str::to_owned),
        code: event
            .code()
            .map(|c| c.as_str().to_owned())
            .unwrap_or_default(),
        not_before: event
            .not_before()
            .and_then(|t| jiff::Timestamp::from_second(t.secs()).ok()),
        description: event.description().unwrap_or_default().to_owned(),
    }
}

impl InstancesByProfile for SdkInstances {
    /// Two `DescribeInstances` queries, because EC2 ANDs filters: instances tagged
    /// `eks:cluster-name` = cluster (managed node groups), then those carrying the
    /// `kubernetes.io/cluster/<cluster>` tag key (self-managed nodes, Karpenter).
    async fn live_cluster_instances_with_profiles(
        &self,
        cluster_name: &str,
        instance_profile_arns: &[String],
        limit: usize,
    ) -> Result<Vec<String>, AwsError> {
        use aws_sdk_ec2::types::Filter;
        let mut found: Vec<String> = Vec::new();
        if instance_profile_arns.is_empty() {
            return Ok(found);
        }
        let cluster_filters = [
            Filter::builder()
                .name("tag:eks:cluster-name")
                .values(cluster_name)
                .build(),
            Filter::builder()
                .name("tag-key")
                .values(format!("kubernetes.io/cluster/{cluster_name}"))
                .build(),
        ];
        for cluster_filter in cluster_filters {
            let mut pages = self
                .client()
                .describe_instances()
                .filters(
                    Filter::builder()
                        .name("iam-instance-profile.arn")
                        .set_values(Some(instance_profile_arns.to_vec()))
                        .build(),
                )
                .filters(
                    Filter::builder()
                        .name("instance-state-name")
                        .set_values(Some(
                            LIVE_INSTANCE_STATES
                                .iter()
                                .map(|s| (*s).to_owned())
                                .collect(),
                        ))
                        .build(),
                )
                .filters(cluster_filter)
                .into_paginator()
                .send();
            // Page by page, not item by item: no page is asked for once `limit` are found.
            while let Some(output) = pages
                .try_next()
                .await
                .map_err(|e| classify("DescribeInstances", e))?
            {
                for id in output
                    .reservations()
                    .iter()
                    .flat_map(|r| r.instances())
                    .filter_map(|i| i.instance_id())
                {
                    if !found.iter().any(|known| known == id) {
                        found.push(id.to_owned());
                    }
                }
                if found.len() >= limit {
                    found.truncate(limit);
                    return Ok(found);
                }
            }
        }
        Ok(found)
    }
}

/// SNS through `aws-sdk-sns`.
#[derive(Debug, Clone)]
pub struct SdkNotifications {
    client: OnFirstUse<aws_sdk_sns::Client>,
}

impl SdkNotifications {
    /// The client is built when the first call needs it (see [`OnFirstUse`]).
    pub fn new(config: &SdkConfig) -> Self {
        Self {
            client: OnFirstUse::new(config, aws_sdk_sns::Client::new),
        }
    }

    pub fn from_client(client: aws_sdk_sns::Client) -> Self {
        Self {
            client: OnFirstUse::ready(client),
        }
    }

    fn client(&self) -> &aws_sdk_sns::Client {
        self.client.get()
    }
}

impl Notifications for SdkNotifications {
    async fn publish(
        &self,
        topic_arn: &str,
        subject: Option<&str>,
        message: &str,
    ) -> Result<(), AwsError> {
        self.client()
            .publish()
            .topic_arn(topic_arn)
            .set_subject(subject.map(str::to_owned))
            .message(message)
            .send()
            .await
            .map_err(|e| classify("Publish", e))?;
        Ok(())
    }
}

/// EKS through `aws-sdk-eks`.
#[derive(Debug, Clone)]
pub struct SdkEks {
    client: OnFirstUse<aws_sdk_eks::Client>,
}

impl SdkEks {
    /// The client is built when the first call needs it (see [`OnFirstUse`]).
    pub fn new(config: &SdkConfig) -> Self {
        Self {
            client: OnFirstUse::new(config, aws_sdk_eks::Client::new),
        }
    }

    pub fn from_client(client: aws_sdk_eks::Client) -> Self {
        Self {
            client: OnFirstUse::ready(client),
        }
    }

    fn client(&self) -> &aws_sdk_eks::Client {
        self.client.get()
    }
}

/// `Ok(None)` for a not-found error, the error otherwise.
fn none_if_not_found<T>(error: AwsError) -> Result<Option<T>, AwsError> {
    match error.kind {
        AwsErrorKind::NotFound => Ok(None),
        _ => Err(error),
    }
}

impl Eks for SdkEks {
    async fn describe_cluster(
        &self,
        cluster_name: &str,
    ) -> Result<Option<ClusterDescription>, AwsError> {
        let output = match self
            .client()
            .describe_cluster()
            .name(cluster_name)
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) => return none_if_not_found(classify("DescribeCluster", e)),
        };
        let Some(cluster) = output.cluster() else {
            return Ok(None);
        };
        let authentication_mode = match cluster
            .access_config()
            .and_then(|a| a.authentication_mode())
        {
            None => AuthenticationMode::ConfigMap,
            Some(mode) => AuthenticationMode::parse(mode.as_str()).ok_or_else(|| {
                AwsError::new(
                    "DescribeCluster",
                    AwsErrorKind::Other,
                    format!("unknown authentication mode {:?}", mode.as_str()),
                )
            })?,
        };
        Ok(Some(ClusterDescription {
            name: cluster.name().unwrap_or(cluster_name).to_owned(),
            arn: cluster.arn().unwrap_or_default().to_owned(),
            endpoint: cluster.endpoint().unwrap_or_default().to_owned(),
            certificate_authority_data: cluster
                .certificate_authority()
                .and_then(|c| c.data())
                .unwrap_or_default()
                .to_owned(),
            authentication_mode,
        }))
    }

    async fn describe_nodegroup(
        &self,
        cluster_name: &str,
        nodegroup_name: &str,
    ) -> Result<Option<NodegroupDescription>, AwsError> {
        let output = match self
            .client()
            .describe_nodegroup()
            .cluster_name(cluster_name)
            .nodegroup_name(nodegroup_name)
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) => return none_if_not_found(classify("DescribeNodegroup", e)),
        };
        Ok(output.nodegroup().map(|ng| NodegroupDescription {
            cluster_name: ng.cluster_name().unwrap_or(cluster_name).to_owned(),
            nodegroup_name: ng.nodegroup_name().unwrap_or(nodegroup_name).to_owned(),
            node_role: ng.node_role().unwrap_or_default().to_owned(),
            ami_type: ng
                .ami_type()
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
            status: ng
                .status()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default(),
        }))
    }

    async fn list_nodegroups(&self, cluster_name: &str) -> Result<Vec<String>, AwsError> {
        self.client()
            .list_nodegroups()
            .cluster_name(cluster_name)
            .into_paginator()
            .items()
            .send()
            .collect::<Result<Vec<_>, _>>()
            .await
            .map_err(|e| classify("ListNodegroups", e))
    }

    async fn create_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
        entry_type: AccessEntryType,
    ) -> Result<AccessEntryCreation, AwsError> {
        match self
            .client()
            .create_access_entry()
            .cluster_name(cluster_name)
            .principal_arn(principal_arn)
            .r#type(entry_type.as_str())
            .send()
            .await
        {
            Ok(_) => Ok(AccessEntryCreation::Created),
            Err(e) => {
                let error = classify("CreateAccessEntry", e);
                match error.kind {
                    AwsErrorKind::AlreadyExists => Ok(AccessEntryCreation::AlreadyExists),
                    _ => Err(error),
                }
            }
        }
    }

    async fn describe_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
    ) -> Result<Option<AccessEntry>, AwsError> {
        let output = match self
            .client()
            .describe_access_entry()
            .cluster_name(cluster_name)
            .principal_arn(principal_arn)
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) => return none_if_not_found(classify("DescribeAccessEntry", e)),
        };
        Ok(output.access_entry().map(|entry| AccessEntry {
            principal_arn: entry.principal_arn().unwrap_or(principal_arn).to_owned(),
            entry_type: entry.r#type().unwrap_or_default().to_owned(),
            username: entry.username().map(str::to_owned),
            kubernetes_groups: entry.kubernetes_groups().to_vec(),
        }))
    }

    async fn delete_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
    ) -> Result<bool, AwsError> {
        match self
            .client()
            .delete_access_entry()
            .cluster_name(cluster_name)
            .principal_arn(principal_arn)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => {
                none_if_not_found(classify("DeleteAccessEntry", e)).map(|_: Option<()>| false)
            }
        }
    }
}

impl InstanceHealth for SdkAutoScaling {
    async fn describe_group_instances(
        &self,
        instance_ids: &[String],
    ) -> Result<Vec<GroupInstance>, AwsError> {
        let mut out = Vec::new();
        for batch in instance_ids.chunks(AUTO_SCALING_BATCH) {
            let instances = self
                .client()
                .describe_auto_scaling_instances()
                .set_instance_ids(Some(batch.to_vec()))
                .max_records(AUTO_SCALING_BATCH as i32)
                .into_paginator()
                .items()
                .send()
                .try_collect()
                .await
                .map_err(|e| classify("DescribeAutoScalingInstances", e))?;
            out.extend(instances.iter().filter_map(|i| {
                Some(GroupInstance {
                    instance_id: i.instance_id()?.to_owned(),
                    auto_scaling_group_name: i.auto_scaling_group_name()?.to_owned(),
                    lifecycle_state: i.lifecycle_state().unwrap_or_default().to_owned(),
                    health_status: i.health_status().unwrap_or_default().to_owned(),
                })
            }));
        }
        Ok(out)
    }

    async fn describe_group_health_settings(
        &self,
        group_names: &[String],
    ) -> Result<Vec<GroupHealthSettings>, AwsError> {
        let mut out = Vec::new();
        for batch in group_names.chunks(AUTO_SCALING_BATCH) {
            let groups = self
                .client()
                .describe_auto_scaling_groups()
                .set_auto_scaling_group_names(Some(batch.to_vec()))
                .into_paginator()
                .items()
                .send()
                .try_collect()
                .await
                .map_err(|e| classify("DescribeAutoScalingGroups", e))?;
            out.extend(groups.iter().filter_map(|group| {
                Some(GroupHealthSettings {
                    name: group.auto_scaling_group_name()?.to_owned(),
                    tags: tags_of(group),
                    health_check_grace_period: Duration::from_secs(
                        group.health_check_grace_period().unwrap_or(0).max(0) as u64,
                    ),
                })
            }));
        }
        Ok(out)
    }

    async fn set_instance_unhealthy(&self, instance_id: &str) -> Result<(), AwsError> {
        self.client()
            .set_instance_health()
            .instance_id(instance_id)
            .health_status("Unhealthy")
            .should_respect_grace_period(true)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| classify("SetInstanceHealth", e))
    }
}

impl SdkInstances {
    /// `visit`s each instance EC2 describes of `instance_ids`, by an `instance-id` filter
    /// (200 ids a call, every page), not `InstanceIds`: an id EC2 no longer knows (terminated
    /// and gone) is then simply absent instead of failing the whole call.
    /// The time `pick` reads of each instance EC2 describes (an instance without one is
    /// absent).
    async fn instance_times(
        &self,
        instance_ids: &[String],
        pick: impl Fn(&aws_sdk_ec2::types::Instance) -> Option<&aws_sdk_ec2::primitives::DateTime>,
    ) -> Result<BTreeMap<String, jiff::Timestamp>, AwsError> {
        let mut times = BTreeMap::new();
        self.each_described_instance(instance_ids, |id, instance| {
            let at = pick(instance)
                .and_then(|at| jiff::Timestamp::new(at.secs(), at.subsec_nanos() as i32).ok());
            if let Some(at) = at {
                times.insert(id.to_owned(), at);
            }
        })
        .await?;
        Ok(times)
    }

    async fn each_described_instance(
        &self,
        instance_ids: &[String],
        mut visit: impl FnMut(&str, &aws_sdk_ec2::types::Instance),
    ) -> Result<(), AwsError> {
        use aws_sdk_ec2::types::Filter;
        for batch in instance_ids.chunks(INSTANCE_FILTER_BATCH) {
            let filter = Filter::builder()
                .name("instance-id")
                .set_values(Some(batch.to_vec()))
                .build();
            let mut reservations = self
                .client()
                .describe_instances()
                .filters(filter)
                .max_results(1000)
                .into_paginator()
                .items()
                .send();
            while let Some(reservation) = reservations
                .try_next()
                .await
                .map_err(|e| classify("DescribeInstances", e))?
            {
                for instance in reservation.instances() {
                    if let Some(id) = instance.instance_id() {
                        visit(id, instance);
                    }
                }
            }
        }
        Ok(())
    }
}

impl RepairInstances for SdkInstances {
    /// By an `instance-id` filter, not `InstanceIds`: an id EC2 no longer knows (terminated
    /// and gone) is then simply absent instead of failing the whole call.
    async fn launch_times(
        &self,
        instance_ids: &[String],
    ) -> Result<BTreeMap<String, jiff::Timestamp>, AwsError> {
        self.instance_times(instance_ids, |instance| instance.launch_time())
            .await
    }

    async fn reboot_instance(&self, instance_id: &str) -> Result<(), AwsError> {
        self.client()
            .reboot_instances()
            .instance_ids(instance_id)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| classify("RebootInstances", e))
    }

    async fn instance_condition(
        &self,
        instance_id: &str,
    ) -> Result<Option<InstanceCondition>, AwsError> {
        let summary = |s: Option<&aws_sdk_ec2::types::InstanceStatusSummary>| {
            s.and_then(|s| s.status()).map(|s| s.as_str().to_owned())
        };
        Ok(self
            .instance_status(instance_id)
            .await?
            .map(|s| InstanceCondition {
                state: s
                    .instance_state()
                    .and_then(|state| state.name())
                    .map(|name| name.as_str().to_owned())
                    .unwrap_or_default(),
                system_status: summary(s.system_status()),
                instance_status: summary(s.instance_status()),
            }))
    }
}

impl RefreshInstances for SdkInstances {
    /// The primary network interface's (device index 0) attach time, which a stop and a
    /// start leave alone; `LaunchTime` when EC2 lists no such interface.
    async fn launch_times(
        &self,
        instance_ids: &[String],
    ) -> Result<BTreeMap<String, jiff::Timestamp>, AwsError> {
        self.instance_times(instance_ids, |instance| {
            let primary = instance
                .network_interfaces()
                .iter()
                .filter_map(|interface| interface.attachment())
                .find(|attachment| attachment.device_index() == Some(0))
                .and_then(|attachment| attachment.attach_time());
            primary.or(instance.launch_time())
        })
        .await
    }

    /// One `DescribeLaunchTemplates` per template (an unknown id or name fails a call that
    /// names it, so each is asked alone and an unknown one is left out).
    async fn launch_template_versions(
        &self,
        templates: &[LaunchTemplateRef],
    ) -> Result<Vec<LaunchTemplateVersions>, AwsError> {
        let mut found = Vec::new();
        for template in templates {
            let request = self.client().describe_launch_templates();
            let request = match (&template.id, &template.name) {
                (Some(id), _) => request.launch_template_ids(id),
                (None, Some(name)) => request.launch_template_names(name),
                (None, None) => continue,
            };
            let output = match request.send().await {
                Ok(output) => output,
                Err(error) => {
                    let error = classify("DescribeLaunchTemplates", error);
                    let unknown = error
                        .code
                        .as_deref()
                        .is_some_and(|c| c.starts_with("InvalidLaunchTemplate"));
                    if unknown {
                        continue;
                    }
                    return Err(error);
                }
            };
            found.extend(output.launch_templates().iter().filter_map(|t| {
                Some(LaunchTemplateVersions {
                    id: t.launch_template_id()?.to_owned(),
                    name: t.launch_template_name().unwrap_or_default().to_owned(),
                    default_version: t.default_version_number()?,
                    latest_version: t.latest_version_number()?,
                })
            }));
        }
        Ok(found)
    }
}

fn launch_template_of(
    spec: Option<&aws_sdk_autoscaling::types::LaunchTemplateSpecification>,
) -> Option<LaunchTemplateRef> {
    spec.map(|t| LaunchTemplateRef {
        id: t.launch_template_id().map(str::to_owned),
        name: t.launch_template_name().map(str::to_owned),
        version: t.version().map(str::to_owned),
    })
}

fn mixed_instances_policy_of(
    policy: Option<&aws_sdk_autoscaling::types::MixedInstancesPolicy>,
) -> Option<MixedInstancesPolicyRef> {
    let template = policy?.launch_template();
    Some(MixedInstancesPolicyRef {
        launch_template: launch_template_of(
            template.and_then(|t| t.launch_template_specification()),
        ),
        overrides: template
            .map(|t| t.overrides())
            .unwrap_or_default()
            .iter()
            .map(|o| TemplateOverride {
                instance_type: o.instance_type().map(str::to_owned),
                launch_template: launch_template_of(o.launch_template_specification()),
            })
            .collect(),
    })
}

fn percentage(value: Option<i32>) -> Option<u32> {
    value.and_then(|v| u32::try_from(v).ok())
}

/// The action's token for a call that names the action, `None` when it is named by its
/// instance alone (Auto Scaling refuses an empty token).
fn token_of(action: &LifecycleActionRef) -> Option<String> {
    (!action.by_instance_only()).then(|| action.token.clone())
}

impl GroupActivity for SdkAutoScaling {
    async fn waiting_terminations(
        &self,
        groups: &GroupQuery,
        topic_arn: &str,
    ) -> Result<Vec<WaitingTermination>, AwsError> {
        let mut waiting = Vec::new();
        for group in self.groups_matching(groups).await? {
            let Some(name) = group.auto_scaling_group_name() else {
                continue;
            };
            let mut instances: Vec<(String, bool)> = group
                .instances()
                .iter()
                .filter(|i| i.lifecycle_state().map(|s| s.as_str()) == Some(TERMINATING_WAIT))
                .filter_map(|i| Some((i.instance_id()?.to_owned(), false)))
                .collect();
            if group.warm_pool_configuration().is_some() {
                let pooled = self.instances_waiting_into_pool(name).await?;
                instances.extend(pooled.into_iter().map(|id| (id, true)));
            }
            if instances.is_empty() {
                continue;
            }
            let account_id = group
                .auto_scaling_group_arn()
                .and_then(|arn| arn.split(':').nth(4))
                .unwrap_or_default();
            for hook in self.terminating_hooks_notifying(name, topic_arn).await? {
                waiting.extend(
                    instances
                        .iter()
                        .map(|(id, into_warm_pool)| WaitingTermination {
                            action: LifecycleActionRef {
                                auto_scaling_group_name: name.to_owned(),
                                lifecycle_hook_name: hook.clone(),
                                instance_id: id.clone(),
                                token: String::new(),
                            },
                            account_id: account_id.to_owned(),
                            into_warm_pool: *into_warm_pool,
                        }),
                );
            }
        }
        Ok(waiting)
    }

    async fn lifecycle_states(
        &self,
        instance_ids: &[String],
    ) -> Result<BTreeMap<String, String>, AwsError> {
        Ok(self
            .describe_group_instances(instance_ids)
            .await?
            .into_iter()
            .map(|i| (i.instance_id, i.lifecycle_state))
            .collect())
    }

    async fn instance_refresh_status(
        &self,
        group_name: &str,
        instance_refresh_id: &str,
    ) -> Result<Option<String>, AwsError> {
        Ok(self
            .describe_instance_refresh(group_name, instance_refresh_id)
            .await?
            .map(|r| r.status))
    }
}

impl SdkAutoScaling {
    /// The groups `query` finds, each once: one `DescribeAutoScalingGroups` (every page) per
    /// tag, and the named ones in batches.
    async fn groups_matching(
        &self,
        query: &GroupQuery,
    ) -> Result<Vec<aws_sdk_autoscaling::types::AutoScalingGroup>, AwsError> {
        use aws_sdk_autoscaling::types::Filter;
        let mut requests: Vec<_> = query
            .tags
            .iter()
            .map(|(key, values)| {
                let filter = if values.is_empty() {
                    Filter::builder().name("tag-key").values(key)
                } else {
                    Filter::builder()
                        .name(format!("tag:{key}"))
                        .set_values(Some(values.clone()))
                };
                self.client()
                    .describe_auto_scaling_groups()
                    .filters(filter.build())
            })
            .collect();
        requests.extend(query.names.chunks(AUTO_SCALING_BATCH).map(|batch| {
            self.client()
                .describe_auto_scaling_groups()
                .set_auto_scaling_group_names(Some(batch.to_vec()))
        }));
        let mut found = BTreeMap::new();
        for request in requests {
            let groups: Vec<_> = request
                .into_paginator()
                .items()
                .send()
                .try_collect()
                .await
                .map_err(|e| classify("DescribeAutoScalingGroups", e))?;
            for group in groups {
                let name = group
                    .auto_scaling_group_name()
                    .unwrap_or_default()
                    .to_owned();
                found.entry(name).or_insert(group);
            }
        }
        Ok(found.into_values().collect())
    }

    /// The instances of `group`'s warm pool waiting for a lifecycle hook on their way in
    /// (`DescribeWarmPool`, every page).
    async fn instances_waiting_into_pool(&self, group: &str) -> Result<Vec<String>, AwsError> {
        let mut found = Vec::new();
        let mut next_token = None;
        loop {
            let page = self
                .client()
                .describe_warm_pool()
                .auto_scaling_group_name(group)
                .set_next_token(next_token)
                .send()
                .await
                .map_err(|e| classify("DescribeWarmPool", e))?;
            found.extend(
                page.instances()
                    .iter()
                    .filter(|i| {
                        i.lifecycle_state().map(|s| s.as_str()) == Some(WARMED_PENDING_WAIT)
                    })
                    .filter_map(|i| i.instance_id().map(str::to_owned)),
            );
            next_token = page.next_token().map(str::to_owned);
            if next_token.is_none() {
                return Ok(found);
            }
        }
    }

    /// `group`'s lifecycle hooks (`DescribeLifecycleHooks`), or only the one named `name`.
    async fn lifecycle_hooks(
        &self,
        group: &str,
        name: Option<&str>,
    ) -> Result<Vec<aws_sdk_autoscaling::types::LifecycleHook>, AwsError> {
        let output = self
            .client()
            .describe_lifecycle_hooks()
            .auto_scaling_group_name(group)
            .set_lifecycle_hook_names(name.map(|n| vec![n.to_owned()]))
            .send()
            .await
            .map_err(|e| classify("DescribeLifecycleHooks", e))?;
        Ok(output.lifecycle_hooks.unwrap_or_default())
    }

    /// The names of `group`'s terminating hooks whose notifications go to `topic_arn`.
    async fn terminating_hooks_notifying(
        &self,
        group: &str,
        topic_arn: &str,
    ) -> Result<Vec<String>, AwsError> {
        Ok(self
            .lifecycle_hooks(group, None)
            .await?
            .iter()
            .filter(|h| h.lifecycle_transition() == Some(LifecycleTransition::Terminating.as_str()))
            .filter(|h| h.notification_target_arn() == Some(topic_arn))
            .filter_map(|h| h.lifecycle_hook_name().map(str::to_owned))
            .collect())
    }

    /// One page of `DescribeInstanceRefreshes` for the group (the refresh `id`, or the
    /// newest ones), read as descriptions. An unknown group is a validation error: none.
    async fn instance_refreshes(
        &self,
        group_name: &str,
        id: Option<&str>,
    ) -> Result<Vec<InstanceRefreshDescription>, AwsError> {
        let answer = self
            .client()
            .describe_instance_refreshes()
            .auto_scaling_group_name(group_name)
            .set_instance_refresh_ids(id.map(|id| vec![id.to_owned()]))
            .send()
            .await;
        let output = match answer {
            Ok(output) => output,
            Err(error) => {
                let error = classify("DescribeInstanceRefreshes", error);
                return if error.kind == AwsErrorKind::Invalid {
                    Ok(Vec::new())
                } else {
                    Err(error)
                };
            }
        };
        Ok(output
            .instance_refreshes()
            .iter()
            .filter_map(|refresh| refresh_description(refresh, group_name))
            .collect())
    }
}

/// What we read of one refresh; `None` without an id.
fn refresh_description(
    refresh: &aws_sdk_autoscaling::types::InstanceRefresh,
    group_name: &str,
) -> Option<InstanceRefreshDescription> {
    let instance_refresh_id = refresh.instance_refresh_id()?;
    let preferences = refresh.preferences();
    Some(InstanceRefreshDescription {
        instance_refresh_id: instance_refresh_id.to_owned(),
        auto_scaling_group_name: refresh
            .auto_scaling_group_name()
            .unwrap_or(group_name)
            .to_owned(),
        status: refresh
            .status()
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default(),
        start_time: refresh
            .start_time()
            .and_then(|at| jiff::Timestamp::new(at.secs(), at.subsec_nanos() as i32).ok()),
        min_healthy_percentage: percentage(preferences.and_then(|p| p.min_healthy_percentage())),
        max_healthy_percentage: percentage(preferences.and_then(|p| p.max_healthy_percentage())),
        skip_matching: preferences.and_then(|p| p.skip_matching()).unwrap_or(false),
        scale_in_protected_instances: preferences
            .and_then(|p| p.scale_in_protected_instances())
            .map(|v| v.as_str().to_owned()),
        standby_instances: preferences
            .and_then(|p| p.standby_instances())
            .map(|v| v.as_str().to_owned()),
        desired_launch_template: launch_template_of(
            refresh
                .desired_configuration()
                .and_then(|c| c.launch_template()),
        ),
        desired_mixed_instances_policy: mixed_instances_policy_of(
            refresh
                .desired_configuration()
                .and_then(|c| c.mixed_instances_policy()),
        ),
    })
}

impl InstanceRefreshes for SdkAutoScaling {
    async fn describe_instance_refresh(
        &self,
        group_name: &str,
        instance_refresh_id: &str,
    ) -> Result<Option<InstanceRefreshDescription>, AwsError> {
        Ok(self
            .instance_refreshes(group_name, Some(instance_refresh_id))
            .await?
            .into_iter()
            .find(|r| r.instance_refresh_id == instance_refresh_id))
    }

    async fn active_instance_refresh(
        &self,
        group_name: &str,
    ) -> Result<Option<InstanceRefreshDescription>, AwsError> {
        // Newest first; a group has at most one refresh that is not over.
        Ok(self
            .instance_refreshes(group_name, None)
            .await?
            .into_iter()
            .find(|r| matches!(r.status.as_str(), "Pending" | "InProgress")))
    }

    async fn describe_group_configuration(
        &self,
        group_name: &str,
    ) -> Result<Option<GroupConfiguration>, AwsError> {
        Ok(self.describe_group(group_name).await?.map(|group| {
            let maintenance = group.instance_maintenance_policy();
            GroupConfiguration {
                name: group_name.to_owned(),
                tags: tags_of(&group),
                desired_capacity: percentage(group.desired_capacity()).unwrap_or(0),
                launch_template: launch_template_of(group.launch_template()).or_else(|| {
                    launch_template_of(
                        group
                            .mixed_instances_policy()
                            .and_then(|m| m.launch_template())
                            .and_then(|t| t.launch_template_specification()),
                    )
                }),
                mixed_instances_policy: mixed_instances_policy_of(group.mixed_instances_policy()),
                maintenance_min_healthy_percentage: percentage(
                    maintenance.and_then(|m| m.min_healthy_percentage()),
                ),
                maintenance_max_healthy_percentage: percentage(
                    maintenance.and_then(|m| m.max_healthy_percentage()),
                ),
                retains_abandoned_instances: retains_abandoned_instances(&group),
                instances: group
                    .instances()
                    .iter()
                    .map(|instance| ConfiguredInstance {
                        instance_id: instance.instance_id().unwrap_or_default().to_owned(),
                        lifecycle_state: instance
                            .lifecycle_state()
                            .map(|s| s.as_str().to_owned())
                            .unwrap_or_default(),
                        instance_type: instance.instance_type().map(str::to_owned),
                        launch_template: launch_template_of(instance.launch_template()),
                        protected_from_scale_in: instance
                            .protected_from_scale_in()
                            .unwrap_or(false),
                    })
                    .collect(),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static BUILT: AtomicUsize = AtomicUsize::new(0);

    fn counted(config: &SdkConfig) -> Option<String> {
        BUILT.fetch_add(1, Ordering::SeqCst);
        config.region().map(|r| r.as_ref().to_owned())
    }

    #[test]
    fn a_client_is_built_on_its_first_use_and_only_once() {
        let config = SdkConfig::builder()
            .region(aws_types::region::Region::new("eu-west-1"))
            .build();
        let lazy = OnFirstUse::new(&config, counted);
        assert_eq!(BUILT.load(Ordering::SeqCst), 0, "nothing built at start-up");
        assert_eq!(lazy.get().as_deref(), Some("eu-west-1"));
        assert_eq!(lazy.get().as_deref(), Some("eu-west-1"));
        assert_eq!(BUILT.load(Ordering::SeqCst), 1);
        assert_eq!(OnFirstUse::ready(Some(7)).get(), &Some(7));
    }
}
