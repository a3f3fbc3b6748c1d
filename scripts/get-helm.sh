#!/usr/bin/env bash
# get-helm.sh - build a pinned helm v3 from its Go module (via the Go module
# proxy) and cache the binary; prints the binary's path on stdout.
#
# No prebuilt release tarball is downloaded: `go install` compiles helm from
# source, which needs a Go toolchain new enough for the pinned release
# (helm v3.22.x declares go 1.26). The first build takes several minutes;
# later runs return at once when the cached binary already reports the
# pinned version.
#
# Environment:
#   NEARDUP_TOOLS         cache root (default: $HOME/.cache/neardup/tools);
#                         the binary goes to $NEARDUP_TOOLS/bin/helm
#   NEARDUP_HELM_VERSION  helm release to build (default: v3.22.0)
#   GO                    go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#
# Usage: scripts/get-helm.sh            # prints e.g. /root/.cache/neardup/tools/bin/helm
#        HELM="$(scripts/get-helm.sh)"
set -euo pipefail

HELM_VERSION="${NEARDUP_HELM_VERSION:-v3.22.0}"
TOOLS_DIR="${NEARDUP_TOOLS:-$HOME/.cache/neardup/tools}"
BIN_DIR="$TOOLS_DIR/bin"
HELM_BIN="$BIN_DIR/helm"

log() { echo "get-helm: $*" >&2; }

find_go() {
    if [[ -n "${GO:-}" ]]; then
        echo "$GO"
    elif command -v go >/dev/null 2>&1; then
        command -v go
    elif [[ -x /usr/local/go/bin/go ]]; then
        echo /usr/local/go/bin/go
    else
        log "no Go toolchain found (set GO=/path/to/go)"
        exit 1
    fi
}

installed_version() {
    # helm prints e.g. "v3.22.0"; empty if the binary is missing or broken.
    [[ -x "$HELM_BIN" ]] || return 0
    "$HELM_BIN" version --template '{{.Version}}' 2>/dev/null || true
}

if [[ "$(installed_version)" == "$HELM_VERSION" ]]; then
    echo "$HELM_BIN"
    exit 0
fi

GO_BIN="$(find_go)"
log "building helm $HELM_VERSION with $("$GO_BIN" version) (this can take several minutes)"
mkdir -p "$BIN_DIR"
start=$SECONDS
# -X stamps the version helm reports (otherwise it would print a generic
# "v3.x"-style default); -s -w drop debug info to keep the binary small.
CGO_ENABLED=0 GOBIN="$BIN_DIR" "$GO_BIN" install \
    -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"

got="$(installed_version)"
if [[ "$got" != "$HELM_VERSION" ]]; then
    log "built binary reports version '${got}', expected '$HELM_VERSION'"
    exit 1
fi
log "built $HELM_BIN in $((SECONDS - start)) s"
echo "$HELM_BIN"
