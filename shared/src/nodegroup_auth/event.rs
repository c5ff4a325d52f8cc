//! What an invocation asks for: a CloudTrail-via-EventBridge record of `CreateNodegroup` /
//! `DeleteNodegroup`, or a direct request to reconcile one or all node groups.
//!
//! The event only says *which* node group; everything that is written comes from
//! `DescribeNodegroup`. Even so the event is checked: source `aws.eks`, this function's
//! account and region; an event of another cluster of the account is answered as ignored
//! (not an error: every stack of the account sees it). Direct requests have a closed shape
//! (unknown fields such as `groups` or `nodeRole` are rejected), so nobody can smuggle a
//! group or a role into the mapping through the payload.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde::{Deserialize, Serialize};
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

/// The part of a CloudTrail record (the EventBridge event's `detail`) this function reads;
/// every other field is ignored. `aws_lambda_events`' `AWSAPICall` is not used: it requires
/// fields this function never reads (`userIdentity`, `sourceIPAddress`, `userAgent`, ...) and
/// lacks the ones it does (`recipientAccountId`, `errorCode`).
// `Serialize` only because `EventBridgeEvent<T>` requires it of its detail type.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct CloudTrailCall {
    event_source: Option<String>,
    event_name: Option<String>,
    aws_region: Option<String>,
    recipient_account_id: Option<String>,
    error_code: Option<Value>,
    #[serde(default)]
    request_parameters: Option<NodegroupRequest>,
    #[serde(default)]
    response_elements: Option<NodegroupResponse>,
}

/// `CreateNodegroup` / `DeleteNodegroup` request parameters: the cluster name (a URI
/// parameter) is `name`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct NodegroupRequest {
    name: Option<String>,
    nodegroup_name: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
struct NodegroupResponse {
    nodegroup: Option<NodegroupElements>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct NodegroupElements {
    cluster_name: Option<String>,
    nodegroup_name: Option<String>,
    node_role: Option<String>,
}

fn parse_cloudtrail(
    payload: &Value,
    origin: &Origin,
    scope: &ClusterScope,
) -> Result<Invocation, InvocationError> {
    let event: EventBridgeEvent<CloudTrailCall> = serde_path_to_error::deserialize(payload)
        .map_err(|err| {
            InvocationError::Malformed(format!(
                "not an EventBridge CloudTrail event: {}: {}",
                err.path(),
                err.inner()
            ))
        })?;
    if event.source != "aws.eks" {
        return Err(InvocationError::WrongSource(event.source));
    }
    if event.detail_type != "AWS API Call via CloudTrail" {
        return Err(InvocationError::WrongDetailType(event.detail_type));
    }
    let call = event.detail;
    check_origin(
        [
            Some(event.account.unwrap_or_default()),
            call.recipient_account_id,
        ],
        [event.region, call.aws_region],
        origin,
    )?;
    let event_source = call.event_source.unwrap_or_default();
    if event_source != "eks.amazonaws.com" {
        return Err(InvocationError::WrongSource(event_source));
    }
    let event_name = call.event_name.unwrap_or_default();
    if !matches!(event_name.as_str(), "CreateNodegroup" | "DeleteNodegroup") {
        return Ok(Invocation::Ignore {
            reason: format!("{event_name:?} is not CreateNodegroup or DeleteNodegroup"),
        });
    }
    if let Some(code) = call.error_code.filter(|v| !v.is_null()) {
        return Ok(Invocation::Ignore {
            reason: format!("{event_name} failed ({code}); nothing changed"),
        });
    }
    let request = call.request_parameters.unwrap_or_default();
    let response = call
        .response_elements
        .and_then(|r| r.nodegroup)
        .unwrap_or_default();
    let cluster = agreed_name("cluster name", response.cluster_name, request.name)?;
    // nodegroup-auth serves exactly one cluster (CLUSTER_NAME; ADDITIONAL_CLUSTER_NAMES is
    // refused at start-up): its cluster client and IAM policy are for that one only.
    if cluster != scope.cluster_name {
        return Ok(Invocation::OtherCluster { cluster });
    }
    let nodegroup = agreed_name(
        "node group name",
        response.nodegroup_name,
        request.nodegroup_name,
    )?;
    Ok(if event_name == "CreateNodegroup" {
        Invocation::Grant { cluster, nodegroup }
    } else {
        Invocation::Revoke {
            cluster,
            nodegroup,
            event_node_role: response.node_role,
        }
    })
}

/// Every place that names an account or region must agree with this function's: the
/// envelope's are required (given as `Some`, empty when absent), the record's checked when
/// present (`None` when absent); an absent region is empty and never agrees.
fn check_origin(
    accounts: [Option<String>; 2],
    regions: [Option<String>; 2],
    origin: &Origin,
) -> Result<(), InvocationError> {
    for found in accounts.into_iter().flatten() {
        if found != origin.account_id {
            return Err(InvocationError::WrongAccount {
                found,
                expected: origin.account_id.clone(),
            });
        }
    }
    for found in regions {
        let found = found.unwrap_or_default();
        if found != origin.region {
            return Err(InvocationError::WrongRegion {
                found,
                expected: origin.region.clone(),
            });
        }
    }
    Ok(())
}

/// The name from the response (preferred) and the request; when both are present they
/// must be the same.
fn agreed_name(
    what: &'static str,
    response: Option<String>,
    request: Option<String>,
) -> Result<String, InvocationError> {
    match (response, request) {
        (Some(a), Some(b)) if a != b => Err(InvocationError::Malformed(format!(
            "the event names two different {what}s ({a:?} and {b:?}); refusing it"
        ))),
        (Some(name), _) | (None, Some(name)) => checked_name(what, &name),
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
