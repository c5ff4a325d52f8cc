//! Whether an Auto Scaling group belongs to this function's cluster.
//!
//! A hook function may share an SNS topic or an EventBridge bus with other clusters' groups;
//! acting on their instances would drain nodes of a cluster we do not serve. A group is ours
//! when it carries one of the cluster tags EKS, the cluster autoscaler convention or eksctl
//! put on node groups, or when it is named in the allow-list setting; the notification must
//! also come from this function's own account.

use std::collections::BTreeMap;

use crate::aws::{AutoScaling, AwsError, GroupQuery};
use crate::settings::ClusterScope;

use super::recent::RecentReads;

/// Why a group is ours or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeDecision {
    /// Act on it; `evidence` names the tag or setting that says so (for the log line).
    Ours {
        evidence: String,
    },
    Foreign(ForeignReason),
}

impl ScopeDecision {
    pub fn is_ours(&self) -> bool {
        matches!(self, Self::Ours { .. })
    }
}

/// Why a group is left alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForeignReason {
    #[error("the notification is from account {account_id}, not this function's account")]
    OtherAccount { account_id: String },
    #[error("the Auto Scaling group does not exist (any more)")]
    GroupNotFound,
    #[error(
        "the Auto Scaling group has no tag naming this cluster (eks:cluster-name, kubernetes.io/cluster/<name>, alpha.eksctl.io/cluster-name) and is not in AUTO_SCALING_GROUP_NAMES"
    )]
    NotTaggedForCluster,
}

/// Decides, and remembers the decision per group for the lifecycle action it was made for,
/// at most [`super::recent::MAX_AGE`]: a group tagged after its first notification is in
/// scope from its next action on (and an untagged one leaves scope as soon).
#[derive(Debug)]
pub struct GroupScope {
    cluster: ClusterScope,
    allowed_groups: Vec<String>,
    account_id: Option<String>,
    decided: RecentReads<String, ScopeDecision>,
    /// Group tags read for instance notices, which belong to no lifecycle action: reused by
    /// every notice about the group for [`super::recent::MAX_AGE`].
    notice_tags: RecentReads<String, Option<BTreeMap<String, String>>>,
}

impl GroupScope {
    /// `account_id`: this function's account (see [`account_id_from_function_arn`]); `None`
    /// skips the account check, for local runs without a function ARN.
    pub fn new(
        cluster: ClusterScope,
        allowed_groups: Vec<String>,
        account_id: Option<String>,
    ) -> Self {
        Self {
            cluster,
            allowed_groups,
            account_id,
            decided: RecentReads::default(),
            notice_tags: RecentReads::default(),
        }
    }

    /// The scope both hooks use: their cluster and group allow-list, the account checked
    /// per invocation against the function's own ARN.
    pub fn from_settings(settings: &crate::lifecycle::settings::LifecycleSettings) -> Self {
        Self::new(
            settings.cluster.clone(),
            settings.allowed_groups.clone(),
            None,
        )
    }

    /// Sets the function's account once it is known (the first invocation's context).
    pub fn with_account_id(mut self, account_id: Option<String>) -> Self {
        self.account_id = account_id;
        self
    }

    /// Whether `group_name`, named in a notification from `notification_account` about the
    /// lifecycle action `action_token`, is ours.
    pub async fn decide(
        &self,
        autoscaling: &impl AutoScaling,
        notification_account: &str,
        group_name: &str,
        action_token: &str,
    ) -> Result<ScopeDecision, AwsError> {
        self.decide_for_account(
            autoscaling,
            self.account_id.as_deref(),
            notification_account,
            group_name,
            action_token,
        )
        .await
    }

    /// [`Self::decide`] with the function's account given per call (from the invocation's
    /// context), overriding the one given at construction when `Some`.
    pub async fn decide_for_account(
        &self,
        autoscaling: &impl AutoScaling,
        function_account: Option<&str>,
        notification_account: &str,
        group_name: &str,
        action_token: &str,
    ) -> Result<ScopeDecision, AwsError> {
        if let Some(decision) =
            self.decide_before_tags(function_account, notification_account, group_name)
        {
            return Ok(decision);
        }
        if let Some(decision) = self.decided.get(&group_name.to_owned(), action_token) {
            return Ok(decision);
        }
        let decision = match autoscaling.group_tags(group_name).await? {
            // Not cached: a group that is not there yet may be created with this name.
            None => return Ok(ScopeDecision::Foreign(ForeignReason::GroupNotFound)),
            Some(tags) => decide_by_tags(&self.cluster, &tags),
        };
        self.decided
            .insert(group_name.to_owned(), action_token, decision.clone());
        Ok(decision)
    }
}

