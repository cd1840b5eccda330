"""Device probe and a training-memory estimate, from the model's config.json alone (no weights loaded)."""

from __future__ import annotations

import json
from pathlib import Path

from mens.train.presets import card_presets, load_preset, recommend_preset

FIT_SHARE = 0.9  # a run "fits" when its estimate is at most 90% of one process's memory
LINEAR_ATTENTION_ACTIVATIONS = 2.1
"""A linear-attention layer's activations over a softmax layer's: what makes the Qwen3.5-4B headline job's
measured peak (bench/results/gpu_headline-h100.json, torch fallback) match the estimate."""

_BYTES_PER_WEIGHT = {"qlora": 0.56, "lora": 2.0, "full": 4.0}  # NF4 + double-quant scales; bf16; f32 master


def probe_device(device: str = "auto") -> dict:
    """Device kind, name, memory (GB) and count: CUDA from torch, MPS, else CPU with system RAM."""
    import os

    import torch

    if device in ("auto", "cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        return {"kind": "cuda", "name": props.name, "memory_gb": round(total / 2**30, 1),
                "free_gb": round(free / 2**30, 1), "count": torch.cuda.device_count(),
                "bf16": torch.cuda.is_bf16_supported()}
    if device in ("auto", "mps") and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return {"kind": "mps", "name": "Apple GPU", "memory_gb": None, "count": 1, "bf16": False}
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = None
    return {"kind": "cpu", "name": "cpu", "memory_gb": round(mem, 1) if mem else None,
            "count": os.cpu_count(), "bf16": False}


def count_params(cfg: dict) -> tuple[int, int]:
    """(total parameters, parameters in the attention + MLP projections) estimated from config.json."""
    cfg = cfg.get("text_config", cfg)
    h = cfg.get("hidden_size") or cfg.get("n_embd")
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    vocab = cfg.get("vocab_size")
    inter = cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * h
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or h // heads
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    mlp = 3 * h * inter
    proj = layers * (attn + mlp)
    emb = vocab * h * (1 if cfg.get("tie_word_embeddings", True) else 2)
    return proj + emb, proj


def estimate_memory_gb(model_config: dict, *, backend: str, r: int, seq_len: int, batch_size: int,
                       gradient_checkpointing: bool = False) -> dict:
    """Rough peak training memory: weights + trainable state + activations + logits.

    Activations per token and decoder layer: about 30 x hidden + 2 x intermediate values (bf16 for adapters),
    fitted to the peaks measured on an H100 for Qwen2.5-0.5B and -1.5B shapes, LoRA and QLoRA, 4,096 to 16,384
    tokens a pass (the estimate is 0-14% above them; bench/results/gpu_train_speed-h100.json,
    gpu_train_speed-bs8-h100.json). Layers on transformers' torch fallback for linear attention (Qwen3.5 without
    flash-linear-attention) hold more: LINEAR_ATTENTION_ACTIVATIONS, from one measured Qwen3.5-4B job."""
    cfg = model_config.get("text_config", model_config)
    total, proj = count_params(model_config)
    h = cfg.get("hidden_size") or cfg.get("n_embd")
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    vocab = cfg.get("vocab_size")
    inter = cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * h
    # QLoRA quantizes the decoder's projections; embeddings and the LM head stay bf16
    weights = proj * _BYTES_PER_WEIGHT[backend] + (total - proj) * (2.0 if backend == "qlora" else
                                                                     _BYTES_PER_WEIGHT[backend])
    if backend == "full":
        trainable = total * 12  # f32 grad + two Adam moments
    else:
        lora_params = layers * 7 * r * 2 * h * 2  # ~7 projections, A and B of about h x r each (upper bound)
        trainable = lora_params * 16  # f32 weight, grad, two moments
    tokens = seq_len * batch_size
    act_bytes = 2 if backend != "full" else 4
    per_layer = tokens * (30 * h + 2 * inter) * act_bytes
    # linear-attention layers (Qwen3.5, Qwen3-Next) measured about 2.1x a softmax layer on transformers' torch
    # fallback; kept where flash-linear-attention would run them (not measured)
    linear = sum(kind == "linear_attention" for kind in (cfg.get("layer_types") or ()))
    weighted_layers = layers + (LINEAR_ATTENTION_ACTIVATIONS - 1) * min(linear, layers)
    # checkpointing keeps each layer's input and recomputes one layer's activations at a time
    activations = (per_layer * (LINEAR_ATTENTION_ACTIVATIONS if linear else 1) + tokens * h * act_bytes * layers
                   if gradient_checkpointing else per_layer * weighted_layers)
    # the loss holds one chunk of rows' f32 logits at a time (mens.train.loss): logits, their gradient, softmax
    logits = min(tokens, _loss_chunk_rows(vocab)) * vocab * 4 * 3
    gb = (weights + trainable + activations + logits) / 2**30 * 1.15 + 0.3  # allocator + runtime overhead
    return {"total_gb": round(gb, 2), "weights_gb": round(weights / 2**30, 2), "params_m": round(total / 1e6, 1)}


