//! Fake IAM: `ListInstanceProfilesForRole` over the roles and instance profiles a test adds
//! (the one IAM call the functions make). IAM is global: clients sign for the partition's
//! home region (`us-east-1`), whatever the account's region.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::protocol::{ApiError, QueryParams, Reply, element};
use super::{Shared, lock};

#[derive(Default)]
pub(crate) struct IamState {
    /// Role name → the names of the instance profiles that carry it.
    roles: BTreeMap<String, Vec<String>>,
}

/// Handle on the fake IAM.
#[derive(Clone)]
pub struct FakeIam {
    shared: Arc<Shared>,
}

impl FakeIam {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Declares a role (without instance profiles: an unknown role is `NoSuchEntity`).
    pub fn add_role(&self, role_name: &str) {
        lock(&self.shared.iam)
            .roles
            .entry(role_name.to_owned())
            .or_default();
    }

    /// Puts role `role_name` into instance profile `profile_name`; returns the profile's ARN
    /// (`arn:aws:iam::<account>:instance-profile/<name>`), as EC2 reports it on an instance.
    pub fn add_instance_profile(&self, role_name: &str, profile_name: &str) -> String {
        lock(&self.shared.iam)
            .roles
            .entry(role_name.to_owned())
            .or_default()
            .push(profile_name.to_owned());
        self.instance_profile_arn(profile_name)
    }

    pub fn instance_profile_arn(&self, profile_name: &str) -> String {
        format!(
            "arn:aws:iam::{}:instance-profile/{profile_name}",
            self.shared.account.account_id
        )
    }
}

pub(crate) fn dispatch(
    shared: &Shared,
    operation: &str,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    match operation {
        "ListInstanceProfilesForRole" => list_instance_profiles_for_role(shared, params),
        other => Err(ApiError::new(
            400,
            "InvalidAction",
            format!("Could not find operation {other} for version 2010-05-08"),
        )),
    }
}

fn list_instance_profiles_for_role(
    shared: &Shared,
    params: &QueryParams,
) -> Result<Reply, ApiError> {
    let Some(role_name) = params.get("RoleName").filter(|name| !name.is_empty()) else {
        return Err(ApiError::validation(
            "1 validation error detected: Value null at 'roleName' failed to satisfy constraint: Member must not be null",
        ));
    };
    let account_id = &shared.account.account_id;
    let state = lock(&shared.iam);
    let Some(profiles) = state.roles.get(role_name) else {
        return Err(ApiError::new(
            404,
            "NoSuchEntity",
            format!("The role with name {role_name} cannot be found."),
        ));
    };
    let mut members = String::new();
    for profile in profiles {
        // Each profile lists its roles, whose ARNs a reader must not take for profiles.
        members.push_str(&format!(
            "<member>{}<Roles><member>{}{}{}</member></Roles>{}{}{}</member>",
            element("InstanceProfileId", "AIPAFAKE"),
            element("Path", "/"),
            element(
                "Arn",
                &format!("arn:aws:iam::{account_id}:role/{role_name}")
            ),
            element("RoleName", role_name),
            element("InstanceProfileName", profile),
            element("Path", "/"),
            element(
                "Arn",
                &format!("arn:aws:iam::{account_id}:instance-profile/{profile}")
            ),
        ));
    }
    Ok(Reply::Xml(format!(
        "<IsTruncated>false</IsTruncated><InstanceProfiles>{members}</InstanceProfiles>"
    )))
}
