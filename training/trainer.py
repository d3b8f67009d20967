"""The training loop shared by every recipe.

A recipe (`training.recipes`) says how to build the model, produce batches, compute the loss,
evaluate on held-out data and write a checkpoint; `Trainer` does the rest: device, data-parallel
processes under torchrun (`distributed.py`), AdamW with the SSM parameter group, warmup + cosine
schedule, gradient clipping, bfloat16 autocast on CUDA, a tqdm bar with loss and throughput,
metrics (JSONL, CSV, PNG), evaluation every epoch, the best checkpoint in `<out_dir>/model/`, and
a resumable state in
`<out_dir>/last/` (model + optimiser + counters, written every `save_every` steps and at every
epoch end). `--resume` continues from `<out_dir>/last/` exactly where it stopped.
With `--ema-decay` the run also keeps a moving average of its weights (`ema.py`): the average
is evaluated every epoch and kept in `model/`, and its latest state is the checkpoint `ema/`.
A recipe may also train modules that are not part of the model (`Recipe.auxiliary`, e.g. a head
of an auxiliary loss): they share the optimiser, clipping and schedule, are kept in
`last/auxiliary.safetensors` for resuming, and never enter a checkpoint.

Run directory:
    run.json          recipe and configuration of the run
    model/            best checkpoint by the held-out metric (dlr_runtime checkpoint directory)
    last/             latest checkpoint + train_state.{safetensors,json} (for --resume)
    ema/              with --ema-decay: the weight average at the latest epoch end
    metrics.jsonl     one line per log interval ("train") and per evaluation ("eval")
    metrics.csv, curves.png, summary.json   written at the end
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import time
import types
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.optim.swa_utils import AveragedModel
from tqdm import tqdm

from .config import TrainConfig
from .distributed import DistContext
from .ema import load_ema, make_ema, save_ema
from .metrics import MetricsLog
from .optim import lr_factor, make_optimizer, set_lr
from .state import Progress, atomic_replace, has_train_state, load_train_state, save_train_state

MODEL_DIR = "model"
LAST_DIR = "last"
EMA_DIR = "ema"  # with --ema-decay: the weight average at the latest epoch end
# a run's checkpoint directories: the kept one, the last step, the weight average (--ema-decay)
CHECKPOINTS = (MODEL_DIR, LAST_DIR, EMA_DIR)
AUX_FILE = "auxiliary.safetensors"  # in last/: the recipe's auxiliary modules


class Recipe(ABC):
    """What a task contributes to a run; the trainer calls these and nothing else."""

    name: str = "recipe"
    primary: str = "loss"  # key of `evaluate`'s result that picks the best checkpoint
    higher_is_better: bool = False
    plotted: tuple[str, ...] = ()  # more `evaluate` keys drawn beside `primary` in curves.png
    items_name: str = "samples"  # what `loss` counts (samples, tokens)

    def setup(self, ctx: DistContext) -> None:  # noqa: B027 - optional hook
        """Prepare data (runs once per process before the model is built)."""

    @abstractmethod
    def build_model(self) -> nn.Module: ...

    def auxiliary(self) -> nn.Module | None:
        """Modules trained with the model but not part of it (called once, after build_model;
        the recipe keeps its own reference and uses it in `loss`); None: none."""
        return None

    @abstractmethod
    def steps_per_epoch(self) -> int: ...

    @abstractmethod
    def train_batches(self, epoch: int, start: int) -> Iterator[Any]:
        """This process's batches of `epoch`, skipping the first `start` of them."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        """(scalar loss, number of items in the batch)."""

    @abstractmethod
    def evaluate(self, model: nn.Module, device: torch.device, split: str = "valid") -> dict:
        """Held-out metrics as floats; must contain `primary`."""

    @abstractmethod
    def save_model(self, model: nn.Module, path: Path, summary: dict[str, Any]) -> None:
        """Write a checkpoint directory whose model.safetensors holds `model.state_dict()`."""

    def finish(self, model: nn.Module, device: torch.device, out_dir: Path) -> dict[str, Any]:
        """Final results with the best model (test split, samples...), stored in the summary."""
        return {"test": self.evaluate(model, device, "test")}

    def describe(self) -> dict[str, Any]:
        """Recipe options recorded in run.json and in the checkpoint's training summary."""
        return {}


def hardware() -> dict[str, Any]:
    """What the run ran on, for model cards."""
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _fp32_ssm_forward(self: nn.Module, u: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=u.device.type, enabled=False):
        return type(self).forward(self, u.float())


def keep_ssm_fp32(model: nn.Module) -> None:
    """Run every SSM layer (kernel powers, FFTs) outside autocast, in float32 (pitfall 3)."""
    for blk in getattr(model, "blocks", []):
        if hasattr(blk, "ssm"):
            blk.ssm.forward = types.MethodType(_fp32_ssm_forward, blk.ssm)


