//! One writer ends a record of ours (issue #43): the writes that undo a record and its marks
//! (a drain record, an instance refresh's record, a maintenance plan, the out-of-service
//! taint) are called from `shared/src/reconcile/converge.rs` alone; a feature that sees a
//! record's end at once (the launching hook, a refresh's end event, a maintenance drain that
//! ran) goes through that module's functions. Read from the sources, tests left out, so a
//! second writer cannot slip in unnoticed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// The functions of `shared/src/node_marks/` that write (or compose) the end of a record.
const UNDO_WRITERS: &[&str] = &[
    "undo_record_patch",
    "unmark_node",
    "clear_maintenance",
    "replan_maintenance",
    "lift_shutdown_taint",
];

/// The one module allowed to call them (their own module defines them).
const CONVERGE: &str = "shared/src/reconcile/converge.rs";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit sits in the repository root")
        .to_path_buf()
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.to_string_lossy().ends_with("_tests.rs")
        {
            found.push(path);
        }
    }
}

/// The calls of an undo writer in `text` outside its test module, as `line: text`.
fn undo_calls(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| {
            UNDO_WRITERS.iter().any(|name| {
                line.contains(&format!("{name}(")) && !line.contains(&format!("fn {name}("))
            })
        })
        .map(|(number, line)| format!("{}: {}", number + 1, line.trim()))
        .collect()
}

#[test]
fn only_converge_ends_a_record() {
    let root = repo_root();
    let mut files = Vec::new();
    sources(&root.join("shared/src"), &mut files);
    sources(&root.join("functions"), &mut files);
    let mut elsewhere = Vec::new();
    let mut in_converge = 0;
    for file in files {
        let relative = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let calls = undo_calls(&std::fs::read_to_string(&file).unwrap());
        if relative == CONVERGE {
            in_converge += calls.len();
        } else {
            elsewhere.extend(calls.into_iter().map(|c| format!("{relative}:{c}")));
        }
    }
    assert!(
        elsewhere.is_empty(),
        "a record's end written outside {CONVERGE}: {elsewhere:#?}"
    );
    // The scan itself must see the writer's calls, or it proves nothing.
    assert!(
        in_converge >= UNDO_WRITERS.len(),
        "{in_converge} calls seen in {CONVERGE}"
    );
}

#[test]
fn the_scan_finds_a_call_and_skips_definitions_comments_and_tests() {
    let text = "fn unmark_node(a: u8) {}\n// unmark_node(x)\nlet x = unmark_node(nodes, node, id);\n#[cfg(test)]\nmod tests { clear_maintenance(c, n, r); }\n";
    assert_eq!(
        undo_calls(text),
        ["3: let x = unmark_node(nodes, node, id);"]
    );
}
