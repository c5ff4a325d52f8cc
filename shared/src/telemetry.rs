//! Logs and metrics as Lambda and CloudWatch expect them.
//!
//! - Logs: `tracing`, one structured line per step; JSON when the function's log format is
//!   JSON (`AWS_LAMBDA_LOG_FORMAT=JSON`), level from `AWS_LAMBDA_LOG_LEVEL` or `RUST_LOG`.
//! - Metrics: CloudWatch Embedded Metric Format (EMF) lines on stdout, which CloudWatch turns
//!   into metrics without any API call (no extra latency, no extra IAM permission).

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

/// The CloudWatch namespace of every metric the functions emit.
pub const METRIC_NAMESPACE: &str = "OpenNodeManager";

/// Installs the global log subscriber. Call once, first thing in `main`.
pub fn init() {
    lambda_runtime::tracing::init_default_subscriber();
}

/// A CloudWatch metric unit (the subset the functions use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Seconds,
    Milliseconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Self::Count => "Count",
            Self::Seconds => "Seconds",
            Self::Milliseconds => "Milliseconds",
        }
    }
}

/// A set of metrics that share dimensions, written as one EMF line.
///
/// ```
/// use node_manager::telemetry::{MetricSet, Unit};
/// let line = MetricSet::new("terminating-hook")
///     .dimension("Outcome", "Drained")
///     .metric("PodsEvicted", 3.0, Unit::Count)
///     .to_json_line(1_700_000_000_000);
/// assert!(line.contains("\"PodsEvicted\":3.0"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSet {
    dimensions: Vec<(String, String)>,
    metrics: Vec<(String, f64, Unit)>,
    properties: Map<String, Value>,
}

impl MetricSet {
    /// A metric set for `function`, which becomes the `Function` dimension.
    pub fn new(function: &str) -> Self {
        Self {
            dimensions: vec![("Function".to_owned(), function.to_owned())],
            metrics: Vec::new(),
            properties: Map::new(),
        }
    }

    pub fn dimension(mut self, name: &str, value: &str) -> Self {
        self.dimensions.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn metric(mut self, name: &str, value: f64, unit: Unit) -> Self {
        self.metrics.push((name.to_owned(), value, unit));
        self
    }

    /// A searchable property that is not a dimension (instance id, node name, ...).
    pub fn property(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.properties.insert(name.to_owned(), value.into());
        self
    }

    /// The EMF document, stamped with `timestamp_ms` (milliseconds since the epoch).
    pub fn to_json_line(&self, timestamp_ms: u64) -> String {
        let mut root = self.properties.clone();
        for (name, value) in &self.dimensions {
            root.insert(name.clone(), Value::String(value.clone()));
        }
        for (name, value, _) in &self.metrics {
            root.insert(name.clone(), json!(value));
        }
        let dimension_names: Vec<&str> = self.dimensions.iter().map(|(n, _)| n.as_str()).collect();
        let metric_definitions: Vec<Value> = self
            .metrics
            .iter()
            .map(|(name, _, unit)| json!({ "Name": name, "Unit": unit.as_str() }))
            .collect();
        root.insert(
            "_aws".to_owned(),
            json!({
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{
                    "Namespace": METRIC_NAMESPACE,
                    "Dimensions": [dimension_names],
                    "Metrics": metric_definitions,
                }],
            }),
        );
        Value::Object(root).to_string()
    }

    /// Writes the EMF line to stdout, where the Lambda log agent picks it up.
    pub fn emit(&self) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let line = self.to_json_line(now_ms);
        let mut stdout = std::io::stdout().lock();
        // A lost metric line must never fail the invocation.
        let _ = writeln!(stdout, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_line_declares_every_metric_and_dimension() {
        let line = MetricSet::new("nodegroup-auth")
            .dimension("Outcome", "Written")
            .metric("Writes", 1.0, Unit::Count)
            .metric("Duration", 0.25, Unit::Seconds)
            .property("RoleArn", "arn:aws:iam::111111111111:role/node")
            .to_json_line(42);
        let doc: Value = serde_json::from_str(&line).expect("valid JSON");
        assert_eq!(doc["_aws"]["Timestamp"], 42);
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], METRIC_NAMESPACE);
        assert_eq!(directive["Dimensions"], json!([["Function", "Outcome"]]));
        assert_eq!(
            directive["Metrics"],
            json!([{"Name": "Writes", "Unit": "Count"}, {"Name": "Duration", "Unit": "Seconds"}])
        );
        assert_eq!(doc["Function"], "nodegroup-auth");
        assert_eq!(doc["Writes"], 1.0);
        assert_eq!(doc["Duration"], 0.25);
        assert_eq!(doc["RoleArn"], "arn:aws:iam::111111111111:role/node");
        assert!(!line.contains('\n'));
    }
}
