//! Each built function binary, started without its required settings (as a misconfigured
//! deployment would be), stops at once with an error that names what to set — no panic, no
//! hang. One case per function binary, from one table.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use node_manager_testkit::binaries;

/// How long a binary may take to give up before the test calls it hung.
const HANG_AFTER: Duration = Duration::from_secs(20);

/// Starts `function` with only a Runtime API address and a region, and checks it stops with
/// an error naming the missing `CLUSTER_NAME`.
fn fails_start_up_naming_the_cluster_setting(function: &str) {
    let mut child = Command::new(binaries::function_binary(function))
        .env_clear()
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
        .env("AWS_REGION", "eu-west-1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the function binary starts");
    let started = Instant::now();
    while child.try_wait().expect("process status").is_none() {
        assert!(
            started.elapsed() < HANG_AFTER,
            "{function}: the binary hung"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{function}: {text}");
    assert!(text.contains("CLUSTER_NAME"), "{function}: {text}");
    assert!(!text.contains("panicked"), "{function}: {text}");
}

/// One `#[test]` per function binary, so a failure names the function.
macro_rules! missing_cluster_name_fails_start_up {
    ($($test:ident => $binary:literal,)+) => {
        $(
            #[test]
            fn $test() {
                fails_start_up_naming_the_cluster_setting($binary);
            }
        )+
    };
}

missing_cluster_name_fails_start_up! {
    terminating_hook_without_cluster_name_fails_start_up_with_a_clear_error => "terminating-hook",
    launching_hook_without_cluster_name_fails_start_up_with_a_clear_error => "launching-hook",
    nodegroup_auth_without_cluster_name_fails_start_up_with_a_clear_error => "nodegroup-auth",
    node_repair_without_cluster_name_fails_start_up_with_a_clear_error => "node-repair",
}
