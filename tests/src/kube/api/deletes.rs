//! The delete verbs. Deleting a pod bypasses the eviction subresource and every PDB, so each
//! pod deletion is also kept in the disruption log, with the budgets' counts taken under the
//! lock of the delete.

use serde_json::json;

use super::dispatch::ResourceCall;
use super::reads::{field_query, label_query};
use super::request::parse_body;
use super::response::Outcome;
use crate::kube::disruption_log::PendingDeletion;
use crate::kube::resources::ResourceType;
use crate::kube::status::ApiError;
use crate::kube::store::{DeleteOptions, meta_str};

/// Core `pods` (the only resource whose deletion the disruption log keeps).
fn is_pods(resource: &ResourceType) -> bool {
    resource.group.is_empty() && resource.plural == "pods"
}

/// The body's `DeleteOptions`, where `gracePeriodSeconds` in the query wins over the body's.
fn delete_options(call: &ResourceCall<'_>) -> Result<DeleteOptions, ApiError> {
    let mut options = if call.body.is_empty() {
        DeleteOptions::default()
    } else {
        DeleteOptions::from_json(&parse_body(call.body)?)
    };
    if call.query.grace_period_seconds.is_some() {
        options.grace_period_seconds = call.query.grace_period_seconds;
    }
    Ok(options)
}

pub(super) fn delete(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let (resource, namespace, name) = (call.resource, call.namespace, call.name);
    let dry_run = call.query.dry_run;
    let options = delete_options(call)?;
    let mut guard = call.state.store.lock();
    let pending = is_pods(resource).then(|| {
        PendingDeletion::before(
            &guard,
            namespace,
            name,
            call.requester,
            false,
            dry_run,
            options.grace_period_seconds,
        )
    });
    let result = if dry_run {
        // `dryRun=All`: what exists is answered, nothing is deleted.
        guard.get(resource, namespace, name)
    } else {
        guard
            .delete(resource, namespace, name, &options)
            .map(|deleted| deleted.body().clone())
    };
    if let Some(pending) = pending {
        let code = result.as_ref().map_or_else(|error| error.code, |_| 200);
        pending.finish(&guard, code, &call.state.disruptions);
    }
    Ok(Outcome::Json(200, result?))
}

/// Deletes what a list with the same selectors would return, one object at a time; the
/// answer lists the objects deleted.
pub(super) fn delete_collection(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let resource = call.resource;
    let labels = label_query(call.query)?;
    let fields = field_query(call.query, resource)?;
    let options = delete_options(call)?;
    let mut guard = call.state.store.lock();
    let page = guard.list(
        resource,
        call.namespace_scope(),
        &labels,
        &fields,
        None,
        None,
    )?;
    let mut items = Vec::new();
    for item in page.items {
        let item_namespace = meta_str(&item, "namespace").to_owned();
        let item_name = meta_str(&item, "name").to_owned();
        let pending = is_pods(resource).then(|| {
            PendingDeletion::before(
                &guard,
                &item_namespace,
                &item_name,
                call.requester,
                true,
                false,
                options.grace_period_seconds,
            )
        });
        let result = guard.delete(resource, &item_namespace, &item_name, &options);
        if let Some(pending) = pending {
            let code = result.as_ref().map_or_else(|error| error.code, |_| 200);
            pending.finish(&guard, code, &call.state.disruptions);
        }
        if let Ok(deleted) = result {
            items.push(deleted.body().clone());
        }
    }
    Ok(Outcome::Json(
        200,
        json!({
            "kind": resource.list_kind(),
            "apiVersion": resource.api_version(),
            "metadata": { "resourceVersion": guard.resource_version().to_string() },
            "items": items,
        }),
    ))
}
