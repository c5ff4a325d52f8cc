//! Where the workspace's built binaries (the Lambda functions, `eks-token`) are, for tests
//! that run them as processes.
//!
//! The target directory is found from the running test binary's own path
//! (`<target>/<profile>/deps/<test>-<hash>`), so `CARGO_TARGET_DIR` and the profile in use are
//! honoured without asking cargo. `NODE_MANAGER_BIN_DIR` overrides the directory (e.g. release
//! binaries for a benchmark). A missing binary is built once per process with
//! `cargo build --workspace --bins --tests`; cargo's own lock serialises concurrent test processes.
//!
//! A binary that exists is used as is: run `cargo build --workspace --bins --tests` before the tests
//! (or call [`build_workspace_binaries`]) when the functions changed since the last build.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Environment variable naming a directory that holds the binaries (no build is attempted).
pub const BIN_DIR_VARIABLE: &str = "NODE_MANAGER_BIN_DIR";

/// Why a binary could not be located or built.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    #[error(
        "cannot tell the cargo target directory from the test executable {0}: set NODE_MANAGER_BIN_DIR to the directory of the built binaries"
    )]
    UnknownTargetDir(PathBuf),
    #[error("could not run `cargo build`: {0}")]
    Cargo(#[source] std::io::Error),
    #[error("`cargo build` of the workspace's binaries failed ({0}); its errors are above")]
    BuildFailed(std::process::ExitStatus),
    #[error("{path} does not exist{hint}")]
    Missing { path: PathBuf, hint: &'static str },
}

/// The build-once guard: `Some(result)` once this process ran cargo.
static BUILD: Mutex<Option<Result<(), String>>> = Mutex::new(None);

/// The profile directory (`<target>/debug`) the running executable was built into.
pub fn profile_dir() -> Result<PathBuf, BinaryError> {
    let exe = std::env::current_exe().map_err(|_| BinaryError::UnknownTargetDir(PathBuf::new()))?;
    profile_dir_of(&exe).ok_or(BinaryError::UnknownTargetDir(exe))
}

/// `<target>/<profile>` from `<target>/<profile>/deps/<exe>` (tests) or
/// `<target>/<profile>/<exe>` (binaries, e.g. the sandbox).
fn profile_dir_of(exe: &Path) -> Option<PathBuf> {
    let parent = exe.parent()?;
    let dir = if parent.file_name()? == "deps" {
        parent.parent()?
    } else {
        parent
    };
    // A profile directory sits in a target directory that cargo tags.
    let target = dir.parent()?;
    target
        .join("CACHEDIR.TAG")
        .exists()
        .then(|| dir.to_path_buf())
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR").map(|target| {
                PathBuf::from(target).join(dir.file_name().unwrap_or_else(|| "debug".as_ref()))
            })
        })
}

/// The path of workspace binary `name` built in the current profile, building the workspace's
/// binaries once if it is missing.
pub fn try_function_binary(name: &str) -> Result<PathBuf, BinaryError> {
    let file = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    if let Some(dir) = std::env::var_os(BIN_DIR_VARIABLE) {
        let path = PathBuf::from(dir).join(file);
        return if path.exists() {
            Ok(path)
        } else {
            Err(BinaryError::Missing {
                path,
                hint: " (NODE_MANAGER_BIN_DIR is set, so nothing is built)",
            })
        };
    }
    let path = profile_dir()?.join(file);
    if path.exists() {
        return Ok(path);
    }
    build_workspace_binaries()?;
    if path.exists() {
        Ok(path)
    } else {
        Err(BinaryError::Missing {
            path,
            hint: " after `cargo build --workspace --bins --tests`: is it a binary of this workspace?",
        })
    }
}

/// Like [`try_function_binary`], for tests: panics with the reason.
pub fn function_binary(name: &str) -> PathBuf {
    match try_function_binary(name) {
        Ok(path) => path,
        Err(error) => panic!("cannot provide binary {name:?}: {error}"),
    }
}

