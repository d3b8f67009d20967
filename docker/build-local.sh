#!/usr/bin/env bash
# Build every image of compose.yaml where no image registry is reachable (only Debian's package
# mirror and PyPI on the host), and tag them as compose.local.yaml names them:
#   dlr-local/python:3.11-bookworm   base: debootstrap of Debian bookworm + python3.11, imported
#   dlr-local/redis, dlr-local/haproxy, dlr-local/prometheus   from Debian packages (docker/local/)
#   dlr-serve:cpu                    docker/Dockerfile on that base, pip offline from a wheelhouse
# Then `docker compose -f compose.yaml -f compose.local.yaml up` runs offline.
#   usage: docker/build-local.sh [--cuda]   (--cuda: also docker/Dockerfile.cuda on the Debian
#          base, since nvidia/cuda cannot be pulled here, and torch's CUDA build in both images;
#          see README "GPU profile")
# DLR_IMAGE_TORCH: the torch requirement of the images (default torch==2.13.0, the CPU-only wheel)
# Caches: the wheelhouse in ${DLR_WHEEL_CACHE:-~/.cache/dlr-serve/wheelhouse} (filled with
# `pip download` from the host's package index, hard-linked into docker/wheelhouse/, the build
# context), the base image (built once), Docker's layer cache (a rerun without changes takes
# seconds). Set DLR_DEBIAN_MIRROR to use another mirror than the one apt uses.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=0
[ "${1:-}" = "--cuda" ] && cuda=1
# --cuda: the wheelhouse (of both images) takes torch's CUDA build unless DLR_IMAGE_TORCH says
if [ "$cuda" = 1 ]; then : "${DLR_IMAGE_TORCH:=torch==2.14.1}"; fi
base=dlr-local/python:3.11-bookworm
cache=${DLR_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlr-serve/wheelhouse}
t0=$(date +%s)
say() { echo "[build-local +$(($(date +%s) - t0))s] $*"; }

# 1. the wheelhouse: every dependency of pyproject.toml (+ pip and the build backend), as wheels.
# torch: the image takes the CPU-only wheel (DLR_IMAGE_TORCH; pyproject's range allows it), not
# the CUDA build with ~3 GB of nvidia-* wheels that the `train` extra pins for torchaudio.
mkdir -p "$cache"
reqs=$(DLR_IMAGE_TORCH=${DLR_IMAGE_TORCH:-torch==2.13.0} python3 - <<'PY'
import os
import tomllib

with open("pyproject.toml", "rb") as f:
    p = tomllib.load(f)
deps = [os.environ["DLR_IMAGE_TORCH"] if d.startswith("torch") and d[5:6] in "<>=!~ " else d
        for d in p["project"]["dependencies"]]
# async-timeout: redis needs it on Python < 3.11.3 (the image's bookworm 3.11.2), which a
# newer host Python's pip does not download
extra = ["pip>=24", "async-timeout>=4.0.3"]
print("\n".join([*deps, *p["build-system"]["requires"], *extra]))
PY
)
want=$(printf '%s\n' "$reqs" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$cache/.stamp" 2>/dev/null)" != "$want" ]; then
  say "wheelhouse: pip download into $cache"
  find "$cache" -maxdepth 1 -name '*.whl' -delete  # only what these requirements need
  printf '%s\n' "$reqs" >"$cache/requirements.txt"
  "${DLR_PIP:-.venv/bin/pip}" download -q --disable-pip-version-check -d "$cache" -r "$cache/requirements.txt" \
    2> >(grep -v "^WARNING: Location" >&2)
  echo "$want" >"$cache/.stamp"
fi
find docker/wheelhouse -name '*.whl' -delete
# hard links when the cache is on the same file system (no copy), else copies
cp -l "$cache"/*.whl docker/wheelhouse/ 2>/dev/null || cp "$cache"/*.whl docker/wheelhouse/
say "wheelhouse: $(find docker/wheelhouse -name '*.whl' | wc -l) wheels"

# 2. the base image
if ! docker image inspect "$base" >/dev/null 2>&1; then
  mirror=${DLR_DEBIAN_MIRROR:-}
  if [ -z "$mirror" ]; then  # the mirror apt uses here
    mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
      | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -1 | tr -d ' ' || true)
  fi
  mirror=${mirror:-http://deb.debian.org/debian}
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  say "base: debootstrap bookworm from $mirror"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
    "$root" "$mirror" >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  ln -sf /usr/bin/python3 "$root/usr/local/bin/python"  # `python` as in the official image
  tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' - "$base" >/dev/null
  rm -rf "$root"
  trap - EXIT
fi
say "base: $base"

# 3. Redis, HAProxy, Prometheus from Debian packages
for svc in redis haproxy prometheus; do
  docker build -q --build-arg BASE_IMAGE="$base" -f "docker/local/$svc.Dockerfile" \
    -t "dlr-local/$svc:bookworm" docker/local >/dev/null 2>"${TMPDIR:-/tmp}/dlr-build-$svc.log" \
    || { cat "${TMPDIR:-/tmp}/dlr-build-$svc.log"; exit 1; }
  say "image: dlr-local/$svc:bookworm"
done

# 4. the server image (the same build arguments as compose.local.yaml)
# The build stage is tagged too (dlr-serve:cpu-build): untagged, its layers (the wheelhouse and
# the installed dependencies) would be dangling images that `docker image prune` deletes, and
# the next build would install every dependency again.
offline=(--build-arg BASE_IMAGE="$base" --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels)
log=${TMPDIR:-/tmp}/dlr-build-cpu.log
{ docker build "${offline[@]}" -f docker/Dockerfile --target build -t dlr-serve:cpu-build . \
  && docker build "${offline[@]}" -f docker/Dockerfile -t dlr-serve:cpu .; } >"$log" 2>&1 \
  || { tail -40 "$log"; exit 1; }
say "image: dlr-serve:cpu"
if [ "$cuda" = 1 ]; then
  log=${TMPDIR:-/tmp}/dlr-build-cuda.log
  cuda_args=(--build-arg CUDA_IMAGE="$base" --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels)
  { docker build "${cuda_args[@]}" -f docker/Dockerfile.cuda --target build -t dlr-serve:cuda-debian-build . \
    && docker build "${cuda_args[@]}" -f docker/Dockerfile.cuda -t dlr-serve:cuda-debian .; } >"$log" 2>&1 \
    || { tail -40 "$log"; exit 1; }
  say "image: dlr-serve:cuda-debian (docker/Dockerfile.cuda on the Debian base, no CUDA runtime)"
fi
say "done"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^(dlr-local|dlr-serve)' || true
