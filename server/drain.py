"""Graceful drain on SIGTERM and restore at start-up (rolling restarts without lost sessions).

`drain(store)`: readiness turns off and new sessions are refused (1013 / 503); in-flight work
finishes (queued whole audio frames are processed, running generations complete, a message
being handled is completed) for at most `drain_timeout_s` (then generations are cancelled at a
batch boundary, which keeps every sampled token in the state). From then on the server is
quiesced: a client message that arrives later is held, not handled, so the state written is
the one the client is told about (its resume position, e.g. `messages_received` or the audio
received, says what was taken; the client re-sends the rest after resuming). Then every connected client gets `{"type":"going_away",...,
"resume":...}` and a close 1001. With `state_dir` set, each live session's state is written
there first, independently of the others (`<session_id>.state`, written to a temporary name,
fsynced and renamed, so a file is complete or absent; a failed write removes its temporary
file), and its client is told `resume: true` only once that succeeded; a session that could
not be written is logged by id and counted (`dlr_sessions_persisted_total{event="lost"}`),
and its client is told `resume: false`. `DrainingServer` runs the drain before uvicorn's
own shutdown closes the sockets.

With a durable state store (`DLR_STATE_STORE` dir: or redis://) every live session also gets a
last checkpoint there (`checkpoint_all`), so a restarted server, or another replica sharing
the store, resumes it when its client comes back.

`restore_dir(store)`: at start-up, every `*.state` file is restored as a detached session (same
id, same token, same replay buffer; the resume grace starts now) and removed; a file that
fails to restore is renamed to `*.state.bad` with a logged error, and the others still load.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import uvicorn

from dlr_runtime.engine import SnapshotError

from .sessions.restore import restore_blob
from .sessions.store import SessionStore

log = logging.getLogger("dlr.server")
SUFFIX = ".state"


async def _wait(pred, deadline: float) -> bool:
    while not pred():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def drain(store: SessionStore) -> int:
    """Drain the server (see the module docstring); returns the number of sessions persisted."""
    st = store.ctx
    if st.draining:
        return 0
    st.draining, st.ready = True, False
    try:
        return await _drain(store)
    finally:
        st.drained.set()  # (held connections end; their clients were told, or it failed)


async def _drain(store: SessionStore) -> int:
    st = store.ctx
    t0 = time.monotonic()
    settings = st.settings
    deadline = t0 + settings.drain_timeout_s
    scheds = [m.scheduler for m in st.models.values()]

    def settled() -> bool:
        return all(s.idle() for s in scheds) and not any(
            sess.in_turn() for sess in store.live.values()
        )

    finished = await _wait(settled, deadline)
    st.quiesced = True  # (no await since `settled`: no message is half-way in)
    live = list(store.live.values())
    if not finished:
        log.warning(
            "drain: in-flight work did not finish in %.1f s; cancelling generations",
            settings.drain_timeout_s,
        )
    for sess in live:
        sess.cancel()
    # (a prefill is not cancelled: it ends within a batch; the message handler then returns)
    await _wait(lambda: not any(s.busy() or s.in_turn() for s in live), time.monotonic() + 5)
    stored = await checkpoint_all(store)  # (first: a client may resume elsewhere at once)
    d = st.durable
    durable = d is not None and d.checkpoints and not d.writer.backlog
    root = Path(settings.state_dir) if settings.state_dir is not None else None
    if root is not None:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.error("drain: state directory %s unusable: %s", root, e)
    sessions = list(store.live.values())
    conns = {}
    for sess in sessions:  # detached first: no client message is handled from here on
        conns[sess.sid], sess.conn = sess.conn, None
    n = lost = 0
    for sess in sessions:
        # persist first, then tell the client: `resume: true` only once its state is written
        ok = durable
        if root is not None and not sess.closed:
            written = await persist(st, sess, root)
            n, ok = n + written, ok or written
        lost += not ok
        conn = conns.get(sess.sid)
        if conn is not None:
            await conn.going_away(sess.sid, ok)
    log.info(
        "drain: %d session(s) persisted, %d checkpointed to the store, %d lost, in %.2f s",
        n,
        stored,
        lost,
        time.monotonic() - t0,
    )
    return n + stored


async def persist(st, sess, root: Path) -> bool:
    """Write one session's state to `root`; False (logged, counted) when it could not be."""
    try:
        blob = await sess.export(persist=True)
        write_atomic(root / f"{sess.sid}{SUFFIX}", blob)
    except (SnapshotError, RuntimeError, OSError) as e:
        log.error("drain: session %s not persisted (it cannot resume): %s", sess.sid, e)
        st.metrics.persisted.labels("lost").inc()
        return False
    st.metrics.persisted.labels("written").inc()
    return True


async def checkpoint_all(store: SessionStore) -> int:
    """With a durable store: a last checkpoint of every live session, flushed to the store
    (any replica sharing it resumes them); returns how many were written."""
    st = store.ctx
    d = st.durable
    if d is None or not d.checkpoints:
        return 0
    n = 0
    for sess in list(store.live.values()):
        n += bool(await sess.checkpoint())
    if not await d.writer.flush(st.settings.drain_timeout_s):
        log.error("drain: %d checkpoint(s) not stored (state store down)", d.writer.backlog)
    st.metrics.persisted.labels("written").inc(n)
    return n


def write_atomic(path: Path, data: bytes) -> None:
    """`path` holds `data` completely or is left as it was; no temporary file remains."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


async def restore_dir(store: SessionStore) -> int:
    """Restore every persisted session file; returns how many were restored."""
    st = store.ctx
    if st.settings.state_dir is None:
        return 0
    root = Path(st.settings.state_dir)
    if not root.is_dir():
        return 0
    n = 0
    for path in sorted(root.glob(f"*{SUFFIX}")):
        try:
            if path.stat().st_size > st.settings.max_state_bytes:
                raise SnapshotError("file larger than max_state_bytes")
            sess = await restore_blob(store, path.read_bytes(), persisted=True)
        except Exception as e:  # noqa: BLE001  (any bad file: skip it, keep the others)
            log.error("restore: skipping %s: %s: %s", path.name, type(e).__name__, e)
            st.metrics.persisted.labels("failed").inc()
            os.replace(path, path.with_name(path.name + ".bad"))
            continue
        path.unlink()
        st.metrics.persisted.labels("restored").inc()
        log.info("restore: session %s (%s, %s)", sess.sid, sess.kind, sess.m.name)
        n += 1
    return n


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains the app (see `drain`) before closing connections."""

    def __init__(self, config: uvicorn.Config, store: SessionStore) -> None:
        super().__init__(config)
        self.store = store

    async def shutdown(self, sockets=None) -> None:
        try:
            await drain(self.store)
        except Exception:  # noqa: BLE001  (never block the shutdown itself)
            log.exception("drain failed")
        await super().shutdown(sockets)
