"""Attach LoRA adapters (peft) to every projection the architecture table names; save them in PEFT format."""

from __future__ import annotations

import warnings
from pathlib import Path

from mens.model.targets import find_targets

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def attach_lora(model, *, r: int, alpha: float, dropout: float, strict: bool = False):
    """Wrap `model` in a `PeftModel` with LoRA on all attention + MLP projections. Seed torch before calling."""
    import peft

    targets = find_targets(model, strict=strict)
    fan_in_fan_out = getattr(model.config, "model_type", "") == "gpt2"  # GPT-2 uses Conv1D (transposed weights)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                          fan_in_fan_out=fan_in_fan_out, bias="none", task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft reads a property transformers 5 has deprecated; nothing to act on
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return peft.get_peft_model(model, cfg)


def adapter_state(model) -> dict:
    """The trainable adapter tensors under PEFT's saved key names (on CPU, contiguous)."""
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}


def save_adapter(model, out_dir: str | Path) -> None:
    """Write adapter_config.json + adapter_model.safetensors (exactly those two files, no README)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter_state(model), str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    model.peft_config["default"].save_pretrained(str(out))  # writes adapter_config.json only


def load_adapter_weights(model, adapter_dir: str | Path) -> None:
    """Load adapter tensors saved by `save_adapter` into an already-wrapped `PeftModel` (for resume)."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(Path(adapter_dir) / "adapter_model.safetensors")))
