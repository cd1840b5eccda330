"""A LoRA-adapted gated MLP (gate, up and down projections with SiLU) as one autograd function.

Why by hand: in peft, each of the three projections is a base matmul plus a LoRA branch, and autograd keeps every
intermediate the pieces need: SiLU's input and output, the up projection, and their product (the down projection's
LoRA input). The product alone is as large as the MLP's width per token. This function keeps the block's input,
the two projections and the rank-r LoRA intermediates, and recomputes the product in backward: one element-wise
pass, no matmul. Unsloth trains its LoRA MLPs the same way.

The forward pass runs peft's operations (the same modules run the base projections, under the same autocast; on
CUDA, Liger's SwiGLU kernel where it is installed); the backward pass computes the same gradients by hand. Liger's
backward kernel writes the gradients over the saved gate and up projections, so such a graph cannot be
back-propagated twice (mens never does).

Used where every projection carries one plain LoRA adapter (no dropout, no DoRA, not merged, no bias) over an
nn.Linear or a bitsandbytes 4-bit layer, the activation is SiLU, and the fused block gives the module's own output
on a probe input. Anything else keeps peft's modules; so does a call with the adapters disabled or merged.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

from mens.train import flat_4bit
from mens.train.flat_4bit import dequantized_4bit
from mens.train.int8_base import Int8Linear

FUSED_LORA_MLP = "auto"  # "auto": fuse every MLP that qualifies; "off": peft's modules (the benchmark's A/B)


def fuse_lora_mlps(model, autocast) -> str | None:
    """Bind the fused forward to each decoder layer's qualifying MLP; the preflight note, or None when none
    qualifies or the switch is off."""
    if FUSED_LORA_MLP == "off":
        return None
    from mens.model.targets import decoder_layers

    _, layers = decoder_layers(model)
    stream = model.get_input_embeddings().weight.dtype
    mlps = [m for m in (getattr(layer, "mlp", None) for layer in layers) if m is not None and _qualifies(m)]
    if not mlps or not _agrees(mlps[0], autocast, stream):
        return None
    for mlp in mlps:
        mlp._mens_peft_forward = mlp.forward
        mlp.forward = types.MethodType(_fused_forward, mlp)
        mlp._mens_fused_lora = True
    return f"{len(mlps)} of {len(layers)} decoder layers (gated-MLP products recomputed in backward)"


def is_fused(module) -> bool:
    return bool(getattr(module, "_mens_fused_lora", False))


def _projections(mlp):
    return mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _qualifies(mlp) -> bool:
    if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return False
    probe = torch.linspace(-4, 4, 9)
    try:
        if not torch.allclose(mlp.act_fn(probe), F.silu(probe)):
            return False
    except Exception:
        return False
    return all(_plain_lora(p) for p in _projections(mlp))


def _plain_lora(proj) -> bool:
    lora_a = getattr(proj, "lora_A", None)
    if lora_a is None or len(lora_a) != 1 or getattr(proj, "merged", True) or getattr(proj, "disable_adapters", True):
        return False
    name = next(iter(lora_a))
    if list(getattr(proj, "active_adapters", [])) != [name] or name in getattr(proj, "lora_variant", {}):
        return False
    if not isinstance(proj.lora_dropout[name], torch.nn.Identity) or proj.lora_A[name].bias is not None:
        return False
    if proj.lora_B[name].bias is not None:
        return False
    base = proj.base_layer
    if type(base) is torch.nn.Linear or type(base) is Int8Linear:
        return base.bias is None
    return type(base).__name__ == "Linear4bit" and base.bias is None and hasattr(base.weight, "quant_state")


def _active(mlp) -> bool:
    return all(not p.disable_adapters and not p.merged for p in _projections(mlp))


def _fused_forward(self, x):
    if not _active(self):
        return self._mens_peft_forward(x)
    g, u, d = _projections(self)
    name = next(iter(g.lora_A))
    return _LoraMLP.apply(x, g.lora_A[name].weight, g.lora_B[name].weight, u.lora_A[name].weight,
                          u.lora_B[name].weight, d.lora_A[name].weight, d.lora_B[name].weight,
                          (g, u, d), (g.scaling[name], u.scaling[name], d.scaling[name]))


def _input_grad(base, grad):
    """grad @ W for a frozen base projection: W itself, an int8 W as its own backward does it, or a 4-bit weight
    dequantized as bitsandbytes' own backward does."""
    if type(base) is torch.nn.Linear:
        return grad @ base.weight.to(grad.dtype)
    if type(base) is Int8Linear:
        return base.input_grad(grad)
    return grad @ dequantized_4bit(base.weight).to(grad.dtype)


def _base(proj, x):
    """The frozen base projection of x: the module itself, except a 4-bit one under FLAT_ABSMAX (the same matmul
    of the same dequantized weight, in the dtype bitsandbytes computes and returns)."""
    base = proj.base_layer
    if flat_4bit.FLAT_ABSMAX == "off" or type(base).__name__ != "Linear4bit":
        return base(x)
    dtype = base.compute_dtype or x.dtype
    return F.linear(x.to(dtype), dequantized_4bit(base.weight, dtype)).to(x.dtype)


