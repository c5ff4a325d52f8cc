#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a short time (default 20 s each), starting from the
# corpus kept in fuzz/corpus/<target>/ plus seeds made from tests/fixtures, and fails when
# any target finds a crash (its input is then printed, base64, and left in
# fuzz/artifacts/<target>/).
#
#   scripts/fuzz-smoke.sh                                   # 20 s per target, stable Rust
#   FUZZ_SECONDS=300 scripts/fuzz-smoke.sh lifecycle_message
#   FUZZ_TOOLCHAIN=nightly FUZZ_SANITIZER=address scripts/fuzz-smoke.sh   # with ASan
#
# Needs `cargo install cargo-fuzz`. By default the targets are built on the default (stable)
# toolchain without a sanitizer (`-s none`): the code under test is safe Rust, so what the
# fuzzer looks for is a panic, an overflow (debug assertions stay on) or a broken property,
# and none of that needs nightly. The build goes to FUZZ_TARGET_DIR (default
# ~/.cache/open-node-manager/fuzz-target), never to the main workspace's CARGO_TARGET_DIR:
# the fuzz RUSTFLAGS differ, so sharing it would rebuild both every time.
#
# New inputs go to FUZZ_CORPUS_DIR/<target> when that is set (CI keeps one outside the
# clone, so what it finds accumulates across runs) and otherwise to fuzz/corpus/<target>,
# which is minimized (cmin) at the end, ready to commit.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
fixtures="${FIXTURES_DIR:-$root/tests/fixtures}"
seconds="${FUZZ_SECONDS:-20}"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/open-node-manager/fuzz-target}"
cargo=(cargo)
if [ -n "${FUZZ_TOOLCHAIN:-}" ]; then
    cargo+=("+$FUZZ_TOOLCHAIN")
fi
# The same build options for build, run and cmin, so that none of them rebuilds.
build_options=(--sanitizer "${FUZZ_SANITIZER:-none}")
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(lifecycle_message cloudtrail_event map_roles instance_event)
fi

cd "$root/fuzz"

# Seeds: read at every run, never written to (libFuzzer adds new inputs to the first
# corpus directory only).
seeds="$(mktemp -d)"
trap 'rm -rf "$seeds"' EXIT
touch "$seeds/started"
mkdir -p "$seeds"/{lifecycle_message,cloudtrail_event,map_roles,instance_event}
if [ -d "$fixtures" ]; then
    cp "$fixtures"/sns-*.json "$seeds/lifecycle_message/" 2>/dev/null || true
    cp "$fixtures"/eventbridge-*.json "$seeds/cloudtrail_event/" 2>/dev/null || true
    # The lifecycle target also reads its input as the SNS Message itself.
    for file in "$fixtures"/sns-*.json; do
        [ -f "$file" ] || continue
        python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["Records"][0]["Sns"]["Message"], end="")' \
            "$file" > "$seeds/lifecycle_message/message-$(basename "$file")" 2>/dev/null || true
    done
else
    echo "note: no fixtures at $fixtures; starting from the kept corpus only" >&2
fi
printf '{"clusterName": "ironman-2022", "nodegroupName": "demo-ng"}' > "$seeds/cloudtrail_event/direct-one"
printf '{"clusterName": "second", "reconcile": "all"}' > "$seeds/cloudtrail_event/direct-all"
printf -- '- rolearn: arn:aws:iam::111111111111:role/admin\n  username: admin\n  groups:\n    - system:masters\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups:\n    - system:bootstrappers\n    - system:nodes\n' > "$seeds/map_roles/block"
printf -- '[{"rolearn": "arn:aws:iam::111111111111:role/node", "username": "system:node:{{EC2PrivateDNSName}}", "groups": ["system:nodes"]}]\n' > "$seeds/map_roles/flow"

"${cargo[@]}" fuzz build "${build_options[@]}"

failed=()
for target in "${targets[@]}"; do
    corpus="${FUZZ_CORPUS_DIR:+$FUZZ_CORPUS_DIR/$target}"
    corpus="${corpus:-corpus/$target}"
    kept=()
    if [ "$corpus" != "corpus/$target" ] && [ -d "corpus/$target" ]; then
        kept=("corpus/$target")
    fi
    mkdir -p "$corpus" "$seeds/$target"
    echo "== $target: ${seconds}s, corpus $corpus"
    if ! "${cargo[@]}" fuzz run "${build_options[@]}" "$target" "$corpus" "${kept[@]}" "$seeds/$target" -- \
        -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1; then
        failed+=("$target")
        continue
    fi
    # Keep the corpus small: a set of inputs that still reaches every edge (hit counts are
    # ignored; counting them keeps about three times as many files).
    "${cargo[@]}" fuzz cmin "${build_options[@]}" "$target" "$corpus" -- -use_counters=0 \
        > /dev/null 2>&1 || true
    echo "corpus $target: $(find "$corpus" -type f | wc -l) inputs, $(du -sh "$corpus" | cut -f1)"
done

if [ ${#failed[@]} -gt 0 ]; then
    for target in "${failed[@]}"; do
        find "artifacts/$target" -type f -newer "$seeds/started" 2>/dev/null | while read -r input; do
            echo "!! $target crashed on fuzz/$input (base64):"
            base64 "$input"
            echo "   reproduce: (cd fuzz && ${cargo[*]} fuzz run -s ${FUZZ_SANITIZER:-none} $target $input)"
        done
    done
    echo "fuzzing found a crash in: ${failed[*]}" >&2
    exit 1
fi
