//! Every setting is documented once, in the table of `docs/settings.md`, and that table
//! matches what the code reads and what `infra/template.yaml` passes.
//!
//! "What the code reads" is found in the sources (`shared/src`, `functions/`, test modules
//! left out): the name given to a settings call (`required`, `value`, `list`, `flag`,
//! `parsed`, `seconds`, the settings modules' own `seconds`/`result`/`millis` helpers) or to
//! `std::env::var` / an SDK `.env(...)` lookup, as a string literal or a `const` of the same
//! file. So that a new way of reading cannot slip past, every upper-case literal in a
//! `*settings.rs` module must be recognised as read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Calls whose first name argument (after an optional `source,`) is an environment variable.
const READERS: &[&str] = &[
    "required(",
    "value(",
    "list(",
    "flag(",
    "parsed(",
    "seconds(",
    "result(",
    "millis(",
    "var(",
    "var_os(",
    "env(",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit sits in the repository root")
        .to_path_buf()
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_root().join(relative))
        .unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// The Rust files under `dir`, as (path relative to the repository, text before any
/// `#[cfg(test)]`).
fn production_sources(dir: &str) -> Vec<(String, String)> {
    let root = repo_root();
    let mut files = Vec::new();
    let mut pending = vec![root.join(dir)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source file");
                let production = text.split("#[cfg(test)]").next().unwrap_or("").to_owned();
                let relative = path.strip_prefix(&root).unwrap().display().to_string();
                files.push((relative, production));
            }
        }
    }
    files.sort();
    files
}

fn is_variable_name(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_uppercase())
        && text.contains('_')
        && text
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Every string literal of `text` that looks like an environment variable name.
fn upper_case_literals(text: &str) -> BTreeSet<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|literal| is_variable_name(literal))
        .map(str::to_owned)
        .collect()
}

/// `const NAME: &str = "VALUE";` of one file.
fn string_consts(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let rest = line
                .trim()
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ")
                .strip_prefix("const ")?;
            let (name, rest) = rest.split_once(": &str = \"")?;
            let (value, _) = rest.split_once('"')?;
            Some((name.trim().to_owned(), value.to_owned()))
        })
        .collect()
}

/// The environment variables one file reads.
fn variables_read_in(text: &str) -> BTreeSet<String> {
    let consts = string_consts(text);
    let mut names = BTreeSet::new();
    for reader in READERS {
        for (at, _) in text.match_indices(reader) {
            // `value(` must be a call of its own, not the tail of `some_value(`.
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && !matches!(*reader, "seconds(" | "result(")
            {
                continue;
            }
            let arguments = text[at + reader.len()..].trim_start();
            let arguments = arguments
                .strip_prefix("source,")
                .map(str::trim_start)
                .unwrap_or(arguments);
            let name = if let Some(literal) = arguments.strip_prefix('"') {
                literal.split('"').next().unwrap_or("").to_owned()
            } else {
                let ident: String = arguments
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                consts.get(&ident).cloned().unwrap_or_default()
            };
            if is_variable_name(&name) {
                names.insert(name);
            }
        }
    }
    names
}

/// Variable → the files that read it.
fn variables_read_by_code() -> BTreeMap<String, BTreeSet<String>> {
    let mut read: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for dir in ["shared/src", "functions"] {
        for (path, text) in production_sources(dir) {
            for name in variables_read_in(&text) {
                read.entry(name).or_default().insert(path.clone());
            }
        }
    }
    read
}

/// One row of the settings table.
#[derive(Debug)]
struct Row {
    /// `NAME`, or `None` for a stack parameter that reaches no function as a variable.
    variable: Option<String>,
    /// Every backticked name of the stack parameter column.
    parameters: BTreeSet<String>,
}

fn backticked(cell: &str) -> BTreeSet<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The rows of `docs/settings.md`'s table (the one whose header starts `| variable |`).
fn settings_table(markdown: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in markdown.lines() {
        let line = line.trim();
        if line.starts_with("| variable |") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert!(cells.len() >= 5, "a settings row has five columns: {line}");
        let names = backticked(cells[0]);
        assert!(
            names.len() <= 1,
            "one variable per row, so each has one home: {line}"
        );
        rows.push(Row {
            variable: names.into_iter().next(),
            parameters: backticked(cells[1]),
        });
    }
    rows
}

fn documented() -> Vec<Row> {
    let rows = settings_table(&read("docs/settings.md"));
    assert!(rows.len() > 10, "docs/settings.md has its table");
    rows
}

fn documented_variables(rows: &[Row]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for name in rows.iter().filter_map(|r| r.variable.clone()) {
        assert!(names.insert(name.clone()), "{name} has two rows");
    }
    names
}

