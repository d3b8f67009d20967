"""Probe (not part of the product): are two models' stream figures apart, or is it the streams?

Scores each ``NAME=MODEL_DIR`` on the streams ``dlr-eval speech`` builds for split ``--split``
(the same seeds: ``--minutes 60`` of valid streams are dlr-eval's ``--valid-stream-minutes 60``;
more minutes add pieces after those), through the voice-activity gate as the server does, at
the model's stored operating point's smoothing, over dlr-eval's thresholds. Then resamples
the pieces (``training/stream_bootstrap.py``) and prints each model's recall within each
``--targets`` false accepts per hour with a 95 % interval, and each model's difference from
the first model on the same resamples (paired). ``--ensemble NAME=A+B`` adds the output
ensemble of models named before it (their mean log-posteriors per frame, read at
``--ensemble-smooth-ms``): what serving several models at once would give on the same streams.
``--rule NAME=FIELD:VALUE,...`` adds the first model read by another decision rule (fields of
``KWSConfig``: ``rearm``, ``refractory_ms``, ``smooth_ms``), its thresholds swept as any model's.

Each model's per-piece frame scores are kept in ``--cache`` (``NAME.npz``; the file records the
model folder, its weights' sha256, split and seed, and is rebuilt when they differ or it holds fewer pieces; fewer
``--minutes`` read the first pieces of a longer run), so two shells can score two models
side by side (``--score-only``) and a third run reads both.

    PYTHONPATH=. python training/cards/probes/stream_compare.py shipped=models/speech-commands \\
        route16=runs/route16/soup/model --minutes 180 --json runs/stream_compare.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from dlr_runtime.kws import KWSConfig
from training.data.rooms import rir_bank
from training.eval_speech import EvalOptions, scoring_pools, split_streams, sweep
from training.stream_bootstrap import (
    PieceCounts,
    compare,
    piece_counts,
    point_intervals,
)
from training.streams import Stream, stream_scores


def _model_seed(meta: dict) -> tuple[int, dict]:
    training = meta.get("training", {})
    kws_opts = training.get("recipe_options", {}).get("kws", {})
    return int(training.get("train", {}).get("seed", 0)), kws_opts


@dataclass
class Scored:
    """One model's per-frame scores of every piece, and how its detector reads them."""

    scores: list[np.ndarray]  # per piece (F, C)
    streams: list[Stream]
    labels: list[str]
    frame_ms: float
    base: KWSConfig  # the stored operating point (its smoothing is used)
    seed: int

    def counts(self, base: KWSConfig | None = None) -> PieceCounts:
        b = base or self.base
        return piece_counts(
            [
                sweep([(x, s)], self.labels, self.frame_ms, b)
                for x, s in zip(self.scores, self.streams, strict=True)
            ]
        )


