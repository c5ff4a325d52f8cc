//! What an invocation asks for: a CloudTrail-via-EventBridge record of `CreateNodegroup` /
//! `DeleteNodegroup`, or a direct request to reconcile one or all node groups.
//!
//! The event only says *which* node group; everything that is written comes from
//! `DescribeNodegroup`. Even so the event is checked: source `aws.eks`, this function's
//! account and region; an event of another cluster of the account is answered as ignored
//! (not an error: every stack of the account sees it). Direct requests have a closed shape
//! (unknown fields such as `groups` or `nodeRole` are rejected), so nobody can smuggle a
//! group or a role into the mapping through the payload.

use serde::Deserialize;
use serde_json::Value;

use crate::settings::ClusterScope;

/// Where the function runs: the account and region every event must come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub account_id: String,
    pub region: String,
}

/// A request the function acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// `CreateNodegroup` succeeded, or a direct request for one node group: ensure its role
    /// is mapped.
    Grant { cluster: String, nodegroup: String },
    /// `DeleteNodegroup` succeeded: unmap the role once no node group uses it.
    Revoke {
        cluster: String,
        nodegroup: String,
        /// `responseElements.nodegroup.nodeRole`, used only when the node group is already
        /// gone and cannot be described any more (a late delivery).
        event_node_role: Option<String>,
    },
    /// Direct request: ensure every node group's role of the cluster is mapped (backfill).
    GrantAll { cluster: String },
    /// Nothing to do (a failed call, another EKS API).
    Ignore { reason: String },
    /// A genuine-looking event (this account, region and source) for another cluster of the
    /// account: with one stack per cluster every function sees every cluster's events, so
    /// this is not an error (no retry, no failure queue), only a log line and a metric.
    OtherCluster { cluster: String },
}

/// A payload that is refused: nothing is read or written for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvocationError {
    #[error("event source {0:?} is not aws.eks; refusing it")]
    WrongSource(String),
    #[error("event detail-type {0:?} is not \"AWS API Call via CloudTrail\"; refusing it")]
    WrongDetailType(String),
    #[error(
        "event is from account {found:?}, but this function serves account {expected}; refusing it"
    )]
    WrongAccount { found: String, expected: String },
    #[error(
        "event is from region {found:?}, but this function serves region {expected}; refusing it"
    )]
    WrongRegion { found: String, expected: String },
    #[error("cluster {0:?} is not served by this function (CLUSTER_NAME); refusing it")]
    ForeignCluster(String),
    #[error("{0}")]
    Malformed(String),
}

/// The direct request shapes; any other field is an error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DirectRequest {
    cluster_name: String,
    nodegroup_name: Option<String>,
    reconcile: Option<String>,
}

impl Invocation {
    /// Reads and checks `payload`.
    pub fn parse(
        payload: &Value,
        origin: &Origin,
        scope: &ClusterScope,
    ) -> Result<Self, InvocationError> {
        let Some(object) = payload.as_object() else {
            return Err(InvocationError::Malformed(
                "the payload must be a JSON object".to_owned(),
            ));
        };
        if object.contains_key("detail-type") || object.contains_key("source") {
            parse_cloudtrail(payload, origin, scope)
        } else {
            parse_direct(payload, scope)
        }
    }
}

