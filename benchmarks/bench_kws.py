"""Keyword spotting in continuous streams: what silence costs, how many idle streams fit, and
false accepts per hour on long non-command audio.

Runs the server's engine-thread path in-process (`dlr_runtime.listen.feed_listening` over an
`Engine`, one thread, batches of 100 ms per stream as the scheduler forms them), so it measures
compute, not the network. Every figure is a ratio or a count from one run:

1. CPU per stream-second of audio (process CPU time) for streams that are speaking (espeak-ng
   words back to back), silent (a quiet room, -80 dBFS), steady white noise (-40 dBFS) and
   mostly idle (10 % speech); the silent/speaking ratio is the goal (<= 5 %).
2. Mostly-idle streams one engine thread holds in real time: streams / (CPU s per audio s) of a
   batch of `--streams` such streams.
3. False accepts per hour: `--fa-minutes` of non-command espeak-ng words (several voices) with
   pauses and noise, through the model's operating point.

    python -m benchmarks.bench_kws [--model models/speech-commands] [--streams 64]
        [--seconds 10] [--fa-minutes 10] [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import io
import subprocess
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from scipy.signal import resample_poly

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from dlr_runtime.kws import KWSConfig
from dlr_runtime.listen import Listener, feed_listening
from dlr_runtime.vad import GateConfig

RATE = 16000
COMMAND_WORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
OTHER_WORDS = [
    "house",
    "table",
    "window",
    "cat",
    "bird",
    "water",
    "green",
    "paper",
    "music",
    "river",
    "happy",
    "seven",
    "morning",
    "yellow",
    "garden",
    "number",
    "simple",
    "father",
    "little",
    "quiet",
    "dog",
    "tree",
    "apple",
    "market",
    "doctor",
    "pencil",
    "orange",
    "basket",
    "winter",
    "summer",
    "bottle",
    "jacket",
    "mountain",
    "island",
    "letter",
    "coffee",
    "ticket",
    "button",
    "monkey",
]
VOICES = ["en-us", "en-gb", "en-us+f3", "en-gb+m3", "en-sc", "en-us+f2"]


def say(word: str, voice: str) -> np.ndarray:
    out = subprocess.run(
        ["espeak-ng", "-v", voice, "--stdout", word], capture_output=True, check=True
    ).stdout
    x, sr = sf.read(io.BytesIO(out), dtype="float32")
    return 0.8 * resample_poly(x, RATE, sr).astype(np.float32)


def speech(seconds: float, rng: np.random.Generator, words: list[str], gap=(0.05, 0.2)):
    parts, n = [], 0
    cache: dict[tuple[str, str], np.ndarray] = {}
    while n < seconds * RATE:
        key = (str(rng.choice(words)), str(rng.choice(VOICES)))
        if key not in cache:
            cache[key] = say(*key)
        g = np.zeros(int(RATE * rng.uniform(*gap)), np.float32)
        parts += [cache[key], g]
        n += cache[key].size + g.size
    x = np.concatenate(parts)[: int(seconds * RATE)]
    return x + (3e-4 * rng.standard_normal(x.size)).astype(np.float32)


def mostly_idle(seconds: float, rng: np.random.Generator, fraction: float = 0.1) -> np.ndarray:
    """Quiet room noise with one word-sized burst of speech per 1/fraction s of audio."""
    x = (3e-4 * rng.standard_normal(int(seconds * RATE))).astype(np.float32)
    period = int(RATE * 0.6 / fraction)  # ~0.6 s of speech per period
    for start in range(int(rng.integers(0, period)), x.size - RATE, period):
        w = speech(0.6, rng, COMMAND_WORDS + OTHER_WORDS, gap=(0.0, 0.01))
        x[start : start + w.size] += w
    return x


def cpu_per_audio_s(
    eng: Engine, labels, streams: list[np.ndarray], chunk_ms=100.0, gate: bool = True
) -> float:
    """Process CPU seconds per stream-second of audio for these streams fed as one batch."""
    slots = [eng.open() for _ in streams]
    cfg = eng.config
    kws = KWSConfig.from_metadata(eng.metadata)
    lis = [Listener(labels, cfg.frame_stride, RATE, kws, GateConfig(enabled=gate)) for _ in streams]
    step = int(RATE * chunk_ms / 1000)
    n = min(x.size for x in streams)
    t0 = time.process_time()
    for i in range(0, n, step):
        feed_listening(eng, slots, lis, [torch.from_numpy(x[i : i + step]) for x in streams])
    cpu = time.process_time() - t0
    for s in slots:
        eng.close(s)
    return cpu / (len(streams) * n / RATE)


def false_accepts(eng: Engine, labels, minutes: float, rng) -> tuple[int, float, dict]:
    x = speech(minutes * 60, rng, OTHER_WORDS, gap=(0.3, 2.0))
    cfg = eng.config
    lis = Listener(labels, cfg.frame_stride, RATE, KWSConfig.from_metadata(eng.metadata))
    slot = eng.open()
    for i in range(0, x.size, RATE):
        feed_listening(eng, [slot], [lis], [torch.from_numpy(x[i : i + RATE])])
    eng.close(slot)
    hours = x.size / RATE / 3600
    counts: dict[str, int] = {}
    for d in lis.detections:
        counts[d.label] = counts.get(d.label, 0) + 1
    return len(lis.detections), hours, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/speech-commands")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--fa-minutes", type=float, default=10.0)
    ap.add_argument("--results", default=None, help="append a section to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rec = load_recurrent(args.model)
    eng = Engine(
        make_backend(rec, "torch"), "kws", args.streams + 1, metadata=rec.checkpoint_metadata
    )
    labels = list(rec.config.labels)
    rng = np.random.default_rng(0)
    b, sec = args.streams, args.seconds
    kinds = {
        "speaking (words back to back)": [
            speech(sec, np.random.default_rng(k), COMMAND_WORDS + OTHER_WORDS) for k in range(b)
        ],
        "silent (quiet room, -80 dBFS)": [
            (1e-4 * rng.standard_normal(int(sec * RATE))).astype(np.float32) for _ in range(b)
        ],
        "steady white noise (-40 dBFS)": [
            (1e-2 * rng.standard_normal(int(sec * RATE))).astype(np.float32) for _ in range(b)
        ],
        "mostly idle (10 % speech)": [mostly_idle(sec, rng) for _ in range(b)],
    }
    cost = {name: cpu_per_audio_s(eng, labels, xs) for name, xs in kinds.items()}
    idle = kinds["mostly idle (10 % speech)"]
    cost["mostly idle, gate off (`vad: false`)"] = cpu_per_audio_s(eng, labels, idle, gate=False)
    speak = cost["speaking (words back to back)"]
    lines = [
        f"model `{args.model}` ({rec.config.d_model}x{rec.config.d_state}x"
        f"{rec.config.n_layers}, labels {len(labels)}), {b} streams x {sec:g} s per kind, "
        "batches of 100 ms per stream, 1 torch thread; CPU = process time of the engine-thread "
        "path (gate, model, detector), no network",
        "",
        "| stream kind | CPU ms per stream-second | vs speaking | streams per core in real time |",
        "|---|---|---|---|",
    ]
    for name, c in cost.items():
        lines.append(f"| {name} | {c * 1000:.3f} | {c / speak:.1%} | {1 / c:,.0f} |")
    n_fa, hours, counts = false_accepts(eng, labels, args.fa_minutes, rng)
    lines += [
        "",
        f"False accepts on {hours * 60:.1f} min of non-command espeak-ng words "
        f"({len(OTHER_WORDS)} words x {len(VOICES)} voices, 0.3-2 s pauses): {n_fa} "
        f"= {n_fa / hours:.0f} per hour; by label {counts}",
    ]
    text = "\n".join(lines)
    print(text)
    if args.results:
        with Path(args.results).open("a") as f:
            f.write(
                "\n## Keyword spotting: idle-stream cost and false accepts "
                "(benchmarks/bench_kws.py)\n\n"
                f"`python -m benchmarks.bench_kws --model {args.model} --streams {b} "
                f"--seconds {sec:g} --fa-minutes {args.fa_minutes:g}`\n\n{text}\n"
            )


if __name__ == "__main__":
    main()
