"""How much a keyword model's detection score depends on where a word falls inside a frame.

A front end that turns each 20 ms frame (320 samples) into one log-mel spectrum of that frame
alone gives different features for the same word delayed by a fraction of a frame; overlapping
windows (`DLRConfig.frame_window`, e.g. 40 ms of Hann every 20 ms) should give nearly the same
ones. This measures the effect on what the decision rule sees: for each espeak-ng word (commands and
other words, several voices) placed after 0.5 s of quiet, and delayed by 0, 20, ..., 300
samples, the peak of the smoothed posterior (the word's own label for a command, the highest
command for any other word) within 1 s after the word, per smoothing window.

A command whose lowest peak over the shifts falls under a threshold is missed or found
depending on the sub-frame timing alone.

    python -m benchmarks.bench_kws_phase [--model models/speech-commands]
        [--smooth-ms 100 200 400] [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.bench_kws import COMMAND_WORDS, OTHER_WORDS, RATE, VOICES, say
from benchmarks.harness import append_results
from dlr_runtime import load_checkpoint
from dlr_runtime.kws import softmax

SHIFTS = tuple(range(0, 320, 20))  # samples of delay inside one 20 ms frame


def smoothed(p: np.ndarray, k: int) -> np.ndarray:
    """Mean of the last k rows of (T, C) posteriors at every frame from k-1 on (T-k+1, C)."""
    c = np.cumsum(np.vstack([np.zeros((1, p.shape[1])), p]), 0)
    return (c[k:] - c[:-k]) / k


@torch.no_grad()
def peaks(model, labels: list[str], word: np.ndarray, label: str | None, ks: list[int]):
    """{k: peak per shift (S,)} of one word: its `label`'s smoothed posterior, or (another
    word, `label` None) the highest command's."""
    lead, tail = int(0.5 * RATE), int(1.2 * RATE)
    x = np.concatenate([np.zeros(lead, np.float32), word, np.zeros(tail, np.float32)])
    batch = np.stack([np.concatenate([np.zeros(s, np.float32), x])[: x.size] for s in SHIFTS])
    post = softmax(model(torch.from_numpy(batch)).double().numpy())  # (S, T, C)
    stride = model.config.frame_stride
    start = lead // stride
    end = (lead + word.size + RATE) // stride  # until 1 s after the word
    cmd = [labels.index(c) for c in COMMAND_WORDS]
    out = {}
    for k in ks:
        got = []
        for p in post:
            sm = smoothed(p, k)[max(0, start - k + 1) : end - k + 1]  # frames start..end
            col = sm[:, labels.index(label)] if label else sm[:, cmd].max(1)
            got.append(float(col.max()))
        out[k] = np.array(got)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/speech-commands")
    ap.add_argument("--smooth-ms", type=float, nargs="+", default=[100.0, 200.0, 400.0])
    ap.add_argument("--voices", type=int, default=3, help="espeak-ng voices of bench_kws")
    ap.add_argument("--others", type=int, default=12, help="non-command words")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.6, 0.8])
    ap.add_argument("--results", default=None, help="append the table to this Markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_checkpoint(args.model).eval()
    labels = list(model.config.labels)
    frame_ms = 1000 * model.config.frame_stride / model.config.sample_rate
    ks = [max(1, round(ms / frame_ms)) for ms in args.smooth_ms]
    rows: dict[str, dict[int, list[np.ndarray]]] = {"command": {}, "other": {}}
    for v in VOICES[: args.voices]:
        for w in COMMAND_WORDS + OTHER_WORDS[: args.others]:
            kind = "command" if w in COMMAND_WORDS else "other"
            got = peaks(model, labels, say(w, v), w if kind == "command" else None, ks)
            for k, arr in got.items():
                rows[kind].setdefault(k, []).append(arr)
    lines = [
        f"model `{args.model}`, espeak-ng voices {VOICES[: args.voices]}, each word delayed by "
        f"{len(SHIFTS)} shifts of 0-{SHIFTS[-1]} samples inside a {frame_ms:g} ms frame",
        "",
        "| smoothing | words | median peak | mean spread (max - min over shifts) "
        "| worst spread | lowest peak | "
        + " | ".join(f"words on both sides of {t:g}" for t in args.thresholds)
        + " |",
        "|---:|---|---:|---:|---:|---:|" + "---:|" * len(args.thresholds),
    ]
    for ms, k in zip(args.smooth_ms, ks, strict=True):
        for kind in ("command", "other"):
            a = np.stack(rows[kind][k])  # (words, shifts)
            spread = a.max(1) - a.min(1)
            flips = [int(((a.min(1) < t) & (a.max(1) >= t)).sum()) for t in args.thresholds]
            lines.append(
                f"| {ms:g} ms | {len(a)} {kind} | {np.median(a):.2f} | {spread.mean():.2f} "
                f"| {spread.max():.2f} | {a.min():.2f} | " + " | ".join(map(str, flips)) + " |"
            )
    body = "\n".join(lines)
    print(body)
    append_results(args.results, "Keyword spotting: sub-frame timing (bench_kws_phase)", body)


if __name__ == "__main__":
    main()
