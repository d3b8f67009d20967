"""Bookkeeping of sent audio for resumes (pure logic, no server)."""

from __future__ import annotations

import pytest

from clients.errors import ConnectionFailed
from clients.speech import MAX_RESEND_S, _Upload


async def _none():
    return
    yield


def make(rate: int = 1000) -> _Upload:
    return _Upload(_none(), "pcm_s16le", rate)  # 2000 bytes per second


def test_nothing_is_kept_without_a_resume_token():
    up = make()
    for _ in range(100):
        up.record(b"\x00" * 200, resumable=False)
    assert up.sent == 20000 and not up.unacked and up.kept == 0


def test_acknowledged_audio_is_dropped_and_resends_start_at_the_offset():
    up = make()
    for i in range(10):
        up.record(bytes([i]) * 200, resumable=True)  # 10 payloads of 0.1 s
    up.ack_ms(250)  # the server has 0.25 s = 500 bytes: payloads 0 and 1 are done
    assert up.acked == 500 and [off for off, _ in up.unacked][0] == 400
    again = up.resend_from(500)
    assert b"".join(again) == bytes([2]) * 100 + b"".join(bytes([i]) * 200 for i in range(3, 10))
    assert sum(map(len, again)) == up.sent - 500


def test_kept_audio_is_bounded_and_too_old_offsets_refuse_to_resume():
    up = make()
    chunk = int(up.bytes_per_second * 0.5)
    n = int(MAX_RESEND_S * 4)  # 2x the bound
    for _ in range(n):
        up.record(b"\x01" * chunk, resumable=True)
    assert up.kept <= up.max_kept
    assert up.kept == sum(len(d) for _, d in up.unacked)
    with pytest.raises(ConnectionFailed, match="cannot resume"):
        up.resend_from(0)
    assert up.resend_from(up.sent) == []
