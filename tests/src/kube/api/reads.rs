//! The read verbs: get, list (JSON or `Table`) and watch.

use std::time::Duration;

use serde_json::{Value, json};

use super::dispatch::ResourceCall;
use super::request::Query;
use super::response::Outcome;
use crate::kube::fields::FieldQuery;
use crate::kube::resources::ResourceType;
use crate::kube::selectors::LabelQuery;
use crate::kube::status::ApiError;
use crate::kube::store::ListPage;
use crate::kube::table;
use crate::kube::watch::{self, WatchRequest};

pub(super) fn get(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let object = call
        .state
        .store
        .lock()
        .get(call.resource, call.namespace, call.name)?;
    Ok(Outcome::Json(
        200,
        table::maybe_table(call.resource, call.accept, vec![object], None, false),
    ))
}

pub(super) fn list(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let labels = label_query(call.query)?;
    let fields = field_query(call.query, call.resource)?;
    let page = call.state.store.lock().list(
        call.resource,
        call.namespace_scope(),
        &labels,
        &fields,
        call.query.limit,
        call.query.continue_token.as_deref(),
    )?;
    if table::wants_table(call.accept) {
        return Ok(Outcome::Json(
            200,
            table::maybe_table(
                call.resource,
                call.accept,
                page.items.clone(),
                Some(&page),
                true,
            ),
        ));
    }
    Ok(Outcome::Json(200, list_object(call.resource, page)))
}

/// The `<Kind>List` of a page; its items drop `kind` and `apiVersion`, as the real server's
/// list items do.
fn list_object(resource: &ResourceType, page: ListPage) -> Value {
    let items: Vec<Value> = page
        .items
        .into_iter()
        .map(|mut item| {
            if let Some(map) = item.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            item
        })
        .collect();
    let mut metadata = json!({ "resourceVersion": page.resource_version.to_string() });
    if let Some(token) = &page.continue_token {
        metadata["continue"] = json!(token);
    }
    if let Some(remaining) = page.remaining {
        metadata["remainingItemCount"] = json!(remaining);
    }
    json!({
        "kind": resource.list_kind(),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
        "items": items,
    })
}

pub(super) fn watch(call: &ResourceCall<'_>) -> Result<Outcome, ApiError> {
    let labels = label_query(call.query)?;
    let fields = field_query(call.query, call.resource)?;
    let response = watch::start(
        call.state,
        WatchRequest {
            resource: call.resource,
            namespace: call.namespace_scope().map(str::to_owned),
            labels,
            fields,
            resource_version: call.query.resource_version.clone(),
            timeout: Duration::from_secs(call.query.timeout_seconds.unwrap_or(1800)),
            bookmarks: call.query.allow_watch_bookmarks,
        },
    )?;
    Ok(Outcome::Stream(response))
}

pub(super) fn label_query(query: &Query) -> Result<LabelQuery, ApiError> {
    LabelQuery::parse(query.label_selector.as_deref().unwrap_or_default())
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

pub(super) fn field_query(query: &Query, resource: &ResourceType) -> Result<FieldQuery, ApiError> {
    FieldQuery::parse(
        query.field_selector.as_deref().unwrap_or_default(),
        resource,
    )
}
