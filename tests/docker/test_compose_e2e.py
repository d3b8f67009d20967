"""End to end: compose.yaml built and run on a real Docker engine, traffic through HAProxy.

`docker/build-local.sh` builds every image from Debian packages and the host's wheelhouse (no
image registry is reachable here; Docker's layer cache makes a rerun quick), then
`compose.yaml` + `compose.local.yaml` start two server replicas behind HAProxy, Redis and
Prometheus (Grafana's image cannot be had offline; its files are checked statically in
test_compose_and_monitoring.py), with ports published on 127.0.0.1 only (free ports, a project
name of its own, `down -v` at the end). The tests run in file order on that one stack:

1. every container's health check passes and new sessions spread over both replicas;
2. speech streams and chat sessions through HAProxy give what an in-process server of the same
   shipped models gives (finals and generated text);
3. Prometheus finds both replicas by DNS service discovery, both targets are up, dlr_* series
   exist for each;
4. `docker kill` of one replica in the middle of speech streams and chat sessions: every
   client resumes through HAProxy on the other replica with identical outputs (needs the shared
   state store, `DLR_STATE_STORE`; skipped, saying so, on a server without that setting);
5. `docker compose restart`: sessions open across it are restored and continue identically
   (with the shared store on both replicas; without it on one replica, from the state volume).

Skipped only where no Docker engine answers (`docker/dockerd.sh start` starts one as root).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from clients import AsyncChatSession, AsyncSpeechClient
from server.app import create_app
from server.settings import Settings

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
# complex64 state: a score depends in float32 rounding on chunking and batching (see
# tests/clients/test_resume.py); a lost or repeated 10 ms of audio changes it far more
SCORE_TOL = 1e-4
SAMPLE_RATE = 16000
WORDS = ("yes", "no", "up", "down", "left", "right", "stop", "go")
CHATS = (
    ("Q: Who is Hamlet?\nA:", " And Ophelia?", " Where is Elsinore?"),
    ("First Citizen:", "\nSecond Citizen:", "\nFirst Citizen:"),
    ("To be, or not", " to be", ": that is"),
)
TOKENS = 24
# a speech stream classified this far was received past 1 s of audio, so its replica has written
# its first checkpoint (DLR_CHECKPOINT_AUDIO_S=1 below) to Redis
CHECKPOINTED_MS = 2500.0

# a cold build (no base image, no layer cache; README "Deployment") took ~10 min here
BUILD_TIMEOUT_S = 1800
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(BUILD_TIMEOUT_S + 900)]


def engine_problem() -> str | None:
    """Why no Docker engine can be used here, or None."""
    if shutil.which("docker") is None:
        return "no docker command (Debian package docker.io)"
    out = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:
        return f"no Docker engine answers (docker/dockerd.sh start): {out.stderr.strip()[:200]}"
    return None


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) where installed, else Debian's `docker-compose` (v1)."""
    ok = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    if ok.returncode == 0:
        return ["docker", "compose"]
    v1 = shutil.which("docker-compose")
    return [v1] if v1 else None


