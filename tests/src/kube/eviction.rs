//! The eviction subresource's decision (`POST .../pods/<name>/eviction`), as the real
//! kube-apiserver makes it (`pkg/registry/core/pod/storage/eviction.go`).
//!
//! [`evaluate_eviction`] is pure: it reads the pod and the PDBs of its namespace (with their
//! current status) and says either which writes to make, in order, or which `Status` to
//! answer. The fake server applies an [`EvictionAllowance`] atomically (under the lock that
//! guards its store), which gives the guarantee the real server gets from optimistic
//! concurrency on the PDB: two racing evictions cannot both spend the last unit.
//!
//! The order of checks follows the real handler:
//! 1. eviction name differs from the URL's pod name: 400 BadRequest;
//! 2. pod Succeeded, Failed or Pending, or already being deleted: delete it, no PDB check;
//! 3. PDBs of the namespace whose selector matches the pod (absent selector: none; empty
//!    selector: all; invalid selector: none): none → delete; more than one → 500;
//! 4. pod not Ready: with `unhealthyPodEvictionPolicy: AlwaysAllow`, or (default
//!    `IfHealthyBudget`) when `currentHealthy >= desiredHealthy > 0`, delete it without
//!    spending the budget;
//! 5. otherwise spend one unit of the budget: status not yet observed (`observedGeneration`
//!    behind `generation`) → 429 "still being processed"; negative `disruptionsAllowed` or
//!    more than 2000 `disruptedPods` → 403; `disruptionsAllowed == 0` → 429 with a
//!    `DisruptionBudget` cause; else decrement, record the pod in `disruptedPods`, delete.

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails, Time};
use k8s_openapi::jiff::Timestamp;

use super::disruption::{is_pod_ready, set_disruption_allowed_condition};
use super::selectors::{LabelQuery, object_labels};

/// The message of every 429 the eviction subresource answers.
pub const TOO_MANY_REQUESTS_MESSAGE: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";
/// The message of the 500 for a pod covered by several PDBs.
pub const MULTIPLE_BUDGETS_MESSAGE: &str = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";
/// The `details.causes[].reason` naming a PDB refusal.
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";
/// Above this many unconfirmed evictions in `disruptedPods`, the handler refuses (403).
pub const MAX_DISRUPTED_POD_SIZE: usize = 2000;
/// `Retry-After` suggested while a PDB's status lags its spec.
pub const STALE_BUDGET_RETRY_AFTER_SECONDS: u32 = 10;

/// What the server must do with an eviction request.
#[derive(Debug, Clone, PartialEq)]
pub enum EvictionDecision {
    /// Evict: apply the allowance's writes in order, then answer `201` with a `Success` Status.
    Allow(Box<EvictionAllowance>),
    /// Do not touch anything; answer this Status.
    Refuse(EvictionRefusal),
}

/// Why an eviction was allowed (for the audit log and for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllowedBecause {
    /// Succeeded, Failed or Pending pod, or a pod already being deleted: PDBs do not apply.
    PodNotRunning,
    /// No PDB covers the pod.
    NoBudget,
    /// The pod is not Ready and its PDB says `unhealthyPodEvictionPolicy: AlwaysAllow`.
    UnhealthyPodAlwaysAllowed,
    /// The pod is not Ready and its application is not disrupted (`IfHealthyBudget`).
    UnhealthyPodWithinHealthyBudget,
    /// The PDB had a unit to spend; the allowance carries the spent status.
    BudgetSpent,
}

/// The PDB status write that must succeed before the pod is deleted.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSpend {
    pub pdb_name: String,
    /// The PDB's resourceVersion the status was computed from: write only if unchanged
    /// (otherwise evaluate again against the fresh PDB, as the real handler retries).
    pub pdb_resource_version: Option<String>,
    /// `disruptionsAllowed` minus one, the pod recorded in `disruptedPods` at `now`, the
    /// `DisruptionAllowed` condition updated when the last unit is spent.
    /// For a dry-run request, do not write it.
    pub status: PodDisruptionBudgetStatus,
}

