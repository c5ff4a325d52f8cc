//! Finds credentials in captured logs: EKS bearer tokens, the fake account's secret access
//! keys and session tokens. A function that logs one of them leaks a credential to CloudWatch
//! Logs, where far more people can read it than can assume the role; every end-to-end test of
//! this suite runs its captured output through [`SecretScanner::assert_clean`].

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::account::FakeCredentials;

/// The prefix of every EKS token (`k8s-aws-v1.` + base64url of a presigned URL).
pub const EKS_TOKEN_PREFIX: &str = "k8s-aws-v1.";
/// Every secret access key [`crate::account::FakeAccount::add_role_credentials`] issues
/// starts with this; so a key of a role the test never named is still caught.
pub const FAKE_SECRET_PREFIX: &str = "fake-secret-";
/// Same for session tokens.
pub const FAKE_SESSION_PREFIX: &str = "fake-session-";

/// One credential found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretHit {
    /// What kind of secret (the needle's description).
    pub kind: String,
    /// 1-based line number in the scanned text.
    pub line: usize,
    /// The line, with the secret itself masked so the failure message does not leak it again.
    pub excerpt: String,
}

/// The needles to look for.
#[derive(Debug, Clone)]
pub struct SecretScanner {
    needles: Vec<(String, String)>,
}

impl Default for SecretScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl SecretScanner {
    /// EKS tokens and anything shaped like a fake secret key or session token.
    pub fn new() -> Self {
        Self {
            needles: vec![
                ("EKS bearer token".to_owned(), EKS_TOKEN_PREFIX.to_owned()),
                (
                    "secret access key".to_owned(),
                    FAKE_SECRET_PREFIX.to_owned(),
                ),
                ("session token".to_owned(), FAKE_SESSION_PREFIX.to_owned()),
                // A presigned STS URL carries the signature of the token.
                (
                    "presigned STS signature".to_owned(),
                    "X-Amz-Signature=".to_owned(),
                ),
            ],
        }
    }

    /// Also looks for these exact credentials (their secret key and session token; the
    /// access key id is not secret and is logged by AWS itself).
    pub fn with_credentials(mut self, credentials: &FakeCredentials) -> Self {
        self.needles.push((
            format!("secret access key of {}", credentials.principal_arn),
            credentials.secret_access_key.clone(),
        ));
        if let Some(token) = &credentials.session_token {
            self.needles.push((
                format!("session token of {}", credentials.principal_arn),
                token.clone(),
            ));
        }
        self
    }

    /// Also looks for `needle` (e.g. a token a test signed itself).
    pub fn with_needle(mut self, kind: &str, needle: &str) -> Self {
        if !needle.is_empty() {
            self.needles.push((kind.to_owned(), needle.to_owned()));
        }
        self
    }

    /// Every hit in `text`.
    pub fn scan(&self, text: &str) -> Vec<SecretHit> {
        let mut hits = Vec::new();
        for (number, line) in text.lines().enumerate() {
            for (kind, needle) in &self.needles {
                if line.contains(needle.as_str()) {
                    hits.push(SecretHit {
                        kind: kind.clone(),
                        line: number + 1,
                        excerpt: mask(line, needle),
                    });
                }
            }
        }
        hits
    }

    /// Panics (failing the test) with every hit when `text` holds a secret.
    pub fn assert_clean(&self, what: &str, text: &str) {
        let hits = self.scan(text);
        assert!(
            hits.is_empty(),
            "{what} leaks {} secret(s):\n{}",
            hits.len(),
            hits.iter()
                .map(|h| format!("  line {} ({}): {}", h.line, h.kind, h.excerpt))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// `line` with `needle` and what follows it up to the next blank replaced by `***`.
fn mask(line: &str, needle: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(needle) {
        out.push_str(&rest[..at]);
        out.push_str(&needle.chars().take(4).collect::<String>());
        out.push_str("***");
        let after = &rest[at + needle.len()..];
        let end = after
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'')
            .unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    let max = 300;
    if out.chars().count() > max {
        format!("{}…", out.chars().take(max).collect::<String>())
    } else {
        out
    }
}

/// The tracing output of in-process code, captured in memory (every level, every target).
#[derive(Debug, Clone, Default)]
pub struct CapturedLogs {
    buffer: Arc<Mutex<Vec<u8>>>,
}

impl CapturedLogs {
    /// Installs a subscriber for the current thread that writes every event, at TRACE level,
    /// into the returned buffer, for as long as the guard lives. With a current-thread Tokio
    /// runtime (the `#[tokio::test]` default) this covers every task the test spawns.
    pub fn install() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(logs.clone())
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        (logs, guard)
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// How many bytes were captured (to show the capture was not empty).
    pub fn len(&self) -> usize {
        self.buffer.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The writer handed to the subscriber: appends to the shared buffer.
pub struct CapturedWriter {
    buffer: Arc<Mutex<Vec<u8>>>,
}

impl Write for CapturedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buffer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLogs {
    type Writer = CapturedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        CapturedWriter {
            buffer: self.buffer.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_masks_every_kind_of_secret() {
        let creds = crate::account::FakeAccount::reference().add_role_credentials("hook");
        let scanner = SecretScanner::new().with_credentials(&creds);
        let text = format!(
            "ok line\nAuthorization: Bearer k8s-aws-v1.aHR0cHM6Ly9zdHM\nkey={} token={}\n",
            creds.secret_access_key,
            creds.session_token.clone().unwrap_or_default()
        );
        let hits = scanner.scan(&text);
        assert!(
            hits.iter()
                .any(|h| h.kind == "EKS bearer token" && h.line == 2)
        );
        assert!(
            hits.iter()
                .any(|h| h.kind.starts_with("secret access key") && h.line == 3)
        );
        assert!(
            hits.iter()
                .any(|h| h.kind.starts_with("session token") && h.line == 3)
        );
        assert!(hits.iter().all(|h| !h.excerpt.contains("aHR0cHM6Ly9zdHM")));
        assert!(
            scanner
                .scan("nothing here\naccess key ASIAXYZ\n")
                .is_empty()
        );
    }

    #[test]
    fn assert_clean_fails_on_a_hit() {
        let result = std::panic::catch_unwind(|| {
            SecretScanner::new().assert_clean("log", "Bearer k8s-aws-v1.abc")
        });
        assert!(result.is_err());
    }

    #[test]
    fn captured_tracing_output_is_scanned() {
        let (logs, guard) = CapturedLogs::install();
        tracing::info!(token = "k8s-aws-v1.leaked", "oops");
        drop(guard);
        assert!(!SecretScanner::new().scan(&logs.text()).is_empty());
    }
}
