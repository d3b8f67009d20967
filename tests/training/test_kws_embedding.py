"""The kws recipe with the speech-embedding front end (`--frontend speech_embedding`): the
framing it sets, the framings it refuses, and a tiny run through the real command line whose
checkpoint streams exactly as it scores offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dlr_runtime import load_checkpoint, load_recurrent
from dlr_runtime.speech_embedding import EMBED_STRIDE, EMBED_WINDOW, SpeechEmbedding
from training.cli import main
from training.config import TrainConfig
from training.data.vocab import SC12_LABELS
from training.modelopts import ModelOptions
from training.recipes.kws import KWSOptions, KWSRecipe

from .conftest import QUIET, TINY_MODEL

SMALL = ModelOptions(d_model=8, d_state=4, n_layers=1)


def test_the_recipe_sets_the_embeddings_framing_and_no_vtlp() -> None:
    recipe = KWSRecipe(KWSOptions(frontend="speech_embedding"), SMALL, TrainConfig())
    o = recipe.opts
    assert (o.frame_stride, o.frame_window, o.vtlp) == (EMBED_STRIDE, EMBED_WINDOW, False)
    assert recipe.describe()["kws"]["frame_stride"] == EMBED_STRIDE  # the record says so
    model = recipe.build_model()
    assert isinstance(model.encoder.frontend, SpeechEmbedding) and recipe.warp is None
    # the log-mel default is untouched
    assert KWSRecipe(KWSOptions(), SMALL, TrainConfig()).opts.frame_stride == 320


@pytest.mark.parametrize("stride,window", [(640, 0), (320, 640)])
def test_another_framing_is_refused(stride: int, window: int) -> None:
    opts = KWSOptions(frontend="speech_embedding", frame_stride=stride, frame_window=window)
    with pytest.raises(ValueError, match="--frontend speech_embedding sets --frame-stride 1280"):
        KWSRecipe(opts, SMALL, TrainConfig())


def test_a_stride_that_does_not_divide_the_rate_is_still_refused_for_log_mel() -> None:
    with pytest.raises(ValueError, match="--frame-stride must divide 16000"):
        KWSRecipe(KWSOptions(frame_stride=EMBED_STRIDE), SMALL, TrainConfig())


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("espeak-ng") is None or shutil.which("flite") is None,
    reason="needs espeak-ng and flite",
)
def test_tiny_embedding_run_streams_exactly(tmp_path: Path) -> None:
    out = tmp_path / "kws"
    argv = [
        "kws", "--out-dir", str(out), "--cache-dir", str(tmp_path / "cache"), "--tiny-corpus",
        "--frontend", "speech_embedding", "--batch-size", "4", "--epoch-windows", "8",
        "--valid-clips", "16", "--valid-silence", "4", "--valid-context-s", "5", "--warmup", "1",
        "--num-workers", "0", "--workers", "1", "--steps", "2", *TINY_MODEL, *QUIET,
    ]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
    model = load_checkpoint(out / "model")
    cfg = model.config
    assert (cfg.frontend, cfg.frame_stride, cfg.frame_window) == (
        "speech_embedding", EMBED_STRIDE, EMBED_WINDOW,
    )  # fmt: skip
    assert cfg.labels == list(SC12_LABELS)
    rec = load_recurrent(out / "model")
    x = 0.1 * torch.randn(1, 16000 * 2)
    y, _ = rec.chunk(x, rec.init_state(1))
    with torch.no_grad():
        ref = model(x)
    assert y.shape == ref.shape == (1, 2 * 16000 // EMBED_STRIDE, len(SC12_LABELS))
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-4
