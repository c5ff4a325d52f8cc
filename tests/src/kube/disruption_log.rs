//! The disruption log: every eviction the server decides and every pod DELETE it carries
//! out, with the PodDisruptionBudget counts at that instant.
//!
//! The audit log says what a client asked and what it was answered; it cannot say how many
//! pods of an application were healthy when an eviction was granted, and a test that samples
//! the store afterwards can miss a short dip. The server therefore writes an
//! [`EvictionRecord`] (or a [`PodDeletionRecord`]) while it still holds the store lock under
//! which it decided and wrote: the counts before and after are exact, and no other write can
//! fall between the decision and the record.
//!
//! Two kinds of counts are kept per budget ([`BudgetCounts`]):
//! - the PDB `status` as stored, which is all the real eviction handler reads
//!   (`currentHealthy`, `desiredHealthy`, `expectedPods`, `disruptionsAllowed`), and
//! - the healthy pods counted from the pods themselves (Ready, not being deleted), before
//!   the request and after its writes: what the application actually had.
//!
//! A request refused before it reaches the handler (authentication, authorization, an
//! injected fault) is in the audit log only; this log holds what the handler acted on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::Value;

use super::eviction::AllowedBecause;
use super::resources;
use super::selectors::LabelQuery;
use super::store::{State, labels_of, meta_str};

/// Who sent a request: the authenticated user and the `User-Agent` header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requester {
    pub username: String,
    pub groups: Vec<String>,
    pub user_agent: String,
}

/// One PDB covering the pod of a request, as it stood when the request was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetCounts {
    pub namespace: String,
    pub name: String,
    /// `status.currentHealthy` as stored (the disruption controller's last count).
    pub current_healthy: i32,
    /// `status.desiredHealthy` as stored.
    pub desired_healthy: i32,
    /// `status.expectedPods` as stored.
    pub expected_pods: i32,
    /// `status.disruptionsAllowed` as stored, before this request spent any.
    pub disruptions_allowed: i32,
    /// `status.observedGeneration` has caught up with `metadata.generation` (otherwise the
    /// handler answers 429 "still being processed").
    pub status_observed: bool,
    /// Pods the budget selects that were Ready and not being deleted, before the request.
    pub healthy_before: i32,
    /// The same count after the request's writes, in the same critical section. `None` when
    /// the request wrote nothing (a refusal, a dry run).
    pub healthy_after: Option<i32>,
}

impl BudgetCounts {
    /// This request removed a healthy pod of the budget and left it below `desiredHealthy`:
    /// the disruption a PDB exists to prevent.
    pub fn broken_by_request(&self) -> bool {
        self.healthy_after
            .is_some_and(|after| after < self.healthy_before && after < self.desired_healthy)
    }
}

/// What the eviction handler did with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// Allowed (201), and its writes were made unless the request was a dry run.
    Granted(AllowedBecause),
    /// Refused by the decision: 400 (name mismatch), 403 (corrupt budget), 429 (budget
    /// exhausted or still being processed), 500 (more than one budget).
    Refused {
        code: u16,
        reason: Option<&'static str>,
        message: String,
    },
    /// Allowed by the decision, but a write failed afterwards (e.g. the client's
    /// `resourceVersion` precondition): the budget may have been spent, the pod not deleted.
    WriteFailed {
        because: AllowedBecause,
        code: u16,
        message: String,
    },
    /// No such pod (404); nothing was decided about a budget.
    PodNotFound,
}

/// One eviction request the handler decided.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionRecord {
    /// Order among all records of the log (evictions and pod deletions).
    pub sequence: u64,
    pub at: jiff::Timestamp,
    pub namespace: String,
    pub pod: String,
    pub requester: Requester,
    pub dry_run: bool,
    /// The pod was Ready and not being deleted when the request was decided.
    pub pod_was_healthy: bool,
    /// Every PDB whose selector matched the pod (more than one: the 500).
    pub budgets: Vec<BudgetCounts>,
    pub outcome: EvictionOutcome,
    /// The store's resourceVersion once the request was done.
    pub resource_version: u64,
}

impl EvictionRecord {
    /// Allowed and acted on (not a dry run).
    pub fn granted(&self) -> bool {
        !self.dry_run && matches!(self.outcome, EvictionOutcome::Granted(_))
    }

