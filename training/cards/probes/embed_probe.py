"""Probe (not part of the product): do speech embeddings learnt from recorded human speech
carry the commands to unheard voices better than our log-mel features?

The embedding is Google's speech_embedding (Apache-2.0; arXiv:2002.01322), a frozen stack of
convolutions over 76 frames (0.775 s) of a 32-band log-mel spectrum, giving 96 numbers every
80 ms. openWakeWord re-implemented it in ONNX and ships it, with its mel front end, inside its
0.5.1 wheel (`pip install --no-deps openwakeword==0.5.1`); this probe reads the two ONNX files
from there and runs them with onnxruntime, one thread.

The same small classifier (an MLP over the whole 1.5 s evaluation window, flattened) is trained
on the same windows of the final split's training voices, clean and augmented, once on the
embeddings and once on the shipped model's own log-mel features pooled to the same 80 ms hop.
Both are scored on the test voices' clean and augmented clip windows, beside the shipped model
(its last frame, as `dlr-eval speech` scores clips). The windows are `clip_windows`' (the word
ends 0.15-0.45 s before the end), so a fixed-position classifier is a fair clip classifier.

    PYTHONPATH=. python training/cards/probes/embed_probe.py models/speech-commands \\
        --rhvoice-accents --out runs/embed_probe [--train-clips 12000]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dlr_runtime import load_checkpoint
from dlr_runtime.model import frames_of
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, UNK, WordPool, clip_windows, silence_windows
from training.data.vocab import NEAR_MISSES, SC12_LABELS
from training.eval_speech import CLIP_SEED, clip_sample, frame_scores
from training.recipes.kws import KWSOptions, load_split

EMB_FRAMES = 76  # mel frames (10 ms) per embedding
EMB_HOP = 8  # mel frames between embeddings (80 ms)


class GoogleEmbedding:
    """openWakeWord's ONNX copies of the mel front end and Google's speech_embedding."""

    def __init__(self, threads: int = 1) -> None:
        import onnxruntime as ort

        spec = importlib.util.find_spec("openwakeword")
        if spec is None or spec.origin is None:
            raise SystemExit("needs `pip install --no-deps openwakeword==0.5.1` (its ONNX files)")
        d = Path(spec.origin).parent / "resources" / "models"
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        cpu = ["CPUExecutionProvider"]
        self.mel = ort.InferenceSession(str(d / "melspectrogram.onnx"), so, providers=cpu)
        self.emb = ort.InferenceSession(str(d / "embedding_model.onnx"), so, providers=cpu)

    def __call__(self, audio: torch.Tensor, batch: int = 64) -> np.ndarray:
        """Windows (N, L) in [-1, 1] -> embeddings (N, E, 96), one per 80 ms hop."""
        outs = []
        for s in range(0, len(audio), batch):
            x = (audio[s : s + batch].numpy() * 32767.0).astype(np.float32)
            mel = self.mel.run(None, {"input": x})[0][:, 0] / 10.0 + 2.0  # (B, F, 32)
            starts = range(0, mel.shape[1] - EMB_FRAMES + 1, EMB_HOP)
            w = np.stack([mel[:, t : t + EMB_FRAMES] for t in starts], 1)  # (B, E, 76, 32)
            b, e = w.shape[:2]
            emb = self.emb.run(None, {"input_1": w.reshape(b * e, EMB_FRAMES, 32, 1)})[0]
            outs.append(emb.reshape(b, e, 96))
        return np.concatenate(outs)


def logmel_feats(model: nn.Module, audio: torch.Tensor, pool: int) -> np.ndarray:
    """The shipped model's front-end features (N, F // pool, D), averaged over `pool` frames."""
    enc = model.encoder
    with torch.no_grad():
        f = enc.frontend(frames_of(audio, enc.stride, enc.history))  # (N, F, D)
    n, t, d = f.shape
    t = t // pool * pool
    return f[:, f.shape[1] - t :].reshape(n, t // pool, pool, d).mean(2).numpy()


def train_mlp(x: np.ndarray, y: np.ndarray, epochs: int, seed: int) -> nn.Module:
    """A two-layer MLP on flattened, standardised features (N, ...) -> 12 classes."""
    torch.manual_seed(seed)
    xt = torch.from_numpy(x.reshape(len(x), -1)).float()
    mu, sd = xt.mean(0), xt.std(0) + 1e-5
    net = nn.Sequential(nn.Linear(xt.shape[1], 256), nn.GELU(), nn.Dropout(0.3),
                        nn.Linear(256, len(SC12_LABELS)))  # fmt: skip
    opt = torch.optim.AdamW(net.parameters(), 1e-3, weight_decay=1e-2)
    yt = torch.from_numpy(y).long()
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for b in torch.randperm(len(xt), generator=g).split(128):
            loss = nn.functional.cross_entropy(net((xt[b] - mu) / sd), yt[b], label_smoothing=0.05)
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    return nn.Sequential(Standardise(mu, sd), net)


class Standardise(nn.Module):
    def __init__(self, mu: torch.Tensor, sd: torch.Tensor) -> None:
        super().__init__()
        self.mu, self.sd = mu, sd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.reshape(len(x), -1) - self.mu) / self.sd


