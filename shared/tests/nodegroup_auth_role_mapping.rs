//! The pure `mapRoles` merge: every style the authenticator accepts, every decision.
#![allow(clippy::unwrap_used)]

use node_manager::nodegroup_auth::role_mapping::*;

const ROLE: &str = "arn:aws:iam::111111111111:role/node";
const LINUX: &[&str] = &["system:bootstrappers", "system:nodes"];
const WINDOWS: &[&str] = &[
    "system:bootstrappers",
    "system:nodes",
    "eks:kube-proxy-windows",
];

fn grant_and_render(
    source: Option<&str>,
    role: &str,
    groups: &[&str],
) -> (GrantDecision, Option<String>) {
    let map = MapRoles::parse(source).unwrap();
    let decision = map.grant(role, groups);
    let rendered = match &decision {
        GrantDecision::Change(change) => Some(map.render(change).unwrap()),
        _ => None,
    };
    (decision, rendered)
}

fn effective(text: &str, role: &str) -> RoleMapping {
    MapRoles::parse(Some(text))
        .unwrap()
        .effective(role)
        .map(|(_, m)| m.clone())
        .unwrap()
}

#[test]
fn absent_and_skippable_values_get_one_entry() {
    for source in [None, Some(""), Some("  \n"), Some("``"), Some("\"\"")] {
        let (decision, text) = grant_and_render(source, ROLE, LINUX);
        assert!(
            matches!(
                decision,
                GrantDecision::Change(MappingChange::Append { .. })
            ),
            "{source:?}"
        );
        let text = text.unwrap();
        let parsed = MapRoles::parse(Some(&text)).unwrap();
        assert_eq!(parsed.mappings().len(), 1, "{source:?}: {text}");
        let m = &parsed.mappings()[0];
        assert_eq!(m.role_arn, ROLE);
        assert_eq!(m.username, NODE_USERNAME);
        assert_eq!(m.groups, LINUX);
    }
}

#[test]
fn appending_keeps_every_byte_of_the_existing_text() {
    let source = "# managed by platform team\n- rolearn: arn:aws:iam::111111111111:role/admin   # admins\n  username: admin\n  groups: [\"system:masters\"]\n- groups:\n  - dev\n  username: dev\n  rolearn: 'arn:aws:iam::111111111111:role/dev'";
    let (_, text) = grant_and_render(Some(source), ROLE, LINUX);
    let text = text.unwrap();
    assert!(text.starts_with(source), "{text}");
    let parsed = MapRoles::parse(Some(&text)).unwrap();
    let arns: Vec<_> = parsed
        .mappings()
        .iter()
        .map(|m| m.role_arn.as_str())
        .collect();
    assert_eq!(
        arns,
        [
            "arn:aws:iam::111111111111:role/admin",
            "arn:aws:iam::111111111111:role/dev",
            ROLE
        ]
    );
}

#[test]
fn appending_follows_an_indented_list() {
    let source = "  - rolearn: arn:aws:iam::111111111111:role/other\n    username: other\n    groups:\n      - team\n";
    let (_, text) = grant_and_render(Some(source), ROLE, LINUX);
    let text = text.unwrap();
    assert!(text.starts_with(source));
    assert!(
        text.contains("\n  - rolearn: arn:aws:iam::111111111111:role/node\n"),
        "{text}"
    );
    assert_eq!(MapRoles::parse(Some(&text)).unwrap().mappings().len(), 2);
}

#[test]
fn equivalent_entries_in_any_style_are_already_granted() {
    let styles = [
        // key order and quoting
        "- groups:\n  - 'system:nodes'\n  - \"system:bootstrappers\"\n  username: \"system:node:{{EC2PrivateDNSName}}\"\n  rolearn: arn:aws:iam::111111111111:role/node\n",
        // JSON flow style
        r#"[{"rolearn":"arn:aws:iam::111111111111:role/node","username":"system:node:{{EC2PrivateDNSName}}","groups":["system:bootstrappers","system:nodes"]}]"#,
        // case variants of the keys and of the ARN
        "- RoleARN: ARN:AWS:IAM::111111111111:ROLE/NODE\n  UserName: system:node:{{EC2PrivateDNSName}}\n  Groups: [system:bootstrappers, system:nodes]\n",
        // extra, non-privileged user groups
        "- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups:\n  - system:bootstrappers\n  - system:nodes\n  - team-observability\n",
        // Windows-shared entry already has the Windows group
        "- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes, eks:kube-proxy-windows]\n",
    ];
    for source in styles {
        let (decision, _) = grant_and_render(Some(source), ROLE, LINUX);
        assert_eq!(decision, GrantDecision::AlreadyGranted, "{source}");
    }
}

