//! The AWS calls the domain makes, as one small trait per capability.
//!
//! Each trait has an SDK adapter (`sdk`) and, with the `fakes` feature (tests only), an
//! in-memory implementation (`in_memory`), so domain logic is tested without I/O and the binaries
//! pick the real one. Errors are folded into [`AwsError`]
//! whose [`AwsErrorKind`] is what a caller acts on (retry, treat as done, give up).

#[cfg(feature = "runtime")]
pub mod http_client;
#[cfg(feature = "runtime")]
pub mod iam;
#[cfg(any(feature = "fakes", all(test, feature = "runtime")))]
pub mod in_memory;
#[cfg(feature = "runtime")]
pub mod load_balancing;
pub mod partition;
#[cfg(feature = "runtime")]
pub mod sdk;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// An AWS call that failed, with the part a caller can act on.
#[derive(Debug, thiserror::Error)]
#[error("{operation} failed ({kind:?}{}): {message}", code.as_deref().map(|c| format!(", {c}")).unwrap_or_default())]
pub struct AwsError {
    /// The API operation, e.g. `CompleteLifecycleAction`.
    pub operation: &'static str,
    pub kind: AwsErrorKind,
    /// The service's error code, when it sent one.
    pub code: Option<String>,
    pub message: String,
}

/// What kind of failure an [`AwsError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwsErrorKind {
    /// The named resource does not exist (`ResourceNotFoundException`, ...).
    NotFound,
    /// It exists already (`ResourceInUseException`).
    AlreadyExists,
    /// Throttled or a 5xx: worth retrying.
    Transient,
    /// Not allowed (`AccessDenied`): fix IAM, retrying will not help.
    AccessDenied,
    /// The request was refused as invalid.
    Invalid,
    /// Could not reach the service or read its answer.
    Transport,
    /// Anything else.
    Other,
}

impl AwsError {
    pub fn new(operation: &'static str, kind: AwsErrorKind, message: impl Into<String>) -> Self {
        Self {
            operation,
            kind,
            code: None,
            message: message.into(),
        }
    }

    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Whether trying the same call again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, AwsErrorKind::Transient | AwsErrorKind::Transport)
    }
}

/// Identifies one pending lifecycle action of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleActionRef {
    pub auto_scaling_group_name: String,
    pub lifecycle_hook_name: String,
    pub instance_id: String,
    /// The `LifecycleActionToken` of the notification (not a credential). Empty for an
    /// action the sweep found waiting after its notification was lost: Auto Scaling lists
    /// no token, so the action is named by its group, hook and instance, which name one
    /// pending action at a time (`CompleteLifecycleAction` and
    /// `RecordLifecycleActionHeartbeat` accept the instance id instead of the token).
    pub token: String,
}

impl LifecycleActionRef {
    /// Whether the action is named by its instance alone (see [`Self::token`]).
    pub fn by_instance_only(&self) -> bool {
        self.token.is_empty()
    }

    /// What names this action in what is remembered per action (a group's scope, a hook's
    /// timings): its token, else its hook and instance.
    pub fn memo_key(&self) -> String {
        if self.by_instance_only() {
            format!("{}/{}", self.lifecycle_hook_name, self.instance_id)
        } else {
            self.token.clone()
        }
    }
}

/// A terminating lifecycle action Auto Scaling lists as waiting (`Terminating:Wait`) for a
/// hook that notifies this stack's topic, as [`GroupActivity::waiting_terminations`] finds
/// it: named by instance (no token), with the account of its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingTermination {
    pub action: LifecycleActionRef,
    /// The account of the group's ARN (what a notification's `AccountId` would say).
    pub account_id: String,
    /// Whether the instance goes back to the group's warm pool (a scale-in with instance
    /// reuse, waiting in `Warmed:Pending:Wait`) rather than out of the group.
    pub into_warm_pool: bool,
}

/// The lifecycle state of an instance whose terminating action waits for its hook.
pub const TERMINATING_WAIT: &str = "Terminating:Wait";
/// The lifecycle state of an instance on its way into the warm pool waiting for a hook.
pub const WARMED_PENDING_WAIT: &str = "Warmed:Pending:Wait";

