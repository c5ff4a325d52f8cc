//! The write verbs: create, update and patch (of an object or its `status`), and the POSTs
//! that store nothing they receive: evictions and access reviews.

use super::dispatch::ResourceCall;
use super::request::parse_body;
use super::response::Outcome;
use crate::kube::eviction_api;
use crate::kube::patch::{self, PatchType};
use crate::kube::resources::ResourceType;
use crate::kube::reviews;
use crate::kube::status::ApiError;
use crate::kube::store::{Origin, UpdateMode, meta_str};

/// `POST pods/<name>/eviction`: the pod is deleted if its budgets allow it.
pub(super) fn evict(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let eviction = parse_body(call.body)?;
    let status = eviction_api::evict(
        &call.state.store,
        &call.state.disruptions,
        call.requester,
        call.namespace,
        call.name,
        &eviction,
        call.query.dry_run,
    )?;
    Ok(Outcome::Json(201, status))
}

/// A `SelfSubjectReview` or `SelfSubjectAccessReview`: answered from the request, never
/// stored.
pub(super) fn review(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let review = reviews::answer(
        &call.state.store,
        call.resource,
        call.user,
        parse_body(call.body)?,
    )?;
    Ok(Outcome::Json(201, review))
}

pub(super) fn create(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let object = parse_body(call.body)?;
    if call.query.dry_run {
        return Ok(Outcome::Json(201, object));
    }
    let created =
        call.state
            .store
            .lock()
            .create(call.resource, call.namespace, object, Origin::Client)?;
    Ok(Outcome::Json(201, created))
}

pub(super) fn update(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let object = parse_body(call.body)?;
    let store = &call.state.store;
    if call.query.dry_run {
        let current = store.lock().get(call.resource, call.namespace, call.name)?;
        return dry_run_write(call.resource, call.name, &current, object);
    }
    let updated = store.lock().update(
        call.resource,
        call.namespace,
        call.name,
        object,
        update_mode(call),
    )?;
    Ok(Outcome::Json(200, updated))
}

/// A patch of any [`PatchType`]; a server-side apply of a missing object creates it.
pub(super) fn patch(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let (resource, namespace, name) = (call.resource, call.namespace, call.name);
    let patch_type = PatchType::from_content_type(call.content_type)?;
    let mode = update_mode(call);
    let mut guard = call.state.store.lock();
    let current = match guard.get(resource, namespace, name) {
        Ok(current) => current,
        Err(error) if error.code == 404 && patch_type == PatchType::Apply => {
            let object = patch::parse_json_or_yaml(call.body, patch_type)?;
            let created = guard.create(resource, namespace, object, Origin::Client)?;
            return Ok(Outcome::Json(201, created));
        }
        Err(error) => return Err(error),
    };
    let patched = patch::apply(resource, patch_type, &current, call.body)?;
    if call.query.dry_run {
        return dry_run_write(resource, name, &current, patched);
    }
    let updated = guard.update(resource, namespace, name, patched, mode)?;
    Ok(Outcome::Json(200, updated))
}

/// A write to the `status` subresource changes the status only; any other, all but it.
fn update_mode(call: &ResourceCall<'_>) -> UpdateMode {
    if call.subresource == "status" {
        UpdateMode::Status
    } else {
        UpdateMode::Main
    }
}

/// `dryRun=All` for update/patch: the conflict check, then the object as it would be
/// written; nothing is stored.
fn dry_run_write(
    resource: &ResourceType,
    name: &str,
    current: &serde_json::Value,
    object: serde_json::Value,
) -> Result<Outcome, ApiError> {
    let wanted = meta_str(&object, "resourceVersion");
    if !wanted.is_empty() && wanted != meta_str(current, "resourceVersion") {
        return Err(ApiError::conflict(resource, name));
    }
    Ok(Outcome::Json(200, object))
}
