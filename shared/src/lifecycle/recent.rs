//! How long something read from Auto Scaling about a group or hook (its tags, its hook's
//! timeouts) is trusted: at most [`MAX_AGE`], and only for the lifecycle action it was read
//! for. An operator who lowers a hook's `HeartbeatTimeout` or tags a group after its first
//! notification is seen by the next action, and by the same action within a minute, not only
//! when Lambda recycles the execution environment.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The longest a read is reused, even for the same action (its redeliveries and hand-overs).
/// One `Describe*` call a minute per group is negligible against Auto Scaling's limits, and a
/// minute is well inside the shortest heartbeat timeout Auto Scaling accepts (30 s between
/// heartbeats is half of it): a lowered timeout is paced correctly before it can expire an
/// action.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(60);

/// Values read per key, each remembered with the lifecycle action (token) it was read for
/// and when.
#[derive(Debug)]
pub struct RecentReads<K, V> {
    entries: Mutex<HashMap<K, Remembered<V>>>,
}

#[derive(Debug)]
struct Remembered<V> {
    value: V,
    action_token: String,
    read_at: Instant,
}

impl<K, V> Default for RecentReads<K, V> {
    fn default() -> Self {
        Self {
            entries: Mutex::default(),
        }
    }
}

impl<K: Eq + Hash, V: Clone> RecentReads<K, V> {
    /// The value read for `key` during the action `action_token` less than [`MAX_AGE`] ago.
    pub fn get(&self, key: &K, action_token: &str) -> Option<V> {
        self.lock()
            .get(key)
            .filter(|r| r.action_token == action_token && r.read_at.elapsed() < MAX_AGE)
            .map(|r| r.value.clone())
    }

    /// Remembers `value`, read now for the action `action_token`.
    pub fn insert(&self, key: K, action_token: &str, value: V) {
        self.lock().insert(
            key,
            Remembered {
                value,
                action_token: action_token.to_owned(),
                read_at: Instant::now(),
            },
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Remembered<V>>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_serves_its_action_for_at_most_the_max_age() {
        let reads: RecentReads<&str, u32> = RecentReads::default();
        reads.insert("group", "token-1", 7);
        assert_eq!(reads.get(&"group", "token-1"), Some(7));
        assert_eq!(
            reads.get(&"group", "token-2"),
            None,
            "a new action reads again"
        );
        let aged = Instant::now()
            .checked_sub(MAX_AGE)
            .expect("the clock is past MAX_AGE");
        if let Some(entry) = reads.lock().get_mut(&"group") {
            entry.read_at = aged;
        }
        assert_eq!(reads.get(&"group", "token-1"), None, "too old");
    }
}
