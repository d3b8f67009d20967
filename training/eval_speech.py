"""Evaluation of an SC12 keyword-spotting checkpoint: clips, rejection, continuous streams.

``dlr-eval speech MODEL_DIR`` (see ``eval_cli.py``) writes into ``--out``:

- ``eval.json``: every number below;
- ``confusion.png``: confusion matrix of the augmented test clips (+ word-less windows);
- ``det.png``: DET-style curve of the continuous streams (miss rate vs false accepts per hour
  over detection thresholds), valid and test voices.

1. Clip accuracy of the split's test voices, per engine and per voice, on 1.5 s windows whose
   last frame is the prediction (as the server's utterance mode): ``clean`` (faint noise floor)
   and ``augmented`` (the training augmentation: reverb, channel, background, level).
2. Rejection: the share of ``_unknown_`` clips and word-less windows whose prediction is a
   command (argmax), the unknown words' share also for the near misses of a command
   (``vocab.NEAR_MISSES``) and the other words apart, and the share on which the detector
   (operating point) fires; and the model's trade between the two, as a bias on the
   ``_unknown_`` logit sweeps (``rejection_sweep``, ``rejection.png``): a curve to read, not a
   point to choose (``training/kws_calibrate.py`` chooses on valid clips).
3. Continuous streams of valid and test voices (``streams.py``): recall, false accepts per
   hour and detection delay over thresholds; the operating point is chosen on the *valid*
   streams for at most ``fa_target`` false accepts per hour (never on test): one shared
   threshold, or one threshold per command with ``--per-command`` (``operating_point.py``;
   then the DET plot also draws that rule's test results at several targets, and
   ``global_point`` keeps the shared threshold's results for comparison). With several
   ``--smooth-ms`` windows, the one detecting the most valid commands within the target is
   kept (``smoothing`` in eval.json lists each window's best point on the valid streams).
   With ``--vad`` the streams go through the voice-activity gate first, as the server's
   continuous mode runs them by default (frames the gate skips are silence to the detector, and
   each opening feeds its pre-roll into the state the gate closed with; `dlr_runtime/vad.py`).
   ``anatomy`` splits the mistakes at the operating point by kind (``stream_anatomy.py``):
   false accepts by the word they fired on, missed commands by how close they came.
   ``intervals`` (valid and test) gives the recall within each false-accept target, and the
   recall and false accepts per hour at a shared-threshold operating point, with 95 % intervals
   over resamples of the stream pieces (``stream_bootstrap.py``): in one hour a target of
   10 FA/h is ten events, and one more or less moves the recall by points.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from dlr_runtime.kws import KeywordSpotter, KWSConfig, commands_of
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, UNK, WordPool, clip_windows, silence_windows
from training.data.vocab import NEAR_MISSES
from training.detect_sweep import fire, smoothed
from training.kws_calibrate import sweep as bias_sweep
from training.operating_point import ChosenPoint, choose_point, global_point
from training.recipes.kws import KWSOptions, load_split
from training.stream_anatomy import anatomy
from training.stream_bootstrap import compare, piece_counts, point_intervals
from training.streams import StreamScore, build_stream, score, stream_scores

THRESHOLDS = (
    0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8,
    0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.91, 0.92, 0.93,
    0.94, 0.95, 0.96, 0.965, 0.97, 0.975, 0.98, 0.985, 0.99, 0.995,
)  # fmt: skip
# (dense above 0.93: the goal's 0.5-1 false accepts per hour lie there, and one step of 0.02
# moved a model's recall within 1 FA/h from 2 % to 21 %)
DET_TARGETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)  # FA/h targets of the per-command DET line


@dataclass
class EvalOptions:
    cache_dir: str = "runs/sc12cache"  # corpus cache (rendered if missing)
    split: str = ""  # split preset (default: the one the model was trained on)
    more_engines: bool = False  # the corpus with MBROLA, RHVoice and Pico (data/engines.py
    # MORE_ENGINES): their test voices too; always on for a model trained with them
    rhvoice_accents: bool = False  # with the engines, also RHVoice's voices of other languages
    # (data/engines.py RHVOICE_ACCENTED): 16 more test voices. Never taken from the model's
    # training options, so a model trained with them is scored on the same voices as one without
    pico_accents: bool = False  # with the engines, also Pico's voices of other languages
    # (PICO_ACCENTED); they test only in the Pico fold. Not taken from the model either
    mbrola_accents: bool = False  # the same for MBROLA's (MBROLA_ACCENTED), in the MBROLA fold
    out: str = ""  # output folder (default: MODEL_DIR/eval)
    seed: int = 0  # corpus and augmentation seed (the model's training seed by default)
    max_clips: int = 0  # cap on test clips (0: all)
    silence_clips: int = 600  # word-less windows
    stream_minutes: float = 60.0  # total minutes of test streams (0: skip streams)
    valid_stream_minutes: float = 20.0  # minutes of valid streams (operating point)
    stream_piece_minutes: float = 5.0  # length of one stream
    fa_target: float = 0.5  # false accepts per hour that pick the operating point
    per_command: bool = False  # one threshold per command (else one shared threshold)
    smooth_ms: tuple[float, ...] = ()  # smoothing windows to choose from on valid (): the model's
    write_operating_point: bool = False  # store the chosen point in MODEL_DIR's metadata
    vad: bool = False  # streams through the voice-activity gate (its defaults), as the server's
    # continuous mode computes them by default (dlr_runtime/listen.py gated_scores)


@torch.no_grad()
def frame_scores(model: torch.nn.Module, audio: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """Per-frame scores (N, F, C) of windows (N, L), offline."""
    return torch.cat([model(audio[s : s + batch]).float() for s in range(0, len(audio), batch)])


def clip_sample(n: int, max_clips: int, seed: int, salt: int = 0xE7A) -> np.ndarray:
    """Sorted indices of at most `max_clips` of `n` clips (all when 0), drawn from the seed."""
    idx = np.arange(n)
    if max_clips and n > max_clips:
        idx = np.sort(np.random.default_rng([seed, salt]).choice(idx, max_clips, replace=False))
    return idx


def _acc(pred: np.ndarray, lab: np.ndarray) -> float:
    return float((pred == lab).mean()) if len(lab) else float("nan")


def clip_report(
    pred: np.ndarray,
    labels: np.ndarray,
    engines: np.ndarray,
    voices: np.ndarray,
    words: np.ndarray | None = None,
) -> dict[str, Any]:
    """Accuracy overall, on commands, per engine, per voice; unknown accepted as a command,
    and with the clips' `words`, that share among the near misses of a command
    (``vocab.NEAR_MISSES``) and among the other unknown words apart."""
    cmd = labels < SIL
    unk = labels == UNK
    out: dict[str, Any] = {
        "accuracy": _acc(pred, labels),
        "command_accuracy": _acc(pred[cmd], labels[cmd]),
        "unknown_accepted": float((pred[unk] < SIL).mean()) if unk.any() else float("nan"),
        "clips": int(len(labels)),
        "per_engine": {},
        "per_voice": {},
    }
    if words is not None:
        near = np.isin(words, NEAR_MISSES)
        for name, m in (("near_miss", unk & near), ("other_word", unk & ~near)):
            out[f"unknown_accepted_{name}"] = float((pred[m] < SIL).mean()) if m.any() else None
            out[f"unknown_clips_{name}"] = int(m.sum())
    for e in sorted(set(engines.tolist())):
        m = engines == e
        out["per_engine"][e] = {
            "command_accuracy": _acc(pred[m & cmd], labels[m & cmd]),
            "unknown_accepted": float((pred[m & unk] < SIL).mean()) if (m & unk).any() else None,
            "clips": int(m.sum()),
        }
    for v in sorted(set(voices.tolist())):
        m = voices == v
        out["per_voice"][v] = {
            "command_accuracy": _acc(pred[m & cmd], labels[m & cmd]),
            "unknown_accepted": float((pred[m & unk] < SIL).mean()) if (m & unk).any() else None,
        }
    return out


def detector_fires(
    scores: torch.Tensor, labels: list[str], frame_ms: float, cfg: KWSConfig
) -> np.ndarray:
    """Whether the decision rule fires anywhere in each window (N,)."""
    return np.array([bool(KeywordSpotter(labels, frame_ms, cfg).run(s.numpy())) for s in scores])


def plot_confusion(cm: np.ndarray, labels: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    norm = cm / np.maximum(1, cm.sum(1, keepdims=True))
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    for i in range(len(labels)):
        for j in range(len(labels)):
            if cm[i, j]:
                ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=6,
                        color="white" if norm[i, j] > 0.5 else "black")  # fmt: skip
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: `_unknown_` logit biases of the rejection sweep: the model's own trade between commands
#: found and unknown words accepted (b > 0 rejects more; `training/kws_calibrate.py` picks one
#: on valid clips, never on these).
SWEEP_BIASES = tuple(float(b) for b in np.round(np.arange(-4.0, 8.0001, 0.1), 2))


def rejection_sweep(scores: torch.Tensor, labels: np.ndarray) -> list[dict[str, float]]:
    """Last-frame scores (N, C) of command and unknown-word clips -> one point per bias of
    :data:`SWEEP_BIASES`: commands given their label, unknown words called a command."""
    points = bias_sweep(scores, torch.from_numpy(labels), SWEEP_BIASES)
    return [
        {
            "unknown_bias": p.unknown_bias,
            "command_accuracy": p.command_accuracy,
            "unknown_accepted": p.false_accept,
        }
        for p in points
    ]


def commands_within(points: list[dict[str, float]], accepted: float) -> float | None:
    """The most commands found by a bias of the sweep that accepts at most `accepted` of the
    unknown words (None when no bias does)."""
    ok = [p["command_accuracy"] for p in points if p["unknown_accepted"] <= accepted]
    return max(ok) if ok else None


def plot_rejection(sweeps: dict[str, list[dict[str, float]]], path: Path, title: str) -> None:
    """Commands found against unknown words accepted, one line per clip kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for kind, pts in sweeps.items():
        fa = [100 * p["unknown_accepted"] for p in pts]
        found = [100 * p["command_accuracy"] for p in pts]
        (line,) = ax.plot(fa, found, label=kind, lw=1.3)
        zero = next(p for p in pts if p["unknown_bias"] == 0.0)
        ax.plot(100 * zero["unknown_accepted"], 100 * zero["command_accuracy"], "o",
                color=line.get_color(), ms=4)  # fmt: skip
    ax.axvline(100 * 0.02, color="grey", ls=":", lw=0.8, label="2 % (the goal)")
    ax.set_xlim(0, 20)
    ax.set_xlabel("unknown words accepted as a command (%)")
    ax.set_ylabel("commands found (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_det(curves: dict[str, list[dict]], path: Path, fa_target: float) -> None:
    """Miss rate vs false accepts per hour, one line per curve (``fa_per_hour``, ``recall``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, pts in curves.items():
        fa = [max(p["fa_per_hour"], 1e-2) for p in pts]
        miss = [100 * (1 - p["recall"]) for p in pts]
        ax.plot(fa, miss, marker="o", ms=3, label=name)
    ax.axvline(fa_target, color="grey", ls="--", lw=0.8)
    ax.axhline(5.0, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("false accepts per hour (0 drawn at 0.01)")
    ax.set_ylabel("miss rate (%)")
    ax.set_title("continuous streams: shared thresholds " + f"{THRESHOLDS[0]}..{THRESHOLDS[-1]}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Offsets from a run's seed of what the evaluation draws; the probes and benchmarks that rebuild
# its streams and clips go through `split_streams` and these, so they stay in step with it.
STREAM_SEED = {"test": 1, "valid": 2}
CLIP_SEED = 11
SILENCE_SEED = 7


def eval_streams(pool: WordPool, minutes: float, piece: float, rirs, seed: int) -> list:
    """Streams of `pool`'s voices: `minutes` in pieces of `piece` minutes, seeded `seed`."""
    n = max(1, int(round(minutes / piece))) if minutes > 0 else 0
    return [build_stream(pool, min(piece, minutes), rirs, seed + 1000 * k) for k in range(n)]


def split_streams(
    pools: dict[str, WordPool], name: str, minutes: float, rirs, seed: int, piece: float = 5.0
) -> list:
    """dlr-eval speech's streams of split `name` ("valid" | "test") for a run seeded `seed`."""
    if name not in STREAM_SEED:
        raise ValueError(f"streams are built for {sorted(STREAM_SEED)}, not {name!r}")
    return eval_streams(pools[name], minutes, piece, rirs, seed + STREAM_SEED[name])


def sweep(
    per_stream: list, labels: list[str], frame_ms: float, base: KWSConfig
) -> list[StreamScore]:
    """`base` at each of THRESHOLDS shared by every command, scored over `per_stream`; each
    stream smoothed once (training/detect_sweep.py: the reference rule's detections)."""
    sms = [smoothed(x, labels, frame_ms, base) for x, _ in per_stream]
    out = []
    for t in THRESHOLDS:
        cfg = KWSConfig(**{**asdict(base), "threshold": t, "keywords": {}})
        dets = [fire(sm, labels, cfg) for sm in sms]
        out.append(score(per_stream, labels, frame_ms, cfg, dets))
    return out


def stream_intervals(
    per_stream: list,
    labels: list[str],
    frame_ms: float,
    base: KWSConfig,
    threshold: float | None,
    resamples: int = 2000,
) -> dict[str, Any] | None:
    """How sure the stream figures are (training/stream_bootstrap.py): the recall within each of
    DET_TARGETS false accepts per hour and, at the shared `threshold` (None: per-command
    thresholds, skipped), recall and false accepts per hour, each with its 95 % interval over
    resamples of the stream pieces; None for a single piece."""
    if len(per_stream) < 2:
        return None
    counts = piece_counts([sweep([p], labels, frame_ms, base) for p in per_stream])
    cmp = compare({"model": counts}, DET_TARGETS, resamples=resamples)
    out: dict[str, Any] = {
        "pieces": counts.pieces,
        "level": cmp.level,
        "resamples": resamples,
        "within": [
            {"fa_target": t, "recall": iv.value, "low": iv.low, "high": iv.high}
            for t, iv in zip(cmp.targets, cmp.recall["model"], strict=True)
        ],
    }
    if threshold is not None:
        recall, fa = point_intervals(counts, threshold, resamples)
        out["at_operating_point"] = {"recall": asdict(recall), "fa_per_hour": asdict(fa)}
    return out


def with_more_engines(kws_opts: dict[str, Any], opts: EvalOptions) -> bool:
    """Whether a model is scored with the three opt-in engines: it trained with them (its
    metadata's kws options `kws_opts`) or `opts` asks for them."""
    return opts.more_engines or bool(kws_opts.get("more_engines", False))


def scoring_pools(
    kws_opts: dict[str, Any], split: str, seed: int, opts: EvalOptions
) -> dict[str, WordPool]:
    """The word pools a model is scored on: split `split` of the corpus it was trained on
    (its metadata's kws options `kws_opts`: the small corpus, the three opt-in engines), with
    the accented voices `opts` asks for. dlr-eval speech and the benchmarks that score its
    streams build them here, so both score the same voices."""
    return load_split(
        KWSOptions(
            cache_dir=opts.cache_dir,
            split=split,
            tiny_corpus=bool(kws_opts.get("tiny_corpus", False)),
            more_engines=with_more_engines(kws_opts, opts),
            rhvoice_accents=opts.rhvoice_accents,
            pico_accents=opts.pico_accents,
            mbrola_accents=opts.mbrola_accents,
        ),
        seed,
    )


def evaluate(model_dir: str | Path, opts: EvalOptions) -> dict[str, Any]:
    """Run every evaluation of the module docstring; returns (and writes) the results."""
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model_dir = Path(model_dir)
    model = load_checkpoint(model_dir).eval()
    meta = getattr(model, "checkpoint_metadata", {}) or {}
    training = meta.get("training", {})
    kws_opts = training.get("recipe_options", {}).get("kws", {})
    split = opts.split or kws_opts.get("split", "")
    if not split:
        split = "final"
        print(
            f"{model_dir}: its metadata names no training split; scoring the 'final' split's "
            "test voices (give --split for a leave-one-synthesizer-out fold)",
            file=sys.stderr,
        )
    seed = opts.seed or int(training.get("train", {}).get("seed", 0))
    out = Path(opts.out) if opts.out else model_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    labels = list(cfg.labels)
    frame_ms = 1000 * cfg.frame_stride / cfg.sample_rate
    base = KWSConfig.from_metadata(meta)
    more = with_more_engines(kws_opts, opts)
    pools = scoring_pools(kws_opts, split, seed, opts)
    rirs = rir_bank(opts.cache_dir, seed=seed)
    test = pools["test"]
    idx = clip_sample(len(test), opts.max_clips, seed)
    lab = test.labels[idx]
    results: dict[str, Any] = {
        "model": str(model_dir),
        "split": split,
        "seed": seed,
        "more_engines": more,
        "rhvoice_accents": opts.rhvoice_accents,
        "pico_accents": opts.pico_accents,
        "mbrola_accents": opts.mbrola_accents,
    }
    results["test_voices"] = sorted(set(test.voices.tolist()))
    results["sizes"] = {k: int(len(p)) for k, p in pools.items()}
    results["clip_detector"] = base.to_dict()  # the rule used for the clip "detector_fires"
    sil_audio = silence_windows(opts.silence_clips, test, seed + SILENCE_SEED)
    sil_scores = frame_scores(model, sil_audio)
    sil_pred = sil_scores[:, -1].argmax(-1).numpy()
    results["silence"] = {
        "windows": int(len(sil_pred)),
        "accepted_argmax": float((sil_pred < SIL).mean()),
        "predicted_silence": float((sil_pred == SIL).mean()),
        "detector_fires": float(detector_fires(sil_scores, labels, frame_ms, base).mean()),
    }
    cm = np.zeros((len(labels), len(labels)), np.int64)
    for kind in ("clean", "augmented"):
        audio = clip_windows(test, idx, rirs, seed + CLIP_SEED, augment=kind == "augmented")
        scores = frame_scores(model, audio)
        pred = scores[:, -1].argmax(-1).numpy()
        rep = clip_report(pred, lab, test.engines[idx], test.voices[idx], test.words[idx])
        fires = detector_fires(scores[lab == UNK], labels, frame_ms, base)
        rep["unknown_detector_fires"] = float(fires.mean()) if len(fires) else None
        rep["rejection_sweep"] = rejection_sweep(scores[:, -1], lab)
        results[kind] = rep
        if kind == "augmented":
            np.add.at(cm, (lab, pred), 1)
            np.add.at(cm, (np.full(len(sil_pred), SIL), sil_pred), 1)
    results["confusion"] = cm.tolist()
    plot_rejection(
        {k: results[k]["rejection_sweep"] for k in ("clean", "augmented")},
        out / "rejection.png",
        f"{model_dir.name}: test voices ({split}), the _unknown_ bias swept (dot: none)",
    )
    plot_confusion(cm, labels, out / "confusion.png", f"{model_dir.name}: test voices ({split})")
    if opts.stream_minutes > 0:
        results["streams"] = _stream_eval(
            model, pools, rirs, seed, labels, frame_ms, base, opts, out
        )
        if opts.write_operating_point:
            write_operating_point(model_dir, results["streams"]["operating_point"])
    (out / "eval.json").write_text(json.dumps(results, indent=1))
    return results


def _stream_eval(model, pools, rirs, seed, labels, frame_ms, base, opts, out) -> dict[str, Any]:
    res: dict[str, Any] = {"vad": opts.vad}
    curves: dict[str, list[dict]] = {}
    per = {}
    for name, minutes in (("valid", opts.valid_stream_minutes), ("test", opts.stream_minutes)):
        streams = split_streams(pools, name, minutes, rirs, seed, opts.stream_piece_minutes)
        per[name] = [(stream_scores(model, s.audio, gated=opts.vad), s) for s in streams]
        res[name] = {"hours": sum(s.hours for s in streams)}
    # the smoothing window: the one whose best threshold within the target detects the most
    # valid commands (ties: the shorter window, which fires sooner; none within the target:
    # the one with the fewest false accepts)
    by_smooth = {}
    for ms in opts.smooth_ms or (base.smooth_ms,):
        b = KWSConfig(**{**asdict(base), "smooth_ms": float(ms)})
        by_smooth[float(ms)] = (b, sweep(per["valid"], labels, frame_ms, b))
    res["smoothing"] = {
        f"{ms:g}": global_point(sw, opts.fa_target).summary() for ms, (_, sw) in by_smooth.items()
    }

    def rank(ms: float) -> tuple[bool, float, float]:  # within the target first, then recall
        g = global_point(by_smooth[ms][1], opts.fa_target)
        ok = g.fa_per_hour <= opts.fa_target
        return (ok, g.detected if ok else -g.fa_per_hour, -ms)

    best = max(by_smooth, key=rank)
    base = by_smooth[best][0]
    sweeps = {"valid": by_smooth[best][1], "test": sweep(per["test"], labels, frame_ms, base)}
    for name in ("valid", "test"):
        curves[f"{name} voices"] = [s.summary() for s in sweeps[name]]
        res[name]["curve"] = curves[f"{name} voices"]

    def on(name: str) -> Callable[[KWSConfig], StreamScore]:
        return lambda cfg: score(per[name], labels, frame_ms, cfg)

    def pick(target: float, per_command: bool) -> ChosenPoint:
        cmds = commands_of(labels)
        return choose_point(sweeps["valid"], base, cmds, target, on("valid"), per_command)

    chosen = pick(opts.fa_target, opts.per_command)
    res["operating_point"] = chosen.config.to_dict()
    res["rule"] = chosen.rule  # "per_command" | "global" (see training/operating_point.py)
    res["fa_target"] = opts.fa_target  # what picked it: <= this FA/h on the valid streams
    at = (  # a shared threshold was scored in the sweep already
        next(t for t in sweeps["test"] if t.threshold == chosen.config.threshold)
        if chosen.rule == "global"
        else on("test")(chosen.config)
    )
    res["test_at_operating_point"] = at.summary()
    res["valid_at_operating_point"] = chosen.valid.summary()
    shared = chosen.config.threshold if chosen.rule == "global" else None
    for name in ("valid", "test"):
        res[name]["intervals"] = stream_intervals(per[name], labels, frame_ms, base, shared)
    # what the mistakes at that point are made of (training/stream_anatomy.py)
    res["anatomy"] = {
        name: anatomy(per[name], labels, frame_ms, chosen.config).summary()
        for name in ("valid", "test")
    }
    res["test_per_command"] = {
        c: {
            "threshold": chosen.config.keywords.get(c, chosen.config.threshold),
            "commands": at.commands_by_label[c],
            "detected": at.detected_by_label[c],
            "false_accepts": at.false_by_label[c],
        }
        for c in commands_of(labels)
    }
    if opts.per_command:
        glob = pick(opts.fa_target, per_command=False)
        res["global_point"] = {
            "threshold": glob.config.threshold,
            "valid": glob.valid.summary(),
            "test": on("test")(glob.config).summary(),
        }
        line = []
        for target in DET_TARGETS:
            p = pick(target, per_command=True)
            line.append({"fa_target": target, "rule": p.rule, **on("test")(p.config).summary()})
        res["per_command_curve"] = line
        curves["test voices, per-command thresholds (chosen on valid)"] = line
    plot_det(curves, out / "det.png", opts.fa_target)
    return res


def write_operating_point(model_dir: Path, point: dict[str, Any]) -> None:
    """Store the detection operating point in the checkpoint's metadata (config.json)."""
    path = Path(model_dir) / "config.json"
    header = json.loads(path.read_text())
    header.setdefault("metadata", {})["detection"] = point
    path.write_text(json.dumps(header, indent=1, sort_keys=True))
