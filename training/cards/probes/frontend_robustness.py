"""Probe (not part of the product): is a front end itself robust to rooms and noise?

`augment_probe.py` found that a model on the speech embedding loses more than the log-mel
model to room reverberation, strong background and clipping. That model is a DLR network
trained on the frozen embedding, so the loss could be the features' or the network's. This
probe takes the network out: for each front end (the shipped model's log-mel, the frozen
speech embedding, and both side by side) it fits one linear classifier of the ten commands
on the front end's features alone, from the training voices' command clips under the
training augmentation, and scores it on held-out voices' command clips through one effect at
a time (the effects of `augment_probe.py`). A front end whose accuracy falls further under an
effect, relative to its clean accuracy, loses more of the word's identity to that effect
before any training.
``--model NAME=DIR`` adds a trained model on the same clips, twice: its last frame's argmax
over all its labels (what the evaluation scores: a command can be rejected as `_unknown_` or
`_silence_`) and over the ten commands alone (what the linear classifiers answer), so a
voice's misses can be split into rejections and confusions.

Features: each 1.5 s window's last second of frames, cut into four equal spans, each span's
mean and max per feature (order kept coarsely); standardised on the training windows. The
classifier: multinomial logistic regression (L-BFGS, L2), the same for both front ends.
Voices: the final split's (`training/data/splits.py`) train and test voices among those whose
clean clips are rendered in `--cache-dir` (a partly rendered corpus serves: the JSON lists
the voices used).

    PYTHONPATH=. python training/cards/probes/frontend_robustness.py --test-clips 5000 \\
        --model "log-mel model (shipped)=models/speech-commands" \\
        --out training/cards/frontend-robustness.json --png training/cards/frontend-robustness.png
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F

from dlr_runtime import DLRConfig, load_checkpoint
from dlr_runtime.config import EMBED_STRIDE, EMBED_WINDOW
from dlr_runtime.frontend import make_frontend
from dlr_runtime.model import frames_of
from dlr_runtime.speech_embedding import SpeechEmbedding
from training.data.corpus import (
    CorpusConfig,
    all_tts_voices,
    engines_for,
    is_rendered,
    load_voice,
)
from training.data.labels import SAMPLE_RATE
from training.data.rooms import RoomConfig, rir_bank
from training.data.sc12 import SIL, UNK, WordPool, clip_windows
from training.data.splits import check_disjoint, split_voices
from training.eval_speech import frame_scores

SEED = 0xF40
SPANS = 4
TAIL_S = 1.0


def _augment_probe() -> ModuleType:
    """augment_probe.py, for its EFFECTS and plot_bars (the probes folder is not a package)."""
    path = Path(__file__).with_name("augment_probe.py")
    spec = importlib.util.spec_from_file_location("augment_probe", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_pools(cache_dir: Path) -> tuple[WordPool, WordPool]:
    """(train, test) pools of the final split's voices whose clean clips are rendered."""
    cfg = CorpusConfig(engines=engines_for(True), rhvoice_accents=True)
    voices = [v for v in all_tts_voices(cfg) if is_rendered(cache_dir, cfg, v)]
    split = split_voices(voices, "final")
    check_disjoint(split)
    return tuple(  # type: ignore[return-value]
        WordPool.from_voices([load_voice(cache_dir, cfg, v) for v in split[part]])
        for part in ("train", "test")
    )


class Features:
    """A front end's frames of 1.5 s windows -> one pooled vector per window."""

    def __init__(self, name: str, cfg: DLRConfig) -> None:
        self.name = name
        self.cfg = cfg
        self.frontend = make_frontend(cfg).eval()

    @torch.no_grad()
    def __call__(self, audio: torch.Tensor, batch: int = 64) -> torch.Tensor:
        out = []
        for s in range(0, len(audio), batch):
            x = audio[s : s + batch]
            if isinstance(self.frontend, SpeechEmbedding):
                feats = self.frontend.from_audio(x, self.cfg.history)  # (B, T, 96)
            else:
                feats = self.frontend(frames_of(x, self.cfg.frame_stride, self.cfg.history))
            tail = int(TAIL_S * SAMPLE_RATE) // self.cfg.frame_stride
            spans = feats[:, -tail:].chunk(SPANS, dim=1)  # SPANS x (B, tail / SPANS, F)
            out.append(torch.cat([f(p) for p in spans for f in _POOLS], dim=-1))
        return torch.cat(out).double()  # (N, SPANS * 2 * F)


_POOLS = (lambda p: p.mean(1), lambda p: p.amax(1))


BOTH = "both, side by side"  # the two front ends' pooled vectors concatenated


