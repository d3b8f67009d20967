"""Probe (not part of the product): where in the streams does a model miss its commands?

A model can score well on clips (a word in a 1.5 s window) and still miss commands in the
evaluation's streams. This probe takes `dlr-eval speech`'s valid streams and, for each model,
runs the detector at the given threshold (300 ms smoothing, the shipped rule otherwise) and
splits the recall by the command's engine, by the gap since the previous word ended and by
the word's length, through the server's voice-activity gate and without it. If a front end's
misses fall evenly over the gaps, the previous word is not what hides a command.

    PYTHONPATH=. python training/cards/probes/stream_context_probe.py \\
        "log-mel (shipped)=models/speech-commands@0.8" "embedding=runs/m22_se_cap2/model@0.8"
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import torch

from dlr_runtime import load_checkpoint, to_recurrent
from dlr_runtime.kws import KeywordSpotter, KWSConfig
from dlr_runtime.listen import gated_scores
from training.data.rooms import rir_bank
from training.data.sc12 import SIL
from training.eval_speech import split_streams
from training.recipes.kws import KWSOptions, load_split
from training.streams import match

GAPS_S = (0.8, 1.5, 3.0)  # bin edges of the gap since the previous word ended
LENGTHS_S = (0.35, 0.5, 0.7)  # bin edges of the command's length


def _bins(values: np.ndarray, edges: tuple[float, ...]) -> tuple[np.ndarray, list[str]]:
    names = [f"< {edges[0]:g} s"]
    names += [f"{a:g}-{b:g} s" for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return np.digitize(values, edges), [*names, f">= {edges[-1]:g} s"]


def _table(title: str, key: np.ndarray, names: list[str], hit: np.ndarray) -> str:
    cells = [
        f"{n} {100 * hit[key == k].mean():.1f} % (n={(key == k).sum()})"
        for k, n in enumerate(names)
        if (key == k).any()
    ]
    return f"    by {title}: " + ", ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="name=checkpoint directory@threshold")
    ap.add_argument("--minutes", type=float, default=60.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    pools = load_split(KWSOptions(split="final", more_engines=True), 0)
    streams = split_streams(pools, "valid", a.minutes, rir_bank(KWSOptions().cache_dir, seed=0), 0)
    for spec in a.models:
        name, rest = spec.split("=", 1)
        path, thr = rest.rsplit("@", 1)
        model = load_checkpoint(path).eval()
        rec = to_recurrent(model, dtype=torch.complex64)
        labels = list(model.config.labels)
        frame_ms = 1000 * model.config.frame_stride / model.config.sample_rate
        rule = replace(
            KWSConfig.from_metadata(model.checkpoint_metadata),
            keywords={},
            smooth_ms=300.0,
            threshold=float(thr),
        )
        for gated in (True, False):
            rows = []  # (engine, gap s, length s, hit) per command
            false = 0
            for s in streams:
                if gated:
                    y = gated_scores(rec, s.audio)
                else:
                    with torch.no_grad():
                        out, _ = rec.chunk(
                            torch.from_numpy(s.audio).unsqueeze(0), rec.init_state(1)
                        )
                    y = out[0].double().numpy()
                m = match(KeywordSpotter(labels, frame_ms, rule).run(y), s.events, labels)
                false += len(m.false)
                hits = {(e.start, e.end) for e in m.hits}
                prev_end = None
                for e in s.events:
                    if e.label < SIL:
                        gap = np.inf if prev_end is None else (e.start - prev_end) / 16000
                        rows.append(
                            (
                                e.voice.split(":")[0],
                                gap,
                                (e.end - e.start) / 16000,
                                (e.start, e.end) in hits,
                            )
                        )
                    prev_end = e.end
            engine = np.array([r[0] for r in rows])
            hit = np.array([r[3] for r in rows])
            hours = sum(s.hours for s in streams)
            print(
                f"{name} ({'through the gate' if gated else 'no gate'}), threshold {thr}: recall "
                f"{100 * hit.mean():.1f} % of {len(hit)} commands, {false / hours:.1f} FA/h",
                flush=True,
            )
            names = sorted(set(engine.tolist()))
            key = np.array([names.index(e) for e in engine])
            print(_table("engine", key, names, hit))
            for title, col, edges in (("gap", 1, GAPS_S), ("length", 2, LENGTHS_S)):
                key, bins = _bins(np.array([r[col] for r in rows]), edges)
                print(_table(title, key, bins, hit))
                if title == "gap":
                    es = engine == "espeak"
                    print(_table("gap, espeak-ng only", key[es], bins, hit[es]))


if __name__ == "__main__":
    main()
