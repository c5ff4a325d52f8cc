//! Paged lists, one page at a time, that survive an expired `continue` token.
//!
//! A `continue` token names the revision of the list's first page; kube-apiserver serves the
//! next pages at that revision, from its watch cache or from etcd. Once etcd has compacted
//! that revision (kube-apiserver compacts every five minutes by default) the token is refused
//! with `410 Expired`, and the answer carries another token that lists the rest of the
//! collection at its latest state (an "inconsistent" continuation). Every list of this crate
//! wants each object once, not a snapshot: a long list (the reconciler's marked nodes at
//! fleet scale, a refresh's pods) follows that token instead of failing or starting over.

use kube::Api;
use kube::api::ListParams;
use kube::core::Status;
use serde::de::DeserializeOwned;

/// The pages of one list: [`Pages::next`] until `None`.
pub struct Pages<K> {
    api: Api<K>,
    params: ListParams,
    done: bool,
}

impl<K> Pages<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    /// The pages of `params` (its `limit` is the page size; a `continue` token in it starts
    /// there).
    pub fn new(api: Api<K>, params: ListParams) -> Self {
        Self {
            api,
            params,
            done: false,
        }
    }

    /// The next page's objects; `None` after the last page. An expired token is followed by
    /// the rest at the latest state (logged); any other error is returned, and the same page
    /// is asked for again on the next call.
    pub async fn next(&mut self) -> Result<Option<Vec<K>>, kube::Error> {
        if self.done {
            return Ok(None);
        }
        let page = match self.api.list(&self.params).await {
            Err(kube::Error::Api(status)) if self.params.continue_token.is_some() => {
                let rest = remainder_after_expiry(&status).ok_or(kube::Error::Api(status))?;
                tracing::info!(
                    "a list's continue token expired (its revision was compacted); listing the rest at the latest state"
                );
                self.params.continue_token = Some(rest);
                self.api.list(&self.params).await?
            }
            other => other?,
        };
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => self.params.continue_token = Some(token),
            None => self.done = true,
        }
        Ok(Some(page.items))
    }
}

/// The token for the rest of a list whose `continue` token expired: kube-apiserver answers
/// `410` with reason `Expired` and that token in the status's list metadata. `None` for any
/// other answer, or an expiry without one (the list must then start over).
fn remainder_after_expiry(status: &Status) -> Option<String> {
    if status.code != 410 || status.reason != "Expired" {
        return None;
    }
    status
        .metadata
        .as_ref()?
        .continue_
        .clone()
        .filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

    fn status(code: u16, reason: &str, token: Option<&str>) -> Status {
        let mut status = Status::failure("too old", reason).with_code(code);
        status.metadata = token.map(|t| ListMeta {
            continue_: Some(t.to_owned()),
            ..ListMeta::default()
        });
        status
    }

    #[test]
    fn only_an_expiry_that_names_the_rest_is_followed() {
        assert_eq!(
            remainder_after_expiry(&status(410, "Expired", Some("rest"))).as_deref(),
            Some("rest")
        );
        assert_eq!(remainder_after_expiry(&status(410, "Expired", None)), None);
        assert_eq!(
            remainder_after_expiry(&status(410, "Expired", Some(""))),
            None
        );
        assert_eq!(
            remainder_after_expiry(&status(410, "Gone", Some("rest"))),
            None
        );
        assert_eq!(
            remainder_after_expiry(&status(500, "Expired", Some("rest"))),
            None
        );
    }
}
