//! The disruption controller's arithmetic: what `status` a PodDisruptionBudget gets.
//!
//! The eviction subresource only reads a PDB's status (`disruptionsAllowed`,
//! `currentHealthy`, `desiredHealthy`, `observedGeneration`); the kube-controller-manager's
//! disruption controller is what keeps that status in line with the pods. The fake API
//! server runs [`compute_pdb_status`] whenever a pod or PDB changes (and at
//! [`PdbStatusUpdate::recheck_at`]) so that a PDB-blocked drain makes progress exactly when
//! a real cluster's would: once replacement pods are Ready.
//!
//! Facts followed (from `pkg/controller/disruption/disruption.go`):
//! - the PDB covers every pod of its namespace its selector matches, whatever the phase;
//!   an absent selector covers none, an empty one covers all;
//! - healthy = Ready condition True, not being deleted, and not listed in `disruptedPods`
//!   within the deletion timeout (2 minutes);
//! - integer `minAvailable`: `expectedPods` is the number of covered pods; percentage
//!   `minAvailable` or any `maxUnavailable`: `expectedPods` is the sum of the scales of the
//!   distinct controllers of the covered pods (pods without a controller are skipped with an
//!   `UnmanagedPods` warning) and percentages round up;
//! - `disruptionsAllowed = max(0, currentHealthy - desiredHealthy)`, and 0 when
//!   `expectedPods` is 0;
//! - when the computation fails (a controller that cannot be found, a malformed percentage,
//!   an invalid selector) the controller "fails safe": `disruptionsAllowed` becomes 0 with a
//!   `SyncFailed` condition and `observedGeneration` is left as it was.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::selectors::{LabelQuery, object_labels};

/// How long an entry of `status.disruptedPods` keeps its pod out of `currentHealthy`: the
/// eviction handler promised the pod would be deleted; if it is not deleted by then, the
/// controller stops waiting for it.
pub const DELETION_TIMEOUT: SignedDuration = SignedDuration::from_secs(120);

/// The PDB condition the controller and the eviction handler maintain.
pub const DISRUPTION_ALLOWED_CONDITION: &str = "DisruptionAllowed";
pub const SUFFICIENT_PODS_REASON: &str = "SufficientPods";
pub const INSUFFICIENT_PODS_REASON: &str = "InsufficientPods";
pub const SYNC_FAILED_REASON: &str = "SyncFailed";

/// The workload (ReplicaSet, Deployment, StatefulSet, ...) that controls a pod, resolved to
/// the object whose scale counts: for a ReplicaSet owned by a Deployment, the Deployment.
/// Two pods whose controllers resolve to the same `uid` count its replicas once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerScale {
    pub uid: String,
    pub replicas: i32,
}

/// An Event the real controller would record while computing the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdbEvent {
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    pub reason: &'static str,
    pub message: String,
    /// `None`: about the PDB; `Some(name)`: about that pod.
    pub pod: Option<String>,
}

/// The outcome of one controller sync of one PDB.
#[derive(Debug, Clone, PartialEq)]
pub struct PdbStatusUpdate {
    /// The status to store (compare with [`status_needs_write`] to skip no-op writes).
    pub status: PodDisruptionBudgetStatus,
    /// When the earliest `disruptedPods` entry expires: sync again then.
    pub recheck_at: Option<Timestamp>,
    pub events: Vec<PdbEvent>,
}

/// Whether a pod counts as available: its `Ready` condition is `True`.
pub fn is_pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// The owner reference marked `controller: true`, if any.
pub fn controller_of(metadata: &ObjectMeta) -> Option<&OwnerReference> {
    metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
}

/// apimachinery's `GetScaledValueFromIntOrPercent`: an integer as is, `"N%"` of `total`
/// rounded up or down. Anything else is an error (the message the controller reports).
pub fn scaled_value(value: &IntOrString, total: i32, round_up: bool) -> Result<i32, String> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(text) => {
            let Some(number) = text.strip_suffix('%') else {
                return Err(
                    "invalid value for IntOrString: invalid type: string is not a percentage"
                        .to_owned(),
                );
            };
            let percent: i64 = number.parse().map_err(|_| {
                format!("invalid value for IntOrString: invalid value {text:?}: not an integer")
            })?;
            let scaled = percent as f64 * f64::from(total) / 100.0;
            let rounded = if round_up {
                scaled.ceil()
            } else {
                scaled.floor()
            };
            // Saturating cast: absurd percentages cannot wrap around.
            Ok(rounded as i32)
        }
    }
}