    /// Refused by a budget: 429 (exhausted or not yet processed) or 403 (corrupt status).
    pub fn refused_by_budget(&self) -> bool {
        matches!(
            self.outcome,
            EvictionOutcome::Refused {
                code: 403 | 429,
                ..
            }
        )
    }

    /// The HTTP status the client received.
    pub fn code(&self) -> u16 {
        match &self.outcome {
            EvictionOutcome::Granted(_) => 201,
            EvictionOutcome::Refused { code, .. } | EvictionOutcome::WriteFailed { code, .. } => {
                *code
            }
            EvictionOutcome::PodNotFound => 404,
        }
    }

    /// The budgets this request left with fewer healthy pods than desired by evicting a
    /// healthy one (see [`BudgetCounts::broken_by_request`]). Empty for a correct server.
    pub fn broken_budgets(&self) -> Vec<&BudgetCounts> {
        self.budgets
            .iter()
            .filter(|b| b.broken_by_request())
            .collect()
    }

    /// One line for a human.
    pub fn line(&self) -> String {
        let budgets: Vec<String> = self.budgets.iter().map(BudgetCounts::line).collect();
        format!(
            "#{} eviction {}/{} by {} ua={:?}{}: {:?} [{}]",
            self.sequence,
            self.namespace,
            self.pod,
            self.requester.username,
            self.requester.user_agent,
            if self.dry_run { " (dry run)" } else { "" },
            self.outcome,
            budgets.join("; ")
        )
    }
}

impl BudgetCounts {
    fn line(&self) -> String {
        let after = self
            .healthy_after
            .map_or_else(|| "-".to_owned(), |after| after.to_string());
        format!(
            "{}/{}: status current {} desired {} expected {} allowed {}{}; healthy {} -> {}",
            self.namespace,
            self.name,
            self.current_healthy,
            self.desired_healthy,
            self.expected_pods,
            self.disruptions_allowed,
            if self.status_observed { "" } else { " (stale)" },
            self.healthy_before,
            after
        )
    }
}

/// One pod DELETE (or a pod removed by a DELETE of the collection): a disruption that does
/// not go through the eviction subresource and so is not checked against any budget.
#[derive(Debug, Clone, PartialEq)]
pub struct PodDeletionRecord {
    pub sequence: u64,
    pub at: jiff::Timestamp,
    pub namespace: String,
    pub pod: String,
    pub requester: Requester,
    /// `deletecollection` rather than `delete`.
    pub collection: bool,
    pub dry_run: bool,
    pub grace_period_seconds: Option<i64>,
    /// 200 when the pod was deleted (or marked for deletion), else the error's code.
    pub code: u16,
    /// The pod was Ready and not being deleted before the request.
    pub pod_was_healthy: bool,
    /// The PDBs whose selector matched the pod; `healthy_after` is set when it was deleted.
    pub budgets: Vec<BudgetCounts>,
    pub resource_version: u64,
}

impl PodDeletionRecord {
    /// The pod was deleted or marked for deletion (not a dry run, not an error).
    pub fn deleted(&self) -> bool {
        self.code == 200 && !self.dry_run
    }

    /// At least one PodDisruptionBudget selects the pod.
    pub fn covered_by_budget(&self) -> bool {
        !self.budgets.is_empty()
    }

    /// One line for a human.
    pub fn line(&self) -> String {
        let budgets: Vec<String> = self.budgets.iter().map(BudgetCounts::line).collect();
        format!(
            "#{} {} pod {}/{} by {} ua={:?}{}: {} [{}]",
            self.sequence,
            if self.collection {
                "deletecollection"
            } else {
                "delete"
            },
            self.namespace,
            self.pod,
            self.requester.username,
            self.requester.user_agent,
            if self.dry_run { " (dry run)" } else { "" },
            self.code,
            budgets.join("; ")
        )
    }
}

/// Figures over the evictions of a log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionTally {
    /// Eviction requests the handler decided (dry runs and 404s included).
    pub decided: u64,
    /// Granted and acted on.
    pub granted: u64,
    /// Refused by a budget (429, 403).
    pub refused_by_budget: u64,
    /// Refused because more than one budget covers the pod (500).
    pub multiple_budgets: u64,
    /// Every other answer: 400, 404, failed writes, dry runs.
    pub other: u64,
    /// Budget counts checked at a grant (one per covering budget of each grant).
    pub budget_checks: u64,
    /// Grants that left a budget below `desiredHealthy` by evicting a healthy pod.
    pub broken_budgets: u64,
}

