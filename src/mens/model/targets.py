"""LoRA targets by discovery: every linear projection inside the decoder layers of the loaded model.

The decoder layers are the largest `nn.ModuleList` outside vision/audio towers. Inside them every `nn.Linear`
(bitsandbytes' Linear4bit / Linear8bitLt subclass it, so QLoRA bases count too) and GPT-2's `Conv1D` is adapted,
plus fused MoE expert weights (3-D `nn.Parameter`s, through peft's `target_parameters`). Embeddings, the LM head
and the towers lie outside the layers. The only table names the exceptions: MoE routers and gates, kept frozen.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from mens.errors import ModelError

ROUTER_NAMES = frozenset({"gate", "router", "shared_expert_gate", "shared_experts_gate"})
"""Leaf names of MoE routing layers (Qwen-MoE/Mixtral `mlp.gate`, Qwen's `shared_expert_gate`): they choose experts
and scale the shared one; adapting them shifts routing for every token, so they stay frozen on purpose."""

_TOWER_PARTS = ("vision", "visual", "audio", "image", "speech", "multi_modal_projector", "mm_projector")


@dataclass
class Targets:
    """What LoRA adapts in one model: full module and parameter names, and what was skipped or left out."""

    layers_path: str
    """Dotted name of the decoder layers' ModuleList (e.g. `model.layers`)."""
    n_layers: int
    layers: list[int]
    """Indices of the adapted layers (all of them unless only the top N were asked for)."""
    modules: list[str] = field(default_factory=list)
    """Linear modules to adapt (full names under the model peft wraps)."""
    parameters: list[str] = field(default_factory=list)
    """Weights adapted as parameters (peft `target_parameters`, full names): fused MoE experts (3-D), and the
    `.weight` of Linears whose name peft rewrites on this model type (`peft_renamed_leaves`)."""
    routers: list[str] = field(default_factory=list)
    """MoE routers/gates skipped on purpose (ROUTER_NAMES)."""
    left_out: list[str] = field(default_factory=list)
    """Weight-carrying modules of the adapted layers that peft cannot wrap (neither skipped on purpose nor adapted)."""
    conv1d: bool = False
    """The projections are GPT-2 Conv1D (transposed weights: peft's fan_in_fan_out)."""

    def peft_kwargs(self) -> dict:
        """`target_modules` as one regex that matches exactly `modules`, and `target_parameters` (full names)."""
        kw: dict = {"target_modules": module_regex(self.layers_path, self.modules) if self.modules else []}
        if self.parameters:
            kw["target_parameters"] = list(self.parameters)
        return kw

    def record(self) -> dict:
        return {"layers_path": self.layers_path, "n_layers": self.n_layers, "adapted_layers": self.layers,
                "modules": self.modules, "parameters": self.parameters, "skipped_routers": self.routers,
                "left_out": self.left_out}


def module_regex(layers_path: str, modules: list[str]) -> str:
    """A regex (peft full-matches it against module names) for exactly these `layers_path.<i>.<suffix>` names.

    Layers are grouped by their suffix set (a hybrid model has one group per layer kind), so no name outside the
    list can match: not a router, not a tower module that happens to share a leaf name.
    """
    by_layer: dict[int, set[str]] = {}
    for name in modules:
        index, _, suffix = name[len(layers_path) + 1:].partition(".")
        by_layer.setdefault(int(index), set()).add(suffix)
    groups: dict[tuple[str, ...], list[int]] = {}
    for index, suffixes in sorted(by_layer.items()):
        groups.setdefault(tuple(sorted(suffixes)), []).append(index)
    alts = [f"(?:{'|'.join(map(str, idx))})\\.(?:{'|'.join(re.escape(s) for s in sfx)})" for sfx, idx in groups.items()]
    return re.escape(layers_path) + r"\.(?:" + "|".join(alts) + ")"


def decoder_layers(model) -> tuple[str, list]:
    """(dotted name, layers) of the decoder's repeated blocks: the ModuleList holding most parameters, towers aside."""
    import torch

    best: tuple[str, list, int] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) == 0 or _in_tower(name):
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[2]:
            best = (name, list(module), size)
    return (best[0], best[1]) if best else ("", [])


def _in_tower(name: str) -> bool:
    return any(part.startswith(_TOWER_PARTS) or part.endswith(("_tower", "_encoder")) for part in name.split("."))


def is_linear(module) -> bool:
    """A projection peft's LoRA wraps: nn.Linear (incl. bitsandbytes 4/8-bit layers) or GPT-2's Conv1D."""
    import torch
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, torch.nn.Linear | Conv1D)


