#!/usr/bin/env bash
# Builds every Lambda function of the workspace for Lambda's arm64 runtime (provided.al2023)
# with cargo-lambda, and prints each binary's size. CI calls this; so can you.
#
#   scripts/build-lambdas.sh             # release, arm64
#   scripts/build-lambdas.sh --x86-64    # release, x86_64 (extra args go to cargo lambda build)
#
# cargo-lambda and zig (the cross linker) come from PyPI (`cargo-lambda`, `ziglang`) and are
# installed when missing. The workspace's default-members are exactly the function crates, so
# `cargo lambda build` at the root builds the functions and nothing else (no test kit, no CLI).
# Output: ${CARGO_TARGET_DIR:-target}/lambda/<function>/bootstrap.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

arch_flag="--arm64"
rust_target="aarch64-unknown-linux-gnu"
elf_machine="aarch64"
for arg in "$@"; do
    case "$arg" in
        --x86-64 | --x86_64)
            arch_flag="--x86-64"
            rust_target="x86_64-unknown-linux-gnu"
            elf_machine="x86-64"
            ;;
    esac
done
extra_args=()
for arg in "$@"; do
    case "$arg" in
        --x86-64 | --x86_64 | --arm64) ;;
        *) extra_args+=("$arg") ;;
    esac
done

if ! cargo lambda --version >/dev/null 2>&1 || ! python3 -m ziglang version >/dev/null 2>&1; then
    echo "build-lambdas: installing cargo-lambda and ziglang from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check cargo-lambda ziglang
    hash -r
fi
export PATH="$HOME/.local/bin:$PATH"

# The standard library for the target must come with the toolchain: no other toolchain
# component can be downloaded on machines without access to the Rust distribution server.
if command -v rustup >/dev/null 2>&1 &&
    ! rustup target list --installed 2>/dev/null | grep -qx "$rust_target"; then
    if ! rustup target add "$rust_target"; then
        echo "build-lambdas: SKIPPED: the Rust standard library for $rust_target is not installed" >&2
        echo "build-lambdas: and cannot be downloaded here (rustup target add $rust_target)." >&2
        exit 0
    fi
fi

# Nothing that is not needed at run time belongs in a function: no test kit, and no second
# TLS stack (aws-lc-sys or OpenSSL: more size, and C code to cross-compile besides ring).
for manifest in functions/*/Cargo.toml; do
    package="$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$manifest" | head -n 1)"
    unwanted="$(cargo tree -q -p "$package" -e normal,build --target "$rust_target" --prefix none |
        sed 's/ .*//' | sort -u | grep -E '^(node-manager-testkit|aws-lc-sys|aws-lc-fips-sys|openssl-sys)$' || true)"
    if [ -n "$unwanted" ]; then
        echo "build-lambdas: $package depends on $(echo "$unwanted" | tr '\n' ' ')- remove it from its dependency tree" >&2
        exit 1
    fi
done

echo "build-lambdas: $(cargo lambda --version), zig $(python3 -m ziglang version)"
start=$(date +%s)
cargo lambda build --release "$arch_flag" ${extra_args[@]+"${extra_args[@]}"}
echo "build-lambdas: built in $(($(date +%s) - start)) s"

lambda_dir="${CARGO_TARGET_DIR:-target}/lambda"
status=0
printf '%-20s %12s %9s  %s\n' function bytes MiB path
for manifest in functions/*/Cargo.toml; do
    name="$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$manifest" | head -n 1)"
    binary="$lambda_dir/$name/bootstrap"
    if [ ! -f "$binary" ]; then
        echo "build-lambdas: missing $binary" >&2
        status=1
        continue
    fi
    bytes=$(stat -c %s "$binary")
    printf '%-20s %12d %9.2f  %s\n' "$name" "$bytes" "$(awk -v b="$bytes" 'BEGIN { print b / 1048576 }')" "$binary"
    # Lambda runs what it is given: make sure it is the right machine code.
    if command -v file >/dev/null 2>&1 && ! file "$binary" | grep -qi "$elf_machine"; then
        echo "build-lambdas: $binary is not an $elf_machine executable: $(file -b "$binary")" >&2
        status=1
    fi
done
exit "$status"