#[derive(Default)]
struct Records {
    evictions: Vec<EvictionRecord>,
    deletions: Vec<PodDeletionRecord>,
}

/// The server's disruption log; clones share it. Read it with
/// [`FakeApiServer::disruption_log`](super::FakeApiServer::disruption_log).
#[derive(Clone, Default)]
pub struct DisruptionLog {
    records: Arc<Mutex<Records>>,
    sequence: Arc<AtomicU64>,
}

impl DisruptionLog {
    fn next_sequence(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Appends an eviction; its `sequence` is assigned here. Called with the store lock held.
    pub(crate) fn record_eviction(&self, mut record: EvictionRecord) {
        record.sequence = self.next_sequence();
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .evictions
            .push(record);
    }

    /// Appends a pod deletion; its `sequence` is assigned here. Called with the store lock
    /// held.
    pub(crate) fn record_deletion(&self, mut record: PodDeletionRecord) {
        record.sequence = self.next_sequence();
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deletions
            .push(record);
    }

    /// Every eviction request decided so far, in order.
    pub fn evictions(&self) -> Vec<EvictionRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .evictions
            .clone()
    }

    /// Every pod DELETE carried out (or attempted) so far, in order.
    pub fn pod_deletions(&self) -> Vec<PodDeletionRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deletions
            .clone()
    }

    /// Counts over [`DisruptionLog::evictions`].
    pub fn eviction_tally(&self) -> EvictionTally {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let mut tally = EvictionTally::default();
        for record in &records.evictions {
            tally.decided += 1;
            if record.granted() {
                tally.granted += 1;
                tally.budget_checks += record.budgets.len() as u64;
                tally.broken_budgets += record.broken_budgets().len() as u64;
            } else if record.refused_by_budget() {
                tally.refused_by_budget += 1;
            } else if record.code() == 500 {
                tally.multiple_budgets += 1;
            } else {
                tally.other += 1;
            }
        }
        tally
    }

    pub fn clear(&self) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.evictions.clear();
        records.deletions.clear();
    }
}

/// Ready (condition `Ready` is `True`) and not being deleted: what a PDB counts as healthy
/// (the controller also discounts pods it promised to an eviction; here every such pod is
/// already being deleted, in the same critical section as the promise).
pub(crate) fn pod_value_is_healthy(pod: &Value) -> bool {
    let deleting = pod
        .get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null());
    let ready = pod
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    ready && !deleting
}

/// The PDBs of `namespace` whose selector matches `pod_labels` (absent selector: none;
/// empty: all; invalid: none, as the eviction handler finds them), with their stored
/// status and the healthy pods they select now. `healthy_after` is left unset.
pub(crate) fn budgets_covering(
    state: &State,
    namespace: &str,
    pod_labels: &std::collections::BTreeMap<String, String>,
) -> Vec<BudgetCounts> {
    let (Some(pdbs), Some(_)) = (
        resources::find("policy", "v1", "poddisruptionbudgets"),
        resources::find("", "v1", "pods"),
    ) else {
        return Vec::new();
    };
    let mut covering = Vec::new();
    for value in state.iter(pdbs, Some(namespace)) {
        let Ok(pdb) = serde_json::from_value::<PodDisruptionBudget>(value.clone()) else {
            continue;
        };
        let Ok(selector) = LabelQuery::from_optional_label_selector(
            pdb.spec.as_ref().and_then(|spec| spec.selector.as_ref()),
        ) else {
            continue;
        };
        if !selector.matches(pod_labels) {
            continue;
        }
        let status = pdb.status.clone().unwrap_or_default();
        let status_observed = match (status.observed_generation, pdb.metadata.generation) {
            (Some(observed), Some(generation)) => observed >= generation,
            (_, None) => true,
            (None, Some(_)) => false,
        };
        covering.push(BudgetCounts {
            namespace: namespace.to_owned(),
            name: meta_str(value, "name").to_owned(),
            current_healthy: status.current_healthy,
            desired_healthy: status.desired_healthy,
            expected_pods: status.expected_pods,
            disruptions_allowed: status.disruptions_allowed,
            status_observed,
            healthy_before: healthy_pods(state, namespace, &selector),
            healthy_after: None,
        });
    }
    covering
}

