#!/usr/bin/env bash
# install-validators.sh -- install the tools tests/test_deploy.py and tests/test_kubernetes.py use
# when they find them:
#   * the Docker Compose v2 CLI plugin, so `docker compose config` validates compose.yaml with no
#     engine running. Bookworm's own docker-compose package is the Python 1.x tool, which is no
#     plugin; trixie's 2.x build runs on bookworm (it needs glibc >= 2.34). It goes to
#     $COMPOSE_PLUGIN_DIR (default ~/.docker/cli-plugins), where the docker client looks for it.
#   * promtool (from Debian's prometheus package), which parses every PromQL expression of the
#     dashboard and checks deploy/prometheus/prometheus.yml. It goes to $PROMTOOL_DIR (default
#     /usr/local/bin).
#   * kubectl, unless one is on PATH already: `kubectl kustomize` builds deploy/kubernetes's
#     overlays offline. Bookworm's kubernetes-client is 1.20, whose kustomize predates components;
#     trixie's kubectl (1.32, kustomize v5) runs on bookworm. It goes to $KUBECTL_DIR (default
#     /usr/local/bin).
# Only the binaries are installed; the packages are downloaded and unpacked in a temporary
# folder, with a private apt state for trixie's package list, so nothing else on the system changes.
# Prints the paths of the tools.
set -euo pipefail
COMPOSE_PLUGIN_DIR=${COMPOSE_PLUGIN_DIR:-$HOME/.docker/cli-plugins}
PROMTOOL_DIR=${PROMTOOL_DIR:-/usr/local/bin}
KUBECTL_DIR=${KUBECTL_DIR:-/usr/local/bin}
# shellcheck source=deploy/trixie-download.sh
. "$(dirname "$0")/trixie-download.sh"
W=$(mktemp -d "${TMPDIR:-/tmp}/tritonactor-validators.XXXXXX")
trap 'rm -rf "$W"' EXIT

works() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

if ! works "$COMPOSE_PLUGIN_DIR/docker-compose"; then
  mkdir -p "$W/compose"
  trixie_download "$W" docker-compose
  dpkg-deb -x "$W"/docker-compose_*.deb "$W/compose"
  mkdir -p "$COMPOSE_PLUGIN_DIR"
  install -m 0755 "$W/compose/usr/libexec/docker/cli-plugins/docker-compose" "$COMPOSE_PLUGIN_DIR/"
fi

if ! works "$PROMTOOL_DIR/promtool"; then
  mkdir -p "$W/prometheus"
  (cd "$W" && apt-get -qq -o APT::Sandbox::User=root download prometheus >&2)
  dpkg-deb -x "$W"/prometheus_*.deb "$W/prometheus"
  mkdir -p "$PROMTOOL_DIR"
  install -m 0755 "$W/prometheus/usr/bin/promtool" "$PROMTOOL_DIR/"
fi

KUBECTL=$(command -v kubectl || true)
if [ -z "$KUBECTL" ] || ! "$KUBECTL" kustomize --help >/dev/null 2>&1; then
  mkdir -p "$W/kubectl"
  trixie_download "$W" kubectl
  dpkg-deb -x "$W"/kubectl_*.deb "$W/kubectl"
  mkdir -p "$KUBECTL_DIR"
  install -m 0755 "$W/kubectl/usr/bin/kubectl" "$KUBECTL_DIR/"
  KUBECTL=$KUBECTL_DIR/kubectl
fi

echo "$COMPOSE_PLUGIN_DIR/docker-compose"
echo "$PROMTOOL_DIR/promtool"
echo "$KUBECTL"
