//! The sandbox's shipped scenarios, run as a user runs them: the `sandbox` binary, which
//! starts the fakes and the built function binaries, must exit 0; and a scenario whose
//! expectation cannot hold must make it exit non-zero.

use std::path::Path;
use std::process::Command;

fn run_sandbox(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .args(args)
        .output()
        .expect("the sandbox binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

fn scenario(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn default_scenario_passes() {
    let (code, output) = run_sandbox(&[]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("0 failed"), "{output}");
    assert!(
        output.contains("pods/eviction"),
        "the timeline shows the evictions: {output}"
    );
}

#[test]
fn pdb_blocked_scenario_passes() {
    let (code, output) = run_sandbox(&["--scenario", &scenario("pdb-blocked.yaml")]);
    assert_eq!(code, 0, "{output}");
}

#[test]
fn node_repair_scenario_passes() {
    let (code, output) = run_sandbox(&["--scenario", &scenario("node-repair.yaml")]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("node-repair replaced"), "{output}");
}

#[test]
fn warm_pool_scenario_passes() {
    let (code, output) = run_sandbox(&["--scenario", &scenario("warm-pool.yaml")]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("0 failed"), "{output}");
    assert!(
        output.contains("re-registers"),
        "the node came back under its old name: {output}"
    );
}

#[test]
fn access_entries_scenario_passes() {
    let (code, output) = run_sandbox(&["--scenario", &scenario("access-entries.yaml")]);
    assert_eq!(code, 0, "{output}");
}

#[test]
fn instance_refresh_scenario_passes() {
    let (code, output) = run_sandbox(&["--scenario", &scenario("instance-refresh.yaml")]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("0 failed"), "{output}");
    assert!(
        output.contains("instance-refresh ← EventBridge EC2 Auto Scaling Instance Refresh Started"),
        "the start reached the function: {output}"
    );
}

#[test]
fn a_refresh_whose_drain_fails_keeps_that_node_and_restores_the_rest() {
    let (code, output) = run_sandbox(&["--scenario", &scenario("instance-refresh-failed.yaml")]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("0 failed"), "{output}");
    assert!(output.contains("PodEvictionFailure"), "{output}");
}

/// The same node update without the refresh events reaching `instance-refresh`: the
/// services sharing an image only the outdated nodes hold land on the next outdated node and
/// move twice (the scheduler weighs ImageLocality as kube-scheduler does), and the scenario's
/// check says so.
#[test]
fn the_same_refresh_without_instance_refresh_moves_pods_twice() {
    let dir = std::env::temp_dir().join(format!("sandbox-refresh-off-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("refresh-off.yaml");
    let text = std::fs::read_to_string(scenario("instance-refresh.yaml"))
        .expect("scenario")
        .replacen("\nnodegroups:", "\nrefreshEvents: false\nnodegroups:", 1);
    std::fs::write(&path, text).expect("write scenario");
    let (code, output) = run_sandbox(&["--scenario", &path.display().to_string()]);
    assert_eq!(code, 1, "{output}");
    assert!(
        output.contains("✗ no pod was scheduled onto an outdated node"),
        "{output}"
    );
}

#[test]
fn spot_interruption_scenario_passes() {
    let (code, output) = run_sandbox(&["--scenario", &scenario("spot-interruption.yaml")]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("0 failed"), "{output}");
    assert!(
        output.contains("terminating-hook ← EventBridge EC2 Spot Instance Interruption Warning"),
        "the warning reached the function: {output}"
    );
    assert!(
        output.contains("terminating-hook ← SNS TERMINATING"),
        "so did the lifecycle notification: {output}"
    );
}

/// The same interruption on a stack whose rules do not deliver instance notices: only the
/// lifecycle notification drains the node, with the drain timeout as its deadline, far past
/// the moment EC2 takes the instance; the scenario's checks say so.
#[test]
fn the_same_interruption_without_instance_notices_drains_past_the_instance_end() {
    let dir = std::env::temp_dir().join(format!("sandbox-notices-off-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("notices-off.yaml");
    let text = std::fs::read_to_string(scenario("spot-interruption.yaml"))
        .expect("scenario")
        .replace("timings:", "instanceNoticeEvents: false\ntimings:");
    std::fs::write(&path, text).expect("write scenario");
    let (code, output) = run_sandbox(&["--scenario", &path.display().to_string()]);
    assert_eq!(code, 1, "{output}");
    assert!(
        output
            .contains("✗ the node's drain answers the Spot notice and works to the instance's end"),
        "{output}"
    );
    assert!(
        output.contains("✗ terminating-hook confirmed the Spot warning"),
        "{output}"
    );
}

#[test]
fn an_expectation_that_cannot_hold_fails_the_run() {
    let dir = std::env::temp_dir().join(format!("sandbox-negative-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("wrong.yaml");
    // The drain completes CONTINUE; expecting ABANDON must fail the run.
    let text = std::fs::read_to_string(scenario("pdb-blocked.yaml"))
        .expect("scenario")
        .replace(
            "expectDrained: false",
            "expectDrained: false, expectResult: ABANDON",
        );
    std::fs::write(&path, text).expect("write scenario");
    let (code, output) = run_sandbox(&["--scenario", &path.display().to_string()]);
    assert_eq!(code, 1, "{output}");
    assert!(
        output.contains("✗ terminate hook completed ABANDON"),
        "{output}"
    );
}

#[test]
fn a_malformed_scenario_is_refused_before_anything_starts() {
    let dir = std::env::temp_dir().join(format!("sandbox-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "name: bad\nnodegroups: []\nsteps:\n  - scaleIn: { nodegroup: ghost, node: 0 }\n",
    )
    .expect("write scenario");
    let (code, output) = run_sandbox(&["--scenario", &path.display().to_string()]);
    assert_eq!(code, 2, "{output}");
    assert!(output.contains("ghost"), "{output}");
}
