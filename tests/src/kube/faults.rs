//! Fault injection: make chosen requests slow, throttled, failing or cut off, reproducibly.
//!
//! Rules are matched in the order they were added; the first rule that matches a request
//! and whose (seeded) coin flip hits decides its fate. The random generator is seeded, so a
//! scenario that issues the same requests in the same order sees the same faults.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

/// What happens to a request a rule hits.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Delay the request, then serve it normally.
    Latency(Duration),
    /// `429 TooManyRequests` with `Retry-After: <seconds>` (API Priority and Fairness).
    TooManyRequests { retry_after_seconds: u64 },
    /// `500 InternalError`.
    InternalError,
    /// `503 ServiceUnavailable`.
    ServiceUnavailable,
    /// Close the connection without answering.
    DropConnection,
    /// `409 Conflict` as the API server sends when its own retries of a write that kept
    /// losing to concurrent changes run out (an eviction of a busy pod, for one).
    Conflict,
    /// `403 Forbidden` with the `NamespaceTerminating` cause (a write in a namespace being
    /// deleted).
    NamespaceTerminating,
}

impl FaultAction {
    pub fn describe(&self) -> String {
        match self {
            Self::Latency(d) => format!("latency {}ms", d.as_millis()),
            Self::TooManyRequests {
                retry_after_seconds,
            } => format!("429 retry-after {retry_after_seconds}s"),
            Self::InternalError => "500".into(),
            Self::ServiceUnavailable => "503".into(),
            Self::DropConnection => "dropped connection".into(),
            Self::Conflict => "409".into(),
            Self::NamespaceTerminating => "403 NamespaceTerminating".into(),
        }
    }
}

/// Which requests a rule applies to; `None` matches anything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultMatch {
    pub verb: Option<String>,
    pub resource: Option<String>,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Matches when the request's User-Agent contains this.
    pub user_agent_contains: Option<String>,
}

/// A fault rule.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub matches: FaultMatch,
    pub action: FaultAction,
    /// Chance (0..=1) that a matching request is hit.
    pub probability: f64,
    /// How many hits before the rule retires (`None`: forever).
    pub times: Option<u32>,
    /// When the rule retires whatever its hits (`None`: never): a burst.
    pub until: Option<std::time::Instant>,
}

impl FaultRule {
    /// A rule hitting every matching request, forever.
    pub fn new(action: FaultAction) -> Self {
        Self {
            matches: FaultMatch::default(),
            action,
            probability: 1.0,
            times: None,
            until: None,
        }
    }

    pub fn verb(mut self, verb: &str) -> Self {
        self.matches.verb = Some(verb.to_owned());
        self
    }

    pub fn resource(mut self, resource: &str) -> Self {
        self.matches.resource = Some(resource.to_owned());
        self
    }

    pub fn subresource(mut self, subresource: &str) -> Self {
        self.matches.subresource = Some(subresource.to_owned());
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        self.matches.namespace = Some(namespace.to_owned());
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.matches.name = Some(name.to_owned());
        self
    }

    pub fn user_agent(mut self, contains: &str) -> Self {
        self.matches.user_agent_contains = Some(contains.to_owned());
        self
    }

    pub fn probability(mut self, probability: f64) -> Self {
        self.probability = probability;
        self
    }

    /// The rule hits only for `duration` from now: a burst (of 503s on node writes, say).
    pub fn lasting(mut self, duration: Duration) -> Self {
        self.until = Some(std::time::Instant::now() + duration);
        self
    }

    /// The rule hits at most `times` requests.
    pub fn times(mut self, times: u32) -> Self {
        self.times = Some(times);
        self
    }
}

/// The attributes of a request that rules look at.
#[derive(Debug, Clone, Default)]
pub struct FaultTarget<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub user_agent: &'a str,
}

fn field_matches(wanted: Option<&String>, actual: &str) -> bool {
    wanted.is_none_or(|w| w == actual)
}

impl FaultMatch {
    fn matches(&self, target: &FaultTarget<'_>) -> bool {
        field_matches(self.verb.as_ref(), target.verb)
            && field_matches(self.resource.as_ref(), target.resource)
            && field_matches(self.subresource.as_ref(), target.subresource)
            && field_matches(self.namespace.as_ref(), target.namespace)
            && field_matches(self.name.as_ref(), target.name)
            && self
                .user_agent_contains
                .as_ref()
                .is_none_or(|c| target.user_agent.contains(c.as_str()))
    }
}

/// Identifies an added rule, to remove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FaultId(u64);

/// Throttling by request rate, the way API Priority and Fairness sheds load: a token bucket
/// of `burst` requests refilled at `per_second`; a request that finds it empty gets
/// `429 TooManyRequests` with `Retry-After: retry_after_seconds`. Watches are not counted
/// (long-running requests hold a seat rather than spend a token; their re-establishing is
/// what a throttled watcher would do anyway).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: f64,
    pub retry_after_seconds: u64,
}

