"""torchrun support: process group setup, rank info, and summing tensors/gradients across ranks.

Gradients are summed explicitly after accumulation (no DDP wrapper): each rank back-propagates
`sum of its token losses / global supervised tokens`, so the all-reduced sum is the exact global mean.
With FSDP (`mens.train.fsdp`) the sharded parameters' gradients are summed by FSDP's reduce-scatter instead.

Every collective gets a tensor on a device its backend serves. On CUDA the group is "cpu:gloo,cuda:nccl": CUDA
tensors (gradients, FSDP's shards) travel over NCCL, the few scalars and the RNG objects over gloo, so nothing is
copied to a GPU just to be summed. Several machines: plain torchrun (docs/gpu.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CUDA_BACKEND = "cpu:gloo,cuda:nccl"  # one process group, a backend per device type


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    sharded: bool = False
    """Parameters are FSDP-sharded: FSDP reduces the gradients, and every rank must run the same passes."""
    backends: dict | None = None
    """Device type -> backend of the process group ({"cpu": "gloo", "cuda": "nccl"}); None = one process."""

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def scalar_device(self) -> str:
        """Where small collectives (counts, losses) run: CPU when the group serves it, else this rank's GPU."""
        if not self.backends or "cpu" in self.backends:
            return "cpu"
        kind = next(iter(self.backends))
        return f"{kind}:{self.local_rank}" if kind in ("cuda", "xpu") else kind


def served_devices(config: str) -> dict[str, str]:
    """A backend config as torch reports it ("cpu:gloo,cuda:nccl") -> {"cpu": "gloo", "cuda": "nccl"}.

    A bare backend name ("nccl") maps to the device types torch says it serves.
    """
    from torch.distributed import Backend

    out: dict[str, str] = {}
    for part in str(config).lower().split(","):
        dev, _, name = part.strip().rpartition(":")
        if dev:
            out[dev] = name
        else:
            out.update({d: name for d in Backend.backend_capability.get(name, [])})
    return out


def backend_for(device_kind: str) -> str:
    """The process-group backend string for a run on `device_kind` ("cuda" or "cpu")."""
    return CUDA_BACKEND if device_kind == "cuda" else "gloo"


def setup(device_kind: str) -> Dist:
    """Init the process group when launched by torchrun (gloo on CPU; gloo + NCCL on CUDA, see module doc)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        if device_kind == "cuda":
            import torch

            torch.cuda.set_device(local_rank)  # NCCL and object collectives use the current device
        dist.init_process_group(backend_for(device_kind))
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank,
                backends=served_devices(dist.get_backend_config()))


def teardown(d: Dist) -> None:
    if d.world > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def all_sum(d: Dist, values: list[float]) -> list[float]:
    """Sum a few scalars over ranks, in float64 (token counts pass 2^24; gloo and NCCL both reduce float64)."""
    if d.world <= 1:
        return values
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=d.scalar_device)
    dist.all_reduce(t)
    return t.cpu().tolist()


def all_sum_grads(d: Dist, params: list) -> None:
    """Sum the gradients of `params` over ranks in one flat buffer (missing grads count as zero)."""
    if d.world <= 1 or d.sharded:  # FSDP reduce-scattered them (a sum) during backward
        return
    import torch
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads])  # on the parameters' device
    served = flat.device.type in (d.backends or {})
    wire = flat if served else flat.to(d.scalar_device)  # e.g. mps parameters under a gloo group
    dist.all_reduce(wire)
    flat = wire if served else wire.to(flat.device)
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
    """Every rank's `obj`, in rank order (a collective: all ranks must call it).

    `all_gather_object` pickles `obj` and unpickles the other ranks' bytes. That is acceptable here only because
    the peers are this job's own processes (started by the same torchrun), never data from disk or the network;
    it carries the RNG states (tensors mixed with Python and numpy tuples) to rank 0 at checkpoints. With a CPU
    backend in the group the bytes go over it, without a copy to the GPU.
    """
    if d.world <= 1:
        return [obj]
    import torch.distributed as dist

    out: list = [None] * d.world
    dist.all_gather_object(out, obj)
    return out