def scored(name: str, model_dir: str, split: str, minutes: float, cache: Path) -> Scored:
    model = load_checkpoint(model_dir).eval()
    meta = getattr(model, "checkpoint_metadata", {}) or {}
    seed, kws_opts = _model_seed(meta)
    opts = EvalOptions()
    pools = scoring_pools(kws_opts, kws_opts.get("split", "final"), seed, opts)
    rirs = rir_bank(opts.cache_dir, seed=seed)
    streams: list[Stream] = split_streams(pools, split, minutes, rirs, seed)
    weights = hashlib.sha256((Path(model_dir) / "model.safetensors").read_bytes()).hexdigest()
    key = {
        "model": str(Path(model_dir).resolve()),
        "weights": weights,
        "split": split,
        "seed": seed,
    }
    path = cache / f"{name}.npz"
    scores: list[np.ndarray] | None = None
    if path.exists():  # pieces are nested: a longer run's first pieces are a shorter run's
        z = np.load(path, allow_pickle=False)
        held = json.loads(str(z["key"]))
        if {k: held.get(k) for k in key} == key and held.get("pieces", 0) >= len(streams):
            scores = [z[f"p{i}"] for i in range(len(streams))]
    if scores is None:
        key["pieces"] = len(streams)
        scores = []
        for i, s in enumerate(streams):
            scores.append(stream_scores(model, s.audio, gated=True))
            print(f"{name}: piece {i + 1}/{len(streams)} scored", flush=True)
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(path, key=json.dumps(key), **{f"p{i}": x for i, x in enumerate(scores)})
    cfg = model.config
    frame_ms = 1000 * cfg.frame_stride / cfg.sample_rate
    return Scored(scores, streams, list(cfg.labels), frame_ms, KWSConfig.from_metadata(meta), seed)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def ensemble(members: list[Scored], smooth_ms: float) -> Scored:
    """The members' mean log-posteriors per frame (an output ensemble; the gate is the same
    for every model, so their frames line up), read at `smooth_ms`."""
    first = members[0]
    for m in members[1:]:
        if m.labels != first.labels or m.seed != first.seed:
            raise SystemExit("ensemble members must share labels and streams")
    with np.errstate(invalid="ignore"):
        scores = [
            np.mean([log_softmax(m.scores[i]) for m in members], axis=0)
            for i in range(len(first.scores))
        ]
    for x in scores:  # gated frames: -inf everywhere but _silence_ (0) in every member
        x[np.isnan(x)] = -np.inf
    base = replace(first.base, smooth_ms=smooth_ms)
    return Scored(scores, first.streams, first.labels, first.frame_ms, base, first.seed)


def _band(ax, x: np.ndarray, ivs: list[dict], color: str, label: str) -> None:
    """One line of values (as percentages) with its interval shaded."""
    ax.plot(x, [100 * i["value"] for i in ivs], marker="o", color=color, label=label)
    lo, hi = [100 * i["low"] for i in ivs], [100 * i["high"] for i in ivs]
    ax.fill_between(x, lo, hi, color=color, alpha=0.12)


