//! Node group auth: a node's EKS token (its instance profile role, the session named after
//! the instance as EC2 names it) is refused until `nodegroup-auth` maps the new node group's
//! role through `aws-auth`; then the node authenticates as `system:node:<its private DNS
//! name>` in the node groups, and the Node authorizer lets it read its own Node.

use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use super::identity::{eks_token, status_code, whoami};
use super::{Played, response};
use crate::control_plane::ControlPlaneError;
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::{CLUSTER, NODE_ROLE, Target};
use crate::soak::corpus::fixture;

pub async fn play(bin: &Path) -> Result<Played, ControlPlaneError> {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::NodegroupAuth])
        .authentication_mode("CONFIG_MAP")
        .start(bin)
        .await?;
    let role_name = NODE_ROLE.rsplit('/').next().unwrap_or(NODE_ROLE);
    let role = w.aws.account().add_role_credentials(role_name);
    w.aws
        .account()
        .name_session(&role.access_key_id, &w.instance);
    let token = eks_token(&role, CLUSTER)?;
    let node_client = w.plane.client_with_token(token.expose()).await?;
    let mut played = Played::on(&w);

    let before = whoami(&node_client).await;
    played.expect(
        "before the node group is mapped, its node's token is refused (401)",
        before.as_ref().err().and_then(status_code) == Some(401),
        format!("{before:?}"),
    );
    played.line("nodegroup-auth gets the node group's CreateNodegroup event");
    // The fixture's account is the reference account; the world's may be another (under
    // AWS's Lambda emulator).
    let reference = crate::account::FakeAccount::reference().account_id;
    let event = fixture("eventbridge-create-nodegroup.json")
        .to_string()
        .replace(&reference, &w.aws.account().account_id);
    let event: serde_json::Value = serde_json::from_str(&event)
        .map_err(|e| ControlPlaneError::setup("the nodegroup-auth scenario", e))?;
    let answer = response(w.function(Target::NodegroupAuth), &event).await?;
    played.expect(
        "nodegroup-auth mapped the node role in aws-auth",
        answer["nodegroups"][0]["awsAuth"] == "mapped",
        &answer,
    );
    let after = whoami(&node_client).await;
    let in_groups = |groups: &[String]| {
        ["system:bootstrappers", "system:nodes"]
            .iter()
            .all(|g| groups.iter().any(|have| have == g))
    };
    played.expect(
        format!(
            "then the node is system:node:{} in system:bootstrappers and system:nodes",
            w.node
        ),
        after.as_ref().is_ok_and(|(user, groups)| {
            *user == format!("system:node:{}", w.node) && in_groups(groups)
        }),
        format!("{after:?}"),
    );
    let own = Api::<Node>::all(node_client).get(&w.node).await;
    played.expect(
        "and the Node authorizer lets it read its own Node",
        own.is_ok(),
        own.err().map(|e| e.to_string()).unwrap_or_default(),
    );
    Ok(played)
}
