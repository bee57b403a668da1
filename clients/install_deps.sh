#!/usr/bin/env bash
# Install the toolchains `make clients` needs, from Debian (bookworm) packages; offline-capable
# apart from the apt mirror. Installs only what is missing. Node.js (>= 18) and npm come from
# apt only when absent; the Node packages come from the npm registry via `npm ci` (`make clients`).
#
#   clients/install_deps.sh [node] [cpp] [go] [image] [redis]     (default: node cpp go)
set -euo pipefail
WANT=("$@")
[ ${#WANT[@]} -gt 0 ] || WANT=(node cpp go)
PKGS=()
for want in "${WANT[@]}"; do
  case $want in
    node) command -v node >/dev/null || PKGS+=(nodejs)
          command -v npm >/dev/null || PKGS+=(npm) ;;
    cpp) PKGS+=(g++ make cmake protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev) ;;
    # golang-google-grpc-dev accepts either golang/protobuf 1.3 or 1.5; code from protoc-gen-go
    # 1.28 needs 1.5 (the 1.3 codec panics on it), so name it explicitly.
    go) PKGS+=(protobuf-compiler golang-go golang-google-grpc-dev golang-google-protobuf-dev
               golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc) ;;
    # not a client: what `make image` builds and runs the container image with (only on request)
    image) PKGS+=(podman runc mmdebstrap) ;;
    # not a client either: the real Redis the queue door's tests, the bench and clients/run_all.sh start (trtserve.testing.redis_server)
    redis) command -v redis-server >/dev/null || PKGS+=(redis-server) ;;
    *) echo "unknown toolchain '$want' (node, cpp, go, image, redis)" >&2; exit 2 ;;
  esac
done
MISSING=()
for pkg in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || MISSING+=("$pkg")
done
if [ ${#MISSING[@]} -eq 0 ]; then
  echo "toolchains ${WANT[*]}: all installed"
  exit 0
fi
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "toolchains ${WANT[*]}: installing ${MISSING[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${MISSING[@]}"
