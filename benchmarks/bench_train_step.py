"""What the training step costs: the shipped models' forward and backward in FFT-convolution
mode, through the reference path and through the faster one, in one process.

Three forms of every SSM layer's forward, swapped call by call (A B C A B C ...), so that a
busy machine slows every form alike; the median of each form's calls is reported:
- `reference`: `ssm.fft_causal_conv` (autograd derives the backward) and the layer's output
  left as the transposed view, the training step before the twenty-sixth session;
- `contiguous`: the same convolution, the output made contiguous (what the position-wise
  layers after it, GELU's backward above all, run fastest on);
- `fast`: `fft_conv.causal_conv` (the hand-written frequency-domain backward) and the
  contiguous output, the path `DiagonalSSM.forward` takes now.
All three give the same values (tests/dlr_runtime/test_fft_conv.py); the table gives the
median milliseconds per forward + backward and the ratio against `reference`.

Cases: the speech model's training batch (32 windows of 2.4 s, 120 frames, models/speech-commands)
and the byte LM's (8 x 256 tokens, models/byte-lm). The data side of a speech window gets one
row as well: a speed change (`training.data.audio.change_speed`, 1 s of audio, a factor drawn
from 0.90-1.10) through torchaudio's functional resampler, which rebuilds its sinc kernel per
call, against the cached resampler `training.data.audio.resample` keeps per pair of rates.

    nice -n 10 .venv/bin/python -m benchmarks.bench_train_step [--calls 40]
        [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torchaudio.functional as AF

from benchmarks.harness import ROOT, append_results, md_table
from dlr_runtime import load_checkpoint
from dlr_runtime.ssm import DiagonalSSM, fft_causal_conv, kernel_from_params
from training.data.audio import change_speed

FORMS = ("reference", "contiguous", "fast")


SHIPPED_FORWARD = DiagonalSSM.forward  # the `fast` form is the runtime's own forward


def ssm_forward(form: str) -> Callable[[DiagonalSSM, torch.Tensor], torch.Tensor]:
    """A DiagonalSSM.forward in one of FORMS (u (B, L, H) -> y (B, L, H))."""
    if form == "fast":
        return SHIPPED_FORWARD

    def forward(self: DiagonalSSM, u: torch.Tensor) -> torch.Tensor:
        p = self.recurrent_params()
        k = kernel_from_params(p, u.shape[1]).to(u.dtype)  # (H, L)
        ut = u.transpose(1, 2)  # (B, H, L)
        y = fft_causal_conv(ut, k) + p.D.to(u.dtype).unsqueeze(-1) * ut  # (B, H, L)
        return y.transpose(1, 2) if form == "reference" else y.transpose(1, 2).contiguous()

    return forward


def step_fn(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()

    return step


def cases() -> dict[str, tuple[torch.nn.Module, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    speech = load_checkpoint(ROOT / "models" / "speech-commands").train()
    lm = load_checkpoint(ROOT / "models" / "byte-lm").train()
    audio = 0.1 * torch.randn(32, int(2.4 * 16000), generator=gen)  # (B, samples)
    tokens = torch.randint(0, lm.config.vocab_size, (8, 256), generator=gen)  # (B, L)
    return {
        "speech, 32 x 2.4 s (120 frames)": (speech, audio),
        "byte LM, 8 x 256 tokens": (lm, tokens),
    }


def interleaved(fns: dict[str, Callable[[], None]], calls: int) -> dict[str, float]:
    """Median seconds per call of each function, calling them in turn `calls` times each
    (after one warm-up call each)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def with_form(form: str, step: Callable[[], None]) -> Callable[[], None]:
    forward = ssm_forward(form)

    def call() -> None:
        DiagonalSSM.forward = forward  # type: ignore[method-assign]
        step()

    return call


def resample_row(calls: int) -> list[object]:
    clip = np.random.default_rng(0).standard_normal(16000).astype(np.float32)
    rng = np.random.default_rng(1)

    def functional() -> None:
        num = int(round(100 * rng.uniform(0.9, 1.1)))
        AF.resample(torch.from_numpy(clip), num, 100)

    def cached() -> None:
        change_speed(clip, rng.uniform(0.9, 1.1))

    med = interleaved({"functional": functional, "cached": cached}, calls)
    f, c = med["functional"] * 1e3, med["cached"] * 1e3
    return ["speed change of a 1 s word (data worker)", f, "", c, f / c]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=40, help="timed calls per form and case")
    p.add_argument("--results", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    rows: list[list[object]] = []
    try:
        for name, (model, x) in cases().items():
            step = step_fn(model, x)
            med = interleaved({f: with_form(f, step) for f in FORMS}, args.calls)
            ms = {f: med[f] * 1e3 for f in FORMS}
            ratio = med["reference"] / med["fast"]
            rows.append([name, ms["reference"], ms["contiguous"], ms["fast"], ratio])
            print(name, {f: round(v, 2) for f, v in ms.items()}, flush=True)
    finally:
        DiagonalSSM.forward = SHIPPED_FORWARD  # type: ignore[method-assign]
    rows.append(resample_row(25 * args.calls))
    table = md_table(
        [
            "case",
            "reference: ms",
            "contiguous output: ms",
            "fast (causal_conv + contiguous): ms",
            "reference / fast",
        ],
        rows,
    )
    note = (
        "Median of each form's calls, interleaved call by call; forward + backward of one "
        "training batch, one torch thread; for the data row the second column is torchaudio's "
        "functional resampler and the fourth the cached one."
    )
    print(table)
    title = "Training step: the FFT convolution's backward (bench_train_step)"
    append_results(args.results, title, f"{note}\n\n{table}")


if __name__ == "__main__":
    main()