def plot(results: list[dict], path: Path) -> None:
    """Per split (a row each, from the ``--json`` files): recall within each target with its
    interval (left), each model minus the first (right); one colour per model throughout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(11, 4.2 * len(results)), squeeze=False)
    for (a, b), res in zip(axes, results, strict=True):
        cmp = res["comparison"]
        names = list(cmp["models"])
        x = np.array(cmp["targets"])

        for k, n in enumerate(names):
            _band(a, x, cmp["models"][n]["recall"], f"C{k}", n)
            if k:
                _band(b, x, cmp["models"][n]["diff_from_first"], f"C{k}", f"{n} - {names[0]}")
        b.axhline(0, color="k", lw=0.8)
        title = f"{res['split']} streams: {cmp['pieces']} pieces, {res['hours']:.1f} h"
        for ax, ylab in ((a, "recall (%)"), (b, "difference in recall (points, paired)")):
            ax.set_xscale("log")
            ax.set_xticks(x, [f"{t:g}" for t in x])
            ax.set_xlabel("false accepts per hour (at most)")
            ax.set_ylabel(ylab)
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    level = 100 * results[0]["comparison"]["level"]
    fig.suptitle(f"bands: {level:.0f} % bootstrap intervals over resamples of the stream pieces")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", metavar="NAME=MODEL_DIR")
    ap.add_argument("--split", default="valid", choices=("valid", "test"))
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--targets", type=float, nargs="+", default=[1.0, 2.0, 5.0, 10.0, 20.0])
    ap.add_argument("--resamples", type=int, default=4000)
    ap.add_argument("--cache", default="runs/stream_compare")
    ap.add_argument("--score-only", action="store_true", help="score and cache, no table")
    ap.add_argument("--json", default="", help="also write the comparison here")
    ap.add_argument(
        "--ensemble", nargs="*", default=[], metavar="NAME=A+B",
        help="also an output ensemble of models named above (mean log-posteriors)",
    )  # fmt: skip
    ap.add_argument("--ensemble-smooth-ms", type=float, default=300.0)
    ap.add_argument(
        "--rule", nargs="*", default=[], metavar="NAME=FIELD:VALUE,...",
        help="also the first model under another decision rule, e.g. late=refractory_ms:1600",
    )  # fmt: skip
    ap.add_argument("--png", default="", help="also plot the recalls and the differences")
    ap.add_argument(
        "--replot", nargs="*", default=[], metavar="JSON",
        help="only draw --png from earlier --json files (one row each; no models are scored)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.replot:
        plot([json.loads(Path(f).read_text()) for f in args.replot], Path(args.png))
        return
    if not args.models:
        ap.error("name at least one NAME=MODEL_DIR (or --replot earlier --json files)")
    torch.set_num_threads(1)
    runs, dirs = {}, {}
    for arg in args.models:
        name, _, folder = arg.partition("=")
        runs[name] = scored(name, folder, args.split, args.minutes, Path(args.cache))
        dirs[name] = folder
    if args.score_only:
        return
    first = next(iter(runs))
    for arg in args.rule:  # the first model read by another decision rule
        name, _, fields = arg.partition("=")
        try:
            changes = {k: float(v) for k, v in (f.split(":") for f in fields.split(","))}
            replace(runs[first].base, **changes)
        except (TypeError, ValueError) as e:
            ap.error(f"--rule {arg!r}: want NAME=FIELD:NUMBER,... with KWSConfig fields ({e})")
        runs[name] = replace(runs[first], base=replace(runs[first].base, **changes))
        dirs[name] = f"{dirs[first]} ({fields})"
    for arg in args.ensemble:
        name, _, members = arg.partition("=")
        runs[name] = ensemble([runs[m] for m in members.split("+")], args.ensemble_smooth_ms)
        dirs[name] = members
    counts = {n: r.counts() for n, r in runs.items()}
    info = {n: {"seed": r.seed, "smooth_ms": r.base.smooth_ms} for n, r in runs.items()}
    if len({i["seed"] for i in info.values()}) != 1:
        raise SystemExit(f"models trained with different seeds score other streams: {info}")
    cmp = compare(counts, args.targets, resamples=args.resamples)
    first = cmp.names[0]
    hours = float(next(iter(counts.values())).hours.sum())
    cmds = int(next(iter(counts.values())).commands.sum())
    print(
        f"{args.split} streams: {cmp.pieces} pieces, {hours:.2f} h, {cmds} commands; "
        f"recall (%) within each FA/h target, {100 * cmp.level:.0f} % interval over "
        f"{cmp.resamples} resamples of the pieces"
    )
    head = " | ".join(f"{t:g} FA/h" for t in cmp.targets)
    print(f"\n| model | smoothing | {head} | mean |\n|---|---:|" + "---:|" * (len(cmp.targets) + 1))
    for n in cmp.names:
        cells = " | ".join(x.fmt() for x in cmp.recall[n])
        print(f"| {n} | {info[n]['smooth_ms']:g} ms | {cells} | {cmp.mean_recall[n].fmt()} |")
    print(
        f"\n| model - {first} (paired) | {head} | mean | share of resamples ahead |\n|---|"
        + "---:|" * (len(cmp.targets) + 2)
    )
    for n in cmp.names[1:]:
        cells = " | ".join(x.fmt(signed=True) for x in cmp.diff[n])
        print(f"| {n} | {cells} | {cmp.mean_diff[n].fmt(signed=True)} | {cmp.p_better[n]:.2f} |")
    print(
        "\n| model | stored operating point | recall | false accepts per hour |\n|---|---|---:|---:|"
    )
    points = {}
    for n, r in runs.items():
        rec, fa = point_intervals(counts[n], r.base.threshold, args.resamples)
        points[n] = {
            "threshold": r.base.threshold,
            "recall": asdict(rec),
            "fa_per_hour": asdict(fa),
        }
        print(
            f"| {n} | {r.base.threshold:g} over {r.base.smooth_ms:g} ms | {rec.fmt()} | "
            f"{fa.fmt(scale=1.0)} |"
        )
    out = {"split": args.split, "minutes": args.minutes, "hours": hours, "commands": cmds,
           "models": {n: {"dir": dirs[n], **info[n]} for n in cmp.names},
           "comparison": cmp.to_dict(), "operating_points": points}  # fmt: skip
    if args.png:
        plot([out], Path(args.png))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