#[test]
fn every_variable_the_code_reads_is_in_the_settings_table() {
    let documented = documented_variables(&documented());
    let missing: Vec<String> = variables_read_by_code()
        .into_iter()
        .filter(|(name, _)| !documented.contains(name))
        .map(|(name, files)| format!("{name} (read in {files:?})"))
        .collect();
    assert!(
        missing.is_empty(),
        "read by the code but not in docs/settings.md: {missing:?}"
    );
}

#[test]
fn the_settings_table_names_only_variables_the_code_reads() {
    let read = variables_read_by_code();
    let unread: Vec<String> = documented_variables(&documented())
        .into_iter()
        .filter(|name| !read.contains_key(name))
        .collect();
    assert!(
        unread.is_empty(),
        "in docs/settings.md but read by no code: {unread:?}"
    );
}

#[test]
fn every_upper_case_literal_of_a_settings_module_is_recognised_as_read() {
    let read = variables_read_by_code();
    let mut unrecognised = Vec::new();
    for dir in ["shared/src", "functions"] {
        for (path, text) in production_sources(dir) {
            if !path.ends_with("settings.rs") {
                continue;
            }
            for literal in upper_case_literals(&text) {
                if !read.contains_key(&literal) {
                    unrecognised.push(format!("{path}: {literal}"));
                }
            }
        }
    }
    assert!(
        unrecognised.is_empty(),
        "names in settings modules this test does not see being read (a new way of \
         reading? add it to READERS): {unrecognised:?}"
    );
}

#[test]
fn the_scanner_finds_literal_and_const_readers_and_ignores_other_text() {
    let text = r#"
        pub const CLUSTER_ENDPOINT: &str = "CLUSTER_ENDPOINT";
        let a = source.value(CLUSTER_ENDPOINT);
        let b = seconds(source, "DRAIN_TIMEOUT_SECONDS", d)?;
        let c = source.parsed(
            "EVICTION_CONCURRENCY", 16, "n")?;
        let d = std::env::var("AWS_LAMBDA_LOG_STREAM_NAME");
        let e = some_value("NOT_A_SETTING");
        let f = Error { name: "ALSO_NOT_READ" };
        pub(crate) const MODE: &str = "CLUSTER_AUTHENTICATION_MODE";
        let g = source.value(MODE);
    "#;
    let names: Vec<String> = variables_read_in(text).into_iter().collect();
    assert_eq!(
        names,
        [
            "AWS_LAMBDA_LOG_STREAM_NAME",
            "CLUSTER_AUTHENTICATION_MODE",
            "CLUSTER_ENDPOINT",
            "DRAIN_TIMEOUT_SECONDS",
            "EVICTION_CONCURRENCY"
        ]
    );
}

/// `infra/template.yaml`: its parameters, and every `VARIABLE: !Ref Target` of the functions'
/// environments.
fn template_settings() -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let text = read("infra/template.yaml");
    let mut parameters = BTreeSet::new();
    let mut in_parameters = false;
    for line in text.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            in_parameters = line == "Parameters:";
            continue;
        }
        if in_parameters
            && let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':'))
            && !name.starts_with(' ')
        {
            parameters.insert(name.to_owned());
        }
    }
    let environment = text
        .lines()
        .filter_map(|line| {
            let (name, target) = line.trim().split_once(": !Ref ")?;
            is_variable_name(name).then(|| (name.to_owned(), target.trim().to_owned()))
        })
        .collect();
    (parameters, environment)
}

#[test]
fn the_stack_parameter_column_matches_the_template() {
    let rows = documented();
    let (parameters, environment) = template_settings();
    assert!(parameters.contains("ClusterName") && !environment.is_empty());

    let named: BTreeSet<&String> = rows.iter().flat_map(|r| &r.parameters).collect();
    let undocumented: Vec<&String> = parameters.iter().filter(|p| !named.contains(p)).collect();
    assert!(
        undocumented.is_empty(),
        "template parameters missing from docs/settings.md: {undocumented:?}"
    );

    let mut wrong = Vec::new();
    for (variable, target) in &environment {
        match rows.iter().find(|r| r.variable.as_ref() == Some(variable)) {
            Some(row) if row.parameters.contains(target) => {}
            Some(row) => wrong.push(format!(
                "{variable}: template sets it from {target}, the table says {:?}",
                row.parameters
            )),
            None => wrong.push(format!("{variable}: set by the template, not in the table")),
        }
    }
    for row in &rows {
        let Some(variable) = &row.variable else {
            continue;
        };
        for parameter in row.parameters.iter().filter(|p| parameters.contains(*p)) {
            if !environment.contains(&(variable.clone(), parameter.clone())) {
                wrong.push(format!(
                    "{variable}: the table says stack parameter {parameter}, the template does not pass it"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