/// Which groups are the cluster's, as a query: groups carrying one of `tags` (a key with
/// the values it may have; no values: any value), or named in `names`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupQuery {
    pub tags: Vec<(String, Vec<String>)>,
    pub names: Vec<String>,
}

/// The result given to `CompleteLifecycleAction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecycleActionResult {
    Continue,
    Abandon,
}

impl LifecycleActionResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Continue => "CONTINUE",
            Self::Abandon => "ABANDON",
        }
    }

    /// Parses `CONTINUE`/`ABANDON` (case-insensitive).
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_uppercase().as_str() {
            "CONTINUE" => Some(Self::Continue),
            "ABANDON" => Some(Self::Abandon),
            _ => None,
        }
    }
}

/// What `CompleteLifecycleAction` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionOutcome {
    /// This call completed the action.
    Completed,
    /// Auto Scaling had no active action for this instance and token ("No active Lifecycle
    /// Action found"): somebody completed it, or it timed out. Nothing left to do.
    NoActiveAction,
}

/// What a heartbeat did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    Recorded,
    /// The action is gone (completed or expired): stop working on it.
    NoActiveAction,
}

/// A lifecycle hook's timing, as `DescribeLifecycleHooks` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleHook {
    pub name: String,
    pub transition: String,
    pub heartbeat_timeout: Duration,
    pub global_timeout: Duration,
    pub default_result: LifecycleActionResult,
}

/// Auto Scaling: lifecycle actions and the group facts needed to act on them.
pub trait AutoScaling: Send + Sync {
    fn complete_lifecycle_action(
        &self,
        action: &LifecycleActionRef,
        result: LifecycleActionResult,
    ) -> impl Future<Output = Result<CompletionOutcome, AwsError>> + Send;

    fn record_lifecycle_action_heartbeat(
        &self,
        action: &LifecycleActionRef,
    ) -> impl Future<Output = Result<HeartbeatOutcome, AwsError>> + Send;

    /// The hook named `hook_name` of group `group_name`, `None` when it does not exist.
    fn describe_lifecycle_hook(
        &self,
        group_name: &str,
        hook_name: &str,
    ) -> impl Future<Output = Result<Option<LifecycleHook>, AwsError>> + Send;

    /// The group's tags, `None` when the group does not exist.
    fn group_tags(
        &self,
        group_name: &str,
    ) -> impl Future<Output = Result<Option<BTreeMap<String, String>>, AwsError>> + Send;

    /// Whether the group keeps an instance whose terminating lifecycle action ends ABANDON
    /// (`InstanceLifecyclePolicy.RetentionTriggers.TerminateHookAbandon = retain`: the
    /// instance stays in `Terminating:Retained`); `None` when the group does not exist.
    fn retains_abandoned_instances(
        &self,
        group_name: &str,
    ) -> impl Future<Output = Result<Option<bool>, AwsError>> + Send;
}

/// EC2: what the domain needs to know about an instance.
pub trait Instances: Send + Sync {
    /// The instance's private DNS name (the node name on EKS), `None` when the instance is
    /// unknown or has none.
    fn private_dns_name(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<Option<String>, AwsError>> + Send;

    /// The instance's EC2 state name (`pending`, `running`, `stopping`, `stopped`,
    /// `shutting-down`, `terminated`), `None` when EC2 does not know the instance.
    fn instance_state(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<Option<String>, AwsError>> + Send;
}

/// What an instance notice needs to know about its instance (one `DescribeInstances`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceFacts {
    /// The EC2 state name (`running`, `stopping`, ...).
    pub state: Option<String>,
    /// The Auto Scaling group, from the `aws:autoscaling:groupName` tag Auto Scaling puts on
    /// its instances (an `aws:` tag nobody else can set).
    pub auto_scaling_group: Option<String>,
    /// The Spot request of a Spot instance; `None` for an On-Demand one.
    pub spot_request_id: Option<String>,
    /// The private DNS name, which EKS nodes are named after: the node is found without a
    /// second `DescribeInstances`.
    pub private_dns_name: Option<String>,
}

/// A scheduled event of an instance, as `DescribeInstanceStatus` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduledInstanceEvent {
    /// `InstanceEventId` (`instance-event-…`): which event this is, named by the records that
    /// answer it.
    pub id: Option<String>,
    /// `instance-retirement`, `instance-stop`, `instance-reboot`, `system-reboot`,
    /// `system-maintenance`.
    pub code: String,
    /// The earliest time it may start.
    pub not_before: Option<jiff::Timestamp>,
    /// EC2 keeps completed and cancelled events for a while, their descriptions starting
    /// with `[Completed]` or `[Canceled]`: those are not pending.
    pub description: String,
}

