"""torchrun support: process group setup, rank info, and summing tensors/gradients across ranks.

Gradients are summed explicitly after accumulation (no DDP wrapper): each rank back-propagates
`sum of its token losses / global supervised tokens`, so the all-reduced sum is the exact global mean.
With FSDP (`mens.train.fsdp`) the sharded parameters' gradients are summed by FSDP's reduce-scatter instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    sharded: bool = False
    """Parameters are FSDP-sharded: FSDP reduces the gradients, and every rank must run the same passes."""

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup(device_kind: str) -> Dist:
    """Init the process group when launched by torchrun (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def teardown(d: Dist) -> None:
    if d.world > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def all_sum(d: Dist, values: list[float]) -> list[float]:
    """Sum a few scalars over ranks (float64)."""
    if d.world <= 1:
        return values
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def all_sum_grads(d: Dist, params: list) -> None:
    """Sum the gradients of `params` over ranks in one flat buffer (missing grads count as zero)."""
    if d.world <= 1 or d.sharded:  # FSDP reduce-scattered them (a sum) during backward
        return
    import torch
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(g).to(g.dtype)
        offset += n


def barrier(d: Dist) -> None:
    if d.world > 1:
        import torch.distributed as dist

        dist.barrier()


def gather_objects(d: Dist, obj) -> list:
    """Every rank's `obj`, in rank order (a collective: all ranks must call it)."""
    if d.world <= 1:
        return [obj]
    import torch.distributed as dist

    out: list = [None] * d.world
    dist.all_gather_object(out, obj)
    return out