/// Computes a PDB's status like one sync of the disruption controller, with the real
/// 2-minute [`DELETION_TIMEOUT`].
///
/// `pods` are candidate pods (the fake can pass every pod of the namespace; pods of other
/// namespaces and pods the selector does not match are ignored). `controller_scale`
/// resolves a pod's controller reference; `None` means the controller does not exist,
/// which makes the sync fail (as in Kubernetes, where it fails safe).
pub fn compute_pdb_status(
    pdb: &PodDisruptionBudget,
    pods: &[Pod],
    controller_scale: impl Fn(&OwnerReference) -> Option<ControllerScale>,
    now: Timestamp,
) -> PdbStatusUpdate {
    compute_pdb_status_with_timeout(pdb, pods, controller_scale, now, DELETION_TIMEOUT)
}

/// [`compute_pdb_status`] with a scenario-chosen deletion timeout (scaled-down tests).
pub fn compute_pdb_status_with_timeout(
    pdb: &PodDisruptionBudget,
    pods: &[Pod],
    controller_scale: impl Fn(&OwnerReference) -> Option<ControllerScale>,
    now: Timestamp,
    deletion_timeout: SignedDuration,
) -> PdbStatusUpdate {
    let mut events = Vec::new();
    let selector = match LabelQuery::from_optional_label_selector(
        pdb.spec.as_ref().and_then(|spec| spec.selector.as_ref()),
    ) {
        Ok(selector) => selector,
        Err(error) => {
            events.push(PdbEvent {
                type_: "Warning",
                reason: "NoPods",
                message: format!("Failed to get pods: {error}"),
                pod: None,
            });
            return fail_safe(pdb, &error.to_string(), now, events);
        }
    };
    let namespace = pdb.metadata.namespace.as_deref().unwrap_or_default();
    let covered: Vec<&Pod> = pods
        .iter()
        .filter(|pod| pod.metadata.namespace.as_deref().unwrap_or_default() == namespace)
        .filter(|pod| selector.matches(object_labels(&pod.metadata)))
        .collect();
    if covered.is_empty() {
        events.push(PdbEvent {
            type_: "Normal",
            reason: "NoPods",
            message: "No matching pods found".to_owned(),
            pod: None,
        });
    }

    let expected = match expected_pod_count(pdb, &covered, &controller_scale) {
        Ok(expected) => expected,
        Err(error) => {
            events.push(PdbEvent {
                type_: "Warning",
                reason: "CalculateExpectedPodCountFailed",
                message: format!("Failed to calculate the number of expected pods: {error}"),
                pod: None,
            });
            return fail_safe(pdb, &error, now, events);
        }
    };
    if !expected.unmanaged_pods.is_empty() {
        events.push(PdbEvent {
            type_: "Warning",
            reason: "UnmanagedPods",
            message: "Pods selected by this PodDisruptionBudget were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.".to_owned(),
            pod: None,
        });
    }

    let (disrupted_pods, recheck_at) =
        live_disrupted_pods(pdb, &covered, now, deletion_timeout, &mut events);
    let current_healthy = covered
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            // Promised to be deleted soon: no longer counted as available.
            !disrupted_pods
                .get(name)
                .is_some_and(|since| is_within(since, deletion_timeout, now))
        })
        .filter(|pod| is_pod_ready(pod))
        .count();
    let current_healthy = i32::try_from(current_healthy).unwrap_or(i32::MAX);

    // A PDB that covers no pods yet must not allow disruptions the moment its first pods
    // appear and before the controller has caught up.
    let mut disruptions_allowed = current_healthy.saturating_sub(expected.desired_healthy);
    if expected.expected_pods <= 0 || disruptions_allowed <= 0 {
        disruptions_allowed = 0;
    }

    let previous = pdb.status.clone().unwrap_or_default();
    let mut status = PodDisruptionBudgetStatus {
        current_healthy,
        desired_healthy: expected.desired_healthy,
        expected_pods: expected.expected_pods,
        disruptions_allowed,
        disrupted_pods: Some(disrupted_pods),
        observed_generation: pdb.metadata.generation,
        conditions: previous.conditions,
    };
    set_disruption_allowed_condition(&mut status, now);
    PdbStatusUpdate {
        status,
        recheck_at,
        events,
    }
}

