"""Probe (not part of the product): would a second-stage check of each detection cut the
streams' false accepts?

The streaming detector (stage 1, `dlr_runtime.kws.KeywordSpotter` over the model's gated
scores, as the server runs it) fires; a verifier then scores the last ``--window-s`` of audio
before the firing frame from a zero state, offline (the clip classifier's own condition:
`dlr-eval speech` scores 1.5 s windows at their last frame), and the detection is kept only
when the verifier's posterior of the fired label at that last frame reaches ``t2``. A verifier
that is the stage-1 model itself tests whether the stream's context (the state left by earlier
words) makes the false accepts; another model tests whether independent errors help.

Grid: `dlr-eval speech`'s thresholds from 0.5 up x verifier thresholds (t2 = 0 is the detector alone). For each
verifier: the valid streams' best point within ``--fa-target`` (the operating point a choice
may look at), the test streams at that point, and the best test recall within 0.5 / 1 / 10 /
20 FA/h over the grid (a bound, picked on test).

    PYTHONPATH=. python training/cards/probes/ensemble_streams.py dump MODEL STAGE1.npz --more-engines
    PYTHONPATH=. python training/cards/probes/verify_streams.py STAGE1.npz \\
        self=models/speech-commands other=runs/m16_mbsoup4/model@1.5 [--window-s 1.0] [--png P]
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from dlr_runtime.kws import Detection, KeywordSpotter, KWSConfig, commands_of, softmax
from training.data.rooms import rir_bank
from training.eval_speech import THRESHOLDS, split_streams
from training.recipes.kws import KWSOptions, load_split
from training.streams import match

T1 = tuple(t for t in THRESHOLDS if t >= 0.5)  # dlr-eval speech's own grid
T2 = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)
LIMITS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)


class Verifier:
    """Posteriors (C,) of `model` over a window of `window_s` that ends `lookahead_s` after
    each firing frame: the mean of its last `frames` frames' softmax outputs."""

    def __init__(self, model_dir: str, window_s: float, lookahead_s: float, frames: int) -> None:
        self.model = load_checkpoint(model_dir).eval()
        cfg = self.model.config
        self.stride = cfg.frame_stride
        self.n = int(window_s * cfg.sample_rate) // self.stride * self.stride
        self.ahead = int(lookahead_s * cfg.sample_rate) // self.stride * self.stride
        self.frames = frames
        self.cache: dict[tuple[str, int], np.ndarray] = {}

    @torch.no_grad()
    def posteriors(self, audio: np.ndarray, key: str, frames: list[int]) -> list[np.ndarray]:
        todo = sorted({f for f in frames if (key, f) not in self.cache})
        for s in range(0, len(todo), 64):
            batch = []
            for f in todo[s : s + 64]:
                end = min(len(audio), (f + 1) * self.stride + self.ahead)
                w = audio[max(0, end - self.n) : end]
                batch.append(np.pad(w, (self.n - len(w), 0)))
            y = self.model(torch.from_numpy(np.stack(batch)))[:, -self.frames :].double().numpy()
            for f, rows in zip(todo[s : s + 64], y, strict=True):
                self.cache[(key, f)] = softmax(rows).mean(axis=0)
        return [self.cache[(key, f)] for f in frames]


def grid(
    dump: np.lib.npyio.NpzFile,
    streams: dict,
    labels: list[str],
    base: KWSConfig,
    frame_ms: float,
    ver: Verifier | None,
) -> dict[str, dict[tuple[float, float], tuple]]:
    """(t1, t2) -> (recall, FA/h) per split."""
    out: dict[str, dict[tuple[float, float], tuple]] = {}
    commands = set(commands_of(labels))
    for name, ss in streams.items():
        acc: dict[tuple[float, float], list[int]] = {}
        hours = sum(s.hours for s in ss)
        for i, s in enumerate(ss):
            scores = dump[f"{name}_{i}"].astype(np.float64)
            n_cmd = sum(1 for e in s.events if labels[e.label] in commands)
            for t1 in T1:
                dets: list[Detection] = KeywordSpotter(
                    labels, frame_ms, replace(base, threshold=t1)
                ).run(scores)
                if ver is not None and dets:
                    key = f"{name}_{i}"
                    post = ver.posteriors(s.audio, key, [d.frame for d in dets])
                    pv = [p[labels.index(d.label)] for p, d in zip(post, dets, strict=True)]
                else:
                    pv = [1.0] * len(dets)
                for t2 in T2 if ver is not None else (0.0,):
                    kept = [d for d, p in zip(dets, pv, strict=True) if p >= t2]
                    m = match(kept, s.events, labels)
                    a = acc.setdefault((t1, t2), [0, 0, 0])
                    a[0] += len(m.hits)
                    a[1] += n_cmd
                    a[2] += len(m.false)
        out[name] = {k: (h / max(1, c), f / hours) for k, (h, c, f) in acc.items()}
    return out


