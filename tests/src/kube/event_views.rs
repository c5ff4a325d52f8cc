//! One storage for Events, two shapes: like the real server, `events.k8s.io/v1` Events are
//! the core/v1 Events seen through a field mapping, so an Event recorded with kube-runtime's
//! `Recorder` shows in `kubectl get events` and `kubectl describe`, and vice versa.

use serde_json::{Map, Value, json};

/// `(core/v1 field, events.k8s.io/v1 field)`.
const FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("related", "related"),
    ("message", "note"),
    ("reason", "reason"),
    ("type", "type"),
    ("action", "action"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("reportingComponent", "reportingController"),
    ("reportingInstance", "reportingInstance"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn convert(object: Value, api_version: &str, to_v1: bool) -> Value {
    let Value::Object(mut fields) = object else {
        return object;
    };
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    if let Some(metadata) = fields.remove("metadata") {
        out.insert("metadata".into(), metadata);
    }
    for (core, v1) in FIELDS {
        let (from, to) = if to_v1 { (core, v1) } else { (v1, core) };
        if let Some(value) = fields.remove(*from).filter(|v| !v.is_null()) {
            out.insert((*to).to_owned(), value);
        }
    }
    Value::Object(out)
}

/// A stored core/v1 Event as `events.k8s.io/v1` shows it.
pub fn core_to_v1(object: Value) -> Value {
    convert(object, "events.k8s.io/v1", true)
}

/// An `events.k8s.io/v1` Event in the core/v1 form it is stored in.
pub fn v1_to_core(object: Value) -> Value {
    convert(object, "v1", false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_the_recorder_fields() {
        let v1 = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": { "name": "n1.1", "namespace": "default" },
            "regarding": { "kind": "Node", "name": "n1" },
            "note": "Draining", "reason": "Drain", "type": "Normal", "action": "Drain",
            "reportingController": "terminating-hook", "reportingInstance": "i-1",
            "eventTime": "2025-01-01T00:00:00.000000Z",
        });
        let core = v1_to_core(v1.clone());
        assert_eq!(core["involvedObject"]["name"], "n1");
        assert_eq!(core["message"], "Draining");
        assert_eq!(core["reportingComponent"], "terminating-hook");
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core_to_v1(core), v1);
    }
}
