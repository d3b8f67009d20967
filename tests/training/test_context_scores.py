"""Valid clips scored after a stream's worth of context: the same as the offline forward of
the context and the clip joined (the recurrent form carries the state across)."""

from __future__ import annotations

import torch

from dlr_runtime import DLRConfig, DLRModel
from training.streams import scores_after_context


def _model(**kw) -> DLRModel:
    cfg = DLRConfig(
        d_model=12, d_state=8, n_layers=2, encoder="audio", decoder="classifier",
        labels=["a", "b", "c", "d"], frame_stride=320, frontend="logmel", n_mels=16,
        pool_window_s=0.3, **kw,
    )  # fmt: skip
    return DLRModel(cfg, seed=4).eval()


def test_scores_after_context_equal_the_offline_forward_of_context_and_clip_joined():
    model = _model()
    g = torch.Generator().manual_seed(0)
    context = 0.1 * torch.randn(320 * 150, generator=g)  # 3 s
    clips = 0.1 * torch.randn(5, 320 * 40, generator=g)
    after = scores_after_context(model, context, clips, batch=2)
    with torch.no_grad():
        joined = torch.cat([context.expand(5, -1), clips], dim=1)
        offline = model(joined)[:, -1]  # (5, C)
        fresh = model(clips)[:, -1]
    # complex64 state against the float32 offline FFT form: stated tolerance 1e-4 of the scale
    scale = float(offline.abs().max())
    assert float((after - offline).abs().max()) < 1e-4 * scale
    assert float((after - fresh).abs().max()) > 1e-3 * scale  # the context does matter
    assert model.training is False


def test_the_model_keeps_its_training_mode():
    model = _model().train()
    scores_after_context(model, torch.zeros(640), torch.zeros(2, 640))
    assert model.training