def _loss_chunk_rows(vocab: int) -> int:
    from mens.train.loss import chunk_rows  # imports torch: only when an estimate is asked for

    return chunk_rows(vocab)


def choose_checkpointing(setting: bool | None, *, model_config: dict, backend: str, r: int, seq_len: int,
                         batch_size: int, memory_gb: float | None) -> tuple[bool, str]:
    """Whether to recompute activations in backward, and why: forced by the setting, else on only when the run
    without it is estimated above FIT_SHARE of one process's memory (unknown memory: off)."""
    if setting is not None:
        return setting, f"{'on' if setting else 'off'} (--{'' if setting else 'no-'}gradient-checkpointing)"
    est = estimate_memory_gb(model_config, backend=backend, r=r, seq_len=seq_len, batch_size=batch_size)["total_gb"]
    if memory_gb is None:
        return False, f"off (estimate {est:.2f} GB without it; process memory unknown)"
    if est > FIT_SHARE * memory_gb:
        with_gc = estimate_memory_gb(model_config, backend=backend, r=r, seq_len=seq_len, batch_size=batch_size,
                                     gradient_checkpointing=True)["total_gb"]
        return True, (f"on (estimate {est:.2f} GB without it > {FIT_SHARE:.0%} of {memory_gb:.1f} GB; "
                      f"{with_gc:.2f} GB with it)")
    return False, f"off (estimate {est:.2f} GB fits {FIT_SHARE:.0%} of {memory_gb:.1f} GB)"


def _preset_estimate(cfg: dict, preset: dict, memory_gb: float | None) -> dict:
    """The memory estimate of training `cfg`'s model with a preset's settings on `memory_gb` of memory, with
    gradient checkpointing as `mens train` would choose it."""
    backend = preset.get("backend", "qlora")
    shape = {"backend": backend, "r": preset.get("r", 16), "seq_len": preset.get("seq_len", 512),
             "batch_size": preset.get("batch_size", 4)}
    gc, _ = choose_checkpointing(preset.get("gradient_checkpointing"), model_config=cfg, memory_gb=memory_gb, **shape)
    return {"backend": backend, "gradient_checkpointing": gc,
            **estimate_memory_gb(cfg, gradient_checkpointing=gc, **shape)}


def card_table(cfg: dict | None) -> list[dict]:
    """Per GPU size (8, 12, 16, 24, 48, 80 GB): the preset mens picks and, given a model config, whether it fits."""
    rows = []
    for gb, name in card_presets().items():
        row = {"card_gb": gb, "preset": name}
        if cfg is not None:
            est = _preset_estimate(cfg, load_preset(name), gb)
            row.update(estimate_gb=est["total_gb"], backend=est["backend"], fits=est["total_gb"] <= FIT_SHARE * gb,
                       gradient_checkpointing=est["gradient_checkpointing"])
        rows.append(row)
    return rows


def probe_report(model_dir: Path | None, device: str = "auto") -> dict:
    """What `mens probe` prints: device, memory, recommended preset, memory estimate, the preset per card size."""
    dev = probe_device(device)
    name = recommend_preset(dev["kind"], dev.get("memory_gb"))
    preset = load_preset(name)
    out = {"device": dev, "recommended_preset": name, "preset": preset}
    cfg = None
    if model_dir is not None and (model_dir / "config.json").is_file():
        cfg = json.loads((model_dir / "config.json").read_text())
        out["model"] = str(model_dir)
        out["estimate"] = _preset_estimate(cfg, preset, dev.get("memory_gb"))
        if dev.get("memory_gb"):
            out["estimate"]["fits"] = out["estimate"]["total_gb"] <= FIT_SHARE * dev["memory_gb"]
    out["cards"] = card_table(cfg)
    return out
