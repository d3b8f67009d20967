"""dlr-serve on a real local Ray cluster (a head and a worker node on 127.0.0.1) via Ray Serve.

Two replicas of server/ray_serve.py serve the tiny checkpoints behind Ray's HTTP proxy. Checked
for real: HTTP, SSE and both WebSockets through the proxy equal a local server; WebSocket
sessions land on both replicas (`X-DLR-Replica`); a replica actor is killed (`ray.kill`) and
Ray brings the deployment back to two replicas, which serve new sessions identically.
Resuming the sessions (Ray 2.60's proxy drops the survivors' WebSockets too) needs the shared state store
(`Settings.state_store`, DLR_STATE_STORE=redis://...): that part alone is skipped while the
server has no such setting.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

# every Ray process on the loopback address (the head would otherwise advertise the host's IP)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_SERVE_SESSION_ID_HEADER_KEY"] = "x-dlr-session-id"  # the affinity key
# Serve's controller kills a proxy whose ready check (5 s) or health checks (10 s, three in a
# row) time out; on 2 loaded cores a healthy proxy missed them (ActorDiedError in serve.start),
# so the proxy gets the same patience as the rest of the start-up.
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install -e .[ray])")

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from clients import AsyncChatSession, AsyncGenerateClient, AsyncSpeechClient  # noqa: E402
from server.settings import Settings  # noqa: E402
from tests.clients.conftest import word_wav  # noqa: E402,F401  (fixture)
from tests.server.conftest import make_settings  # noqa: E402
from tests.server.live import LiveServer, free_port  # noqa: E402

# The first test also pays for the module's cluster and deployment (one of each per module):
# on 2 loaded cores that took over 240 s in a full run (Ray's processes and the replicas'
# imports compete with the rest of the suite), so the start-up waits are bounded on their own
# (STARTUP_S, with progress on stderr) and the per-test limit leaves room for them.
STARTUP_S = 420.0
pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(STARTUP_S) + 300)]
# The cluster tests run in a pytest process of their own (test_in_a_fresh_process): in the
# full suite's process, after tests/clients had run, `ray.init` hung in its GCS client start
# (reproduced with `pytest tests/clients tests/deploy`; this module alone passes), so the
# driver gets a clean interpreter.
CHILD_ENV = "DLR_RAY_TEST_CHILD"
IN_CHILD = os.environ.get(CHILD_ENV) == "1"
in_child_only = pytest.mark.skipif(
    not IN_CHILD, reason="runs in its own process: see test_in_a_fresh_process"
)

ROOT = Path(__file__).resolve().parents[2]
STORE_MISSING = (
    "the server has no `state_store` setting (DLR_STATE_STORE=redis://..., the shared session "
    "store): the killed replica's sessions cannot continue on the other replica"
)
ROUTER = "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter"
TURNS = ("Hello", " world", " again")
# new sessions carry no session id: the router spreads them at random (hash of a request id);
# with 12, all on one of two replicas has odds of 1 in 2048
N_SESSIONS = 12


def replica_of(client) -> str:
    return client._conn._ws.response.headers["x-dlr-replica"]


def redis_url(tmp: Path) -> tuple[str, subprocess.Popen] | None:
    if not Settings.model_fields.get("state_store"):
        return None
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
        stdout=subprocess.DEVNULL,
    )
    return f"redis://127.0.0.1:{port}/0", proc


def _replica_ready(url: str) -> str | None:
    """The replica that answered /readyz with 200 through the proxy, or None."""
    try:
        r = httpx.get(url + "/readyz", timeout=5)
    except httpx.TransportError:
        return None
    return r.headers.get("x-dlr-replica") if r.status_code == 200 else None


def progress(msg: str) -> None:
    print(f"[ray test] {msg}", file=sys.stderr, flush=True)


def wait_ready(url: str, t0: float, replicas: int = 2) -> None:
    """Until `replicas` different replicas have answered /readyz through the proxy (its
    router knows them all; one replica ready first would get every new session), at most
    STARTUP_S after `t0`; the deployment's state on stderr every 15 s (pytest shows it when
    this fails)."""
    last = 0.0
    seen: set[str] = set()
    while len(seen) < replicas:
        r = _replica_ready(url)  # (the proxy may not listen yet on a loaded machine)
        if r is not None:
            seen.add(r)
        now = time.monotonic()
        if now - last >= 15:
            last = now
            try:
                app = serve.status().applications["dlr"]
                st = app.deployments["dlr"]
                state = f"{app.status} {st.status} {dict(st.replica_states)} {st.message}"
            except Exception as e:  # noqa: BLE001  (the status itself may not answer yet)
                app, state = None, f"status unavailable: {e!r}"
            progress(f"{now - t0:.0f} s: waiting for the deployment ({len(seen)} ready): {state}")
            assert app is None or app.status != "DEPLOY_FAILED", state
        assert now - t0 < STARTUP_S, (
            f"{len(seen)} of {replicas} replicas ready in {STARTUP_S:.0f} s"
        )
        time.sleep(0.05 if r is not None else 0.5)
    progress(f"deployment ready in {time.monotonic() - t0:.0f} s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head (1 CPU) + worker (2 CPUs) on 127.0.0.1, small object stores, Serve on a free port."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # no idle workers started ahead (one per CPU by default): the replicas need only their own
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    small = dict(object_store_memory=80 << 20, include_dashboard=False, node_ip_address="127.0.0.1")
    t0 = time.monotonic()
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, **small))
    c.add_node(num_cpus=2, **small)
    ray.init(address=c.address, log_to_driver=False)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    progress(f"cluster and Serve up in {time.monotonic() - t0:.0f} s")
    yield f"http://127.0.0.1:{port}", time.monotonic() - t0
    serve.shutdown()
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def deployed(cluster, models_dir, tmp_path_factory):
    from server.ray_serve import DLRDeployment

    url, _ = cluster
    tmp = tmp_path_factory.mktemp("ray")
    fields = dict(
        models_dir=str(models_dir), device="cpu", max_batch_wait_ms=2.0, resume_grace_s=60.0
    )
    redis = redis_url(tmp)
    if redis is not None:
        # one store and one signing secret for every replica (without it each replica signs
        # with a random secret of its own and rejects the others' checkpoints)
        fields["state_store"] = redis[0]
        fields["state_secret"] = secrets.token_hex(32)
    t0 = time.monotonic()
    # not serve.run: it waits for the application without a time limit; the wait is ours
    serve._run(
        DLRDeployment.options(
            num_replicas=2,
            ray_actor_options={"num_cpus": 0.5},
            request_router_config={"request_router_class": ROUTER},
        ).bind(fields),
        name="dlr",
        route_prefix="/",
        _blocking=False,
    )
    wait_ready(url, t0)
    yield url, time.monotonic() - t0
    if redis is not None:
        redis[1].terminate()


def wait_dead(actor, timeout: float = 60.0) -> None:
    """Until calls to `actor` fail because it died (at most `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        assert time.monotonic() < deadline, f"the killed replica still answers after {timeout} s"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def local(models_dir):
    """The same models on a plain local server: the reference outputs."""
    with LiveServer(make_settings(models_dir)) as srv:
        yield srv.url


async def chat_turns(
    url: str, turns=TURNS, hold: asyncio.Event | None = None, out: list | None = None
):
    """Greedy turns in one session; `out[-1]` gets the replica of the first turn (each
    caller passes a list of its own: the replicas of concurrent sessions arrive out of order)."""
    async with AsyncChatSession(url, resume_timeout=30.0) as c:
        texts = [(await c.say(turns[0], max_new_tokens=8, temperature=0)).text]
        if out is not None:
            out.append(replica_of(c))
        if hold is not None:
            await hold.wait()
        for t in turns[1:]:
            texts.append((await c.say(t, max_new_tokens=8, temperature=0)).text)
        return texts, c.reconnects


async def speech_and_http(url: str, audio: np.ndarray):
    async with AsyncSpeechClient(url) as s:
        results = [r async for r in s.stream(np.array_split(audio, 20), sample_rate=16000)]
    async with AsyncGenerateClient(url) as g:
        whole = await g.generate("The", max_new_tokens=10, temperature=0)
        pieces = [e.text async for e in g.generate_stream("The", max_new_tokens=10, temperature=0)]
    final = results[-1]
    return final.label, round(final.score, 4), whole.text, "".join(pieces)


@in_child_only
def test_http_sse_and_websockets_through_ray_equal_a_local_server(
    deployed,
    local,
    word_wav,  # noqa: F811  (the fixture imported above)
):
    import soundfile as sf

    url, _ = deployed
    audio, _sr = sf.read(word_wav, dtype="float32")
    assert asyncio.run(speech_and_http(url, audio)) == asyncio.run(speech_and_http(local, audio))
    assert asyncio.run(chat_turns(url))[0] == asyncio.run(chat_turns(local))[0]


@in_child_only
def test_requests_naming_a_session_stick_to_one_replica(deployed):
    url, _ = deployed
    seen: dict[str, set[str]] = {}
    # 32 ids: the ring (100 virtual nodes per replica) splits them roughly evenly; all on one
    # of two replicas has odds below 1e-6 (with 8 ids it was ~1 %, and it happened once in CI)
    for i in range(32):
        sid = f"{i:032x}"
        for _ in range(3):
            r = httpx.get(url + "/v1/models", headers={"X-DLR-Session-Id": sid}, timeout=10)
            seen.setdefault(sid, set()).add(r.headers["x-dlr-replica"])
    assert all(len(v) == 1 for v in seen.values()), seen
    assert len(set().union(*seen.values())) == 2, seen  # different ids, different replicas


@in_child_only
def test_sessions_spread_over_two_replicas_and_survive_one_killed(deployed, local, cluster):
    url, deploy_s = deployed
    ref = asyncio.run(chat_turns(local))[0]
    killed: dict[str, object] = {}

    async def run():
        hold = asyncio.Event()
        outs: list[list[str]] = [[] for _ in range(N_SESSIONS)]  # each session's replica
        tasks = [asyncio.create_task(chat_turns(url, hold=hold, out=o)) for o in outs]
        deadline = time.monotonic() + 60
        while not all(outs):
            assert time.monotonic() < deadline, "sessions did not start"
            await asyncio.sleep(0.05)
        out = [o[0] for o in outs]
        replicas = set(out)
        killed["replicas"] = replicas
        victim = sorted(replicas)[0]
        killed["victim"] = victim
        killed["on_victim"] = sum(r == victim for r in out)
        names = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and victim in a["name"]
        ]
        assert len(names) == 1, names
        actor = ray.get_actor(names[0], namespace="serve")
        ray.kill(actor, no_restart=True)
        killed["at"] = time.monotonic()
        # ray.kill returns before the actor is dead: a session let go on at once could finish
        # its turns on the victim before it dies, and never need the other replica
        await asyncio.to_thread(wait_dead, actor)
        hold.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return list(zip(out, results, strict=True))

    got = asyncio.run(run())
    assert len(killed["replicas"]) == 2, f"all sessions on one replica: {killed['replicas']}"
    # Observed with Ray 2.60: killing one replica also drops the WebSocket connections that the
    # proxy held to the other replica, so every session resumes (and may land anywhere): without
    # the shared store only the deployment's recovery can be checked here.
    # the deployment is back to two healthy replicas and serves new sessions
    deadline = time.monotonic() + 120
    while True:
        st = serve.status().applications["dlr"].deployments["dlr"]
        if st.status == "HEALTHY" and st.replica_states.get("RUNNING", 0) == 2:
            break
        assert time.monotonic() < deadline, f"not back to 2 replicas: {st}"
        time.sleep(0.5)
    print(f"deploy {deploy_s:.1f} s, replacement {time.monotonic() - killed['at']:.1f} s")
    assert asyncio.run(chat_turns(url))[0] == ref
    if not Settings.model_fields.get("state_store"):
        pytest.skip(STORE_MISSING)
    for r, res in got:
        assert not isinstance(res, BaseException), (r, res)
        assert res[0] == ref, (r, res)
    assert all(res[1] >= 1 for r, res in got if r == killed["victim"]), (
        killed,
        [(r, res[1]) for r, res in got],
    )


@pytest.mark.skipif(IN_CHILD, reason="(the child process runs the cluster tests themselves)")
@pytest.mark.timeout(int(STARTUP_S) + 900)
def test_in_a_fresh_process() -> None:
    """This module's cluster tests, in a new pytest process (see CHILD_ENV); its output is
    shown when they fail."""
    env = {**os.environ, CHILD_ENV: "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-rs"]
    cmd += ["-k", "not test_in_a_fresh_process"]
    out = subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=STARTUP_S + 840
    )
    report = out.stdout[-6000:] + out.stderr[-6000:]
    assert out.returncode == 0, report
    assert re.search(r"\b3 passed\b", out.stdout) and "skipped" not in out.stdout, report
