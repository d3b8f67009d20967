"""benchmarks/profile_server.py folds py-spy's collapsed stacks into layers and top functions."""

from __future__ import annotations

from benchmarks.profile_server import fold

RAW = "\n".join(
    [
        "process 1:python;thread (0x1): MainThread;run (asyncio/base_events.py:600);"
        "send (websockets/protocol.py:10);dumps (json/__init__.py:231) 3",
        "process 1:python;thread (0x2): engine;_execute (/repo/server/scheduler.py:90);"
        "chunk (/repo/dlr_runtime/recurrent.py:50);einsum (torch/functional.py:400) 5",
        "process 1:python;thread (0x1): MainThread;run (asyncio/base_events.py:600) 2",
        "garbage line without a count",
    ]
)


def test_fold_assigns_each_sample_to_its_innermost_known_layer() -> None:
    prof = fold(RAW)
    assert prof.samples == 10
    assert prof.layers["JSON encode/decode"] == 3  # inside websockets' send, JSON is innermost
    assert prof.layers["torch (outside dlr_runtime)"] == 5
    assert prof.layers["asyncio event loop"] == 2
    assert prof.self_time["einsum (torch/functional.py)"] == 5
    assert prof.inclusive["run (asyncio/base_events.py)"] == 5  # counted once per sample
