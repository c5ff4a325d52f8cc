//! The sandbox's readable timeline: function invocations, every Kubernetes API call in
//! audit-log style, every AWS call, lifecycle results and checks, in the order they happened.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::aws::{AwsRequestRecord, FakeAws};
use crate::kube::{AuditEvent, FakeApiServer};

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEntry {
    pub at: Duration,
    pub source: Source,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Step,
    Lambda,
    Kubernetes,
    Aws,
    Check,
    Note,
}

impl Source {
    fn tag(self) -> &'static str {
        match self {
            Self::Step => "STEP",
            Self::Lambda => "λ",
            Self::Kubernetes => "k8s",
            Self::Aws => "aws",
            Self::Check => "CHECK",
            Self::Note => "·",
        }
    }
}

/// Collects entries from every source, stamped on arrival, and prints them as they come.
#[derive(Clone)]
pub struct Timeline {
    started: Instant,
    entries: Arc<Mutex<Vec<TimelineEntry>>>,
    echo: bool,
}

impl Timeline {
    /// `echo`: print each entry to stdout as it is recorded.
    pub fn new(echo: bool) -> Self {
        Self {
            started: Instant::now(),
            entries: Arc::default(),
            echo,
        }
    }

    pub fn record(&self, source: Source, text: impl Into<String>) {
        let entry = TimelineEntry {
            at: self.started.elapsed(),
            source,
            text: text.into(),
        };
        if self.echo {
            println!("{}", render(&entry));
        }
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(entry);
    }

    pub fn entries(&self) -> Vec<TimelineEntry> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Follows the fake API server's audit log and the fake AWS request log until the
    /// returned handle is aborted (or dropped with the runtime).
    pub fn follow(&self, server: &FakeApiServer, aws: Arc<FakeAws>) -> tokio::task::JoinHandle<()> {
        let timeline = self.clone();
        let audit = server.audit().clone();
        tokio::spawn(async move {
            let (mut seen_audit, mut seen_aws) = (0, 0);
            loop {
                let events = audit.events();
                for event in events.iter().skip(seen_audit) {
                    timeline.record(Source::Kubernetes, audit_line(event));
                }
                seen_audit = events.len();
                let requests = aws.requests();
                for request in requests.iter().skip(seen_aws) {
                    timeline.record(Source::Aws, aws_line(request));
                }
                seen_aws = requests.len();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}

/// `[  1.234s] k8s   terminating-hook  patch nodes/ip-... → 200`
pub fn render(entry: &TimelineEntry) -> String {
    let indent = match entry.source {
        Source::Step => "",
        _ => "  ",
    };
    format!(
        "[{:>7.3}s] {indent}{:<5} {}",
        entry.at.as_secs_f64(),
        entry.source.tag(),
        entry.text
    )
}

/// The function name out of the user agent `open-node-manager/<v> (<function>)`.
fn caller(user_agent: &str, fallback: &str) -> String {
    user_agent
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(name, _)| name.to_owned())
        .unwrap_or_else(|| fallback.to_owned())
}

fn audit_line(event: &AuditEvent) -> String {
    let mut resource = event.resource().to_owned();
    if !event.subresource().is_empty() {
        resource = format!("{resource}/{}", event.subresource());
    }
    let target = match (event.namespace(), event.name()) {
        ("", "") => String::new(),
        ("", name) => format!(" {name}"),
        (ns, "") => format!(" -n {ns}"),
        (ns, name) => format!(" {ns}/{name}"),
    };
    let target = if target.is_empty() && resource.is_empty() {
        format!(" {}", event.request_uri)
    } else {
        target
    };
    format!(
        "{:<18} {} {resource}{target} → {}",
        caller(&event.user_agent, &event.user.username),
        event.verb,
        event.code()
    )
}

fn aws_line(request: &AwsRequestRecord) -> String {
    let service = request
        .service
        .map(|s| s.signing_name().to_owned())
        .unwrap_or_else(|| "?".to_owned());
    let key_params: Vec<String> = [
        "InstanceId",
        "InstanceId.1",
        "LifecycleActionResult",
        "LifecycleHookName",
        "nodegroupName",
        "principalArn",
        "name",
    ]
    .iter()
    .filter_map(|k| request.params.get(*k).map(|v| format!("{k}={v}")))
    .collect();
    let who = request
        .user_agent
        .as_deref()
        .map(|ua| caller(ua, ""))
        .filter(|c| !c.is_empty())
        .or_else(|| {
            request
                .principal_arn
                .as_deref()
                .and_then(|arn| arn.rsplit('/').next())
                .map(str::to_owned)
        })
        .unwrap_or_default();
    format!(
        "{who:<18} {service} {} {} → {}{}",
        request.operation,
        key_params.join(" "),
        request.status,
        request
            .error_code
            .as_deref()
            .map(|c| format!(" {c}"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_is_the_function_in_the_user_agent() {
        assert_eq!(
            caller("open-node-manager/0.1.0 (terminating-hook)", "x"),
            "terminating-hook"
        );
        assert_eq!(caller("kubectl/v1.32", "admin"), "admin");
    }

    #[test]
    fn entries_render_with_time_and_source() {
        let line = render(&TimelineEntry {
            at: Duration::from_millis(1500),
            source: Source::Check,
            text: "ok".into(),
        });
        assert_eq!(line, "[  1.500s]   CHECK ok");
    }
}