#[test]
fn shared_linux_role_gains_the_windows_group_in_place() {
    let source = "- rolearn: arn:aws:iam::111111111111:role/first\n  username: first\n  groups: [a]\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups:\n  - system:bootstrappers\n  - system:nodes\n  extra: kept\n- rolearn: arn:aws:iam::111111111111:role/last\n  username: last\n  groups: [b]\n";
    let (decision, text) = grant_and_render(Some(source), ROLE, WINDOWS);
    assert_eq!(
        decision,
        GrantDecision::Change(MappingChange::AddGroups {
            index: 1,
            groups: vec!["eks:kube-proxy-windows".into()]
        })
    );
    let text = text.unwrap();
    let parsed = MapRoles::parse(Some(&text)).unwrap();
    let arns: Vec<_> = parsed
        .mappings()
        .iter()
        .map(|m| m.role_arn.as_str())
        .collect();
    assert_eq!(arns.len(), 3, "no second entry: {text}");
    assert_eq!(arns[1], ROLE);
    assert_eq!(parsed.mappings()[1].groups, WINDOWS);
    assert_eq!(parsed.mappings()[1].other["extra"], "kept");
}

#[test]
fn foreign_username_or_privileged_groups_are_conflicts() {
    let foreign = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: admin\n  groups: [system:nodes]\n";
    let GrantDecision::Conflict(conflict) =
        MapRoles::parse(Some(foreign)).unwrap().grant(ROLE, LINUX)
    else {
        panic!("expected a conflict");
    };
    assert_eq!(conflict.reason, ConflictReason::ForeignUsername);
    assert!(conflict.to_string().contains("admin"));

    let privileged = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes, system:masters]\n";
    let GrantDecision::Conflict(conflict) = MapRoles::parse(Some(privileged))
        .unwrap()
        .grant(ROLE, LINUX)
    else {
        panic!("expected a conflict");
    };
    assert_eq!(
        conflict.reason,
        ConflictReason::PrivilegedGroups(vec!["system:masters".into()])
    );
}

#[test]
fn last_duplicate_wins_like_the_authenticator() {
    // The first entry is the node mapping, but the last one (foreign) is what counts.
    let source = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n- rolearn: arn:aws:iam::111111111111:role/NODE\n  username: someone\n  groups: []\n";
    assert!(matches!(
        MapRoles::parse(Some(source)).unwrap().grant(ROLE, LINUX),
        GrantDecision::Conflict(MappingConflict { index: 1, .. })
    ));
    // And the other way round: the last is the node mapping, nothing to do.
    let source = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: someone\n  groups: []\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n";
    assert_eq!(
        MapRoles::parse(Some(source)).unwrap().grant(ROLE, LINUX),
        GrantDecision::AlreadyGranted
    );
    // Field spelled twice: the last spelling wins.
    let source = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: admin\n  UserName: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n";
    assert_eq!(effective(source, ROLE).username, NODE_USERNAME);
}

#[test]
fn a_role_path_entry_does_not_count_as_the_mapping() {
    // The authenticator never matches an ARN with a path: such an entry grants nothing.
    let source = "- rolearn: arn:aws:iam::111111111111:role/teams/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n";
    let (decision, text) = grant_and_render(Some(source), ROLE, LINUX);
    assert!(matches!(
        decision,
        GrantDecision::Change(MappingChange::Append { .. })
    ));
    assert_eq!(
        MapRoles::parse(Some(&text.unwrap()))
            .unwrap()
            .mappings()
            .len(),
        2
    );
}

