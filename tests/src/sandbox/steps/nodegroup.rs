//! `createNodegroup` / `deleteNodegroup`: EKS's CloudTrail record of the call, through
//! EventBridge to `nodegroup-auth`; then the node role is (or is no longer) mapped.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use super::Checks;
use crate::aws::FakeNodegroup;
use crate::lambda_api::InvocationOutcome;
use crate::sandbox::functions::invoke;
use crate::sandbox::scenario::NodegroupStep;
use crate::sandbox::timeline::Source;
use crate::sandbox::world::Sandbox;

impl Sandbox {
    pub(in crate::sandbox) async fn create_nodegroup(
        &self,
        index: usize,
        step: &NodegroupStep,
    ) -> Checks {
        self.timeline.record(
            Source::Step,
            format!(
                "{}. CreateNodegroup {} (CloudTrail via EventBridge)",
                index + 1,
                step.nodegroup
            ),
        );
        self.nodegroup_event("CreateNodegroup", step).await
    }

    pub(in crate::sandbox) async fn delete_nodegroup(
        &self,
        index: usize,
        step: &NodegroupStep,
    ) -> Checks {
        self.timeline.record(
            Source::Step,
            format!(
                "{}. DeleteNodegroup {} (CloudTrail via EventBridge)",
                index + 1,
                step.nodegroup
            ),
        );
        // As EKS does: the node group is DELETING when the event is sent, and gone a little
        // later (nodegroup-auth waits for that; a node group already gone when the event
        // arrives cannot be verified, and its role would stay mapped).
        let eks = self.aws.eks();
        if let Some(spec) = self.nodegroup(&step.nodegroup) {
            // Re-adding with the same name replaces the node group, status aside.
            let deleting = FakeNodegroup::new(&spec.name, &self.role_arn(spec))
                .ami_type(&spec.ami_type)
                .auto_scaling_group(&spec.auto_scaling_group)
                .status("DELETING");
            if eks.add_nodegroup(&self.scenario.cluster, deleting).is_err() {
                return vec![(false, format!("node group {} is DELETING", step.nodegroup))];
            }
        }
        let cluster = self.scenario.cluster.clone();
        let name = step.nodegroup.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            eks.remove_nodegroup(&cluster, &name);
        });
        self.nodegroup_event("DeleteNodegroup", step).await
    }

    async fn nodegroup_event(&self, event_name: &str, step: &NodegroupStep) -> Checks {
        let Some(spec) = self.nodegroup(&step.nodegroup) else {
            return vec![(false, format!("node group {} is defined", step.nodegroup))];
        };
        let role_arn = self.role_arn(spec);
        let event = self.cloudtrail_event(spec, &role_arn, event_name);
        let outcome = invoke(
            &self.timeline,
            "nodegroup-auth",
            &self.functions["nodegroup-auth"],
            &event,
            self.function_timeout(),
            &format!("EventBridge {event_name} {}", spec.name),
        )
        .await;
        let mut checks = vec![(
            matches!(outcome, Some(InvocationOutcome::Response(_))),
            format!("nodegroup-auth handled {event_name} without error"),
        )];
        let verb = if step.expect_role_mapped {
            "maps"
        } else {
            "no longer maps"
        };
        if self.uses_config_map() && self.mode() == "CONFIG_MAP" {
            let mapped = self.aws_auth_maps_node_role(&role_arn);
            checks.push((
                mapped == step.expect_role_mapped,
                format!("aws-auth {verb} {role_arn} as a node"),
            ));
        }
        if self.uses_access_entries() {
            let entry = self
                .aws
                .eks()
                .access_entry(&self.scenario.cluster, &role_arn);
            checks.push((
                entry.is_some() == step.expect_role_mapped,
                format!("access entry (EC2_LINUX) {verb} {role_arn}"),
            ));
        }
        checks
    }

    /// Whether `aws-auth` maps `role_arn` with the node username and both node groups.
    fn aws_auth_maps_node_role(&self, role_arn: &str) -> bool {
        let Some(config_map) = self
            .server
            .store()
            .find::<ConfigMap>("kube-system", "aws-auth")
        else {
            return false;
        };
        let map_roles = config_map
            .data
            .as_ref()
            .and_then(|d| d.get("mapRoles"))
            .cloned()
            .unwrap_or_default();
        let Ok(entries) = serde_saphyr::from_str::<Vec<BTreeMap<String, Value>>>(&map_roles) else {
            return false;
        };
        entries.iter().any(|entry| maps_as_node(entry, role_arn))
    }
}

/// Whether one `mapRoles` entry maps `role_arn` with the node username and both node groups
/// (keys matched without regard to case, as `aws-iam-authenticator` reads them).
fn maps_as_node(entry: &BTreeMap<String, Value>, role_arn: &str) -> bool {
    let field = |name: &str| {
        entry
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    };
    let arn_matches = field("rolearn")
        .and_then(Value::as_str)
        .is_some_and(|a| a.eq_ignore_ascii_case(role_arn));
    let username =
        field("username").and_then(Value::as_str) == Some("system:node:{{EC2PrivateDNSName}}");
    let groups: Vec<&str> = field("groups")
        .and_then(Value::as_array)
        .map(|g| g.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    arn_matches
        && username
        && groups.contains(&"system:nodes")
        && groups.contains(&"system:bootstrappers")
}
