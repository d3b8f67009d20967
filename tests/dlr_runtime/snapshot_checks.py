"""Snapshot checks shared by the tests of front ends with a state (feature norm, PCEN)."""

from __future__ import annotations

import pytest
import torch

from dlr_runtime.engine import Engine
from dlr_runtime.engine.snapshot import SnapshotError


def mid_frame_round_trip(eng: Engine, count: str) -> int:
    """A session fed 1,250 samples at a 160-sample stride (7 frames done, 130 samples wait),
    snapshotted and restored into another, continues bitwise; returns the first session."""
    x = torch.randn(4000, generator=torch.Generator().manual_seed(4)) * 0.3
    a = eng.open()
    eng.feed_audio([a], [x[:1250]])
    assert float(eng.pool.row(a)[count]) > 1
    blob = eng.snapshot(a)
    ya = eng.feed_audio([a], [x[1250:]])[0]
    b = eng.open()
    eng.restore(b, blob)
    yb = eng.feed_audio([b], [x[1250:]])[0]
    assert torch.equal(ya, yb) and ya.shape[0] == 18  # 25 frames in all
    return a


def refuses_bad_values(eng: Engine, sid: int, bad: tuple[tuple[str, float], ...]) -> None:
    """Each (state tensor, value) written into session `sid` makes its snapshot unrestorable,
    with an error that names the tensor."""
    for name, value in bad:
        row = eng.pool.row(sid)
        keep = row[name].clone()
        row[name].view(-1)[0] = value
        with pytest.raises(SnapshotError, match=name):
            eng.restore(eng.open(), eng.snapshot(sid))
        row[name].copy_(keep)
