"""Load what a user points at for inference: a run directory (base + adapter), a merged or plain model directory.

A QLoRA run is loaded as it was trained: base in NF4 (double quant) with the adapter on top, so what is
served is what was trained. The system prompt travels with the model: `training_manifest.json`
(`system_prompt`) in a run directory, `system_prompt.txt` in a merged directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mens.errors import ModelError
from mens.run_records import ADAPTER_CONFIG, MANIFEST, SYSTEM_PROMPT, TrainingManifest, read_json

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Config attributes that name a model's context length, in the order they are trusted."""


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    system_prompt: str | None
    model_id: str
    kind: str
    """"run" (base + adapter) or "model" (a merged or plain Hugging Face directory)."""

    @property
    def context_length(self) -> int | None:
        """The model's position limit from its config (None when the config names none)."""
        config = getattr(self.model, "config", None)
        for name in CONTEXT_KEYS:
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None


def resolve_base(run: Path) -> tuple[Path, TrainingManifest]:
    """The local base model directory of a run, and the run's manifest (empty when the run has none: an adapter
    directory from another tool)."""
    manifest = TrainingManifest.read_optional(run / MANIFEST) or TrainingManifest()
    adapter_cfg = read_json(run / ADAPTER_CONFIG) if (run / ADAPTER_CONFIG).is_file() else {}
    base = manifest.base_model_path or (adapter_cfg.get("base_model_name_or_path") if isinstance(adapter_cfg, dict)
                                        else None)
    if not base:
        raise ModelError(f"{run}: neither {MANIFEST} nor {ADAPTER_CONFIG} names the base model")
    base_dir = Path(base)
    if not (base_dir / "config.json").is_file():
        raise ModelError(f"base model {base} (from {run}) is not a local model directory with config.json; "
                         "download it or point base_model_name_or_path in adapter_config.json at a local copy")
    return base_dir, manifest


def _device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _for_decoding(model):
    """The model, its f32 linear layers on CPU packed for oneDNN (mens.model.cpu_linear: faster decoding)."""
    from mens.model.cpu_linear import pack_linears

    pack_linears(model)
    return model


def load_for_inference(path: str | Path, *, device: str = "auto") -> LoadedModel:
    """Model + tokenizer + system prompt from a run directory or a model directory, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from mens.model.load import auto_tokenizer
    from mens.model.quant import nf4_config

    p = Path(path)
    dev = _device(device)
    if (p / ADAPTER_CONFIG).is_file():
        from mens.model.lora import load_adapter

        base_dir, manifest = resolve_base(p)
        kwargs: dict = {"dtype": torch.bfloat16 if dev == "cuda" else torch.float32}
        if manifest.backend == "qlora":
            kwargs["quantization_config"] = nf4_config(dev)  # the training config: served = trained
            kwargs["device_map"] = dev
        base = AutoModelForCausalLM.from_pretrained(base_dir, **kwargs)
        if "device_map" not in kwargs:
            base.to(dev)
        model = load_adapter(base, p)
        tok_dir = p if (p / "tokenizer_config.json").is_file() else base_dir
        tokenizer = auto_tokenizer(tok_dir)
        return LoadedModel(_for_decoding(model.eval()), tokenizer, manifest.system_prompt, p.name, "run")
    if (p / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
        model.to(dev)
        tokenizer = auto_tokenizer(p)
        sp = p / SYSTEM_PROMPT
        system_prompt = sp.read_text(encoding="utf-8") if sp.is_file() else None
        return LoadedModel(_for_decoding(model.eval()), tokenizer, system_prompt, p.name, "model")
    raise ModelError(f"{p}: not a run directory (adapter_config.json) nor a model directory (config.json); "
                     "pass the --output-dir of `mens train`, or the -o of `mens merge`")