def peft_renamed_leaves(model_type: str) -> frozenset[str]:
    """Leaf names that peft rewrites to fused-expert targets on this model type.

    peft converts adapter configs written for transformers v4 MoE layouts (`gate_proj`/`up_proj`/`down_proj` of
    each expert -> `experts.gate_up_proj`/`down_proj`), on every load; a dense or shared-expert Linear with such a
    name would silently become an expert target. Those Linears are adapted through `target_parameters` instead.
    """
    try:
        from peft.utils import transformers_weight_conversion as conv

        base = conv._MODEL_TO_CONVERSION_PATTERN.get(model_type)
        return frozenset(conv._MOE_TARGET_MODULE_MAPPING.get(base, {})) if base else frozenset()
    except (ImportError, AttributeError):  # another peft: nothing renamed (attach_lora checks the result anyway)
        return frozenset()


def _scan_layer(prefix: str, layer, t: Targets, renamed: frozenset[str]) -> None:
    """Sort one layer's weight-carrying modules into adapt / router / left out."""
    import torch

    routers: list[str] = []
    for name, module in layer.named_modules():
        full = f"{prefix}.{name}" if name else prefix
        own = dict(module.named_parameters(recurse=False))
        weight = own.get("weight")
        if any(full.startswith(r + ".") for r in routers):
            continue  # inside a router
        if name.rsplit(".", 1)[-1] in ROUTER_NAMES or "Router" in type(module).__name__:
            routers.append(full)
            if any(True for _ in module.parameters()):
                t.routers.append(full)
            continue
        if is_linear(module) and name.rsplit(".", 1)[-1] in renamed:
            if type(module.weight) is torch.nn.Parameter and module.weight.is_floating_point():
                t.parameters.append(f"{full}.weight")  # same update as a LoRA Linear (peft ParamWrapper, 2-D)
            else:
                t.left_out.append(f"{full} ({type(module).__name__}: a quantized weight peft cannot adapt as a "
                                  "parameter, and its name is rewritten to the experts on this model type)")
            continue
        if is_linear(module):
            t.modules.append(full)
            t.conv1d = t.conv1d or not isinstance(module, torch.nn.Linear)
            continue
        if isinstance(module, torch.nn.modules.conv._ConvNd | torch.nn.Embedding):
            continue  # depthwise short convolutions of linear attention, per-layer embeddings: not projections
        t.parameters += [f"{full}.{p}" for p, v in own.items() if v.dim() == 3]  # fused experts (E, out, in)
        if weight is not None and weight.dim() == 2:
            t.left_out.append(f"{full} ({type(module).__name__})")


def find_targets(model, *, strict: bool = False, top_layers: int = 0) -> Targets:
    """Discover the LoRA targets of `model` (before peft wraps it).

    top_layers > 0: only the top N decoder layers. Modules peft cannot wrap fail (strict) or warn by name.

    Raises:
        ModelError: no decoder layers or nothing to adapt; strict and a projection would stay unadapted.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", "?")
    path, layers = decoder_layers(model)
    if not layers:
        raise ModelError(f"model_type {model_type!r} ({type(model).__name__}): found no decoder layers (no "
                         "nn.ModuleList of blocks outside vision/audio towers) to put LoRA adapters on; "
                         "use --backend full")
    keep = list(range(max(0, len(layers) - top_layers), len(layers))) if top_layers else list(range(len(layers)))
    t = Targets(layers_path=path, n_layers=len(layers), layers=keep)
    renamed = peft_renamed_leaves(model_type)
    for i in keep:
        _scan_layer(f"{path}.{i}", layers[i], t, renamed)
    if not t.modules and not t.parameters:
        raise ModelError(f"model_type {model_type!r}: the {len(layers)} decoder layers under {path!r} hold no "
                         "linear projection LoRA can adapt; use --backend full")
    if t.left_out:
        msg = (f"model_type {model_type!r}: {len(t.left_out)} weight module(s) in the decoder layers are not "
               f"layers peft's LoRA can wrap and stay frozen: {', '.join(t.left_out[:6])}"
               f"{' ...' if len(t.left_out) > 6 else ''}")
        if strict:
            raise ModelError(msg + ". Turn off --strict-targets to train the other "
                             f"{len(t.modules) + len(t.parameters)} targets, or use --backend full")
        warnings.warn(msg + f"; adapting the other {len(t.modules) + len(t.parameters)} (--strict-targets fails "
                      "instead)", stacklevel=2)
    return t
