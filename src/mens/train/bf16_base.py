"""Frozen base projections held in bf16 for a LoRA run under bf16 autocast on CPU.

Why by hand: autocast keeps the bf16 copy it makes of a weight only for leaf tensors that require grad, so a
frozen f32 projection is cast anew on every call: every step reads each frozen weight in f32 and writes a bf16
copy in the forward pass, and the fused LoRA MLP's backward (mens.train.lora_mlp) casts its three weights a second
time.
The matmul then reads that copy. Holding the bf16 copy in place of the f32 weight gives autocast exactly the
tensor it would have made (the same rounding, so the same step to the bit) without the casts. The step's speed
with and without it, paired inside one run: docs/benchmarks.md ("Frozen base weights held in bf16").

Only the base layers of LoRA-adapted nn.Linear projections whose weight does not train are held in bf16; the
embeddings and a head tied to them, the norms and the adapters keep their dtype, as autocast computes them. The
f32 weights are kept aside and put back after training (`restore`), so whatever runs on the model after that sees
it as it was loaded. On CUDA a LoRA base is loaded in bf16 already; the f32 path (no native bf16) has nothing to
cast.
"""

from __future__ import annotations

import torch

BF16_BASE = "auto"
""""auto": under bf16 autocast on CPU, the frozen LoRA base projections are held in bf16; "off": they stay f32 and
autocast casts them on every call (the benchmark's A/B)."""


def bind_for_training(model, *, amp: str | None, device: str, backend: str, sharded: bool,
                      spare_gb: float | None = None) -> tuple[list, str | None]:
    """Hold the frozen base projections in bf16 where it applies; returns what `restore` needs and the preflight
    note (None where it does not apply). `spare_gb`: what the run's memory estimate leaves of the process's share
    (None: unknown); copies that would not fit in it are not made, and the note says so."""
    if BF16_BASE == "off" or amp != "bf16" or device != "cpu" or backend != "lora" or sharded:
        return [], None
    targets = frozen_projections(model)
    if not targets:
        return [], None
    mb = sum(base.weight.numel() for base in targets) * 2 / 2**20
    if spare_gb is not None and mb / 1024 > spare_gb:
        return [], (f"kept f32: the bf16 copies of {len(targets)} frozen base projections ({mb:.0f} MB) do not fit "
                    f"the {max(0.0, spare_gb) * 1024:.0f} MB the run's memory estimate leaves; autocast casts them "
                    "on every call instead")
    swapped = bind(model)
    return swapped, (f"{len(swapped)} frozen base projections held in bf16 ({mb:.0f} MB beside their f32 weights, "
                     "which come back after training): autocast's own cast, made once instead of every call")


def frozen_projections(model) -> list[torch.nn.Linear]:
    """The nn.Linear bases of LoRA-adapted projections whose weight is frozen, f32, on the CPU and not shared with
    the embeddings: the ones `bind` holds in bf16."""
    from peft.tuners.lora import LoraLayer

    shared = {id(getattr(m, "weight", None)) for m in (model.get_input_embeddings(), model.get_output_embeddings())
              if m is not None}
    found = []
    for module in model.modules():
        base = getattr(module, "base_layer", None)
        if not isinstance(module, LoraLayer) or type(base) is not torch.nn.Linear:
            continue
        w = base.weight
        if not w.requires_grad and w.dtype == torch.float32 and w.device.type == "cpu" and id(w) not in shared:
            found.append(base)
    return found


def bind(model) -> list[tuple[torch.nn.Linear, torch.nn.Parameter]]:
    """Replace the weight of each of `frozen_projections(model)` by its bf16 copy; returns (module, f32 weight)
    pairs for `restore`."""
    swapped = []
    for base in frozen_projections(model):
        w = base.weight
        base.weight = torch.nn.Parameter(w.detach().to(torch.bfloat16), requires_grad=False)
        swapped.append((base, w))
    return swapped


def restore(swapped: list[tuple[torch.nn.Linear, torch.nn.Parameter]]) -> None:
    """Put the f32 weights back: the model then computes exactly as before `bind`."""
    for base, w in swapped:
        base.weight = w