struct ExpectedPods {
    expected_pods: i32,
    desired_healthy: i32,
    unmanaged_pods: Vec<String>,
}

fn expected_pod_count(
    pdb: &PodDisruptionBudget,
    covered: &[&Pod],
    controller_scale: &impl Fn(&OwnerReference) -> Option<ControllerScale>,
) -> Result<ExpectedPods, String> {
    let spec = pdb.spec.clone().unwrap_or_default();
    if let Some(max_unavailable) = &spec.max_unavailable {
        let (expected_pods, unmanaged_pods) = expected_scale(covered, controller_scale)?;
        let max_unavailable = scaled_value(max_unavailable, expected_pods, true)?;
        return Ok(ExpectedPods {
            expected_pods,
            desired_healthy: expected_pods.saturating_sub(max_unavailable).max(0),
            unmanaged_pods,
        });
    }
    match &spec.min_available {
        Some(IntOrString::Int(min_available)) => Ok(ExpectedPods {
            expected_pods: i32::try_from(covered.len()).unwrap_or(i32::MAX),
            desired_healthy: *min_available,
            unmanaged_pods: Vec::new(),
        }),
        Some(percent @ IntOrString::String(_)) => {
            let (expected_pods, unmanaged_pods) = expected_scale(covered, controller_scale)?;
            Ok(ExpectedPods {
                expected_pods,
                desired_healthy: scaled_value(percent, expected_pods, true)?,
                unmanaged_pods,
            })
        }
        // Neither set: nothing is expected, so nothing may be disrupted.
        None => Ok(ExpectedPods {
            expected_pods: 0,
            desired_healthy: 0,
            unmanaged_pods: Vec::new(),
        }),
    }
}

/// The sum of the scales of the distinct controllers of the covered pods.
fn expected_scale(
    covered: &[&Pod],
    controller_scale: &impl Fn(&OwnerReference) -> Option<ControllerScale>,
) -> Result<(i32, Vec<String>), String> {
    let mut scales: BTreeMap<String, i32> = BTreeMap::new();
    let mut seen_references: BTreeSet<&str> = BTreeSet::new();
    let mut unmanaged = Vec::new();
    for pod in covered {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let Some(reference) = controller_of(&pod.metadata) else {
            unmanaged.push(name.to_owned());
            continue;
        };
        if !seen_references.insert(reference.uid.as_str()) {
            continue;
        }
        let Some(controller) = controller_scale(reference) else {
            return Err(format!("found no controllers for pod {name:?}"));
        };
        scales.insert(controller.uid, controller.replicas);
    }
    let total = scales.values().fold(0_i32, |sum, n| sum.saturating_add(*n));
    Ok((total, unmanaged))
}

/// Keeps the `disruptedPods` entries of covered pods that are not being deleted yet and
/// whose promise has not expired; warns about the expired ones.
fn live_disrupted_pods(
    pdb: &PodDisruptionBudget,
    covered: &[&Pod],
    now: Timestamp,
    deletion_timeout: SignedDuration,
    events: &mut Vec<PdbEvent>,
) -> (BTreeMap<String, Time>, Option<Timestamp>) {
    let mut live = BTreeMap::new();
    let mut recheck_at: Option<Timestamp> = None;
    let Some(previous) = pdb
        .status
        .as_ref()
        .and_then(|status| status.disrupted_pods.as_ref())
    else {
        return (live, recheck_at);
    };
    for pod in covered {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let Some(since) = previous.get(name) else {
            continue;
        };
        let expected_deletion = since.0.saturating_add(deletion_timeout).unwrap_or(since.0);
        if expected_deletion < now {
            let pdb_namespace = pdb.metadata.namespace.as_deref().unwrap_or_default();
            let pdb_name = pdb.metadata.name.as_deref().unwrap_or_default();
            events.push(PdbEvent {
                type_: "Warning",
                reason: "NotDeleted",
                message: format!(
                    "Pod was expected by PDB {pdb_namespace}/{pdb_name} to be deleted but it wasn't"
                ),
                pod: Some(name.to_owned()),
            });
        } else {
            if recheck_at.is_none_or(|at| expected_deletion < at) {
                recheck_at = Some(expected_deletion);
            }
            live.insert(name.to_owned(), since.clone());
        }
    }
    (live, recheck_at)
}