def bounded(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess[str]:
    """`cmd` in its own process group, all of it killed past `timeout` (subprocess.run kills
    only the child, and would then wait for grandchildren, e.g. `docker build`, on its pipes)."""
    p = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kw,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate(timeout=30)
        raise AssertionError(
            f"{' '.join(cmd)}: still running after {timeout:.0f} s, killed\n{out[-2000:]}{err[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_state_store() -> bool:
    return "state_store" in Settings.model_fields


NO_STORE = (
    "the server has no `state_store` setting (DLR_STATE_STORE=redis://..., the shared session "
    "store): a killed replica's sessions cannot continue on the other replica"
)


@dataclass
class Stack:
    compose: list[str]
    project: str
    env: dict[str, str]
    lb_url: str
    prom_url: str
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        cmd = [
            *self.compose,
            "-p",
            self.project,
            "-f",
            str(REPO / "compose.yaml"),
            "-f",
            str(REPO / "compose.local.yaml"),
            *args,
        ]
        out = bounded(cmd, timeout, env=self.env)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {out.returncode}\n{out.stderr[-4000:]}")
        return out.stdout

    def containers(self, service: str | None = None) -> list[str]:
        return self.run("ps", "-q", *([service] if service else [])).split()

    def wait_healthy(self, expect: int, timeout: float = 300) -> None:
        """Until `expect` containers run and every one with a health check is healthy."""
        deadline = time.monotonic() + timeout
        states: list[str] = []
        while time.monotonic() < deadline:
            ids = self.containers()
            if len(ids) >= expect:
                out = subprocess.run(
                    ["docker", "inspect", "-f", "{{.Name}} {{.RestartCount}} {{.State.Status}} "
                     "{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}", *ids],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                states = [s.split() for s in out.stdout.splitlines() if s.strip()]
                looping = [s[0] for s in states if int(s[1]) >= 3]
                assert not looping, f"restarting over and over: {looping}\n{self.logs()}"
                if out.returncode == 0 and all(
                    s[2:] in (["running", "healthy"], ["running", "none"]) for s in states
                ):
                    return
            time.sleep(2)
        raise AssertionError(f"not healthy within {timeout:.0f} s: {states}\n{self.logs()}")

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "40", check=False, timeout=60)[-8000:]

    def replica_metrics(self, cid: str) -> dict[str, float]:
        """Sum of each dlr_* sample of one replica's /metrics (read inside its container)."""
        code = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/metrics').read().decode())"
        out = subprocess.run(
            ["docker", "exec", cid, "python", "-c", code],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        sums: dict[str, float] = {}
        for fam in text_string_to_metric_families(out):
            for s in fam.samples:
                sums[s.name] = sums.get(s.name, 0.0) + s.value
        return sums

    def wait_stored(self, n: int, timeout: float = 30) -> int:
        """Until Redis holds `n` keys (at most `timeout` s); how many it holds."""
        (redis,) = self.containers("redis")
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run(
                ["docker", "exec", redis, "redis-cli", "dbsize"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            got = int(out.stdout.strip() or 0) if out.returncode == 0 else 0
            if got >= n or time.monotonic() > deadline:
                return got
            time.sleep(0.5)

    def wait_lb(self, timeout: float = 120) -> None:
        """Until HAProxy answers /readyz through a replica."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.lb_url + "/readyz", timeout=3).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(1)
        raise AssertionError(f"HAProxy did not serve /readyz within {timeout:.0f} s\n{self.logs()}")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    problem = engine_problem()
    if problem:
        pytest.skip(problem)
    compose = compose_command()
    if compose is None:
        pytest.skip("neither `docker compose` nor Debian's docker-compose is installed")
    lb_port, prom_port = free_port(), free_port()
    env = {
        **os.environ,
        "DLR_PUBLISH_ADDR": "127.0.0.1",
        "DLR_PUBLISH_PORT": str(lb_port),
        "PROMETHEUS_PUBLISH_PORT": str(prom_port),
        "GRAFANA_PUBLISH_PORT": str(free_port()),
        "DLR_GPU_PUBLISH_PORT": str(free_port()),
        "DLR_STATE_SECRET": secrets.token_hex(32),
        "DLR_REPLICAS": "2",
        # speech checkpoints every second of audio (default 5 s): the kill at CHECKPOINTED_MS
        # lands after each stream's first checkpoint, before which a crash loses a session
        "DLR_CHECKPOINT_AUDIO_S": "1",
    }
    s = Stack(
        compose,
        f"dlre2e{os.getpid()}",
        env,
        f"http://127.0.0.1:{lb_port}",
        f"http://127.0.0.1:{prom_port}",
    )
    t0 = time.monotonic()
    build = bounded(["bash", str(REPO / "docker" / "build-local.sh")], BUILD_TIMEOUT_S)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    s.timings["build_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    try:
        s.run("up", "-d", timeout=600)
        s.wait_healthy(expect=4)  # 2 servers, HAProxy, Redis, Prometheus (one may lag)
        s.wait_healthy(expect=5)
        s.wait_lb()
        s.timings["up_s"] = time.monotonic() - t0
        print(f"\ncompose e2e: build {s.timings['build_s']:.0f} s, up {s.timings['up_s']:.0f} s")
        yield s
    finally:
        if os.environ.get("DLR_E2E_KEEP") != "1":
            s.run("down", "-v", "--remove-orphans", timeout=300, check=False)


@pytest.fixture(scope="module")
def local_url() -> Iterator[str]:
    """The same shipped models served in-process (the reference run)."""
    app = create_app(Settings(models_dir=MODELS, device="cpu"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert th.is_alive() and time.monotonic() < deadline, "in-process server did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    th.join(timeout=30)


@pytest.fixture(scope="module")
def utterances() -> list[np.ndarray]:
    """Streams of spoken commands (espeak-ng, 16 kHz float32, 1 s per word), 6 s each."""
    from training.data.speech_synth import synthesize_clip

    clips = {w: synthesize_clip(w, "en-us", 160, 50) for w in WORDS}
    return [
        np.concatenate([clips[WORDS[(i + k) % len(WORDS)]] for k in range(6)]) for i in range(3)
    ]


# ------------------------------------------------------------------ workloads


@dataclass
class Outcome:
    finals: list[tuple[str, float, float]]  # speech: (label, score, audio_ms) of the final
    texts: list[str]  # chat: the text of each turn
    reconnects: int


async def speech_run(url: str, audio: np.ndarray, mark: asyncio.Event | None = None) -> Outcome:
    """Stream `audio` in real time (50 ms chunks); `mark` is set once CHECKPOINTED_MS of it
    were classified."""
    chunks = np.array_split(audio, len(audio) // 800)
    async with AsyncSpeechClient(url, resume_timeout=120, max_reconnects=5) as c:
        final = None
        last_ms = -1.0
        async for r in c.stream(chunks, sample_rate=SAMPLE_RATE, realtime=True):
            assert r.audio_ms >= last_ms, "a partial came twice or out of order"
            last_ms = r.audio_ms
            if mark is not None and r.audio_ms >= CHECKPOINTED_MS:
                mark.set()
            if r.is_final:
                final = (r.label, r.score, r.audio_ms)
        assert final is not None
        return Outcome([final], [], c.reconnects)


async def chat_run(url: str, turns: tuple[str, ...], mark: asyncio.Event | None = None,
                   go_on: asyncio.Event | None = None) -> Outcome:  # fmt: skip
    """Three greedy turns; between turn 2 and 3 `mark` is set and `go_on` awaited; the kill
    lands during turn 2's generation or before turn 3."""
    async with AsyncChatSession(url, resume_timeout=120, max_reconnects=5) as chat:
        texts = [(await chat.say(turns[0], max_new_tokens=TOKENS, temperature=0)).text]
        await chat.append(turns[1])
        pieces = []
        async for ev in chat.generate(max_new_tokens=TOKENS, temperature=0):
            pieces.append(ev.text)
            if mark is not None:
                mark.set()
        texts.append("".join(pieces))
        if go_on is not None:
            await asyncio.wait_for(go_on.wait(), 120)
        texts.append((await chat.say(turns[2], max_new_tokens=TOKENS, temperature=0)).text)
        return Outcome([], texts, chat.reconnects)


async def all_runs(url: str, utterances: list[np.ndarray], marks=None, go_on=None) -> list[Outcome]:
    marks = marks or [None] * (len(utterances) + len(CHATS))
    jobs = [speech_run(url, a, m) for a, m in zip(utterances, marks, strict=False)]
    jobs += [
        chat_run(url, t, m, go_on) for t, m in zip(CHATS, marks[len(utterances) :], strict=True)
    ]
    return list(await asyncio.wait_for(asyncio.gather(*jobs), 300))


def assert_same(got: list[Outcome], ref: list[Outcome]) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g.texts == r.texts
        for (gl, gs, gms), (rl, rs, rms) in zip(g.finals, r.finals, strict=True):
            assert gl == rl
            assert gs == pytest.approx(rs, abs=SCORE_TOL)
            assert gms == pytest.approx(rms, abs=1.0)


@pytest.fixture(scope="module")
def reference(local_url: str, utterances: list[np.ndarray]) -> list[Outcome]:
    return asyncio.run(all_runs(local_url, utterances))


# ------------------------------------------------------------------ tests


def test_stack_is_healthy_and_sessions_spread_over_both_replicas(stack: Stack):
    servers = stack.containers("server")
    assert len(servers) == 2
    assert httpx.get(stack.lb_url + "/lb-health", timeout=5).status_code == 200
    models = httpx.get(stack.lb_url + "/v1/models", timeout=10).json()
    assert {"byte-lm", "speech-commands"} <= {m["name"] for m in models["data"]}

    async def hold_sessions() -> list[float]:
        chats = [AsyncChatSession(stack.lb_url) for _ in range(4)]
        for c in chats:  # one after the other: leastconn sees each open connection
            await c.open()
        try:
            per = await asyncio.to_thread(
                lambda: [
                    stack.replica_metrics(cid).get("dlr_active_sessions", 0) for cid in servers
                ]
            )
            # each new text session is checkpointed: both replicas reach the shared Redis
            stored = await asyncio.to_thread(stack.wait_stored, 4)
            assert stored >= 4, f"{stored} session(s) in Redis, 4 open\n{stack.logs()}"
        finally:
            for c in chats:
                await c.close()
        return per

    per_replica = asyncio.run(hold_sessions())
    assert sum(per_replica) == 4 and min(per_replica) >= 1, per_replica


def test_streams_through_haproxy_equal_a_local_run(stack: Stack, reference, utterances):
    got = asyncio.run(all_runs(stack.lb_url, utterances))
    assert_same(got, reference)
    assert all(o.reconnects == 0 for o in got)
    # and plain HTTP through the balancer
    body = {"model": "byte-lm", "prompt": CHATS[0][0], "max_new_tokens": TOKENS, "temperature": 0}
    r = httpx.post(stack.lb_url + "/v1/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["text"] == reference[len(utterances)].texts[0]


def test_prometheus_discovers_and_scrapes_both_replicas(stack: Stack):
    deadline = time.monotonic() + 120
    up: list[dict] = []
    per_instance: set[str] = set()
    while time.monotonic() < deadline:
        try:
            targets = httpx.get(stack.prom_url + "/api/v1/targets", timeout=5).json()
            up = [
                t
                for t in targets["data"]["activeTargets"]
                if t["labels"]["job"] == "dlr-serve" and t["health"] == "up"
            ]
            q = 'count by (instance) ({__name__=~"dlr_.+", job="dlr-serve"})'
            res = httpx.get(
                stack.prom_url + "/api/v1/query?query=" + urllib.parse.quote(q), timeout=5
            ).json()
            per_instance = {r["metric"]["instance"] for r in res["data"]["result"]}
        except (httpx.TransportError, KeyError, json.JSONDecodeError):
            pass
        if len(up) == 2 and len(per_instance) == 2:
            break
        time.sleep(2)
    assert len(up) == 2, up
    assert per_instance == {t["labels"]["instance"] for t in up}
    assert all(t["labels"]["image"] == "cpu" for t in up)


def test_killed_replica_sessions_resume_on_the_other(stack: Stack, reference, utterances):
    if not has_state_store():
        pytest.skip(NO_STORE)
    servers = stack.containers("server")
    assert len(servers) == 2
    victim = servers[0]
    held: list[float] = []

    async def run() -> list[Outcome]:
        n = len(utterances) + len(CHATS)
        marks = [asyncio.Event() for _ in range(n)]
        go_on = asyncio.Event()
        task = asyncio.ensure_future(all_runs(stack.lb_url, utterances, marks, go_on))
        await asyncio.wait_for(asyncio.gather(*(m.wait() for m in marks)), 120)
        held.append(
            (await asyncio.to_thread(stack.replica_metrics, victim)).get("dlr_active_sessions", 0)
        )
        await asyncio.to_thread(subprocess.run, ["docker", "kill", victim], check=True, timeout=30)
        go_on.set()
        return await task

    got = asyncio.run(run())
    assert held[0] >= 1, "the killed replica held no session"
    assert_same(got, reference)
    assert sum(1 for o in got if o.reconnects > 0) >= held[0]
    stack.run("up", "-d", timeout=300)  # the killed replica comes back
    stack.wait_healthy(expect=5)


def test_sessions_are_restored_after_compose_restart(stack: Stack, reference, utterances):
    if not has_state_store():
        # without the shared store each replica restores the sessions it finds in the shared
        # state volume, and a resume may land on the other one: run this part on one replica
        stack.run("up", "-d", "--scale", "server=1", timeout=300)
        stack.wait_healthy(expect=4)
        stack.wait_lb()

    async def run() -> list[Outcome]:
        n = len(CHATS)
        marks = [asyncio.Event() for _ in range(n)]
        go_on = asyncio.Event()
        jobs = [chat_run(stack.lb_url, t, m, go_on) for t, m in zip(CHATS, marks, strict=True)]
        task = asyncio.ensure_future(asyncio.gather(*jobs))
        await asyncio.wait_for(asyncio.gather(*(m.wait() for m in marks)), 120)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(stack.run, "restart", timeout=300)
        go_on.set()
        return list(await asyncio.wait_for(task, 300))

    got = asyncio.run(run())
    ref = reference[len(utterances) :]
    assert [o.texts for o in got] == [o.texts for o in ref]
    assert all(o.reconnects >= 1 for o in got), [o.reconnects for o in got]
