"""Probe (not part of the product): how much would an ensemble of models find on the streams?

A weight average (`training/soup.py`) is one model; an *output* ensemble averages the
posteriors of several models frame by frame and costs one forward per member. If the ensemble
finds many more commands at equal false accepts than its best member, a single model distilled
from it is worth training; if not, that lever is closed.

Two steps. ``dump`` scores the evaluation's streams (`dlr-eval speech`'s seeds and lengths,
through the server's gate) with one model and stores each stream's (F, C) logits; ``combine``
averages the members' softmax posteriors per frame and runs the same detector: for each
smoothing window, the valid streams' point within the target (`global_point`, a finer grid)
and the test streams at that point, plus the best test recall within 1 / 10 / 20 FA/h.

    PYTHONPATH=. python training/cards/probes/ensemble_streams.py dump MODEL OUT.npz
    PYTHONPATH=. python training/cards/probes/ensemble_streams.py combine A.npz B.npz ...

Members may have different frame strides (log-mel's 20 ms and the speech embedding's 80 ms):
each member's rows are put on the finest stride by holding each frame's posterior until its
next frame (causal: a fine frame sees only the coarse frames that ended by its own end), and a
frame before a member's first frame averages the other members only. ``clips`` scores the
evaluation's test clips (`dlr-eval speech`'s sample, clean and augmented) with the members and
their mean posterior at each window's end: commands per engine and per voice, unknown words
accepted.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import torch

from dlr_runtime import load_checkpoint, to_recurrent
from dlr_runtime.kws import KWSConfig, softmax
from dlr_runtime.listen import gated_scores
from training.data.rooms import rir_bank
from training.data.sc12 import clip_windows
from training.eval_speech import (
    CLIP_SEED,
    THRESHOLDS,
    EvalOptions,
    clip_report,
    clip_sample,
    frame_scores,
    split_streams,
)
from training.operating_point import global_point
from training.recipes.kws import KWSOptions, load_split
from training.streams import score

GRID = sorted({*THRESHOLDS, 0.45, 0.55, 0.65, 0.82, 0.83, 0.84, 0.94, 0.96})
SPLITS = ("valid", "test")


def _streams(minutes: float, more_engines: bool) -> dict[str, list]:
    """`dlr-eval speech`'s valid and test streams of a model trained on the "final" split
    (seed 0; `more_engines` as its recipe: every model since the eighth session's)."""
    pools = load_split(KWSOptions(split="final", more_engines=more_engines), 0)
    rirs = rir_bank(KWSOptions().cache_dir, seed=0)
    return {name: split_streams(pools, name, minutes, rirs, 0) for name in SPLITS}


def dump(model_dir: str, out: str, minutes: float, more_engines: bool) -> None:
    torch.set_num_threads(1)
    model = load_checkpoint(model_dir).eval()
    rec = to_recurrent(model, dtype=torch.complex64)
    arrays = {}
    for name, streams in _streams(minutes, more_engines).items():
        for i, s in enumerate(streams):
            arrays[f"{name}_{i}"] = gated_scores(rec, s.audio).astype(np.float32)
    np.savez(
        out,
        labels=np.array(model.config.labels),
        frame_stride=model.config.frame_stride,
        minutes=minutes,
        more_engines=more_engines,
        **arrays,
    )
    print(f"{model_dir}: {len(arrays)} streams -> {out}", flush=True)


def on_stride(rows: np.ndarray, stride: int, fine: int, frames: int) -> np.ndarray:
    """A member's (F, C) rows at `stride` samples -> (frames, C) at the finer `fine` stride,
    each fine frame holding the last coarse frame that ended by its own end; NaN rows before
    the first one."""
    if stride % fine:
        raise ValueError(f"frame stride {stride} is not a multiple of {fine}")
    k = (np.arange(1, frames + 1) * fine) // stride - 1  # the coarse frame each one sees
    out = np.full((frames, rows.shape[1]), np.nan)
    ok = (k >= 0) & (k < len(rows))
    out[ok] = rows[k[ok]]
    return out


def mean_posterior_logits(
    members: list[np.ndarray], strides: list[int] | None = None
) -> np.ndarray:
    """(F_i, C) logits of each member (at its frame stride; all equal when None) -> log of
    the frame-wise mean posterior at the finest stride (F, C)."""
    strides = strides or [1] * len(members)
    fine = min(strides)
    frames = min(len(m) * s // fine for m, s in zip(members, strides, strict=True))
    posts = [
        on_stride(softmax(m.astype(np.float64)), s, fine, frames)
        for m, s in zip(members, strides, strict=True)
    ]
    p = np.nanmean(np.stack(posts), axis=0)  # (F, C): the members present at each frame
    return np.log(p + 1e-30)


def combine(paths: list[str], minutes: float, template: str) -> None:
    dumps = [np.load(p) for p in paths]
    labels = [str(x) for x in dumps[0]["labels"]]
    if any([str(x) for x in d["labels"]] != labels for d in dumps):
        raise SystemExit("members disagree on the label set")
    if any(float(d["minutes"]) != minutes for d in dumps):
        raise SystemExit(f"every member must be dumped with --minutes {minutes:g}")
    more = bool(dumps[0].get("more_engines", False))  # dumps before the flag: base engines
    if any(bool(d.get("more_engines", False)) != more for d in dumps):
        raise SystemExit("members were dumped with and without --more-engines")
    streams = _streams(minutes, more)  # rebuilt (deterministic): the dumps keep scores, not words
    model = load_checkpoint(template)
    strides = [
        int(d["frame_stride"]) if "frame_stride" in d else model.config.frame_stride for d in dumps
    ]
    frame_ms = 1000 * min(strides) / model.config.sample_rate
    base = replace(KWSConfig.from_metadata(model.checkpoint_metadata), keywords={})
    per = {
        name: [
            (mean_posterior_logits([d[f"{name}_{i}"] for d in dumps], strides), s)
            for i, s in enumerate(ss)
        ]
        for name, ss in streams.items()
    }
    print(" + ".join(paths), flush=True)
    for ms in (100.0, 200.0, 300.0, 400.0):
        at = replace(base, smooth_ms=ms)
        v = [score(per["valid"], labels, frame_ms, replace(at, threshold=t)) for t in GRID]
        t_sw = [score(per["test"], labels, frame_ms, replace(at, threshold=t)) for t in GRID]
        g = global_point(v, 10.0)
        te = next(s for s in t_sw if s.threshold == g.threshold)
        best = [
            max((s.recall for s in t_sw if s.fa_per_hour <= b), default=0.0) for b in (1, 10, 20)
        ]
        print(
            f"  {ms:3.0f} ms: valid {g.recall:.3f} at {g.fa_per_hour:.0f} FA/h "
            f"(threshold {g.threshold:g}) -> test {te.recall:.3f} at {te.fa_per_hour:.0f} FA/h; "
            f"best test within 1/10/20 FA/h {' / '.join(f'{b:.3f}' for b in best)}",
            flush=True,
        )


def clips(members: list[str], max_clips: int, more_engines: bool) -> None:
    """The evaluation's test clips through each member and their mean posterior."""
    torch.set_num_threads(1)
    test = load_split(KWSOptions(split="final", more_engines=more_engines), 0)["test"]
    rirs = rir_bank(KWSOptions().cache_dir, seed=0)
    idx = clip_sample(len(test), max_clips, 0)
    lab = test.labels[idx]
    models = {
        spec.split("=", 1)[0]: load_checkpoint(spec.split("=", 1)[1]).eval() for spec in members
    }
    for kind in ("clean", "augmented"):
        audio = clip_windows(test, idx, rirs, CLIP_SEED, augment=kind == "augmented")
        posts = {}
        with torch.no_grad():
            for name, model in models.items():
                posts[name] = torch.softmax(frame_scores(model, audio)[:, -1].double(), -1).numpy()
        posts["mean of all"] = np.mean(list(posts.values()), axis=0)
        for name, p in posts.items():
            rep = clip_report(
                p.argmax(-1), lab, test.engines[idx], test.voices[idx], test.words[idx]
            )
            worst = min(rep["per_voice"].items(), key=lambda kv: kv[1]["command_accuracy"])
            engines = ", ".join(
                f"{e} {100 * r['command_accuracy']:.1f}" for e, r in rep["per_engine"].items()
            )
            print(
                f"{kind:9s} {name}: commands {100 * rep['command_accuracy']:.1f} %, unknown "
                f"accepted {100 * rep['unknown_accepted']:.1f} % (near misses "
                f"{100 * rep['unknown_accepted_near_miss']:.1f} %), worst voice {worst[0]} "
                f"{100 * worst[1]['command_accuracy']:.1f} %; per engine: {engines}",
                flush=True,
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("model")
    d.add_argument("out")
    d.add_argument(
        "--more-engines",
        action="store_true",
        help="the streams of the eighth session's engines (every model trained with them)",
    )
    c = sub.add_parser("combine")
    c.add_argument("dumps", nargs="+")
    c.add_argument("--template", default="models/speech-commands")
    for p in (d, c):
        p.add_argument("--minutes", type=float, default=60.0)
    k = sub.add_parser("clips")
    k.add_argument("members", nargs="+", help="name=checkpoint directory")
    k.add_argument("--max-clips", type=int, default=EvalOptions().max_clips)
    a = ap.parse_args()
    if a.cmd == "dump":
        dump(a.model, a.out, a.minutes, a.more_engines)
    elif a.cmd == "clips":
        clips(a.members, a.max_clips, more_engines=True)
    else:
        combine(a.dumps, a.minutes, a.template)