fn is_within(since: &Time, timeout: SignedDuration, now: Timestamp) -> bool {
    since
        .0
        .saturating_add(timeout)
        .is_ok_and(|until| until > now)
}

/// The controller's "fail safe": allow no disruption, say why, keep the rest of the status
/// (including `observedGeneration`, so evictions see a stale budget and get a 429).
fn fail_safe(
    pdb: &PodDisruptionBudget,
    error: &str,
    now: Timestamp,
    events: Vec<PdbEvent>,
) -> PdbStatusUpdate {
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    let observed_generation = status.observed_generation;
    set_status_condition(
        status.conditions.get_or_insert_with(Vec::new),
        Condition {
            type_: DISRUPTION_ALLOWED_CONDITION.to_owned(),
            status: "False".to_owned(),
            reason: SYNC_FAILED_REASON.to_owned(),
            message: error.to_owned(),
            observed_generation,
            last_transition_time: Time(now),
        },
    );
    PdbStatusUpdate {
        status,
        recheck_at: None,
        events,
    }
}

/// Sets the `DisruptionAllowed` condition from `disruptionsAllowed` (True/SufficientPods
/// when positive, False/InsufficientPods otherwise), as both the controller and the
/// eviction handler (when it spends the last unit) do.
pub fn set_disruption_allowed_condition(status: &mut PodDisruptionBudgetStatus, now: Timestamp) {
    let (value, reason) = if status.disruptions_allowed > 0 {
        ("True", SUFFICIENT_PODS_REASON)
    } else {
        ("False", INSUFFICIENT_PODS_REASON)
    };
    let observed_generation = status.observed_generation;
    set_status_condition(
        status.conditions.get_or_insert_with(Vec::new),
        Condition {
            type_: DISRUPTION_ALLOWED_CONDITION.to_owned(),
            status: value.to_owned(),
            reason: reason.to_owned(),
            message: String::new(),
            observed_generation,
            last_transition_time: Time(now),
        },
    );
}

/// apimachinery's `meta.SetStatusCondition`: replace the condition of the same type,
/// keeping its `lastTransitionTime` unless the status flips.
fn set_status_condition(conditions: &mut Vec<Condition>, new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status != new.status {
                existing.status = new.status;
                existing.last_transition_time = new.last_transition_time;
            }
            existing.reason = new.reason;
            existing.message = new.message;
            existing.observed_generation = new.observed_generation;
        }
        None => conditions.push(new),
    }
}

/// Whether storing `new` would change anything the controller cares about; the real
/// controller skips the write otherwise (no resourceVersion bump, no watch event).
pub fn status_needs_write(pdb: &PodDisruptionBudget, new: &PodDisruptionBudgetStatus) -> bool {
    let Some(old) = pdb.status.as_ref() else {
        return true;
    };
    let empty = BTreeMap::new();
    let conditions_key =
        |status: &PodDisruptionBudgetStatus| -> Vec<(String, String, String, Option<i64>)> {
            status
                .conditions
                .iter()
                .flatten()
                .map(|c| {
                    (
                        c.type_.clone(),
                        c.status.clone(),
                        c.reason.clone(),
                        c.observed_generation,
                    )
                })
                .collect()
        };
    old.current_healthy != new.current_healthy
        || old.desired_healthy != new.desired_healthy
        || old.expected_pods != new.expected_pods
        || old.disruptions_allowed != new.disruptions_allowed
        || old.observed_generation != new.observed_generation
        || old.disrupted_pods.as_ref().unwrap_or(&empty)
            != new.disrupted_pods.as_ref().unwrap_or(&empty)
        || conditions_key(old) != conditions_key(new)
}

