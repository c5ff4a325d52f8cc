//! The `pods/eviction` subresource: the request flow of the real server (name check, pod
//! lookup, PDB lookup, budget spend, graceful delete), all under the store lock so that two
//! racing evictions cannot both spend a PDB's last allowed disruption.
//!
//! The decision itself (which pods skip the budget, what the budget allows) is the pure
//! function of `kube::eviction`.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};

use super::disruption_log::{self, DisruptionLog, EvictionOutcome, EvictionRecord, Requester};
use super::eviction;
use super::resources::{self, ResourceType};
use super::status::ApiError;
use super::store::{DeleteOptions, State, Store, UpdateMode, labels_of, meta_str};

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

/// Handles `POST .../pods/<name>/eviction`; answers the `Status` of a 201. Every request
/// that gets this far is written to `log`, under the store lock of its decision.
pub(crate) fn evict(
    store: &Store,
    log: &DisruptionLog,
    requester: &Requester,
    namespace: &str,
    name: &str,
    body: &Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let mut record = EvictionRecord {
        sequence: 0,
        at: jiff::Timestamp::now(),
        namespace: namespace.to_owned(),
        pod: name.to_owned(),
        requester: requester.clone(),
        dry_run,
        pod_was_healthy: false,
        budgets: Vec::new(),
        outcome: EvictionOutcome::PodNotFound,
        resource_version: 0,
    };
    if let Err(refused) = eviction::check_eviction_name(name, meta_str(body, "name")) {
        record.outcome = refused_outcome(&refused);
        record.resource_version = store.resource_version();
        log.record_eviction(record);
        return Err(refusal(&refused));
    }
    let options = body
        .get("deleteOptions")
        .map(DeleteOptions::from_json)
        .unwrap_or_default();
    let pods = pods()?;
    let pdbs_resource = pdbs()?;
    let mut state = store.lock();
    // The NamespaceLifecycle admission plugin answers before the pod is looked up.
    if state.namespace_terminating(namespace) {
        let refused = ApiError::namespace_terminating("pods", name, namespace);
        record.outcome = EvictionOutcome::Refused {
            code: 403,
            reason: Some("NamespaceTerminating"),
            message: refused.message.clone(),
        };
        record.resource_version = state.resource_version();
        log.record_eviction(record);
        return Err(refused);
    }
    let pod_value = match state.get(pods, namespace, name) {
        Ok(pod) => pod,
        Err(error) => {
            record.resource_version = state.resource_version();
            log.record_eviction(record);
            return Err(error);
        }
    };
    let pod: Pod = serde_json::from_value(pod_value.clone())
        .map_err(|e| ApiError::internal(format!("stored pod does not decode: {e}")))?;
    let pdbs: Vec<PodDisruptionBudget> = state
        .iter(pdbs_resource, Some(namespace))
        .filter_map(|p| serde_json::from_value(p.clone()).ok())
        .collect();
    record.pod_was_healthy = disruption_log::pod_value_is_healthy(&pod_value);
    record.budgets = disruption_log::budgets_covering(&state, namespace, &labels_of(&pod_value));
    record.at = jiff::Timestamp::now();
    let allowance = match eviction::evaluate_eviction(&pod, name, &pdbs, record.at) {
        eviction::EvictionDecision::Refuse(refused) => {
            record.outcome = refused_outcome(&refused);
            record.resource_version = state.resource_version();
            log.record_eviction(record);
            return Err(refusal(&refused));
        }
        eviction::EvictionDecision::Allow(allowance) => allowance,
    };
    if dry_run {
        // `dryRun=All` (kubectl drain --dry-run=server): the decision, no writes.
        record.outcome = EvictionOutcome::Granted(allowance.because);
        record.resource_version = state.resource_version();
        log.record_eviction(record);
        return serde_json::to_value(eviction::eviction_success_status())
            .map_err(|e| ApiError::internal(format!("Status does not encode: {e}")));
    }
    let written = write_eviction(&mut state, namespace, name, pod_value, &allowance, options);
    disruption_log::count_after(&state, &mut record.budgets);
    record.outcome = match &written {
        Ok(()) => EvictionOutcome::Granted(allowance.because),
        Err(error) => EvictionOutcome::WriteFailed {
            because: allowance.because,
            code: error.code,
            message: error.message.clone(),
        },
    };
    record.resource_version = state.resource_version();
    log.record_eviction(record);
    written?;
    serde_json::to_value(eviction::eviction_success_status())
        .map_err(|e| ApiError::internal(format!("Status does not encode: {e}")))
}

fn refused_outcome(refused: &eviction::EvictionRefusal) -> EvictionOutcome {
    EvictionOutcome::Refused {
        code: refused.code,
        reason: refused.reason,
        message: refused.message.clone(),
    }
}

/// The writes of an allowed eviction, in the real handler's order: the PDB status, the
/// pod's `DisruptionTarget` condition, the graceful delete. Called under the store lock
/// of the decision, so the PDB and the pod cannot change in between and two racing
/// evictions cannot both spend the last unit of a budget.
fn write_eviction(
    state: &mut State,
    namespace: &str,
    name: &str,
    pod_value: Value,
    allowance: &eviction::EvictionAllowance,
    mut options: DeleteOptions,
) -> Result<(), ApiError> {
    let pods = pods()?;
    let pdbs_resource = pdbs()?;
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
    Ok(())
}
