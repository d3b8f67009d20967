"""Device selection and data-parallel set-up across processes (launch with torchrun).

`torchrun --nproc_per_node=K -m training.cli <recipe> ...` sets RANK / WORLD_SIZE / LOCAL_RANK;
`DistContext.from_env` then joins the process group (NCCL on CUDA, gloo on CPU) and each process
trains on its own shard of every epoch (`ShardedSampler`) or its own random stream. Without those
variables everything runs in one process and no process group is created.

The trainer keeps the replicas equal itself: rank 0's parameters are broadcast before training
(`broadcast_params`) and every step's gradients are averaged over the processes in one flattened
all-reduce (`average_grads`). torch's DistributedDataParallel wrapper is not used: it averages
only when its own `forward` runs, and recipes call their models' parts directly (the kws
recipe's warped front end, its auxiliary heads), which left each process training alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import Sampler


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """ "auto" -> cuda:<local_rank> when CUDA is available, else cpu; otherwise `name` itself."""
    if name == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: str = "auto") -> DistContext:
        """Read torchrun's variables; join the process group when WORLD_SIZE > 1."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        dev = pick_device(device, local)
        if world > 1 and not dist.is_initialized():
            backend = "nccl" if dev.type == "cuda" else "gloo"
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
            dist.init_process_group(backend=backend)
        return cls(rank=rank, world_size=world, local_rank=local, device=dev)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def mean(self, value: float) -> float:
        """Average a float over processes (identity without a process group)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item()) / self.world_size

    def average_grads(self, module: torch.nn.Module) -> None:
        """Average `module`'s gradients over the processes (one all-reduce of them all; a
        parameter without a gradient on this process counts as a zero one)."""
        if not self.distributed:
            return
        params = [p for p in module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n

    def broadcast_params(self, module: torch.nn.Module) -> None:
        """Give every process rank 0's parameters and buffers."""
        if not self.distributed:
            return
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


class ShardedSampler(Sampler[int]):
    """A seeded permutation per epoch, split across ranks, that can start mid-epoch.

    Every rank sees `len(dataset) // world_size` indices (the remainder is dropped so ranks
    stay in step); `start` skips that many of this rank's indices (for resuming).
    """

    def __init__(self, size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.size = size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch = epoch
        self.start = start

    def per_rank(self) -> int:
        return self.size // self.world_size

    def __len__(self) -> int:
        return max(0, self.per_rank() - self.start)

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(self.size, generator=gen)[: self.per_rank() * self.world_size]
        mine = perm[self.rank :: self.world_size]
        return iter(mine[self.start :].tolist())