/// The writes an accepted eviction makes, in order: the PDB status (if any), then the pod's
/// `DisruptionTarget` condition, then a graceful delete of the pod.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionAllowance {
    pub because: AllowedBecause,
    pub budget_spend: Option<BudgetSpend>,
    /// Delete only if the pod still has this resourceVersion (the real handler sets it, when
    /// the client set none, so that a pod that turned Ready meanwhile is not evicted as an
    /// unhealthy one). On a mismatch: for [`AllowedBecause::PodNotRunning`] evaluate again;
    /// otherwise answer [`EvictionRefusal::budget_still_processing`].
    pub pod_resource_version_precondition: Option<String>,
    /// Added to the pod's status before it is deleted (not for dry-run requests).
    pub disruption_target_condition: PodCondition,
}

/// A refused eviction, ready to become the `Status` the client receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionRefusal {
    /// 400, 403, 429 or 500.
    pub code: u16,
    /// `BadRequest`, `Forbidden`, `TooManyRequests`; `None` for the multiple-PDB 500, which
    /// the real server returns without a reason.
    pub reason: Option<&'static str>,
    pub message: String,
    /// `details.retryAfterSeconds` and the `Retry-After` header, when non-zero.
    pub retry_after_seconds: Option<u32>,
    /// `details.causes`: `(reason, message)`.
    pub causes: Vec<(String, String)>,
    /// For a 403 about a PDB, its name: `details` then name group `policy`, kind
    /// `poddisruptionbudget` and this name.
    pub forbidden_budget: Option<String>,
}

impl EvictionRefusal {
    fn new(code: u16, reason: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            retry_after_seconds: None,
            causes: Vec::new(),
            forbidden_budget: None,
        }
    }

    /// 400: the Eviction object names another pod than the URL.
    pub fn name_mismatch() -> Self {
        Self::new(
            400,
            Some("BadRequest"),
            "name in URL does not match name in Eviction object",
        )
    }

    /// 500: more than one PDB covers the pod.
    pub fn multiple_budgets() -> Self {
        Self::new(500, None, MULTIPLE_BUDGETS_MESSAGE)
    }

    /// 429 while a PDB's status has not caught up with its spec, or when the pod changed
    /// under an eviction that relied on its readiness.
    pub fn budget_still_processing(pdb_name: &str) -> Self {
        Self {
            retry_after_seconds: Some(STALE_BUDGET_RETRY_AFTER_SECONDS),
            causes: vec![(
                DISRUPTION_BUDGET_CAUSE.to_owned(),
                format!("The disruption budget {pdb_name} is still being processed by the server."),
            )],
            ..Self::new(429, Some("TooManyRequests"), TOO_MANY_REQUESTS_MESSAGE)
        }
    }

    /// 429: the budget has no disruption left.
    pub fn budget_exhausted(pdb_name: &str, desired_healthy: i32, current_healthy: i32) -> Self {
        Self {
            causes: vec![(
                DISRUPTION_BUDGET_CAUSE.to_owned(),
                format!(
                    "The disruption budget {pdb_name} needs {desired_healthy} healthy pods and has {current_healthy} currently"
                ),
            )],
            ..Self::new(429, Some("TooManyRequests"), TOO_MANY_REQUESTS_MESSAGE)
        }
    }

    /// 403 about the PDB itself (a corrupt status).
    fn budget_forbidden(pdb_name: &str, why: &str) -> Self {
        Self {
            forbidden_budget: Some(pdb_name.to_owned()),
            ..Self::new(
                403,
                Some("Forbidden"),
                format!("poddisruptionbudget.policy {pdb_name:?} is forbidden: {why}"),
            )
        }
    }

    /// The `metav1.Status` body (`status: Failure`).
    pub fn to_status(&self) -> Status {
        let has_details = self.retry_after_seconds.is_some()
            || !self.causes.is_empty()
            || self.forbidden_budget.is_some();
        let details = has_details.then(|| StatusDetails {
            causes: (!self.causes.is_empty()).then(|| {
                self.causes
                    .iter()
                    .map(|(reason, message)| StatusCause {
                        field: None,
                        message: Some(message.clone()),
                        reason: Some(reason.clone()),
                    })
                    .collect()
            }),
            group: self.forbidden_budget.as_ref().map(|_| "policy".to_owned()),
            kind: self
                .forbidden_budget
                .as_ref()
                .map(|_| "poddisruptionbudget".to_owned()),
            name: self.forbidden_budget.clone(),
            retry_after_seconds: self
                .retry_after_seconds
                .and_then(|seconds| i32::try_from(seconds).ok()),
            uid: None,
        });
        Status {
            code: Some(i32::from(self.code)),
            details,
            message: Some(self.message.clone()),
            metadata: Default::default(),
            reason: self.reason.map(str::to_owned),
            status: Some("Failure".to_owned()),
        }
    }
}

