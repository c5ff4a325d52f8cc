//! The terminating hook's parser of EC2 and AWS Health instance events
//! (`node_manager::instance_notice::event::parse`) on arbitrary JSON: never a panic, and
//! whatever it accepts names well-formed instance ids of a well-formed account.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_manager::instance_notice::event::{NoticeEvent, is_notice_event, parse};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(event) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let _ = is_notice_event(&event);
    if let Ok(NoticeEvent::Instance(parsed)) = parse(&event) {
        assert!(!parsed.instance_ids.is_empty(), "an event about no instance");
        assert!(
            parsed.account.len() == 12 && parsed.account.bytes().all(|b| b.is_ascii_digit()),
            "accepted account {:?}",
            parsed.account
        );
        for id in &parsed.instance_ids {
            let hex = id.strip_prefix("i-").unwrap_or_default();
            assert!(
                matches!(hex.len(), 8 | 17)
                    && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "accepted instance id {id:?}"
            );
        }
    }
});
