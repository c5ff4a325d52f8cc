#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a short time (default 20 s each) on the nightly
# toolchain, starting from and adding to the corpus kept in fuzz/corpus/<target>/.
#
#   scripts/fuzz-smoke.sh            # 20 s per target
#   FUZZ_SECONDS=300 scripts/fuzz-smoke.sh lifecycle_message
#
# Needs: rustup toolchain nightly, `cargo install cargo-fuzz`. The first run compiles the
# shared crate with sanitizers into fuzz/target (several minutes); later runs take about
# targets x FUZZ_SECONDS. A crash leaves its input in fuzz/artifacts/<target>/ and fails.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
fixtures="${FIXTURES_DIR:-$root/../shared/fixtures}"
seconds="${FUZZ_SECONDS:-20}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(lifecycle_message cloudtrail_event map_roles)
fi

cd "$root/fuzz"
seed() {
    local target="$1"; shift
    mkdir -p "corpus/$target"
    for file in "$@"; do
        [ -f "$file" ] && cp -n "$file" "corpus/$target/seed-$(basename "$file")"
    done
    return 0
}
seed lifecycle_message "$fixtures"/sns-*.json
if command -v jq > /dev/null; then
    for f in "$fixtures"/sns-*.json; do
        jq -r '.Records[0].Sns.Message' "$f" > "corpus/lifecycle_message/seed-message-$(basename "$f" .json)" || true
    done
fi
seed cloudtrail_event "$fixtures"/eventbridge-*.json
mkdir -p corpus/map_roles
[ -e corpus/map_roles/seed-block ] || printf -- '- rolearn: arn:aws:iam::111111111111:role/admin\n  username: admin\n  groups:\n    - system:masters\n- rolearn: arn:aws:iam::111111111111:role/node\n  username: system:node:{{EC2PrivateDNSName}}\n  groups:\n    - system:bootstrappers\n    - system:nodes\n' > corpus/map_roles/seed-block
[ -e corpus/map_roles/seed-flow ] || printf -- '[{"rolearn": "arn:aws:iam::111111111111:role/node", "username": "system:node:{{EC2PrivateDNSName}}", "groups": ["system:nodes"]}]\n' > corpus/map_roles/seed-flow

cargo +nightly fuzz build -O
for target in "${targets[@]}"; do
    echo "== $target: ${seconds}s"
    cargo +nightly fuzz run -O "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
# Keep the corpus small: merge each into its minimal covering set.
for target in "${targets[@]}"; do
    cargo +nightly fuzz cmin -O "$target" "corpus/$target" > /dev/null 2>&1 || true
done
du -sh corpus/* | sed 's/^/corpus size: /'
