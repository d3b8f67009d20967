"""The durable-session metrics a server exports (server/durable.py `update_metrics`, /metrics):
parked and live sessions, stored sessions and bytes, write and read latency, checkpoints
written, park / unpark latency; measured on a real dir: store with one text slot, so each
new session parks the previous one."""

from __future__ import annotations

import asyncio

from tests.conftest import LM_NAME
from tests.server.conftest import LiveServer, make_settings
from tests.server.hardening_help import metric
from tests.server.test_durable import SECRET, text_collect_turn
from tests.server.waits import eventually
from tests.server.wshelp import text_start


def test_parked_live_stored_bytes_and_latencies_are_exported(models_dir, tmp_path):
    settings = make_settings(
        models_dir,
        state_store=f"dir:{tmp_path / 'st'}",
        state_secret=SECRET,
        max_sessions=1,
        park_after_idle_s=0,
        parked_ram_bytes=0,  # (parked states are read back from the store)
    )
    with LiveServer(settings) as srv:
        st = srv.app.state.dlr

        async def main():
            socks = []
            for _ in range(3):  # each start parks the previous session (one slot)
                ws, _ = await text_start(srv.ws)
                await text_collect_turn(ws)
                socks.append(ws)
            await eventually(lambda: not st.durable.writer.backlog, timeout=10)
            before = await asyncio.to_thread(snapshot, srv)
            await text_collect_turn(socks[0])  # its next turn unparks it
            after = await asyncio.to_thread(snapshot, srv)
            for ws in socks:
                await ws.close()
            return before, after

        before, after = asyncio.run(main())
    assert before["parked"] == 2 and before["held"] == 3 and before["slots"] == 1
    assert before["stored"] == 3 and before["bytes"] > 3 * 1000
    assert before["write_p99"] > 0 and before["written"] >= 6 and before["parks"] >= 2
    assert after["unparks"] >= 1 and after["read_p99"] > 0
    assert after["parked"] == 2 and after["failed"] == 0


def snapshot(srv: LiveServer) -> dict[str, float]:
    return {
        "parked": metric(srv, "dlr_parked_sessions"),
        "held": metric(srv, "dlr_active_sessions", model=LM_NAME),  # (parked included)
        "slots": metric(srv, "dlr_pool_slots_in_use", model=LM_NAME),
        "stored": metric(srv, "dlr_state_store_sessions"),
        "bytes": metric(srv, "dlr_state_store_bytes"),
        "write_p99": metric(srv, "dlr_state_store_write_p99_seconds"),
        "read_p99": metric(srv, "dlr_state_store_read_p99_seconds"),
        "written": metric(srv, "dlr_checkpoints_total", event="written"),
        "parks": metric(srv, "dlr_park_seconds_count", op="park"),
        "unparks": metric(srv, "dlr_park_seconds_count", op="unpark"),
        "failed": metric(srv, "dlr_state_store_failed_calls"),
    }
