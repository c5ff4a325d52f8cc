#!/usr/bin/env bash
# AWS's Lambda Runtime Interface Emulator (`aws-lambda-rie`, the runtime API AWS ships in its
# Lambda base images), built from its Go module at a pinned version for the end-to-end tests
# that run the built functions under it (`tests/src/lambda_rie.rs`).
#
#   scripts/lambda-rie.sh build    build it into the cache (skipped when already there)
#   scripts/lambda-rie.sh path     print where the tests find it
#
# The binary goes outside the clone, to
#   ${ONM_LAMBDA_RIE_CACHE:-$HOME/.cache/open-node-manager/lambda-rie}/aws-lambda-rie
# with a stamp naming the module version and Go version it was built from: another pin or
# another Go rebuilds it. Needs Go (the module proxy serves the module); about half a minute.
set -euo pipefail

# The module's newest commit the Go module proxy served on 2026-12-01 (it publishes no
# tagged release there).
MODULE="github.com/aws/aws-lambda-runtime-interface-emulator"
VERSION="v0.0.0-20261030222936-bef5c4ba774d"

export PATH="$PATH:/usr/local/go/bin"
cache="${ONM_LAMBDA_RIE_CACHE:-$HOME/.cache/open-node-manager/lambda-rie}"
binary="$cache/aws-lambda-rie"

stamp() { printf '%s@%s %s CGO_ENABLED=0\n' "$MODULE" "$VERSION" "$(go env GOVERSION)"; }

case "${1:-}" in
build)
    if [[ -x "$binary" && -f "$cache/stamp" && "$(cat "$cache/stamp")" == "$(stamp)" ]]; then
        exit 0
    fi
    mkdir -p "$cache"
    echo "[lambda-rie] building $MODULE@$VERSION with $(go env GOVERSION)" >&2
    CGO_ENABLED=0 GOBIN="$cache" GOFLAGS=-mod=mod go install "$MODULE/cmd/aws-lambda-rie@$VERSION"
    stamp > "$cache/stamp"
    sha256sum "$binary" >&2
    ;;
path)
    echo "$binary"
    ;;
*)
    echo "usage: $0 build|path" >&2
    exit 2
    ;;
esac