/// The Status body of an accepted eviction (served with HTTP 201).
pub fn eviction_success_status() -> Status {
    Status {
        status: Some("Success".to_owned()),
        ..Default::default()
    }
}

/// 400 unless the Eviction object's name is the pod name of the URL. Checked before the
/// pod is looked up, so a mismatch is a 400 even for a missing pod.
pub fn check_eviction_name(url_pod_name: &str, eviction_name: &str) -> Result<(), EvictionRefusal> {
    if url_pod_name == eviction_name {
        Ok(())
    } else {
        Err(EvictionRefusal::name_mismatch())
    }
}

/// The PDBs that cover a pod, as the eviction handler finds them.
pub fn budgets_covering<'a>(
    pod: &Pod,
    pdbs: &'a [PodDisruptionBudget],
) -> Vec<&'a PodDisruptionBudget> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let labels = object_labels(&pod.metadata);
    pdbs.iter()
        .filter(|pdb| pdb.metadata.namespace.as_deref().unwrap_or_default() == namespace)
        .filter(|pdb| {
            // An invalid selector covers nothing (the real handler skips it).
            LabelQuery::from_optional_label_selector(
                pdb.spec.as_ref().and_then(|spec| spec.selector.as_ref()),
            )
            .is_ok_and(|selector| selector.matches(labels))
        })
        .collect()
}

/// Pods whose eviction needs no budget: terminal, not started, or already going away.
pub fn can_ignore_budgets(pod: &Pod) -> bool {
    let phase = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed" | "Pending"))
        || pod.metadata.deletion_timestamp.is_some()
}

/// Decides an eviction of `pod` (already looked up by name; a missing pod is the server's
/// 404), given the PDBs of its namespace with their current status.
pub fn evaluate_eviction(
    pod: &Pod,
    eviction_name: &str,
    pdbs: &[PodDisruptionBudget],
    now: Timestamp,
) -> EvictionDecision {
    if pod.metadata.name.as_deref() != Some(eviction_name) {
        return EvictionDecision::Refuse(EvictionRefusal::name_mismatch());
    }
    let allow = |because, budget_spend, precondition: bool| {
        EvictionDecision::Allow(Box::new(EvictionAllowance {
            because,
            budget_spend,
            pod_resource_version_precondition: if precondition {
                pod.metadata.resource_version.clone()
            } else {
                None
            },
            disruption_target_condition: disruption_target_condition(now),
        }))
    };

    if can_ignore_budgets(pod) {
        // Terminal and terminating pods are deleted as they are; a Pending pod is deleted
        // only if it has not changed (it could be turning Running and Ready).
        let terminal_or_terminating = pod.metadata.deletion_timestamp.is_some()
            || matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
        return allow(
            AllowedBecause::PodNotRunning,
            None,
            !terminal_or_terminating,
        );
    }

    let covering = budgets_covering(pod, pdbs);
    let pdb = match covering.as_slice() {
        [] => return allow(AllowedBecause::NoBudget, None, false),
        [pdb] => *pdb,
        _ => return EvictionDecision::Refuse(EvictionRefusal::multiple_budgets()),
    };
    let pdb_name = pdb.metadata.name.as_deref().unwrap_or_default();
    let status = pdb.status.clone().unwrap_or_default();

    if !is_pod_ready(pod) {
        let policy = pdb
            .spec
            .as_ref()
            .and_then(|spec| spec.unhealthy_pod_eviction_policy.as_deref());
        if policy == Some("AlwaysAllow") {
            return allow(AllowedBecause::UnhealthyPodAlwaysAllowed, None, true);
        }
        // `IfHealthyBudget`, the default. (An unknown policy is treated the same way here,
        // which the API's enum validation makes moot.)
        if status.current_healthy >= status.desired_healthy && status.desired_healthy > 0 {
            return allow(AllowedBecause::UnhealthyPodWithinHealthyBudget, None, true);
        }
    }

    match spend_budget(pdb, pod.metadata.name.as_deref().unwrap_or_default(), now) {
        Ok(status) => allow(
            AllowedBecause::BudgetSpent,
            Some(BudgetSpend {
                pdb_name: pdb_name.to_owned(),
                pdb_resource_version: pdb.metadata.resource_version.clone(),
                status,
            }),
            false,
        ),
        Err(refusal) => EvictionDecision::Refuse(refusal),
    }
}

