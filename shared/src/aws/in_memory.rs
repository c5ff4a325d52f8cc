//! In-memory implementations of the AWS traits, for fast domain tests.
//!
//! They keep just enough state to behave like the service (a completed lifecycle action is
//! gone; an access entry exists once) and record every call so tests can assert on them.
//! Faults are injected per operation with [`InMemoryFaults`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::*;
use crate::lifecycle::notification::LifecycleTransition;

/// Errors queued per operation name; each call pops one before doing anything.
#[derive(Debug, Default, Clone)]
pub struct InMemoryFaults {
    queued: Arc<Mutex<HashMap<&'static str, VecDeque<AwsErrorKind>>>>,
}

impl InMemoryFaults {
    /// The next `times` calls of `operation` fail with `kind`.
    pub fn fail(&self, operation: &'static str, kind: AwsErrorKind, times: usize) {
        let mut queued = lock(&self.queued);
        let queue = queued.entry(operation).or_default();
        queue.extend(std::iter::repeat_n(kind, times));
    }

    /// Forgets every fault still queued (a brownout is over).
    pub fn clear(&self) {
        lock(&self.queued).clear();
    }

    fn take(&self, operation: &'static str) -> Result<(), AwsError> {
        match lock(&self.queued)
            .get_mut(operation)
            .and_then(VecDeque::pop_front)
        {
            Some(kind) => Err(AwsError::new(operation, kind, "injected fault")),
            None => Ok(()),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another test thread must not hide this test's own result.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A completion as the fake recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCompletion {
    pub action: LifecycleActionRef,
    pub result: LifecycleActionResult,
}

#[derive(Debug, Default)]
struct AutoScalingState {
    /// (group, hook, instance) -> token of the pending action.
    pending: HashMap<(String, String, String), String>,
    hooks: HashMap<(String, String), LifecycleHook>,
    tags: HashMap<String, BTreeMap<String, String>>,
    /// Groups that keep instances whose terminating action ends ABANDON.
    retaining: std::collections::HashSet<String>,
    completions: Vec<RecordedCompletion>,
    heartbeats: Vec<LifecycleActionRef>,
    /// instance -> lifecycle state, as `DescribeAutoScalingInstances` reports it.
    lifecycle_states: BTreeMap<String, String>,
    /// (group, refresh id) -> status, as `DescribeInstanceRefreshes` reports it.
    refresh_statuses: BTreeMap<(String, String), String>,
    /// (group, hook) -> the topic the hook notifies (`NotificationTargetARN`).
    hook_targets: HashMap<(String, String), String>,
}

/// The account of every group of the in-memory Auto Scaling (what its ARN would say).
pub const IN_MEMORY_ACCOUNT: &str = "111111111111";

/// Auto Scaling with pending lifecycle actions, hooks and group tags.
#[derive(Debug, Default, Clone)]
pub struct InMemoryAutoScaling {
    state: Arc<Mutex<AutoScalingState>>,
    pub faults: InMemoryFaults,
}

impl InMemoryAutoScaling {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_group(&self, group: &str, tags: &[(&str, &str)]) {
        lock(&self.state).tags.insert(
            group.to_owned(),
            tags.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
    }

    /// Sets whether `group` (added with [`Self::add_group`]) retains instances whose
    /// terminating lifecycle action ends ABANDON (its instance lifecycle policy).
    pub fn set_retains_abandoned_instances(&self, group: &str, retains: bool) {
        let mut state = lock(&self.state);
        if retains {
            state.retaining.insert(group.to_owned());
        } else {
            state.retaining.remove(group);
        }
    }

    pub fn add_hook(&self, group: &str, hook: LifecycleHook) {
        lock(&self.state)
            .hooks
            .insert((group.to_owned(), hook.name.clone()), hook);
    }

    /// Makes `group`'s hook `hook` notify `topic_arn` (its `NotificationTargetARN`).
    pub fn set_hook_target(&self, group: &str, hook: &str, topic_arn: &str) {
        lock(&self.state)
            .hook_targets
            .insert((group.to_owned(), hook.to_owned()), topic_arn.to_owned());
    }

    /// Makes `action` pending, as Auto Scaling does when it sends the notification.
    pub fn start_action(&self, action: &LifecycleActionRef) {
        lock(&self.state)
            .pending
            .insert(key(action), action.token.clone());
    }

    /// Ends `action` as its hook's timeout does: no completion recorded, nothing pending.
    pub fn time_out_action(&self, action: &LifecycleActionRef) {
        lock(&self.state).pending.remove(&key(action));
    }

    pub fn completions(&self) -> Vec<RecordedCompletion> {
        lock(&self.state).completions.clone()
    }

    pub fn heartbeats(&self) -> Vec<LifecycleActionRef> {
        lock(&self.state).heartbeats.clone()
    }

    pub fn is_pending(&self, action: &LifecycleActionRef) -> bool {
        lock(&self.state).pending.contains_key(&key(action))
    }

    /// Puts `instance_id` in its group's `state` (`InService`, `Terminating:Wait`, ...).
    pub fn set_lifecycle_state(&self, instance_id: &str, state: &str) {
        lock(&self.state)
            .lifecycle_states
            .insert(instance_id.to_owned(), state.to_owned());
    }

    /// Sets the status `DescribeInstanceRefreshes` reports for a refresh of `group`.
    pub fn set_refresh_status(&self, group: &str, refresh_id: &str, status: &str) {
        lock(&self.state)
            .refresh_statuses
            .insert((group.to_owned(), refresh_id.to_owned()), status.to_owned());
    }
}

impl GroupActivity for InMemoryAutoScaling {
    async fn lifecycle_states(
        &self,
        instance_ids: &[String],
    ) -> Result<BTreeMap<String, String>, AwsError> {
        self.faults.take("DescribeAutoScalingInstances")?;
        let state = lock(&self.state);
        Ok(instance_ids
            .iter()
            .filter_map(|id| Some((id.clone(), state.lifecycle_states.get(id)?.clone())))
            .collect())
    }

    async fn instance_refresh_status(
        &self,
        group_name: &str,
        instance_refresh_id: &str,
    ) -> Result<Option<String>, AwsError> {
        self.faults.take("DescribeInstanceRefreshes")?;
        Ok(lock(&self.state)
            .refresh_statuses
            .get(&(group_name.to_owned(), instance_refresh_id.to_owned()))
            .cloned())
    }

    /// The pending actions of terminating hooks that notify `topic_arn`, in groups `groups`
    /// finds (a pending action is one waiting for its hook); into the warm pool when the
    /// instance's state set by [`Self::set_lifecycle_state`] is `Warmed:Pending:Wait`.
    async fn waiting_terminations(
        &self,
        groups: &GroupQuery,
        topic_arn: &str,
    ) -> Result<Vec<WaitingTermination>, AwsError> {
        self.faults.take("DescribeAutoScalingGroups")?;
        let state = lock(&self.state);
        let mut waiting: Vec<WaitingTermination> = state
            .pending
            .keys()
            .filter(|(group, hook, _)| {
                let ours = state.tags.get(group).is_some_and(|tags| {
                    groups.names.contains(group) || matches_any_tag(tags, &groups.tags)
                });
                let terminating = state
                    .hooks
                    .get(&(group.clone(), hook.clone()))
                    .is_some_and(|h| h.transition == LifecycleTransition::Terminating.as_str());
                let target = state.hook_targets.get(&(group.clone(), hook.clone()));
                ours && terminating && target.is_some_and(|t| t == topic_arn)
            })
            .map(|(group, hook, instance)| WaitingTermination {
                action: LifecycleActionRef {
                    auto_scaling_group_name: group.clone(),
                    lifecycle_hook_name: hook.clone(),
                    instance_id: instance.clone(),
                    token: String::new(),
                },
                account_id: IN_MEMORY_ACCOUNT.to_owned(),
                into_warm_pool: state
                    .lifecycle_states
                    .get(instance)
                    .is_some_and(|s| s == WARMED_PENDING_WAIT),
            })
            .collect();
        waiting.sort_by(|a, b| a.action.instance_id.cmp(&b.action.instance_id));
        Ok(waiting)
    }
}

/// Whether `tags` carry one of `wanted` (a key with one of its values; no values: any).
fn matches_any_tag(tags: &BTreeMap<String, String>, wanted: &[(String, Vec<String>)]) -> bool {
    wanted.iter().any(|(key, values)| {
        tags.get(key)
            .is_some_and(|v| values.is_empty() || values.contains(v))
    })
}

/// Whether `action` names the pending action of its group, hook and instance whose token is
/// `pending_token`: by that token, or by the instance alone (no token).
fn names_pending(action: &LifecycleActionRef, pending_token: &str) -> bool {
    action.by_instance_only() || action.token == pending_token
}

fn key(action: &LifecycleActionRef) -> (String, String, String) {
    (
        action.auto_scaling_group_name.clone(),
        action.lifecycle_hook_name.clone(),
        action.instance_id.clone(),
    )
}

impl AutoScaling for InMemoryAutoScaling {
    async fn complete_lifecycle_action(
        &self,
        action: &LifecycleActionRef,
        result: LifecycleActionResult,
    ) -> Result<CompletionOutcome, AwsError> {
        self.faults.take("CompleteLifecycleAction")?;
        let mut state = lock(&self.state);
        match state.pending.get(&key(action)) {
            Some(token) if names_pending(action, token) => {
                state.pending.remove(&key(action));
                state.completions.push(RecordedCompletion {
                    action: action.clone(),
                    result,
                });
                Ok(CompletionOutcome::Completed)
            }
            _ => Ok(CompletionOutcome::NoActiveAction),
        }
    }

    async fn record_lifecycle_action_heartbeat(
        &self,
        action: &LifecycleActionRef,
    ) -> Result<HeartbeatOutcome, AwsError> {
        self.faults.take("RecordLifecycleActionHeartbeat")?;
        let mut state = lock(&self.state);
        match state.pending.get(&key(action)) {
            Some(token) if names_pending(action, token) => {
                state.heartbeats.push(action.clone());
                Ok(HeartbeatOutcome::Recorded)
            }
            _ => Ok(HeartbeatOutcome::NoActiveAction),
        }
    }

    async fn describe_lifecycle_hook(
        &self,
        group_name: &str,
        hook_name: &str,
    ) -> Result<Option<LifecycleHook>, AwsError> {
        self.faults.take("DescribeLifecycleHooks")?;
        Ok(lock(&self.state)
            .hooks
            .get(&(group_name.to_owned(), hook_name.to_owned()))
            .cloned())
    }

    async fn group_tags(
        &self,
        group_name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, AwsError> {
        self.faults.take("DescribeAutoScalingGroups")?;
        Ok(lock(&self.state).tags.get(group_name).cloned())
    }

    async fn retains_abandoned_instances(
        &self,
        group_name: &str,
    ) -> Result<Option<bool>, AwsError> {
        self.faults.take("DescribeAutoScalingGroups")?;
        let state = lock(&self.state);
        Ok(state
            .tags
            .contains_key(group_name)
            .then(|| state.retaining.contains(group_name)))
    }
}

/// An instance's instance profile ARN and tags.
type ProfiledInstance = (String, BTreeMap<String, String>);

/// EC2 instances, their private DNS names and states.
#[derive(Debug, Default, Clone)]
pub struct InMemoryInstances {
    names: Arc<Mutex<HashMap<String, String>>>,
    /// States set by a test; an added instance without one is `running`.
    states: Arc<Mutex<HashMap<String, String>>>,
    /// Instance id → (instance profile ARN, tags), for instances added with a profile.
    profiles: Arc<Mutex<BTreeMap<String, ProfiledInstance>>>,
    /// What instance notices are proven with.
    pub notices: InMemoryInstanceNotices,
    pub faults: InMemoryFaults,
}

impl InMemoryInstances {
    pub fn add(&self, instance_id: &str, private_dns_name: &str) {
        lock(&self.names).insert(instance_id.to_owned(), private_dns_name.to_owned());
    }

    /// Sets the EC2 state name of an instance (`pending`, `running`, `stopped`, ...).
    pub fn set_state(&self, instance_id: &str, state: &str) {
        lock(&self.states).insert(instance_id.to_owned(), state.to_owned());
    }

    /// Gives an instance an instance profile and tags (it is added if unknown).
    pub fn set_profile(
        &self,
        instance_id: &str,
        instance_profile_arn: &str,
        tags: &[(&str, &str)],
    ) {
        lock(&self.names)
            .entry(instance_id.to_owned())
            .or_insert_with(|| format!("{instance_id}.ec2.internal"));
        let tags = tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        lock(&self.profiles).insert(
            instance_id.to_owned(),
            (instance_profile_arn.to_owned(), tags),
        );
    }
}

impl InstancesByProfile for InMemoryInstances {
    async fn live_cluster_instances_with_profiles(
        &self,
        cluster_name: &str,
        instance_profile_arns: &[String],
        limit: usize,
    ) -> Result<Vec<String>, AwsError> {
        self.faults.take("DescribeInstances")?;
        let states = lock(&self.states);
        let cluster_tag = format!("kubernetes.io/cluster/{cluster_name}");
        Ok(lock(&self.profiles)
            .iter()
            .filter(|(id, (profile, tags))| {
                let state = states.get(*id).map_or("running", String::as_str);
                LIVE_INSTANCE_STATES.contains(&state)
                    && instance_profile_arns.contains(profile)
                    && (tags.get("eks:cluster-name").map(String::as_str) == Some(cluster_name)
                        || tags.contains_key(&cluster_tag))
            })
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect())
    }
}

/// IAM instance profiles per role.
#[derive(Debug, Default, Clone)]
pub struct InMemoryInstanceProfiles {
    by_role: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    pub faults: InMemoryFaults,
}

impl InMemoryInstanceProfiles {
    /// Puts role `role_name` into the instance profile `instance_profile_arn`.
    pub fn add(&self, role_name: &str, instance_profile_arn: &str) {
        lock(&self.by_role)
            .entry(role_name.to_owned())
            .or_default()
            .push(instance_profile_arn.to_owned());
    }
}

impl InstanceProfiles for InMemoryInstanceProfiles {
    async fn instance_profiles_for_role(&self, role_name: &str) -> Result<Vec<String>, AwsError> {
        self.faults.take("ListInstanceProfilesForRole")?;
        Ok(lock(&self.by_role)
            .get(role_name)
            .cloned()
            .unwrap_or_default())
    }
}

impl Instances for InMemoryInstances {
    async fn private_dns_name(&self, instance_id: &str) -> Result<Option<String>, AwsError> {
        self.faults.take("DescribeInstances")?;
        Ok(lock(&self.names).get(instance_id).cloned())
    }

    async fn instance_state(&self, instance_id: &str) -> Result<Option<String>, AwsError> {
        self.faults.take("DescribeInstances")?;
        if let Some(state) = lock(&self.states).get(instance_id) {
            return Ok(Some(state.clone()));
        }
        Ok(lock(&self.names)
            .contains_key(instance_id)
            .then(|| "running".to_owned()))
    }
}

/// EC2's answers about instance notices, as a test sets them.
#[derive(Debug, Default, Clone)]
pub struct InMemoryInstanceNotices {
    facts: Arc<Mutex<HashMap<String, InstanceFacts>>>,
    spot_statuses: Arc<Mutex<HashMap<String, String>>>,
    scheduled: Arc<Mutex<HashMap<String, Vec<ScheduledInstanceEvent>>>>,
    pub faults: InMemoryFaults,
}

impl InMemoryInstanceNotices {
    pub fn set_facts(&self, instance_id: &str, facts: InstanceFacts) {
        lock(&self.facts).insert(instance_id.to_owned(), facts);
    }

    pub fn set_spot_status(&self, spot_request_id: &str, code: &str) {
        lock(&self.spot_statuses).insert(spot_request_id.to_owned(), code.to_owned());
    }

    /// Replaces the instance's scheduled events (EC2 cancelled, completed or moved them).
    pub fn set_schedule(&self, instance_id: &str, events: Vec<ScheduledInstanceEvent>) {
        lock(&self.scheduled).insert(instance_id.to_owned(), events);
    }

    pub fn schedule(&self, instance_id: &str, event: ScheduledInstanceEvent) {
        lock(&self.scheduled)
            .entry(instance_id.to_owned())
            .or_default()
            .push(event);
    }
}

impl InstanceNotices for InMemoryInstanceNotices {
    async fn instance_facts(&self, instance_id: &str) -> Result<Option<InstanceFacts>, AwsError> {
        self.faults.take("DescribeInstances")?;
        Ok(lock(&self.facts).get(instance_id).cloned())
    }

    async fn spot_request_status(&self, spot_request_id: &str) -> Result<Option<String>, AwsError> {
        self.faults.take("DescribeSpotInstanceRequests")?;
        Ok(lock(&self.spot_statuses).get(spot_request_id).cloned())
    }

    async fn scheduled_events(
        &self,
        instance_id: &str,
    ) -> Result<Vec<ScheduledInstanceEvent>, AwsError> {
        self.faults.take("DescribeInstanceStatus")?;
        Ok(lock(&self.scheduled)
            .get(instance_id)
            .cloned()
            .unwrap_or_default())
    }
}

impl InstanceNotices for InMemoryInstances {
    async fn instance_facts(&self, instance_id: &str) -> Result<Option<InstanceFacts>, AwsError> {
        self.faults.take("DescribeInstances")?;
        let facts = self.notices.instance_facts(instance_id).await?;
        Ok(facts.map(|mut facts| {
            if facts.private_dns_name.is_none() {
                facts.private_dns_name = lock(&self.names).get(instance_id).cloned();
            }
            facts
        }))
    }

    async fn spot_request_status(&self, spot_request_id: &str) -> Result<Option<String>, AwsError> {
        self.notices.spot_request_status(spot_request_id).await
    }

    async fn scheduled_events(
        &self,
        instance_id: &str,
    ) -> Result<Vec<ScheduledInstanceEvent>, AwsError> {
        self.notices.scheduled_events(instance_id).await
    }
}

impl InstanceNoticesBatch for InMemoryInstanceNotices {
    async fn interrupted_spot_instances(&self) -> Result<Vec<String>, AwsError> {
        self.faults.take("DescribeSpotInstanceRequests")?;
        let statuses = lock(&self.spot_statuses).clone();
        let mut out: Vec<String> = lock(&self.facts)
            .iter()
            .filter(|(_, facts)| {
                facts
                    .spot_request_id
                    .as_ref()
                    .and_then(|r| statuses.get(r))
                    .is_some_and(|code| SPOT_INTERRUPTION_CODES.contains(&code.as_str()))
            })
            .map(|(id, _)| id.clone())
            .collect();
        out.sort();
        Ok(out)
    }

    /// As EC2 lists them without `IncludeAllInstances`: running instances only.
    async fn instances_with_scheduled_events(
        &self,
    ) -> Result<BTreeMap<String, Vec<ScheduledInstanceEvent>>, AwsError> {
        self.faults.take("DescribeInstanceStatus")?;
        let facts = lock(&self.facts).clone();
        let running = |id: &String| {
            facts
                .get(id)
                .is_some_and(|f| f.state.as_deref() == Some("running"))
        };
        Ok(lock(&self.scheduled)
            .iter()
            .filter(|(id, events)| {
                running(id)
                    && events
                        .iter()
                        .any(|e| SCHEDULED_EVENT_CODES.contains(&e.code.as_str()))
            })
            .map(|(id, events)| (id.clone(), events.clone()))
            .collect())
    }
}

impl InstanceNoticesBatch for InMemoryInstances {
    async fn interrupted_spot_instances(&self) -> Result<Vec<String>, AwsError> {
        self.notices.interrupted_spot_instances().await
    }

    async fn instances_with_scheduled_events(
        &self,
    ) -> Result<BTreeMap<String, Vec<ScheduledInstanceEvent>>, AwsError> {
        self.notices.instances_with_scheduled_events().await
    }
}

/// A message published to SNS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedMessage {
    pub topic_arn: String,
    pub subject: Option<String>,
    pub message: String,
}

/// SNS that records what is published.
#[derive(Debug, Default, Clone)]
pub struct InMemoryNotifications {
    published: Arc<Mutex<Vec<PublishedMessage>>>,
    pub faults: InMemoryFaults,
}

impl InMemoryNotifications {
    pub fn published(&self) -> Vec<PublishedMessage> {
        lock(&self.published).clone()
    }

    /// Removes and returns what was published so far (to deliver it as a new invocation).
    pub fn drain(&self) -> Vec<PublishedMessage> {
        std::mem::take(&mut *lock(&self.published))
    }
}

impl Notifications for InMemoryNotifications {
    async fn publish(
        &self,
        topic_arn: &str,
        subject: Option<&str>,
        message: &str,
    ) -> Result<(), AwsError> {
        self.faults.take("Publish")?;
        lock(&self.published).push(PublishedMessage {
            topic_arn: topic_arn.to_owned(),
            subject: subject.map(str::to_owned),
            message: message.to_owned(),
        });
        Ok(())
    }
}

#[derive(Debug, Default)]
struct EksState {
    clusters: HashMap<String, ClusterDescription>,
    /// cluster -> node group name -> description.
    nodegroups: HashMap<String, BTreeMap<String, NodegroupDescription>>,
    /// (cluster, principal ARN) -> entry.
    access_entries: BTreeMap<(String, String), AccessEntry>,
    calls: Vec<String>,
}

/// EKS clusters, node groups and access entries.
#[derive(Debug, Default, Clone)]
pub struct InMemoryEks {
    state: Arc<Mutex<EksState>>,
    pub faults: InMemoryFaults,
}

impl InMemoryEks {
    pub fn add_cluster(&self, cluster: ClusterDescription) {
        lock(&self.state)
            .clusters
            .insert(cluster.name.clone(), cluster);
    }

    pub fn add_nodegroup(&self, nodegroup: NodegroupDescription) {
        lock(&self.state)
            .nodegroups
            .entry(nodegroup.cluster_name.clone())
            .or_default()
            .insert(nodegroup.nodegroup_name.clone(), nodegroup);
    }

    pub fn remove_nodegroup(&self, cluster_name: &str, nodegroup_name: &str) {
        if let Some(groups) = lock(&self.state).nodegroups.get_mut(cluster_name) {
            groups.remove(nodegroup_name);
        }
    }

    pub fn access_entries(&self, cluster_name: &str) -> Vec<AccessEntry> {
        lock(&self.state)
            .access_entries
            .iter()
            .filter(|((cluster, _), _)| cluster == cluster_name)
            .map(|(_, entry)| entry.clone())
            .collect()
    }

    /// Operation names called so far, in order.
    pub fn calls(&self) -> Vec<String> {
        lock(&self.state).calls.clone()
    }

    fn call(&self, operation: &'static str) -> Result<MutexGuard<'_, EksState>, AwsError> {
        self.faults.take(operation)?;
        let mut state = lock(&self.state);
        state.calls.push(operation.to_owned());
        Ok(state)
    }
}

impl Eks for InMemoryEks {
    async fn describe_cluster(
        &self,
        cluster_name: &str,
    ) -> Result<Option<ClusterDescription>, AwsError> {
        Ok(self
            .call("DescribeCluster")?
            .clusters
            .get(cluster_name)
            .cloned())
    }

    async fn describe_nodegroup(
        &self,
        cluster_name: &str,
        nodegroup_name: &str,
    ) -> Result<Option<NodegroupDescription>, AwsError> {
        Ok(self
            .call("DescribeNodegroup")?
            .nodegroups
            .get(cluster_name)
            .and_then(|groups| groups.get(nodegroup_name))
            .cloned())
    }

    async fn list_nodegroups(&self, cluster_name: &str) -> Result<Vec<String>, AwsError> {
        Ok(self
            .call("ListNodegroups")?
            .nodegroups
            .get(cluster_name)
            .map(|groups| groups.keys().cloned().collect())
            .unwrap_or_default())
    }

    async fn create_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
        entry_type: AccessEntryType,
    ) -> Result<AccessEntryCreation, AwsError> {
        let mut state = self.call("CreateAccessEntry")?;
        let key = (cluster_name.to_owned(), principal_arn.to_owned());
        if state.access_entries.contains_key(&key) {
            return Ok(AccessEntryCreation::AlreadyExists);
        }
        let groups = match entry_type {
            AccessEntryType::Ec2Linux | AccessEntryType::Ec2Windows => {
                vec!["system:nodes".to_owned()]
            }
        };
        state.access_entries.insert(
            key,
            AccessEntry {
                principal_arn: principal_arn.to_owned(),
                entry_type: entry_type.as_str().to_owned(),
                username: Some("system:node:{{EC2PrivateDNSName}}".to_owned()),
                kubernetes_groups: groups,
            },
        );
        Ok(AccessEntryCreation::Created)
    }

    async fn describe_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
    ) -> Result<Option<AccessEntry>, AwsError> {
        Ok(self
            .call("DescribeAccessEntry")?
            .access_entries
            .get(&(cluster_name.to_owned(), principal_arn.to_owned()))
            .cloned())
    }

    async fn delete_access_entry(
        &self,
        cluster_name: &str,
        principal_arn: &str,
    ) -> Result<bool, AwsError> {
        Ok(self
            .call("DeleteAccessEntry")?
            .access_entries
            .remove(&(cluster_name.to_owned(), principal_arn.to_owned()))
            .is_some())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn action(token: &str) -> LifecycleActionRef {
        LifecycleActionRef {
            auto_scaling_group_name: "asg".into(),
            lifecycle_hook_name: "Terminate-LC-Hook".into(),
            instance_id: "i-1".into(),
            token: token.into(),
        }
    }

    #[tokio::test]
    async fn a_lifecycle_action_completes_once() {
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action("t1"));
        let first = asg
            .complete_lifecycle_action(&action("t1"), LifecycleActionResult::Continue)
            .await
            .unwrap();
        let second = asg
            .complete_lifecycle_action(&action("t1"), LifecycleActionResult::Continue)
            .await
            .unwrap();
        assert_eq!(first, CompletionOutcome::Completed);
        assert_eq!(second, CompletionOutcome::NoActiveAction);
        assert_eq!(asg.completions().len(), 1);
    }

    #[tokio::test]
    async fn wrong_token_and_injected_faults() {
        let asg = InMemoryAutoScaling::new();
        asg.start_action(&action("t1"));
        asg.faults
            .fail("CompleteLifecycleAction", AwsErrorKind::Transient, 1);
        let err = asg
            .complete_lifecycle_action(&action("t1"), LifecycleActionResult::Continue)
            .await
            .unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(
            asg.record_lifecycle_action_heartbeat(&action("other"))
                .await
                .unwrap(),
            HeartbeatOutcome::NoActiveAction
        );
        assert!(asg.is_pending(&action("t1")));
    }

    #[tokio::test]
    async fn access_entry_exists_once() {
        let eks = InMemoryEks::default();
        let arn = "arn:aws:iam::111111111111:role/node";
        assert_eq!(
            eks.create_access_entry("c", arn, AccessEntryType::Ec2Linux)
                .await
                .unwrap(),
            AccessEntryCreation::Created
        );
        assert_eq!(
            eks.create_access_entry("c", arn, AccessEntryType::Ec2Linux)
                .await
                .unwrap(),
            AccessEntryCreation::AlreadyExists
        );
        assert!(eks.delete_access_entry("c", arn).await.unwrap());
        assert!(!eks.delete_access_entry("c", arn).await.unwrap());
    }
}

#[derive(Debug, Default)]
struct InstanceHealthState {
    /// instance id -> membership (state and health change as calls are made).
    instances: BTreeMap<String, GroupInstance>,
    groups: BTreeMap<String, GroupHealthSettings>,
    marked_unhealthy: Vec<String>,
    rebooted: Vec<String>,
    /// EC2 `LaunchTime` of the instances that have one set by the test.
    launch_times: BTreeMap<String, jiff::Timestamp>,
    /// Instance ids asked for, per `DescribeInstances` call (launch times).
    launch_time_calls: Vec<usize>,
    /// Instance ids asked for, per `DescribeAutoScalingInstances` call.
    describe_calls: Vec<usize>,
    /// EC2's state and status checks of the instances a test set (others: running, ok).
    conditions: BTreeMap<String, InstanceCondition>,
}

/// Auto Scaling membership and health plus EC2 reboots, for node repair: marking an instance
/// unhealthy moves it to `Terminating` as Auto Scaling would.
#[derive(Debug, Default, Clone)]
pub struct InMemoryInstanceHealth {
    state: Arc<Mutex<InstanceHealthState>>,
    pub faults: InMemoryFaults,
}

impl InMemoryInstanceHealth {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_group(&self, name: &str, tags: &[(&str, &str)], grace_period: Duration) {
        lock(&self.state).groups.insert(
            name.to_owned(),
            GroupHealthSettings {
                name: name.to_owned(),
                tags: tags
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                health_check_grace_period: grace_period,
            },
        );
    }

    /// Puts `instance_id` in `group` as `InService` and `HEALTHY`.
    pub fn add_instance(&self, group: &str, instance_id: &str) {
        self.set_instance(group, instance_id, "InService", "HEALTHY");
    }

    /// The instance leaves its group (terminated).
    pub fn remove_instance(&self, instance_id: &str) {
        lock(&self.state).instances.remove(instance_id);
    }

    pub fn set_instance(&self, group: &str, instance_id: &str, state: &str, health: &str) {
        lock(&self.state).instances.insert(
            instance_id.to_owned(),
            GroupInstance {
                instance_id: instance_id.to_owned(),
                auto_scaling_group_name: group.to_owned(),
                lifecycle_state: state.to_owned(),
                health_status: health.to_owned(),
            },
        );
    }

    pub fn marked_unhealthy(&self) -> Vec<String> {
        lock(&self.state).marked_unhealthy.clone()
    }

    pub fn rebooted(&self) -> Vec<String> {
        lock(&self.state).rebooted.clone()
    }

    /// EC2 reports `at` as the instance's `LaunchTime` (its last start).
    pub fn set_launch_time(&self, instance_id: &str, at: jiff::Timestamp) {
        lock(&self.state)
            .launch_times
            .insert(instance_id.to_owned(), at);
    }

    /// EC2 reports `condition` for the instance (its state and status checks).
    pub fn set_condition(&self, instance_id: &str, condition: InstanceCondition) {
        lock(&self.state)
            .conditions
            .insert(instance_id.to_owned(), condition);
    }

    /// How many instance ids each launch-time lookup named.
    pub fn launch_time_calls(&self) -> Vec<usize> {
        lock(&self.state).launch_time_calls.clone()
    }

    /// How many instance ids each `DescribeAutoScalingInstances` call named.
    pub fn describe_calls(&self) -> Vec<usize> {
        lock(&self.state).describe_calls.clone()
    }
}

impl InstanceHealth for InMemoryInstanceHealth {
    async fn describe_group_instances(
        &self,
        instance_ids: &[String],
    ) -> Result<Vec<GroupInstance>, AwsError> {
        let mut out = Vec::new();
        for batch in instance_ids.chunks(50) {
            self.faults.take("DescribeAutoScalingInstances")?;
            let mut state = lock(&self.state);
            state.describe_calls.push(batch.len());
            out.extend(
                batch
                    .iter()
                    .filter_map(|id| state.instances.get(id).cloned()),
            );
        }
        Ok(out)
    }

    async fn describe_group_health_settings(
        &self,
        group_names: &[String],
    ) -> Result<Vec<GroupHealthSettings>, AwsError> {
        self.faults.take("DescribeAutoScalingGroups")?;
        let state = lock(&self.state);
        Ok(group_names
            .iter()
            .filter_map(|name| state.groups.get(name).cloned())
            .collect())
    }

    async fn set_instance_unhealthy(&self, instance_id: &str) -> Result<(), AwsError> {
        self.faults.take("SetInstanceHealth")?;
        let mut state = lock(&self.state);
        let Some(instance) = state.instances.get_mut(instance_id) else {
            return Err(AwsError::new(
                "SetInstanceHealth",
                AwsErrorKind::Invalid,
                format!(
                    "Instance Id not found - No managed instance found for instance ID: {instance_id}"
                ),
            ));
        };
        instance.health_status = "UNHEALTHY".to_owned();
        instance.lifecycle_state = "Terminating:Wait".to_owned();
        state.marked_unhealthy.push(instance_id.to_owned());
        Ok(())
    }
}

impl RepairInstances for InMemoryInstanceHealth {
    async fn launch_times(
        &self,
        instance_ids: &[String],
    ) -> Result<BTreeMap<String, jiff::Timestamp>, AwsError> {
        self.faults.take("DescribeInstances")?;
        let mut state = lock(&self.state);
        state.launch_time_calls.push(instance_ids.len());
        Ok(instance_ids
            .iter()
            .filter_map(|id| Some((id.clone(), *state.launch_times.get(id)?)))
            .collect())
    }

    async fn reboot_instance(&self, instance_id: &str) -> Result<(), AwsError> {
        self.faults.take("RebootInstances")?;
        lock(&self.state).rebooted.push(instance_id.to_owned());
        Ok(())
    }

    async fn instance_condition(
        &self,
        instance_id: &str,
    ) -> Result<Option<InstanceCondition>, AwsError> {
        self.faults.take("DescribeInstanceStatus")?;
        let state = lock(&self.state);
        if let Some(condition) = state.conditions.get(instance_id) {
            return Ok(Some(condition.clone()));
        }
        Ok(state
            .instances
            .contains_key(instance_id)
            .then(|| InstanceCondition {
                state: "running".to_owned(),
                system_status: Some("ok".to_owned()),
                instance_status: Some("ok".to_owned()),
            }))
    }
}

/// Instance refreshes and group configurations, set by a test; and the EC2 side of a
/// refresh (launch times, launch templates).
#[derive(Debug, Default, Clone)]
pub struct InMemoryInstanceRefreshes {
    refreshes: Arc<Mutex<Vec<InstanceRefreshDescription>>>,
    groups: Arc<Mutex<BTreeMap<String, GroupConfiguration>>>,
    launch_times: Arc<Mutex<BTreeMap<String, jiff::Timestamp>>>,
    templates: Arc<Mutex<Vec<LaunchTemplateVersions>>>,
    pub faults: InMemoryFaults,
}

impl InMemoryInstanceRefreshes {
    /// Adds or replaces (by id) a refresh.
    pub fn put_refresh(&self, refresh: InstanceRefreshDescription) {
        let mut refreshes = lock(&self.refreshes);
        refreshes.retain(|r| r.instance_refresh_id != refresh.instance_refresh_id);
        refreshes.push(refresh);
    }

    /// Adds or replaces (by name) a group.
    pub fn put_group(&self, group: GroupConfiguration) {
        lock(&self.groups).insert(group.name.clone(), group);
    }

    /// The instance was first launched at `at` (what
    /// [`RefreshInstances::launch_times`] answers).
    pub fn put_launch_time(&self, instance_id: &str, at: jiff::Timestamp) {
        lock(&self.launch_times).insert(instance_id.to_owned(), at);
    }

    /// Adds or replaces (by id) a launch template.
    pub fn put_launch_template(&self, template: LaunchTemplateVersions) {
        let mut templates = lock(&self.templates);
        templates.retain(|t| t.id != template.id);
        templates.push(template);
    }
}

impl RefreshInstances for InMemoryInstanceRefreshes {
    async fn launch_times(
        &self,
        instance_ids: &[String],
    ) -> Result<BTreeMap<String, jiff::Timestamp>, AwsError> {
        self.faults.take("DescribeInstances")?;
        let times = lock(&self.launch_times);
        Ok(instance_ids
            .iter()
            .filter_map(|id| Some((id.clone(), *times.get(id)?)))
            .collect())
    }

    async fn launch_template_versions(
        &self,
        templates: &[LaunchTemplateRef],
    ) -> Result<Vec<LaunchTemplateVersions>, AwsError> {
        self.faults.take("DescribeLaunchTemplates")?;
        Ok(lock(&self.templates)
            .iter()
            .filter(|known| {
                templates.iter().any(|t| match &t.id {
                    Some(id) => *id == known.id,
                    None => t.name.as_deref() == Some(known.name.as_str()),
                })
            })
            .cloned()
            .collect())
    }
}

impl InstanceRefreshes for InMemoryInstanceRefreshes {
    async fn describe_instance_refresh(
        &self,
        group_name: &str,
        instance_refresh_id: &str,
    ) -> Result<Option<InstanceRefreshDescription>, AwsError> {
        self.faults.take("DescribeInstanceRefreshes")?;
        Ok(lock(&self.refreshes)
            .iter()
            .find(|r| {
                r.auto_scaling_group_name == group_name
                    && r.instance_refresh_id == instance_refresh_id
            })
            .cloned())
    }

    async fn active_instance_refresh(
        &self,
        group_name: &str,
    ) -> Result<Option<InstanceRefreshDescription>, AwsError> {
        self.faults.take("DescribeInstanceRefreshes")?;
        Ok(lock(&self.refreshes)
            .iter()
            .rev()
            .find(|r| {
                r.auto_scaling_group_name == group_name
                    && matches!(r.status.as_str(), "Pending" | "InProgress")
            })
            .cloned())
    }

    async fn describe_group_configuration(
        &self,
        group_name: &str,
    ) -> Result<Option<GroupConfiguration>, AwsError> {
        self.faults.take("DescribeAutoScalingGroups")?;
        Ok(lock(&self.groups).get(group_name).cloned())
    }
}

/// The cluster's load balancers as a test sets them: each with its deregistration delay and
/// how it stands towards each instance (an instance it does not name is not routed).
#[derive(Debug, Default, Clone)]
pub struct InMemoryLoadBalancers {
    state: Arc<Mutex<InMemoryLoadBalancerState>>,
    pub faults: InMemoryFaults,
}

#[derive(Debug, Default)]
struct InMemoryLoadBalancerState {
    delays: BTreeMap<LoadBalancerRef, Duration>,
    routing: BTreeMap<(LoadBalancerRef, String), InstanceRouting>,
    calls: Vec<&'static str>,
}

impl InMemoryLoadBalancers {
    /// Adds a load balancer of the cluster.
    pub fn add(&self, load_balancer: LoadBalancerRef, deregistration_delay: Duration) {
        lock(&self.state)
            .delays
            .insert(load_balancer, deregistration_delay);
    }

    pub fn set_routing(
        &self,
        load_balancer: &LoadBalancerRef,
        instance_id: &str,
        routing: InstanceRouting,
    ) {
        lock(&self.state)
            .routing
            .insert((load_balancer.clone(), instance_id.to_owned()), routing);
    }

    /// The operations called so far, in order (`ClusterLoadBalancers`, `Routing`,
    /// `DeregistrationDelay`).
    pub fn calls(&self) -> Vec<&'static str> {
        lock(&self.state).calls.clone()
    }

    fn call(&self, operation: &'static str) -> Result<(), AwsError> {
        lock(&self.state).calls.push(operation);
        self.faults.take(operation)
    }
}

impl LoadBalancers for InMemoryLoadBalancers {
    fn cluster_load_balancers<'a>(
        &'a self,
        _cluster_name: &'a str,
    ) -> AwsFuture<'a, Vec<LoadBalancerRef>> {
        Box::pin(async move {
            self.call("ClusterLoadBalancers")?;
            Ok(lock(&self.state).delays.keys().cloned().collect())
        })
    }

    fn routing<'a>(
        &'a self,
        load_balancer: &'a LoadBalancerRef,
        instance_id: &'a str,
    ) -> AwsFuture<'a, InstanceRouting> {
        Box::pin(async move {
            self.call("Routing")?;
            let key = (load_balancer.clone(), instance_id.to_owned());
            Ok(lock(&self.state)
                .routing
                .get(&key)
                .copied()
                .unwrap_or(InstanceRouting::NotRouted))
        })
    }

    fn deregistration_delay<'a>(
        &'a self,
        load_balancer: &'a LoadBalancerRef,
    ) -> AwsFuture<'a, Duration> {
        Box::pin(async move {
            self.call("DeregistrationDelay")?;
            Ok(lock(&self.state)
                .delays
                .get(load_balancer)
                .copied()
                .unwrap_or_default())
        })
    }
}
