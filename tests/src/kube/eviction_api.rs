//! The `pods/eviction` subresource: the request flow of the real server (name check, pod
//! lookup, PDB lookup, budget spend, graceful delete), all under the store lock so that two
//! racing evictions cannot both spend a PDB's last allowed disruption.
//!
//! The decision itself (which pods skip the budget, what the budget allows) is the pure
//! function of `kube::eviction`.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};

use super::eviction;
use super::resources::{self, ResourceType};
use super::status::ApiError;
use super::store::{DeleteOptions, Store, UpdateMode, meta_str};

fn pods() -> Result<&'static ResourceType, ApiError> {
    resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("pods are not served"))
}

fn pdbs() -> Result<&'static ResourceType, ApiError> {
    resources::find("policy", "v1", "poddisruptionbudgets")
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets are not served"))
}

fn refusal(refusal: &eviction::EvictionRefusal) -> ApiError {
    let status = serde_json::to_value(refusal.to_status()).unwrap_or_default();
    let mut error = ApiError::new(
        refusal.code,
        refusal.reason.unwrap_or_default(),
        refusal.message.clone(),
    );
    error.details = status.get("details").cloned().map(Box::new);
    error.retry_after = refusal.retry_after_seconds.map(u64::from);
    error
}

/// Handles `POST .../pods/<name>/eviction`; answers the `Status` of a 201.
pub(crate) fn evict(
    store: &Store,
    namespace: &str,
    name: &str,
    body: &Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    eviction::check_eviction_name(name, meta_str(body, "name")).map_err(|r| refusal(&r))?;
    let mut options = body
        .get("deleteOptions")
        .map(DeleteOptions::from_json)
        .unwrap_or_default();
    let pods = pods()?;
    let pdbs_resource = pdbs()?;
    let mut state = store.lock();
    let pod_value = state.get(pods, namespace, name)?;
    let pod: Pod = serde_json::from_value(pod_value.clone())
        .map_err(|e| ApiError::internal(format!("stored pod does not decode: {e}")))?;
    let pdbs: Vec<PodDisruptionBudget> = state
        .iter(pdbs_resource, Some(namespace))
        .filter_map(|p| serde_json::from_value(p.clone()).ok())
        .collect();
    let now = jiff::Timestamp::now();
    let allowance = match eviction::evaluate_eviction(&pod, name, &pdbs, now) {
        eviction::EvictionDecision::Refuse(r) => return Err(refusal(&r)),
        eviction::EvictionDecision::Allow(allowance) => allowance,
    };
    if dry_run {
        // `dryRun=All` (kubectl drain --dry-run=server): the decision, no writes.
        return serde_json::to_value(eviction::eviction_success_status())
            .map_err(|e| ApiError::internal(format!("Status does not encode: {e}")));
    }
    // Everything below happens under the one store lock: the PDB and the pod cannot change
    // between the decision and the writes, so two racing evictions cannot both spend the
    // last unit of a budget.
    if let Some(spend) = &allowance.budget_spend {
        let mut pdb = state.get(pdbs_resource, namespace, &spend.pdb_name)?;
        pdb["status"] = serde_json::to_value(&spend.status)
            .map_err(|e| ApiError::internal(format!("PDB status does not encode: {e}")))?;
        state.update(
            pdbs_resource,
            namespace,
            &spend.pdb_name,
            pdb,
            UpdateMode::Status,
        )?;
    }
    if options.precondition_resource_version.is_none() {
        options.precondition_resource_version = allowance.pod_resource_version_precondition.clone();
    }
    if let Some(wanted) = &options.precondition_resource_version {
        let actual = meta_str(&pod_value, "resourceVersion");
        if wanted != actual {
            return Err(ApiError::conflict_because(
                pods,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {wanted}, ResourceVersion in object meta: {actual}"
                ),
            ));
        }
    }
    let mut pod_value = pod_value;
    if let Ok(condition) = serde_json::to_value(&allowance.disruption_target_condition) {
        if !pod_value["status"].is_object() {
            pod_value["status"] = json!({});
        }
        let conditions = pod_value["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut conditions: Vec<Value> = conditions
            .into_iter()
            .filter(|c| c.get("type") != condition.get("type"))
            .collect();
        conditions.push(condition);
        pod_value["status"]["conditions"] = Value::Array(conditions);
        let updated = state.update(pods, namespace, name, pod_value, UpdateMode::Status)?;
        // The condition write moved the pod's resourceVersion on purpose.
        if options.precondition_resource_version.is_some() {
            options.precondition_resource_version =
                Some(meta_str(&updated, "resourceVersion").to_owned());
        }
    }
    state.delete(pods, namespace, name, &options)?;
    serde_json::to_value(eviction::eviction_success_status())
        .map_err(|e| ApiError::internal(format!("Status does not encode: {e}")))
}
