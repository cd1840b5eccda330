"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for `mens train` under torchrun: whether to shard, sharding each
decoder layer then the root, and full tensors in and out of the sharded model for the run directory and checkpoints.

Gradients keep the loop's semantics: each rank back-propagates (its token-loss sum / global supervised tokens) and
the global gradient is the SUM over ranks. FSDP2 averages by default, so every group gets divide factor 1 with
SUM-only collectives: a factor alone selects ReduceOp.PREMUL_SUM, which gloo rejects ("Cannot use
ReduceOp.PREMUL_SUM with Gloo"); forcing SUM works on gloo and NCCL alike.
"""

from __future__ import annotations

import contextlib
import os
import sys

from mens.errors import ConfigError, ModelError
from mens.train.probe import FIT_SHARE  # a replicated run "fits" in this share of one process's memory


def decide(mode: str, *, world: int, device: str, replicated_gb: float, memory_gb: float | None) -> tuple[bool, str]:
    """Whether to shard, and why (the preflight line). `memory_gb` is what one process may use (None = unknown)."""
    if world <= 1:
        return False, "single process"
    if device == "mps":
        if mode == "on":
            raise ConfigError("--fsdp on: FSDP needs CUDA (nccl) or CPU (gloo) processes, not mps; "
                              "use --fsdp off or --device cpu")
        return False, f"ddp-allreduce over {world} processes (no FSDP on mps)"
    if mode == "off":
        return False, f"ddp-allreduce over {world} processes (--fsdp off)"
    if mode == "on":
        return True, f"fsdp over {world} processes (--fsdp on)"
    need = f"replicated estimate {replicated_gb:.2f} GB"
    if memory_gb is None:
        return False, f"ddp-allreduce over {world} processes (--fsdp auto: {need}, process memory unknown)"
    if replicated_gb > FIT_SHARE * memory_gb:
        return True, f"fsdp over {world} processes (--fsdp auto: {need} > {FIT_SHARE:.0%} of {memory_gb:.1f} GB)"
    return False, f"ddp-allreduce over {world} processes (--fsdp auto: {need} fits {memory_gb:.1f} GB)"


def quantized_sharding_problem(backend: str, mode: str, device: str) -> str | None:
    """Why --fsdp on cannot shard this base (config validation, before any model loads), or None.

    FSDP2 shards a parameter by chunking its storage and all-gathers it back as a plain tensor: bitsandbytes'
    packed NF4 weights (uint8 storage, `Params4bit` with its quantization state) then crash or silently compute
    garbage on CUDA. On CPU processes (gloo) the same run matches one process (tests/train/test_fsdp.py).
    """
    if backend == "qlora" and mode == "on" and device != "cpu":
        return ("--fsdp on with --backend qlora: FSDP2 cannot shard a bitsandbytes 4-bit base on CUDA (expected "
                "--fsdp off or auto: each GPU holds the 4-bit base and LoRA gradients are summed; or --backend lora "
                "--fsdp on: a bf16 base, sharded)")
    return None


SUM_ONLY = ("set_gradient_divide_factor", "set_force_sum_reduction_for_comms")
"""What `shard_model` calls on every FSDP2 module so that gradients are summed over ranks (the module docstring)."""


def torch_sharding_problem() -> str | None:
    """Why this torch's FSDP2 cannot keep the loop's summed gradients, or None: torch 2.6's `FSDPModule` lacks both
    of SUM_ONLY (2.13 has them), and without them a sharded run would average gradients or fail on gloo."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    missing = [name for name in SUM_ONLY if not hasattr(FSDPModule, name)]
    if not missing:
        return None
    return (f"torch {torch.__version__}'s FSDP2 has no {' or '.join(missing)}, which a sharded run needs to sum "
            "gradients over ranks (torch 2.13 has both)")


def choose(mode: str, *, world: int, device: str, model_config: dict, backend: str, r: int, seq_len: int,
           batch_size: int, gradient_checkpointing: bool) -> tuple[bool, str]:
    """`decide`, with the replicated run's memory estimate (`mens probe`'s) worked out only when "auto" needs it.
    On a torch whose FSDP2 cannot sum gradients, --fsdp on is refused and auto keeps every rank replicated."""
    shard, why = _choose(mode, world=world, device=device, model_config=model_config, backend=backend, r=r,
                         seq_len=seq_len, batch_size=batch_size, gradient_checkpointing=gradient_checkpointing)
    if shard and (problem := torch_sharding_problem()):
        if mode == "on":
            raise ConfigError(f"--fsdp on: {problem}; expected a newer torch, or --fsdp off (each process holds "
                              "the whole model and gradients are all-reduced)")
        return False, f"ddp-allreduce over {world} processes (--fsdp auto would shard, but {problem})"
    return shard, why


def _choose(mode: str, *, world: int, device: str, model_config: dict, backend: str, r: int, seq_len: int,
            batch_size: int, gradient_checkpointing: bool) -> tuple[bool, str]:
    if world > 1 and (problem := quantized_sharding_problem(backend, mode, device)):
        raise ConfigError(problem)
    if world > 1 and mode == "auto" and backend == "qlora" and device.startswith("cuda"):
        return False, f"ddp-allreduce over {world} processes (--fsdp auto: a 4-bit base is never sharded on CUDA)"
    if world <= 1 or mode != "auto" or device == "mps":
        return decide(mode, world=world, device=device, replicated_gb=0.0, memory_gb=None)
    from mens.train.probe import estimate_memory_gb

    est = estimate_memory_gb(model_config, backend=backend, r=r, seq_len=seq_len, batch_size=batch_size,
                             gradient_checkpointing=gradient_checkpointing)["total_gb"]
    return decide(mode, world=world, device=device, replicated_gb=est, memory_gb=process_memory_gb(device))


def process_memory_gb(device: str) -> float | None:
    """Memory one process may use: its own GPU's (times the allocator cap `torch.cuda.set_per_process_memory_fraction`
    set, if any: a shared card, or a run held to a smaller card's memory), or on CPU the machine's RAM split among
    the node's processes."""
    if device.startswith("cuda"):  # not probe_device: it would open a context on GPU 0 from every rank
        import torch

        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index  # the API wants an index, not bare "cuda"
        try:
            share = torch.cuda.get_per_process_memory_fraction(index)
        except (AttributeError, RuntimeError, ValueError):  # an older torch without it
            share = 1.0
        return torch.cuda.get_device_properties(index).total_memory * share / 2**30
    from mens.train.probe import probe_device

    ram = probe_device("cpu").get("memory_gb")
    return None if ram is None else ram / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def decoder_layers(model) -> list:
    """The repeated blocks to shard one by one: modules whose class the model lists in `_no_split_modules`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model, device: str) -> str:
    """`fully_shard` each decoder layer, then the root; gradients are summed over ranks, never averaged."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    layers = decoder_layers(model)
    if not layers:
        raise ModelError(f"--fsdp: found no decoder layers to shard in {type(model).__name__} (its "
                         "_no_split_modules names none); train with --fsdp off")
    what = f"{len(layers)} x {type(layers[0]).__name__} + root"  # before fully_shard renames the classes FSDP*
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return what


def is_sharded(model) -> bool:
    """The model went through `shard_model` (its parameters are DTensor shards)."""
    if "torch.distributed.fsdp" not in sys.modules:  # nothing was sharded without importing it
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_weights(model, backend: str) -> dict:
    """Full tensors on CPU of what the run directory stores: every weight (full) or the trainable ones (LoRA).

    A collective: every rank calls it; rank 0 gets the tensors, the others an empty dict.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=backend != "full")
    full = get_model_state_dict(model, options=opts)
    # A tied parameter (embeddings = LM head) comes back as one copy per name; alias them again, or
    # save_pretrained, which finds ties by shared storage, would write the LM head as a separate tensor.
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in full:
            full[name] = full[first.setdefault(id(p), name)]
    return full


def full_optimizer_state(optimizer, main: bool) -> dict | None:
    """`optimizer.state_dict()` with every sharded state tensor gathered whole, in the single-process format
    (parameter indices, full CPU tensors), so checkpoints do not depend on how many processes wrote them.

    A collective (one all-gather per state tensor); rank 0 gets the dict, the others None.
    """
    from torch.distributed.tensor import DTensor

    sd = optimizer.state_dict()
    state = {}
    for i, s in sd["state"].items():  # same order on every rank: parameter index
        full = {k: v.full_tensor().cpu() if isinstance(v, DTensor) else v for k, v in s.items()}
        if main:
            state[i] = full
    return {"state": state, "param_groups": sd["param_groups"]} if main else None


def load_optimizer_state(optimizer, sd: dict) -> None:
    """Load a single-process-format optimizer state; full tensors of sharded parameters are sharded like them."""
    if "torch.distributed.tensor" in sys.modules:  # there are no DTensor parameters without it
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, s in sd["state"].items():  # same order on every rank: distribute_tensor scatters from rank 0
            p = params[int(i)]
            if not isinstance(p, DTensor):
                continue
            for k, v in s.items():
                if hasattr(v, "shape") and tuple(v.shape) == tuple(p.shape):  # moments; "step" stays a scalar
                    s[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements)
    optimizer.load_state_dict(sd)


def loading_full_tensors(model):
    """Context in which `load_state_dict` copies full tensors into a sharded model (each rank keeps its shard)."""
    if not is_sharded(model):
        return contextlib.nullcontext()
    from torch.distributed.tensor.experimental import implicit_replication

    return implicit_replication()
