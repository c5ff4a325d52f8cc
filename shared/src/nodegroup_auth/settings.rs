//! The node group auth function's settings, read once at start-up.

use std::time::Duration;

use crate::settings::{ClusterScope, SettingsError, SettingsSource};

use crate::retry::RetryPolicy;

/// Everything the function is configured with (see the README's settings table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodegroupAuthSettings {
    pub scope: ClusterScope,
    /// `AWS_REGION` (set by Lambda): events from other regions are refused.
    pub region: String,
    /// `ACCOUNT_ID`: only for runs outside Lambda. In Lambda the account is the one in the
    /// invoked function's ARN; when both are given they must agree.
    pub account_id: Option<String>,
    /// `WRITE_AWS_AUTH_WITH_ACCESS_ENTRIES`: in `API_AND_CONFIG_MAP` mode, also map the role
    /// in `aws-auth` (for nodes of tooling that still reads it). Default `false`, like EKS.
    pub aws_auth_with_access_entries: bool,
    /// `AWS_AUTH_MAX_ATTEMPTS`, `AWS_AUTH_RETRY_BASE_MILLIS`, `AWS_AUTH_RETRY_MAX_MILLIS`.
    pub retry: RetryPolicy,
    /// `DELETE_WAIT_SECONDS`: how long a `DeleteNodegroup` waits for the node group to be
    /// gone before unmapping its role (its nodes still drain meanwhile and need the mapping).
    /// Zero unmaps at once.
    pub delete_wait: Duration,
    /// `DELETE_POLL_SECONDS`: how often it checks.
    pub delete_poll_interval: Duration,
}

impl NodegroupAuthSettings {
    pub fn from_source(source: &(impl SettingsSource + ?Sized)) -> Result<Self, SettingsError> {
        let account_id = source.value("ACCOUNT_ID");
        if let Some(account) = &account_id
            && (account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(SettingsError::Invalid {
                name: "ACCOUNT_ID",
                value: account.clone(),
                expected: "a 12-digit AWS account id",
            });
        }
        let defaults = RetryPolicy::AWS_AUTH_WRITE;
        let max_attempts = source.parsed(
            "AWS_AUTH_MAX_ATTEMPTS",
            defaults.max_attempts,
            "a whole number of attempts, at least 1",
        )?;
        if max_attempts == 0 {
            return Err(SettingsError::Invalid {
                name: "AWS_AUTH_MAX_ATTEMPTS",
                value: "0".to_owned(),
                expected: "a whole number of attempts, at least 1",
            });
        }
        let millis = |name, default: Duration| {
            source
                .parsed(
                    name,
                    u64::try_from(default.as_millis()).unwrap_or(u64::MAX),
                    "a whole number of milliseconds",
                )
                .map(Duration::from_millis)
        };
        let scope = ClusterScope::from_source(source)?;
        if !scope.additional_cluster_names.is_empty() {
            // One cluster client, one IAM policy scoped to one cluster: an event for another
            // name would be written to CLUSTER_NAME's aws-auth. One stack per cluster.
            return Err(SettingsError::Invalid {
                name: "ADDITIONAL_CLUSTER_NAMES",
                value: scope.additional_cluster_names.join(","),
                expected: "unset: nodegroup-auth serves exactly one cluster (CLUSTER_NAME); deploy one stack per cluster",
            });
        }
        Ok(Self {
            scope,
            region: source.required(
                "AWS_REGION",
                "Lambda sets it; for local runs set it to the cluster's region",
            )?,
            account_id,
            aws_auth_with_access_entries: source
                .flag("WRITE_AWS_AUTH_WITH_ACCESS_ENTRIES", false)?,
            retry: RetryPolicy {
                max_attempts,
                base_delay: millis("AWS_AUTH_RETRY_BASE_MILLIS", defaults.base_delay)?,
                max_delay: millis("AWS_AUTH_RETRY_MAX_MILLIS", defaults.max_delay)?,
            },
            delete_wait: source.seconds("DELETE_WAIT_SECONDS", Duration::from_secs(600))?,
            delete_poll_interval: source.seconds("DELETE_POLL_SECONDS", Duration::from_secs(15))?,
        })
    }

    /// The account this invocation serves: from the invoked function's ARN
    /// (`arn:aws:lambda:<region>:<account>:function:<name>`), else `ACCOUNT_ID`.
    pub fn account_for(&self, invoked_function_arn: &str) -> Result<String, AccountError> {
        let from_arn = invoked_function_arn
            .split(':')
            .nth(4)
            .filter(|a| a.len() == 12 && a.bytes().all(|b| b.is_ascii_digit()))
            .map(str::to_owned);
        match (from_arn.as_ref(), self.account_id.as_ref()) {
            (Some(arn), Some(setting)) if arn != setting => Err(AccountError::Mismatch {
                function: arn.clone(),
                setting: setting.clone(),
            }),
            (Some(account), _) | (None, Some(account)) => Ok(account.clone()),
            (None, None) => Err(AccountError::Unknown),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountError {
    #[error(
        "the function runs in account {function} but ACCOUNT_ID is {setting}; remove or fix ACCOUNT_ID"
    )]
    Mismatch { function: String, setting: String },
    #[error(
        "cannot tell this function's account: the invoked function ARN has none; set ACCOUNT_ID"
    )]
    Unknown,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ARN: &str = "arn:aws:lambda:eu-west-1:111111111111:function:nodegroup-auth";

    #[test]
    fn defaults_and_account_resolution() {
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "ironman-2022"),
            ("AWS_REGION", "eu-west-1"),
        ];
        let settings = NodegroupAuthSettings::from_source(env).unwrap();
        assert_eq!(settings.retry, RetryPolicy::AWS_AUTH_WRITE);
        assert!(!settings.aws_auth_with_access_entries);
        assert_eq!(settings.delete_wait, Duration::from_secs(600));
        assert_eq!(settings.account_for(ARN).unwrap(), "111111111111");
        assert_eq!(
            settings.account_for("local").unwrap_err(),
            AccountError::Unknown
        );
    }

    #[test]
    fn account_setting_must_agree_with_the_function() {
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "c"),
            ("AWS_REGION", "eu-west-1"),
            ("ACCOUNT_ID", "222222222222"),
        ];
        let settings = NodegroupAuthSettings::from_source(env).unwrap();
        assert_eq!(settings.account_for("local").unwrap(), "222222222222");
        assert!(matches!(
            settings.account_for(ARN),
            Err(AccountError::Mismatch { .. })
        ));
        let bad: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "c"),
            ("AWS_REGION", "r"),
            ("ACCOUNT_ID", "12"),
        ];
        assert!(NodegroupAuthSettings::from_source(bad).is_err());
        let zero: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "c"),
            ("AWS_REGION", "r"),
            ("AWS_AUTH_MAX_ATTEMPTS", "0"),
        ];
        assert!(NodegroupAuthSettings::from_source(zero).is_err());
    }

    #[test]
    fn additional_cluster_names_are_refused_at_start_up() {
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", "blue"),
            ("AWS_REGION", "eu-west-1"),
            ("ADDITIONAL_CLUSTER_NAMES", "green"),
        ];
        let err = NodegroupAuthSettings::from_source(env).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("ADDITIONAL_CLUSTER_NAMES"), "{message}");
        assert!(message.contains("exactly one cluster"), "{message}");
    }
}
