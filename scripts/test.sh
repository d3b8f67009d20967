#!/usr/bin/env bash
# The test command: lint, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
