"""Several server processes on one port (`DLR_WORKERS` > 1): each its own event loop and engines.

One event loop is where a loaded server spends its time (benchmarks/profile_server.py: most
of the GIL is held by per-message work on the loop thread), so a many-core host runs several
workers. Each worker binds the port itself with `SO_REUSEPORT`, so the kernel spreads new
connections over the workers; nothing is shared between them but the state store. That is
why more than one worker needs a store shared between processes (`DLR_STATE_STORE=redis://`):
a session lives on the connection that opened it, and a resume that lands on another worker
continues from the store exactly as it would on another replica. The supervisor (this
process) binds the port first (so port 0 resolves once and the port stays taken while a
worker restarts), generates one state secret for all workers when none is set, restarts a
worker that dies, and forwards SIGTERM/SIGINT so every worker drains.

Metrics are per worker: a scrape through the shared port reaches one of them. Scrape
replicas (docker compose, Ray Serve) for whole-server series, or run one worker per replica.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

from .settings import Settings

log = logging.getLogger("dlr.server")

RESTART_DELAY_S = 1.0
Serve = Callable[[Settings, list[socket.socket]], None]  # runs one server on given sockets


def check(settings: Settings) -> None:
    """Raise ValueError when `settings` cannot run with several workers."""
    if settings.workers > 1 and not settings.state_store.startswith("redis"):
        raise ValueError(
            "workers > 1 needs a state store shared between processes (DLR_STATE_STORE="
            "redis://HOST:PORT/DB; memory is per process and dir: has one owner process): a "
            "resumed session may reach another worker"
        )
    if settings.workers > 1 and settings.state_dir is not None:
        raise ValueError(
            "state_dir is per process; with workers > 1 sessions are kept in the state store"
        )


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT (not yet listening)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _drain_when_orphaned(parent: int) -> None:
    """SIGTERM this worker (a drain) once the supervisor is gone, e.g. SIGKILLed."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _worker(values: dict[str, Any], index: int, serve: Serve, parent: int) -> None:
    """One worker process: its own app, engines and listening socket on the shared port."""
    os.setpgrp()  # a terminal's Ctrl-C reaches the supervisor only; it forwards one SIGTERM
    settings = Settings(**values)
    logging.basicConfig(
        level=settings.log_level.upper(), format=f"%(asctime)s w{index} %(name)s %(message)s"
    )
    threading.Thread(target=_drain_when_orphaned, args=(parent,), daemon=True).start()
    sock = reuseport_socket(settings.host, settings.port)
    sock.listen(2048)
    serve(settings, [sock])


def run(settings: Settings, serve: Serve) -> int:
    """Supervise `settings.workers` processes, each running `serve` (a module-level function:
    it is pickled by name into the spawned worker) until SIGTERM/SIGINT; the exit status."""
    check(settings)
    holder = reuseport_socket(settings.host, settings.port)  # resolves port 0, holds the port
    port = holder.getsockname()[1]
    if not settings.state_secret:
        secret = secrets.token_hex(32)
        os.environ["DLR_STATE_SECRET"] = secret  # (the workers' signer reads the environment)
        log.warning(
            "DLR_STATE_SECRET is not set: generated one for this server's workers; states "
            "verify only on this server (set the same secret on every replica)"
        )
        settings = settings.model_copy(update={"state_secret": secret})
    values = settings.model_dump() | {"port": port}
    ctx = mp.get_context("spawn")
    workers: dict[int, BaseProcess] = {}
    stopping = False

    def start(i: int) -> None:
        p = ctx.Process(
            target=_worker, args=(values, i, serve, os.getpid()), name=f"dlr-worker-{i}"
        )
        p.start()
        workers[i] = p
        log.info("worker %d started (pid %s) on port %d", i, p.pid, port)

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in workers.values():
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)  # each drains its sessions

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i in range(settings.workers):
        start(i)
    try:
        while not stopping:
            time.sleep(0.2)
            for i, p in list(workers.items()):
                if not p.is_alive() and not stopping:
                    log.error("worker %d exited with %s; restarting it", i, p.exitcode)
                    time.sleep(RESTART_DELAY_S)
                    start(i)
        deadline = time.monotonic() + settings.drain_timeout_s + 15
        for p in workers.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.error("worker %s did not stop in time; killing it", p.name)
                p.kill()
                p.join(5)
    finally:
        holder.close()
    # (uvicorn re-raises the SIGTERM it handled once it has shut down: that end is clean too)
    clean = (0, -signal.SIGTERM)
    return 0 if all(p.exitcode in clean for p in workers.values()) else 1
