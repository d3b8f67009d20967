"""Snapshot/restore tests: round trip continues exactly, and bad blobs are refused clearly."""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, load_recurrent, save_checkpoint
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, SnapshotError
from dlr_runtime.engine.snapshot import MAGIC, read_header
from tests.conftest import LM_NAME, SPEECH_NAME
from tests.server.hardening_help import set_field


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


def test_speech_snapshot_with_overlapping_windows(tmp_path):
    """A model whose frames see the samples before them keeps that history in the snapshot:
    restored mid-frame, it continues bitwise; a history holding impossible samples is refused."""
    cfg = DLRConfig.preset("tiny-speech", frontend="logmel", n_mels=8, frame_window=400)
    save_checkpoint(DLRModel(cfg, seed=0), tmp_path / "w")
    rec = load_recurrent(tmp_path / "w")
    eng = Engine(make_backend(rec, "torch"), "windowed", 2)
    x = torch.randn(2000, generator=torch.Generator().manual_seed(4)) * 0.3
    a = eng.open()
    eng.feed_audio([a], [x[:1250]])  # 7 frames done, 130 samples wait, history non-zero
    assert float(eng.pool.row(a)["frame_hist"].abs().sum()) > 0
    blob = eng.snapshot(a)
    ya = eng.feed_audio([a], [x[1250:]])[0]
    b = eng.open()
    eng.restore(b, blob)
    yb = eng.feed_audio([b], [x[1250:]])[0]
    assert torch.equal(ya, yb) and ya.shape[0] == 5
    eng.close(b)
    bad = eng.pool.row(a)
    bad["frame_hist"][0] = 1e30
    with pytest.raises(SnapshotError, match="frame_hist"):
        eng.restore(eng.open(), eng.snapshot(a))


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


# ---------------------------------------------------------------------- crafted headers
def craft(blob: bytes, mutate=None, raw: bytes | None = None) -> bytes:
    """`blob` with its header changed and a valid digest (anyone can recompute a sha256)."""
    from tests.server.hardening_help import craft as craft_blob

    return craft_blob(blob, header=mutate, raw_header=raw)


SPEECH_EXTRA = {
    "kind": "speech",
    "start": {"type": "start", "sample_rate": 44100},
    "consumed": 10,
    "bytes_received": 20,
    "buffered": "",
}


@pytest.mark.parametrize(
    "path,value,field",
    [
        ("extra.appended", float("inf"), "appended"),
        ("extra.consumed", -1, "consumed"),
        ("extra.consumed", "10", "consumed"),
        ("extra.consumed", 1e300, "consumed"),
        ("extra.bytes_received", True, "bytes_received"),
        ("extra.start.sample_rate", 10**9, "sample_rate"),
        ("extra.start.sample_rate", 16000.5, "sample_rate"),
        ("extra.resampler", {"orig": "x"}, "resampler"),
        ("extra.session_id", "../escaped", "session_id"),
        ("extra.pending", [1, -2], "pending"),
        ("tensors", "not a list", "tensors"),
        ("tensors.0.offset", -8, "offset"),
        ("tensors.0.offset", 10**12, "tensors.0"),
        ("tensors.0.nbytes", 3, "nbytes"),
        ("tensors.0.dtype", "object", "dtype"),
        ("model", 7, "model"),
        ("config_hash", ["x"], "config_hash"),
    ],
)
def test_every_header_field_is_validated(engines, path, value, field):
    from dlr_runtime.engine.snapshot import InvalidHeader

    _, eng = engines
    a = eng.open()
    blob = eng.snapshot(a, extra=dict(SPEECH_EXTRA))
    eng.close(a)
    bad = craft(blob, set_field(path, value))
    with pytest.raises(InvalidHeader, match=field):
        read_header(bad)


def test_non_standard_json_and_deep_nesting_are_refused(engines):
    from dlr_runtime.engine.snapshot import InvalidHeader

    _, eng = engines
    a = eng.open()
    blob = eng.snapshot(a, extra={"kind": "speech"})
    eng.close(a)
    text = read_header(blob)
    assert text["extra"] == {"kind": "speech"}
    for raw, why in [
        (b'{"model": NaN}', "model holds nan, which is not plain JSON"),
        (b'{"extra": {"x": [1, -Infinity]}}', "extra.x.1 holds -inf"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        (b'{"a": ' * 40 + b"1" + b"}" * 40, "nested deeper"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
    ]:
        with pytest.raises(InvalidHeader, match=why):
            read_header(craft(blob, raw=raw))


# ---------------------------------------------------------------------- reachable states
def test_huge_finite_state_is_refused_naming_the_field(engines):
    from dlr_runtime.engine.snapshot import StateOutOfRange, pack

    lm, _ = engines
    a = lm.open()
    row = {k: v.clone() for k, v in lm.pool.row(a).items()}
    row["ssm"].view(-1)[3] = complex(3e38, 0)
    with pytest.raises(StateOutOfRange, match="'ssm'.*beyond what this model reaches"):
        lm.restore(a, pack(lm.name, lm.config_hash, row))
    lm.close(a)


def test_states_real_runs_reach_are_within_the_bound(engines):
    """Adversarial but legal inputs (random bytes for 3000 steps; full-scale noise and a
    clipped square wave for 4 s of audio) stay inside the bound, so no real export is refused;
    the bound is far below 3e38."""
    from dlr_runtime.engine.snapshot import check_state

    lm, sp = engines
    g = torch.Generator().manual_seed(5)
    a = lm.open()
    toks = torch.randint(0, 256, (3000,), generator=g).tolist()
    lm.prefill([a], [toks])
    for t in toks[:300]:
        lm.decode([a], [t])
    row = lm.pool.row(a)
    check_state(row, lm._bounds)
    ratio = (row["ssm"].abs() / lm._bounds["ssm"]).max().item()
    assert ratio < 1  # (measured well below: the bound has a 4x margin and assumes worst phase)
    assert lm._bounds["ssm"].max() < 1e12
    lm.blob = lm.snapshot(a)
    b = lm.open()
    lm.restore(b, lm.blob)
    lm.close(a)
    lm.close(b)
    s = sp.open()
    noise = torch.rand(32000, generator=g) * 2 - 1
    square = torch.sign(torch.sin(torch.arange(32000) * 0.05))
    sp.feed_audio([s], [torch.cat([noise, square]) * 1.0])
    check_state(sp.pool.row(s), sp._bounds)
    sp.restore(s, sp.snapshot(s))
    sp.close(s)


def test_without_model_bounds_the_generic_cap_applies():
    """A backend that does not expose the torch form (ONNX) still refuses huge states."""
    from dlr_runtime.engine.snapshot import STATE_ABS_CAP, StateOutOfRange, check_state

    row = {"ssm": torch.zeros(2, 4, 3, dtype=torch.complex64)}
    check_state(row, None)
    row["ssm"][1, 2, 0] = complex(3e38, 0)
    with pytest.raises(StateOutOfRange, match="'ssm'"):
        check_state(row, None)
    row["ssm"][1, 2, 0] = complex(STATE_ABS_CAP / 2, 0)
    check_state(row, None)