impl ScheduledInstanceEvent {
    pub fn is_pending(&self) -> bool {
        !(self.description.starts_with("[Completed]") || self.description.starts_with("[Canceled]"))
    }
}

/// The Spot request status codes of an instance EC2 is about to interrupt (stop, terminate
/// or hibernate).
pub const SPOT_INTERRUPTION_CODES: [&str; 3] = [
    "marked-for-termination",
    "marked-for-stop",
    "marked-for-hibernation",
];

/// Whether a Spot request status code says EC2 is about to interrupt the instance (one of
/// [`SPOT_INTERRUPTION_CODES`]).
pub fn marked_for_interruption(status: &str) -> bool {
    status.starts_with("marked-for-")
}

/// The codes of EC2's scheduled events that drain an instance (what AWS Health's scheduled
/// changes for EC2 announce): a lost Health event is found again by these.
pub const SCHEDULED_EVENT_CODES: [&str; 5] = [
    "instance-reboot",
    "system-reboot",
    "system-maintenance",
    "instance-retirement",
    "instance-stop",
];

/// EC2: what proves an instance notice before the drain it starts.
pub trait InstanceNotices: Send + Sync {
    /// The instance's state, group and Spot request; `None` when EC2 does not know it.
    fn instance_facts(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<Option<InstanceFacts>, AwsError>> + Send;

    /// The status code of a Spot request (`fulfilled`, `marked-for-termination`,
    /// `marked-for-stop`, ...); `None` when EC2 does not know it.
    fn spot_request_status(
        &self,
        spot_request_id: &str,
    ) -> impl Future<Output = Result<Option<String>, AwsError>> + Send;

    /// The instance's scheduled events (`DescribeInstanceStatus`, all states).
    fn scheduled_events(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<Vec<ScheduledInstanceEvent>, AwsError>> + Send;
}

/// How many instance ids one `DescribeInstances` or `DescribeSpotInstanceRequests` call
/// filters by (EC2 takes at most 200 values per filter).
pub const INSTANCE_FILTER_BATCH: usize = 200;
/// How many instance ids one `DescribeInstanceStatus` call takes (at most 100).
pub const INSTANCE_STATUS_BATCH: usize = 100;
/// How many instance ids (or group names) one `DescribeAutoScalingInstances` (or
/// `DescribeAutoScalingGroups`) call takes (the APIs' limits are 50 and 100; one size keeps
/// it simple).
pub const AUTO_SCALING_BATCH: usize = 50;

/// EC2 as the reconciler reads it: the same facts as [`InstanceNotices`], for many instances
/// at once, so that a run costs calls in proportion to the marked nodes, not to the cluster.
/// The defaults ask one instance at a time (what the in-memory fakes need); the SDK adapter
/// batches.
pub trait InstanceNoticesBatch: InstanceNotices {
    /// The facts of each instance EC2 knows; an unknown instance is absent.
    fn instances_facts(
        &self,
        instance_ids: &[String],
    ) -> impl Future<Output = Result<BTreeMap<String, InstanceFacts>, AwsError>> + Send {
        async move {
            let mut out = BTreeMap::new();
            for id in instance_ids {
                if let Some(facts) = self.instance_facts(id).await? {
                    out.insert(id.clone(), facts);
                }
            }
            Ok(out)
        }
    }

    /// The status code of each Spot request named, by request id; an unknown one is absent.
    fn spot_request_statuses(
        &self,
        spot_request_ids: &[String],
    ) -> impl Future<Output = Result<BTreeMap<String, String>, AwsError>> + Send {
        async move {
            let mut out = BTreeMap::new();
            for id in spot_request_ids {
                if let Some(status) = self.spot_request_status(id).await? {
                    out.insert(id.clone(), status);
                }
            }
            Ok(out)
        }
    }

    /// The instances whose Spot request EC2 marks for interruption now
    /// ([`SPOT_INTERRUPTION_CODES`]), account-wide: what a lost interruption warning
    /// announced, found again.
    fn interrupted_spot_instances(
        &self,
    ) -> impl Future<Output = Result<Vec<String>, AwsError>> + Send;

    /// The running instances with a scheduled event of one of [`SCHEDULED_EVENT_CODES`],
    /// account-wide, with their scheduled events (all states): what a lost AWS Health event
    /// announced, found again.
    fn instances_with_scheduled_events(
        &self,
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<ScheduledInstanceEvent>>, AwsError>> + Send;

    /// The scheduled events of each instance (all of them EC2 knows).
    fn scheduled_events_of(
        &self,
        instance_ids: &[String],
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<ScheduledInstanceEvent>>, AwsError>> + Send
    {
        async move {
            let mut out = BTreeMap::new();
            for id in instance_ids {
                out.insert(id.clone(), self.scheduled_events(id).await?);
            }
            Ok(out)
        }
    }
}

/// Auto Scaling as the reconciler reads it: where the marked instances are in their group's
/// lifecycle, and whether the instance refreshes that marked nodes are still running.
pub trait GroupActivity: Send + Sync {
    /// The lifecycle state (`InService`, `Terminating:Wait`, ...) of each instance in a group
    /// (`DescribeAutoScalingInstances`, batched); an instance in no group is absent.
    fn lifecycle_states(
        &self,
        instance_ids: &[String],
    ) -> impl Future<Output = Result<BTreeMap<String, String>, AwsError>> + Send;

    /// The status of instance refresh `instance_refresh_id` of `group_name`
    /// (`DescribeInstanceRefreshes`); `None` when Auto Scaling does not know it.
    fn instance_refresh_status(
        &self,
        group_name: &str,
        instance_refresh_id: &str,
    ) -> impl Future<Output = Result<Option<String>, AwsError>> + Send;

    /// The terminating lifecycle actions waiting in the groups `groups` finds, for their
    /// terminating hooks that notify `topic_arn` (`DescribeAutoScalingGroups` by tag and by
    /// name, every page; `DescribeWarmPool` of each group with a warm pool;
    /// `DescribeLifecycleHooks` of each group with an instance in `Terminating:Wait`, or in
    /// `Warmed:Pending:Wait` in its pool: a scale-in back to the pool, or a launch into it,
    /// which the drain's proof tells apart, its heartbeat naming the terminating hook).
    fn waiting_terminations(
        &self,
        groups: &GroupQuery,
        topic_arn: &str,
    ) -> impl Future<Output = Result<Vec<WaitingTermination>, AwsError>> + Send;
}

/// The EC2 states in which an instance still holds (or will again hold) its instance
/// profile's credentials: everything but `shutting-down` and `terminated`.
pub const LIVE_INSTANCE_STATES: [&str; 4] = ["pending", "running", "stopping", "stopped"];

/// EC2: which instances of a cluster run with given instance profiles.
pub trait InstancesByProfile: Send + Sync {
    /// Ids of the instances in a [`LIVE_INSTANCE_STATES`] state, tagged for `cluster_name`
    /// (`eks:cluster-name` = the cluster, or a `kubernetes.io/cluster/<cluster>` tag key), whose
    /// instance profile is one of `instance_profile_arns`; at most `limit` of them.
    fn live_cluster_instances_with_profiles(
        &self,
        cluster_name: &str,
        instance_profile_arns: &[String],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>, AwsError>> + Send;
}

/// IAM: the instance profiles that carry a role.
pub trait InstanceProfiles: Send + Sync {
    /// The ARNs of the instance profiles that contain the role `role_name` (all pages);
    /// empty when the role does not exist (`NoSuchEntity`).
    fn instance_profiles_for_role(
        &self,
        role_name: &str,
    ) -> impl Future<Output = Result<Vec<String>, AwsError>> + Send;
}

/// A load balancer of the cluster that may route to an instance: a target group with instance
/// targets (Elastic Load Balancing v2) or a classic load balancer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum LoadBalancerRef {
    /// The target group's ARN.
    TargetGroup(String),
    /// The classic load balancer's name.
    Classic(String),
}

impl std::fmt::Display for LoadBalancerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // `targetgroup/<name>/<id>`: the part of the ARN a person recognises.
            Self::TargetGroup(arn) => {
                let short = arn.find("targetgroup/").map_or(arn.as_str(), |i| &arn[i..]);
                write!(f, "target group {short}")
            }
            Self::Classic(name) => write!(f, "classic load balancer {name}"),
        }
    }
}

/// How a load balancer stands towards one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceRouting {
    /// Registered and not (yet) deregistered: new connections may still come.
    Registered,
    /// Deregistered, its connections draining (target `draining`, classic `InService` with
    /// "Instance deregistration currently in progress").
    Draining,
    /// Neither: not registered, its draining over, or the load balancer gone.
    NotRouted,
}

