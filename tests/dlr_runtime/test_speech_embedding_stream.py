"""The speech embedding's streaming form (dlr_runtime/speech_embedding_stream.py): each new
80 ms frame from the convolutions' cached rows, against the per-window reference.

- equal to `SpeechEmbedding.forward` of each frame's 0.78 s window in float64 to 1e-10 of the
  output scale, for one frame per call, uneven chunks and a whole stream at once; in float32
  to 1e-4 (the reference in float64);
- the zero cache is the start of a stream; the cache is smaller than the window's history;
- a model's state carries "embed_cache" and no "frame_hist"; streams at different offsets
  inside a frame in one batch, and a state moved through a snapshot mid-stream, continue
  exactly;
- no exported graph carries the cache, so ONNX refuses such a model and "auto" serves it with
  its own code.
"""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRModel, to_recurrent
from dlr_runtime.engine.snapshot import check_state, config_hash, pack, state_bounds, unpack
from dlr_runtime.export.realmath import unexportable
from dlr_runtime.model import frames_of
from dlr_runtime.speech_embedding import EMBED_DIM, EMBED_STRIDE, EMBED_WINDOW, SpeechEmbedding
from dlr_runtime.speech_embedding_stream import EmbeddingStream, cache_size
from dlr_runtime.state_spec import state_bytes

from .test_speech_embedding import F32_TOL, F64_TOL, HISTORY, config, speechlike


def run_stream(stream: EmbeddingStream, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Whole frames of x (B, n * S) in calls of `sizes` frames each, from a zero cache."""
    b = x.shape[0]
    cache = torch.zeros(b, cache_size(), dtype=x.dtype)
    outs, at = [], 0
    for n in sizes:
        frames = x[:, at * EMBED_STRIDE : (at + n) * EMBED_STRIDE].reshape(b, n, EMBED_STRIDE)
        y, cache = stream(frames, cache)
        outs.append(y)
        at += n
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize(
    "sizes", [[1] * 13, [3, 0, 5, 1, 4], [13]], ids=["frame-by-frame", "uneven", "whole"]
)
def test_stream_matches_per_window_reference_float64(sizes):
    emb = SpeechEmbedding().double()
    x = speechlike(2, EMBED_STRIDE * 13, seed=4)
    ref = emb(frames_of(x, EMBED_STRIDE, HISTORY))  # (2, 13, 96), each window on its own
    out = run_stream(EmbeddingStream(emb), x, sizes)
    assert out.shape == ref.shape == (2, 13, EMBED_DIM)
    scale = ref.abs().max()
    assert scale > 1.0
    assert float((out - ref).abs().max() / scale) < F64_TOL


def test_stream_float32_within_tolerance():
    emb64 = SpeechEmbedding().double()
    x = speechlike(3, EMBED_STRIDE * 10, seed=5)
    ref = emb64(frames_of(x, EMBED_STRIDE, HISTORY))
    out = run_stream(EmbeddingStream(SpeechEmbedding()), x.float(), [2] * 5)
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < F32_TOL


def test_zero_cache_is_a_fresh_stream_and_smaller_than_the_history():
    emb = SpeechEmbedding().double()
    stream = EmbeddingStream(emb)
    frame = speechlike(1, EMBED_STRIDE, seed=6)
    window = torch.cat([frame.new_zeros(1, HISTORY), frame], dim=1)  # (1, EMBED_WINDOW)
    y, cache = stream(frame.reshape(1, 1, EMBED_STRIDE), frame.new_zeros(1, cache_size()))
    assert float((y[0, 0] - emb(window)[0]).abs().max()) < F64_TOL * 100
    assert not torch.equal(cache, torch.zeros_like(cache))  # the frame moved the cache
    assert cache_size() < EMBED_WINDOW - EMBED_STRIDE  # 9,824 numbers against 11,232 samples


def test_state_layout_carries_the_cache_not_the_history():
    rec = to_recurrent(DLRModel(config(), seed=0).eval())
    assert "frame_hist" not in rec.spec
    assert rec.spec["embed_cache"] == ((cache_size(),), torch.float32)
    ssm = rec.spec["ssm"]
    with_hist = {"ssm": ssm, "frame_hist": ((HISTORY,), torch.float32)}
    assert state_bytes(rec.spec) < state_bytes(with_hist) + 4 * EMBED_STRIDE + 64


def test_streams_at_different_offsets_in_one_batch():
    model = DLRModel(config(), seed=2).double().eval()
    rec = to_recurrent(model, dtype=torch.complex128)
    x = speechlike(2, EMBED_STRIDE * 8, seed=7)
    with torch.no_grad():
        ref = model(x)  # (2, 8, 4)
    state = rec.init_state(2)
    _, first = rec.chunk(x[:1, :500], {k: v[:1] for k, v in state.items()})  # stream 0 ahead
    state = {k: torch.cat([first[k], state[k][1:]]) for k in state}
    outs = [[], []]
    for s in range(0, 6 * EMBED_STRIDE, EMBED_STRIDE):  # both in one call, offsets 500 and 0
        chunk = torch.stack([x[0, 500 + s : 500 + s + EMBED_STRIDE], x[1, s : s + EMBED_STRIDE]])
        y, state = rec.chunk(chunk, state)
        for i in range(2):
            outs[i].append(y[i])
    for i in range(2):
        got = torch.cat(outs[i])
        want = ref[i, : got.shape[0]]
        assert got.shape[0] >= 5
        assert float((got - want).abs().max() / ref.abs().max()) < F64_TOL


def test_state_moved_through_a_snapshot_continues_exactly():
    model = DLRModel(config(), seed=3).double().eval()
    rec = to_recurrent(model, dtype=torch.complex128)
    x = speechlike(1, EMBED_STRIDE * 7, seed=8)
    with torch.no_grad():
        ref = model(x)
    cut = 3 * EMBED_STRIDE + 77
    y1, state = rec.chunk(x[:, :cut], rec.init_state(1))
    row = {k: v[0] for k, v in state.items()}
    chash = config_hash(rec.config, row)
    got, _ = unpack(pack("m", chash, row), "m", chash, row)
    check_state(got, state_bounds(rec))
    other = to_recurrent(model, dtype=torch.complex128)  # another replica's copy
    y2, _ = other.chunk(x[:, cut:], {k: v.unsqueeze(0) for k, v in got.items()})
    out = torch.cat([y1, y2], dim=1)
    assert float((out - ref).abs().max() / ref.abs().max()) < F64_TOL
    bad = dict(got, embed_cache=torch.full_like(got["embed_cache"], float("nan")))
    with pytest.raises(ValueError, match="embed_cache"):
        check_state(bad, state_bounds(rec))


def test_no_exported_graph_and_auto_leaves_onnx_out():
    from dlr_runtime.backends.autoselect import build, default_candidates

    cfg = config()
    assert "speech-embedding" in (unexportable(cfg) or "")
    rec = to_recurrent(DLRModel(cfg, seed=0).eval())
    assert "onnx" not in default_candidates(rec)
    assert "torch" in default_candidates(rec)
    with pytest.raises(ValueError, match="speech-embedding front end"):
        build(rec, "onnx")