fn parse_direct(payload: &Value, scope: &ClusterScope) -> Result<Invocation, InvocationError> {
    let request = DirectRequest::deserialize(payload).map_err(|err| {
        InvocationError::Malformed(format!(
            "a direct invocation must be {{\"clusterName\": ..., \"nodegroupName\": ...}} or {{\"clusterName\": ..., \"reconcile\": \"all\"}}: {err}"
        ))
    })?;
    let cluster = checked_name("clusterName", &request.cluster_name)?;
    // A direct request is an operator's: naming another cluster is a mistake to report.
    if cluster != scope.cluster_name {
        return Err(InvocationError::ForeignCluster(cluster));
    }
    match (request.nodegroup_name, request.reconcile.as_deref()) {
        (Some(nodegroup), None) => Ok(Invocation::Grant {
            cluster,
            nodegroup: checked_name("nodegroupName", &nodegroup)?,
        }),
        (None, Some("all")) => Ok(Invocation::GrantAll { cluster }),
        _ => Err(InvocationError::Malformed(
            "a direct invocation needs exactly one of nodegroupName or \"reconcile\": \"all\""
                .to_owned(),
        )),
    }
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

fn parse_cloudtrail(
    event: &Value,
    origin: &Origin,
    scope: &ClusterScope,
) -> Result<Invocation, InvocationError> {
    let source = str_at(event, "/source").unwrap_or_default();
    if source != "aws.eks" {
        return Err(InvocationError::WrongSource(source.to_owned()));
    }
    let detail_type = str_at(event, "/detail-type").unwrap_or_default();
    if detail_type != "AWS API Call via CloudTrail" {
        return Err(InvocationError::WrongDetailType(detail_type.to_owned()));
    }
    // Every place that names an account or region must agree with this function's.
    for pointer in ["/account", "/detail/recipientAccountId"] {
        let found = str_at(event, pointer);
        if pointer == "/account" || found.is_some() {
            let found = found.unwrap_or_default();
            if found != origin.account_id {
                return Err(InvocationError::WrongAccount {
                    found: found.to_owned(),
                    expected: origin.account_id.clone(),
                });
            }
        }
    }
    for pointer in ["/region", "/detail/awsRegion"] {
        let found = str_at(event, pointer).unwrap_or_default();
        if found != origin.region {
            return Err(InvocationError::WrongRegion {
                found: found.to_owned(),
                expected: origin.region.clone(),
            });
        }
    }
    let event_source = str_at(event, "/detail/eventSource").unwrap_or_default();
    if event_source != "eks.amazonaws.com" {
        return Err(InvocationError::WrongSource(event_source.to_owned()));
    }
    let event_name = str_at(event, "/detail/eventName").unwrap_or_default();
    if !matches!(event_name, "CreateNodegroup" | "DeleteNodegroup") {
        return Ok(Invocation::Ignore {
            reason: format!("{event_name:?} is not CreateNodegroup or DeleteNodegroup"),
        });
    }
    if let Some(code) = event.pointer("/detail/errorCode").filter(|v| !v.is_null()) {
        return Ok(Invocation::Ignore {
            reason: format!("{event_name} failed ({code}); nothing changed"),
        });
    }
    let cluster = agreed_name(
        event,
        "cluster name",
        "/detail/responseElements/nodegroup/clusterName",
        "/detail/requestParameters/name",
    )?;
    // nodegroup-auth serves exactly one cluster (CLUSTER_NAME; ADDITIONAL_CLUSTER_NAMES is
    // refused at start-up): its cluster client and IAM policy are for that one only.
    if cluster != scope.cluster_name {
        return Ok(Invocation::OtherCluster { cluster });
    }
    let nodegroup = agreed_name(
        event,
        "node group name",
        "/detail/responseElements/nodegroup/nodegroupName",
        "/detail/requestParameters/nodegroupName",
    )?;
    Ok(if event_name == "CreateNodegroup" {
        Invocation::Grant { cluster, nodegroup }
    } else {
        Invocation::Revoke {
            cluster,
            nodegroup,
            event_node_role: str_at(event, "/detail/responseElements/nodegroup/nodeRole")
                .map(str::to_owned),
        }
    })
}

/// The name from the response (preferred) and the request; when both are present they
/// must be the same.
fn agreed_name(
    event: &Value,
    what: &'static str,
    response: &str,
    request: &str,
) -> Result<String, InvocationError> {
    match (str_at(event, response), str_at(event, request)) {
        (Some(a), Some(b)) if a != b => Err(InvocationError::Malformed(format!(
            "the event names two different {what}s ({a:?} and {b:?}); refusing it"
        ))),
        (Some(name), _) | (None, Some(name)) => checked_name(what, name),
        (None, None) => Err(InvocationError::Malformed(format!(
            "the event does not name the {what}"
        ))),
    }
}

/// EKS cluster and node group names: 1-100 characters, alphanumerics, `-` and `_`,
/// starting with an alphanumeric.
fn checked_name(what: &str, name: &str) -> Result<String, InvocationError> {
    let valid = !name.is_empty()
        && name.len() <= 100
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if valid {
        Ok(name.to_owned())
    } else {
        Err(InvocationError::Malformed(format!(
            "{what} {name:?} is not a valid EKS name"
        )))
    }
}