/// The real `checkAndDecrement`: the status after spending one disruption, or the refusal.
pub fn spend_budget(
    pdb: &PodDisruptionBudget,
    pod_name: &str,
    now: Timestamp,
) -> Result<PodDisruptionBudgetStatus, EvictionRefusal> {
    let pdb_name = pdb.metadata.name.as_deref().unwrap_or_default();
    let mut status = pdb.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(0) < pdb.metadata.generation.unwrap_or(0) {
        return Err(EvictionRefusal::budget_still_processing(pdb_name));
    }
    if status.disruptions_allowed < 0 {
        return Err(EvictionRefusal::budget_forbidden(
            pdb_name,
            "pdb disruptions allowed is negative",
        ));
    }
    if status.disrupted_pods.as_ref().map_or(0, |pods| pods.len()) > MAX_DISRUPTED_POD_SIZE {
        return Err(EvictionRefusal::budget_forbidden(
            pdb_name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if status.disruptions_allowed == 0 {
        return Err(EvictionRefusal::budget_exhausted(
            pdb_name,
            status.desired_healthy,
            status.current_healthy,
        ));
    }
    status.disruptions_allowed -= 1;
    if status.disruptions_allowed == 0 {
        set_disruption_allowed_condition(&mut status, now);
    }
    status
        .disrupted_pods
        .get_or_insert_with(Default::default)
        .insert(pod_name.to_owned(), Time(now));
    Ok(status)
}

/// The pod condition the eviction handler adds before deleting (PodDisruptionConditions).
pub fn disruption_target_condition(now: Timestamp) -> PodCondition {
    PodCondition {
        type_: "DisruptionTarget".to_owned(),
        status: "True".to_owned(),
        reason: Some("EvictionByEvictionAPI".to_owned()),
        message: Some("Eviction API: evicting".to_owned()),
        last_transition_time: Some(Time(now)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::disruption::fixtures::*;
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use std::collections::BTreeMap;

    /// A PDB for `app=web` whose status the controller computed as given.
    fn budget(allowed: i32, desired: i32, current: i32) -> PodDisruptionBudget {
        let mut pdb = min_available(pdb("web-pdb", Some("web")), IntOrString::Int(desired));
        pdb.metadata.resource_version = Some("7".to_owned());
        pdb.status = Some(PodDisruptionBudgetStatus {
            disruptions_allowed: allowed,
            desired_healthy: desired,
            current_healthy: current,
            expected_pods: current,
            observed_generation: Some(1),
            ..Default::default()
        });
        pdb
    }

    fn with_policy(mut pdb: PodDisruptionBudget, policy: &str) -> PodDisruptionBudget {
        if let Some(spec) = pdb.spec.as_mut() {
            spec.unhealthy_pod_eviction_policy = Some(policy.to_owned());
        }
        pdb
    }

    fn running(name: &str) -> Pod {
        let mut pod = pod(name, "web");
        pod.metadata.resource_version = Some("42".to_owned());
        pod
    }

    fn allowed(decision: &EvictionDecision) -> Option<AllowedBecause> {
        match decision {
            EvictionDecision::Allow(allowance) => Some(allowance.because),
            EvictionDecision::Refuse(_) => None,
        }
    }

    fn refusal(decision: EvictionDecision) -> EvictionRefusal {
        match decision {
            EvictionDecision::Refuse(refusal) => refusal,
            EvictionDecision::Allow(allowance) => panic!("expected a refusal, got {allowance:?}"),
        }
    }

    /// (case, pod, PDBs of the namespace, expected: `Ok(why allowed)` or `Err(HTTP code)`)
    type Case = (
        &'static str,
        Pod,
        Vec<PodDisruptionBudget>,
        Result<AllowedBecause, u16>,
    );

    #[test]
    fn decisions_follow_the_eviction_handler() {
        use AllowedBecause::*;
        let cases: Vec<Case> = vec![
            ("no pdb", running("web-0"), vec![], Ok(NoBudget)),
            (
                "pdb of other pods",
                running("web-0"),
                vec![min_available(pdb("db", Some("db")), IntOrString::Int(1))],
                Ok(NoBudget),
            ),
            (
                "pdb of another namespace",
                in_namespace(running("web-0"), "other"),
                vec![budget(0, 3, 3)],
                Ok(NoBudget),
            ),
            (
                "budget left",
                running("web-0"),
                vec![budget(1, 2, 3)],
                Ok(BudgetSpent),
            ),
            (
                "budget exhausted",
                running("web-0"),
                vec![budget(0, 3, 3)],
                Err(429),
            ),
            (
                "succeeded pod ignores budget",
                phase(running("web-0"), "Succeeded"),
                vec![budget(0, 3, 3)],
                Ok(PodNotRunning),
            ),
            (
                "failed pod ignores budget",
                phase(running("web-0"), "Failed"),
                vec![budget(0, 3, 3)],
                Ok(PodNotRunning),
            ),
            (
                "pending pod ignores budget",
                phase(running("web-0"), "Pending"),
                vec![budget(0, 3, 3)],
                Ok(PodNotRunning),
            ),
            (
                "terminating pod ignores budget",
                deleting(running("web-0")),
                vec![budget(0, 3, 3)],
                Ok(PodNotRunning),
            ),
            (
                "terminating pod ignores even several budgets",
                deleting(running("web-0")),
                vec![budget(0, 3, 3), pdb("all", None)],
                Ok(PodNotRunning),
            ),
            (
                "two budgets",
                running("web-0"),
                vec![budget(5, 1, 3), pdb("all", None)],
                Err(500),
            ),
            (
                "empty selector covers the pod",
                running("web-0"),
                vec![{
                    let mut all = budget(0, 3, 3);
                    all.spec.as_mut().unwrap().selector = Some(Default::default());
                    all
                }],
                Err(429),
            ),
            (
                "absent selector covers nothing",
                running("web-0"),
                vec![{
                    let mut none = budget(0, 3, 3);
                    none.spec.as_mut().unwrap().selector = None;
                    none
                }],
                Ok(NoBudget),
            ),
            (
                "unready pod, healthy budget (default policy)",
                not_ready(running("web-0")),
                vec![budget(0, 2, 2)],
                Ok(UnhealthyPodWithinHealthyBudget),
            ),
            (
                "unready pod, explicit IfHealthyBudget",
                not_ready(running("web-0")),
                vec![with_policy(budget(0, 2, 2), "IfHealthyBudget")],
                Ok(UnhealthyPodWithinHealthyBudget),
            ),
            (
                "unready pod, disrupted application, IfHealthyBudget",
                not_ready(running("web-0")),
                vec![budget(0, 3, 2)],
                Err(429),
            ),
            (
                "unready pod, disrupted application, budget still has units",
                not_ready(running("web-0")),
                vec![{
                    let mut odd = budget(1, 3, 2);
                    odd.metadata.name = Some("odd".to_owned());
                    odd
                }],
                Ok(BudgetSpent),
            ),
            (
                "unready pod, desiredHealthy 0 spends the budget",
                not_ready(running("web-0")),
                vec![budget(0, 0, 0)],
                Err(429),
            ),
            (
                "unready pod, AlwaysAllow",
                not_ready(running("web-0")),
                vec![with_policy(budget(0, 3, 1), "AlwaysAllow")],
                Ok(UnhealthyPodAlwaysAllowed),
            ),
            (
                "ready pod, AlwaysAllow still guarded",
                running("web-0"),
                vec![with_policy(budget(0, 3, 3), "AlwaysAllow")],
                Err(429),
            ),
            (
                "stale status",
                running("web-0"),
                vec![{
                    let mut stale = budget(5, 1, 3);
                    stale.metadata.generation = Some(2);
                    stale
                }],
                Err(429),
            ),
            (
                "negative disruptionsAllowed",
                running("web-0"),
                vec![budget(-1, 1, 3)],
                Err(403),
            ),
        ];
        for (name, pod, pdbs, expected) in cases {
            let pod_name = pod.metadata.name.clone().unwrap();
            let decision = evaluate_eviction(&pod, &pod_name, &pdbs, at(0));
            match (&decision, expected) {
                (EvictionDecision::Allow(allowance), Ok(why)) => {
                    assert_eq!(allowance.because, why, "{name}");
                }
                (EvictionDecision::Refuse(refusal), Err(code)) => {
                    assert_eq!(refusal.code, code, "{name}: {refusal:?}");
                }
                (decision, expected) => panic!("{name}: expected {expected:?}, got {decision:?}"),
            }
        }
    }

    #[test]
    fn spending_decrements_and_records_the_pod() {
        let decision = evaluate_eviction(&running("web-0"), "web-0", &[budget(2, 1, 3)], at(5));
        let EvictionDecision::Allow(allowance) = decision else {
            panic!("expected an allowance");
        };
        assert_eq!(allowance.pod_resource_version_precondition, None);
        let spend = allowance.budget_spend.unwrap();
        assert_eq!(spend.pdb_name, "web-pdb");
        assert_eq!(spend.pdb_resource_version.as_deref(), Some("7"));
        assert_eq!(spend.status.disruptions_allowed, 1);
        assert_eq!(
            spend.status.disrupted_pods,
            Some(BTreeMap::from([("web-0".to_owned(), Time(at(5)))]))
        );
        assert!(
            spend.status.conditions.is_none(),
            "condition untouched while units remain"
        );
        assert_eq!(
            allowance.disruption_target_condition.type_,
            "DisruptionTarget"
        );
        assert_eq!(
            allowance.disruption_target_condition.reason.as_deref(),
            Some("EvictionByEvictionAPI")
        );
    }

    #[test]
    fn spending_the_last_unit_flips_the_condition() {
        let status = spend_budget(&budget(1, 2, 3), "web-0", at(5)).unwrap();
        assert_eq!(status.disruptions_allowed, 0);
        let condition = &status.conditions.unwrap()[0];
        assert_eq!(
            (
                condition.type_.as_str(),
                condition.status.as_str(),
                condition.reason.as_str()
            ),
            ("DisruptionAllowed", "False", "InsufficientPods")
        );
    }

    #[test]
    fn two_evictions_cannot_both_spend_the_last_unit() {
        let mut pdb = budget(1, 2, 3);
        let first = evaluate_eviction(&running("web-0"), "web-0", &[pdb.clone()], at(0));
        let EvictionDecision::Allow(allowance) = first else {
            panic!("first eviction should pass");
        };
        pdb.status = Some(allowance.budget_spend.unwrap().status);
        let second = refusal(evaluate_eviction(&running("web-1"), "web-1", &[pdb], at(0)));
        assert_eq!(second.code, 429);
    }

    #[test]
    fn refusals_render_the_real_status() {
        let exhausted = refusal(evaluate_eviction(
            &running("web-0"),
            "web-0",
            &[budget(0, 3, 3)],
            at(0),
        ));
        let json = serde_json::to_value(exhausted.to_status()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "status": "Failure",
                "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                "reason": "TooManyRequests",
                "details": {
                    "causes": [{
                        "reason": "DisruptionBudget",
                        "message": "The disruption budget web-pdb needs 3 healthy pods and has 3 currently"
                    }]
                },
                "code": 429
            })
        );
        assert_eq!(exhausted.retry_after_seconds, None);

        let mut stale = budget(5, 1, 3);
        stale.metadata.generation = Some(2);
        let stale = refusal(evaluate_eviction(
            &running("web-0"),
            "web-0",
            &[stale],
            at(0),
        ));
        assert_eq!(stale.retry_after_seconds, Some(10));
        assert_eq!(
            stale.causes,
            [(
                "DisruptionBudget".to_owned(),
                "The disruption budget web-pdb is still being processed by the server.".to_owned()
            )]
        );
        assert_eq!(
            stale.to_status().details.unwrap().retry_after_seconds,
            Some(10)
        );

        let multiple = refusal(evaluate_eviction(
            &running("web-0"),
            "web-0",
            &[budget(1, 1, 3), pdb("all", None)],
            at(0),
        ));
        let json = serde_json::to_value(multiple.to_status()).unwrap();
        assert_eq!(json["code"], 500);
        assert_eq!(json["message"], MULTIPLE_BUDGETS_MESSAGE);
        assert!(json.get("reason").is_none(), "the real 500 has no reason");

        let negative = refusal(evaluate_eviction(
            &running("web-0"),
            "web-0",
            &[budget(-1, 1, 3)],
            at(0),
        ));
        assert_eq!(
            negative.message,
            "poddisruptionbudget.policy \"web-pdb\" is forbidden: pdb disruptions allowed is negative"
        );
        let details = negative.to_status().details.unwrap();
        assert_eq!(details.kind.as_deref(), Some("poddisruptionbudget"));
        assert_eq!(details.group.as_deref(), Some("policy"));
    }

    #[test]
    fn name_mismatch_is_a_bad_request() {
        let refused = refusal(evaluate_eviction(&running("web-0"), "web-1", &[], at(0)));
        assert_eq!(refused.code, 400);
        assert_eq!(refused.reason, Some("BadRequest"));
        assert_eq!(
            refused.message,
            "name in URL does not match name in Eviction object"
        );
        assert!(check_eviction_name("a", "a").is_ok());
        assert_eq!(check_eviction_name("a", "b").unwrap_err().code, 400);
    }

    #[test]
    fn too_many_unconfirmed_evictions_are_forbidden() {
        let mut pdb = budget(5, 1, 3);
        pdb.status.as_mut().unwrap().disrupted_pods = Some(
            (0..=MAX_DISRUPTED_POD_SIZE)
                .map(|i| (format!("p{i}"), Time(at(0))))
                .collect(),
        );
        let refused = refusal(evaluate_eviction(&running("web-0"), "web-0", &[pdb], at(0)));
        assert_eq!(refused.code, 403);
        assert!(refused.message.contains("DisruptedPods map too big"));
    }

    #[test]
    fn preconditions_guard_readiness_based_decisions() {
        let precondition = |pod: Pod, pdbs: Vec<PodDisruptionBudget>| {
            let name = pod.metadata.name.clone().unwrap();
            match evaluate_eviction(&pod, &name, &pdbs, at(0)) {
                EvictionDecision::Allow(allowance) => allowance.pod_resource_version_precondition,
                EvictionDecision::Refuse(refusal) => panic!("unexpected {refusal:?}"),
            }
        };
        let pending = phase(running("web-0"), "Pending");
        assert_eq!(precondition(pending, vec![]).as_deref(), Some("42"));
        assert_eq!(
            precondition(phase(running("web-0"), "Failed"), vec![]),
            None
        );
        assert_eq!(precondition(deleting(running("web-0")), vec![]), None);
        assert_eq!(precondition(running("web-0"), vec![]), None);
        assert_eq!(
            precondition(not_ready(running("web-0")), vec![budget(0, 2, 2)]).as_deref(),
            Some("42")
        );
        assert_eq!(precondition(running("web-0"), vec![budget(1, 2, 3)]), None);
        assert_eq!(eviction_success_status().status.as_deref(), Some("Success"));
    }

    #[test]
    fn budgets_with_invalid_selectors_cover_nothing() {
        let mut broken = budget(0, 3, 3);
        broken.spec.as_mut().unwrap().selector = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_expressions: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "app".to_owned(),
                        operator: "Equals".to_owned(),
                        values: Some(vec!["web".to_owned()]),
                    },
                ]),
                match_labels: None,
            },
        );
        let pdbs = [broken];
        assert!(budgets_covering(&running("web-0"), &pdbs).is_empty());
        assert_eq!(
            allowed(&evaluate_eviction(&running("web-0"), "web-0", &pdbs, at(0))),
            Some(AllowedBecause::NoBudget)
        );
    }
}
