"""What a front-end variant costs a speech stream: the shipped speech model's weights with each
20 ms frame's log-mel taken over the frame alone (as shipped, the baseline) or, `--variant
window`, over a 40 ms Hann window ending with it (`DLRConfig.frame_window=640`; the state keeps
the 320 samples before the frame), or, `--variant pcen`, with the frame's mel energies through
the PCEN front end (`dlr_runtime/pcen.py`, at its initial per-band values: the cost does not
depend on them; the state keeps each band's smoothed energy), or, `--variant logmel_pcen`,
with the shipped log-mel features and the PCEN ones side by side (the shipped weights widened by
`training.widen_frontend`: the same scores, 80 features into the frame map), or, `--variant
speech_embedding`, with the frozen speech embedding (`dlr_runtime/speech_embedding.py`: 80 ms
frames, each from a 0.78 s window, streamed from its convolutions' cached rows by
`speech_embedding_stream.py`; the shipped weights but a new frame map, at its initial
values: the cost does not depend on them). A 100 ms chunk from a fresh state completes one
80 ms frame; a live stream averages 1.25 per chunk, so its cost per second is 1.25x the
chunk's (the table's last column).

Per batch of streams (1, 16, 64): median seconds per 100 ms chunk (5 frames, the server's
piece) through the engine's speech backend for each front end, measured in alternating rounds
in one process (best round kept), the ratio variant / frame, the front end alone (the chunk's
frames through the front end and, for PCEN, its compression), and the state bytes per session.

    nice -n 10 .venv/bin/python -m benchmarks.bench_frontend_window
        [--variant window|pcen|logmel_pcen|speech_embedding]
        [--backend fused|torch] [--rounds 3] [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from benchmarks.harness import ROOT, append_results, machine, md_table, time_calls
from dlr_runtime import DLRModel, load_checkpoint, to_recurrent
from dlr_runtime.backends import Backend, make_backend
from dlr_runtime.model import frames_of
from dlr_runtime.recurrent import RecurrentModel
from dlr_runtime.speech_embedding import EMBED_STRIDE, EMBED_WINDOW
from training.widen_frontend import widen

BATCHES = (1, 16, 64)
CHUNK = 1600  # samples: 100 ms at 16 kHz


TITLES = {
    "window": "Speech front end: overlapping windows (bench_frontend_window)",
    "pcen": "Speech front end: PCEN (bench_frontend_window --variant pcen)",
    "logmel_pcen": "Speech front end: log-mel and PCEN (bench_frontend_window --variant logmel_pcen)",
    "speech_embedding": (
        "Speech front end: the speech embedding (bench_frontend_window --variant speech_embedding)"
    ),
}
EMBED_FRAMING = {"frame_stride": EMBED_STRIDE, "frame_window": EMBED_WINDOW}


def backends(model_dir: str, kind: str, variant: str) -> dict[str, tuple[RecurrentModel, Backend]]:
    """The same weights behind both front ends: "frame" (as shipped) and `variant` ->
    (recurrent form, the engine's backend)."""
    base = load_checkpoint(model_dir).eval()
    cfg = base.config
    frame = DLRModel(replace(cfg, frontend="logmel", frame_window=0))
    frame.load_state_dict(base.state_dict())
    if variant == "logmel_pcen":  # the frame map widened, PCEN columns at zero
        other = widen(frame)
    elif variant == "speech_embedding":  # a new frame map (96 inputs), the rest as shipped
        other = DLRModel(replace(cfg, frontend="speech_embedding", **EMBED_FRAMING))
        kept = {k: v for k, v in base.state_dict().items() if not k.startswith("encoder.frame.")}
        other.load_state_dict(kept, strict=False)
    else:
        other = DLRModel(
            replace(cfg, frame_window=2 * cfg.frame_stride)
            if variant == "window"
            else replace(cfg, frontend="pcen")
        )
        other.load_state_dict(base.state_dict(), strict=False)  # (PCEN's parameters: initial)
    out = {}
    for name, m in (("frame", frame), (variant, other)):
        rec = to_recurrent(m.eval())
        out[name] = (rec, make_backend(rec, kind))
    return out


def front_end(rec: RecurrentModel, x: torch.Tensor) -> torch.Tensor:
    """The chunk's whole frames through the front end (and PCEN's compression, from zeros)."""
    cfg = rec.config
    if rec.embed_stream is not None:  # the speech embedding from a fresh stream's cache
        n = x.shape[1] // cfg.frame_stride
        frames = x[:, : n * cfg.frame_stride].reshape(x.shape[0], n, cfg.frame_stride)
        cache = torch.zeros(x.shape[0], rec.spec["embed_cache"][0][0], dtype=x.dtype)
        return rec.embed_stream(frames, cache)[0]
    feats = rec.encoder.frontend(frames_of(x, cfg.frame_stride, cfg.history))
    if rec.encoder.pcen is None:
        return feats
    zeros = torch.zeros(x.shape[0], cfg.n_mels, dtype=torch.float64)
    return rec.encoder.pcen.chunk(feats, zeros, torch.zeros(x.shape[0], dtype=torch.float64))[0]


def per_chunk(rec: RecurrentModel) -> float:
    """Frames a live stream completes per chunk over those a chunk from a fresh state does."""
    stride = rec.config.frame_stride
    return (CHUNK / stride) / (CHUNK // stride)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "speech-commands"))
    ap.add_argument("--variant", default="window", choices=sorted(TITLES))
    ap.add_argument("--backend", default="fused", choices=["fused", "torch"])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (best kept)")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds per point per round")
    ap.add_argument("--results", default=None, help="append a section to this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bes = backends(args.model, args.backend, args.variant)
    v = args.variant
    g = torch.Generator().manual_seed(0)
    rows = []
    for b in BATCHES:
        x = 0.1 * torch.randn(b, CHUNK, generator=g)
        best: dict[str, float] = {}
        fe_best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, (rec, be) in bes.items():
                state = be.init_state(b)
                sec, _ = time_calls(lambda be=be, s=state, x=x: be.chunk(x, s), args.budget)
                best[name] = min(best.get(name, float("inf")), sec)
                with torch.no_grad():
                    sec, _ = time_calls(lambda r=rec, x=x: front_end(r, x), args.budget)
                fe_best[name] = min(fe_best.get(name, float("inf")), sec)
        rows.append(
            [b, 1e3 * best["frame"], 1e3 * best[v], best[v] / best["frame"],
             1e3 * fe_best["frame"], 1e3 * fe_best[v],
             best[v] * per_chunk(bes[v][0]) / (best["frame"] * per_chunk(bes["frame"][0]))]
        )  # fmt: skip
    state_kb = {n: rec.state_bytes() / 1024 for n, (rec, _) in bes.items()}
    body = (
        f"model `{args.model}` weights, backend `{args.backend}`, 100 ms chunks (5 frames); "
        f"state per session: frame {state_kb['frame']:.2f} KiB, {v} {state_kb[v]:.2f} "
        f"KiB; {machine()}\n\n"
        + md_table(
            [
                "streams",
                "frame: ms/chunk",
                f"{v}: ms/chunk",
                f"{v} / frame",
                "front end, frame: ms",
                f"front end, {v}: ms",
                f"per stream-second, {v} / frame",
            ],
            rows,
        )  # fmt: skip
    )
    print(body)
    append_results(args.results, TITLES[v], body)


if __name__ == "__main__":
    main()