/// A future of the [`LoadBalancers`] trait, boxed so that the trait stays dyn-compatible.
pub type AwsFuture<'a, T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, AwsError>> + Send + 'a>>;

/// Elastic Load Balancing (v2 and classic): which of the cluster's load balancers route to an
/// instance, and until when. Dyn-compatible: only the drain uses it, so it is held as a
/// trait object instead of joining the client types every hook shares.
pub trait LoadBalancers: Send + Sync {
    /// The cluster's target groups with instance targets and its classic load balancers: those
    /// tagged `elbv2.k8s.aws/cluster` = the cluster (AWS Load Balancer Controller) or with a
    /// `kubernetes.io/cluster/<cluster>` tag key (the Kubernetes service controller).
    fn cluster_load_balancers<'a>(
        &'a self,
        cluster_name: &'a str,
    ) -> AwsFuture<'a, Vec<LoadBalancerRef>>;

    /// How `load_balancer` stands towards `instance_id` now.
    fn routing<'a>(
        &'a self,
        load_balancer: &'a LoadBalancerRef,
        instance_id: &'a str,
    ) -> AwsFuture<'a, InstanceRouting>;

    /// How long `load_balancer` lets a deregistered instance's connections drain (the target
    /// group's `deregistration_delay.timeout_seconds`, the classic load balancer's connection
    /// draining timeout; zero when draining is off).
    fn deregistration_delay<'a>(
        &'a self,
        load_balancer: &'a LoadBalancerRef,
    ) -> AwsFuture<'a, Duration>;
}