/// Sets `healthy_after` of each budget from the pods as they are now.
pub(crate) fn count_after(state: &State, budgets: &mut [BudgetCounts]) {
    let Some(pdbs) = resources::find("policy", "v1", "poddisruptionbudgets") else {
        return;
    };
    for budget in budgets {
        let selector = state
            .get(pdbs, &budget.namespace, &budget.name)
            .ok()
            .and_then(|value| serde_json::from_value::<PodDisruptionBudget>(value).ok())
            .and_then(|pdb| {
                LabelQuery::from_optional_label_selector(
                    pdb.spec.as_ref().and_then(|spec| spec.selector.as_ref()),
                )
                .ok()
            });
        if let Some(selector) = selector {
            budget.healthy_after = Some(healthy_pods(state, &budget.namespace, &selector));
        }
    }
}

fn healthy_pods(state: &State, namespace: &str, selector: &LabelQuery) -> i32 {
    let Some(pods) = resources::find("", "v1", "pods") else {
        return 0;
    };
    let count = state
        .iter(pods, Some(namespace))
        .filter(|pod| {
            pod_value_is_healthy(pod)
                && selector.matches_json_labels(
                    pod.get("metadata")
                        .and_then(|m| m.get("labels"))
                        .and_then(Value::as_object),
                )
        })
        .count();
    i32::try_from(count).unwrap_or(i32::MAX)
}

/// Everything about a pod DELETE but its outcome, taken before the delete.
pub(crate) struct PendingDeletion {
    record: PodDeletionRecord,
}

impl PendingDeletion {
    /// Reads the pod (if it exists) and its budgets before the delete.
    pub(crate) fn before(
        state: &State,
        namespace: &str,
        name: &str,
        requester: &Requester,
        collection: bool,
        dry_run: bool,
        grace_period_seconds: Option<i64>,
    ) -> Self {
        let pod =
            resources::find("", "v1", "pods").and_then(|r| state.get(r, namespace, name).ok());
        let (pod_was_healthy, budgets) = match &pod {
            Some(pod) => (
                pod_value_is_healthy(pod),
                budgets_covering(state, namespace, &labels_of(pod)),
            ),
            None => (false, Vec::new()),
        };
        Self {
            record: PodDeletionRecord {
                sequence: 0,
                at: jiff::Timestamp::now(),
                namespace: namespace.to_owned(),
                pod: name.to_owned(),
                requester: requester.clone(),
                collection,
                dry_run,
                grace_period_seconds,
                code: 0,
                pod_was_healthy,
                budgets,
                resource_version: 0,
            },
        }
    }

