//! One policy/v1 `Eviction` and what its answer means for the drain.
//!
//! Eviction, not deletion: the API server checks the pod's PodDisruptionBudgets, so a drain
//! never takes more replicas down than the application allows. The request carries the pod's
//! UID as a precondition, so a replacement that reuses the name (a StatefulSet pod) is never
//! evicted by mistake. The request is built by hand rather than with `Api::evict`, which
//! neither sends `deleteOptions` in the API's spelling nor exposes the `Retry-After` header.

use std::time::Duration;

use http::{Request, StatusCode};
use kube::client::Body;
use serde_json::json;

use super::plan::PodKey;

/// The `details.causes[].type` the API server gives a 429 refused by a PodDisruptionBudget.
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";
/// The `details.causes[].type` of a 403 for a pod whose namespace is being deleted.
pub(crate) const NAMESPACE_TERMINATING_CAUSE: &str = "NamespaceTerminating";

/// What an eviction request's answer means for the drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// 2xx: the pod is being deleted; wait for it to go.
    Accepted,
    /// 404: the pod the drain wanted gone is gone.
    Gone,
    /// 409: the API server gave up on its own conflict retries (the pod kept changing), or the
    /// UID precondition failed. Neither proves the pod gone: retried with backoff, and the
    /// watch of the node's pods tells whether the pod with this UID is still there (a UID
    /// change or a deletion drops it from the plan, and so from the retries).
    Conflict { message: String },
    /// 429 from a PodDisruptionBudget: retry later. `budgets` names them when the server said.
    BlockedByBudget {
        budgets: Vec<String>,
        retry_after: Option<Duration>,
        message: String,
    },
    /// 500 "more than one PodDisruptionBudget": the API server refuses to evict a pod two
    /// budgets select. Retried (an operator may fix the budgets) and reported.
    MultipleBudgets { message: String },
    /// 403 NamespaceTerminating: the namespace's deletion should remove the pod, but until
    /// the pod has a `deletionTimestamp` nothing proves it: retried with backoff, and waited
    /// for (not evicted again) once the watch shows it being deleted.
    NamespaceTerminating,
    /// Throttling (429 without a budget), 5xx, or the API server could not be reached.
    Transient {
        retry_after: Option<Duration>,
        message: String,
    },
    /// Anything else (e.g. 403 from RBAC): retried slowly and reported, since only an
    /// operator can fix it.
    Rejected { status: u16, message: String },
}

impl EvictionOutcome {
    /// Whether the pod is leaving (or left) and the drain only has to watch it go.
    pub fn is_leaving(&self) -> bool {
        matches!(self, Self::Accepted | Self::Gone)
    }

    /// The server's `Retry-After`, when it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::BlockedByBudget { retry_after, .. } | Self::Transient { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// A short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Gone => "gone",
            Self::Conflict { .. } => "conflict",
            Self::BlockedByBudget { .. } => "blocked_by_budget",
            Self::MultipleBudgets { .. } => "multiple_budgets",
            Self::NamespaceTerminating => "namespace_terminating",
            Self::Transient { .. } => "transient",
            Self::Rejected { .. } => "rejected",
        }
    }

    /// Classifies an eviction answer: HTTP status, `Retry-After` header and body (a
    /// `metav1.Status` for failures).
    pub fn classify(status: StatusCode, retry_after_header: Option<&str>, body: &[u8]) -> Self {
        if status.is_success() {
            return Self::Accepted;
        }
        let parsed: Option<kube::core::Status> = serde_json::from_slice(body).ok();
        let message = parsed
            .as_ref()
            .map(|s| s.message.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(300).collect());
        let causes = parsed
            .as_ref()
            .and_then(|s| s.details.as_ref())
            .map(|d| d.causes.clone())
            .unwrap_or_default();
        let retry_after = retry_after_header
            .and_then(|v| v.trim().parse::<u64>().ok())
            .or_else(|| {
                parsed
                    .as_ref()
                    .and_then(|s| s.details.as_ref())
                    .map(|d| u64::from(d.retry_after_seconds))
                    .filter(|s| *s > 0)
            })
            .map(Duration::from_secs);
        match status {
            StatusCode::NOT_FOUND => Self::Gone,
            StatusCode::CONFLICT => Self::Conflict { message },
            StatusCode::TOO_MANY_REQUESTS => {
                let budgets: Vec<String> = causes
                    .iter()
                    .filter(|c| c.reason == DISRUPTION_BUDGET_CAUSE)
                    .filter_map(|c| budget_name(&c.message))
                    .collect();
                let mentions_budget = !budgets.is_empty()
                    || causes.iter().any(|c| c.reason == DISRUPTION_BUDGET_CAUSE)
                    || message.contains("disruption budget");
                if mentions_budget {
                    Self::BlockedByBudget {
                        budgets,
                        retry_after,
                        message,
                    }
                } else {
                    Self::Transient {
                        retry_after,
                        message,
                    }
                }
            }
            StatusCode::FORBIDDEN
                if causes
                    .iter()
                    .any(|c| c.reason == NAMESPACE_TERMINATING_CAUSE) =>
            {
                Self::NamespaceTerminating
            }
            StatusCode::INTERNAL_SERVER_ERROR
                if message.contains("more than one PodDisruptionBudget") =>
            {
                Self::MultipleBudgets { message }
            }
            s if s.is_server_error() => Self::Transient {
                retry_after,
                message,
            },
            s => Self::Rejected {
                status: s.as_u16(),
                message,
            },
        }
    }
}

