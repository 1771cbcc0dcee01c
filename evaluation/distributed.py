"""Evaluation across ranks (torchrun): the process group, length-aware sharding, gathering on rank 0.

World size 1 needs no process group: `Dist()` is the single-process run, and `gather` hands back its own value."""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# ranks wait at the gather for the slowest shard, which may take long on a big set
TIMEOUT = timedelta(hours=4)


def shard(costs: Sequence[float], world_size: int) -> list[list[int]]:
    """Longest-processing-time packing: units by decreasing cost, each onto the least-loaded rank.
    -> unit indices per rank, ascending. Ties go to the lower index and the lower rank, so every rank computes the
    same plan."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads = [(0.0, r) for r in range(world_size)]  # a heap of (load, rank)
    plan: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, r = heapq.heappop(loads)
        plan[r].append(i)
        heapq.heappush(loads, (load + costs[i], r))
    return [sorted(p) for p in plan]


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    device: str | None = None  # this rank's device; None: Synthesizer's default

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, obj) -> list | None:
        """Every rank's `obj` on rank 0 (in rank order); None elsewhere."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size if self.is_main else None
        torch.distributed.gather_object(obj, out, dst=0)
        return out

    def close(self) -> None:
        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def init_distributed(device: str | None = None) -> Dist:
    """Join the process group torchrun set up. Each rank takes cuda:LOCAL_RANK (NCCL) when every local rank has a
    GPU, else the CPU (gloo). `device`: None (that choice), "cuda" (GPUs required) or "cpu"."""
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"--distributed needs the environment torchrun sets ({', '.join(missing)} missing); "
            "launch with `torchrun --nproc-per-node N -m toolkit.cli evaluate ... --distributed`, "
            "or drop --distributed for a single process"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device not in (None, "cpu", "cuda"):
        raise RuntimeError(
            f"--device {device} with --distributed: pass --device cuda (rank r takes cuda:LOCAL_RANK) or --device cpu"
        )
    if device == "cuda" and gpus < local_world:
        raise RuntimeError(
            f"{local_world} ranks on this node but {gpus} CUDA device(s) visible; "
            f"use --nproc-per-node {gpus} or --device cpu"
        )
    use_cuda = device != "cpu" and gpus >= local_world > 0
    dev = f"cuda:{local}" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(local)  # NCCL's object collectives run on the current device
    torch.distributed.init_process_group("nccl" if use_cuda else "gloo", timeout=TIMEOUT)
    return Dist(rank, world, dev)