impl GroupScope {
    /// The tags of `group_name` (`None`: no such group) for an instance notice: read at most
    /// once a minute per group, however many notices name it (a notice has no lifecycle
    /// action to key the reading on, and a burst of Spot warnings names one group many times).
    pub async fn recent_tags(
        &self,
        autoscaling: &impl AutoScaling,
        group_name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, AwsError> {
        const ANY_NOTICE: &str = "";
        let key = group_name.to_owned();
        if let Some(tags) = self.notice_tags.get(&key, ANY_NOTICE) {
            return Ok(tags);
        }
        let tags = autoscaling.group_tags(group_name).await?;
        self.notice_tags.insert(key, ANY_NOTICE, tags.clone());
        Ok(tags)
    }
}

/// The tag EKS puts on the Auto Scaling group of a managed node group (value: the node
/// group's name). EKS's own node manager drains those nodes.
pub const MANAGED_NODEGROUP_TAG: &str = "eks:nodegroup-name";

/// The managed node group a group's tags name, if any.
pub fn managed_node_group(tags: &BTreeMap<String, String>) -> Option<&str> {
    tags.get(MANAGED_NODEGROUP_TAG).map(String::as_str)
}

impl GroupScope {
    /// The account and allow-list checks, which need no tags: `Some` when they decide.
    fn decide_before_tags(
        &self,
        function_account: Option<&str>,
        notification_account: &str,
        group_name: &str,
    ) -> Option<ScopeDecision> {
        let function_account = function_account.or(self.account_id.as_deref());
        if let Some(own) = function_account
            && own != notification_account
        {
            return Some(ScopeDecision::Foreign(ForeignReason::OtherAccount {
                account_id: notification_account.to_owned(),
            }));
        }
        if self.allowed_groups.iter().any(|g| g == group_name) {
            return Some(ScopeDecision::Ours {
                evidence: "AUTO_SCALING_GROUP_NAMES".to_owned(),
            });
        }
        None
    }

