"""The image's install steps, run here the way the Dockerfile runs them.

The install steps of docker/Dockerfile are replayed outside Docker, in order: the build
stage's and the runtime stage's COPY lines (but `COPY --from`, which the shared venv stands for)
copy the same files into a temporary root, their `RUN bash docker/install.sh ...` lines (the
dependencies, then the project) run with the image paths mapped into it (a fresh virtual
environment, no packages from the test environment), with the build stage's ENV; other RUN
lines (creating the image's user) are not replayed. Then the installed `dlr-serve` serves the tiny test
models and the image's HEALTHCHECK command passes against it, and `/` serves the page from
the installed package. Slow (a full install of torch from the local wheels): runs when
DLR_TEST_INSTALL=1 is set.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"


def parse_stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions of each stage as (KEYWORD, arguments), line continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    stages: list[list[tuple[str, str]]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, args = line.partition(" ")
        if key.upper() == "FROM":
            stages.append([])
        if stages:  # (global ARGs before the first FROM only parameterise FROM lines)
            stages[-1].append((key.upper(), args.strip()))
    return stages


def parse_env(args: str) -> dict[str, str]:
    return dict(tok.split("=", 1) for tok in shlex.split(args))


def test_every_copy_source_exists_in_the_repo():
    for name in ("Dockerfile", "Dockerfile.cuda"):
        for stage in parse_stages((REPO / "docker" / name).read_text()):
            for key, args in stage:
                if key != "COPY" or "--from=" in args:
                    continue
                *srcs, _dest = [a for a in shlex.split(args) if not a.startswith("--")]
                for src in srcs:
                    if src.rstrip("/") == "models" and not any(
                        (REPO / "models").glob("*/config.json")
                    ):
                        pytest.skip("models/ holds no shipped checkpoint yet (written by training)")
                    assert (REPO / src).exists(), f"{name}: COPY {src} is not in the repository"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FULL = os.environ.get("DLR_TEST_INSTALL") == "1"


def third_party_site(tmp_path: Path) -> Path:
    """A directory exposing the test environment's installed third-party packages (torch,
    fastapi, ...) but not this project's own packages nor its editable-install hooks."""
    import fastapi

    site = Path(fastapi.__file__).resolve().parents[1]
    out = tmp_path / "third-party"
    out.mkdir()
    own = ("dlr_runtime", "server", "clients", "training", "dlr_serve")
    for entry in site.iterdir():
        if (
            entry.name.startswith(own)
            or entry.name.startswith("__editable__")
            or entry.suffix == ".pth"
        ):
            continue
        (out / entry.name).symlink_to(entry)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "deps",
    [
        "reused",
        pytest.param(
            "fresh",
            marks=pytest.mark.skipif(
                not FULL,
                reason="installs torch + CUDA wheels (~5 GB) into a fresh venv: 2-5 min on 2 "
                "cores, over the suite's time budget; run with DLR_TEST_INSTALL=1",
            ),
        ),
    ],
)
def test_build_stage_install_runs_in_a_fresh_venv(tmp_path, models_dir, deps):
    """deps="fresh": every dependency is installed from scratch, as in the image.
    deps="reused": the same steps, but the fresh venv sees the test environment's third-party
    packages (so pip finds torch & co. already there and installs only this project)."""
    build, runtime = parse_stages(DOCKERFILE.read_text())[:2]
    workdir = "/"
    root = tmp_path / "image"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)

    def host(path: str) -> Path:  # an image path, inside the temporary root
        return root / path.lstrip("/")

    if deps == "reused":  # pre-create the venv (install.sh's `python3 -m venv` keeps it)
        venv_dir = host("/opt/venv")
        subprocess.run(["python3", "-m", "venv", str(venv_dir)], check=True, env=env, timeout=120)
        (site,) = venv_dir.glob("lib/python*/site-packages")
        (site / "zz_third_party.pth").write_text(str(third_party_site(tmp_path)) + "\n")

    installs = 0
    steps = [("build", k, a) for k, a in build] + [("runtime", k, a) for k, a in runtime]
    for stage, key, args in steps:
        if key == "WORKDIR":
            workdir = args
        elif key == "ENV" and stage == "build":  # (the runtime's ENV is for the server's run)
            env.update(parse_env(args))
        elif key == "COPY" and "--from=" not in args:
            *srcs, dest = [a for a in shlex.split(args) if not a.startswith("--")]
            target = host(dest if dest.startswith("/") else f"{workdir}/{dest}")
            for src in srcs:
                s = REPO / src
                if s.is_dir():
                    shutil.copytree(
                        s,
                        target,
                        # (*.whl: an offline build's wheelhouse; the venv here gets its
                        # packages as the test environment's pip is set up)
                        ignore=shutil.ignore_patterns(
                            "__pycache__", "build", "*.egg-info", "*.whl"
                        ),
                    )
                elif dest.endswith("/"):
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(s, target / s.name)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(s, target)
        elif key == "RUN" and "docker/install.sh" in args:
            installs += 1
            # absolute image paths (whole words) are mapped into the temporary root
            cmd = " ".join(str(host(w)) if w.startswith("/") else w for w in shlex.split(args))
            out = subprocess.run(
                cmd,
                shell=True,
                cwd=host(workdir),
                env=env,
                capture_output=True,
                text=True,
                timeout=850,
            )
            assert out.returncode == 0, f"RUN {args}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            assert "install.sh: ok" in out.stdout

    assert installs == 2  # the dependencies, then the project
    venv = host("/opt/venv")
    assert (venv / "bin" / "dlr-serve").is_file()
    # a regular install: the packages live in the venv, not in the source tree
    found = list(venv.glob("lib/python*/site-packages/server/static/index.html"))
    assert found, "server/static was not installed as package data"

    # run the installed server with the runtime stage's settings, then its HEALTHCHECK
    run_env = dict(env)
    for key, args in runtime:
        if key == "ENV":
            run_env.update(parse_env(args.replace("$PATH", env["PATH"])))
    port = free_port()
    run_env.update(DLR_PORT=str(port), DLR_HOST="127.0.0.1", DLR_MODELS_DIR=str(models_dir))
    run_env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [str(venv / "bin" / "dlr-serve")],
        env=run_env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        health = next(a for k, a in runtime if k == "HEALTHCHECK")
        argv = json.loads(health.split("CMD", 1)[1].strip())  # the exec-form JSON array
        argv[0] = str(venv / "bin" / argv[0])  # `python` of the image is the venv's
        assert subprocess.run(argv, env=run_env, timeout=30).returncode == 0
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
        assert page.status_code == 200 and "Live speech commands" in page.text
        assert httpx.get(f"http://127.0.0.1:{port}/pcm-worklet.js", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)