/// Runs `cargo build --workspace --bins --tests` (with `--release` for a release profile) into the
/// target directory of the running executable, at most once per process.
pub fn build_workspace_binaries() -> Result<(), BinaryError> {
    let mut guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(result) = guard.as_ref() {
        return result.clone().map_err(|message| {
            BinaryError::Cargo(std::io::Error::other(format!(
                "an earlier build in this process failed: {message}"
            )))
        });
    }
    let profile = profile_dir()?;
    let result = run_cargo_build(&profile);
    *guard = Some(result.as_ref().map(|_| ()).map_err(ToString::to_string));
    result
}

fn run_cargo_build(profile: &Path) -> Result<(), BinaryError> {
    let mut command = cargo_build(profile);
    // `--tests` makes cargo resolve features exactly as `cargo nextest run --workspace` did
    // (dev-dependencies enable features of shared crates such as the AWS SDK's): without it
    // this build is a second feature set that recompiles the SDK crates for minutes, longer
    // than nextest lets the test that asked for a binary live, so the test was killed, its
    // build with it, and the next test started the same build again. With it, after the test
    // build, only the binaries are linked.
    command.args(["--workspace", "--bins", "--tests"]);
    finish(command)
}

/// `cargo build` in this workspace, into `profile`'s target directory and profile.
fn cargo_build(profile: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| Path::new("."));
    let mut command = Command::new(cargo);
    command.current_dir(workspace).arg("build");
    if profile.file_name().is_some_and(|name| name == "release") {
        command.arg("--release");
    }
    if let Some(target) = profile.parent() {
        command.env("CARGO_TARGET_DIR", target);
    }
    command
}

fn finish(mut command: Command) -> Result<(), BinaryError> {
    let status = command.status().map_err(BinaryError::Cargo)?;
    if status.success() {
        Ok(())
    } else {
        Err(BinaryError::BuildFailed(status))
    }
}

/// The binaries the sandbox starts: the Lambda functions and `eks-token` (the kubeconfig of
/// `--serve`).
pub const SANDBOX_BINARIES: &[&str] = &[
    "terminating-hook",
    "launching-hook",
    "nodegroup-auth",
    "node-repair",
    "instance-refresh",
    "eks-token",
];

/// Builds whichever of `binaries` is missing before the sandbox starts them, in the target
/// directory and profile of the running executable, saying first what it builds and how long
/// that takes, with cargo's own progress on the terminal. Only the sandbox's binaries are
/// built, but for the whole workspace (`--workspace --bin ...`): features are then resolved
/// exactly as for the sandbox itself (`cargo run -p node-manager-testkit`), so no dependency
/// is compiled a second time with other features, and a first run adds one small crate and one
/// link per binary instead of every binary of the workspace. Binaries that exist are used as they
/// are, as everywhere in the test kit. Nothing is built when `NODE_MANAGER_BIN_DIR` names the
/// binaries.
pub fn build_for_sandbox(binaries: &[&str]) -> Result<(), BinaryError> {
    if std::env::var_os(BIN_DIR_VARIABLE).is_some() {
        return Ok(());
    }
    let profile = profile_dir()?;
    let missing: Vec<&str> = binaries
        .iter()
        .copied()
        .filter(|name| {
            !profile
                .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
                .exists()
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "sandbox: first run: building the binaries it starts ({}). This compiles {} small \
         crate(s) and links them against the dependencies already built for the sandbox: \
         about a minute on a 2-core machine.",
        missing.join(", "),
        missing.len()
    );
    let mut command = cargo_build(&profile);
    command.arg("--workspace");
    for binary in binaries {
        command.args(["--bin", binary]);
    }
    finish(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_dir_is_above_deps() {
        let target = std::env::temp_dir().join(format!("binaries-test-{}", std::process::id()));
        std::fs::create_dir_all(target.join("debug/deps")).expect("mkdir");
        std::fs::write(target.join("CACHEDIR.TAG"), "").expect("tag");
        assert_eq!(
            profile_dir_of(&target.join("debug/deps/fake_aws-0123")),
            Some(target.join("debug"))
        );
        assert_eq!(
            profile_dir_of(&target.join("debug/fake-eks")),
            Some(target.join("debug"))
        );
        std::fs::remove_dir_all(&target).expect("cleanup");
    }

    #[test]
    fn the_running_test_knows_its_profile_dir() {
        let dir = profile_dir().expect("profile dir");
        assert!(dir.join("deps").is_dir(), "{}", dir.display());
    }
}