#[test]
fn malformed_or_mistyped_values_are_errors_naming_the_problem() {
    let cases = [
        "- rolearn: arn:aws:iam::111111111111:role/a\n  username: a\n groups: [team-a]\n",
        "- rolearn: [unclosed\n",
        "rolearn: not-a-list\n",
        "- rolearn: arn\n  username: 42\n",
        "- rolearn: arn\n  groups: system:nodes\n",
        "- just a string\n",
    ];
    for source in cases {
        let err = MapRoles::parse(Some(source)).unwrap_err();
        assert!(
            err.to_string().contains("nothing was written"),
            "{source}: {err}"
        );
    }
    let err = MapRoles::parse(Some("- rolearn: arn\n  username: 42\n")).unwrap_err();
    assert!(
        matches!(err, MapRolesError::InvalidItem { index: 0, .. }),
        "{err}"
    );
}

#[test]
fn flow_style_is_re_rendered_with_every_field_kept() {
    let source = r#"[{"rolearn":"arn:aws:iam::111111111111:role/sso","username":"sso:{{SessionName}}","groups":["viewers"],"sso":{"permissionSetName":"View","accountID":"111111111111"}},{"userid":"AROA123","username":"x","groups":[]}]"#;
    let (_, text) = grant_and_render(Some(source), ROLE, LINUX);
    let text = text.unwrap();
    let before = MapRoles::parse(Some(source)).unwrap();
    let after = MapRoles::parse(Some(&text)).unwrap();
    assert_eq!(&after.mappings()[..2], before.mappings(), "{text}");
    assert_eq!(after.mappings()[2].role_arn, ROLE);
}

#[test]
fn revoke_removes_only_node_shaped_entries_of_the_role() {
    let source = "- rolearn: arn:aws:iam::111111111111:role/a\n  username: a\n  groups: [team-a]\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n- rolearn: arn:aws:iam::111111111111:role/b\n  username: b\n  groups: [team-b]\n";
    let map = MapRoles::parse(Some(source)).unwrap();
    let RevokeDecision::Change(change) = map.revoke(ROLE) else {
        panic!("expected a removal");
    };
    let text = map.render(&change).unwrap();
    let after = MapRoles::parse(Some(&text)).unwrap();
    let arns: Vec<_> = after
        .mappings()
        .iter()
        .map(|m| m.role_arn.as_str())
        .collect();
    assert_eq!(
        arns,
        [
            "arn:aws:iam::111111111111:role/a",
            "arn:aws:iam::111111111111:role/b"
        ]
    );
    assert_eq!(
        map.revoke("arn:aws:iam::111111111111:role/absent"),
        RevokeDecision::NotPresent
    );

    // A privileged duplicate earlier in the list would be promoted: leave both.
    let source = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: admin\n  groups: [system:masters]\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n";
    assert!(matches!(
        MapRoles::parse(Some(source)).unwrap().revoke(ROLE),
        RevokeDecision::Conflict(MappingConflict { index: 0, .. })
    ));
    // Extra user groups: not of the node shape, kept.
    let source = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes, team]\n";
    assert!(matches!(
        MapRoles::parse(Some(source)).unwrap().revoke(ROLE),
        RevokeDecision::Conflict(MappingConflict {
            reason: ConflictReason::NotNodeShaped,
            ..
        })
    ));
}

#[test]
fn removing_the_last_entry_leaves_an_empty_value() {
    let source = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n";
    let map = MapRoles::parse(Some(source)).unwrap();
    let RevokeDecision::Change(change) = map.revoke(ROLE) else {
        panic!("expected a removal");
    };
    let text = map.render(&change).unwrap();
    assert!(MapRoles::parse(Some(&text)).unwrap().mappings().is_empty());
}

#[test]
fn os_from_ami_type() {
    assert_eq!(
        NodeOs::from_ami_type("WINDOWS_CORE_2022_x86_64"),
        NodeOs::Windows
    );
    assert_eq!(NodeOs::from_ami_type("AL2_x86_64"), NodeOs::Linux);
    assert_eq!(NodeOs::from_ami_type("CUSTOM"), NodeOs::Linux);
    assert_eq!(NodeOs::Windows.required_groups(), WINDOWS);
    assert!(
        NodeOs::Windows
            .required_groups()
            .iter()
            .all(|g| ALLOWED_NODE_GROUPS.contains(g))
    );
}

