"""Liger Kernel's RMSNorm and SwiGLU for the decoder layers of a model that trains on CUDA.

Why: in a LoRA step on a GPU, the frozen base's norms and gated MLPs are memory-bound element-wise work. torch's
RMSNorm keeps f32 copies of every hidden state it normalises for the backward pass, and SiLU(gate) * up keeps the
SiLU output too; Liger's Triton kernels (those TRL's `use_liger_kernel` applies) keep only their inputs and
recompute the rest in backward, in one kernel each.

mens binds Liger's functions to this model's own module instances, rather than through Liger's
`apply_liger_kernel_to_*`: those also replace classes and functions inside transformers' modules for the whole
process, so a model loaded later in the same process (on CPU, to merge or evaluate) would run Triton kernels too.
Rotary embeddings stay torch's: transformers calls them as a module-level function, which cannot be swapped for one
model alone.

Each kind of module is bound only when Liger's version gives the module's own output on a probe input (within bf16
rounding): a norm of another form, such as Gemma's `(1 + weight)`, or an MLP with another activation keeps torch's.
"""

from __future__ import annotations

import types
from collections.abc import Callable

LAYER_KERNELS = "auto"  # "auto": Liger's kernels where usable (CUDA, liger-kernel installed); "off": torch's own
PROBE_TOLERANCE = 2e-2  # relative to the output's scale: bf16 keeps ~3 significant digits, a wrong form is ~100%


def layer_kernels(model, device: str, autocast) -> str | None:
    """Bind Liger's RMSNorm and SwiGLU to the decoder layers where they agree with the model's own modules.
    Returns the preflight note, or None when not on CUDA, not installed or switched off."""
    if LAYER_KERNELS == "off" or not str(device).startswith("cuda"):
        return None
    try:
        from liger_kernel.transformers.functional import liger_rms_norm, liger_swiglu
    except ImportError:
        return None
    return bind_layer_kernels(model, rms_norm=liger_rms_norm, swiglu=liger_swiglu, autocast=autocast,
                              source="Liger")


def bind_layer_kernels(model, *, rms_norm: Callable, swiglu: Callable, autocast, source: str) -> str:
    """The device-independent part of `layer_kernels`: `rms_norm(x, weight, eps, offset, casting_mode, in_place)`
    and `swiglu(gate, up)` replace the forward of each decoder layer's RMSNorms and gated MLPs whose own output
    they reproduce (checked once per module class). Returns what was bound and what was kept."""
    from mens.model.targets import decoder_layers

    _, layers = decoder_layers(model)
    stream = model.get_input_embeddings().weight.dtype  # the hidden states' dtype: each probe's input
    norms, mlps = [], []
    for layer in layers:
        for module in layer.modules():
            if _is_rms_norm(module):
                norms.append(module)
            elif _is_gated_mlp(module):
                mlps.append(module)
    verdicts: dict[type, bool] = {}
    bound = {"RMSNorm": 0, "SwiGLU MLP": 0}
    kept: set[str] = set()
    for kind, modules, forward in (("RMSNorm", norms, _norm_forward(rms_norm)), ("SwiGLU MLP", mlps,
                                                                                  _mlp_forward(swiglu))):
        for module in modules:
            cls = type(module)
            if cls not in verdicts:
                verdicts[cls] = _agrees(module, forward, autocast, stream)
            if verdicts[cls]:
                module.forward = types.MethodType(forward, module)
                bound[kind] += 1
            else:
                kept.add(cls.__name__)
    done = ", ".join(f"{kind} in {n} places" for kind, n in bound.items() if n) or "nothing bound"
    rest = f"; torch's kept for {', '.join(sorted(kept))} (another form)" if kept else ""
    return f"{source}: {done}{rest}"


def _is_rms_norm(module) -> bool:
    import torch

    weight = getattr(module, "weight", None)
    return (type(module).__name__.endswith("RMSNorm") and isinstance(weight, torch.nn.Parameter)
            and weight.dim() == 1 and _eps(module) is not None)


def _is_gated_mlp(module) -> bool:
    from mens.train.lora_mlp import is_fused

    names = ("gate_proj", "up_proj", "down_proj", "act_fn")
    return not is_fused(module) and all(hasattr(module, name) for name in names)  # a fused one keeps its own


def _eps(module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def _norm_forward(rms_norm: Callable):
    def forward(self, hidden_states):
        # llama casting: normalise in f32, cast back to the input's dtype, then scale (transformers' LlamaRMSNorm);
        # out of place in backward, since the incoming gradient may be shared
        return rms_norm(hidden_states, self.weight, _eps(self), 0.0, "llama", False)

    return forward


def _mlp_forward(swiglu: Callable):
    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))

    return forward


def _agrees(module, forward, autocast, dtype) -> bool:
    """The module's own forward and the replacement agree on a probe input of the hidden states' dtype (under
    QLoRA: bf16 states through f32 norm weights, as in training)."""
    width = module.weight.shape[0] if _is_rms_norm(module) else _in_features(module.gate_proj)
    return width is not None and same_output(module.forward, lambda x: forward(module, x), module, width, dtype,
                                             autocast)


def same_output(own: Callable, replacement: Callable, module, width: int, dtype, autocast) -> bool:
    """`own` and `replacement` give the same output (within PROBE_TOLERANCE of its scale) on a small seeded random
    input of `width` features on the module's device; an exception in either counts as no."""
    import torch

    param = next(module.parameters(), None)
    if param is None:
        return False
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(3, width, generator=gen).to(device=param.device, dtype=dtype)
    try:
        with torch.no_grad(), autocast():
            want = own(x).float()
            got = replacement(x).float()
    except Exception:  # a kernel that cannot take this module: keep the module's own
        return False
    scale = want.abs().max().clamp_min(1e-6)
    return bool(got.shape == want.shape and ((got - want).abs().max() / scale) <= PROBE_TOLERANCE)


def _in_features(linear) -> int | None:
    base = getattr(linear, "base_layer", linear)  # a peft-wrapped projection
    return getattr(base, "in_features", None)