/// The tag the AWS Load Balancer Controller puts on what it creates, valued with the cluster.
pub const LOAD_BALANCER_CONTROLLER_CLUSTER_TAG: &str = "elbv2.k8s.aws/cluster";

/// Whether the tags (key, value) of a load balancer or target group say it is `cluster`'s.
pub fn tagged_for_cluster<'t>(
    cluster: &str,
    mut tags: impl Iterator<Item = (&'t str, &'t str)>,
) -> bool {
    let owned_key = format!("kubernetes.io/cluster/{cluster}");
    tags.any(|(key, value)| {
        key == owned_key || (key == LOAD_BALANCER_CONTROLLER_CLUSTER_TAG && value == cluster)
    })
}

/// SNS: hand a notification to a fresh invocation by publishing it again.
pub trait Notifications: Send + Sync {
    fn publish(
        &self,
        topic_arn: &str,
        subject: Option<&str>,
        message: &str,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;
}

/// The cluster's authentication mode (`accessConfig.authenticationMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthenticationMode {
    ConfigMap,
    ApiAndConfigMap,
    Api,
}

impl AuthenticationMode {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "CONFIG_MAP" => Some(Self::ConfigMap),
            "API_AND_CONFIG_MAP" => Some(Self::ApiAndConfigMap),
            "API" => Some(Self::Api),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigMap => "CONFIG_MAP",
            Self::ApiAndConfigMap => "API_AND_CONFIG_MAP",
            Self::Api => "API",
        }
    }
}