def best_within(curve: dict, budget: float) -> float:
    """The best recall over the grid with at most `budget` false accepts per hour."""
    return max((r for r, fa in curve.values() if fa <= budget), default=0.0)


def frontier(curve: dict) -> str:
    """Best recall within each of LIMITS false accepts per hour over the grid."""
    return " / ".join(f"{100 * best_within(curve, lim):.1f}" for lim in LIMITS)


def report(name: str, g: dict, targets: list[float]) -> None:
    v, t = g["valid"], g["test"]
    for target in targets:
        _report_point(f"{name}, within {target:g} FA/h", v, t, target)
    print(f"| {name}: best over the grid | | {frontier(v)} | {frontier(t)} |", flush=True)


def _report_point(name: str, v: dict, t: dict, target: float) -> None:
    ok = [k for k in v if v[k][1] <= target]
    best = max(ok, key=lambda k: (v[k][0], -v[k][1])) if ok else None
    if best is None:
        pt = "no point within the target"
    else:
        pt = (
            f"valid {100 * v[best][0]:.1f} % at {v[best][1]:.0f} FA/h (t1 {best[0]:g}, "
            f"t2 {best[1]:g}) -> test {100 * t[best][0]:.1f} % at {t[best][1]:.0f} FA/h"
        )
    print(f"| {name} | {pt} | | |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage1", help="ensemble_streams.py dump of the stage-1 model")
    ap.add_argument("verifiers", nargs="*", help="NAME=MODEL_DIR[@WINDOW_S]")
    ap.add_argument("--template", default="models/speech-commands")
    ap.add_argument("--window-s", type=float, nargs="+", default=[1.0])
    ap.add_argument("--lookahead-s", type=float, nargs="+", default=[0.0])
    ap.add_argument(
        "--frames", type=int, nargs="+", default=[1], help="posterior: mean of the last k"
    )
    ap.add_argument("--fa-target", type=float, nargs="+", default=[10.0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--png", help="plot each row's best recall by false-accept budget")
    a = ap.parse_args()
    torch.set_num_threads(2)
    dump = np.load(a.stage1)
    labels = [str(x) for x in dump["labels"]]
    model = load_checkpoint(a.template)
    frame_ms = 1000 * model.config.frame_stride / model.config.sample_rate
    base = replace(KWSConfig.from_metadata(model.checkpoint_metadata), keywords={})
    print(f"stage 1: {a.stage1}, smoothing {base.smooth_ms:g} ms", flush=True)
    # the streams the dump was scored on (ensemble_streams.py: the "final" split, seed 0)
    opts = KWSOptions(split="final", more_engines=bool(dump.get("more_engines", False)))
    pools = load_split(opts, 0)
    rirs = rir_bank(opts.cache_dir, seed=0)
    streams = {n: split_streams(pools, n, a.minutes, rirs, 0) for n in ("valid", "test")}
    lims = " / ".join(f"{x:g}" for x in LIMITS)
    print(
        f"| verifier | valid point within the target -> test | best valid within {lims} FA/h "
        f"| best test within {lims} FA/h |"
    )
    print("|---|---|---|---|")
    rows = {"none (the detector alone)": grid(dump, streams, labels, base, frame_ms, None)}
    report("none (the detector alone)", rows["none (the detector alone)"], a.fa_target)
    for spec in a.verifiers:
        name, path = spec.split("=", 1)
        windows = a.window_s
        if "@" in path:  # NAME=MODEL_DIR@WINDOW_S: this verifier's own window
            path, own = path.rsplit("@", 1)
            windows = [float(own)]
        for w, ahead, k in itertools.product(windows, a.lookahead_s, a.frames):
            ver = Verifier(path, w, ahead, k)
            row = f"{name}, {w:g} s, +{ahead:g} s, {k} frames"
            rows[row] = grid(dump, streams, labels, base, frame_ms, ver)
            report(row, rows[row], a.fa_target)
    if a.png:
        plot(rows, a.png)


def plot(rows: dict[str, dict], png: str) -> None:
    """Valid and test panels: each row's best recall within each budget (a step curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = np.arange(0, 31)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, split in zip(axes, ("valid", "test"), strict=True):
        for name, g in rows.items():
            best = [best_within(g[split], b) for b in budgets]
            ax.step(budgets, 100 * np.array(best), where="post", label=name)
        ax.axvline(10, color="grey", ls=":", lw=1)
        ax.set_title(f"{split} streams (1 h): best recall over the grid")
        ax.set_xlabel("false accepts per hour, at most")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("commands detected (%)")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"-> {png}", flush=True)


if __name__ == "__main__":
    main()
