"""Every layer kind, after training steps, converts to a recurrent form that reproduces the
training-mode network: checkpoint -> `load_recurrent` -> chunk/step == `model(x)`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlr_runtime import load_checkpoint, load_recurrent
from training.config import TrainConfig
from training.modelopts import ModelOptions
from training.recipes.lm import LMOptions, LMRecipe
from training.trainer import Trainer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("eqcorpus")
    for i in range(3):
        (folder / f"d{i}.txt").write_text(f"{i} to be or not to be, that is the question\n" * 6)
    return folder


@pytest.mark.parametrize("kind", ["dlr", "s4d", "lru"])
def test_trained_layer_kind_streams_like_its_training_forward(
    kind: str, corpus: Path, tmp_path: Path
) -> None:
    opts = LMOptions(
        text=(str(corpus),), seq_len=32, eval_tokens=64, valid_fraction=0.34, samples=0
    )
    model_opts = ModelOptions(
        d_model=16, d_state=8, n_layers=2, layer=kind, shared_lambda=kind != "lru"
    )
    train = TrainConfig(
        out_dir=str(tmp_path),
        steps=3,
        steps_per_epoch=3,
        batch_size=4,
        lr=1e-2,
        ssm_lr=1e-2,
        warmup=1,
        progress=False,
        threads=1,
    )
    Trainer(LMRecipe(opts, model_opts, train), train).run()
    ckpt = tmp_path / "model"
    model = load_checkpoint(ckpt).double().eval()
    assert model.config.layer == kind
    x = torch.randint(0, 258, (2, 40))  # longer than the training windows
    with torch.no_grad():
        expected = model(x)  # (2, 40, 258) float64, FFT convolution

    rec = load_recurrent(ckpt, dtype=torch.complex128, device="cpu", max_block=16)
    state = rec.init_state(2)
    pieces = []
    for s, e in ((0, 7), (7, 8), (8, 30), (30, 40)):  # uneven chunks, one of length 1
        y, state = rec.chunk(x[:, s:e], state)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1).double(), expected, rtol=1e-9, atol=1e-9)

    state = rec.init_state(2)
    steps = []
    for t in range(x.shape[1]):
        y, state = rec.step(x[:, t], state)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps, 1).double(), expected, rtol=1e-9, atol=1e-9)

    rec32 = load_recurrent(ckpt, dtype=torch.complex64, device="cpu")
    y32, _ = rec32.chunk(x, rec32.init_state(2))
    torch.testing.assert_close(y32.double(), expected, rtol=1e-4, atol=1e-4)
