"""A resume that is refused for a while (HTTP 503 + Retry-After) is retried, not given up.

Real parts only: a real `dlr-serve` process with a state directory, behind a real HAProxy that
answers 503 with `Retry-After: 1` to every request (WebSocket upgrades included) while its only
backend is down, as a load balancer does during a restart. The server is stopped (SIGTERM: it
drains and persists the session), stays down for a few seconds, and comes back on the same port;
the client's resume must ride out the 503s and its chat must equal an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from clients import AsyncChatSession
from tests.server.conftest import make_settings
from tests.server.live import LiveServer, free_port

pytestmark = pytest.mark.slow

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
DOWN_S = 3.0  # how long the backend stays down (several refused resume attempts)

CFG = """
global
    maxconn 200
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout tunnel 5m
frontend fe
    bind 127.0.0.1:{lb}
    acl no_replica nbsrv(be) eq 0
    http-request return status 503 content-type application/json hdr Retry-After 1 \
string "{{\\"error\\":{{\\"code\\":\\"unavailable\\",\\"message\\":\\"no replica up\\"}}}}" \
if no_replica
    default_backend be
backend be
    option httpchk GET /readyz
    http-check expect status 200
    server s1 127.0.0.1:{port} check inter 200ms fall 1 rise 1
"""


@pytest.fixture
def haproxy(tmp_path: Path):
    if not Path(HAPROXY).exists():
        pytest.skip("haproxy is not installed (scripts/setup.sh installs it)")
    lb, port = free_port(), free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(CFG.format(lb=lb, port=port))
    proc = subprocess.Popen(
        [HAPROXY, "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    yield f"http://127.0.0.1:{lb}", port
    proc.terminate()
    proc.wait(10)


def wait_status(url: str, status: int, timeout: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == status:
                return r
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer {status} within {timeout} s")
        time.sleep(0.05)


def test_resume_retries_through_503_until_the_server_is_back(models_dir, haproxy, tmp_path):
    lb_url, port = haproxy
    settings = make_settings(models_dir, state_dir=tmp_path / "state", resume_grace_s=60.0)
    log = tmp_path / "server.log"
    server = LiveServer(settings, process=True, port=port, log_path=log).start()
    wait_status(lb_url + "/readyz", 200)
    seen: dict[str, object] = {}

    def restart() -> None:
        server.stop()  # SIGTERM: drain, persist the session, exit
        r = wait_status(lb_url + "/readyz", 503)
        seen["retry_after"] = r.headers.get("retry-after")
        handshake = httpx.get(  # a WebSocket upgrade gets the same 503 while down
            lb_url + "/v1/generate/stream",
            headers={
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            },
            timeout=2,
        )
        seen["ws_status"] = handshake.status_code
        time.sleep(DOWN_S)
        seen["back"] = LiveServer(settings, process=True, port=port, log_path=log).start()

    async def chat(with_restart: bool) -> tuple[str, str, int]:
        async with AsyncChatSession(lb_url, resume_timeout=60.0) as c:
            first = await c.say("Hello", max_new_tokens=6, temperature=0)
            t = None
            if with_restart:
                t = threading.Thread(target=restart)
                t.start()
                await asyncio.sleep(0.5)  # the drain's going_away has closed the connection
            second = await c.say(" world", max_new_tokens=12, temperature=0)
            if t is not None:
                t.join(60)
            return first.text, second.text, c.reconnects

    try:
        ref = asyncio.run(chat(False))
        got = asyncio.run(chat(True))
    finally:
        back = seen.get("back")
        if isinstance(back, LiveServer):
            back.stop()
        server.kill()
    assert seen["ws_status"] == 503 and seen["retry_after"] == "1"
    assert got[2] >= 1  # it did resume
    assert got[:2] == ref[:2]