    /// Completes the record with the outcome and the counts after it, and logs it.
    pub(crate) fn finish(mut self, state: &State, code: u16, log: &DisruptionLog) {
        self.record.code = code;
        if code == 200 && !self.record.dry_run {
            count_after(state, &mut self.record.budgets);
        }
        self.record.resource_version = state.resource_version();
        log.record_deletion(self.record);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;
    use kube::api::{Api, DeleteParams, EvictParams};
    use serde_json::json;

    use super::*;
    use crate::fixtures;
    use crate::kube::FakeApiServer;
    use crate::kube::eviction_api::evict;
    use crate::kube::store::Store;

    const WEB: &[(&str, &str)] = &[("app", "web")];

    fn admin() -> Requester {
        Requester {
            username: "kubernetes-admin".to_owned(),
            groups: vec!["system:masters".to_owned()],
            user_agent: "unit-test".to_owned(),
        }
    }

    /// Three Ready `app=web` pods and a `minAvailable` PDB whose status the controller
    /// computed as given (no controller runs on a bare store).
    fn store_with_budget(min_available: i32, status: PodDisruptionBudgetStatus) -> Store {
        let store = Store::new();
        for name in ["web-0", "web-1", "web-2"] {
            store
                .create(&fixtures::running_pod("default", name, "n1", WEB))
                .unwrap();
        }
        let mut pdb = fixtures::pdb_min_available("default", "web", min_available, WEB);
        pdb.status = Some(status);
        store.create(&pdb).unwrap();
        store
    }

    fn status(current: i32, desired: i32, allowed: i32) -> PodDisruptionBudgetStatus {
        PodDisruptionBudgetStatus {
            current_healthy: current,
            desired_healthy: desired,
            expected_pods: 3,
            disruptions_allowed: allowed,
            observed_generation: Some(1),
            ..Default::default()
        }
    }

    fn eviction(name: &str) -> Value {
        json!({ "apiVersion": "policy/v1", "kind": "Eviction", "metadata": { "name": name } })
    }

    #[test]
    fn a_grant_records_the_counts_before_and_after_and_the_next_refusal_sees_none_left() {
        let store = store_with_budget(2, status(3, 2, 1));
        let log = DisruptionLog::default();
        evict(
            &store,
            &log,
            &admin(),
            "default",
            "web-0",
            &eviction("web-0"),
            false,
        )
        .unwrap();
        let refused = evict(
            &store,
            &log,
            &admin(),
            "default",
            "web-1",
            &eviction("web-1"),
            false,
        )
        .unwrap_err();
        assert_eq!(refused.code, 429);

        let records = log.evictions();
        assert_eq!(records.len(), 2);
        let first = &records[0];
        assert_eq!(
            first.outcome,
            EvictionOutcome::Granted(AllowedBecause::BudgetSpent)
        );
        assert!(first.granted() && first.pod_was_healthy);
        assert_eq!(first.requester, admin());
        assert_eq!(
            first.budgets,
            [BudgetCounts {
                namespace: "default".to_owned(),
                name: "web".to_owned(),
                current_healthy: 3,
                desired_healthy: 2,
                expected_pods: 3,
                disruptions_allowed: 1,
                status_observed: true,
                healthy_before: 3,
                healthy_after: Some(2),
            }]
        );
        assert!(first.broken_budgets().is_empty());

        let second = &records[1];
        assert_eq!(second.pod, "web-1");
        assert!(!second.granted() && second.refused_by_budget());
        assert_eq!(second.code(), 429);
        let budget = &second.budgets[0];
        // The handler spent the unit; the controller has not recounted (no controller here).
        assert_eq!(
            (
                budget.disruptions_allowed,
                budget.current_healthy,
                budget.healthy_before,
                budget.healthy_after
            ),
            (0, 3, 2, None)
        );
        assert!(second.sequence > first.sequence);
        assert!(second.resource_version >= first.resource_version);
        assert_eq!(
            log.eviction_tally(),
            EvictionTally {
                decided: 2,
                granted: 1,
                refused_by_budget: 1,
                multiple_budgets: 0,
                other: 0,
                budget_checks: 1,
                broken_budgets: 0,
            }
        );
    }

    #[test]
    fn a_grant_on_a_status_that_overstates_the_healthy_pods_is_reported_as_broken() {
        // The controller's status claims a spare unit that the pods do not have (one of the
        // three turned unready since its last count): the handler trusts the status, as the real one
        // does, and the record shows what that did to the application.
        let store = store_with_budget(2, status(3, 2, 1));
        store
            .modify::<Pod>("default", "web-2", |pod| {
                for condition in pod
                    .status
                    .as_mut()
                    .and_then(|s| s.conditions.as_mut())
                    .into_iter()
                    .flatten()
                {
                    if condition.type_ == "Ready" {
                        condition.status = "False".to_owned();
                    }
                }
            })
            .unwrap();
        let log = DisruptionLog::default();
        evict(
            &store,
            &log,
            &admin(),
            "default",
            "web-0",
            &eviction("web-0"),
            false,
        )
        .unwrap();
        let record = &log.evictions()[0];
        let broken = record.broken_budgets();
        assert_eq!(broken.len(), 1, "{}", record.line());
        assert_eq!(
            (broken[0].healthy_before, broken[0].healthy_after),
            (2, Some(1))
        );
        assert_eq!(log.eviction_tally().broken_budgets, 1);
    }

    #[test]
    fn refusals_dry_runs_and_missing_pods_are_recorded_without_counts_after() {
        let store = store_with_budget(1, status(3, 1, 2));
        store
            .create(&fixtures::pdb_min_available("default", "all-web", 1, WEB))
            .unwrap();
        let log = DisruptionLog::default();
        let requester = admin();
        let call = |pod: &str, body: Value, dry_run: bool| {
            evict(&store, &log, &requester, "default", pod, &body, dry_run)
                .map_err(|e| e.code)
                .err()
        };
        assert_eq!(call("web-0", eviction("web-0"), false), Some(500));
        assert_eq!(call("web-0", eviction("web-1"), false), Some(400));
        assert_eq!(call("nope", eviction("nope"), false), Some(404));
        store.remove::<PodDisruptionBudget>("default", "all-web");
        assert_eq!(call("web-0", eviction("web-0"), true), None);

        let records = log.evictions();
        let codes: Vec<u16> = records.iter().map(EvictionRecord::code).collect();
        assert_eq!(codes, [500, 400, 404, 201]);
        assert_eq!(records[0].budgets.len(), 2, "both budgets of the 500");
        assert!(records[1].budgets.is_empty() && records[2].budgets.is_empty());
        let dry = &records[3];
        assert!(dry.dry_run && !dry.granted());
        assert_eq!(dry.budgets[0].healthy_after, None);
        assert_eq!(store.list_in::<Pod>("default").len(), 3, "nothing deleted");
        assert_eq!(
            log.eviction_tally(),
            EvictionTally {
                decided: 4,
                multiple_budgets: 1,
                other: 3,
                ..EvictionTally::default()
            }
        );
    }

    #[tokio::test]
    async fn the_server_records_evictions_and_pod_deletes_with_their_requester() {
        let server = FakeApiServer::builder().start().await.unwrap();
        let store = server.store();
        store.create(&fixtures::ready_node("n1")).unwrap();
        for name in ["web-0", "web-1", "web-2", "other"] {
            let labels: &[(&str, &str)] = if name == "other" {
                &[("app", "other")]
            } else {
                WEB
            };
            store
                .create(&fixtures::running_pod("default", name, "n1", labels))
                .unwrap();
        }
        store
            .create(&fixtures::pdb_min_available("default", "web", 2, WEB))
            .unwrap();
        server
            .wait_for("the PDB status", std::time::Duration::from_secs(5), |s| {
                s.get::<PodDisruptionBudget>("default", "web")
                    .ok()
                    .and_then(|p| p.status)
                    .is_some_and(|st| st.disruptions_allowed == 1)
            })
            .await
            .unwrap();
        let client = server.admin_client_without_retries().await.unwrap();
        let pods: Api<Pod> = Api::namespaced(client, "default");
        pods.evict("web-0", &EvictParams::default()).await.unwrap();
        assert!(pods.evict("web-1", &EvictParams::default()).await.is_err());
        pods.delete("web-2", &DeleteParams::default())
            .await
            .unwrap();
        pods.delete("other", &DeleteParams::default())
            .await
            .unwrap();

        let log = server.disruption_log();
        let evictions = log.evictions();
        assert_eq!(evictions.len(), 2);
        let (first, second) = (&evictions[0], &evictions[1]);
        assert_eq!(first.requester.username, "kubernetes-admin");
        assert!(
            first.requester.groups.iter().any(|g| g == "system:masters"),
            "{first:?}"
        );
        assert_eq!(
            (
                first.budgets[0].current_healthy,
                first.budgets[0].desired_healthy,
                first.budgets[0].disruptions_allowed,
                first.budgets[0].healthy_before,
                first.budgets[0].healthy_after
            ),
            (3, 2, 1, 3, Some(2))
        );
        assert_eq!(second.code(), 429);
        assert_eq!(second.budgets[0].disruptions_allowed, 0);

        let deletions = log.pod_deletions();
        let summary: Vec<(&str, u16, bool, bool)> = deletions
            .iter()
            .map(|d| {
                (
                    d.pod.as_str(),
                    d.code,
                    d.covered_by_budget(),
                    d.pod_was_healthy,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [("web-2", 200, true, true), ("other", 200, false, true)]
        );
        // The DELETE took the budget below its minimum: exactly what a PDB cannot stop.
        let web = &deletions[0].budgets[0];
        assert_eq!((web.healthy_before, web.healthy_after), (2, Some(1)));
        assert!(web.broken_by_request());
        assert!(deletions[0].deleted() && !deletions[0].collection);
        assert!(deletions[0].sequence > second.sequence);
    }
}
