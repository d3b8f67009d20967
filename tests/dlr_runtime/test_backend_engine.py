"""The engine gives the same results whichever backend `make_backend` returns."""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine

# each backend built and exported (ONNX) per test: full suite only
pytestmark = pytest.mark.slow

TOKENIZER = {"tokenizer": {"type": "bytes", "bos": 256, "eos": 257, "vocab_size": 258}}


def engines(cfg: DLRConfig) -> tuple[Engine, Engine]:
    rec = to_recurrent(DLRModel(cfg, seed=0).eval(), dtype=torch.complex64)
    meta = TOKENIZER if cfg.encoder == "tokens" else None
    torch_eng = Engine(make_backend(rec, "torch"), "m", max_sessions=4, metadata=meta)
    onnx_eng = Engine(make_backend(rec, "onnx"), "m", max_sessions=4, metadata=meta)
    return torch_eng, onnx_eng


def test_lm_prefill_and_decode_match() -> None:
    cfg = DLRConfig.preset("tiny-lm", init="omega")
    a, b = engines(cfg)
    assert (a.backend.name, b.backend.name) == ("torch", "onnx")
    sa, sb = [a.open(), a.open()], [b.open(), b.open()]
    prompts = [list(b"hello there"), list(b"a much longer prompt than the other one")]
    torch.testing.assert_close(b.prefill(sb, prompts), a.prefill(sa, prompts), rtol=0, atol=1e-4)
    for tok in (10, 200, 33):
        ya, yb = a.decode(sa, [tok, tok]), b.decode(sb, [tok, tok])
        torch.testing.assert_close(yb, ya, rtol=0, atol=1e-4)


def same_audio_results(a: Engine, b: Engine, atol: float) -> tuple[list[int], list[int]]:
    """Two streams through both engines in chunks cut mid-frame: every result and the final
    scores agree to `atol`. Returns the slots (a's, b's)."""
    sa, sb = [a.open(), a.open()], [b.open(), b.open()]
    g = torch.Generator().manual_seed(0)
    for n in (100, 100, 37, 400):
        chunks = [0.1 * torch.randn(n, generator=g) for _ in range(2)]
        for ya, yb in zip(a.feed_audio(sa, chunks), b.feed_audio(sb, chunks), strict=True):
            torch.testing.assert_close(yb, ya, rtol=0, atol=atol)
    torch.testing.assert_close(b.scores(sb), a.scores(sa), rtol=0, atol=atol)
    return sa, sb


def test_audio_matches() -> None:
    cfg = DLRConfig.preset("tiny-speech", labels=["yes", "no", "up"], frame_stride=40)
    same_audio_results(*engines(cfg), atol=1e-4)


@pytest.mark.parametrize(
    "over",
    [{}, {"frontend": "logmel", "n_mels": 8, "pool_window_s": 0.05, "feature_norm_s": 0.2}],
    ids=["running-mean", "window-feature-norm"],
)
def test_snapshots_move_between_backends(over) -> None:
    """A session snapshotted on an ONNX engine continues on a torch engine (and back) exactly
    as if it had stayed: snapshots always hold the torch state layout. With an exponential
    window and feature normalisation the counts are decayed weights, which the ONNX engine
    (no torch form to derive bounds from) checks against its config's bounds."""
    cfg = DLRConfig.preset("tiny-speech", labels=["yes", "no", "up"], frame_stride=40, **over)
    a, b = engines(cfg)
    assert a.config_hash == b.config_hash
    g = torch.Generator().manual_seed(1)
    first, second = 0.1 * torch.randn(130, generator=g), 0.1 * torch.randn(170, generator=g)
    sa, sb = a.open(), b.open()
    a.feed_audio([sa], [first])
    b.feed_audio([sb], [first])
    from_onnx, from_torch = b.snapshot(sb), a.snapshot(sa)
    ta, tb = a.open(), b.open()
    a.restore(ta, from_onnx)  # onnx -> torch
    b.restore(tb, from_torch)  # torch -> onnx
    want = a.feed_audio([sa], [second])[0]  # the session that never moved
    torch.testing.assert_close(a.feed_audio([ta], [second])[0], want, rtol=0, atol=1e-4)
    torch.testing.assert_close(b.feed_audio([tb], [second])[0], want, rtol=0, atol=1e-4)


def test_auto_picks_a_working_backend_by_measuring() -> None:
    rec = to_recurrent(DLRModel(DLRConfig.preset("micro-lm", n_layers=1, vocab_size=258), seed=0))
    backend = make_backend(rec, "auto")
    assert backend.name in ("torch", "fused", "onnx")
    y, _ = backend.step(torch.tensor([1, 2]), backend.init_state(2))
    want, _ = rec.step(torch.tensor([1, 2]), rec.init_state(2))
    torch.testing.assert_close(y, want, rtol=0, atol=1e-4)
