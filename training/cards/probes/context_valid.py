"""Probe (not part of the product): the training recipe's valid clips, scored from a zero
state and after 60 s of a valid stream (`KWSRecipe.evaluate`'s context_* metrics), for
finished models. Shows whether the clip metric a run selects on would have seen a model's
failure in long streams.

    PYTHONPATH=. python training/cards/probes/context_valid.py MODEL_DIR...
"""

from __future__ import annotations

import sys

import torch

from dlr_runtime import load_checkpoint
from training.config import TrainConfig
from training.distributed import DistContext
from training.modelopts import ModelOptions
from training.recipes.kws import KWSOptions, KWSRecipe


def main(model_dirs: list[str]) -> None:
    torch.set_num_threads(1)
    recipe = KWSRecipe(KWSOptions(split="final"), ModelOptions(), TrainConfig())
    recipe.setup(DistContext())
    print("model | valid accuracy / commands / false accepts | the same after 60 s of stream")
    for d in model_dirs:
        m = recipe.evaluate(load_checkpoint(d).eval(), torch.device("cpu"))
        plain = " / ".join(f"{m[k]:.3f}" for k in ("accuracy", "command_accuracy", "false_accept"))
        ctx = " / ".join(
            f"{m['context_' + k]:.3f}" for k in ("accuracy", "command_accuracy", "false_accept")
        )
        print(f"{d} | {plain} | {ctx}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
