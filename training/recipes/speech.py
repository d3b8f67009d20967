"""Speech-commands recipe (SC10) on raw 16 kHz audio: synthetic espeak-ng voices or a local copy
of Google Speech Commands v0.02.

The model is a causal DLR classifier: an audio frame encoder (`frame_stride` samples per frame),
DLR blocks, and the running-mean classifier head, so the score after the last frame is the
clip-level prediction and the same network streams sample by sample. Training uses the score at
the end of the 1 s window. At the end the best model is evaluated on the test split (voices never
heard in training for the synthetic data) and its streaming form (`to_recurrent(...).chunk` over
100 ms chunks) is compared with the offline predictions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dlr_runtime import DLRModel, save_checkpoint, to_recurrent
from training.config import TrainConfig
from training.data.labels import SAMPLE_RATE, SC10_LABELS
from training.distributed import DistContext, ShardedSampler
from training.modelopts import ModelOptions
from training.trainer import Recipe


@dataclass
class SpeechOptions:
    data: str = "synth"  # synth (espeak-ng voices) | real (local Speech Commands v0.02)
    data_root: str = "data/speech_commands_v0.02"  # real: dataset folder (or its parent)
    cache_dir: str = "runs/sc10cache"  # synth: where rendered clean clips are cached
    accents: str = ""  # synth: comma-separated espeak accents (empty: all)
    variants: str = ""  # synth: comma-separated voice variants (empty: all)
    renditions: int = 4  # synth: clips per (voice, word), each with its own speed and pitch
    max_clips: int = 0  # cap on clips per split (0: all), for quick runs
    frame_stride: int = 80  # samples per frame of the audio encoder (80 = 5 ms)
    chunk_ms: int = 100  # chunk size of the streaming check
    stream_clips: int = 200  # test clips used by the streaming check


class _Subset(Dataset):
    def __init__(self, base: Dataset, n: int) -> None:
        self.base, self.n = base, min(n, len(base))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.base[i]

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)


class SpeechRecipe(Recipe):
    name = "speech"
    primary = "accuracy"
    higher_is_better = True
    items_name = "clips"

    def __init__(self, opts: SpeechOptions, model_opts: ModelOptions, train: TrainConfig) -> None:
        if opts.data not in ("synth", "real"):
            raise ValueError(f"--data must be synth or real, got {opts.data!r}")
        if SAMPLE_RATE % opts.frame_stride:
            raise ValueError(f"--frame-stride must divide {SAMPLE_RATE}, got {opts.frame_stride}")
        self.opts = opts
        self.model_opts = model_opts
        self.batch_size = train.batch_size
        self.seed = train.seed
        self.num_workers = train.num_workers
        self.eval_batches = train.eval_batches
        self.splits: dict[str, Dataset] = {}

    def describe(self) -> dict[str, Any]:
        return {"speech": asdict(self.opts), "model": self.model_opts.to_dict()}

    def _load(self, split: str, augment: bool | None = None) -> Dataset:
        o = self.opts
        if o.data == "real":
            from training.data.speech_commands import SpeechCommandsConfig, SpeechCommandsDataset

            ds: Dataset = SpeechCommandsDataset(SpeechCommandsConfig(root=o.data_root), split)
        else:
            from training.data.speech_synth import SynthConfig, SynthSpeechDataset

            kw: dict[str, Any] = {"seed": self.seed, "renditions": o.renditions}
            if o.accents:
                kw["accents"] = tuple(a.strip() for a in o.accents.split(",") if a.strip())
            if o.variants:
                kw["variants"] = tuple(v.strip() for v in o.variants.split(",") if v.strip())
            ds = SynthSpeechDataset.from_config(SynthConfig(**kw), split, o.cache_dir, augment)
        if len(ds) == 0:  # type: ignore[arg-type]
            raise ValueError(f"speech split {split!r} is empty ({o.data} data)")
        return _Subset(ds, o.max_clips) if o.max_clips else ds

    def setup(self, ctx: DistContext) -> None:
        for split in ("train", "valid", "test"):
            self.splits[split] = self._load(split)
        self.sampler = ShardedSampler(
            len(self.splits["train"]), self.seed, ctx.rank, ctx.world_size
        )

    def build_model(self) -> nn.Module:
        cfg = self.model_opts.to_config(
            encoder="audio",
            decoder="classifier",
            labels=list(SC10_LABELS),
            sample_rate=SAMPLE_RATE,
            frame_stride=self.opts.frame_stride,
        )
        return DLRModel(cfg, seed=self.seed)

    def steps_per_epoch(self) -> int:
        return self.sampler.per_rank() // self.batch_size

    def train_batches(self, epoch: int, start: int) -> Iterator[Any]:
        ds = self.splits["train"]
        if hasattr(ds, "set_epoch"):
            ds.set_epoch(epoch)
        self.sampler.set_epoch(epoch, start * self.batch_size)
        loader = DataLoader(
            ds,
            batch_size=self.batch_size,
            sampler=self.sampler,
            drop_last=True,
            num_workers=self.num_workers,
        )
        return iter(loader)

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        audio, labels = batch[0].to(device), batch[1].to(device)  # (B, L), (B,)
        logits = model(audio)[:, -1]  # (B, C): running-mean scores after the last frame
        return F.cross_entropy(logits.float(), labels), audio.shape[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device, split: str = "valid") -> dict:
        return self._accuracy(model, device, self.splits[split])

    @torch.no_grad()
    def _accuracy(self, model: nn.Module, device: torch.device, ds: Dataset) -> dict:
        was_training = model.training
        model.eval()
        loader = DataLoader(ds, batch_size=max(self.batch_size, 64), num_workers=self.num_workers)
        total, correct, loss = 0, 0, 0.0
        for i, (audio, labels) in enumerate(loader):
            if self.eval_batches and i >= self.eval_batches:
                break
            logits = model(audio.to(device))[:, -1].float()  # (B, C)
            labels = labels.to(device)
            loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(-1) == labels).sum())
            total += len(labels)
        model.train(was_training)
        return {"accuracy": correct / total, "loss": loss / total, "clips": float(total)}

    @torch.no_grad()
    def stream_check(self, model: nn.Module, dtype: torch.dtype = torch.complex64) -> dict:
        """Predictions of the recurrent form fed `chunk_ms` chunks vs the offline forward."""
        model = model.cpu().eval()
        rec = to_recurrent(model, dtype=dtype)
        ds = self.splits["test"]
        n = min(self.opts.stream_clips, len(ds))  # type: ignore[arg-type]
        audio = torch.stack([ds[i][0] for i in range(n)])  # (n, L)
        offline = model(audio.float())  # (n, L', C)
        chunk = SAMPLE_RATE * self.opts.chunk_ms // 1000
        state = rec.init_state(n)
        outs = []
        for s in range(0, audio.shape[1], chunk):
            y, state = rec.chunk(audio[:, s : s + chunk].to(rec.rdtype), state)  # (n, T', C)
            outs.append(y)
        stream = torch.cat(outs, dim=1).to(offline.dtype)  # (n, L', C)
        if stream.shape != offline.shape:
            raise RuntimeError(
                f"streaming produced {tuple(stream.shape)}, offline {tuple(offline.shape)}"
            )
        same_final = (stream[:, -1].argmax(-1) == offline[:, -1].argmax(-1)).float().mean()
        same_all = (stream.argmax(-1) == offline.argmax(-1)).float().mean()
        return {
            "clips": n,
            "chunk_samples": chunk,
            "state_dtype": str(dtype).removeprefix("torch."),
            "final_prediction_agreement": float(same_final),
            "per_frame_prediction_agreement": float(same_all),
            "max_abs_score_diff": float((stream - offline).abs().max()),
        }

    def finish(self, model: nn.Module, device: torch.device, out_dir: Path) -> dict[str, Any]:
        results: dict[str, Any] = {"test": self.evaluate(model, device, "test")}
        if self.opts.data == "synth":
            noisy = self._load("test", augment=True)
            results["test_augmented"] = self._accuracy(model, device, noisy)
        results["streaming"] = {
            "complex64": self.stream_check(model, torch.complex64),
            "complex128": self.stream_check(model, torch.complex128),
        }
        model.to(device)
        results["state_bytes_per_session"] = to_recurrent(model.cpu()).state_bytes_per_session()
        model.to(device)
        return results

    def save_model(self, model: nn.Module, path: Path, summary: dict[str, Any]) -> None:
        save_checkpoint(model, path, training=summary, task="speech-commands-sc10")
