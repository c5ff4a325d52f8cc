//! Settings read from the environment, with clear errors for bad values.
//!
//! Every function reads its settings once at start-up through a [`SettingsSource`], so tests
//! give a map instead of mutating the process environment.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

/// A setting that is missing or cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("environment variable {name} is required: {hint}")]
    Missing {
        name: &'static str,
        hint: &'static str,
    },
    #[error("environment variable {name}={value:?} is invalid: expected {expected}")]
    Invalid {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// Where settings come from: the process environment, or a map in tests.
pub trait SettingsSource {
    fn get(&self, name: &str) -> Option<String>;

    /// The value, with surrounding white space removed; unset and empty read as `None`.
    fn value(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    fn required(&self, name: &'static str, hint: &'static str) -> Result<String, SettingsError> {
        self.value(name)
            .ok_or(SettingsError::Missing { name, hint })
    }

    fn parsed<T: FromStr>(
        &self,
        name: &'static str,
        default: T,
        expected: &'static str,
    ) -> Result<T, SettingsError> {
        match self.value(name) {
            None => Ok(default),
            Some(value) => value.parse().map_err(|_| SettingsError::Invalid {
                name,
                value,
                expected,
            }),
        }
    }

    /// A duration given in whole seconds.
    fn seconds(&self, name: &'static str, default: Duration) -> Result<Duration, SettingsError> {
        self.parsed(name, default.as_secs(), "a whole number of seconds")
            .map(Duration::from_secs)
    }

    fn flag(&self, name: &'static str, default: bool) -> Result<bool, SettingsError> {
        match self.value(name).map(|v| v.to_ascii_lowercase()) {
            None => Ok(default),
            Some(v) if matches!(v.as_str(), "1" | "true" | "yes" | "on") => Ok(true),
            Some(v) if matches!(v.as_str(), "0" | "false" | "no" | "off") => Ok(false),
            Some(value) => Err(SettingsError::Invalid {
                name,
                value,
                expected: "true or false",
            }),
        }
    }

    /// A comma-separated list; empty items are dropped.
    fn list(&self, name: &str) -> Vec<String> {
        self.value(name)
            .map(|v| {
                v.split(',')
                    .map(|item| item.trim().to_owned())
                    .filter(|item| !item.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl SettingsSource for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl SettingsSource for BTreeMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        BTreeMap::get(self, name).cloned()
    }
}

impl SettingsSource for [(&str, &str)] {
    fn get(&self, name: &str) -> Option<String> {
        self.iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| (*value).to_owned())
    }
}

/// Which cluster a function serves, and which others it may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterScope {
    /// `CLUSTER_NAME`: the cluster this function serves.
    pub cluster_name: String,
    /// `ADDITIONAL_CLUSTER_NAMES`: other cluster names accepted as this one's (renamed stacks,
    /// blue/green), comma-separated. Empty by default.
    pub additional_cluster_names: Vec<String>,
}

impl ClusterScope {
    pub fn from_source(source: &(impl SettingsSource + ?Sized)) -> Result<Self, SettingsError> {
        Ok(Self {
            cluster_name: source.required(
                "CLUSTER_NAME",
                "set it to the name of the EKS cluster this function serves",
            )?,
            additional_cluster_names: source.list("ADDITIONAL_CLUSTER_NAMES"),
        })
    }

    /// Every name the cluster is known by: `CLUSTER_NAME`, then `ADDITIONAL_CLUSTER_NAMES`.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.cluster_name).chain(&self.additional_cluster_names)
    }

    /// Whether `name` is this function's cluster.
    pub fn includes(&self, name: &str) -> bool {
        self.names().any(|n| n == name)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_typed_values_and_names_the_bad_one() {
        let env: &[(&str, &str)] = &[
            ("CLUSTER_NAME", " ironman-2022 "),
            ("SETTLE_SECONDS", "12"),
            ("FORCE", "yes"),
            ("BAD", "soon"),
            ("LIST", "a, ,b"),
        ];
        assert_eq!(
            env.seconds("SETTLE_SECONDS", Duration::from_secs(60)),
            Ok(Duration::from_secs(12))
        );
        assert_eq!(
            env.seconds("UNSET", Duration::from_secs(60)),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(env.flag("FORCE", false), Ok(true));
        assert_eq!(env.list("LIST"), vec!["a", "b"]);
        let err = env.seconds("BAD", Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("BAD=\"soon\""), "{err}");
        let scope = ClusterScope::from_source(env).unwrap();
        assert!(scope.includes("ironman-2022"));
        assert!(!scope.includes("other"));
    }

    #[test]
    fn missing_cluster_name_says_what_to_set() {
        let env: &[(&str, &str)] = &[];
        let err = ClusterScope::from_source(env).unwrap_err();
        assert!(err.to_string().contains("CLUSTER_NAME"));
    }
}
