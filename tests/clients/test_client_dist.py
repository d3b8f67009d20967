"""The client installs and runs on its own: no torch, nothing of the server.

`pip install ./clients` (the `dlr-serve-client` distribution) goes into a fresh virtual
environment, which then lists the models of a live server with its own `dlr-client`.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "clients"
FORBIDDEN = {"torch", "torchaudio", "server", "dlr_runtime", "training", "fastapi", "onnxruntime"}


def test_client_sources_import_nothing_heavy():
    for path in sorted(CLIENTS.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            bad = [n for n in names if n.split(".")[0] in FORBIDDEN]
            assert not bad, f"{path.name}:{node.lineno} imports {bad}"


@pytest.mark.slow
def test_pip_install_clients_into_a_fresh_venv(tmp_path, live_server):
    src = tmp_path / "src"
    shutil.copytree(
        CLIENTS, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"

    def run(*cmd: str, timeout: float = 240) -> str:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"{cmd}\n{out.stdout}\n{out.stderr}"
        return out.stdout

    run(str(py), "-m", "pip", "install", "-q", str(src))
    listed = json.loads(run(str(py), "-m", "pip", "list", "--format=json"))
    installed = {p["name"].lower() for p in listed}
    assert "dlr-serve-client" in installed
    assert not installed & {"torch", "torchaudio", "fastapi", "uvicorn", "onnxruntime-gpu"}, (
        installed
    )
    probe = "import sys, clients; print(sorted(m for m in sys.modules if m.split('.')[0] in %r))"
    assert run(str(py), "-c", probe % (FORBIDDEN,)).strip() == "[]"
    listing = run(str(env_dir / "bin" / "dlr-client"), "--url", live_server.url, "models")
    assert "tiny-speech" in listing and "tiny-lm" in listing
