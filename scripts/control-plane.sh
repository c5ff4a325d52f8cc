#!/usr/bin/env bash
# The real Kubernetes control plane under the end-to-end tests (tests/tests/real_control_plane*.rs).
#
#   scripts/control-plane.sh build        build etcd, kube-apiserver, kube-controller-manager,
#                                         kube-scheduler, kubectl and kwok into the cache (skipped
#                                         when already there)
#   scripts/control-plane.sh bin-dir      print the folder the tests read the binaries from
#   scripts/control-plane.sh start DIR    start a plane for manual use (state, certs, logs and
#                                         DIR/admin.kubeconfig); prints `export KUBECONFIG=...`
#   scripts/control-plane.sh stop DIR     stop the plane started in DIR
#
# The tests do not use `start`: the test kit (tests/src/control_plane/) starts its own plane per
# test, because it must serve the EKS TokenReview webhook before kube-apiserver starts. The
# manual plane has the same flags but authenticates only its admin token (no webhook).
#
# Version: Kubernetes 1.36 (k8s.io/kubernetes v1.36.3, its latest patch the Go module proxy
# serves). EKS offers 1.36 in standard support through late 2026 and beyond (14 months from its
# EKS release); 1.37 is on the proxy but its EKS launch could not be confirmed when this was
# pinned, so 1.36 is the newest minor known to run on EKS. etcd is v3.6.8, the release
# k8s.io/kubernetes v1.36.3 itself requires, built from the same module graph (the Debian
# package is 3.4 and has no --unsafe-no-fsync; the Go module needs nothing but the module proxy
# the Kubernetes build needs anyway).
#
# Build: k8s.io/kubernetes replaces its k8s.io/* staging modules with ./staging paths, so
# `go install k8s.io/kubernetes/cmd/...@v` is refused; tests/control-plane/go.mod requires
# k8s.io/kubernetes and replaces each staging module with its published v0.36.3, and its go.sum
# pins every module. Go 1.26 is required (a Go 1.27 build served a broken /openapi/v2).
#
# The binaries go to a cache outside the clone, keyed by what decides their bytes: the version,
# go.mod and go.sum, the Go toolchain and the build flags:
#   ${ONM_CONTROL_PLANE_CACHE:-$HOME/.cache/open-node-manager/control-plane}/<key>/bin
# Tests ask this script for that folder (`bin-dir`, so the key has one home) or use
# ONM_CONTROL_PLANE_BIN; they check each binary's version against the pin and print its
# SHA-256 (also written here, to `SHA256SUMS`, when it is built). kubectl is built from the same
# module, for the comparisons with `kubectl drain`. kube-apiserver takes ~8 minutes and ~2 GB of
# memory on 2 cores; each other binary about a minute more.
#
# kwok (sigs.k8s.io/kwok, KWOK_VERSION) plays the kubelets (tests/src/control_plane/kwok.rs). It
# is its own Go module with its own go.sum, so it is built with `go install module@version` into
# the same folder; it is rebuilt when its `--version` (which names the Go toolchain too) differs
# from the pin and this Go, so the folder's key need not cover it.
set -euo pipefail

KUBERNETES_VERSION=v1.36.3
KWOK_VERSION=v0.8.0
REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODULE_DIR="$REPO_ROOT/tests/control-plane"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
VERSION_PKG=k8s.io/component-base/version