#[test]
fn existing_duplicates_are_kept_and_ours_are_removed_together() {
    let source = "- rolearn: arn:aws:iam::111111111111:role/a\n  username: a\n  groups: [team-a]\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes]\n- rolearn: arn:aws:iam::111111111111:role/a\n  username: a2\n  groups: [team-b]\n- rolearn: ARN:AWS:IAM::111111111111:ROLE/NODE\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:nodes]\n";
    let map = MapRoles::parse(Some(source)).unwrap();
    // Granting a third role keeps both duplicates of `a`, in order.
    let GrantDecision::Change(change) = map.grant("arn:aws:iam::111111111111:role/third", LINUX)
    else {
        panic!("expected a change");
    };
    let text = map.render(&change).unwrap();
    assert!(text.starts_with(source));
    let after = MapRoles::parse(Some(&text)).unwrap();
    assert_eq!(&after.mappings()[..4], map.mappings());
    // Our role's effective (last) entry lacks bootstrappers: it is completed in place.
    assert_eq!(
        map.grant(ROLE, LINUX),
        GrantDecision::Change(MappingChange::AddGroups {
            index: 3,
            groups: vec!["system:bootstrappers".into()]
        })
    );
    // Revoking removes both node-shaped entries of the role and nothing else.
    let RevokeDecision::Change(change) = map.revoke(ROLE) else {
        panic!("expected a removal");
    };
    assert_eq!(
        change,
        MappingChange::Remove {
            indices: vec![1, 3]
        }
    );
    let after = MapRoles::parse(Some(&map.render(&change).unwrap())).unwrap();
    let users: Vec<_> = after
        .mappings()
        .iter()
        .map(|m| m.username.as_str())
        .collect();
    assert_eq!(users, ["a", "a2"]);
}

#[test]
fn removal_keeps_the_other_entries_text_and_comments() {
    let source = "# platform roles\n- rolearn: arn:aws:iam::111111111111:role/a   # team a\n  username: a\n  groups: [team-a]\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups:\n    - system:bootstrappers\n    - system:nodes\n- rolearn: \"arn:aws:iam::111111111111:role/b\"\n  groups: [team-b]\n  username: b\n";
    let map = MapRoles::parse(Some(source)).unwrap();
    let RevokeDecision::Change(change) = map.revoke(ROLE) else {
        panic!("expected a removal");
    };
    assert_eq!(
        map.render(&change).unwrap(),
        "# platform roles\n- rolearn: arn:aws:iam::111111111111:role/a   # team a\n  username: a\n  groups: [team-a]\n- rolearn: \"arn:aws:iam::111111111111:role/b\"\n  groups: [team-b]\n  username: b\n"
    );
}

#[test]
fn adding_the_windows_group_keeps_extra_user_groups() {
    let source = "- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:bootstrappers, system:nodes, team-observability]\n";
    let (_, text) = grant_and_render(Some(source), ROLE, WINDOWS);
    let m = effective(&text.unwrap(), ROLE);
    assert_eq!(
        m.groups,
        [
            "system:bootstrappers",
            "system:nodes",
            "team-observability",
            "eks:kube-proxy-windows"
        ]
    );
}

