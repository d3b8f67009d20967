#!/usr/bin/env bash
# Install dlr-serve (server + runtime + client) into a fresh virtual environment.
# The Docker images run exactly this script (docker/Dockerfile, docker/Dockerfile.cuda), and
# tests/docker/test_install_steps.py runs it too, so the image is not the only place it runs.
#   usage: docker/install.sh [--deps-only|--project] VENV_DIR [SOURCE_DIR]
# --deps-only: only the dependencies listed in SOURCE_DIR/pyproject.toml and its build backend
#   (the image's build stage: a layer kept in the build cache while the sources change).
# --project: only this project, into a venv that already holds its dependencies (no index, no
#   build isolation: nothing is downloaded), then the smoke checks. Neither: both steps.
# Extra pip options (an index for other wheels, a wheel cache, offline: PIP_NO_INDEX=1 with
# PIP_FIND_LINKS=DIR) come from PIP_* variables.
set -euo pipefail
mode=all
case "${1:-}" in --deps-only) mode=deps; shift ;; --project) mode=project; shift ;; esac
venv=${1:?usage: install.sh [--deps-only|--project] VENV_DIR [SOURCE_DIR]}
src=${2:-.}
if [ "$mode" != project ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --upgrade "pip>=24"
fi
if [ "$mode" = deps ]; then
  reqs=$(mktemp)
  "$venv/bin/python" - "$src/pyproject.toml" >"$reqs" <<'PY'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)
# the build backend too: the project install that follows builds with it
print("\n".join(project["project"]["dependencies"] + project["build-system"]["requires"]))
PY
  "$venv/bin/python" -m pip install -r "$reqs"
  rm -f "$reqs"
  echo "install.sh: ok, dependencies only"
  exit 0
fi
# a regular (not editable) install: the image must not depend on the source tree
if [ "$mode" = project ]; then
  "$venv/bin/python" -m pip install --no-index --no-deps --no-build-isolation "$src"
else
  "$venv/bin/python" -m pip install "$src"
fi
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
