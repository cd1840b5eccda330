"""LoRA target modules per architecture: a table of projection names by `config.model_type`.

Every attention and MLP projection of the decoder is adapted; embeddings and the LM head stay frozen.
"""

from __future__ import annotations

import warnings

from mens.errors import ModelError

_LLAMA_LIKE = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

TARGETS: dict[str, list[str]] = {
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "gemma": _LLAMA_LIKE,
    "gemma2": _LLAMA_LIKE,
    "olmo2": _LLAMA_LIKE,
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],  # c_proj is both the attention and the MLP output projection
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
}
"""model_type -> module-name suffixes that peft's `target_modules` matches."""

_SKIP_PARTS = ("vision", "visual", "audio", "lm_head", "embed")


def expected_targets(model_type: str) -> list[str]:
    """The projection names expected for a model type (Llama-style names when the type is unknown)."""
    return list(TARGETS.get(model_type, _LLAMA_LIKE))


def find_targets(model, *, strict: bool = False) -> list[str]:
    """The target names present in every decoder layer of `model`; missing ones fail (strict) or warn.

    Raises:
        ModelError: strict and a projection of the table is missing from some layer.
    """
    cfg = model.config
    model_type = getattr(cfg, "model_type", "?")
    n_layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", 1)
    counts: dict[str, int] = {}
    for name, module in model.named_modules():
        if any(p in name for p in _SKIP_PARTS) or list(module.children()):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if hasattr(module, "weight"):
            counts[leaf] = counts.get(leaf, 0) + 1
    wanted = expected_targets(model_type)
    present = [t for t in wanted if counts.get(t, 0) >= n_layers]
    missing = [f"{t} (found {counts.get(t, 0)} of {n_layers} layers)" for t in wanted if t not in present]
    if missing:
        msg = (f"model_type {model_type!r}: LoRA targets missing: {', '.join(missing)}; "
               f"expected {wanted} in each of {n_layers} layers")
        if strict or not present:
            raise ModelError(msg + ". Check that the model directory is complete, or add the architecture to "
                             "mens.model.targets.TARGETS (strict mode: turn it off with --no-strict-targets)")
        warnings.warn(msg + f"; adapting only {present}", stacklevel=2)
    return present