class Trainer:
    def __init__(self, recipe: Recipe, cfg: TrainConfig, command: str = "") -> None:
        cfg.validate()
        self.command = command  # the command line that started the run (for model cards)
        self.recipe = recipe
        self.cfg = cfg
        self.out = Path(cfg.out_dir)

    def _run_info(self, ctx: DistContext) -> dict[str, Any]:
        return {
            "command": self.command,
            "recipe": self.recipe.name,
            "recipe_options": self.recipe.describe(),
            "train": self.cfg.to_dict(),
            "world_size": ctx.world_size,
        }

    def _save_last(
        self,
        model: nn.Module,
        opt,
        progress: Progress,
        info: dict,
        aux: nn.Module | None,
        ema: AveragedModel | None,
    ) -> None:
        last = self.out / LAST_DIR
        # the run's options go with every checkpoint, so a tool reading one mid-run (dlr-eval on
        # last/ or on an interrupted run's model/) sees its split and recipe
        summary = {**info, "progress": "in training", "step": progress.step}
        self.recipe.save_model(model, last, summary)
        if aux is not None:
            state = {k: v.detach().cpu().contiguous() for k, v in aux.state_dict().items()}
            atomic_replace(lambda tmp: save_file(state, tmp), last / AUX_FILE)
        if ema is not None:
            save_ema(ema, last)
        save_train_state(last, opt, progress, info)

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        ctx = DistContext.from_env(cfg.device)
        try:
            return self._run(ctx)
        finally:
            ctx.close()

    def _run(self, ctx: DistContext) -> dict[str, Any]:
        cfg, recipe, device = self.cfg, self.recipe, ctx.device
        if ctx.distributed and cfg.max_minutes:
            raise ValueError("--max-minutes would stop processes at different steps under torchrun")
        if cfg.threads and device.type == "cpu":
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        recipe.setup(ctx)
        model = recipe.build_model().to(device)
        aux = recipe.auxiliary()
        if aux is not None:
            aux.to(device)
        use_amp = cfg.amp and device.type == "cuda"
        if use_amp:
            keep_ssm_fp32(model)
        # the optimised modules: the model's parameters first, in the order of a model alone
        trained: nn.Module = model if aux is None else nn.ModuleDict({"model": model, "aux": aux})
        opt = make_optimizer(trained, cfg)
        ema = make_ema(model, cfg.ema_decay)
        info = self._run_info(ctx)
        log = MetricsLog(self.out, enabled=ctx.is_main)
        progress = Progress()
        last = self.out / LAST_DIR
        if cfg.resume and has_train_state(last):
            model.load_state_dict(load_file(last / "model.safetensors", device=str(device)))
            if aux is not None:
                aux.load_state_dict(load_file(last / AUX_FILE, device=str(device)))
            if ema is not None:
                load_ema(ema, last, device)
            progress, _ = load_train_state(last, opt, device)
            log.truncate_after(progress.step)
            if ctx.is_main:
                print(f"resumed from {last} at step {progress.step} (epoch {progress.epoch})")
        else:
            if cfg.init_from:  # fine-tuning: weights only, a fresh optimiser and schedule
                src = Path(cfg.init_from) / "model.safetensors"
                try:
                    model.load_state_dict(load_file(src, device=str(device)))
                except RuntimeError as e:  # missing, unexpected or differently shaped weights
                    first = str(e).splitlines()[1:2] or [str(e)]
                    raise ValueError(
                        f"--init-from {cfg.init_from} does not fit this run's model: "
                        f"{first[0].strip()}"
                    ) from e
                if ctx.is_main:
                    print(f"initialised from {src}")
            if ctx.is_main:
                self.out.mkdir(parents=True, exist_ok=True)
                if log.path.exists():
                    log.path.unlink()
        if ctx.is_main:
            (self.out / "run.json").write_text(json.dumps(info, indent=1))
        ctx.broadcast_params(trained)  # (equal already when every rank seeds and loads alike)

        spe = recipe.steps_per_epoch()
        if spe < 1:
            raise ValueError(f"{recipe.name}: an epoch has no full batch (too little data?)")
        total = cfg.steps or cfg.epochs * spe
        n_epochs = math.ceil(total / spe)
        autocast = (
            torch.autocast(device_type="cuda", dtype=torch.bfloat16)
            if use_amp
            else contextlib.nullcontext()
        )
        t_start = time.perf_counter() - progress.elapsed_s
        limit_s = cfg.max_minutes * 60 if cfg.max_minutes else math.inf
        out_of_time = False
        while progress.epoch < n_epochs and progress.step < total and not out_of_time:
            epoch = progress.epoch
            model.train()
            bar = tqdm(
                total=min(spe, total - progress.step + progress.step_in_epoch),
                initial=progress.step_in_epoch,
                desc=f"epoch {epoch + 1}/{n_epochs}",
                disable=not (ctx.is_main and cfg.progress),
                dynamic_ncols=True,
            )
            run_loss, run_n, run_items, t_log = 0.0, 0, 0, time.perf_counter()
            for batch in recipe.train_batches(epoch, progress.step_in_epoch):
                if progress.step >= total or progress.step_in_epoch >= spe:
                    break
                if time.perf_counter() - t_start > limit_s:
                    out_of_time = True
                    if ctx.is_main:
                        print(
                            f"time budget of {cfg.max_minutes} min reached at step {progress.step}"
                        )
                    break
                factor = lr_factor(progress.step, total, cfg.warmup, cfg.min_lr_ratio)
                set_lr(opt, factor)
                with autocast:
                    loss, n_items = recipe.loss(model, batch, device)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"non-finite loss {loss.item()} at step {progress.step}"
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                ctx.average_grads(trained)  # the model's and the auxiliary modules' (torchrun)
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(trained.parameters(), cfg.grad_clip)
                opt.step()
                if ema is not None:
                    ema.update_parameters(model)
                progress.step += 1
                progress.step_in_epoch += 1
                progress.items += n_items * ctx.world_size
                run_loss += float(loss.detach())
                run_n += 1
                run_items += n_items * ctx.world_size
                bar.update(1)
                if progress.step % cfg.log_every == 0:
                    dt = max(time.perf_counter() - t_log, 1e-9)
                    rate = run_items / dt
                    bar.set_postfix(
                        loss=f"{run_loss / run_n:.4f}", **{f"{recipe.items_name}/s": f"{rate:.0f}"}
                    )
                    log.write(
                        {
                            "kind": "train",
                            "step": progress.step,
                            "epoch": epoch + progress.step_in_epoch / spe,
                            "loss": run_loss / run_n,
                            "lr": opt.param_groups[0]["lr"],
                            "lr_factor": factor,
                            f"{recipe.items_name}_per_s": rate,
                            "elapsed_s": time.perf_counter() - t_start,
                        }
                    )
                    run_loss, run_n, run_items, t_log = 0.0, 0, 0, time.perf_counter()
                if cfg.save_every and progress.step % cfg.save_every == 0 and ctx.is_main:
                    progress.elapsed_s = time.perf_counter() - t_start
                    self._save_last(model, opt, progress, info, aux, ema)
            bar.close()
            progress.elapsed_s = time.perf_counter() - t_start
            kept = model if ema is None else ema.module  # the weights evaluated and kept
            if ctx.is_main:
                self._evaluate_epoch(kept, device, progress, log, epoch, info)
            progress.epoch += 1
            progress.step_in_epoch = 0
            if ctx.is_main:
                self._save_last(model, opt, progress, info, aux, ema)
                if ema is not None:
                    summary = {**info, "progress": "in training", "step": progress.step}
                    self.recipe.save_model(ema.module, self.out / EMA_DIR, summary)
            ctx.barrier()
        summary: dict[str, Any] = {}
        if ctx.is_main:
            info = dict(info, planned_steps=total, stopped_by_time_budget=out_of_time)
            summary = self._finish(model, device, progress, info)
        ctx.barrier()
        return summary

    def _evaluate_epoch(
        self,
        model: nn.Module,
        device,
        progress: Progress,
        log: MetricsLog,
        epoch: int,
        info: dict[str, Any],
    ) -> None:
        """Score the held-out split, keep the best checkpoint, log and print the result."""
        recipe = self.recipe
        metrics = recipe.evaluate(model, device, "valid")
        value = float(metrics[recipe.primary])
        improved = progress.best is None or (
            value > progress.best if recipe.higher_is_better else value < progress.best
        )
        if improved:
            progress.best, progress.best_step = value, progress.step
            summary = {**info, "progress": "in training", "best_step": progress.step}
            recipe.save_model(model, self.out / MODEL_DIR, summary)
        record = {"kind": "eval", "split": "valid", "step": progress.step, "epoch": epoch + 1}
        record.update({k: float(v) for k, v in metrics.items()})
        record["elapsed_s"] = progress.elapsed_s
        log.write(record)
        progress.history.append(record)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        print(f"epoch {epoch + 1}: step {progress.step} valid {shown}", flush=True)

    def _finish(self, model: nn.Module, device, progress: Progress, info: dict) -> dict[str, Any]:
        best_dir = self.out / MODEL_DIR
        if (best_dir / "model.safetensors").is_file():
            model.load_state_dict(load_file(best_dir / "model.safetensors", device=str(device)))
        model.eval()
        results = self.recipe.finish(model, device, self.out)
        n_params = sum(p.numel() for p in model.parameters())
        summary = {
            **info,
            "steps": progress.step,
            "epochs_done": progress.epoch,
            "items_seen": progress.items,
            "train_time_s": round(progress.elapsed_s, 1),
            "best_valid": {self.recipe.primary: progress.best, "step": progress.best_step},
            "history": progress.history,
            "parameters": n_params,
            "hardware": hardware(),
            **results,
        }
        self.recipe.save_model(model, best_dir, summary)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        plotted = [self.recipe.primary, *self.recipe.plotted]
        MetricsLog(self.out).finish(f"{self.recipe.name}: {self.out.name}", plotted)
        return summary


def copy_checkpoint(src: Path, dst: Path) -> None:
    """Copy a checkpoint directory (e.g. a run's model/ into models/<name>/)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, dst / f.name)