#[derive(Debug)]
struct Bucket {
    limit: RateLimit,
    tokens: f64,
    refilled_at: std::time::Instant,
    throttled: u64,
}

impl Bucket {
    fn take(&mut self) -> bool {
        let now = std::time::Instant::now();
        let elapsed = now.duration_since(self.refilled_at).as_secs_f64();
        self.refilled_at = now;
        self.tokens = (self.tokens + elapsed * self.limit.per_second).min(self.limit.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.throttled += 1;
            false
        }
    }
}

struct Rules {
    rate_limit: Option<Bucket>,
    rules: Vec<(FaultId, FaultRule)>,
    next_id: u64,
    rng: StdRng,
    hits: u64,
}

/// The server's fault rules; clones share them.
#[derive(Clone)]
pub struct Faults {
    inner: Arc<Mutex<Rules>>,
}

impl Default for Faults {
    fn default() -> Self {
        Self::with_seed(0)
    }
}

impl Faults {
    pub fn with_seed(seed: u64) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Rules {
                rate_limit: None,
                rules: Vec::new(),
                next_id: 0,
                rng: StdRng::seed_from_u64(seed),
                hits: 0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rules> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-seeds the random generator (same seed, same requests: same faults).
    pub fn set_seed(&self, seed: u64) {
        self.lock().rng = StdRng::seed_from_u64(seed);
    }

    pub fn add(&self, rule: FaultRule) -> FaultId {
        let mut rules = self.lock();
        rules.next_id += 1;
        let id = FaultId(rules.next_id);
        rules.rules.push((id, rule));
        id
    }

    pub fn remove(&self, id: FaultId) {
        self.lock().rules.retain(|(rule_id, _)| *rule_id != id);
    }

    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// Throttles requests above `limit` (see [`RateLimit`]); `None` lifts it.
    pub fn set_rate_limit(&self, limit: Option<RateLimit>) {
        self.lock().rate_limit = limit.map(|limit| Bucket {
            limit,
            tokens: limit.burst,
            refilled_at: std::time::Instant::now(),
            throttled: 0,
        });
    }

    /// Requests the rate limit answered with 429 so far.
    pub fn throttled(&self) -> u64 {
        self.lock().rate_limit.as_ref().map_or(0, |b| b.throttled)
    }

    /// How many requests faults have hit so far.
    pub fn hits(&self) -> u64 {
        self.lock().hits
    }

    /// The fault for this request, if a rule hits it.
    pub fn decide(&self, target: &FaultTarget<'_>) -> Option<FaultAction> {
        let mut guard = self.lock();
        let rules = &mut *guard;
        if target.verb != "watch"
            && let Some(bucket) = rules.rate_limit.as_mut()
            && !bucket.take()
        {
            let retry_after_seconds = bucket.limit.retry_after_seconds;
            rules.hits += 1;
            return Some(FaultAction::TooManyRequests {
                retry_after_seconds,
            });
        }
        if rules.rules.is_empty() {
            return None;
        }
        let now = std::time::Instant::now();
        rules
            .rules
            .retain(|(_, rule)| rule.until.is_none_or(|until| now < until));
        let mut hit = None;
        for (index, (_, rule)) in rules.rules.iter_mut().enumerate() {
            if !rule.matches.matches(target) {
                continue;
            }
            let roll: f64 = rules.rng.random();
            if roll >= rule.probability {
                continue;
            }
            if let Some(times) = rule.times.as_mut() {
                *times = times.saturating_sub(1);
            }
            hit = Some((index, rule.action.clone()));
            break;
        }
        let (index, action) = hit?;
        rules.hits += 1;
        if rules.rules[index].1.times == Some(0) {
            rules.rules.remove(index);
        }
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(verb: &str) -> FaultTarget<'_> {
        FaultTarget {
            verb,
            ..FaultTarget::default()
        }
    }

    #[test]
    fn the_rate_limit_throttles_above_its_burst_but_not_watches() {
        let faults = Faults::default();
        faults.set_rate_limit(Some(RateLimit {
            per_second: 0.001,
            burst: 3.0,
            retry_after_seconds: 1,
        }));
        let answers: Vec<_> = (0..5).map(|_| faults.decide(&target("get"))).collect();
        assert_eq!(answers[..3], [None, None, None]);
        assert_eq!(
            answers[3],
            Some(FaultAction::TooManyRequests {
                retry_after_seconds: 1
            })
        );
        assert_eq!(faults.throttled(), 2);
        assert_eq!(faults.decide(&target("watch")), None);
        faults.set_rate_limit(None);
        assert_eq!(faults.decide(&target("get")), None);
    }
}
