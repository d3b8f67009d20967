"""Probe (not part of the product): which state the model starts from when the gate opens.

Runs the evaluation's streams (`dlr-eval speech`'s seeds) through the voice-activity gate and
scores, for each way of starting an open segment, the recall at 0.85 over 400 ms and the best
recall within 10 false accepts per hour at 300 and 400 ms smoothing:

- ``zero``: reset to zero (the gate's ``on_open="reset"``);
- ``resume``: the state the gate closed with, pre-roll fed as with ``reset`` (so after a closure
  shorter than the pre-roll up to 200 ms of computed frames are fed again; the shipped
  ``on_open="resume"`` feeds only skipped frames: `benchmarks/bench_kws_gate.py`'s default row);
- ``decay``: that state, each layer's recurrence multiplied by lambda^k and the head's window by
  its decay^k for the k skipped frames (what zero input would have done to the first layer);
- ``zeros2s`` / ``noise-60dB2s``: the state after 2 s of digital silence / of -60 dBFS white
  noise from zero (a "steady silence" state).

    PYTHONPATH=. python training/cards/probes/gate_start_state.py valid 60 zero,resume,decay [MODEL]

MODEL: a model directory (default: the shipped models/speech-commands).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import numpy as np
import torch

from dlr_runtime import load_checkpoint, to_recurrent
from dlr_runtime.kws import SILENCE, KWSConfig
from dlr_runtime.listen import _steps
from dlr_runtime.vad import Gate, GateConfig
from training.data.rooms import rir_bank
from training.eval_speech import split_streams, sweep
from training.operating_point import global_point
from training.recipes.kws import KWSOptions, load_split
from training.streams import score

State = dict[str, torch.Tensor]


def main(voices: str, minutes: float, modes: list[str], model_dir: str) -> None:
    torch.set_num_threads(1)
    model = load_checkpoint(model_dir).eval()
    pools = load_split(KWSOptions(split="final"), 0)
    rirs = rir_bank(KWSOptions().cache_dir, seed=0)
    streams = split_streams(pools, voices, minutes, rirs, 0)
    rec = to_recurrent(model, dtype=torch.complex64)
    cfg = model.config
    labels = list(cfg.labels)
    frame_ms = 1000 * cfg.frame_stride / cfg.sample_rate
    point = replace(KWSConfig.from_metadata(model.checkpoint_metadata), threshold=0.85)
    point = replace(point, smooth_ms=400.0, keywords={})

    def after(audio: np.ndarray) -> State:
        state = rec.init_state(1)
        _, state = rec.chunk(torch.from_numpy(audio.astype(np.float32)).unsqueeze(0), state)
        return state

    rng = np.random.default_rng(0)
    warm = {
        "zeros2s": after(np.zeros(32000)),
        "noise-60dB2s": after(rng.standard_normal(32000) * 10 ** (-60 / 20)),
    }

    def opened(state: State, mode: str, gap: int, drop: int) -> State:
        if mode == "zero":
            return rec.init_state(1)
        if mode in warm:
            return {k: v.clone() for k, v in warm[mode].items()}
        if mode == "resume":
            return state
        k = max(0, gap - drop)  # decay: frames skipped before the pre-roll
        out = {key: v.clone() for key, v in state.items()}
        out["ssm"] = out["ssm"] * torch.exp(rec.log_lam * k).to(out["ssm"].dtype).unsqueeze(0)
        out["mean_sum"] = out["mean_sum"] * rec.head.decay**k
        out["mean_count"] = out["mean_count"] * rec.head.decay**k
        return out

    def gated(audio: np.ndarray, mode: str) -> np.ndarray:  # (F, C) rows for the detector
        quiet = np.full(len(labels), -np.inf)
        quiet[labels.index(SILENCE)] = 0.0
        state, gap, rows = rec.init_state(1), 0, [np.zeros((0, len(labels)))]
        gate = Gate(cfg.frame_stride, cfg.sample_rate, GateConfig(on_open="reset"))
        for step in _steps(gate.plan(np.asarray(audio, np.float32)), cfg.frame_stride):
            if step.samples is None:
                gap += step.skip
                rows.append(np.broadcast_to(quiet, (step.skip, quiet.size)))
                continue
            if step.reset:
                state = opened(state, mode, gap, step.drop)
            gap = 0
            y, state = rec.chunk(torch.from_numpy(step.samples).unsqueeze(0), state)
            rows.append(y[0, step.drop :].double().cpu().numpy())
        return np.concatenate(rows)

    for mode in modes:
        t = time.time()
        per = [(gated(s.audio, mode), s) for s in streams]
        at = score(per, labels, frame_ms, point)
        best = {}
        for ms in (300.0, 400.0):
            g = global_point(sweep(per, labels, frame_ms, replace(point, smooth_ms=ms)), 10.0)
            best[ms] = (round(g.recall, 4), g.threshold, g.fa_per_hour)
        print(
            f"{voices} {mode}: at 0.85/400 ms {at.recall:.4f} ({at.fa_per_hour:g} FA/h); best "
            f"within 10 FA/h (recall, threshold, FA/h) {best} [{time.time() - t:.0f} s]",
            flush=True,
        )


if __name__ == "__main__":
    model_dir = sys.argv[4] if len(sys.argv) > 4 else "models/speech-commands"
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3].split(","), model_dir)
