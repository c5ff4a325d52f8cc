//! The built binary, started without its required settings (as a misconfigured deployment
//! would be), stops at once with an error that names what to set — no panic, no hang.

use std::process::Command;
use std::time::Duration;

#[test]
fn missing_cluster_name_fails_start_up_with_a_clear_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_terminating-hook"))
        .env_clear()
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
        .env("AWS_REGION", "eu-west-1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the function binary starts");
    let started = std::time::Instant::now();
    while child.try_wait().expect("process status").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the binary hung"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("CLUSTER_NAME"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
}
