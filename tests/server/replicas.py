"""Two (or more) `dlr-serve` replicas sharing one Redis behind a real HAProxy, on 127.0.0.1.

`Replicas(models_dir, tmp, redis_url, n=2, **settings)` starts the replicas (subprocesses,
`tests/server/live.py`) with one `DLR_STATE_STORE` and `DLR_STATE_SECRET`, and HAProxy with
`deploy/haproxy.cfg` on a free port (`lb`). `kill(i)` (SIGKILL), `restart(i)` (same port),
`terminate(i)` (SIGTERM: drain), `wait_up(i)` (HAProxy sees it), `sessions(i)` (its
/readyz count). Used by the failover test and benchmarks/bench_durable.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from server.settings import Settings
from tests.server.live import LiveServer, free_port

ROOT = Path(__file__).resolve().parents[2]
HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"
HAPROXY_BIN = shutil.which("haproxy") or (
    "/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None
)
SECRET = "replicas-share-this-state-secret-0123"


class Replicas:
    def __init__(self, models_dir: Path, tmp: Path, redis_url: str, n: int = 2, **settings):
        base = dict(
            models_dir=models_dir,
            device="cpu",
            partial_interval_ms=0,
            log_level="info",
            state_store=redis_url,
            state_secret=SECRET,
            resume_grace_s=60,
        )
        base.update(settings)
        self.settings = Settings(**base)
        self.tmp = tmp
        self.ports = [free_port() for _ in range(n)]
        self.servers: list[LiveServer | None] = [None] * n
        self.starts = [0] * n
        self.lb_port = free_port()
        self.haproxy: subprocess.Popen | None = None

    @property
    def lb(self) -> str:
        return f"http://127.0.0.1:{self.lb_port}"

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    # ---- lifecycle
    def start(self) -> Replicas:
        for i in range(len(self.ports)):
            self.restart(i)
        env = {
            **os.environ,
            "DLR_LB_BIND": f"127.0.0.1:{self.lb_port}",
            **{f"DLR_REPLICA_{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(self.ports)},
        }
        self._hlog = open(self.tmp / "haproxy.log", "ab")  # noqa: SIM115  (closed in stop)
        self.haproxy = subprocess.Popen(
            [HAPROXY_BIN, "-db", "-f", str(HAPROXY_CFG)], env=env, stdout=self._hlog,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for i in range(len(self.ports)):
            self.wait_up(i)
        return self

    def restart(self, i: int) -> None:
        """Start replica `i` (again) on its port; returns once it is ready."""
        self.starts[i] += 1
        log = self.tmp / f"replica{i}.{self.starts[i]}.log"
        srv = LiveServer(self.settings, process=True, port=self.ports[i], log_path=log)
        self.servers[i] = srv.start()

    def kill(self, i: int) -> None:
        srv = self.servers[i]
        assert srv is not None and srv.proc is not None
        srv.proc.kill()
        srv.proc.wait(10)

    def terminate(self, i: int, timeout: float = 60) -> int | None:
        """SIGTERM (drain) and wait for the exit."""
        srv = self.servers[i]
        assert srv is not None
        return srv.stop(timeout)

    def wait_up(self, i: int, timeout: float = 30) -> None:
        """Until HAProxy's health check has replica `i` up (a request through it reaches it:
        /readyz of each replica answers the same, so check the replica itself and wait two
        check intervals)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url(i) + "/readyz", timeout=1).status_code == 200:
                    time.sleep(1.2)  # (HAProxy checks every 500 ms, rise 1)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"replica {i} not up in {timeout} s")

    def sessions(self, i: int) -> int:
        return httpx.get(self.url(i) + "/readyz", timeout=5).json()["sessions"]

    def log(self, i: int) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.tmp.glob(f"replica{i}.*.log"))
        )

    def stop(self) -> None:
        for srv in self.servers:
            if srv is not None:
                srv.kill()
        if self.haproxy is not None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(10)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
            self._hlog.close()

    def __enter__(self) -> Replicas:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
