#!/usr/bin/env bash
# Every test of the workspace, on a fresh clone of a fresh machine as on a warm one: the README's
# test command, and the one `.ci/run` runs.
#
#   scripts/test.sh                         # every test
#   scripts/test.sh -p node-manager --lib   # extra arguments go to `cargo nextest run`
#
# What it does, in order, each step skipped when it is already done:
# 1. installs cargo-nextest (from crates.io, `cargo install --locked`: a few minutes once; no
#    machine of this kind has it preinstalled);
# 2. builds every binary the end-to-end tests start (the Lambda functions, `eks-token`, the
#    sandbox) together with the test targets, in ONE cargo build with the test build's feature
#    set, before any test runs: a test that found its binary missing would otherwise build it
#    inside its own timeout, and on a cold 2-core machine that build outlasts it;
# 3. builds the real Kubernetes control plane the `real_control_plane` tests start (etcd,
#    kube-apiserver, kube-controller-manager, kube-scheduler from their Go modules with the
#    machine's Go 1.26: about 8 minutes once, then cached outside the clone; see CONTRIBUTING);
#    with AWS's Lambda Runtime Interface Emulator, which some of them run the functions under
#    (`scripts/lambda-rie.sh`: half a minute once);
# 4. runs `cargo nextest run --workspace` (profile in .config/nextest.toml: no retries).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

log() { printf '[test.sh %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# The version CI and developers run; bump it deliberately (nextest's output format is read by CI).
nextest_version="0.9.151"

ensure_nextest() {
    if cargo nextest --version >/dev/null 2>&1; then
        return
    fi
    log "installing cargo-nextest $nextest_version (once per machine)"
    # Its own build directory: the workspace's target dir keeps only the workspace's artifacts.
    env -u CARGO_TARGET_DIR -u CARGO_BUILD_BUILD_DIR \
        cargo install cargo-nextest --version "$nextest_version" --locked --quiet
    cargo nextest --version >/dev/null
}

# Go's own install location, for a shell that does not have it on PATH.
export PATH="$PATH:/usr/local/go/bin"

ensure_nextest
log "building the binaries the end-to-end tests start, with the test targets"
cargo build --workspace --bins --tests --locked
profile=default
if [[ "${SKIP_REAL_CONTROL_PLANE_TESTS:-}" == 1 && "${CI:-}" != true ]]; then
    log "SKIP_REAL_CONTROL_PLANE_TESTS=1: the real control plane is not built; the tests that start it are skipped (counted in the summary)"
    profile=no-real-plane
else
    log "building the real control plane and AWS's Lambda Runtime Interface Emulator (cached after the first time)"
    bash scripts/control-plane.sh build
    bash scripts/lambda-rie.sh build
fi
log "running the tests"
exec cargo nextest run --workspace --locked --profile "$profile" "$@"
