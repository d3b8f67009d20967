"""Probe (not part of the product): a second-stage verifier trained on the detector's own
mistakes, mined from streams of the *training* voices.

`verify_streams.py` found that re-scoring a detection's last second with the same kind of
model changes nothing at the operating point: every model here takes the same near misses
for commands. This probe trains the verifier for the job, in the usual cascade way:

1. streams of the train split's voices (`training.streams.build_stream`, the evaluation's
   recipe with other seeds), scored by the stage-1 model through the gate as the server runs
   it; its detector fires at a low threshold (``--mine-threshold``);
2. each firing gives one window: the ``--window-s`` of audio before the firing frame, labelled
   with what was said (a hit: its command; a false accept: the command or ``_unknown_`` word
   it fired on, ``_silence_`` when no word was near);
3. the stage-1 weights are fine-tuned on those windows (each batch: ``--mined-share`` of them)
   and the train split's augmented clip windows (`data.sc12.clip_windows`, the words ending
   0.15-0.45 s before the window's end, as in the mined windows), cross-entropy at the last
   frame;
4. the result is written as a checkpoint, to be scored as a verifier by `verify_streams.py`.

Only training voices are used here, so the valid and test streams stay unheard.

    PYTHONPATH=. python training/cards/probes/mined_verifier.py runs/vf_mined \\
        [--stage1 models/speech-commands] [--minutes 180] [--steps 800]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from dlr_runtime import load_checkpoint, save_checkpoint, to_recurrent
from dlr_runtime.kws import Detection, KeywordSpotter, KWSConfig
from dlr_runtime.listen import gated_scores
from training.data.labels import SAMPLE_RATE
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, clip_windows
from training.recipes.kws import KWSOptions, load_split
from training.stream_anatomy import word_at
from training.streams import Event, Stream, build_stream, match

MINE_SEED = 0x3A1E  # stream seeds of the mining (the evaluation's are 0-based small offsets)


def fired_on(d: Detection, events: list[Event], max_delay_s: float = 1.2) -> int:
    """The label of the word a detection fired on (`stream_anatomy.word_at`; SIL when none)."""
    e = word_at(d.end_ms / 1000 * SAMPLE_RATE, events, int(max_delay_s * SAMPLE_RATE))
    return SIL if e is None else e.label


def mine(
    stage1: str, minutes: float, threshold: float, window_s: float
) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    """Windows (N, L) and labels (N,) of every firing on the train voices' streams."""
    model = load_checkpoint(stage1).eval()
    cfg = model.config
    labels = list(cfg.labels)
    rec = to_recurrent(model, dtype=torch.complex64)
    base = replace(KWSConfig.from_metadata(model.checkpoint_metadata), keywords={})
    frame_ms = 1000 * cfg.frame_stride / cfg.sample_rate
    opts = KWSOptions(split="final", more_engines=True, rhvoice_accents=True)
    pool = load_split(opts, 0)["train"]
    rirs = rir_bank(opts.cache_dir, seed=0)
    n = int(window_s * SAMPLE_RATE)
    wins: list[np.ndarray] = []
    labs: list[int] = []
    counts = {"hits": 0, "false_accepts": 0, "streams": 0}
    pieces = int(np.ceil(minutes / 5.0))
    t0 = time.time()
    for k in range(pieces):
        s: Stream = build_stream(pool, 5.0, rirs, MINE_SEED + 1000 * k)
        dets = KeywordSpotter(labels, frame_ms, replace(base, threshold=threshold)).run(
            gated_scores(rec, s.audio)
        )
        m = match(dets, s.events, labels)
        false_ids = {id(d) for d in m.false}
        for d in dets:
            end = (d.frame + 1) * cfg.frame_stride
            w = s.audio[max(0, end - n) : end]
            wins.append(np.pad(w, (n - len(w), 0)))
            if id(d) in false_ids:
                labs.append(fired_on(d, s.events))
                counts["false_accepts"] += 1
            else:
                labs.append(labels.index(d.label))
                counts["hits"] += 1
        counts["streams"] += 1
        print(
            f"  mined stream {k + 1}/{pieces}: {counts['hits']} hits, "
            f"{counts['false_accepts']} false accepts ({time.time() - t0:.0f} s)",
            flush=True,
        )
    x = torch.from_numpy(np.stack(wins)) if wins else torch.zeros(0, n)
    return x, torch.tensor(labs, dtype=torch.long), counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--stage1", default="models/speech-commands")
    ap.add_argument("--minutes", type=float, default=180.0, help="of train-voice streams")
    ap.add_argument("--mine-threshold", type=float, default=0.5)
    ap.add_argument("--window-s", type=float, default=1.5)
    ap.add_argument("--clips", type=int, default=8000, help="train clip windows mixed in")
    ap.add_argument("--mined-share", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    x_m, y_m, counts = mine(a.stage1, a.minutes, a.mine_threshold, a.window_s)
    print(f"mined {counts}; labels {np.bincount(y_m.numpy(), minlength=12).tolist()}", flush=True)
    opts = KWSOptions(split="final", more_engines=True, rhvoice_accents=True)
    pool = load_split(opts, 0)["train"]
    rirs = rir_bank(opts.cache_dir, seed=0)
    idx = np.sort(np.random.default_rng(MINE_SEED).choice(len(pool), a.clips, replace=False))
    x_c = clip_windows(pool, idx, rirs, seed=MINE_SEED, augment=True, window_s=a.window_s)
    y_c = torch.from_numpy(pool.labels[idx].astype(np.int64))
    model = load_checkpoint(a.stage1)
    meta = dict(model.checkpoint_metadata)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    rng = np.random.default_rng(MINE_SEED + 1)
    n_m = int(round(a.batch_size * a.mined_share))
    t0 = time.time()
    for step in range(1, a.steps + 1):
        im = rng.integers(len(x_m), size=n_m)
        ic = rng.integers(len(x_c), size=a.batch_size - n_m)
        x = torch.cat([x_m[im], x_c[ic]])
        y = torch.cat([y_m[im], y_c[ic]])
        gain = torch.from_numpy(
            10 ** (rng.uniform(-6, 6, size=(len(x), 1)) / 20).astype(np.float32)
        )
        logits = model(torch.clamp(x * gain, -1, 1))[:, -1]
        loss = F.cross_entropy(logits, y, label_smoothing=0.05)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            acc = (logits.argmax(-1) == y).float().mean().item()
            print(
                f"  step {step}/{a.steps}: loss {loss.item():.3f} acc {acc:.2f} "
                f"({time.time() - t0:.0f} s)",
                flush=True,
            )
    meta["verifier"] = {"mined": counts, "args": vars(a)}
    save_checkpoint(model.eval(), f"{a.out}/model", **meta)
    print(f"-> {a.out}/model", flush=True)


if __name__ == "__main__":
    main()
