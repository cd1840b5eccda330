"""Frozen bitsandbytes 4-bit projections with each weight's absmax dequantized once (the `FLAT_ABSMAX` switch).

Why by hand: a QLoRA base is NF4 with double quantization, so each weight's per-block scale (absmax) is itself stored
8-bit. bitsandbytes dequantizes that absmax again on every call: in `dequantize_4bit` (the backward pass, the fused
MLP) and in `gemm_4bit`'s fallback for training-sized inputs (the forward pass). The absmax never changes while the
base is frozen, so those are two Python-dispatched ops a call for nothing. On a GPU whose kernels wait on Python
(Qwen2.5-0.5B QLoRA took 1.33x LoRA's time on an H200; 1.5B took 1.00x) they may be much of QLoRA's extra time.
Here each weight keeps its absmax in f32 (1/16 of a byte a parameter) and a call runs bitsandbytes' own 4-bit
dequantize op once, giving bitsandbytes' weights bit for bit. Whether that pays on a GPU is NOT MEASURED, so the
switch is off unless the GPU benchmark's `mens-flat` side turns it on.

`dequantized_4bit` serves the fused LoRA MLP (`mens.train.lora_mlp`); `flatten_4bit_bases` binds the same path to
every other 4-bit projection of the decoder layers (attention, linear attention) while the model trains.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

FLAT_ABSMAX = "off"
""""auto": 4-bit projections dequantize from an absmax dequantized once per weight; "off": bitsandbytes' calls."""
_FLAT: WeakIdKeyDictionary = WeakIdKeyDictionary()  # 4-bit weight -> ((quant state, storage, version), f32 absmax)


def dequantized_4bit(weight, dtype: torch.dtype | None = None):
    """A bitsandbytes 4-bit weight in `dtype` (default: its quant state's), as `bitsandbytes.functional.
    dequantize_4bit` gives it; with FLAT_ABSMAX on, from an absmax dequantized once per weight."""
    import bitsandbytes.functional as bnbf

    qs = weight.quant_state
    dtype = dtype or qs.dtype
    if FLAT_ABSMAX == "off" or not qs.nested:
        return bnbf.dequantize_4bit(weight.data.view(-1, 1), qs).to(dtype)
    key = (id(qs), weight.data_ptr(), weight._version)
    kept = _FLAT.get(weight)
    if kept is None or kept[0] != key:
        absmax = bnbf.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset  # dequantize_4bit's own steps
        kept = (key, absmax.float())
        _FLAT[weight] = kept
    return torch.ops.bitsandbytes.dequantize_4bit.default(weight.data.view(-1, 1), kept[1], qs.blocksize,
                                                          qs.quant_type, qs.shape, dtype)


class _Frozen4bitLinear(torch.autograd.Function):
    """x @ W.T (+ bias) for a frozen 4-bit W: forward as bitsandbytes' `gemm_4bit` fallback computes it (W dequantized
    straight to x's dtype), backward as its `MatMul4Bit` does (W dequantized again, nothing kept between)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.weight = weight  # frozen: kept by reference, as bitsandbytes keeps it
        return F.linear(x, dequantized_4bit(weight, x.dtype), bias)

    @staticmethod
    def backward(ctx, dy):
        return dy @ dequantized_4bit(ctx.weight).to(dy.dtype), None, None


def _flat_forward(self, x):
    qs = getattr(self.weight, "quant_state", None)
    if (not self.training or qs is None or not qs.nested or not self.compute_type_is_set
            or getattr(qs, "packing_format_for_cpu", False)):
        return self._mens_bnb_forward(x)  # generation and first calls: bitsandbytes' own paths
    dtype = self.compute_dtype or x.dtype
    bias = None if self.bias is None else self.bias.to(dtype)
    return _Frozen4bitLinear.apply(x.to(dtype), self.weight, bias).to(x.dtype)


def flatten_4bit_bases(model) -> str | None:
    """With FLAT_ABSMAX on, bind the flat path to every bitsandbytes 4-bit projection in the decoder layers (a fused
    MLP's take it through `dequantized_4bit`); the preflight note, or None when off or there are none."""
    if FLAT_ABSMAX == "off":
        return None
    from bitsandbytes.nn import Linear4bit

    from mens.model.targets import decoder_layers

    _, layers = decoder_layers(model)
    bound = 0
    for layer in layers:
        for module in layer.modules():
            if isinstance(module, Linear4bit) and not hasattr(module, "_mens_bnb_forward"):  # not peft's wrapper
                module._mens_bnb_forward = module.forward
                module.forward = types.MethodType(_flat_forward, module)
                bound += 1
    return f"{bound} 4-bit projections dequantize from an absmax kept in f32" if bound else None