def pooled(fronts: list[Features], audio: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each front end's pooled vectors of ``audio``, and both side by side (each computed once)."""
    out = {fe.name: fe(audio) for fe in fronts}
    out[BOTH] = torch.cat(list(out.values()), dim=-1)
    return out


def fit(x: torch.Tensor, y: torch.Tensor, l2: float = 1e-3) -> torch.Tensor:
    """Multinomial logistic regression weights (F + 1, 10) by L-BFGS."""
    xb = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    w = torch.zeros(xb.shape[1], 10, dtype=x.dtype, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(xb @ w, y) + l2 * (w[:-1] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach()


def predict(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    xb = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    return (xb @ w).argmax(1)


def accuracy(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((predict(w, x) == y).double().mean())


def voice_group(key: str) -> str:
    """espeak-ng's test variants as one group, every other voice on its own."""
    return "espeak-ng (3 variants)" if key.startswith("espeak:") else key


def plot(results: dict, png: str) -> None:
    """Accuracy per effect: each front end's linear classifier and each trained model."""
    _augment_probe().plot_bars(
        results["accuracy"],
        f"commands right, % ({results['test_clips']} test-voice clips per effect)",
        "Front ends alone (a linear classifier of the ten commands on their features)\n"
        "and a trained model, one augmentation effect at a time",
        png,
        ncol=2,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, default=Path("runs/sc12cache"))
    ap.add_argument("--logmel", type=Path, default=Path("models/speech-commands"))
    ap.add_argument("--train-clips", type=int, default=6000)
    ap.add_argument("--test-clips", type=int, default=1200)
    ap.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also score a trained model on the same clips: its last frame's argmax over all "
        "labels (a command can be rejected) and over the ten commands alone",
    )
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    ap.add_argument("--png", default=None, help="draw the table here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    train, test = load_pools(a.cache_dir)
    rng = np.random.default_rng(SEED)
    cmd_tr, cmd_te = np.flatnonzero(train.labels < SIL), np.flatnonzero(test.labels < SIL)
    tr = np.sort(rng.choice(cmd_tr, min(a.train_clips, len(cmd_tr)), replace=False))
    te = np.sort(rng.choice(cmd_te, min(a.test_clips, len(cmd_te)), replace=False))
    print(
        f"train {len(tr)} of {len(cmd_tr)} command clips ({len(set(train.voices))} voices), "
        f"test {len(te)} of {len(cmd_te)} ({len(set(test.voices))} voices)",
        flush=True,
    )
    rirs = rir_bank(a.cache_dir, seed=0)
    logmel_cfg = load_checkpoint(a.logmel).config
    embed_cfg = replace(
        logmel_cfg,
        frontend="speech_embedding",
        frame_stride=EMBED_STRIDE,
        frame_window=EMBED_WINDOW,
    )
    logmel = Features("log-mel (the shipped front end)", logmel_cfg)
    embed = Features("speech embedding (frozen)", embed_cfg)
    fronts = [logmel, embed]
    y_tr = torch.from_numpy(train.labels[tr])
    y_te = torch.from_numpy(test.labels[te])
    x_train = clip_windows(train, tr, rirs, SEED, augment=True)  # the training augmentation
    weights, stats = {}, {}
    for name, f in pooled(fronts, x_train).items():
        mu, sd = f.mean(0), f.std(0).clamp_min(1e-6)
        stats[name] = (mu, sd)
        weights[name] = fit((f - mu) / sd, y_tr)
        acc = accuracy(weights[name], (f - mu) / sd, y_tr)
        print(f"{name}: {f.shape[1]} features, training accuracy {100 * acc:.1f} %", flush=True)
    models = {}
    for spec in a.model:
        name, path = spec.split("=", 1)
        models[name] = load_checkpoint(path).eval()
    groups = np.array([voice_group(str(v)) for v in test.voices[te]])
    table: dict[str, dict[str, float]] = {}
    per_voice: dict[str, dict[str, dict[str, float]]] = {}
    effects: dict[str, RoomConfig] = _augment_probe().EFFECTS
    for effect, room in effects.items():
        audio = clip_windows(test, te, rirs, SEED + 1, augment=True, room=room)
        row, by_voice = {}, {}
        for name, f in pooled(fronts, audio).items():
            mu, sd = stats[name]
            right = (predict(weights[name], (f - mu) / sd) == y_te).numpy()
            row[name] = float(right.mean())
            by_voice[name] = {g: float(right[groups == g].mean()) for g in sorted(set(groups))}
        for name, model in models.items():
            with torch.no_grad():
                last = frame_scores(model, audio)[:, -1]  # (N, labels)
            for suffix, pred in (
                ("all labels", last.argmax(-1)),
                ("commands alone", last[:, :SIL].argmax(-1)),
            ):
                right = (pred == y_te).numpy()
                row[f"{name}, {suffix}"] = float(right.mean())
                by_voice[f"{name}, {suffix}"] = {
                    g: float(right[groups == g].mean()) for g in sorted(set(groups))
                }
            top = last.argmax(-1).numpy()
            for label, idx in (("_silence_", SIL), ("_unknown_", UNK)):
                by_voice[f"{name}, called {label}"] = {
                    g: float((top[groups == g] == idx).mean()) for g in sorted(set(groups))
                }
        table[effect] = row
        per_voice[effect] = by_voice
        cells = ", ".join(f"{n} {100 * v:.1f} %" for n, v in row.items())
        print(f"{effect}: {cells} ({time.time() - t0:.0f} s)", flush=True)
    results = {
        "train_clips": len(tr),
        "test_clips": len(te),
        "train_voices": sorted(set(train.voices)),
        "test_voices": sorted(set(test.voices)),
        "frontends": [*(fe.name for fe in fronts), BOTH],
        "models": dict(spec.split("=", 1) for spec in a.model),
        "accuracy": table,
        "accuracy_per_voice": per_voice,
    }
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    if a.png:
        plot(results, a.png)
    for effect in ("none", "all (the evaluation's augmented)"):
        print(f"per voice, {effect}:")
        for name, by_voice in per_voice[effect].items():
            print(f"  {name}: " + ", ".join(f"{g} {100 * v:.1f} %" for g, v in by_voice.items()))


if __name__ == "__main__":
    main()
