//! What every Event our functions write about a Node shares: the reference it carries and
//! the size limit of its note. The drain, the launching hook's warm-pool return and node
//! repair each write their own reasons; these pieces are common to them.

use k8s_openapi::api::core::v1::ObjectReference;

/// An events.k8s.io `note` may hold at most 1 KiB.
pub(crate) const MAX_NOTE_BYTES: usize = 1024;

/// The reference Events about a Node carry.
pub(crate) fn node_reference(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_owned()),
        uid: uid.map(str::to_owned),
        ..ObjectReference::default()
    }
}

/// Cuts `note` to the 1 KiB events.k8s.io allows, on a character boundary.
pub(crate) fn truncate_note(note: String) -> String {
    if note.len() <= MAX_NOTE_BYTES {
        return note;
    }
    let suffix = " ...";
    let mut end = MAX_NOTE_BYTES - suffix.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_to_one_kib() {
        let long = "é".repeat(1000);
        let cut = truncate_note(long);
        assert!(cut.len() <= MAX_NOTE_BYTES);
        assert!(cut.ends_with(" ..."));
        assert_eq!(truncate_note("short".into()), "short");
    }
}
