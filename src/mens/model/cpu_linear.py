"""Faster f32 decoding on CPU: each linear layer's weight packed once into oneDNN's blocked layout.

A decoding step multiplies a handful of rows (the answers still going) by every weight matrix. torch sends an
f32 `x @ W^T` to its BLAS (MKL in the PyPI wheels), which is fast for the hundreds of rows of a training step but
packs the weight into its own layout inside every call, as GEMM libraries do. oneDNN, inside torch, takes a weight
packed once (`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU freezing uses). Written here
because that freezing packs only a compiled model, and eval and `mens serve` run the model eagerly. Measured by
`bench/cpu_decode_kernels.py` (docs/benchmarks.md, "Packed weights for CPU decoding").

Only inference sees it: `load_for_inference` packs models on CPU with f32 weights. A call with gradients enabled,
or with input of another dtype, takes the layer's own path. LoRA's own small layers (`lora_A`, `lora_B`) are
left alone: peft reads their weights.
"""

from __future__ import annotations

import types

import torch

PACK_SHARE_OF_FREE_MEMORY = 0.25
"""The packed copies (as large as the weights they copy) are made only when they fit in this share of the memory
the machine has free: a copy that pushed the process into swap would cost more than it saves."""
PACK_ROWS_HINT = 16
"""The row count oneDNN lays the weight out for: decoding's batches run from 64 rows down to 1."""


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (CPU builds for x86 and ARM do)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") \
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _packable(name: str, module: torch.nn.Module) -> bool:
    if type(module) is not torch.nn.Linear or "lora_" in name:
        return False
    w = module.weight
    return w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2 and w.is_contiguous()


def pack_linears(model: torch.nn.Module) -> int:
    """Give every plain f32 `nn.Linear` on CPU in `model` a oneDNN-packed copy of its weight, used whenever the layer
    is called without gradients on f32 input. Returns how many layers were packed (0 where the build lacks oneDNN
    or the copies would not fit in memory). The weights themselves stay as they were (saving, merging and any
    gradient-enabled call use them)."""
    if not packing_available():
        return 0
    layers = [(name, m) for name, m in model.named_modules() if _packable(name, m)]
    need = sum(m.weight.numel() * m.weight.element_size() for _, m in layers)
    try:
        import psutil

        free = psutil.virtual_memory().available
    except Exception:  # noqa: BLE001 - no reading of free memory: pack only what is surely small
        free = 4 * 2**30
    if not layers or need > PACK_SHARE_OF_FREE_MEMORY * free:
        return 0
    for _, m in layers:
        _pack(m)
        m.forward = types.MethodType(_packed_forward, m)
    return len(layers)


def _pack(layer: torch.nn.Linear) -> None:
    layer._mens_packed_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), PACK_ROWS_HINT)
    layer._mens_packed_of = _state(layer.weight)


def _state(weight: torch.Tensor) -> tuple[int, int]:
    """Where the weight's data lives and its version (moved by any in-place write, such as a merge): when either
    changes, the packed copy is stale."""
    return weight.data_ptr(), weight._version


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu" or \
            (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
        return type(self).forward(self, x)  # the layer's own path: gradients, other dtypes
    if _state(self.weight) != self._mens_packed_of:
        _pack(self)
    bias = None if self.bias is None else self.bias.detach()
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(rows, self._mens_packed_weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])