/// What `DescribeCluster` says about the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDescription {
    pub name: String,
    pub arn: String,
    /// `https://...` API server endpoint.
    pub endpoint: String,
    /// `certificateAuthority.data`: base64 of the PEM bundle, exactly as EKS returns it.
    pub certificate_authority_data: String,
    /// Clusters created before access entries existed report no `accessConfig`: `ConfigMap`.
    pub authentication_mode: AuthenticationMode,
}

/// What `DescribeNodegroup` says about a node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodegroupDescription {
    pub cluster_name: String,
    pub nodegroup_name: String,
    pub node_role: String,
    /// e.g. `AL2_x86_64`, `WINDOWS_CORE_2022_x86_64`, `CUSTOM`.
    pub ami_type: String,
    pub status: String,
}

/// An EKS access entry's type for node roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessEntryType {
    Ec2Linux,
    Ec2Windows,
}

impl AccessEntryType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ec2Linux => "EC2_LINUX",
            Self::Ec2Windows => "EC2_WINDOWS",
        }
    }
}

/// An access entry as `DescribeAccessEntry` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessEntry {
    pub principal_arn: String,
    /// `STANDARD`, `EC2_LINUX`, `EC2_WINDOWS`, ...
    pub entry_type: String,
    pub username: Option<String>,
    pub kubernetes_groups: Vec<String>,
}

/// What `CreateAccessEntry` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessEntryCreation {
    Created,
    /// `ResourceInUseException`: an entry for that principal exists already.
    AlreadyExists,
}

/// EKS: clusters, node groups and access entries.
pub trait Eks: Send + Sync {
    /// `None` when the cluster does not exist.
    fn describe_cluster(
        &self,
        cluster_name: &str,
    ) -> impl Future<Output = Result<Option<ClusterDescription>, AwsError>> + Send;

    /// `None` when the node group does not exist (any more).
    fn describe_nodegroup(
        &self,
        cluster_name: &str,
        nodegroup_name: &str,
    ) -> impl Future<Output = Result<Option<NodegroupDescription>, AwsError>> + Send;

    /// Every node group name of the cluster (all pages).
    fn list_nodegroups(
        &self,
        cluster_name: &str,
    ) -> impl Future<Output = Result<Vec<String>, AwsError>> + Send;

    fn create_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
        entry_type: AccessEntryType,
    ) -> impl Future<Output = Result<AccessEntryCreation, AwsError>> + Send;

    /// `None` when there is no entry for the principal.
    fn describe_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
    ) -> impl Future<Output = Result<Option<AccessEntry>, AwsError>> + Send;

    /// `false` when there was no entry to delete.
    fn delete_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
    ) -> impl Future<Output = Result<bool, AwsError>> + Send;
}

/// An instance as `DescribeAutoScalingInstances` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInstance {
    pub instance_id: String,
    pub auto_scaling_group_name: String,
    /// `InService`, `Pending:Wait`, `Terminating:Wait`, ...
    pub lifecycle_state: String,
    /// `HEALTHY` or `UNHEALTHY` (the API's spelling; compare case-insensitively).
    pub health_status: String,
}

/// What node repair needs to know about an Auto Scaling group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupHealthSettings {
    pub name: String,
    pub tags: BTreeMap<String, String>,
    /// `HealthCheckGracePeriod`: a new instance is not replaced for being unhealthy before it.
    pub health_check_grace_period: Duration,
}

/// Auto Scaling as node repair uses it: which group an instance is in, and marking one
/// unhealthy so the group replaces it through its lifecycle hooks.
pub trait InstanceHealth: Send + Sync {
    /// The group membership of `instance_ids` (batched and paged by the adapter); an
    /// instance in no group is absent from the answer.
    fn describe_group_instances(
        &self,
        instance_ids: &[String],
    ) -> impl Future<Output = Result<Vec<GroupInstance>, AwsError>> + Send;

