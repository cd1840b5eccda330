"""Attach LoRA adapters (peft) to every projection of the decoder layers (found by discovery); save them in PEFT
format."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

from mens.errors import ModelError
from mens.model.targets import Targets, find_targets

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def has_adapter(run_dir: Path) -> bool:
    """Whether a run directory holds a PEFT adapter (LoRA/QLoRA) rather than full fine-tuned weights."""
    return all((Path(run_dir) / f).is_file() for f in ADAPTER_FILES)


@contextmanager
def _peft_reads_deprecated_property():
    """peft's PeftModel reads `is_gradient_checkpointing`, which transformers 5 deprecates with a FutureWarning on
    every wrap and every adapter load; nothing for a mens user to act on, so it is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def load_adapter(base, adapter_dir):
    """`PeftModel.from_pretrained(base, adapter_dir)`: plain peft, as any user of the adapter loads it."""
    from peft import PeftModel

    with _peft_reads_deprecated_property():
        return PeftModel.from_pretrained(base, adapter_dir)


def attach_lora(model, *, r: int, alpha: float, dropout: float, strict: bool = False, top_layers: int = 0):
    """Wrap `model` in a `PeftModel` with LoRA on every projection of its decoder layers. Seed torch before calling.

    top_layers > 0: only the top N decoder layers get adapters. Back-propagation then stops at the lowest adapted
    layer, which is where most of a step's time goes (measured on SmolLM2-135M, CPU: the top 15 of 30 layers train
    1.6x faster than all 30). The discovered targets are kept on the result as `mens_targets` (for the manifest).
    """
    import peft

    targets = find_targets(model, strict=strict, top_layers=top_layers)
    if targets.parameters and dropout:
        # peft's ParamWrapper (MoE experts) cannot apply dropout: x cannot be factored out of B(A(drop(x)))
        warnings.warn(f"lora_dropout {dropout:g} -> 0 for this adapter: peft applies no dropout to the "
                      f"{len(targets.parameters)} MoE weights it adapts as parameters, and one adapter has one "
                      "dropout. Pass --lora-dropout 0 to make this explicit", stacklevel=2)
        dropout = 0.0
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, fan_in_fan_out=targets.conv1d, bias="none",
                          task_type="CAUSAL_LM", **targets.peft_kwargs())
    with _peft_reads_deprecated_property():
        wrapped = peft.get_peft_model(model, cfg)
    _check_adapted(wrapped, targets)
    wrapped.mens_targets = targets
    return wrapped


def keep_inputs_in_autocast_dtype(model) -> int:
    """For training under autocast: stop peft casting each adapted projection's input to the f32 adapter dtype.

    Autocast runs the adapter's matmuls in bf16 anyway (the cast round-trips bf16 -> f32 -> bf16 exactly), so the
    cast only added an f32 copy of the activations and an f32 dropout per projection and pass: kernel launches
    and memory traffic on a GPU that is waiting on them. peft's 4-bit layers already skip it under autocast; this
    does the same for the others. Only with autocast on: without it a bf16 input would meet f32 adapter weights.
    Returns the number of layers changed."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    n = 0
    for module in model.modules():
        if isinstance(module, BaseTunerLayer) and hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False
            n += 1
    return n


def _check_adapted(wrapped, targets: Targets) -> None:
    """peft adapted exactly the discovered modules and parameters (the regex caught nothing else)."""
    got = set(wrapped.base_model.targeted_module_names)
    got_params = set(getattr(wrapped.base_model, "targeted_parameter_names", []) or [])
    if got != set(targets.modules) or got_params != set(targets.parameters):
        extra = sorted((got - set(targets.modules)) | (got_params - set(targets.parameters)))
        missing = sorted((set(targets.modules) - got) | (set(targets.parameters) - got_params))
        raise ModelError(f"peft adapted other modules than the {len(targets.modules) + len(targets.parameters)} "
                         f"discovered under {targets.layers_path!r} (extra: {extra[:4]}, missing: {missing[:4]}); "
                         "this is a bug in mens.model.targets: please report it with the model's config.json")


def adapter_state(model, state_dict: dict | None = None) -> dict:
    """The trainable adapter tensors under PEFT's saved key names (on CPU, contiguous).

    `state_dict`: take the tensors from it instead of the model (full tensors gathered from an FSDP-sharded model).
    """
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous()
            for k, v in get_peft_model_state_dict(model, state_dict=state_dict).items()}


def save_adapter(model, out_dir: str | Path, state_dict: dict | None = None) -> None:
    """Write adapter_config.json + adapter_model.safetensors (exactly those two files, no README).

    The safetensors header also records a sha256 of the tensors (`mens.tensors_sha256`, ignored by peft), so
    `load_adapter_weights` notices damaged bytes. The caller makes the write durable (temp dir, fsync, rename).
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = adapter_state(model, state_dict)
    save_file(tensors, str(out / "adapter_model.safetensors"),
              metadata={"format": "pt", DIGEST_KEY: _tensors_sha256(tensors)})
    model.peft_config["default"].save_pretrained(str(out))  # writes adapter_config.json only


def load_adapter_weights(model, adapter_dir: str | Path) -> None:
    """Load adapter tensors saved by `save_adapter` (or plain peft) into an already-wrapped `PeftModel`.

    Refused with a ModelError, before anything is loaded: an unreadable file, tensors that differ from the digest
    `save_adapter` recorded, names or shapes this adapter does not have, NaN or inf.
    """
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors import safe_open

    path = Path(adapter_dir) / "adapter_model.safetensors"
    try:
        with safe_open(str(path), "pt") as f:
            recorded = (f.metadata() or {}).get(DIGEST_KEY)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # damaged bytes: safetensors raises several types, all meaning "unreadable"
        raise ModelError(f"{path}: not a readable safetensors file ({type(e).__name__}); re-create the adapter "
                         "(train again, or restore it from a checkpoint)") from None
    if recorded is not None and recorded != _tensors_sha256(tensors):
        raise ModelError(f"{path}: the tensors do not match the sha256 recorded when it was written (the file is "
                         "damaged); restore it from a checkpoint or train again")
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    shapes = {k: tuple(t.shape) for k, t in tensors.items()}
    wrong = sorted(k for k in set(expected) | set(shapes) if expected.get(k) != shapes.get(k))
    if wrong:
        raise ModelError(f"{path}: {len(wrong)} tensors are missing, extra or reshaped for this adapter (e.g. "
                         f"{wrong[0]}); use the same base model, rank and target modules")
    if bad := [k for k, t in tensors.items() if t.is_floating_point() and not bool(t.isfinite().all())]:
        raise ModelError(f"{path}: {len(bad)} tensors hold NaN or inf (e.g. {bad[0]}); use an earlier checkpoint")
    set_peft_model_state_dict(model, tensors)


DIGEST_KEY = "mens.tensors_sha256"


def _tensors_sha256(tensors: dict) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order (independent of the file layout)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
