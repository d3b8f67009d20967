#!/usr/bin/env bash
# Install dlr-serve (server + runtime + client) into a fresh virtual environment.
# The Docker images run exactly this script (docker/Dockerfile, docker/Dockerfile.cuda), and
# tests/docker/test_install_steps.py runs it too, so the image is not the only place it runs.
#   usage: docker/install.sh VENV_DIR [SOURCE_DIR]
# Extra pip options (an index for other wheels, a wheel cache) come from PIP_* variables.
set -euo pipefail
venv=${1:?usage: install.sh VENV_DIR [SOURCE_DIR]}
src=${2:-.}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --upgrade "pip>=24"
# a regular (not editable) install: the image must not depend on the source tree
"$venv/bin/python" -m pip install "$src"
# smoke checks (from / so that the installed packages are imported, not the source tree): the
# entry points start, the packages and the page's static files are there
cd /
"$venv/bin/dlr-serve" --help >/dev/null
"$venv/bin/dlr-client" --help >/dev/null
"$venv/bin/python" - <<'PY'
import importlib.resources as r
import sys

import clients, dlr_runtime, server  # noqa: F401

assert "site-packages" in server.__file__, f"imported {server.__file__}, not the installed package"

static = r.files("server") / "static"
missing = [n for n in ("index.html", "app.js", "pcm-worklet.js") if not (static / n).is_file()]
if missing:
    sys.exit(f"install.sh: server/static is missing {missing} (package data not installed)")
print("install.sh: ok,", sys.version.split()[0])
PY
