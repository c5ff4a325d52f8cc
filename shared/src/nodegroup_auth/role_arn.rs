//! The node role ARN: checked before it reaches `aws-auth` or an access entry.
//!
//! The ARN comes from `DescribeNodegroup`, but it still ends up in a YAML string that decides
//! who may act as a node, so it is parsed strictly: an IAM role of the cluster's own account
//! in the partition of the function's region, nothing that could be a pattern, a session or
//! a second YAML line. The authenticator canonicalises a caller's identity to
//! `arn:<partition>:iam::<account>:role/<name>` (no path), so `aws-auth` gets that form; an
//! access entry takes the ARN as given, path included.

use std::fmt;

use crate::aws::partition::Partition;

/// IAM's limit for a role's path and name together (`/` + path + name).
const MAX_PATH_AND_NAME: usize = 512;

/// Why a string is not an acceptable node role ARN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleArnError {
    #[error("node role ARN {0:?} is not of the form arn:<partition>:iam::<account>:role/<name>")]
    Malformed(String),
    #[error(
        "node role ARN {arn:?} is in partition {found:?}, but this function's region is in {expected:?}"
    )]
    WrongPartition {
        arn: String,
        found: String,
        expected: String,
    },
    #[error(
        "node role ARN {arn:?} belongs to account {found}, not the cluster's account {expected}"
    )]
    WrongAccount {
        arn: String,
        found: String,
        expected: String,
    },
    #[error(
        "{0:?} is not an IAM role ARN (users, assumed-role sessions and other principals cannot be node roles)"
    )]
    NotARole(String),
    #[error(
        "node role ARN {0:?} is a service-linked role (aws-service-role/), which nodes never use"
    )]
    ServiceLinkedRole(String),
    #[error(
        "node role ARN {0:?} contains characters IAM does not allow in role names or paths (wildcards, white space, line breaks, ...)"
    )]
    InvalidCharacters(String),
    #[error(
        "node role ARN {0:?} has a path and name longer than IAM's {MAX_PATH_AND_NAME} characters"
    )]
    TooLong(String),
}

/// An IAM role ARN that passed every check, split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRoleArn {
    partition: String,
    account: String,
    /// `/` or `/some/path/`.
    path: String,
    name: String,
}

impl NodeRoleArn {
    /// Parses `arn` and checks it is a role of `account` in the partition of `region`.
    pub fn parse(arn: &str, account: &str, region: &str) -> Result<Self, RoleArnError> {
        if !arn.chars().all(is_arn_char) {
            return Err(RoleArnError::InvalidCharacters(arn.to_owned()));
        }
        let malformed = || RoleArnError::Malformed(arn.to_owned());
        let mut parts = arn.splitn(6, ':');
        let (
            Some("arn"),
            Some(partition),
            Some(service),
            Some(arn_region),
            Some(arn_account),
            Some(resource),
        ) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        )
        else {
            return Err(malformed());
        };
        if service != "iam" || !resource.starts_with("role/") {
            return Err(RoleArnError::NotARole(arn.to_owned()));
        }
        if !arn_region.is_empty() {
            return Err(malformed());
        }
        let expected_partition = Partition::of_region(region).id();
        if partition != expected_partition {
            return Err(RoleArnError::WrongPartition {
                arn: arn.to_owned(),
                found: partition.to_owned(),
                expected: expected_partition.to_owned(),
            });
        }
        if arn_account.len() != 12 || !arn_account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed());
        }
        if arn_account != account {
            return Err(RoleArnError::WrongAccount {
                arn: arn.to_owned(),
                found: arn_account.to_owned(),
                expected: account.to_owned(),
            });
        }
        // `role/` + optional `path/` segments + name.
        let path_and_name = &resource["role".len()..];
        let Some(split) = path_and_name.rfind('/') else {
            return Err(malformed());
        };
        let (path, name) = (&path_and_name[..=split], &path_and_name[split + 1..]);
        if name.is_empty() || path.contains("//") {
            return Err(malformed());
        }
        if !path_and_name
            .chars()
            .all(|c| c == '/' || is_role_name_char(c))
        {
            return Err(RoleArnError::InvalidCharacters(arn.to_owned()));
        }
        if path.starts_with("/aws-service-role/") {
            return Err(RoleArnError::ServiceLinkedRole(arn.to_owned()));
        }
        if path_and_name.len() > MAX_PATH_AND_NAME {
            return Err(RoleArnError::TooLong(arn.to_owned()));
        }
        Ok(Self {
            partition: partition.to_owned(),
            account: arn_account.to_owned(),
            path: path.to_owned(),
            name: name.to_owned(),
        })
    }

    /// `arn:<partition>:iam::<account>:role/<name>`: the form the authenticator matches in
    /// `aws-auth` (it never sees role paths).
    pub fn without_path(&self) -> String {
        format!(
            "arn:{}:iam::{}:role/{}",
            self.partition, self.account, self.name
        )
    }

    /// The ARN as IAM spells it, path included: the form access entries take.
    pub fn full(&self) -> String {
        format!(
            "arn:{}:iam::{}:role{}{}",
            self.partition, self.account, self.path, self.name
        )
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn has_path(&self) -> bool {
        self.path != "/"
    }

    /// Whether two ARNs name the same role as the authenticator sees it (path ignored,
    /// case-insensitive).
    pub fn same_role(&self, other: &Self) -> bool {
        self.without_path()
            .eq_ignore_ascii_case(&other.without_path())
    }
}

