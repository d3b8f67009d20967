"""The one live server of the tests: dlr-serve on a free 127.0.0.1 port.

`LiveServer(settings)` runs uvicorn (with the drain-on-shutdown server of `dlr-serve`) in a
thread of the test process: it starts in well under a second and its `app` is reachable
(context, session store, schedulers). `LiveServer(settings, process=True, log_path=...)`
runs the real `dlr-serve` command as a subprocess instead, configured through `DLR_*`
variables, for what needs a process of its own (SIGTERM, RSS, the console script itself).
Both: `http`/`url`, `ws`, `port`, `terminate()` (graceful: drain, like SIGTERM), `stop()`
(terminate and wait), and use as a context manager. Every wait has a timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from server.app import create_app
from server.cli import uvicorn_config
from server.drain import DrainingServer
from server.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_of(settings: Settings) -> dict[str, str]:
    """`DLR_*` variables that reproduce `settings` in a subprocess."""
    env = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        env[f"DLR_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


class LiveServer:
    def __init__(
        self,
        settings: Settings,
        *,
        process: bool = False,
        port: int | None = None,
        log_path: Path | None = None,
        start_timeout: float = 90.0,
    ) -> None:
        self.port = port or free_port()
        self.settings = settings.model_copy(update={"host": "127.0.0.1", "port": self.port})
        self.process, self.log_path, self.start_timeout = process, log_path, start_timeout
        self.proc: subprocess.Popen | None = None
        self.app = None
        self._log = None
        if not process:
            self.app = create_app(self.settings)
            cfg = uvicorn_config(self.app, self.settings, log_level="warning")
            self.server = DrainingServer(cfg, self.app.state.sessions)
            self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    url = http

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LiveServer:
        if self.process:
            env = {k: v for k, v in os.environ.items() if not k.startswith("DLR_")}
            env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **env_of(self.settings))
            env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2])])
            self._log = open(self.log_path or os.devnull, "ab")  # noqa: SIM115  (closed in stop)
            exe = Path(sys.executable).with_name("dlr-serve")
            self.proc = subprocess.Popen([str(exe)], env=env, stdout=self._log, stderr=self._log)
        else:
            self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"dlr-serve exited with {self.proc.returncode}: {self.log()}")
            if self.proc is None and not self.thread.is_alive():
                raise RuntimeError("the server thread ended before it was ready")
            try:
                if httpx.get(self.http + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"dlr-serve did not get ready in {self.start_timeout:g} s: {self.log()}")

    def terminate(self) -> None:
        """Begin a graceful stop (drain, then close): SIGTERM, or uvicorn's should_exit."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
        else:
            self.server.should_exit = True

    def stop(self, timeout: float = 60.0) -> int | None:
        """Terminate and wait; the subprocess's exit status (None for a thread)."""
        self.terminate()
        if self.proc is None:
            self.thread.join(timeout)
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode
        finally:
            self._close_log()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        elif self.proc is None and self.thread.is_alive():
            self.server.force_exit = self.server.should_exit = True
            self.thread.join(10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None and not self._log.closed:
            self._log.close()

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(30)

    # ------------------------------------------------------------------ process mode
    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        if self._log is not None and not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def rss_bytes(self) -> int:
        assert self.proc is not None, "RSS of a subprocess server only"
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")
