"""Snapshot/restore tests: round trip continues exactly, and bad blobs are refused clearly."""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, SnapshotError
from dlr_runtime.engine.snapshot import MAGIC, read_header
from tests.conftest import LM_NAME, SPEECH_NAME


@pytest.fixture(scope="module")
def engines(models_dir):
    lm = load_recurrent(models_dir / LM_NAME)
    sp = load_recurrent(models_dir / SPEECH_NAME)
    return (
        Engine(make_backend(lm, "torch"), LM_NAME, 4, metadata=lm.checkpoint_metadata),
        Engine(make_backend(sp, "torch"), SPEECH_NAME, 4),
    )


def test_lm_snapshot_restore_continues_bitwise(engines):
    eng, _ = engines
    a = eng.open()
    eng.prefill([a], [list(b"a conversation so far")])
    blob = eng.snapshot(a, extra={"pending": [12]})
    assert blob.startswith(MAGIC)
    assert read_header(blob)["model"] == LM_NAME
    cont_a = eng.decode([a], [ord("!")])[0]
    b = eng.open()
    assert eng.restore(b, blob) == {"pending": [12]}
    cont_b = eng.decode([b], [ord("!")])[0]
    assert torch.equal(cont_a, cont_b)
    eng.close(a)
    eng.close(b)


def test_speech_snapshot_mid_frame(engines):
    _, eng = engines
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    a = eng.open()
    eng.feed_audio([a], [x[:250]])  # 90 samples wait inside a frame
    blob = eng.snapshot(a)
    ya = eng.feed_audio([a], [x[250:]])[0]
    b = eng.open()
    eng.restore(b, blob)
    assert eng.pending_in_frame(b) == 90
    yb = eng.feed_audio([b], [x[250:]])[0]
    assert torch.equal(ya, yb)
    eng.close(a)
    eng.close(b)


def test_bad_blobs_refused(engines):
    lm, sp = engines
    a = lm.open()
    blob = lm.snapshot(a)
    with pytest.raises(SnapshotError, match="modified"):
        tampered = bytearray(blob)
        tampered[len(tampered) // 2] ^= 1
        lm.restore(a, bytes(tampered))
    with pytest.raises(SnapshotError, match="magic"):
        lm.restore(a, b"garbage")
    with pytest.raises(SnapshotError, match="version"):
        lm.restore(a, blob[:8] + b"\x09" + blob[9:])
    with pytest.raises(SnapshotError, match="truncated|modified|short"):
        lm.restore(a, blob[:-5])
    s = sp.open()
    with pytest.raises(SnapshotError, match="for model"):
        sp.restore(s, blob)
    lm.close(a)
    sp.close(s)


def test_well_formed_blobs_with_impossible_values_refused(engines):
    """A blob with a valid digest (anyone can recompute sha256) but values no run produces is
    refused, so it can never fail the batches it would join."""
    from dlr_runtime.engine import snapshot as snap

    _, eng = engines
    a = eng.open()
    row = {k: v.clone() for k, v in eng.pool.row(a).items()}
    bad_rows = []
    r = {k: v.clone() for k, v in row.items()}
    r["ssm"].view(-1)[0] = complex(float("nan"), 0)
    bad_rows.append((r, "non-finite"))
    r = {k: v.clone() for k, v in row.items()}
    r["frame_fill"].fill_(eng.config.frame_stride)
    bad_rows.append((r, "frame_fill"))
    r = {k: v.clone() for k, v in row.items()}
    r["mean_count"].fill_(-1)
    bad_rows.append((r, "mean_count"))
    for r, why in bad_rows:
        blob = snap.pack(eng.name, eng.config_hash, r)
        with pytest.raises(SnapshotError, match=why):
            eng.restore(a, blob)
    eng.close(a)


def test_weights_hash_ties_blobs_to_the_weights(models_dir, engines):
    _, eng = engines
    sp = load_recurrent(models_dir / SPEECH_NAME)
    other = Engine(make_backend(sp, "torch"), SPEECH_NAME, 2, weights_hash="other weights")
    assert other.config_hash != eng.config_hash
    a = eng.open()
    blob = eng.snapshot(a)
    b = other.open()
    with pytest.raises(SnapshotError, match="different config"):
        other.restore(b, blob)
    eng.close(a)


def test_resampler_state_round_trip_continues_exactly():
    from dlr_runtime.engine import StreamResampler

    x = torch.randn(44100)  # (L,) 1 s at 44.1 kHz
    whole = StreamResampler(44100, 16000)
    out_a = [whole.push(x[:10007]), whole.push(x[10007:])]
    first = StreamResampler(44100, 16000)
    head = first.push(x[:10007])
    moved = StreamResampler.from_state(first.state_dict())
    out_b = [head, moved.push(x[10007:])]
    assert torch.equal(torch.cat(out_a), torch.cat(out_b))
    assert torch.equal(whole.flush(), moved.flush())
    with pytest.raises(ValueError):
        StreamResampler.from_state({"orig": 44100})
