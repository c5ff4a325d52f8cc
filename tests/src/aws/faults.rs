//! Fault injection: throttling, 5xx and latency, targeted by service and operation and
//! deterministic under a seed, so a retry path is exercised the same way on every run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::protocol::ApiError;
use super::{Service, Shared, lock};

/// What an injected fault does to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwsFaultKind {
    /// The service's throttling error: `Throttling` 400 (Auto Scaling, SNS),
    /// `RequestLimitExceeded` 503 (EC2), `ThrottlingException` 429 (EKS).
    Throttle,
    /// 500: `InternalFailure` (query), `InternalError` (EC2), `ServerException` (EKS).
    InternalError,
    /// 503: `ServiceUnavailable` (query), `Unavailable` (EC2), `ServiceUnavailableException` (EKS).
    Unavailable,
    /// The request is answered normally after this delay.
    Latency(Duration),
}

/// One fault rule. Build with [`AwsFault::throttle`] etc., narrow with `on`/`on_service`,
/// limit with `times`/`probability`.
#[derive(Debug, Clone, PartialEq)]
pub struct AwsFault {
    pub kind: AwsFaultKind,
    /// Only requests to this service (all when `None`).
    pub service: Option<Service>,
    /// Only this operation, e.g. `CompleteLifecycleAction` (all when `None`).
    pub operation: Option<String>,
    /// Chance that a matching request is hit, drawn from the seeded generator.
    pub probability: f64,
    /// How many requests it hits at most (unlimited when `None`).
    pub times: Option<u32>,
}

impl AwsFault {
    pub fn new(kind: AwsFaultKind) -> Self {
        Self {
            kind,
            service: None,
            operation: None,
            probability: 1.0,
            times: None,
        }
    }

    pub fn throttle() -> Self {
        Self::new(AwsFaultKind::Throttle)
    }

    pub fn internal_error() -> Self {
        Self::new(AwsFaultKind::InternalError)
    }

    pub fn unavailable() -> Self {
        Self::new(AwsFaultKind::Unavailable)
    }

    pub fn latency(delay: Duration) -> Self {
        Self::new(AwsFaultKind::Latency(delay))
    }

    /// Targets one operation of one service.
    pub fn on(mut self, service: Service, operation: &str) -> Self {
        self.service = Some(service);
        self.operation = Some(operation.to_owned());
        self
    }

    pub fn on_service(mut self, service: Service) -> Self {
        self.service = Some(service);
        self
    }

    pub fn times(mut self, times: u32) -> Self {
        self.times = Some(times);
        self
    }

    pub fn probability(mut self, probability: f64) -> Self {
        self.probability = probability.clamp(0.0, 1.0);
        self
    }

    fn matches(&self, service: Service, operation: &str) -> bool {
        self.service.is_none_or(|s| s == service)
            && self.operation.as_deref().is_none_or(|o| o == operation)
            && self.times != Some(0)
    }
}

pub(crate) enum Decision {
    Proceed,
    Delay(Duration),
    Fail(AwsFaultKind),
}

pub(crate) struct FaultState {
    inner: Mutex<FaultRules>,
}

struct FaultRules {
    rules: Vec<AwsFault>,
    rng: StdRng,
    injected: u64,
}

impl Default for FaultState {
    fn default() -> Self {
        Self {
            inner: Mutex::new(FaultRules {
                rules: Vec::new(),
                rng: StdRng::seed_from_u64(0),
                injected: 0,
            }),
        }
    }
}

impl FaultState {
    /// The first matching rule that fires decides; a rule that fires spends one of its `times`.
    pub(crate) fn decide(&self, service: Service, operation: &str) -> Decision {
        let mut state = lock(&self.inner);
        let FaultRules {
            rules,
            rng,
            injected,
        } = &mut *state;
        for rule in rules.iter_mut() {
            if !rule.matches(service, operation) {
                continue;
            }
            if rule.probability < 1.0 && !rng.random_bool(rule.probability) {
                continue;
            }
            if let Some(times) = &mut rule.times {
                *times -= 1;
            }
            *injected += 1;
            return match rule.kind {
                AwsFaultKind::Latency(delay) => Decision::Delay(delay),
                kind => Decision::Fail(kind),
            };
        }
        Decision::Proceed
    }
}

/// The error AWS returns for an injected fault on `service`.
pub(crate) fn error_for(service: Service, kind: AwsFaultKind) -> ApiError {
    match (service, kind) {
        (Service::Ec2, AwsFaultKind::Throttle) => {
            ApiError::new(503, "RequestLimitExceeded", "Request limit exceeded.")
        }
        (Service::Eks, AwsFaultKind::Throttle) => {
            ApiError::new(429, "ThrottlingException", "Rate exceeded")
        }
        (_, AwsFaultKind::Throttle) => ApiError::new(400, "Throttling", "Rate exceeded"),
        (Service::Ec2, AwsFaultKind::InternalError) => {
            ApiError::new(500, "InternalError", "An internal error has occurred")
        }
        (Service::Eks, AwsFaultKind::InternalError) => {
            ApiError::new(500, "ServerException", "An internal error occurred.")
        }
        (_, AwsFaultKind::InternalError) => ApiError::new(
            500,
            "InternalFailure",
            "The request processing has failed because of an unknown error, exception or failure.",
        ),
        (Service::Ec2, _) => ApiError::new(
            503,
            "Unavailable",
            "The server is overloaded and can't handle the request.",
        ),
        (Service::Eks, _) => ApiError::new(
            503,
            "ServiceUnavailableException",
            "The service is unavailable. Try again later.",
        ),
        (_, _) => ApiError::new(
            503,
            "ServiceUnavailable",
            "The request has failed due to a temporary failure of the server.",
        ),
    }
}

/// Handle to configure fault injection.
#[derive(Clone)]
pub struct FakeAwsFaults {
    shared: Arc<Shared>,
}

impl FakeAwsFaults {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Reseeds the generator behind `probability` (the default seed is 0).
    pub fn seed(&self, seed: u64) {
        lock(&self.shared.faults.inner).rng = StdRng::seed_from_u64(seed);
    }

    /// Adds a rule after the existing ones.
    pub fn inject(&self, fault: AwsFault) {
        lock(&self.shared.faults.inner).rules.push(fault);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        lock(&self.shared.faults.inner).rules.clear();
    }

    /// How many requests a fault was injected into so far.
    pub fn injected(&self) -> u64 {
        lock(&self.shared.faults.inner).injected
    }
}