def report(pred: np.ndarray, pool: WordPool, idx: np.ndarray) -> dict[str, float]:
    """Commands right, unknown words accepted (near misses and other words apart), per voice."""
    lab = pool.labels[idx]
    cmd, unk = lab < SIL, lab == UNK
    near = np.isin(pool.words[idx], list(NEAR_MISSES))
    out = {
        "commands": float((pred[cmd] == lab[cmd]).mean()),
        "unknown_accepted": float((pred[unk] < SIL).mean()),
        "near_miss_accepted": float((pred[unk & near] < SIL).mean()),
        "other_accepted": float((pred[unk & ~near] < SIL).mean()),
    }
    voices = pool.voices[idx]
    for v in sorted(set(voices[cmd].tolist())):
        m = cmd & (voices == v)
        out[f"commands/{v}"] = float((pred[m] == lab[m]).mean())
    return out


def cached(path: Path, make) -> np.ndarray:
    if path.exists():
        return np.load(path)
    x = make()
    np.save(path, x)
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rhvoice-accents", action="store_true")
    ap.add_argument("--train-clips", type=int, default=12000)
    ap.add_argument("--test-clips", type=int, default=8000)
    ap.add_argument("--silence", type=int, default=1500)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_checkpoint(a.model).eval()
    opts = KWSOptions(split="final", more_engines=True, rhvoice_accents=a.rhvoice_accents)
    pools = load_split(opts, a.seed)
    rirs = rir_bank(opts.cache_dir, seed=a.seed)
    google = GoogleEmbedding()
    pool_frames = 80 // int(model.encoder.stride / 16)  # model frames per 80 ms

    # Training windows: a sample of the training voices' clips, clean and augmented, + silence.
    train = pools["train"]
    tidx = clip_sample(len(train), a.train_clips, a.seed, salt=0xE3B)
    audio = {}
    for kind in ("clean", "augmented"):
        audio[kind] = clip_windows(train, tidx, rirs, a.seed + 17, augment=kind == "augmented")
    audio["silence"] = silence_windows(a.silence, train, a.seed + 17)
    ytr = np.concatenate([train.labels[tidx], train.labels[tidx], np.full(a.silence, SIL)])
    feats: dict[str, np.ndarray] = {}
    for name, fn in (("google", lambda w: google(w)),
                     ("logmel", lambda w: logmel_feats(model, w, pool_frames))):  # fmt: skip
        feats[name] = np.concatenate([
            cached(out / f"train-{k}-{name}.npy", lambda k=k, fn=fn: fn(audio[k]))
            for k in ("clean", "augmented", "silence")
        ])  # fmt: skip
        print(f"train features {name}: {feats[name].shape}", flush=True)
    nets = {name: train_mlp(x, ytr, a.epochs, a.seed) for name, x in feats.items()}

    test = pools["test"]
    idx = clip_sample(len(test), a.test_clips, a.seed)
    results: dict[str, dict[str, float]] = {}
    for kind in ("clean", "augmented"):
        w = clip_windows(test, idx, rirs, a.seed + CLIP_SEED, augment=kind == "augmented")
        pred = frame_scores(model, w)[:, -1].argmax(-1).numpy()
        results[f"shipped/{kind}"] = report(pred, test, idx)
        for name, net in nets.items():
            fn = google if name == "google" else (lambda v: logmel_feats(model, v, pool_frames))
            x = cached(out / f"test-{kind}-{name}.npy", lambda fn=fn, w=w: fn(w))
            with torch.no_grad():
                pred = net(torch.from_numpy(x).float()).argmax(-1).numpy()
            results[f"{name}/{kind}"] = report(pred, test, idx)
        for k in (f"shipped/{kind}", f"logmel/{kind}", f"google/{kind}"):
            r = results[k]
            print(f"{k:20s} commands {r['commands']:.3f}  unknown accepted "
                  f"{r['unknown_accepted']:.3f} (near {r['near_miss_accepted']:.3f}, other "
                  f"{r['other_accepted']:.3f})", flush=True)  # fmt: skip
    (out / "embed_probe.json").write_text(json.dumps(results, indent=1))
    voices = sorted(
        k.split("/", 1)[1] for k in results["shipped/clean"] if k.startswith("commands/")
    )
    print(f"{'voice (clean commands)':30s} shipped logmel-mlp google-mlp")
    for v in voices:
        row = [results[f"{m}/clean"][f"commands/{v}"] for m in ("shipped", "logmel", "google")]
        print(f"{v:30s} " + " ".join(f"{r:7.3f}" for r in row))


if __name__ == "__main__":
    main()