# The linker flags: the version the binaries report (`--version`, `/version`).
ldflags() {
    local minor=${KUBERNETES_VERSION#v1.}
    minor=${minor%%.*}
    echo "-s -w -X $VERSION_PKG.gitVersion=$KUBERNETES_VERSION -X $VERSION_PKG.gitMajor=1 -X $VERSION_PKG.gitMinor=$minor -X $VERSION_PKG.gitTreeState=clean"
}

# Everything else handed to `go build`.
BUILD_FLAGS="-p 2 -trimpath -buildvcs=false"
BUILD_ENV="CGO_ENABLED=0 GOFLAGS=-mod=readonly"

cache_key() {
    # go.mod and go.sum byte for byte, then the toolchain and the flags.
    local sum
    sum=$( (cat "$MODULE_DIR/go.mod" "$MODULE_DIR/go.sum"; go env GOVERSION; echo "$BUILD_ENV $BUILD_FLAGS $(ldflags)") \
        | sha256sum | cut -c1-12)
    echo "$KUBERNETES_VERSION-$sum"
}

bin_dir() {
    if [[ -n "${ONM_CONTROL_PLANE_BIN:-}" ]]; then
        echo "$ONM_CONTROL_PLANE_BIN"
    else
        echo "${ONM_CONTROL_PLANE_CACHE:-$HOME/.cache/open-node-manager/control-plane}/$(cache_key)/bin"
    fi
}

require_go_1_26() {
    command -v go >/dev/null || { echo "control-plane: go is not on PATH (Go 1.26 is needed)" >&2; exit 1; }
    local version
    version=$(go env GOVERSION)
    case "$version" in
        go1.26|go1.26.*) ;;
        *) echo "control-plane: Go 1.26 is needed, found $version (a Go 1.27 build serves a broken /openapi/v2)" >&2; exit 1 ;;
    esac
}

# Package path of each binary inside the build module.
package_of() {
    case "$1" in
        etcd) echo go.etcd.io/etcd/server/v3 ;;
        *) echo "k8s.io/kubernetes/cmd/$1" ;;
    esac
}

build() {
    local out
    out=$(bin_dir)
    mkdir -p "$out"
    require_go_1_26
    for binary in "${BINARIES[@]}"; do
        if [[ $binary == kwok ]]; then
            build_kwok "$out"
            continue
        fi
        if [[ -x "$out/$binary" ]]; then
            echo "control-plane: $binary is built ($out)"
            continue
        fi
        echo "control-plane: building $binary $KUBERNETES_VERSION into $out"
        local started=$SECONDS
        # shellcheck disable=SC2086 # the flags are words on purpose
        (cd "$MODULE_DIR" && env $BUILD_ENV GOMAXPROCS=${GOMAXPROCS:-2} \
            nice -n 10 go build $BUILD_FLAGS -ldflags "$(ldflags)" -o "$out/$binary.partial" \
            "$(package_of "$binary")")
        mv "$out/$binary.partial" "$out/$binary"
        echo "control-plane: built $binary in $((SECONDS - started)) s"
    done
    (cd "$out" && sha256sum "${BINARIES[@]}" > SHA256SUMS && cat SHA256SUMS)
}

