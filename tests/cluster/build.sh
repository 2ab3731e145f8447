#!/usr/bin/env bash
# Build (or reuse) the binaries of the test control plane from Go modules, pinned in versions.env:
# kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok and the agent-sandbox
# controller, plus agent-sandbox's CRDs and the controller's ClusterRoles from the same module
# version. Prints the directory that holds them (bin/, crds/, rbac/).
#
# Kubernetes and etcd cannot be `go install`ed (their go.mod replaces staging modules by local
# paths), so each is built from a small wrapper module that requires it and replaces every staging
# module by its published version, generated from the dependency's own go.mod.
#
# Cache: $ROLLBOX_CLUSTER_CACHE (default ~/.cache/rollbox-cluster)/<versions>/, outside the repo.
# The Go module and build caches used for the build live in that cache's go/ directory and are
# removed after a successful build unless ROLLBOX_CLUSTER_KEEP_GO_CACHE=1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

root="${ROLLBOX_CLUSTER_CACHE:-$HOME/.cache/rollbox-cluster}"
out="$root/k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-agent-sandbox-$AGENT_SANDBOX_VERSION"
binaries=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok agent-sandbox-controller)

complete() {
    for b in "${binaries[@]}"; do [[ -x "$out/bin/$b" ]] || return 1; done
    [[ -f "$out/crds/.complete" ]]
}
if complete; then echo "$out"; exit 0; fi

# One build at a time: .ci/run starts one in the background while the suite runs, and the
# k8s_cluster fixture's own call waits here for it, then finds the binaries complete.
mkdir -p "$root"
exec {lock}>"$root/.build.lock"
flock "$lock"
if complete; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is not installed (needs Go >= 1.26)" >&2; exit 3; }
mkdir -p "$out/bin" "$out/crds" "$out/go"
export GOMODCACHE="$out/go/mod" GOCACHE="$out/go/build" CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
log() { printf '%s build.sh: %s\n' "$(date +%T)" "$*" >&2; }
nice_go() { nice -n 19 go "$@"; }

# wrapper DIR MODULE@VERSION [STAGING_PREFIX STAGING_VERSION]: a module requiring MODULE,
# whose staging requirements (every STAGING_PREFIX* module the dependency replaces by a local
# path) are replaced by STAGING_VERSION. (Plain `go install module@version` would also do
# for modules without such replaces, but it asks the proxy for the module's version list,
# which the proxy here refuses for agent-sandbox.)
wrapper() {
    local dir=$1 dep=$2 prefix=${3:-} staged=${4:-}
    rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
    go mod init rollbox.test/"$(basename "$dir")" >/dev/null 2>&1
    if [[ -n "$prefix" ]]; then
        local gomod
        gomod=$(go mod download -json "$dep" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
        sed -n "s#^\t\($prefix[^ ]*\) => \./.*#\1#p; s#^\t\($prefix[^ ]*\) => \.\./.*#\1#p" \
            "$gomod" | while read -r m; do go mod edit -replace "$m=$m@$staged"; done
    fi
    go mod edit -require "$dep"
}

# build DIR PACKAGE NAME: build PACKAGE of DIR's wrapper into bin/NAME.
build() {
    cd "$1"
    go mod edit -tool "$2"
    nice_go mod tidy >&2
    nice_go build -trimpath -ldflags "-s -w" -o "$out/bin/$3.tmp" "$2"
    mv "$out/bin/$3.tmp" "$out/bin/$3"
}

start=$SECONDS
if [[ ! -x "$out/bin/kube-apiserver" || ! -x "$out/bin/kube-controller-manager" || ! -x "$out/bin/kube-scheduler" ]]; then
    log "kubernetes $KUBERNETES_VERSION"
    minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
    wrapper "$out/go/src/kubernetes" "k8s.io/kubernetes@$KUBERNETES_VERSION" "k8s.io/" "v0.${KUBERNETES_VERSION#v1.}"
    for c in kube-apiserver kube-controller-manager kube-scheduler; do go mod edit -tool "k8s.io/kubernetes/cmd/$c"; done
    nice_go mod tidy >&2
    v=k8s.io/component-base/version
    ldflags="-s -w -X $v.gitVersion=$KUBERNETES_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
    for c in kube-apiserver kube-controller-manager kube-scheduler; do
        log "  go build $c"
        nice_go build -trimpath -ldflags "$ldflags" -o "$out/bin/$c.tmp" "k8s.io/kubernetes/cmd/$c"
        mv "$out/bin/$c.tmp" "$out/bin/$c"
    done
    log "kubernetes done after $((SECONDS - start)) s"
fi
if [[ ! -x "$out/bin/etcd" ]]; then
    log "etcd $ETCD_VERSION"
    wrapper "$out/go/src/etcd" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/" "$ETCD_VERSION"
    build "$out/go/src/etcd" go.etcd.io/etcd/server/v3 etcd
    log "etcd done after $((SECONDS - start)) s"
fi
if [[ ! -x "$out/bin/kwok" ]]; then
    log "kwok $KWOK_VERSION"
    wrapper "$out/go/src/kwok" "sigs.k8s.io/kwok@$KWOK_VERSION"
    build "$out/go/src/kwok" sigs.k8s.io/kwok/cmd/kwok kwok
    log "kwok done after $((SECONDS - start)) s"
fi
if [[ ! -x "$out/bin/agent-sandbox-controller" || ! -f "$out/crds/.complete" ]]; then
    log "agent-sandbox $AGENT_SANDBOX_VERSION"
    wrapper "$out/go/src/agent-sandbox" "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION"
    build "$out/go/src/agent-sandbox" sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller \
        agent-sandbox-controller
    src=$(go mod download -json "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    install -m 0644 "$src"/k8s/crds/*.yaml "$out/crds/"
    mkdir -p "$out/rbac" && install -m 0644 "$src"/k8s/*rbac*.yaml "$out/rbac/"
    touch "$out/crds/.complete"
    log "agent-sandbox done after $((SECONDS - start)) s"
fi
du -sh "$out/bin" "$out/go/mod" "$out/go/build" >&2 || true
if [[ "${ROLLBOX_CLUSTER_KEEP_GO_CACHE:-0}" != 1 ]]; then
    chmod -R u+w "$out/go" && rm -rf "$out/go"
fi
log "built in $((SECONDS - start)) s"
echo "$out"