/// What the authenticator reads, worked out along its code path: go-yaml (first document,
/// duplicate key → last value) → Go map → JSON with byte-wise sorted keys → `encoding/json`
/// into `RoleMapping` (case-insensitive field match, each key assigned in order, so the
/// spelling that sorts last wins). Each row: the `mapRoles` text, the role looked up, and
/// the (rolearn, username, groups) the authenticator ends up with for it.
#[test]
fn field_spellings_duplicates_and_documents_resolve_as_the_authenticator_does() {
    const NODE: &str = "system:node:{{EC2PrivateDNSName}}";
    let table: &[(&str, &str, &str, &str, &[&str])] = &[
        (
            "node username spelled last in the document but sorting first loses",
            "- rolearn: arn:aws:iam::111111111111:role/r\n  username: admin\n  UserName: system:node:{{EC2PrivateDNSName}}\n  groups: [system:nodes]\n",
            "arn:aws:iam::111111111111:role/r",
            "admin",
            &["system:nodes"],
        ),
        (
            "lower-case spelling sorts after the capitalised one and wins wherever it stands",
            "- rolearn: arn:aws:iam::111111111111:role/r\n  username: system:node:{{EC2PrivateDNSName}}\n  UserName: admin\n  groups: [system:nodes]\n",
            "arn:aws:iam::111111111111:role/r",
            NODE,
            &["system:nodes"],
        ),
        (
            "privileged groups under the spelling that sorts last are what counts",
            "- rolearn: arn:aws:iam::111111111111:role/r\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:masters]\n  Groups: [system:nodes]\n",
            "arn:aws:iam::111111111111:role/r",
            NODE,
            &["system:masters"],
        ),
        (
            "an exact duplicate key keeps its last value",
            "- rolearn: arn:aws:iam::111111111111:role/r\n  username: admin\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:nodes]\n",
            "arn:aws:iam::111111111111:role/r",
            NODE,
            &["system:nodes"],
        ),
        (
            "the long s folds to s in Go, so it is the username field",
            "- rolearn: arn:aws:iam::111111111111:role/r\n  u\u{17f}ername: admin\n  groups: [system:nodes]\n",
            "arn:aws:iam::111111111111:role/r",
            "admin",
            &["system:nodes"],
        ),
        (
            "only the first YAML document is read",
            "- rolearn: arn:aws:iam::111111111111:role/r\n  username: system:node:{{EC2PrivateDNSName}}\n  groups: [system:nodes]\n---\n- rolearn: arn:aws:iam::111111111111:role/r\n  username: admin\n  groups: [system:masters]\n",
            "arn:aws:iam::111111111111:role/r",
            NODE,
            &["system:nodes"],
        ),
    ];
    for (what, text, role, username, groups) in table {
        let mapping = effective(text, role);
        assert_eq!(mapping.username, *username, "{what}");
        assert_eq!(mapping.groups, *groups, "{what}");
    }
}

#[test]
fn a_role_is_never_read_as_another_role_than_the_authenticator_sees() {
    // `RoleArn` sorts before `rolearn`: the authenticator files this item under role b.
    let text = "- rolearn: arn:aws:iam::111111111111:role/b\n  RoleArn: arn:aws:iam::111111111111:role/a\n  username: admin\n  groups: [system:masters]\n";
    let map = MapRoles::parse(Some(text)).unwrap();
    assert!(map.effective("arn:aws:iam::111111111111:role/a").is_none());
    assert_eq!(
        map.effective("arn:aws:iam::111111111111:role/b")
            .unwrap()
            .1
            .groups,
        ["system:masters"]
    );
    // Granting role a therefore appends a node entry; role b is a conflict.
    assert!(matches!(
        map.grant("arn:aws:iam::111111111111:role/a", LINUX),
        GrantDecision::Change(MappingChange::Append { .. })
    ));
    assert!(matches!(
        map.grant("arn:aws:iam::111111111111:role/b", LINUX),
        GrantDecision::Conflict(_)
    ));
}

#[test]
fn values_the_authenticator_reads_do_not_block_writes() {
    for text in [
        "- rolearn: arn:aws:iam::111111111111:role/other\n  username: other\n  username: other2\n  groups: [team]\n",
        "- rolearn: arn:aws:iam::111111111111:role/other\n  username: other\n  groups: [team]\n---\nnot: a list\n",
    ] {
        let (decision, rendered) = grant_and_render(Some(text), ROLE, LINUX);
        assert!(
            matches!(
                decision,
                GrantDecision::Change(MappingChange::Append { .. })
            ),
            "{text}"
        );
        let rendered = rendered.unwrap();
        let after = MapRoles::parse(Some(&rendered)).unwrap();
        assert_eq!(after.effective(ROLE).unwrap().1.groups, LINUX, "{rendered}");
        assert_eq!(
            after
                .effective("arn:aws:iam::111111111111:role/other")
                .unwrap()
                .1
                .username,
            if text.contains("other2") {
                "other2"
            } else {
                "other"
            },
            "{rendered}"
        );
    }
}
