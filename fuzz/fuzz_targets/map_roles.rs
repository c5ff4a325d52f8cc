//! The `mapRoles` parser and merger (`node_manager::nodegroup_auth::role_mapping::MapRoles`)
//! on arbitrary text: parse never panics; when it parses, granting a node role and rendering
//! gives text that parses again and maps that role exactly once with the node groups, keeps
//! every other mapping, and revoking it again removes it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_manager::nodegroup_auth::role_mapping::{GrantDecision, MapRoles, RevokeDecision};

const ROLE: &str = "arn:aws:iam::111111111111:role/fuzz-node-role";
const GROUPS: &[&str] = &["system:bootstrappers", "system:nodes"];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(map) = MapRoles::parse(Some(text)) else {
        return;
    };
    let others = map
        .mappings()
        .iter()
        .filter(|m| !m.role_arn.eq_ignore_ascii_case(ROLE))
        .count();
    let GrantDecision::Change(change) = map.grant(ROLE, GROUPS) else {
        return;
    };
    let Ok(rendered) = map.render(&change) else {
        return;
    };
    let granted = MapRoles::parse(Some(&rendered))
        .unwrap_or_else(|e| panic!("rendered mapRoles does not parse: {e}\n{rendered}"));
    let mine: Vec<_> = granted
        .mappings()
        .iter()
        .filter(|m| m.role_arn.eq_ignore_ascii_case(ROLE))
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "role mapped {} times:\n{rendered}",
        mine.len()
    );
    for group in GROUPS {
        assert!(
            mine[0].groups.iter().any(|g| g == group),
            "{group} missing:\n{rendered}"
        );
    }
    let kept = granted
        .mappings()
        .iter()
        .filter(|m| !m.role_arn.eq_ignore_ascii_case(ROLE))
        .count();
    assert_eq!(
        kept, others,
        "other mappings changed:\n{text}\n---\n{rendered}"
    );
    if let RevokeDecision::Change(change) = granted.revoke(ROLE) {
        if let Ok(revoked) = granted.render(&change) {
            let revoked = MapRoles::parse(Some(&revoked)).expect("revoked mapRoles parses");
            assert!(
                !revoked
                    .mappings()
                    .iter()
                    .any(|m| m.role_arn.eq_ignore_ascii_case(ROLE)),
                "revoke left the role"
            );
        }
    }
});
