//! Where a PDB-paced drain's time goes, wave by wave: from the fake's change stream, when
//! each replacement turned Ready and when each budget's status allowed a disruption again;
//! from the audit log, when the drain asked to evict a pod of that budget and when an
//! eviction was granted. A wave of one budget is
//!
//! granted → replacement Ready → budget allows → next eviction asked → granted
//!
//! and the medians of those four gaps over every wave of every budget say which part
//! (the simulated kubelet, the simulated disruption controller, the drain's reaction, or
//! refusals in between) sets the pace.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;

use crate::kube::{AuditEvent, FakeApiServer};

use super::median;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// A pod of the budget turned Ready.
    Ready,
    /// The budget's status went from no disruption allowed to some.
    Allowed,
}

/// Records Ready pods and budgets turning allowed while a drain runs.
pub struct Recorder {
    marks: Arc<Mutex<Vec<(Timestamp, String, Mark)>>>,
    task: tokio::task::JoinHandle<()>,
}

fn allowed(object: &Value) -> i64 {
    object["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)
}

fn ready(object: &Value) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

impl Recorder {
    /// Starts recording every change committed from now on.
    pub fn start(server: &FakeApiServer) -> Result<Self, String> {
        let mut changes = {
            let state = server.store().lock();
            let (_, changes) = state
                .watch_from(state.resource_version())
                .map_err(|e| e.message)?;
            changes
        };
        let marks: Arc<Mutex<Vec<(Timestamp, String, Mark)>>> = Arc::default();
        let recorded = Arc::clone(&marks);
        let task = tokio::spawn(async move {
            while let Ok(change) = changes.recv().await {
                let now = Timestamp::now();
                let previous = change.previous.as_ref();
                let mark = match change.resource.plural {
                    "poddisruptionbudgets" => (allowed(&change.object) > 0
                        && previous.is_none_or(|p| allowed(p) <= 0))
                    .then(|| (name(&change.object).to_owned(), Mark::Allowed)),
                    "pods" => (ready(&change.object) && !previous.is_some_and(ready))
                        .then(|| (name(&change.object).to_owned(), Mark::Ready)),
                    _ => None,
                };
                if let Some((name, mark)) = mark {
                    recorded
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((now, name, mark));
                }
            }
        });
        Ok(Self { marks, task })
    }

    /// Stops recording and relates the marks to the drain's eviction requests (`budgets`:
    /// the budgets' names, each the prefix of its pods' names).
    pub fn finish(self, evictions: &[AuditEvent], budgets: &[String]) -> Gaps {
        self.task.abort();
        let marks = self.marks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let budget_of = |pod: &str| {
            budgets
                .iter()
                .find(|b| pod.starts_with(&format!("{b}-")))
                .cloned()
        };
        // Per budget: (time, what), what = Ready / Allowed / asked (code).
        let mut per_budget: BTreeMap<String, Vec<(Timestamp, Event)>> = BTreeMap::new();
        for (at, name, mark) in marks {
            let budget = match mark {
                Mark::Allowed => Some(name),
                Mark::Ready => budget_of(&name),
            };
            if let Some(budget) = budget {
                per_budget.entry(budget).or_default().push((
                    at,
                    match mark {
                        Mark::Ready => Event::Ready,
                        Mark::Allowed => Event::Allowed,
                    },
                ));
            }
        }
        for e in evictions {
            let (Some(budget), Ok(at)) = (
                budget_of(e.name()),
                e.request_received_timestamp.parse::<Timestamp>(),
            ) else {
                continue;
            };
            per_budget
                .entry(budget)
                .or_default()
                .push((at, Event::Asked(e.code())));
        }
        let mut gaps = Gaps::default();
        let span = |from: Timestamp, to: Timestamp| {
            Duration::try_from(to.duration_since(from)).unwrap_or_default()
        };
        for events in per_budget.values_mut() {
            events.sort_by_key(|(at, _)| *at);
            let granted: Vec<usize> = events
                .iter()
                .enumerate()
                .filter(|(_, (_, e))| matches!(e, Event::Asked(code) if *code < 300))
                .map(|(i, _)| i)
                .collect();
            for pair in granted.windows(2) {
                let (previous, next) = (pair[0], pair[1]);
                let between = &events[previous..=next];
                let find = |from: usize, wanted: fn(&Event) -> bool| {
                    (from..between.len()).find(|&i| wanted(&between[i].1))
                };
                let Some(ready_at) = find(1, |e| *e == Event::Ready) else {
                    continue;
                };
                let Some(allowed_at) = find(ready_at, |e| *e == Event::Allowed) else {
                    continue;
                };
                let Some(asked_at) = find(allowed_at, |e| matches!(e, Event::Asked(_))) else {
                    continue;
                };
                let time = |i: usize| between[i].0;
                gaps.granted_to_ready.push(span(time(0), time(ready_at)));
                gaps.ready_to_allowed
                    .push(span(time(ready_at), time(allowed_at)));
                gaps.allowed_to_asked
                    .push(span(time(allowed_at), time(asked_at)));
                gaps.asked_to_granted
                    .push(span(time(asked_at), time(between.len() - 1)));
                gaps.wave.push(span(time(0), time(between.len() - 1)));
            }
        }
        gaps
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Ready,
    Allowed,
    Asked(u16),
}

/// The gaps of every wave after a budget's first eviction.
#[derive(Debug, Clone, Default)]
pub struct Gaps {
    /// Eviction granted → a replacement of the budget Ready (the simulated ReplicaSet,
    /// scheduler and kubelet).
    pub granted_to_ready: Vec<Duration>,
    /// → the budget's status allows a disruption (the simulated disruption controller).
    pub ready_to_allowed: Vec<Duration>,
    /// → the drain asks to evict a pod of the budget (the budget watch).
    pub allowed_to_asked: Vec<Duration>,
    /// → an eviction of the budget granted (refusals in between count here).
    pub asked_to_granted: Vec<Duration>,
    /// Granted → the next grant of the same budget.
    pub wave: Vec<Duration>,
}

impl Gaps {
    /// Adds another run's waves.
    pub fn extend(&mut self, other: Gaps) {
        self.granted_to_ready.extend(other.granted_to_ready);
        self.ready_to_allowed.extend(other.ready_to_allowed);
        self.allowed_to_asked.extend(other.allowed_to_asked);
        self.asked_to_granted.extend(other.asked_to_granted);
        self.wave.extend(other.wave);
    }

    /// One line: the median and the maximum of each gap, in milliseconds.
    pub fn summary(&self) -> String {
        let part = |name: &str, values: &[Duration]| {
            let mut sorted = values.to_vec();
            let max = sorted.iter().max().copied().unwrap_or_default();
            format!(
                "{name} {:.0}/{:.0}",
                median(&mut sorted).as_secs_f64() * 1000.0,
                max.as_secs_f64() * 1000.0
            )
        };
        format!(
            "{} waves, median/max ms: {}; {}; {}; {}; {}",
            self.wave.len(),
            part("granted→Ready", &self.granted_to_ready),
            part("Ready→allowed", &self.ready_to_allowed),
            part("allowed→asked", &self.allowed_to_asked),
            part("asked→granted", &self.asked_to_granted),
            part("wave", &self.wave),
        )
    }
}
