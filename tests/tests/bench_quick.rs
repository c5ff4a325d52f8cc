//! The benchmark suite's quick mode, so it cannot rot: every part runs against the fakes and
//! the built binaries, and reports measured (non-zero) figures.

use std::process::Command;

#[test]
fn quick_benchmarks_run_and_report_every_part() {
    let output = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--quick")
        .output()
        .expect("the bench binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for section in [
        "## Token signing",
        "## Cold start",
        "## Drain at scale",
        "## PDB-constrained drain",
        "## PDB-paced drain",
        "## Mass scale-in",
        "## aws-auth under concurrency",
        "## Spot interruption",
        "## Instance notices: calls per event",
        "## The instance-refresh function's memory on a big cluster",
        "## Waiting for volumes",
        "## Waiting for load balancers",
        "## A refresh's total time",
    ] {
        assert!(stdout.contains(section), "missing {section}:\n{stdout}");
    }
    // Each function's cold-start row has a measured init time.
    for binary in [
        "echo-lambda",
        "terminating-hook",
        "launching-hook",
        "nodegroup-auth",
    ] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {binary} |")))
            .unwrap_or_else(|| panic!("no cold-start row for {binary}:\n{stdout}"));
        let init: f64 = row
            .split('|')
            .nth(2)
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or(0.0);
        assert!(init > 0.0, "{row}");
    }
    // The drain stays within its request budget (one eviction per pod + 20).
    let drain_row = stdout
        .lines()
        .find(|l| l.starts_with("| 30 |"))
        .unwrap_or_else(|| panic!("no drain row for 30 pods:\n{stdout}"));
    let requests: usize = drain_row
        .split('|')
        .nth(7)
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(usize::MAX);
    assert!(
        (30..=50).contains(&requests),
        "a drain of 30 pods made {requests} requests: {drain_row}"
    );
    // The mass scale-in broke no budget and completed every instance once, throttled or not.
    let mass_rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| unthrottled |") || l.starts_with("| throttled:"))
        .collect();
    assert_eq!(mass_rows.len(), 2, "{stdout}");
    for row in mass_rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells[11], "0", "PDB violations: {row}");
        assert_eq!(cells[12], "true", "one completion per instance: {row}");
        assert_eq!(cells[13], "true", "drained: {row}");
    }
    assert!(stdout.contains("every role present once: true"), "{stdout}");
    assert!(
        stdout.contains("a redelivered event made {\"get\": 1}"),
        "a no-op redelivery only reads: {stdout}"
    );
}
