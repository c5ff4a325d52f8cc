//! `aws-auth` under the same faults: node groups created concurrently and repeatedly through
//! the real `nodegroup-auth` handler; then every node role is mapped once and the entries it
//! had are kept.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use node_manager::aws::in_memory::{InMemoryEks, InMemoryInstanceProfiles, InMemoryInstances};
use node_manager::aws::{
    AuthenticationMode, AwsErrorKind, ClusterDescription, NodegroupDescription,
};
use node_manager::nodegroup_auth::handler::NodegroupAuth;
use node_manager::nodegroup_auth::kube_store::KubeAwsAuthStore;
use node_manager::nodegroup_auth::role_mapping::MapRoles;
use node_manager::nodegroup_auth::settings::NodegroupAuthSettings;
use node_manager::retry::RetryPolicy;
use node_manager::settings::ClusterScope;
use rand::Rng;
use serde_json::{Value, json};

use super::setup::Soak;
use super::{ACCOUNT, ADMIN_ROLE, CLUSTER};
use crate::soak::corpus;
use crate::soak::secrets::SecretScanner;

type SoakNodegroupAuth =
    NodegroupAuth<InMemoryEks, KubeAwsAuthStore, InMemoryInstanceProfiles, InMemoryInstances>;

impl Soak {
    /// 0-3 node groups; when there are any, their CreateNodegroup events delivered
    /// concurrently and twice each (plus a reconcile-all), retried like Lambda. Returns the
    /// violations found in `aws-auth`.
    pub(super) async fn soak_aws_auth(&mut self, client: kube::Client) -> Vec<String> {
        let count = self.rng.random_range(0..=3usize);
        self.report.nodegroups = count;
        if count == 0 {
            return Vec::new();
        }
        if self.rng.random_bool(0.7) {
            self.store
                .apply_yaml(&format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: aws-auth, namespace: kube-system}}\ndata:\n  mapRoles: |\n    - rolearn: {ADMIN_ROLE}\n      username: admin\n      groups:\n        - system:masters\n"
                ))
                .expect("aws-auth");
        }
        let had_admin = self
            .store
            .find::<ConfigMap>("kube-system", "aws-auth")
            .is_some();
        let (eks, roles) = self.nodegroups(count);
        let function = NodegroupAuth::new(
            eks,
            KubeAwsAuthStore::new(client),
            InMemoryInstanceProfiles::default(),
            InMemoryInstances::default(),
            settings(),
        );
        let mut found = self.create_nodegroups(&function, count).await;
        found.extend(self.aws_auth_violations(&roles, had_admin));
        found
    }

    /// EKS with the cluster and `count` node groups (a few DescribeNodegroup failures
    /// queued); their node roles.
    fn nodegroups(&mut self, count: usize) -> (InMemoryEks, Vec<String>) {
        let eks = InMemoryEks::default();
        eks.add_cluster(ClusterDescription {
            name: CLUSTER.into(),
            arn: format!("arn:aws:eks:eu-west-1:{ACCOUNT}:cluster/{CLUSTER}"),
            endpoint: self.server.url().to_owned(),
            certificate_authority_data: self.server.ca_data(),
            authentication_mode: AuthenticationMode::ConfigMap,
        });
        let mut roles = Vec::new();
        for i in 0..count {
            let role = format!("arn:aws:iam::{ACCOUNT}:role/soak-node-role-{i}");
            eks.add_nodegroup(NodegroupDescription {
                cluster_name: CLUSTER.into(),
                nodegroup_name: format!("ng-{i}"),
                node_role: role.clone(),
                ami_type: "AL2023_x86_64_STANDARD".into(),
                status: "ACTIVE".into(),
            });
            roles.push(role);
        }
        let aws_failures = self.rng.random_range(0..=2usize);
        eks.faults
            .fail("DescribeNodegroup", AwsErrorKind::Transient, aws_failures);
        self.report.aws_faults += aws_failures as u64;
        (eks, roles)
    }

    /// Delivers the CreateNodegroup events (each twice) and a reconcile-all, retrying
    /// failures for up to 30 rounds.
    async fn create_nodegroups(
        &mut self,
        function: &SoakNodegroupAuth,
        count: usize,
    ) -> Vec<String> {
        let arn = format!("arn:aws:lambda:eu-west-1:{ACCOUNT}:function:nodegroup-auth");
        let mut queue: Vec<Value> = Vec::new();
        for i in 0..count {
            let mut event = corpus::fixture("eventbridge-create-nodegroup.json");
            event["detail"]["requestParameters"]["nodegroupName"] = json!(format!("ng-{i}"));
            event["detail"]["responseElements"]["nodegroup"]["nodegroupName"] =
                json!(format!("ng-{i}"));
            queue.push(event.clone());
            queue.push(event);
            self.report.duplicates += 1;
        }
        queue.push(json!({"clusterName": CLUSTER, "reconcile": "all"}));
        let mut attempts = 0;
        while !queue.is_empty() && attempts < 30 {
            attempts += 1;
            let batch = std::mem::take(&mut queue);
            self.report.invocations += batch.len() as u64;
            let results = futures::future::join_all(batch.iter().map(|event| async {
                (event.clone(), function.handle(event, &arn).await.is_ok())
            }))
            .await;
            queue.extend(results.into_iter().filter(|(_, ok)| !ok).map(|(e, _)| e));
        }
        if queue.is_empty() {
            Vec::new()
        } else {
            vec![format!(
                "nodegroup-auth still failing after {attempts} rounds of retries"
            )]
        }
    }

    /// `aws-auth` maps each role exactly once, kept the admin entry it had, holds no secret.
    fn aws_auth_violations(&self, roles: &[String], had_admin: bool) -> Vec<String> {
        let mut found = Vec::new();
        let Some(config_map) = self.store.find::<ConfigMap>("kube-system", "aws-auth") else {
            found.push("aws-auth missing".to_owned());
            return found;
        };
        let text = config_map
            .data
            .as_ref()
            .and_then(|d| d.get("mapRoles"))
            .cloned()
            .unwrap_or_default();
        match MapRoles::parse(Some(&text)) {
            Err(error) => found.push(format!("aws-auth mapRoles does not parse: {error}")),
            Ok(map) => {
                for role in roles {
                    let n = map
                        .mappings()
                        .iter()
                        .filter(|m| m.role_arn.eq_ignore_ascii_case(role))
                        .count();
                    if n != 1 {
                        found.push(format!("aws-auth maps {role} {n} times"));
                    }
                }
                if had_admin
                    && !map.mappings().iter().any(|m| {
                        m.role_arn == ADMIN_ROLE && m.groups.iter().any(|g| g == "system:masters")
                    })
                {
                    found.push("aws-auth lost the admin entry".to_owned());
                }
            }
        }
        if !SecretScanner::new().scan(&text).is_empty() {
            found.push("aws-auth holds a secret".to_owned());
        }
        found
    }
}

/// The handler's settings for a fast soak: quick retries and a short wait for deletions.
fn settings() -> NodegroupAuthSettings {
    NodegroupAuthSettings {
        scope: ClusterScope {
            cluster_name: CLUSTER.into(),
            additional_cluster_names: vec![],
        },
        region: "eu-west-1".into(),
        account_id: None,
        aws_auth_with_access_entries: false,
        retry: RetryPolicy {
            max_attempts: 8,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(50),
        },
        delete_wait: Duration::from_millis(100),
        delete_poll_interval: Duration::from_millis(10),
    }
}
