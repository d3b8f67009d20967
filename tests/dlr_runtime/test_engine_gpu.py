"""The engine on a CUDA device: state pool on the GPU, batched equals solo, snapshots move
between devices. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from tests.conftest import LM_NAME, SPEECH_NAME

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def engines(models_dir, name: str) -> tuple[Engine, Engine]:
    out = []
    for dev in ("cuda", "cpu"):
        rec = load_recurrent(models_dir / name, device=dev)
        out.append(Engine(make_backend(rec, "torch"), name, 8, metadata=rec.checkpoint_metadata))
    return out[0], out[1]


def test_lm_pool_on_gpu_batched_equals_solo_and_cpu(models_dir):
    gpu, cpu = engines(models_dir, LM_NAME)
    assert gpu.pool.device.type == "cuda"
    prompts = [list(b"first prompt"), list(b"x"), list(b"a much longer prompt " * 10)]
    slots = [gpu.open() for _ in prompts]
    batched = gpu.prefill(slots, prompts).cpu()
    steps = gpu.decode(slots, [65, 66, 67]).cpu()
    for i, p in enumerate(prompts):
        s = cpu.open()
        assert torch.allclose(batched[i], cpu.prefill([s], [p])[0], atol=1e-4)
        assert torch.allclose(steps[i], cpu.decode([s], [65 + i])[0], atol=1e-4)
        cpu.close(s)
    blob = gpu.snapshot(slots[0])  # a GPU slot restored on the CPU continues the same
    s = cpu.open()
    cpu.restore(s, blob)
    assert torch.allclose(
        gpu.decode([slots[0]], [10])[0].cpu(), cpu.decode([s], [10])[0], atol=1e-4
    )


def test_audio_on_gpu_matches_cpu(models_dir):
    gpu, cpu = engines(models_dir, SPEECH_NAME)
    x = [torch.randn(n, generator=torch.Generator().manual_seed(n)) for n in (1600, 1600, 800)]
    gs = [gpu.open() for _ in x]
    cs = [cpu.open() for _ in x]
    for yg, yc in zip(gpu.feed_audio(gs, x), cpu.feed_audio(cs, x), strict=True):
        assert torch.allclose(yg.cpu(), yc, atol=1e-4)
    assert torch.allclose(gpu.scores(gs).cpu(), cpu.scores(cs), atol=1e-4)