/// The budget's name in the API server's cause message
/// ("The disruption budget web-pdb needs 4 healthy pods and has 4 currently").
fn budget_name(message: &str) -> Option<String> {
    let rest = message.strip_prefix("The disruption budget ")?;
    let name = rest.split_whitespace().next()?;
    Some(name.to_owned())
}

/// The grace period sent for a configured `POD_GRACE_PERIOD_SECONDS`: at least 1, as
/// `kubectl drain --grace-period=0` sends, since 0 asks the API server for an immediate
/// deletion that does not wait for the kubelet to stop the containers.
pub(crate) fn grace_to_send(configured: Duration) -> i64 {
    i64::try_from(configured.as_secs())
        .unwrap_or(i64::MAX)
        .max(1)
}

/// The body of a policy/v1 Eviction for `pod`.
pub(crate) fn eviction_body(pod: &PodKey, grace_period_seconds: Option<i64>) -> serde_json::Value {
    let mut delete_options = json!({"preconditions": {"uid": pod.uid}});
    if let Some(grace) = grace_period_seconds {
        delete_options["gracePeriodSeconds"] = json!(grace);
    }
    json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "deleteOptions": delete_options,
    })
}

/// Asks the API server to evict `pod`. Transport failures come back as
/// [`EvictionOutcome::Transient`]: the caller retries them like a 5xx.
pub async fn evict(
    client: &kube::Client,
    pod: &PodKey,
    grace_period_seconds: Option<i64>,
) -> EvictionOutcome {
    let uri = format!(
        "/api/v1/namespaces/{}/pods/{}/eviction",
        pod.namespace, pod.name
    );
    let body = eviction_body(pod, grace_period_seconds).to_string();
    let request = match Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.into_bytes()))
    {
        Ok(request) => request,
        Err(error) => {
            return EvictionOutcome::Rejected {
                status: 0,
                message: format!("could not build the eviction request for {pod}: {error}"),
            };
        }
    };
    let response = match client.send(request).await {
        Ok(response) => response,
        Err(error) => {
            return EvictionOutcome::Transient {
                retry_after: None,
                message: error.to_string(),
            };
        }
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match response.into_body().collect_bytes().await {
        Ok(bytes) => EvictionOutcome::classify(status, retry_after.as_deref(), &bytes),
        Err(error) if status.is_success() => {
            tracing::debug!(%error, "eviction accepted; its answer could not be read");
            EvictionOutcome::Accepted
        }
        Err(error) => EvictionOutcome::Transient {
            retry_after: None,
            message: error.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn status(code: u16, reason: &str, message: &str, causes: serde_json::Value) -> Vec<u8> {
        json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": code, "reason": reason, "message": message,
            "details": {"causes": causes, "retryAfterSeconds": 0},
        })
        .to_string()
        .into_bytes()
    }

    fn classify(code: u16, retry_after: Option<&str>, body: &[u8]) -> EvictionOutcome {
        EvictionOutcome::classify(StatusCode::from_u16(code).unwrap(), retry_after, body)
    }

    #[test]
    fn success_not_found_and_precondition_conflict() {
        assert_eq!(classify(201, None, b"{}"), EvictionOutcome::Accepted);
        assert_eq!(classify(200, None, b""), EvictionOutcome::Accepted);
        let nf = status(404, "NotFound", "pods \"x\" not found", json!([]));
        assert_eq!(classify(404, None, &nf), EvictionOutcome::Gone);
        let conflict = status(
            409,
            "Conflict",
            "Precondition failed: UID in precondition",
            json!([]),
        );
        // A 409 does not prove the pod gone: retried, the watch decides.
        let outcome = classify(409, None, &conflict);
        assert!(
            matches!(outcome, EvictionOutcome::Conflict { .. }),
            "{outcome:?}"
        );
        assert!(!outcome.is_leaving());
        assert!(EvictionOutcome::Gone.is_leaving());
        assert!(!EvictionOutcome::NamespaceTerminating.is_leaving());
    }

    #[test]
    fn budget_refusal_names_the_budget_and_honours_retry_after() {
        let body = status(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            json!([{"reason": "DisruptionBudget", "message": "The disruption budget nginx-pdb needs 4 healthy pods and has 4 currently"}]),
        );
        let outcome = classify(429, Some("10"), &body);
        assert_eq!(
            outcome,
            EvictionOutcome::BlockedByBudget {
                budgets: vec!["nginx-pdb".into()],
                retry_after: Some(Duration::from_secs(10)),
                message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            }
        );
        assert_eq!(outcome.retry_after(), Some(Duration::from_secs(10)));
        assert!(!outcome.is_leaving());
    }

    #[test]
    fn throttling_and_server_errors_are_transient() {
        let body = status(429, "TooManyRequests", "too many requests", json!([]));
        assert!(matches!(
            classify(429, None, &body),
            EvictionOutcome::Transient {
                retry_after: None,
                ..
            }
        ));
        let body = json!({"status": "Failure", "code": 429, "details": {"retryAfterSeconds": 3}})
            .to_string();
        assert_eq!(
            classify(429, None, body.as_bytes()).retry_after(),
            Some(Duration::from_secs(3))
        );
        assert!(matches!(
            classify(503, None, b"upstream connect error"),
            EvictionOutcome::Transient { .. }
        ));
        assert!(matches!(
            classify(
                500,
                None,
                &status(500, "InternalError", "etcd timeout", json!([]))
            ),
            EvictionOutcome::Transient { .. }
        ));
    }

    #[test]
    fn two_budgets_namespace_terminating_and_rbac() {
        let body = status(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            json!([]),
        );
        assert!(matches!(
            classify(500, None, &body),
            EvictionOutcome::MultipleBudgets { .. }
        ));
        let body = status(
            403,
            "Forbidden",
            "pods \"x\" is forbidden: unable to create new content in namespace gone because it is being terminated",
            json!([{"reason": "NamespaceTerminating", "message": "namespace gone is being terminated", "field": "metadata.namespace"}]),
        );
        assert_eq!(
            classify(403, None, &body),
            EvictionOutcome::NamespaceTerminating
        );
        let body = status(
            403,
            "Forbidden",
            "cannot create resource \"pods/eviction\"",
            json!([]),
        );
        assert_eq!(
            classify(403, None, &body),
            EvictionOutcome::Rejected {
                status: 403,
                message: "cannot create resource \"pods/eviction\"".into()
            }
        );
    }

    #[test]
    fn a_zero_grace_period_is_sent_as_one() {
        assert_eq!(grace_to_send(Duration::ZERO), 1);
        assert_eq!(grace_to_send(Duration::from_millis(500)), 1);
        assert_eq!(grace_to_send(Duration::from_secs(7)), 7);
    }

    #[test]
    fn body_carries_uid_precondition_and_optional_grace() {
        let pod = PodKey {
            namespace: "default".into(),
            name: "nginx-1".into(),
            uid: "u-1".into(),
        };
        let body = eviction_body(&pod, None);
        assert_eq!(body["apiVersion"], "policy/v1");
        assert_eq!(body["deleteOptions"]["preconditions"]["uid"], "u-1");
        assert!(body["deleteOptions"].get("gracePeriodSeconds").is_none());
        assert_eq!(
            eviction_body(&pod, Some(0))["deleteOptions"]["gracePeriodSeconds"],
            0
        );
    }
}