    /// Tags and health-check grace period of the named groups (batched and paged); a group
    /// that does not exist is absent.
    fn describe_group_health_settings(
        &self,
        group_names: &[String],
    ) -> impl Future<Output = Result<Vec<GroupHealthSettings>, AwsError>> + Send;

    /// `SetInstanceHealth Unhealthy` respecting the group's grace period: Auto Scaling then
    /// terminates the instance (through its terminate hook) and launches a replacement.
    fn set_instance_unhealthy(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;
}

/// What EC2 says of an instance's health (`DescribeInstanceStatus` with all instances).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceCondition {
    /// `running`, `stopped`, ...
    pub state: String,
    /// The system status check (AWS's side: host, network, power): `ok`, `impaired`, ...
    pub system_status: Option<String>,
    /// The instance status check (reachability of the operating system).
    pub instance_status: Option<String>,
}

impl InstanceCondition {
    /// Why the instance cannot be running the node's workloads any more, if EC2 shows it:
    /// stopped (or on its way to), or a status check failed (unreachable). `None` for a
    /// running instance whose checks pass or are not known yet.
    pub fn down_because(&self) -> Option<String> {
        if matches!(
            self.state.as_str(),
            "stopping" | "stopped" | "shutting-down" | "terminated"
        ) {
            return Some(format!("EC2 shows it {}", self.state));
        }
        let impaired = |status: &Option<String>| status.as_deref() == Some("impaired");
        match (
            impaired(&self.system_status),
            impaired(&self.instance_status),
        ) {
            (true, _) => Some("its system status check is impaired".to_owned()),
            (false, true) => Some("its instance status check is impaired (unreachable)".to_owned()),
            (false, false) => None,
        }
    }
}

/// EC2 as node repair uses it: when instances last started, whether they are down, and
/// reboots (its lighter action).
pub trait RepairInstances: Send + Sync {
    /// Each instance's `LaunchTime`, which EC2 moves forward whenever a stopped instance
    /// starts again (a return from a stopped warm pool). An instance EC2 does not know is
    /// absent from the answer.
    fn launch_times(
        &self,
        instance_ids: &[String],
    ) -> impl Future<Output = Result<BTreeMap<String, jiff::Timestamp>, AwsError>> + Send;

    fn reboot_instance(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;

    /// The instance's state and status checks; `None` when EC2 does not know it.
    fn instance_condition(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<Option<InstanceCondition>, AwsError>> + Send;
}

/// A launch template as a group, an instance or an instance refresh names it. Auto Scaling
/// gives the id, the name or both; the version as set (`$Latest`, `$Default` or a number).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchTemplateRef {
    pub id: Option<String>,
    pub name: Option<String>,
    pub version: Option<String>,
}

/// One override of a mixed instances policy: an instance type and, optionally, the launch
/// template instances of that type launch with instead of the policy's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateOverride {
    pub instance_type: Option<String>,
    pub launch_template: Option<LaunchTemplateRef>,
}

/// A `MixedInstancesPolicy` as far as it decides what an instance is launched with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MixedInstancesPolicyRef {
    pub launch_template: Option<LaunchTemplateRef>,
    pub overrides: Vec<TemplateOverride>,
}

/// An instance refresh as `DescribeInstanceRefreshes` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceRefreshDescription {
    pub instance_refresh_id: String,
    pub auto_scaling_group_name: String,
    /// `Pending`, `InProgress`, `Successful`, `Failed`, `Cancelling`, `Cancelled`,
    /// `RollbackInProgress`, `RollbackFailed`, `RollbackSuccessful`, `Baking`.
    pub status: String,
    /// `StartTime`: instances launched since are the refresh's own replacements.
    pub start_time: Option<jiff::Timestamp>,
    pub min_healthy_percentage: Option<u32>,
    pub max_healthy_percentage: Option<u32>,
    /// `Preferences.SkipMatching` (false when absent, as Auto Scaling's default).
    pub skip_matching: bool,
    /// `Preferences.ScaleInProtectedInstances` (`Refresh`, `Ignore`, `Wait`); `None`: Auto
    /// Scaling's default, `Ignore`.
    pub scale_in_protected_instances: Option<String>,
    /// `Preferences.StandbyInstances` (`Terminate`, `Ignore`, `Wait`); `None`: `Ignore`.
    pub standby_instances: Option<String>,
    /// `DesiredConfiguration.LaunchTemplate`.
    pub desired_launch_template: Option<LaunchTemplateRef>,
    /// `DesiredConfiguration.MixedInstancesPolicy`. Neither: the group's own configuration.
    pub desired_mixed_instances_policy: Option<MixedInstancesPolicyRef>,
}