# kwok from its own module at KWOK_VERSION, unless the one in $1 reports that version and Go.
build_kwok() {
    local out=$1 want
    want="kwok version $KWOK_VERSION $(go env GOVERSION) "
    if [[ -x "$out/kwok" && "$("$out/kwok" --version 2>/dev/null)" == "$want"* ]]; then
        echo "control-plane: kwok is built ($out)"
        return
    fi
    echo "control-plane: building kwok $KWOK_VERSION into $out"
    local started=$SECONDS gobin
    gobin=$(mktemp -d)
    # shellcheck disable=SC2086 # the flags are words on purpose
    env CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$gobin" GOMAXPROCS=${GOMAXPROCS:-2} \
        nice -n 10 go install $BUILD_FLAGS "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    mv "$gobin/kwok" "$out/kwok"
    rmdir "$gobin"
    echo "control-plane: built kwok in $((SECONDS - started)) s"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A manual plane in DIR: etcd, kube-apiserver, kube-controller-manager, kube-scheduler on
# 127.0.0.1, with the flags the tests use (see tests/src/control_plane/mod.rs).
start() {
    local dir=${1:?usage: control-plane.sh start DIR}
    local bin
    bin=$(bin_dir)
    for binary in "${BINARIES[@]}"; do
        [[ -x "$bin/$binary" ]] || { echo "control-plane: $bin/$binary is missing: run $0 build" >&2; exit 1; }
    done
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [[ -e "$dir/pids" ]] && { echo "control-plane: $dir already runs a plane (stop it first)" >&2; exit 1; }
    local etcd_port peer_port api_port
    etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
    (
        cd "$dir"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
            -subj /CN=control-plane-ca -keyout ca.key -out ca.crt 2>/dev/null
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=kube-apiserver \
            -keyout apiserver.key -out apiserver.csr 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n' > san.ext
        openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
            -extfile san.ext -out apiserver.crt 2>/dev/null
        openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out sa.key 2>/dev/null
        openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
        local admin kcm scheduler
        admin=$(openssl rand -hex 16); kcm=$(openssl rand -hex 16); scheduler=$(openssl rand -hex 16)
        printf '%s,kubernetes-admin,admin,"system:masters"\n%s,system:kube-controller-manager,kcm\n%s,system:kube-scheduler,scheduler\n' \
            "$admin" "$kcm" "$scheduler" > tokens.csv
        local ca
        ca=$(base64 -w0 ca.crt)
        for pair in "admin:$admin" "kube-controller-manager:$kcm" "kube-scheduler:$scheduler"; do
            printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:%s\n    certificate-authority-data: %s\nusers:\n- name: user\n  user:\n    token: %s\ncontexts:\n- name: local\n  context: {cluster: local, user: user}\ncurrent-context: local\n' \
                "$api_port" "$ca" "${pair#*:}" > "${pair%%:*}.kubeconfig"
        done
        "$bin/etcd" --name=default --data-dir="$dir/etcd" \
            --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
            --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
            --initial-cluster="default=http://127.0.0.1:$peer_port" --unsafe-no-fsync --log-level=warn \
            > etcd.log 2>&1 &
        echo $! >> pids
        "$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
            --advertise-address=127.0.0.1 --secure-port="$api_port" --tls-cert-file=apiserver.crt \
            --tls-private-key-file=apiserver.key --client-ca-file=ca.crt --service-cluster-ip-range=10.0.0.0/24 \
            --service-account-issuer=https://kubernetes.default.svc --service-account-signing-key-file=sa.key \
            --service-account-key-file=sa.pub --authorization-mode=Node,RBAC --token-auth-file=tokens.csv \
            --endpoint-reconciler-type=none --profiling=false > kube-apiserver.log 2>&1 &
        echo $! >> pids
        local waited=0
        until kubectl_ready; do
            sleep 0.2; waited=$((waited + 1))
            [[ $waited -lt 150 ]] || { echo "control-plane: kube-apiserver not ready after 30 s, see $dir/kube-apiserver.log" >&2; exit 1; }
        done
        "$bin/kube-controller-manager" --kubeconfig=kube-controller-manager.kubeconfig --secure-port=0 \
            --controllers='*,-node-lifecycle-controller' \
            --use-service-account-credentials --service-account-private-key-file=sa.key --root-ca-file=ca.crt \
            > kube-controller-manager.log 2>&1 &
        echo $! >> pids
        "$bin/kube-scheduler" --kubeconfig=kube-scheduler.kubeconfig --secure-port=0 > kube-scheduler.log 2>&1 &
        echo $! >> pids
    )
    echo "control-plane: running in $dir (logs there); stop it with: $0 stop $dir"
    echo "export KUBECONFIG=$dir/admin.kubeconfig"
}

# /readyz through the admin kubeconfig (curl, so kubectl is not needed).
kubectl_ready() {
    local server token
    server=$(sed -n 's/^ *server: //p' admin.kubeconfig)
    token=$(sed -n 's/^ *token: //p' admin.kubeconfig)
    curl -sf --cacert ca.crt -H "Authorization: Bearer $token" "$server/readyz" >/dev/null 2>&1
}

stop() {
    local dir=${1:?usage: control-plane.sh stop DIR}
    [[ -f "$dir/pids" ]] || { echo "control-plane: no plane runs in $dir" >&2; exit 1; }
    # Stop the components before etcd (reverse start order); only the processes started here.
    local pids
    pids=$(tac "$dir/pids")
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    # etcd may hang in its shutdown: kill what is left after 10 s.
    for _ in $(seq 50); do
        local alive=0
        for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [[ $alive == 1 ]] || break
        sleep 0.2
    done
    for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
    rm -f "$dir/pids"
    echo "control-plane: stopped the plane in $dir"
}

case "${1:-}" in
    build) build ;;
    bin-dir) bin_dir ;;
    start) start "${2:-}" ;;
    stop) stop "${2:-}" ;;
    *)
        sed -n '2,14p' "$0" >&2
        exit 2
        ;;
esac
