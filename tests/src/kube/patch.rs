//! PATCH bodies by content type: JSON merge patch (RFC 7386), JSON patch (RFC 6902),
//! strategic merge patch, and a small approximation of server-side apply.

use serde_json::Value;

use super::resources::ResourceType;
use super::status::ApiError;
use super::strategic_merge;

/// The patch formats the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    Json,
    /// Server-side apply, approximated as a merge patch that may create the object (field
    /// ownership is not tracked).
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        match essence {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/json-patch+json" => Ok(Self::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(Self::Apply),
            _ => Err(ApiError::unsupported_media_type(content_type)),
        }
    }
}

/// Applies `patch` to `current`, returning the patched object.
pub fn apply(
    resource: &ResourceType,
    patch_type: PatchType,
    current: &Value,
    patch: &[u8],
) -> Result<Value, ApiError> {
    let mut object = current.clone();
    match patch_type {
        PatchType::Merge | PatchType::Apply => {
            let patch = parse_json_or_yaml(patch, patch_type)?;
            json_patch::merge(&mut object, &patch);
        }
        PatchType::Strategic => {
            let patch: Value = serde_json::from_slice(patch)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            object = strategic_merge(resource, &object, &patch)?;
        }
        PatchType::Json => {
            let operations: json_patch::Patch = serde_json::from_slice(patch).map_err(|e| {
                ApiError::bad_request(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            })?;
            json_patch::patch(&mut object, &operations).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
        }
    }
    Ok(object)
}

pub fn parse_json_or_yaml(body: &[u8], patch_type: PatchType) -> Result<Value, ApiError> {
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    if patch_type == PatchType::Apply {
        let text = std::str::from_utf8(body)
            .map_err(|_| ApiError::bad_request("apply patch is not UTF-8"))?;
        return serde_saphyr::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")));
    }
    Err(ApiError::bad_request("error decoding patch: invalid JSON"))
}

/// Strategic merge patch (`kube::strategic_merge`), with the real server's error codes.
fn strategic_merge(
    resource: &ResourceType,
    current: &Value,
    patch: &Value,
) -> Result<Value, ApiError> {
    strategic_merge::strategic_merge_patch(resource.kind, current, patch).map_err(|error| {
        let code = error.status_code();
        let reason = match code {
            400 => "BadRequest",
            500 => "InternalError",
            _ => "",
        };
        ApiError::new(code, reason, error.to_string())
    })
}
