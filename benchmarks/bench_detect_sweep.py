"""What the evaluation's threshold sweep costs: the reference decision rule once per threshold
(`dlr_runtime.kws.KeywordSpotter`, frame by frame, as every sweep ran it before) against the
sweep's rule (`training/detect_sweep.py`: the stream smoothed once, then each threshold's
firing logic at the frames that reach it). Both give the same detections (checked here too,
and in tests/training/test_detect_sweep.py).

The scores are the shipped speech model's over `dlr-eval speech`'s first valid streams
(5-minute pieces through the voice-activity gate, as `--vad`), at the model's smoothing; one
sweep is dlr-eval's 26 shared thresholds. Median seconds per sweep of one piece, the ratio, and
what a sweep of five hours costs each way.

    nice -n 10 .venv/bin/python -m benchmarks.bench_detect_sweep [--pieces 2]
        [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

import torch

from benchmarks.harness import append_results, md_table, time_calls
from dlr_runtime import load_checkpoint
from dlr_runtime.kws import KeywordSpotter, KWSConfig
from training.data.rooms import rir_bank
from training.detect_sweep import fire, smoothed
from training.eval_speech import THRESHOLDS, EvalOptions, scoring_pools, split_streams
from training.streams import stream_scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/speech-commands")
    ap.add_argument("--pieces", type=int, default=2, help="5-minute valid pieces to time")
    ap.add_argument("--budget-s", type=float, default=20.0, help="timing budget per method")
    ap.add_argument("--results", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_checkpoint(args.model).eval()
    meta = model.checkpoint_metadata
    kws = meta["training"]["recipe_options"]["kws"]
    seed = int(meta["training"]["train"].get("seed", 0))
    opts = EvalOptions()
    pools = scoring_pools(kws, kws.get("split", "final"), seed, opts)
    streams = split_streams(pools, "valid", 5.0 * args.pieces, rir_bank(opts.cache_dir, seed), seed)
    cfg = model.config
    labels, frame_ms = list(cfg.labels), 1000 * cfg.frame_stride / cfg.sample_rate
    base = KWSConfig.from_metadata(meta)
    configs = [KWSConfig(**{**asdict(base), "threshold": t, "keywords": {}}) for t in THRESHOLDS]
    rows = []
    for i, s in enumerate(streams):
        x = stream_scores(model, s.audio, gated=True)

        def reference(x=x):
            return [KeywordSpotter(labels, frame_ms, c).run(x) for c in configs]

        def swept(x=x):
            sm = smoothed(x, labels, frame_ms, base)
            return [fire(sm, labels, c) for c in configs]

        same = reference() == swept()
        t_ref, n_ref = time_calls(reference, args.budget_s, min_calls=3)
        t_new, n_new = time_calls(swept, args.budget_s, min_calls=3)
        hours = len(x) * frame_ms / 3.6e6
        rows.append(
            [f"valid piece {i + 1} ({len(x):,} frames)", sum(len(d) for d in reference()),
             "yes" if same else "NO", t_ref, t_new, t_ref / t_new,
             f"{5 * t_ref / hours / 60:.1f} min", f"{5 * t_new / hours:.1f} s"]
        )  # fmt: skip
        print(rows[-1], flush=True)
    table = md_table(
        ["stream", "detections (26 thresholds)", "same detections", "reference s/sweep",
         "sweep s/sweep", "ratio", "5 h, reference", "5 h, sweep"],
        rows,
    )  # fmt: skip
    print(table)
    append_results(
        args.results,
        "Keyword spotting: the evaluation's threshold sweep (bench_detect_sweep)",
        f"Model `{args.model}`, smoothing {base.smooth_ms:g} ms, {len(THRESHOLDS)} thresholds.\n\n"
        + table,
    )


if __name__ == "__main__":
    main()
