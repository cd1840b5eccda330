"""What goes into `training_manifest.json`, `training-preflight.json` and `run_summary.json` (what ran, on what,
how it went); the files and their records are named in `mens.run_records`."""

from __future__ import annotations

import hashlib
import json
import platform
import sys

EXECUTION_KERNEL = "torch-peft-loop-v1"


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "platform": sys.platform}
    for pkg in ("mens", "torch", "transformers", "peft", "bitsandbytes", "safetensors", "accelerate"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def contract_digest(config: dict, data_sha256: str, base_sha256: str) -> str:
    """sha256 of what determines the result: the resolved config (minus paths and resume), data and base."""
    keep = {k: v for k, v in config.items() if k not in ("output_dir", "resume", "data", "log_every_s", "num_threads",
                                                           "fsdp")}  # how work is split, not what it computes
    blob = json.dumps({"config": keep, "data": data_sha256, "base": base_sha256}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def peak_memory_mb(device: str) -> dict:
    import resource

    import torch

    out = {"cpu_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if device.startswith("cuda") and torch.cuda.is_available():
        out["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        out["cuda_max_reserved_mb"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    return out


def adapter_record(model) -> dict | None:
    """What LoRA adapted (full module and parameter names), what it skipped or left out, and what trains.

    None for a model without discovered targets (full fine-tuning).
    """
    targets = getattr(model, "mens_targets", None)
    if targets is None:
        return None
    peft_cfg = model.peft_config["default"]
    return {**targets.record(), "peft_target_modules": peft_cfg.target_modules,
            "peft_target_parameters": list(peft_cfg.target_parameters or []), "lora_dropout": peft_cfg.lora_dropout,
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total_parameters": sum(p.numel() for p in model.parameters())}