    /// The same decision for a caller that has read the group's tags itself (`None`: the
    /// group does not exist); nothing is remembered.
    pub fn decide_with_tags(
        &self,
        function_account: Option<&str>,
        notification_account: &str,
        group_name: &str,
        tags: Option<&BTreeMap<String, String>>,
    ) -> ScopeDecision {
        if let Some(decision) =
            self.decide_before_tags(function_account, notification_account, group_name)
        {
            return decision;
        }
        match tags {
            None => ScopeDecision::Foreign(ForeignReason::GroupNotFound),
            Some(tags) => decide_by_tags(&self.cluster, tags),
        }
    }
}

/// The pure part: do these tags name one of the cluster's names?
pub(crate) fn decide_by_tags(
    cluster: &ClusterScope,
    tags: &BTreeMap<String, String>,
) -> ScopeDecision {
    for name in cluster.names() {
        for key in CLUSTER_NAME_TAGS {
            if tags.get(key).is_some_and(|value| value == name) {
                return ScopeDecision::Ours {
                    evidence: format!("tag {key}={name}"),
                };
            }
        }
        // The cluster autoscaler convention: the key names the cluster, the value is
        // `owned` or `shared`; either way the group serves this cluster.
        let key = cluster_key_tag(name);
        if tags.contains_key(&key) {
            return ScopeDecision::Ours {
                evidence: format!("tag {key}"),
            };
        }
    }
    ScopeDecision::Foreign(ForeignReason::NotTaggedForCluster)
}

/// The tags whose value names the cluster of a group (EKS's, eksctl's).
const CLUSTER_NAME_TAGS: [&str; 2] = ["eks:cluster-name", "alpha.eksctl.io/cluster-name"];

/// The cluster autoscaler's tag of a group of cluster `name`: its key names the cluster.
fn cluster_key_tag(name: &str) -> String {
    format!("kubernetes.io/cluster/{name}")
}

impl GroupScope {
    /// The groups this scope takes as ours, as an Auto Scaling query: those tagged for the
    /// cluster (any of its names, each convention [`decide_by_tags`] accepts) and those in
    /// `AUTO_SCALING_GROUP_NAMES`. The account is checked on what is found.
    pub fn query(&self) -> GroupQuery {
        let names: Vec<String> = self.cluster.names().cloned().collect();
        let mut tags: Vec<(String, Vec<String>)> = CLUSTER_NAME_TAGS
            .iter()
            .map(|key| ((*key).to_owned(), names.clone()))
            .collect();
        tags.extend(names.iter().map(|name| (cluster_key_tag(name), Vec::new())));
        GroupQuery {
            tags,
            names: self.allowed_groups.clone(),
        }
    }
}

/// The account of a Lambda function ARN (`arn:aws:lambda:<region>:<account>:function:<name>`).
pub fn account_id_from_function_arn(arn: &str) -> Option<String> {
    let mut parts = arn.split(':');
    let (Some("arn"), Some(_partition), Some("lambda"), Some(_region), Some(account)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    (account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit())).then(|| account.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::aws::in_memory::InMemoryAutoScaling;

    fn cluster() -> ClusterScope {
        ClusterScope {
            cluster_name: "ironman-2022".into(),
            additional_cluster_names: vec!["ironman-old".into()],
        }
    }

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[tokio::test]
    async fn notice_tags_are_read_once_a_minute_per_group_whatever_the_notice() {
        let autoscaling = InMemoryAutoScaling::new();
        autoscaling.add_group("asg", &[("eks:nodegroup-name", "ng-1")]);
        let scope = GroupScope::new(cluster(), Vec::new(), None);
        let tags = scope
            .recent_tags(&autoscaling, "asg")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(managed_node_group(&tags), Some("ng-1"));
        // Any further read within the minute would fail: the first one serves them.
        autoscaling.faults.fail(
            "DescribeAutoScalingGroups",
            crate::aws::AwsErrorKind::AccessDenied,
            100,
        );
        for _ in 0..3 {
            assert_eq!(
                scope.recent_tags(&autoscaling, "asg").await.unwrap(),
                Some(tags.clone())
            );
        }
        assert!(scope.recent_tags(&autoscaling, "other").await.is_err());
    }

    #[test]
    fn each_cluster_tag_is_recognised() {
        for pairs in [
            [("eks:cluster-name", "ironman-2022")],
            [("kubernetes.io/cluster/ironman-2022", "owned")],
            [("alpha.eksctl.io/cluster-name", "ironman-2022")],
            [("eks:cluster-name", "ironman-old")],
        ] {
            assert!(
                decide_by_tags(&cluster(), &tags(&pairs)).is_ours(),
                "{pairs:?}"
            );
        }
        for pairs in [
            [("eks:cluster-name", "other")],
            [("kubernetes.io/cluster/other", "owned")],
            [("Name", "ironman-2022")],
        ] {
            assert_eq!(
                decide_by_tags(&cluster(), &tags(&pairs)),
                ScopeDecision::Foreign(ForeignReason::NotTaggedForCluster),
                "{pairs:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_group_tagged_after_its_first_notification_is_ours_from_its_next_action() {
        let asg = InMemoryAutoScaling::new();
        asg.add_group("late", &[("team", "a")]);
        let scope = GroupScope::new(cluster(), vec![], Some("111111111111".into()));
        let before = scope
            .decide(&asg, "111111111111", "late", "token-1")
            .await
            .unwrap();
        assert_eq!(
            before,
            ScopeDecision::Foreign(ForeignReason::NotTaggedForCluster)
        );
        asg.add_group("late", &[("eks:cluster-name", "ironman-2022")]);
        assert!(
            scope
                .decide(&asg, "111111111111", "late", "token-2")
                .await
                .unwrap()
                .is_ours()
        );
    }

    #[tokio::test]
    async fn decisions_are_cached_per_group() {
        let asg = InMemoryAutoScaling::new();
        asg.add_group("ours", &[("eks:cluster-name", "ironman-2022")]);
        asg.add_group("theirs", &[("eks:cluster-name", "other")]);
        let scope = GroupScope::new(cluster(), vec![], Some("111111111111".into()));
        assert!(
            scope
                .decide(&asg, "111111111111", "ours", "token-1")
                .await
                .unwrap()
                .is_ours()
        );
        assert!(
            !scope
                .decide(&asg, "111111111111", "theirs", "token-1")
                .await
                .unwrap()
                .is_ours()
        );
        // Cached for the same action: a failing DescribeAutoScalingGroups is not called again.
        asg.faults.fail(
            "DescribeAutoScalingGroups",
            crate::aws::AwsErrorKind::AccessDenied,
            5,
        );
        assert!(
            scope
                .decide(&asg, "111111111111", "ours", "token-1")
                .await
                .unwrap()
                .is_ours()
        );
        assert!(
            scope
                .decide(&asg, "111111111111", "unknown", "token-1")
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn other_accounts_and_missing_groups_are_foreign() {
        let asg = InMemoryAutoScaling::new();
        asg.add_group("ours", &[("eks:cluster-name", "ironman-2022")]);
        let scope = GroupScope::new(
            cluster(),
            vec!["listed".into()],
            Some("111111111111".into()),
        );
        assert_eq!(
            scope
                .decide(&asg, "222222222222", "ours", "token-1")
                .await
                .unwrap(),
            ScopeDecision::Foreign(ForeignReason::OtherAccount {
                account_id: "222222222222".into()
            })
        );
        assert_eq!(
            scope
                .decide(&asg, "111111111111", "gone", "token-1")
                .await
                .unwrap(),
            ScopeDecision::Foreign(ForeignReason::GroupNotFound)
        );
        // The allow-list needs no tags and no AWS call.
        assert!(
            scope
                .decide(&asg, "111111111111", "listed", "token-1")
                .await
                .unwrap()
                .is_ours()
        );
    }

    #[test]
    fn account_from_function_arn() {
        assert_eq!(
            account_id_from_function_arn(
                "arn:aws:lambda:eu-west-1:111111111111:function:launching-hook"
            )
            .as_deref(),
            Some("111111111111")
        );
        assert_eq!(account_id_from_function_arn(""), None);
        assert_eq!(
            account_id_from_function_arn("arn:aws:sns:eu-west-1:1:t"),
            None
        );
    }

    /// The query finds the groups the scope decides are ours, by every tag convention and
    /// the allow-list, and no other.
    #[tokio::test]
    async fn the_group_query_finds_exactly_the_groups_decided_ours() {
        use crate::aws::{GroupActivity, LifecycleActionRef, LifecycleActionResult, LifecycleHook};
        let autoscaling = InMemoryAutoScaling::new();
        let groups: [(&str, &[(&str, &str)]); 5] = [
            ("eks", &[("eks:cluster-name", "ironman-old")]),
            ("ca", &[("kubernetes.io/cluster/ironman-2022", "owned")]),
            (
                "eksctl",
                &[("alpha.eksctl.io/cluster-name", "ironman-2022")],
            ),
            ("listed", &[]),
            (
                "foreign",
                &[
                    ("eks:cluster-name", "other"),
                    ("kubernetes.io/cluster/other", "owned"),
                ],
            ),
        ];
        for (i, (group, group_tags)) in groups.iter().enumerate() {
            autoscaling.add_group(group, group_tags);
            autoscaling.add_hook(
                group,
                LifecycleHook {
                    name: "drain".into(),
                    transition: "autoscaling:EC2_INSTANCE_TERMINATING".into(),
                    heartbeat_timeout: std::time::Duration::from_secs(300),
                    global_timeout: std::time::Duration::from_secs(3600),
                    default_result: LifecycleActionResult::Continue,
                },
            );
            autoscaling.set_hook_target(group, "drain", "topic");
            autoscaling.start_action(&LifecycleActionRef {
                auto_scaling_group_name: (*group).to_owned(),
                lifecycle_hook_name: "drain".into(),
                instance_id: format!("i-0{i}"),
                token: format!("t{i}"),
            });
        }
        let scope = GroupScope::new(cluster(), vec!["listed".into()], None);
        let decided = |group: &str, group_tags: &[(&str, &str)]| {
            scope.allowed_groups.iter().any(|g| g == group)
                || decide_by_tags(&scope.cluster, &tags(group_tags)).is_ours()
        };
        let found = autoscaling
            .waiting_terminations(&scope.query(), "topic")
            .await
            .unwrap();
        let found: Vec<&str> = found
            .iter()
            .map(|w| w.action.auto_scaling_group_name.as_str())
            .collect();
        let expected: Vec<&str> = groups
            .iter()
            .filter(|(g, t)| decided(g, t))
            .map(|(g, _)| *g)
            .collect();
        assert_eq!(found, expected);
        assert_eq!(found.len(), 4, "{found:?}");
        let elsewhere = autoscaling
            .waiting_terminations(&scope.query(), "another")
            .await
            .unwrap();
        assert!(
            elsewhere.is_empty(),
            "a hook notifying another topic is not ours: {elsewhere:?}"
        );
    }
}
