"""Probe (not part of the product): are the quiet commands missed by the gate or by the model?

Runs the evaluation's streams (`dlr-eval speech`'s seeds and lengths) three ways: every frame
computed, through the shipped voice-activity gate (8 dB over the noise floor), and through the
same gate with a 5 dB margin; each scored at the model's own operating point (its checkpoint
metadata, e.g. 0.86 over 300 ms). For every command it records the band of its SNR in the
stream, the share of its frames (start of the word to its end) the gate computed, and whether
each of the three found it. Prints, per SNR band and per engine: commands, missed by each, and
the gate's misses split into commands the gate left mostly closed (< 50 % of the word's frames
computed) and commands it computed but the model still missed.

    PYTHONPATH=. python training/cards/probes/gate_quiet_words.py [MODEL] [--json OUT]

MODEL: a model directory (default: the shipped models/speech-commands).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from dataclasses import replace

import numpy as np
import torch

from dlr_runtime import load_checkpoint, to_recurrent
from dlr_runtime.kws import KeywordSpotter, KWSConfig
from dlr_runtime.listen import gated_scores
from dlr_runtime.vad import Gate, GateConfig
from training.data.rooms import rir_bank
from training.data.sc12 import SIL
from training.eval_speech import split_streams
from training.recipes.kws import KWSOptions, load_split
from training.stream_anatomy import SNR_BANDS, snr_band
from training.streams import Stream, match, stream_scores

GATES = {"gate 8 dB": GateConfig(), "gate 5 dB": GateConfig(margin_db=5.0)}


def open_mask(audio: np.ndarray, stride: int, rate: int, gate: GateConfig) -> np.ndarray:
    """(F,) bool: the frames the gate computes (pre-roll not counted)."""
    runs = Gate(stride, rate, gate).plan(np.asarray(audio, np.float32))
    return np.concatenate([np.full(r.frames, r.feed) for r in runs])


def found(scores: np.ndarray, stream: Stream, labels: list[str], ms: float, p: KWSConfig) -> set:
    """ids of the stream's commands the decision rule at `p` detects."""
    dets = KeywordSpotter(labels, ms, p).run(scores)
    return {id(e) for e in match(dets, stream.events, labels).hits}


def main(model_dir: str, out: str | None) -> None:
    torch.set_num_threads(1)
    model = load_checkpoint(model_dir).eval()
    cfg = model.config
    labels = list(cfg.labels)
    frame_ms = 1000 * cfg.frame_stride / cfg.sample_rate
    point = replace(KWSConfig.from_metadata(model.checkpoint_metadata), keywords={})
    rec = to_recurrent(model, dtype=torch.complex64)
    pools = load_split(KWSOptions(split="final"), 0)
    rirs = rir_bank(KWSOptions().cache_dir, seed=0)
    ways = ("ungated", *GATES)
    result: dict[str, dict] = {}
    for name in ("valid", "test"):
        t0 = time.time()
        rows = []  # per command: band, engine, {way: found}, {gate: share of frames computed}
        for s in split_streams(pools, name, 60.0, rirs, 0):
            hits = {"ungated": found(stream_scores(model, s.audio), s, labels, frame_ms, point)}
            share = {}
            for g, gc in GATES.items():
                hits[g] = found(gated_scores(rec, s.audio, gc), s, labels, frame_ms, point)
                mask = open_mask(s.audio, cfg.frame_stride, cfg.sample_rate, gc)
                share[g] = {
                    id(e): float(
                        mask[e.start // cfg.frame_stride : e.end // cfg.frame_stride + 1].mean()
                    )
                    for e in s.events
                    if e.label < SIL
                }
            for e in s.events:
                if e.label >= SIL:
                    continue
                rows.append(
                    (
                        snr_band(e.snr_db) or "unknown",
                        e.voice.split(":")[0],
                        {w: id(e) in hits[w] for w in ways},
                        {g: share[g][id(e)] for g in GATES},
                    )
                )
        result[name] = _tables(rows, ways)
        print(f"== {name} streams ({len(rows)} commands, {time.time() - t0:.0f} s)")
        for key, table in result[name].items():
            print(f"-- by {key}")
            for group, c in table.items():
                print(f"  {group:>9}: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    if out:
        with open(out, "w") as f:
            json.dump({"model": model_dir, "point": point.to_dict(), **result}, f, indent=1)


def _tables(rows: list, ways: tuple[str, ...]) -> dict[str, dict[str, dict[str, int]]]:
    """Counts per SNR band and per engine: commands, misses of each way, and each gate's misses
    split by whether it computed at least half of the word's frames."""
    out: dict[str, dict[str, Counter]] = {
        "snr": defaultdict(Counter),
        "engine": defaultdict(Counter),
    }
    for band, eng, hit, share in rows:
        for key, group in (("snr", band), ("engine", eng)):
            c = out[key][group]
            c["commands"] += 1
            for w in ways:
                c[f"missed {w}"] += not hit[w]
            for g in GATES:
                if not hit[g]:
                    c[f"{g}: missed, mostly closed"] += share[g] < 0.5
                    c[f"{g}: missed, ungated found"] += hit["ungated"]
    groups = {"snr": [*SNR_BANDS, "unknown"], "engine": sorted(out["engine"])}
    return {key: {g: dict(out[key][g]) for g in groups[key] if g in out[key]} for key in out}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="models/speech-commands")
    ap.add_argument("--json", default=None, help="write the tables here")
    a = ap.parse_args()
    main(a.model, a.json)
