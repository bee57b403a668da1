#!/usr/bin/env bash
# `make image`: build the CPU image (deploy/container/Containerfile) with podman, offline apart
# from the Debian mirror. Three steps, the first two cached:
#   1. the base image: a Debian bookworm minbase made by mmdebstrap and `podman import`ed as
#      $BASE_IMAGE; skipped while that image exists in podman's storage (`podman rmi` it to
#      rebuild).
#   2. the wheelhouse, build/wheelhouse: a wheel of trtserve (built every time) and the server's
#      Python packages for the image's Python (3.11, glibc x86_64), pinned to the versions in
#      .venv (the ones the tests ran with), downloaded again only when pyproject.toml is newer
#      than the wheelhouse; pip inside the build has no index, it installs from here.
#   3. `podman build` (chroot isolation, the host's network for apt-get), tagged $IMAGE.
# Environment: IMAGE (default localhost/trtserve:cpu), BASE_IMAGE (localhost/trtserve-base:bookworm),
# TARGET (baked: models from engines/ in /models; server: none, mount them), PYTHON (.venv/bin/python).
# podman runs with deploy/container/containers.conf unless CONTAINERS_CONF names another.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${IMAGE:-localhost/trtserve:cpu}
BASE_IMAGE=${BASE_IMAGE:-localhost/trtserve-base:bookworm}
TARGET=${TARGET:-baked}
PYTHON=${PYTHON:-.venv/bin/python}
WHEELS=build/wheelhouse
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/container/containers.conf}

for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "make image: $tool is missing (apt-get install podman runc mmdebstrap)" >&2; exit 2; }
done

start=$SECONDS
if podman image exists "$BASE_IMAGE"; then
  echo "base image $BASE_IMAGE: cached"
else
  echo "base image $BASE_IMAGE: bootstrapping Debian bookworm (minbase) with mmdebstrap"
  tar=$(mktemp --suffix=.tar)
  trap 'rm -f "$tar"' EXIT
  # No man pages, docs (copyright files stay) or translations: the image's slim variant.
  nice -n 10 mmdebstrap --variant=minbase --format=tar --quiet \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  nice -n 10 podman import --quiet --change 'CMD ["/bin/bash"]' "$tar" "$BASE_IMAGE" >/dev/null
  rm -f "$tar"
fi

# trtserve's own wheel every time (the code changes more often than its dependencies).
rm -f "$WHEELS"/trtserve-*.whl
mkdir -p "$WHEELS"
# A fixed timestamp makes the same code the same wheel, so podman reuses its cached layers.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 315532800) \
  "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$WHEELS" .
if [ ! -f "$WHEELS/.stamp" ] || [ pyproject.toml -nt "$WHEELS/.stamp" ]; then
  echo "wheelhouse $WHEELS: downloading the server's packages for CPython 3.11 x86_64"
  "$PYTHON" -m pip freeze --exclude-editable >"$WHEELS/constraints.txt"
  platforms=()
  for glibc in 2_17 2_24 2_26 2_27 2_28 2_31 2_34 2_35 2_36; do platforms+=(--platform "manylinux_${glibc}_x86_64"); done
  nice -n 10 "$PYTHON" -m pip download --quiet --dest "$WHEELS" --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
    --platform manylinux2014_x86_64 "${platforms[@]}" --platform any \
    --constraint "$WHEELS/constraints.txt" --find-links "$WHEELS" 'trtserve[server]' \
    'async-timeout>=4.0.3'
  # (pip evaluates dependency markers with this machine's Python, not the target's: redis needs
  # async-timeout on bookworm's 3.11.2, python_full_version < "3.11.3", so it is named above.)
  touch "$WHEELS/.stamp"
else
  echo "wheelhouse $WHEELS: dependencies cached (pyproject.toml unchanged)"
fi

echo "building $IMAGE (target $TARGET)"
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
nice -n 10 podman build --isolation chroot --network host --format docker \
  --build-arg "BASE=$BASE_IMAGE" --target "$TARGET" --tag "$IMAGE" \
  --file deploy/container/Containerfile .
echo "make image: $IMAGE in $((SECONDS - start)) s, $(podman image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=si)B"