/// One instance of a group with the configuration it was launched with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfiguredInstance {
    pub instance_id: String,
    pub lifecycle_state: String,
    pub instance_type: Option<String>,
    pub launch_template: Option<LaunchTemplateRef>,
    /// `ProtectedFromScaleIn`.
    pub protected_from_scale_in: bool,
}

/// What `DescribeAutoScalingGroups` says about a group's configuration and its instances.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupConfiguration {
    pub name: String,
    pub tags: BTreeMap<String, String>,
    pub desired_capacity: u32,
    /// The group's `LaunchTemplate`, else its mixed instances policy's.
    pub launch_template: Option<LaunchTemplateRef>,
    pub mixed_instances_policy: Option<MixedInstancesPolicyRef>,
    /// `InstanceMaintenancePolicy`: what a refresh without its own preferences uses.
    pub maintenance_min_healthy_percentage: Option<u32>,
    pub maintenance_max_healthy_percentage: Option<u32>,
    /// `InstanceLifecyclePolicy.RetentionTriggers.TerminateHookAbandon = retain`: an
    /// instance whose terminating action ends ABANDON is kept (`Terminating:Retained`).
    pub retains_abandoned_instances: bool,
    pub instances: Vec<ConfiguredInstance>,
}

/// A launch template's version numbers, as `DescribeLaunchTemplates` reports them: what
/// `$Default` and `$Latest` stand for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchTemplateVersions {
    pub id: String,
    pub name: String,
    pub default_version: i64,
    pub latest_version: i64,
}

/// EC2 as the instance refresh handler reads it: when instances were launched, and what a
/// launch template's symbolic versions stand for.
pub trait RefreshInstances: Send + Sync {
    /// When each instance was first launched; an instance EC2 does not know is absent. Not
    /// `LaunchTime`, which a stop and a start move forward (a return from a stopped warm
    /// pool, an instance stopped and started again): Auto Scaling still replaces such an
    /// instance, launched before the refresh started.
    fn launch_times(
        &self,
        instance_ids: &[String],
    ) -> impl Future<Output = Result<BTreeMap<String, jiff::Timestamp>, AwsError>> + Send;

    /// The templates named (by id or by name); a template EC2 does not know is absent.
    fn launch_template_versions(
        &self,
        templates: &[LaunchTemplateRef],
    ) -> impl Future<Output = Result<Vec<LaunchTemplateVersions>, AwsError>> + Send;
}

/// Auto Scaling as the instance refresh handler reads it.
pub trait InstanceRefreshes: Send + Sync {
    /// The refresh `instance_refresh_id` of `group_name`; `None` when Auto Scaling does not
    /// know it (or the group).
    fn describe_instance_refresh(
        &self,
        group_name: &str,
        instance_refresh_id: &str,
    ) -> impl Future<Output = Result<Option<InstanceRefreshDescription>, AwsError>> + Send;

    /// The group's refresh that is `Pending` or `InProgress`, if any (the same
    /// `DescribeInstanceRefreshes`, without an id: the newest refreshes first).
    fn active_instance_refresh(
        &self,
        group_name: &str,
    ) -> impl Future<Output = Result<Option<InstanceRefreshDescription>, AwsError>> + Send;

    /// The group's configuration and instances; `None` when the group does not exist.
    fn describe_group_configuration(
        &self,
        group_name: &str,
    ) -> impl Future<Output = Result<Option<GroupConfiguration>, AwsError>> + Send;
}