/// Builders shared by the semantics tests (disruption and eviction).
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    pub const NAMESPACE: &str = "shop";

    pub fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// A pod of `shop` labelled `app=<app>`, Running and Ready, owned by ReplicaSet `<app>`.
    pub fn pod(name: &str, app: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".to_owned(),
                    kind: "ReplicaSet".to_owned(),
                    name: app.to_owned(),
                    uid: format!("uid-{app}"),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some("Running".to_owned()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".to_owned(),
                    status: "True".to_owned(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn not_ready(mut pod: Pod) -> Pod {
        if let Some(condition) = pod
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.first_mut())
        {
            condition.status = "False".to_owned();
        }
        pod
    }

    pub fn phase(mut pod: Pod, phase: &str) -> Pod {
        if let Some(status) = pod.status.as_mut() {
            status.phase = Some(phase.to_owned());
        }
        pod
    }

    pub fn deleting(mut pod: Pod) -> Pod {
        pod.metadata.deletion_timestamp = Some(Time(at(0)));
        pod
    }

    pub fn unowned(mut pod: Pod) -> Pod {
        pod.metadata.owner_references = None;
        pod
    }

    pub fn in_namespace(mut pod: Pod, namespace: &str) -> Pod {
        pod.metadata.namespace = Some(namespace.to_owned());
        pod
    }

    /// A PDB of `shop` selecting `app=<app>` (`None`: an empty selector, all pods).
    pub fn pdb(name: &str, app: Option<&str>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                generation: Some(1),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: app
                        .map(|app| BTreeMap::from([("app".to_owned(), app.to_owned())])),
                    match_expressions: None,
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    pub fn min_available(mut pdb: PodDisruptionBudget, value: IntOrString) -> PodDisruptionBudget {
        if let Some(spec) = pdb.spec.as_mut() {
            spec.min_available = Some(value);
        }
        pdb
    }

    pub fn max_unavailable(
        mut pdb: PodDisruptionBudget,
        value: IntOrString,
    ) -> PodDisruptionBudget {
        if let Some(spec) = pdb.spec.as_mut() {
            spec.max_unavailable = Some(value);
        }
        pdb
    }

    pub fn percent(n: i32) -> IntOrString {
        IntOrString::String(format!("{n}%"))
    }

    /// Every ReplicaSet `<app>` exists with `replicas` replicas.
    pub fn scale_of(replicas: i32) -> impl Fn(&OwnerReference) -> Option<ControllerScale> {
        move |reference: &OwnerReference| {
            Some(ControllerScale {
                uid: reference.uid.clone(),
                replicas,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::fixtures::*;
    use super::*;

    fn pods(count: usize, app: &str) -> Vec<Pod> {
        (0..count)
            .map(|i| pod(&format!("{app}-{i}"), app))
            .collect()
    }

    #[test]
    fn scaled_values_round_like_apimachinery() {
        let cases: &[(IntOrString, i32, bool, i32)] = &[
            (IntOrString::Int(2), 10, true, 2),
            (percent(50), 3, true, 2),
            (percent(50), 3, false, 1),
            (percent(34), 3, true, 2),
            (percent(33), 3, true, 1),
            (percent(0), 7, true, 0),
            (percent(100), 7, true, 7),
            (percent(10), 0, true, 0),
            (percent(1), 1, true, 1),
        ];
        for (value, total, round_up, expected) in cases {
            assert_eq!(
                scaled_value(value, *total, *round_up).unwrap(),
                *expected,
                "{value:?} of {total}"
            );
        }
        assert!(scaled_value(&IntOrString::String("5".to_owned()), 10, true).is_err());
        assert!(scaled_value(&IntOrString::String("x%".to_owned()), 10, true).is_err());
    }

    struct Case {
        name: &'static str,
        pdb: PodDisruptionBudget,
        pods: Vec<Pod>,
        replicas: i32,
        /// (expectedPods, desiredHealthy, currentHealthy, disruptionsAllowed)
        expected: (i32, i32, i32, i32),
    }

    #[test]
    fn status_follows_the_disruption_controller() {
        let web = Some("web");
        let cases = vec![
            Case {
                name: "minAvailable int counts covered pods",
                pdb: min_available(pdb("p", web), IntOrString::Int(2)),
                pods: pods(3, "web"),
                replicas: 99,
                expected: (3, 2, 3, 1),
            },
            Case {
                name: "minAvailable int equal to healthy allows nothing",
                pdb: min_available(pdb("p", web), IntOrString::Int(3)),
                pods: pods(3, "web"),
                replicas: 3,
                expected: (3, 3, 3, 0),
            },
            Case {
                name: "minAvailable above healthy clamps to zero",
                pdb: min_available(pdb("p", web), IntOrString::Int(5)),
                pods: pods(3, "web"),
                replicas: 3,
                expected: (3, 5, 3, 0),
            },
            Case {
                name: "minAvailable percent rounds up over controller scale",
                pdb: min_available(pdb("p", web), percent(50)),
                pods: pods(3, "web"),
                replicas: 3,
                expected: (3, 2, 3, 1),
            },
            Case {
                name: "minAvailable percent uses scale, not pod count",
                pdb: min_available(pdb("p", web), percent(50)),
                pods: pods(3, "web"),
                replicas: 5,
                expected: (5, 3, 3, 0),
            },
            Case {
                name: "maxUnavailable int",
                pdb: max_unavailable(pdb("p", web), IntOrString::Int(1)),
                pods: pods(3, "web"),
                replicas: 3,
                expected: (3, 2, 3, 1),
            },
            Case {
                name: "maxUnavailable percent rounds up the unavailable count",
                pdb: max_unavailable(pdb("p", web), percent(30)),
                pods: pods(4, "web"),
                replicas: 4,
                // ceil(1.2) = 2 unavailable => 2 desired.
                expected: (4, 2, 4, 2),
            },
            Case {
                name: "maxUnavailable larger than scale clamps desired at zero",
                pdb: max_unavailable(pdb("p", web), IntOrString::Int(10)),
                pods: pods(2, "web"),
                replicas: 2,
                expected: (2, 0, 2, 2),
            },
            Case {
                name: "maxUnavailable zero blocks every disruption",
                pdb: max_unavailable(pdb("p", web), IntOrString::Int(0)),
                pods: pods(3, "web"),
                replicas: 3,
                expected: (3, 3, 3, 0),
            },
            Case {
                name: "not ready, deleting and other-label pods are not healthy",
                pdb: min_available(pdb("p", web), IntOrString::Int(1)),
                pods: vec![
                    pod("web-0", "web"),
                    not_ready(pod("web-1", "web")),
                    deleting(pod("web-2", "web")),
                    pod("db-0", "db"),
                    in_namespace(pod("web-x", "web"), "other"),
                ],
                replicas: 3,
                expected: (3, 1, 1, 0),
            },
            Case {
                name: "pending and succeeded pods still count as expected",
                pdb: min_available(pdb("p", web), IntOrString::Int(1)),
                pods: vec![
                    pod("web-0", "web"),
                    pod("web-1", "web"),
                    not_ready(phase(pod("web-2", "web"), "Pending")),
                ],
                replicas: 3,
                expected: (3, 1, 2, 1),
            },
            Case {
                name: "empty selector covers every pod of the namespace",
                pdb: min_available(pdb("p", None), IntOrString::Int(1)),
                pods: [pods(2, "web"), pods(2, "db")].concat(),
                replicas: 2,
                expected: (4, 1, 4, 3),
            },
            Case {
                name: "no pods: nothing expected, nothing allowed",
                pdb: max_unavailable(pdb("p", web), IntOrString::Int(1)),
                pods: vec![],
                replicas: 3,
                expected: (0, 0, 0, 0),
            },
            Case {
                name: "minAvailable zero with no pods allows nothing",
                pdb: min_available(pdb("p", web), IntOrString::Int(0)),
                pods: vec![],
                replicas: 3,
                expected: (0, 0, 0, 0),
            },
            Case {
                name: "neither minAvailable nor maxUnavailable",
                pdb: pdb("p", web),
                pods: pods(3, "web"),
                replicas: 3,
                expected: (0, 0, 3, 0),
            },
            Case {
                name: "unmanaged pods are skipped for the scale",
                pdb: max_unavailable(pdb("p", web), IntOrString::Int(1)),
                pods: vec![pod("web-0", "web"), unowned(pod("web-1", "web"))],
                replicas: 3,
                expected: (3, 2, 2, 0),
            },
        ];
        for case in cases {
            let update = compute_pdb_status(&case.pdb, &case.pods, scale_of(case.replicas), at(0));
            let s = &update.status;
            assert_eq!(
                (
                    s.expected_pods,
                    s.desired_healthy,
                    s.current_healthy,
                    s.disruptions_allowed
                ),
                case.expected,
                "{}",
                case.name
            );
            assert_eq!(s.observed_generation, Some(1), "{}", case.name);
            let condition = s
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == DISRUPTION_ALLOWED_CONDITION)
                .unwrap();
            let expected_reason = if case.expected.3 > 0 {
                SUFFICIENT_PODS_REASON
            } else {
                INSUFFICIENT_PODS_REASON
            };
            assert_eq!(condition.reason, expected_reason, "{}", case.name);
        }
    }

    #[test]
    fn distinct_controllers_are_summed_once_each() {
        // Two ReplicaSets (web, api), the pods of web spread over two references that
        // resolve to the same Deployment.
        let mut web_old = pod("web-old", "web");
        if let Some(owner) = web_old
            .metadata
            .owner_references
            .as_mut()
            .and_then(|o| o.first_mut())
        {
            owner.uid = "uid-web-old-rs".to_owned();
        }
        let pods = vec![pod("web-0", "web"), web_old, pod("api-0", "api")];
        let pdb = max_unavailable(pdb("all", None), IntOrString::Int(1));
        let scale = |reference: &OwnerReference| {
            let (uid, replicas) = match reference.uid.as_str() {
                "uid-web" | "uid-web-old-rs" => ("deploy-web", 4),
                "uid-api" => ("deploy-api", 2),
                _ => return None,
            };
            Some(ControllerScale {
                uid: uid.to_owned(),
                replicas,
            })
        };
        let update = compute_pdb_status(&pdb, &pods, scale, at(0));
        assert_eq!(update.status.expected_pods, 6);
        assert_eq!(update.status.desired_healthy, 5);
        assert_eq!(update.status.disruptions_allowed, 0);
    }

    #[test]
    fn a_missing_controller_fails_safe() {
        let mut pdb = max_unavailable(pdb("p", Some("web")), IntOrString::Int(1));
        pdb.metadata.generation = Some(2);
        pdb.status = Some(PodDisruptionBudgetStatus {
            disruptions_allowed: 2,
            current_healthy: 3,
            desired_healthy: 1,
            expected_pods: 3,
            observed_generation: Some(1),
            ..Default::default()
        });
        let update = compute_pdb_status(&pdb, &pods(3, "web"), |_: &OwnerReference| None, at(0));
        assert_eq!(update.status.disruptions_allowed, 0);
        assert_eq!(update.status.current_healthy, 3, "rest of the status kept");
        assert_eq!(
            update.status.observed_generation,
            Some(1),
            "generation not observed"
        );
        let condition = &update.status.conditions.as_ref().unwrap()[0];
        assert_eq!(condition.reason, SYNC_FAILED_REASON);
        assert_eq!(condition.status, "False");
        assert_eq!(condition.message, "found no controllers for pod \"web-0\"");
        assert!(
            update
                .events
                .iter()
                .any(|e| e.reason == "CalculateExpectedPodCountFailed")
        );
    }

    #[test]
    fn disrupted_pods_stop_counting_until_their_promise_expires() {
        let mut pdb = min_available(pdb("p", Some("web")), IntOrString::Int(1));
        pdb.status = Some(PodDisruptionBudgetStatus {
            disrupted_pods: Some(BTreeMap::from([
                ("web-0".to_owned(), Time(at(0))),
                ("web-1".to_owned(), Time(at(30))),
                ("gone".to_owned(), Time(at(0))),
            ])),
            ..Default::default()
        });
        let pods = pods(3, "web");

        // 60 s later: both promises hold, two pods are out of the healthy count.
        let update = compute_pdb_status(&pdb, &pods, scale_of(3), at(60));
        assert_eq!(update.status.current_healthy, 1);
        assert_eq!(update.status.disruptions_allowed, 0);
        let kept: Vec<_> = update
            .status
            .disrupted_pods
            .as_ref()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(
            kept,
            ["web-0", "web-1"],
            "entries of vanished pods are dropped"
        );
        assert_eq!(update.recheck_at, Some(at(120)));

        // 130 s: web-0's promise expired (with a NotDeleted warning), web-1's still holds.
        let update = compute_pdb_status(&pdb, &pods, scale_of(3), at(130));
        assert_eq!(update.status.current_healthy, 2);
        assert_eq!(update.status.disruptions_allowed, 1);
        assert_eq!(update.recheck_at, Some(at(150)));
        assert!(
            update
                .events
                .iter()
                .any(|e| e.reason == "NotDeleted" && e.pod.as_deref() == Some("web-0"))
        );

        // A pod being deleted is dropped from the map: its deletion was seen.
        let pods = vec![
            deleting(pod("web-0", "web")),
            pod("web-1", "web"),
            pod("web-2", "web"),
        ];
        let update = compute_pdb_status(&pdb, &pods, scale_of(3), at(60));
        assert!(
            !update
                .status
                .disrupted_pods
                .as_ref()
                .unwrap()
                .contains_key("web-0")
        );
        assert_eq!(update.status.current_healthy, 1);

        // A scaled-down timeout for fast scenarios.
        let update = compute_pdb_status_with_timeout(
            &pdb,
            &pods,
            scale_of(3),
            at(40),
            SignedDuration::from_secs(5),
        );
        assert_eq!(update.status.current_healthy, 2);
        assert!(update.status.disrupted_pods.as_ref().unwrap().is_empty());
    }

    #[test]
    fn absent_selector_covers_nothing() {
        let mut pdb = min_available(pdb("p", Some("web")), IntOrString::Int(0));
        if let Some(spec) = pdb.spec.as_mut() {
            spec.selector = None;
        }
        let update = compute_pdb_status(&pdb, &pods(3, "web"), scale_of(3), at(0));
        assert_eq!(update.status.expected_pods, 0);
        assert_eq!(update.status.current_healthy, 0);
        assert!(update.events.iter().any(|e| e.reason == "NoPods"));
    }

    #[test]
    fn unchanged_status_is_not_rewritten() {
        let mut pdb = min_available(pdb("p", Some("web")), IntOrString::Int(1));
        let pods = pods(2, "web");
        let first = compute_pdb_status(&pdb, &pods, scale_of(2), at(0));
        assert!(status_needs_write(&pdb, &first.status));
        pdb.status = Some(first.status.clone());
        let second = compute_pdb_status(&pdb, &pods, scale_of(2), at(10));
        assert!(!status_needs_write(&pdb, &second.status));
        assert_eq!(
            second.status.conditions.as_ref().unwrap()[0].last_transition_time,
            Time(at(0)),
            "transition time kept while the condition does not flip"
        );
        let fewer = compute_pdb_status(&pdb, &pods[..1], scale_of(2), at(20));
        assert!(status_needs_write(&pdb, &fewer.status));
        let condition = &fewer.status.conditions.as_ref().unwrap()[0];
        assert_eq!(condition.status, "False");
        assert_eq!(condition.last_transition_time, Time(at(20)));
    }

    #[test]
    fn readiness_comes_from_the_ready_condition() {
        assert!(is_pod_ready(&pod("a", "web")));
        assert!(!is_pod_ready(&not_ready(pod("a", "web"))));
        assert!(!is_pod_ready(&Pod::default()));
        assert_eq!(
            controller_of(&pod("a", "web").metadata).map(|o| o.name.as_str()),
            Some("web")
        );
        assert!(controller_of(&unowned(pod("a", "web")).metadata).is_none());
    }
}
