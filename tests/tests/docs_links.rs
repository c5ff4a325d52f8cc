//! Every relative link of every Markdown file of the repository points at something that
//! exists: the file or folder, and, for a link into a Markdown file, the heading its anchor
//! names (GitHub's anchor rules). Links to web addresses are not checked (no network here).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit sits in the repository root")
        .to_path_buf()
}

/// Folders that hold build output or generated data, not documentation.
fn skipped(name: &str) -> bool {
    name.starts_with('.') || matches!(name, "target" | "corpus" | "artifacts" | "coverage")
}

fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable folder").flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !skipped(&name) {
                    pending.push(path);
                }
            } else if name.ends_with(".md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The lines of `text` outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            lines.push(line);
        }
    }
    lines
}

/// The targets of the inline links `[text](target)` of one line.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        targets.push(after[..end].trim().to_owned());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for line in prose_lines(text) {
        let trimmed = line.trim_start_matches('#');
        if trimmed.len() < line.len() && trimmed.starts_with(' ') {
            let base = anchor_of(trimmed);
            let mut anchor = base.clone();
            let mut n = 0;
            while !anchors.insert(anchor.clone()) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
        }
    }
    anchors
}

/// What is wrong with one link of `file`, if anything.
fn dead(file: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().unwrap().join(path)
    };
    if !resolved.exists() {
        return Some(format!("{target}: no such file or folder"));
    }
    let anchor = anchor?;
    if resolved.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let text = std::fs::read_to_string(&resolved).ok()?;
    (!anchors(&text).contains(anchor)).then(|| format!("{target}: no heading #{anchor}"))
}

#[test]
fn every_relative_link_of_the_markdown_files_resolves() {
    let root = repo_root();
    let files = markdown_files(&root);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "the README is found"
    );
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable Markdown");
        for line in prose_lines(&text) {
            for target in link_targets(line) {
                if let Some(problem) = dead(file, &target) {
                    let relative = file.strip_prefix(&root).unwrap().display().to_string();
                    broken.push(format!("{relative}: {problem}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "dead links: {broken:#?}");
}

#[test]
fn the_checker_sees_a_dead_link_and_github_anchors() {
    let readme = repo_root().join("README.md");
    assert!(dead(&readme, "docs/no-such-page.md").is_some());
    assert!(dead(&readme, "ARCHITECTURE.md#no-such-heading").is_some());
    assert!(dead(&readme, "ARCHITECTURE.md#the-path-of-an-event").is_none());
    assert!(dead(&readme, "https://example.com/x").is_none());
    assert_eq!(
        anchor_of("3. Attach the hooks to each self-managed node group's Auto Scaling group"),
        "3-attach-the-hooks-to-each-self-managed-node-groups-auto-scaling-group"
    );
    assert_eq!(
        anchor_of("`eks-token`: kubectl credentials"),
        "eks-token-kubectl-credentials"
    );
    assert_eq!(
        link_targets("see [a](x.md) and [b](y.md#z)."),
        ["x.md", "y.md#z"]
    );
}