def _liger_swiglu(t: torch.Tensor):
    """Liger's SwiGLU forward/backward kernels for a CUDA tensor where liger-kernel imports (one kernel each instead
    of torch's several element-wise passes over tokens x MLP width), else None."""
    return _liger_swiglu_ops() if t.device.type == "cuda" else None


@functools.cache
def _liger_swiglu_ops():
    """Imported once: a failed import is not cached by Python, and this runs twice per layer and pass."""
    try:
        from liger_kernel.ops.swiglu import swiglu_backward, swiglu_forward
    except ImportError:
        return None
    return swiglu_forward, swiglu_backward


def _gated(e, up):
    """silu(e) * up."""
    if liger := _liger_swiglu(e):
        return liger[0](e, up)[2]
    return F.silu(e) * up


class _LoraMLP(torch.autograd.Function):
    """y = down(silu(gate(x)) * up(x)) with each projection base(x) + B(A(x)) * scaling, as peft computes it."""

    @staticmethod
    def forward(ctx, x, a_g, b_g, a_u, b_u, a_d, b_d, projections, scalings):
        g_proj, u_proj, d_proj = projections
        s_g, s_u, s_d = scalings
        la_g, la_u = F.linear(x, a_g), F.linear(x, a_u)
        e = _base(g_proj, x) + F.linear(la_g, b_g) * s_g
        up = _base(u_proj, x) + F.linear(la_u, b_u) * s_u
        h = _gated(e, up)
        la_d = F.linear(h, a_d)
        y = _base(d_proj, h) + F.linear(la_d, b_d) * s_d
        ctx.save_for_backward(x, e, up, la_g, la_u, la_d, a_g, b_g, a_u, b_u, a_d, b_d)
        ctx.projections, ctx.scalings = projections, scalings
        return y

    @staticmethod
    def backward(ctx, dy):
        x, e, up, la_g, la_u, la_d, a_g, b_g, a_u, b_u, a_d, b_d = ctx.saved_tensors
        g_proj, u_proj, d_proj = ctx.projections
        s_g, s_u, s_d = ctx.scalings
        cd = e.dtype  # the dtype the forward pass computed in (bf16 under autocast)
        a_g, b_g, a_u, b_u, a_d, b_d = (w.to(cd) for w in (a_g, b_g, a_u, b_u, a_d, b_d))
        shape = x.shape
        x2, e2, up2 = x.reshape(-1, shape[-1]).to(cd), e.reshape(-1, e.shape[-1]), up.reshape(-1, up.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1]).to(cd)

        dla_d = (dy2 @ b_d) * s_d
        grad_b_d = (dy2.t() @ la_d.reshape(-1, la_d.shape[-1]).to(cd)) * s_d
        liger = _liger_swiglu(e2)
        silu = None if liger else F.silu(e2)  # kept for d_up below
        h = liger[0](e2, up2)[2] if liger else silu * up2  # recomputed, not saved
        grad_a_d = dla_d.t() @ h
        del h
        dh = _input_grad(d_proj.base_layer, dy2) + dla_d @ a_d
        if liger:  # one kernel; it writes the gradients over e and up, which backward no longer needs
            d_e, d_up = liger[1](e2.contiguous(), up2.contiguous(), dh.contiguous())
        else:  # torch's own SiLU and product backward, as autograd runs them for peft's modules
            d_up = dh * silu
            d_e = torch.ops.aten.silu_backward(dh * up2, e2)
        del dh, silu

        dla_g, dla_u = (d_e @ b_g) * s_g, (d_up @ b_u) * s_u
        grad_b_g = (d_e.t() @ la_g.reshape(-1, la_g.shape[-1]).to(cd)) * s_g
        grad_b_u = (d_up.t() @ la_u.reshape(-1, la_u.shape[-1]).to(cd)) * s_u
        grad_a_g, grad_a_u = dla_g.t() @ x2, dla_u.t() @ x2
        dx = None
        if ctx.needs_input_grad[0]:
            dx = (_input_grad(g_proj.base_layer, d_e) + _input_grad(u_proj.base_layer, d_up)
                  + dla_g @ a_g + dla_u @ a_u).reshape(shape)
        return dx, grad_a_g, grad_b_g, grad_a_u, grad_b_u, grad_a_d, grad_b_d, None, None


def _agrees(mlp, autocast, dtype) -> bool:
    """The fused block gives the MLP's own output on a probe input (once per model: every layer's MLP is the same
    class)."""
    from mens.train.kernels import same_output

    width = getattr(mlp.gate_proj.base_layer, "in_features", None)
    return width is not None and same_output(mlp.forward, lambda x: _fused_forward(mlp, x), mlp, width, dtype,
                                             autocast)
