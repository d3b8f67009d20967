"""`keep_freed_memory`: with glibc, the blocks a batch frees are reused by the next batch, not
unmapped, so a batch of 64 speech streams costs (almost) no page faults. Each case runs in a
fresh interpreter: malloc settings are per process."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from dlr_runtime.engine.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.set_num_threads(1)
cfg = DLRConfig.preset("tiny-speech", d_model=64, d_state=32, frame_stride=320)
eng = Engine(make_backend(to_recurrent(DLRModel(cfg, seed=0)), sys.argv[2]), "s", 64)
slots = [eng.open() for _ in range(64)]  # a 4 MiB state per batch
x = list(0.1 * torch.randn(64, 1600))
for _ in range(3):
    eng.feed_audio(slots, x)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    eng.feed_audio(slots, x)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults(mode: str, backend: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, backend], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return float(out.stdout.split()[-1])


@pytest.mark.slow  # two subprocesses that import torch and run 64-stream batches (~10 s each)
@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_a_batch_of_64_streams_reuses_its_memory_without_page_faults(backend):
    default, kept = _faults("default", backend), _faults("keep", backend)
    # kept: ~0-25 faults per batch here; glibc's default usually unmaps the freed blocks and
    # faults them in again (~800-1200), but its dynamic mmap threshold sometimes starts
    # reusing them on its own (one CI run: 6), so the default is the comparison, not the test
    assert kept < 50, (kept, default)
    if default > 100:
        assert kept < default / 10, (kept, default)
