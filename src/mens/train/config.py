"""`TrainConfig`: every training setting with its default, one docstring per field. Imports no torch.

Precedence: these defaults < the preset's YAML < command-line flags (`resolve_config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mens.errors import ConfigError
from mens.train.fsdp import quantized_sharding_problem

BACKENDS = ("qlora", "lora", "full")
DEVICES = ("auto", "cpu", "cuda", "mps")
AUTOCASTS = ("auto", "bf16", "off")
FSDP_MODES = ("auto", "on", "off")


@dataclass
class TrainConfig:
    data: str = ""
    """Directory holding train.jsonl, or a .jsonl file."""
    output_dir: str = ""
    """Run directory to write (adapter, manifest, telemetry, checkpoints)."""
    model: str = "smollm2-135m"
    """Base model: a local HF directory, a hub id, or the embedded `smollm2-135m`."""
    backend: str = "qlora"
    """qlora (NF4 base + LoRA), lora (full-precision base + LoRA) or full (all weights train)."""
    preset: str | None = None
    """Preset name from mens/configs/train_presets.yaml; None picks the device's recommendation."""
    device: str = "auto"
    """auto, cpu, cuda or mps."""
    epochs: float = 3.0
    """Passes over the training rows (fractions allowed); ignored when max_steps > 0."""
    max_steps: int = 0
    """Optimizer steps to run; 0 derives them from epochs."""
    seq_len: int = 512
    """Maximum tokens per row; longer examples are left-truncated (the answer's end is kept)."""
    batch_size: int = 4
    """Rows per micro-batch (per process)."""
    grad_accum: int = 4
    """Micro-batches per optimizer step. Global batch = batch_size x grad_accum x processes."""
    learning_rate: float = 2e-4
    """Peak learning rate (AdamW), reached after warmup, then cosine decay to 0."""
    warmup_steps: int = 100
    """Linear warmup steps; capped at a tenth of the run (at least 1)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global L2 norm); 0 disables."""
    r: int = 16
    """LoRA rank."""
    lora_alpha: float = 32.0
    """LoRA alpha (scale = alpha / r)."""
    lora_dropout: float = 0.05
    """Dropout on the LoRA input."""
    neftune_alpha: float = 0.0
    """NEFTune (Jain et al. 2023; TRL's `neftune_noise_alpha`): uniform noise of magnitude alpha / sqrt(L * d) on the
    input embeddings during training steps only (L = row length, packed rows included; d = hidden size). 0 = off;
    the paper used 5-15."""
    lora_layers: int = 0
    """Adapt only the top N decoder layers (0 = all). Gradients then stop at the lowest adapted layer: on CPU the
    top half of SmolLM2-135M's layers trains 1.6x faster than all of them, but on dogfood's data it generalized
    worse (held-out task pass@1 0.62 vs 0.78 at the same wall time), so no preset uses it."""
    strict_targets: bool = False
    """Fail (ModelError) when a projection in a decoder layer would stay unadapted, MoE routers aside; off: a
    warning names what was left out and the rest trains. Targets are found on the model (mens.model.targets)."""
    ce_last_k: int = 0
    """Supervise only the last K tokens of each example (0 = every assistant token). The original used 64,
    which drops the start of every answer longer than 64 tokens; we learn whole answers by default."""
    pack: bool = True
    """Pack several examples per row (no attention or positions leak across examples)."""
    val_fraction: float = 0.05
    """Share of examples held out for validation loss (0 = none)."""
    eval_every: int = 50
    """Validation loss every N optimizer steps (0 = only at the end)."""
    save_every: int = 200
    """Checkpoint every N optimizer steps (0 = none)."""
    keep_checkpoints: int = 3
    """How many of the newest checkpoints to keep (0 = all)."""
    resume: bool = False
    """Continue from the newest checkpoint in output_dir/checkpoints."""
    seed: int = 42
    """Seed for adapter init, data order, validation split and dropout."""
    min_rating: int = 3
    """Rows rated below this are dropped (rows without a rating are kept)."""
    min_examples: int = 20
    """Preflight fails with fewer usable training examples than this."""
    init_adapter: str | None = None
    """Start LoRA from this run's adapter (a directory with adapter_model.safetensors) instead of a fresh
    init: a second round of training on new data continues what the first learned. Same rank and targets."""
    system_prompt: str | None = None
    """System prompt for prompt/response rows; None = the packaged Vox prompt, "" = none."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in backward (less memory, ~30% slower). None = chosen from the memory estimate (as
    `mens probe`): on when the run without it is estimated above 90% of one process's memory, off otherwise."""
    autocast: str = "auto"
    """Matmul precision (weights and optimizer stay f32): "auto" = bf16 for full fine-tuning on a CUDA GPU with
    bf16 (LoRA/QLoRA bases are bf16 there already), f32 elsewhere; "bf16" = bf16 autocast wherever the device
    does bf16 natively (CUDA; CPUs with AVX512-BF16 or AMX), f32 where it would be emulated; "off" = f32."""
    fsdp: str = "auto"
    """Under torchrun, shard weights, gradients and optimizer state across the processes (PyTorch FSDP2) instead
    of a full replica in each: "auto" = only when the replicated run's memory estimate (as `mens probe`) exceeds
    90% of one process's memory (its GPU; on CPU, RAM / processes on the node); "on" = whenever there are 2+
    processes; "off" = never (full replicas, gradients summed). One process never shards. The update is the same."""
    num_threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    log_every_s: float = 5.0
    """Seconds between plain-text progress lines when stderr is not a terminal."""
    extra: dict = field(default_factory=dict)
    """Free-form notes stored in the manifest."""

    def __post_init__(self) -> None:
        problems = []
        if self.backend not in BACKENDS:
            problems.append(f"--backend {self.backend!r} (expected one of {', '.join(BACKENDS)})")
        if self.autocast not in AUTOCASTS:
            problems.append(f"autocast = {self.autocast!r} (expected one of {', '.join(AUTOCASTS)})")
        if self.fsdp not in FSDP_MODES:
            problems.append(f"--fsdp {self.fsdp!r} (expected one of {', '.join(FSDP_MODES)})")
        if self.device not in DEVICES:
            problems.append(f"--device {self.device!r} (expected one of {', '.join(DEVICES)})")
        if problem := quantized_sharding_problem(self.backend, self.fsdp, self.device):
            problems.append(problem)
        for name in ("seq_len", "batch_size", "grad_accum", "r"):
            if int(getattr(self, name)) <= 0:
                problems.append(f"{name} = {getattr(self, name)!r} (expected a positive integer)")
        for name in ("max_steps", "ce_last_k", "eval_every", "save_every", "keep_checkpoints", "warmup_steps",
                     "lora_layers"):
            if int(getattr(self, name)) < 0:
                problems.append(f"{name} = {getattr(self, name)!r} (expected >= 0)")
        if not (self.neftune_alpha >= 0):
            problems.append(f"--neftune-alpha {self.neftune_alpha!r} (expected >= 0; 0 = off)")
        if self.ce_last_k > self.seq_len:
            problems.append(f"ce_last_k = {self.ce_last_k} > seq_len = {self.seq_len} (expected <= seq_len)")
        if not 0.0 <= self.val_fraction < 0.5:
            problems.append(f"val_fraction = {self.val_fraction} (expected 0 <= f < 0.5)")
        if self.learning_rate <= 0 or self.epochs <= 0:
            problems.append(f"learning_rate = {self.learning_rate}, epochs = {self.epochs} (expected > 0)")
        if problems:
            raise ConfigError("invalid training settings: " + "; ".join(problems))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def coerce(key: str, value, where: str):
    """Convert a preset/flag value to the field's type; ConfigError names the key and the expected type."""
    types = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    if key not in types:
        raise ConfigError(f"{where}: unknown setting {key!r}; valid keys: {', '.join(field_names())}")
    kind = str(types[key])
    try:
        if value is None or kind in ("str | None", "dict"):
            return value
        if kind in ("bool", "bool | None"):
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind == "int":
            if isinstance(value, bool) or int(value) != float(value):
                raise TypeError
            return int(value)
        if kind == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key} = {value!r} is not a valid {kind}") from None


def resolve_config(flags: dict, preset_values: dict | None = None, preset_name: str | None = None) -> TrainConfig:
    """defaults < preset < flags (flags whose value is None are unset)."""
    values: dict = {}
    for k, v in (preset_values or {}).items():
        values[k] = coerce(k, v, f"preset {preset_name!r}")
    for k, v in flags.items():
        if v is not None:
            values[k] = coerce(k, v, f"--{k.replace('_', '-')}")
    return TrainConfig(**values)
