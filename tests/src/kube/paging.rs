//! `continue` tokens of paged lists, as kube-apiserver's storage serves them.
//!
//! A token names the revision of the list's first page and the key the last page stopped at.
//! The next pages are read at that revision (a consistent snapshot: what was created,
//! changed or deleted after the first page does not show), rebuilt here from the store's
//! history of changes. A token whose revision was compacted ([`super::store::Store::compact`],
//! or beyond the history kept) is refused with `410 Expired` and a token for the rest at the
//! latest state, revision `-1`, as kube-apiserver answers it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::iter::Peekable;

use base64::Engine as _;
use serde_json::{Value, json};

use super::status::ApiError;

pub(crate) type Key = (String, String);

/// Where a page starts: after `key`, at revision `rv` (`None`: the latest state).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ContinueFrom {
    pub rv: Option<u64>,
    pub key: Key,
}

/// The token for the page after `key` of a list read at `rv` (`None`: the latest state).
pub(crate) fn continue_token(rv: Option<u64>, key: &Key) -> String {
    let rv = rv.map_or(-1, |rv| i64::try_from(rv).unwrap_or(i64::MAX));
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({ "rv": rv, "ns": key.0, "name": key.1 }).to_string())
}

/// Reads a token back; a token that is not one of ours (or names revision 0) is a bad
/// request, with kube-apiserver's message.
pub(crate) fn parse_continue(token: &str) -> Result<ContinueFrom, ApiError> {
    let invalid = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| invalid())?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    let rv = match value.get("rv").and_then(Value::as_i64) {
        Some(-1) => None,
        Some(rv) if rv > 0 => Some(rv.unsigned_abs()),
        _ => return Err(invalid()),
    };
    match (
        value.get("ns").and_then(Value::as_str),
        value.get("name").and_then(Value::as_str),
    ) {
        (Some(ns), Some(name)) => Ok(ContinueFrom {
            rv,
            key: (ns.to_owned(), name.to_owned()),
        }),
        _ => Err(invalid()),
    }
}

/// The objects of one storage as they were at a past revision, in key order, merged from the
/// current ones and `past`: for each key changed since, its value before the first such
/// change (`None`: it did not exist).
pub(crate) struct AtRevision<'a, I: Iterator<Item = (&'a Key, &'a Value)>> {
    current: Peekable<I>,
    past: Peekable<std::collections::btree_map::IntoIter<Key, Option<Value>>>,
}

impl<'a, I: Iterator<Item = (&'a Key, &'a Value)>> AtRevision<'a, I> {
    pub(crate) fn new(current: I, past: BTreeMap<Key, Option<Value>>) -> Self {
        Self {
            current: current.peekable(),
            past: past.into_iter().peekable(),
        }
    }
}

impl<'a, I: Iterator<Item = (&'a Key, &'a Value)>> Iterator for AtRevision<'a, I> {
    /// Borrowed when unchanged since: counting what is left of a list copies nothing.
    type Item = (Cow<'a, Key>, Cow<'a, Value>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.current.peek(), self.past.peek()) {
                (None, None) => return None,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((now, _)), Some((then, _))) => (*now).cmp(then),
            };
            if order == std::cmp::Ordering::Less {
                return self
                    .current
                    .next()
                    .map(|(k, v)| (Cow::Borrowed(k), Cow::Borrowed(v)));
            }
            if order == std::cmp::Ordering::Equal {
                self.current.next();
            }
            if let Some((key, Some(value))) = self.past.next() {
                return Some((Cow::Owned(key), Cow::Owned(value)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key(name: &str) -> Key {
        ("ns".into(), name.into())
    }

    #[test]
    fn a_token_reads_back_as_written() {
        for rv in [Some(42), None] {
            let token = continue_token(rv, &key("b"));
            assert_eq!(
                parse_continue(&token).unwrap(),
                ContinueFrom { rv, key: key("b") }
            );
        }
        assert_eq!(parse_continue("not-a-token").unwrap_err().code, 400);
        let zero = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(json!({"rv": 0, "ns": "ns", "name": "b"}).to_string());
        assert_eq!(parse_continue(&zero).unwrap_err().code, 400);
    }

    #[test]
    fn the_past_replaces_what_changed_since() {
        let current: BTreeMap<Key, Value> = [("a", 1), ("c", 3), ("d", 4)]
            .into_iter()
            .map(|(k, v)| (key(k), json!(v)))
            .collect();
        // `b` was deleted since (it had 2), `c` changed (it had 30), `d` was created since.
        let past: BTreeMap<Key, Option<Value>> = [
            (key("b"), Some(json!(2))),
            (key("c"), Some(json!(30))),
            (key("d"), None),
        ]
        .into_iter()
        .collect();
        let seen: Vec<(String, Value)> = AtRevision::new(current.iter(), past)
            .map(|(k, v)| (k.into_owned().1, v.into_owned()))
            .collect();
        assert_eq!(
            seen,
            [
                ("a".to_owned(), json!(1)),
                ("b".to_owned(), json!(2)),
                ("c".to_owned(), json!(30)),
            ]
        );
    }
}