impl fmt::Display for NodeRoleArn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full())
    }
}

/// Printable ASCII without white space: anything else has no place in an ARN.
fn is_arn_char(c: char) -> bool {
    c.is_ascii_graphic()
}

/// IAM's role name and path alphabet: alphanumerics and `+=,.@_-`.
fn is_role_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '=' | ',' | '.' | '@' | '_' | '-')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ACCOUNT: &str = "111111111111";
    const REGION: &str = "eu-west-1";

    fn parse(arn: &str) -> Result<NodeRoleArn, RoleArnError> {
        NodeRoleArn::parse(arn, ACCOUNT, REGION)
    }

    #[test]
    fn accepts_the_reference_role_with_a_67_character_name() {
        let arn = "arn:aws:iam::111111111111:role/eksctl-ironman-2022-nodegroup-demo-ng-NodeInstanceRole-454Q2XHJ5LZ0";
        let role = parse(arn).unwrap();
        assert_eq!(role.name().len(), 67);
        assert_eq!(role.without_path(), arn);
        assert_eq!(role.full(), arn);
        assert!(!role.has_path());
    }

    #[test]
    fn strips_the_path_for_aws_auth_and_keeps_it_for_access_entries() {
        let role = parse("arn:aws:iam::111111111111:role/teams/platform/node-role").unwrap();
        assert_eq!(
            role.without_path(),
            "arn:aws:iam::111111111111:role/node-role"
        );
        assert_eq!(
            role.full(),
            "arn:aws:iam::111111111111:role/teams/platform/node-role"
        );
        assert!(role.has_path());
    }

    #[test]
    fn partition_follows_the_region() {
        let role = NodeRoleArn::parse("arn:aws-cn:iam::111111111111:role/n", ACCOUNT, "cn-north-1")
            .unwrap();
        assert_eq!(role.without_path(), "arn:aws-cn:iam::111111111111:role/n");
        assert!(matches!(
            parse("arn:aws-cn:iam::111111111111:role/n"),
            Err(RoleArnError::WrongPartition { .. })
        ));
        assert!(matches!(
            NodeRoleArn::parse("arn:aws:iam::111111111111:role/n", ACCOUNT, "us-gov-west-1"),
            Err(RoleArnError::WrongPartition { .. })
        ));
    }

    #[test]
    fn the_eu_sovereign_partition_comes_from_the_shared_table() {
        let role = NodeRoleArn::parse(
            "arn:aws-eusc:iam::111111111111:role/n",
            ACCOUNT,
            "eusc-de-east-1",
        )
        .unwrap();
        assert_eq!(role.without_path(), "arn:aws-eusc:iam::111111111111:role/n");
        // Every partition's roles are accepted in its regions and refused in the others'.
        for partition in Partition::ALL {
            let arn = format!("arn:{}:iam::111111111111:role/n", partition.id());
            for region_of in Partition::ALL {
                let parsed = NodeRoleArn::parse(&arn, ACCOUNT, region_of.home_region());
                assert_eq!(
                    parsed.is_ok(),
                    region_of == partition,
                    "{arn} in {region_of:?}"
                );
            }
        }
    }

    type Expectation = fn(&RoleArnError) -> bool;

    #[test]
    fn rejects_everything_that_is_not_a_plain_role_of_this_account() {
        let cases: &[(&str, Expectation)] = &[
            ("arn:aws:iam::222222222222:role/n", |e| {
                matches!(e, RoleArnError::WrongAccount { .. })
            }),
            ("arn:aws:iam::111111111111:user/cli", |e| {
                matches!(e, RoleArnError::NotARole(_))
            }),
            ("arn:aws:sts::111111111111:assumed-role/n/i-0abc", |e| {
                matches!(e, RoleArnError::NotARole(_))
            }),
            ("arn:aws:iam::111111111111:role/*", |e| {
                matches!(e, RoleArnError::InvalidCharacters(_))
            }),
            ("arn:aws:iam::111111111111:role/n?", |e| {
                matches!(e, RoleArnError::InvalidCharacters(_))
            }),
            (
                "arn:aws:iam::111111111111:role/n\n  groups:\n  - system:masters",
                |e| matches!(e, RoleArnError::InvalidCharacters(_)),
            ),
            ("arn:aws:iam::111111111111:role/n ", |e| {
                matches!(e, RoleArnError::InvalidCharacters(_))
            }),
            (
                "arn:aws:iam::111111111111:role/aws-service-role/eks.amazonaws.com/AWSServiceRoleForAmazonEKS",
                |e| matches!(e, RoleArnError::ServiceLinkedRole(_)),
            ),
            ("arn:aws:iam::111111111111:role/", |e| {
                matches!(e, RoleArnError::Malformed(_))
            }),
            ("arn:aws:iam:eu-west-1:111111111111:role/n", |e| {
                matches!(e, RoleArnError::Malformed(_))
            }),
            ("arn:aws:iam::1111:role/n", |e| {
                matches!(e, RoleArnError::Malformed(_))
            }),
            ("role/n", |e| matches!(e, RoleArnError::Malformed(_))),
            ("", |e| matches!(e, RoleArnError::Malformed(_))),
            ("arn:aws:iam::111111111111:role/a//b", |e| {
                matches!(e, RoleArnError::Malformed(_))
            }),
        ];
        for (arn, expected) in cases {
            let err = parse(arn).unwrap_err();
            assert!(expected(&err), "{arn:?}: {err:?}");
        }
    }

    #[test]
    fn length_is_bounded_by_iams_path_and_name_limit_only() {
        let long_name = "n".repeat(200);
        assert!(parse(&format!("arn:aws:iam::111111111111:role/{long_name}")).is_ok());
        let too_long = "n".repeat(MAX_PATH_AND_NAME);
        assert!(matches!(
            parse(&format!("arn:aws:iam::111111111111:role/{too_long}")),
            Err(RoleArnError::TooLong(_))
        ));
    }

    #[test]
    fn same_role_ignores_path_and_case() {
        let a = parse("arn:aws:iam::111111111111:role/x/Node").unwrap();
        let b = parse("arn:aws:iam::111111111111:role/node").unwrap();
        assert!(a.same_role(&b));
    }
}
