//! Which PodDisruptionBudgets cover a pod, to name them when its eviction keeps failing.
//!
//! A 429 names the budget that refused, but a pod two budgets select gets a 500 naming none,
//! and that is exactly the case an operator has to fix by hand. Listing the namespace's
//! budgets (RBAC: `list` only) and matching their selectors answers it for every case.

use std::collections::BTreeMap;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::ListParams;

/// Whether `selector` selects a pod with `labels`. In policy/v1 an empty selector selects
/// every pod of the namespace, and a missing one selects none.
pub(crate) fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_match = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An operator the API server would have rejected: select nothing.
            _ => false,
        }
    });
    labels_match && expressions_match
}

/// The names of `budgets` that select a pod with `labels`, sorted.
pub fn covering(budgets: &[PodDisruptionBudget], labels: &BTreeMap<String, String>) -> Vec<String> {
    let mut names: Vec<String> = budgets
        .iter()
        .filter(|b| selector_matches(b.spec.as_ref().and_then(|s| s.selector.as_ref()), labels))
        .filter_map(|b| b.metadata.name.clone())
        .collect();
    names.sort();
    names
}

/// The budgets of `namespace` (one list call). Errors are the caller's to degrade on: the
/// report is still useful without budget names.
pub async fn list(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<PodDisruptionBudget>, kube::Error> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    Ok(api.list(&ListParams::default()).await?.items)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn pdb(name: &str, selector: serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": selector},
        }))
        .unwrap()
    }

    #[test]
    fn match_labels_and_expressions() {
        let pod = labels(&[("app", "nginx"), ("tier", "web")]);
        let budgets = vec![
            pdb("by-app", json!({"matchLabels": {"app": "nginx"}})),
            pdb(
                "by-tier",
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]}),
            ),
            pdb("other", json!({"matchLabels": {"app": "redis"}})),
            pdb(
                "not-in",
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["web"]}]}),
            ),
            pdb(
                "no-canary",
                json!({"matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]}),
            ),
            pdb("everything", json!({})),
        ];
        assert_eq!(
            covering(&budgets, &pod),
            ["by-app", "by-tier", "everything", "no-canary"]
        );
    }

    #[test]
    fn missing_selector_selects_nothing() {
        let mut budget = pdb("x", json!({}));
        budget.spec.as_mut().unwrap().selector = None;
        assert!(covering(&[budget], &labels(&[("app", "nginx")])).is_empty());
    }
}
