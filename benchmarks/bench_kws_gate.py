"""What the voice-activity gate costs a keyword model in recall, and what it saves in compute.

The server's continuous mode gates the model by default (`dlr_runtime/vad.py`): frames the
gate calls silence are not computed, and each opening feeds a short pre-roll into the state
the model had when the gate closed (or, with ``on_open="reset"``, into a zero state). This
runs the evaluation's valid streams (the voices the operating point is chosen on;
`dlr-eval speech`, the same corpus and seeds; ``--voices test`` to confirm a choice) through
the gate at several settings, exactly as the server computes them (`dlr_runtime.listen.gated_scores`),
and reports per setting:

- the share of frames the model computes (the gate's saving; ungated = 100 %);
- recall and false accepts per hour at the model's stored operating point;
- the best recall within ``--fa-target`` false accepts per hour over the evaluation's
  thresholds (steps of 0.01 between 0.85 and 0.93), at the stored smoothing window;
- where the recall goes: the share of commands during which the gate computed no frame at all
  (the voice detector missed the word), and the recall at the stored point on the commands it
  did open for (against the ungated recall, what happens once it is open costs: a reset
  state, the skipped audio, and a hangover that closes before the detector fires).

    python -m benchmarks.bench_kws_gate [--model models/speech-commands] [--minutes 60]
        [--fa-target 10] [--voices valid|test] [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from benchmarks.harness import append_results
from dlr_runtime import load_checkpoint, to_recurrent
from dlr_runtime.kws import KeywordSpotter, KWSConfig
from dlr_runtime.listen import gated_scores
from dlr_runtime.vad import GateConfig
from training.data.rooms import rir_bank
from training.data.sc12 import SIL
from training.eval_speech import EvalOptions, scoring_pools, split_streams, sweep
from training.operating_point import global_point
from training.streams import Stream, match, score

SETTINGS: dict[str, GateConfig] = {  # name -> gate (the first is the server's default)
    "default (margin 8 dB, pre-roll 200 ms, hangover 600 ms, state resumed)": GateConfig(),
    "state reset to zero on opening (the default before)": GateConfig(on_open="reset"),
    "hangover 400 ms": GateConfig(hangover_ms=400.0),
    "hangover 800 ms": GateConfig(hangover_ms=800.0),
    "margin 5 dB": GateConfig(margin_db=5.0),
    "no gate": GateConfig(enabled=False),
}


def opened(scores: np.ndarray, stream: Stream, stride: int) -> list[bool]:
    """Per command of `stream` (in order): did the gate compute any frame while it was spoken?"""
    computed = np.isfinite(scores).all(axis=1)  # (F,) skipped frames carry -inf
    return [
        bool(computed[e.start // stride : e.end // stride + 1].any())
        for e in stream.events
        if e.label < SIL
    ]


def recall_split(
    per: list[tuple[np.ndarray, Stream]],
    labels: list[str],
    frame_ms: float,
    point: KWSConfig,
    stride: int,
) -> tuple[float, float]:
    """(share of commands the gate never opened on, recall at `point` on the rest)."""
    total = unopened = found = 0
    for scores, stream in per:
        cmds = [e for e in stream.events if e.label < SIL]
        was_open = opened(scores, stream, stride)
        hits = {
            id(e)
            for e in match(
                KeywordSpotter(labels, frame_ms, point).run(scores), stream.events, labels
            ).hits
        }
        total += len(cmds)
        unopened += was_open.count(False)
        found += sum(1 for e, o in zip(cmds, was_open, strict=True) if o and id(e) in hits)
    return unopened / max(1, total), found / max(1, total - unopened)


@dataclass(frozen=True)
class GateRow:
    setting: str
    computed: float  # share of frames computed
    recall: float  # at the stored operating point
    fa_per_hour: float
    best_recall: float  # best within the FA target
    best_threshold: float
    best_fa_per_hour: float
    unopened: float  # share of commands with no frame computed between start and end
    recall_opened: float  # recall at the stored point on the other commands


def measure(
    model_dir: str, minutes: float, fa_target: float, voices: str = "valid"
) -> tuple[list[GateRow], KWSConfig]:
    model = load_checkpoint(model_dir).eval()
    meta = model.checkpoint_metadata
    training = meta.get("training", {})
    kws = training.get("recipe_options", {}).get("kws", {})
    seed = int(training.get("train", {}).get("seed", 0))
    opts = EvalOptions()
    pools = scoring_pools(kws, kws.get("split", "final"), seed, opts)
    rirs = rir_bank(opts.cache_dir, seed=seed)
    streams = split_streams(pools, voices, minutes, rirs, seed)
    rec = to_recurrent(model, dtype=torch.complex64)
    labels = list(model.config.labels)
    frame_ms = 1000 * model.config.frame_stride / model.config.sample_rate
    point = KWSConfig.from_metadata(meta)
    rows = []
    for name, gate in SETTINGS.items():
        per = [(gated_scores(rec, s.audio, gate), s) for s in streams]
        frames = sum(len(p) for p, _ in per)
        computed = sum(int(np.isfinite(p).all(axis=1).sum()) for p, _ in per)
        at = score(per, labels, frame_ms, point)
        best = global_point(sweep(per, labels, frame_ms, replace(point, keywords={})), fa_target)
        unopened, recall_opened = recall_split(
            per, labels, frame_ms, point, model.config.frame_stride
        )
        rows.append(
            GateRow(
                name,
                computed / frames,
                at.recall,
                at.fa_per_hour,
                best.recall,
                best.threshold,
                best.fa_per_hour,
                unopened,
                recall_opened,
            )
        )
        print(asdict(rows[-1]), flush=True)
    return rows, point


def table(rows: list[GateRow], point: KWSConfig, fa_target: float) -> str:
    lines = [
        f"| gate | frames computed | recall at {point.threshold:g} / {point.smooth_ms:g} ms "
        f"(FA/h) | best recall within {fa_target:g} FA/h (threshold, FA/h) "
        "| commands the gate never opened on | recall on the others |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.setting} | {100 * r.computed:.0f} % | {100 * r.recall:.1f} % "
            f"({r.fa_per_hour:.0f}) | {100 * r.best_recall:.1f} % "
            f"({r.best_threshold:g}, {r.best_fa_per_hour:.0f}) | {100 * r.unopened:.1f} % "
            f"| {100 * r.recall_opened:.1f} % |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/speech-commands")
    p.add_argument("--minutes", type=float, default=60.0, help="minutes of valid streams")
    p.add_argument("--fa-target", type=float, default=10.0)
    p.add_argument(
        "--voices",
        choices=("valid", "test"),
        default="valid",
        help="whose streams: valid (where settings are chosen) or test (to confirm a choice)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", default=None, help="append the table to this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows, point = measure(args.model, args.minutes, args.fa_target, args.voices)
    body = table(rows, point, args.fa_target)
    print(body)
    append_results(
        args.results,
        f"Voice-activity gate vs keyword recall ({args.model}, {args.voices} streams)",
        f"{args.minutes:g} min of the evaluation's {args.voices} streams (`dlr-eval speech`'s "
        "seeds), "
        "each through the gate as the server's continuous mode computes it "
        "(`dlr_runtime.listen.gated_scores`).\n\n" + body,
    )


if __name__ == "__main__":
    main()
