"""The training config: one nested, typed object, one docstring per field. Imports no torch.

Sections: model, adapter, data, optimizer, schedule, checkpoint, eval, plus the run-level fields (output_dir,
preset, device, seed, ...). `mens train` options (help = the field's docstring), shipped presets, config files and
dogfood's `train:` block are all views of it; `mens.train.resolve` layers them (defaults < preset < file <
key=value overrides < flags) and every run saves the result as RUN/config.yaml.
"""

from __future__ import annotations

import difflib
import re
import textwrap
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from mens.errors import ConfigError
from mens.train.fsdp import quantized_sharding_problem

DEVICE_ALIASES = {"best": "auto", "default": "auto", "vulkan": "auto", "dx12": "auto", "d3d12": "auto",
                  "gpu": "cuda", "nvidia": "cuda", "metal": "mps"}
"""The original's `--device` spellings (reference §1.2): its Best is mens' auto (CUDA, then MPS, then CPU)."""
RESUMABLE = ("output_dir", "data", "resume", "preset", "max_steps", "epochs", "max_time_s", "fit_to_time",
             "fit_max_steps", "save_every", "keep_checkpoints", "eval_every", "log_every_s", "num_threads", "fsdp",
             "host_memory", "micro_batch")
"""Flat keys that may differ when a run is resumed: where it and its data live (the data is compared by content),
which preset's name it carries (its values are compared key by key), how long it runs, how often it saves and
evaluates, how the work is split. Every other key must match the run's saved config.yaml."""


def setting(default: Any = None, *flags: str, flat: str | None = None, factory=None, **constraints) -> Any:
    """A config field: its default, its command-line names (default `--<name>`) and, where the flat name (the
    manifest key and the option's Python name) is not the field's own, that name."""
    extra = {k: v for k, v in (("flags", list(flags)), ("flat", flat)) if v}
    if factory is not None:
        return Field(default_factory=factory, json_schema_extra=extra or None, **constraints)
    return Field(default, json_schema_extra=extra or None, **constraints)


class Section(BaseModel):
    """A group of settings. Unknown keys are errors; numbers given for text (a preset named 4080) become text."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, coerce_numbers_to_str=True)


class ModelConfig(Section):
    """The base model and how its weights are held."""

    name: str = setting("smollm2-135m", "--model", flat="model")
    """Base model: a local HF directory, a hub id, or the embedded `smollm2-135m`."""
    backend: Literal["qlora", "lora", "full"] = "qlora"
    """qlora (NF4 base + LoRA), lora (full-precision base + LoRA) or full (all weights train)."""
    autocast: Literal["auto", "bf16", "off"] = "auto"
    """Matmul precision (weights and optimizer stay f32): "auto" = bf16 on a CUDA GPU with bf16 (every backend:
    the LoRA path and its saved activations too), f32 elsewhere; "bf16" = bf16 autocast wherever the device
    does bf16 natively (CUDA; CPUs with AVX512-BF16 or AMX), f32 where it would be emulated; "off" = f32."""
    int8_base: Literal["auto", "off"] = "off"
    """Frozen base projections in int8 where LoRA trains in f32 on an x86 CPU (no native bf16): "auto" = the
    projections that read the hidden width (attention and the MLP's gate and up) run their forward and input
    gradient as int8 matmuls, about 1.2x faster a step, the loss moved about 1-2%; adapters, optimizer and
    everything after training stay f32; "off" = f32 throughout (every preset: in paired dogfood runs the extra
    steps gave no better model, docs/benchmarks.md)."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in backward (less memory, ~30% slower). Unset = chosen from the memory estimate (as
    `mens probe`): on when the run without it is estimated above 90% of one process's memory, off otherwise."""


class AdapterConfig(Section):
    """The LoRA adapter (ignored by --backend full)."""

    r: int = setting(16, "--rank", gt=0)
    """LoRA rank."""
    lora_alpha: float = setting(32.0, "--alpha", "--lora-alpha")
    """LoRA alpha (scale = alpha / r)."""
    lora_dropout: float = setting(0.05, ge=0.0, lt=1.0)
    """Dropout on the LoRA input."""
    lora_layers: int = setting(0, ge=0)
    """Adapt only the top N decoder layers (0 = all). Gradients then stop at the lowest adapted layer: faster, but
    on dogfood's data it generalized worse than adapting every layer (docs/benchmarks.md), so no preset uses it."""
    strict_targets: bool = False
    """Fail (ModelError) when a projection in a decoder layer would stay unadapted, MoE routers aside; off: a
    warning names what was left out and the rest trains. Targets are found on the model (mens.model.targets)."""
    init_adapter: str | None = None
    """Start LoRA from this run's adapter (a directory with adapter_model.safetensors) instead of a fresh
    init: a second round of training on new data continues what the first learned. Same rank and targets."""


class DataConfig(Section):
    """The training rows and how they become token rows."""

    path: str = setting("", "--data-dir", "--data", flat="data")
    """Directory holding train.jsonl, or a .jsonl file."""
    seq_len: int = setting(512, gt=0)
    """Maximum tokens per row; longer examples are left-truncated (the answer's end is kept)."""
    pack: bool = True
    """Pack several examples per row (no attention or positions leak across examples)."""
    pack_shuffle: bool = False
    """Pack the examples in a seeded random order instead of file order. In file order neighbours share a row,
    and dogfood's data keeps a request's phrasings next to each other, so one program fills a row and a step."""
    second_pass: Literal["shuffle", "hardest"] = "shuffle"
    """The second pass's row order. "shuffle": a seeded random order, like every pass. "hardest": where the run
    ends inside its second pass (a time budget cut it), the rows whose first-pass loss was highest for their point
    in the run come first (mens.train.data.hardest_first), so the rows it drops are those the model found easiest."""
    ce_last_k: int = setting(0, "--ce-last-k", "--qlora-ce-last-k", ge=0)
    """Supervise only the last K tokens of each example (0 = every assistant token). The original defaults to 64
    and caps K at 64, which drops the start of every longer answer; mens learns whole answers by default."""
    system_prompt: str | None = None
    """System prompt for prompt/response rows; unset = the packaged Vox prompt, "" = none."""
    min_rating: int = 3
    """Rows rated below this are dropped (rows without a rating are kept)."""
    max_per_answer: int = setting(0, ge=0)
    """Keep at most this many rows with the same answer (0 = all). Template-built data pairs one program with
    several phrasings of its request; a run too short to see each row once learns from more distinct programs
    with fewer phrasings each. Which rows stay depends only on the answer text, so every seed, and a resumed run,
    trains on the same rows."""
    min_examples: int = setting(20, ge=0)
    """Preflight fails with fewer usable training examples than this."""


class OptimizerConfig(Section):
    """The update: AdamW, gradient clipping and training-time noise."""

    learning_rate: float = setting(2e-4, "--lr", "--learning-rate", gt=0.0)
    """Peak learning rate (AdamW), reached after warmup, then cosine decay to 0."""
    weight_decay: float = setting(0.01, ge=0.0)
    """AdamW weight decay."""
    max_grad_norm: float = setting(1.0, ge=0.0)
    """Gradient clipping threshold (global L2 norm); 0 disables."""
    lora_plus_ratio: float = setting(1.0, "--lora-plus-ratio", "--loraplus-lr-ratio", ge=1.0)
    """LoRA+ (Hayou et al. 2024): the adapters' B matrices learn at this many times `learning_rate`, their A
    matrices at `learning_rate`. 1 = plain LoRA; the paper used 16 (Axolotl and LLaMA-Factory: loraplus_lr_ratio).
    Ignored by --backend full."""
    neftune_alpha: float = setting(0.0, ge=0.0)
    """NEFTune (Jain et al. 2023; TRL's `neftune_noise_alpha`): uniform noise of magnitude alpha / sqrt(L * d) on the
    input embeddings during training steps only (L = row length, packed rows included; d = hidden size). 0 = off;
    the paper used 5-15."""


class ScheduleConfig(Section):
    """How long the run is and how rows group into steps."""

    epochs: float = setting(3.0, gt=0.0)
    """Passes over the training rows (fractions allowed); ignored when max_steps > 0."""
    max_steps: int = setting(0, ge=0)
    """Optimizer steps to run; 0 derives them from epochs."""
    max_time_s: float = setting(0.0, ge=0.0)
    """Stop once the training loop has run this many seconds (0 = no limit): the last step's adapter is saved and
    validated as at the planned end, and the run summary says it stopped early. The learning-rate schedule stays
    planned for the full step count, so a cut run is not the run it would have been, nor bit-reproducible."""
    fit_to_time: bool = False
    """With max_time_s: re-measure the step time at 20, 40, 60, 80 and 90% of the planned steps (over the steps
    since the previous re-fit) and re-fit the step count to end at 97% of max_time_s (never more steps than
    `epochs` give, or than max_steps when that is longer). The learning-rate cosine keeps the progress it
    reached and spreads the rest over the new count, so it ends at 0 when the time is up instead of being cut
    or ending early. The step count then depends on the machine's speed; telemetry (`refit` events) and
    checkpoints record each re-fit, and a resumed run continues the same curve. `mens dogfood --budget` turns
    it on."""
    fit_max_steps: int = setting(0, ge=0)
    """With fit_to_time: the most steps a re-fit may reach (0: the epochs' steps, or max_steps when that is
    longer). `mens dogfood --budget` sets it to the recipe's length, which is max_steps where the user gave it."""
    batch_size: int = setting(4, gt=0)
    """Rows per micro-batch (per process)."""
    grad_accum: int = setting(4, gt=0)
    """Micro-batches per optimizer step. Global batch = batch_size x grad_accum x processes."""
    micro_batch: Literal["auto", "fixed"] = "auto"
    """How a step's rows are split into forward/backward passes: "auto" = on one CUDA process, as few passes as
    a measured row's memory allows (the same rows, loss and update per step; see mens.train.micro_batch);
    "fixed" = batch_size rows per pass everywhere. CPU runs and runs of several processes use batch_size."""
    warmup_steps: int = setting(100, "--warmup-steps", "--warmup", ge=0)
    """Linear warmup steps; capped at a tenth of the run (at least 1)."""


class CheckpointConfig(Section):
    """Checkpoints written during the run, and resuming from them."""

    save_every: int = setting(200, ge=0)
    """Checkpoint every N optimizer steps (0 = none)."""
    keep_checkpoints: int = setting(3, ge=0)
    """How many of the newest checkpoints to keep (0 = all)."""
    resume: bool = False
    """Continue from the newest checkpoint in output_dir/checkpoints; the settings must match the run's
    config.yaml except where it lives, its length and how often it saves, evaluates and logs."""


class EvalConfig(Section):
    """Validation loss during the run."""

    val_fraction: float = setting(0.05, "--val-fraction", "--validation-split-ratio", ge=0.0, lt=0.5)
    """Share of examples held out for validation loss (0 = none)."""
    eval_every: Annotated[int, Field(ge=0)] | Literal["epoch"] = setting("epoch")
    """Validation loss every N optimizer steps, or "epoch" = at the end of each pass over the data (the
    original's rule); at the run's end either way (0 = only there)."""


SECTIONS: dict[str, type[Section]] = {"model": ModelConfig, "adapter": AdapterConfig, "data": DataConfig,
                                      "optimizer": OptimizerConfig, "schedule": ScheduleConfig,
                                      "checkpoint": CheckpointConfig, "eval": EvalConfig}


class TrainConfig(Section):
    """Every training setting. Build it from nested sections or flat keys (`TrainConfig(seq_len=96)` is
    `TrainConfig(data={"seq_len": 96})`); leaf settings also read and write flat (`cfg.seq_len`), except `model`
    and `data`, which name their sections (`cfg.model.name`, `cfg.data.path`). Assignment is not validated."""

    output_dir: str = ""
    """Run directory to write (adapter, manifest, config.yaml, telemetry, checkpoints)."""
    preset: str | None = None
    """Preset: a shipped name (`mens probe` lists them) or a YAML file of the config's shape. Unset: the
    VOX_TRAIN_PROFILE variable, else the device's recommendation. `mens.train.resolve.resolve_config` applies it
    (as the CLI, dogfood and saved runs do); a TrainConfig built directly only records the name."""
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    """auto, cpu, cuda or mps (the original's best, gpu, nvidia, metal... are accepted)."""
    seed: int = 42
    """Seed for adapter init, data order, validation split and dropout."""
    fsdp: Literal["auto", "on", "off"] = "auto"
    """Under torchrun, shard weights, gradients and optimizer state across the processes (PyTorch FSDP2) instead
    of a full replica in each: "auto" = only when the replicated run's memory estimate (as `mens probe`) exceeds
    90% of one process's memory (its GPU; on CPU, RAM / processes on the node); "on" = whenever there are 2+
    processes; "off" = never (full replicas, gradients summed). One process never shards. The update is the same."""
    num_threads: int = setting(0, "--threads", "--num-threads", ge=0)
    """torch CPU threads (0 = torch's default)."""
    host_memory: Literal["fast", "lean"] = "fast"
    """Host (CPU) memory with glibc's malloc: "lean" fixes its mmap threshold at 1 MiB so freed activation buffers
    go back to the OS (CPU training: about 0.55x the peak RSS, about 25% slower); "fast" keeps glibc's default.
    Training commands run on mimalloc where it is installed and no NVIDIA driver is loaded (MENS_ALLOCATOR=system
    for glibc's), which peaks about as low as "lean" without its cost; there this setting changes nothing. The
    results are the same either way."""
    log_every_s: float = setting(5.0, ge=0.0)
    """Seconds between plain-text progress lines when stderr is not a terminal."""
    extra: dict = setting(None, "--extra", factory=dict)
    """Free-form notes stored in the manifest (on the command line: --extra KEY=VALUE, repeatable)."""

    # the sections (each class's docstring says what it holds)
    model: ModelConfig = Field(default_factory=ModelConfig)
    adapter: AdapterConfig = Field(default_factory=AdapterConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    def __init__(self, **values: Any) -> None:
        values = nest(values)
        for path in SPECS:
            holder, _, leaf = path.rpartition(".")
            tree = values.get(holder) if holder else values
            if isinstance(tree, dict) and leaf in tree:
                tree[leaf] = normalize(path, tree[leaf])
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise ConfigError("invalid training settings: " + describe(e)) from None

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        problems = []
        if problem := quantized_sharding_problem(self.model.backend, self.fsdp, self.device):
            problems.append(problem)
        if self.data.ce_last_k > self.data.seq_len:
            problems.append(f"data.ce_last_k = {self.data.ce_last_k} > data.seq_len = {self.data.seq_len} "
                            "(expected <= seq_len)")
        if self.schedule.fit_to_time and not self.schedule.max_time_s:
            problems.append("schedule.fit_to_time is on but schedule.max_time_s is 0 (expected the time limit, in "
                            "seconds, to fit the steps to)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def __getattr__(self, name: str) -> Any:
        # Flat reads for the training code (`cfg.seq_len`); only called when normal lookup fails.
        path = FLAT.get(name)
        if path is None or "." not in path:
            return super().__getattr__(name)
        section, leaf = path.split(".")
        return getattr(getattr(self, section), leaf)

    def __setattr__(self, name: str, value: Any) -> None:
        # Flat writes (`cfg.max_steps = 3`) go to the section; `model` and `data` name the sections themselves.
        path = FLAT.get(name)
        if path is not None and "." in path and name not in SECTIONS:
            section, leaf = path.split(".")
            setattr(getattr(self, section), leaf, value)
        else:
            super().__setattr__(name, value)

    def to_dict(self) -> dict:
        """Flat {key: value} (the manifest's `config`): section fields under their flat names."""
        nested = self.model_dump()
        return {spec.flat: get_path(nested, spec.path) for spec in SPECS.values()}

    def contract_values(self) -> dict:
        """The flat settings a resumed run must keep (RESUMABLE left out): what a checkpoint's resume digest covers."""
        return {k: v for k, v in self.to_dict().items() if k not in RESUMABLE}

    def to_yaml(self) -> str:
        """The config as YAML, each key under a comment: its docstring's first sentence."""
        return to_yaml(self.model_dump())


@dataclass(frozen=True)
class Spec:
    """One leaf setting: its dotted path, flat name, command-line names, docstring and pydantic field."""

    path: str
    flat: str
    flags: tuple[str, ...]
    doc: str
    field: FieldInfo

    @property
    def section(self) -> str | None:
        return self.path.split(".")[0] if "." in self.path else None


def _specs() -> dict[str, Spec]:
    out: dict[str, Spec] = {}
    owners = [("", TrainConfig)] + [(f"{name}.", cls) for name, cls in SECTIONS.items()]
    for prefix, cls in owners:
        for name, f in cls.model_fields.items():
            if not prefix and name in SECTIONS:
                continue
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            flat = extra.get("flat") or name
            flags = tuple(extra.get("flags") or [f"--{flat.replace('_', '-')}"])
            out[prefix + name] = Spec(prefix + name, flat, flags, " ".join((f.description or "").split()), f)
    return out


SPECS: dict[str, Spec] = _specs()
"""Every leaf setting by dotted path (`schedule.max_steps`; run-level keys have no dot)."""
FLAT: dict[str, str] = {s.flat: s.path for s in SPECS.values()}
"""Flat name (manifest key, `TrainConfig(**flat)` keyword) -> dotted path."""


def field_names() -> list[str]:
    """Every flat setting name."""
    return list(FLAT)


def normalize(path: str, value: Any) -> Any:
    """Other spellings of a value: the original's device names, and on/off (YAML 1.1 reads them as booleans) for
    choice settings that have them (`fsdp: on`, `autocast: off`)."""
    if path == "device" and isinstance(value, str):
        return DEVICE_ALIASES.get(value, value)
    kind = SPECS[path].field.annotation
    if isinstance(value, bool) and get_origin(kind) is Literal and ("on" if value else "off") in get_args(kind):
        return "on" if value else "off"
    return value


def get_path(tree: dict, path: str) -> Any:
    for part in path.split("."):
        tree = tree[part]
    return tree


def set_path(tree: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def nest(values: dict) -> dict:
    """Flat keys (`seq_len`, `model` as a name) and dotted paths into the nested shape; sections pass through."""
    out: dict = {}
    for key, value in values.items():
        if key in SECTIONS and isinstance(value, dict | BaseModel):
            section = value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value
            for k, v in section.items():
                set_path(out, f"{key}.{k}", v)
        elif key in FLAT:
            set_path(out, FLAT[key], value)
        elif key in SPECS:
            set_path(out, key, value)
        else:
            out[key] = value  # unknown: pydantic reports it
    return out


def unknown_key(key: str) -> str:
    """`unknown key 'x'` with the likely path (a flat name, a leaf, a near miss) or else every valid key."""
    leaf = key.split(".")[-1].replace("-", "_")
    named = {**{f[2:].replace("-", "_"): s.path for s in SPECS.values() for f in s.flags}, **FLAT}  # --rank, r
    close = difflib.get_close_matches(key, list(SPECS), n=1)
    guess = named[leaf] if leaf in named and named[leaf] != key else close[0] if close else None
    if guess:
        return f"unknown key {key!r} (did you mean {guess!r}?)"
    return f"unknown key {key!r}; valid keys: {', '.join(SPECS)}"


def describe(e: ValidationError) -> str:
    """Every problem of a pydantic error, one clause each: `key = value (expected ...; flag --x)`."""
    problems = []
    for err in e.errors():
        path = ".".join(str(p) for p in err["loc"])
        ctx = err.get("ctx") or {}
        if isinstance(ctx.get("error"), ValueError) and not path:  # a cross-field check: its own words
            problems.append(str(ctx["error"]))
            continue
        spec = SPECS.get(path)
        if err["type"] == "extra_forbidden":
            problems.append(unknown_key(path))
            continue
        expected = err["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
        if err["type"] == "literal_error" and spec is not None:
            expected = "one of " + ", ".join(str(a) for a in spec.field.annotation.__args__)
        flag = f"; flag {spec.flags[0]}" if spec else ""
        problems.append(f"{path} = {err['input']!r} (expected {expected}{flag})")
    return "; ".join(problems)


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, allow_unicode=True).strip()
    return text.removesuffix("\n...").strip()


def _comment(doc: str, indent: str) -> str:
    first = re.split(r"\.\s+(?=[A-Z])", doc)[0].rstrip(".")
    return "\n".join(f"{indent}# {line}" for line in textwrap.wrap(first, 110 - len(indent)))


def to_yaml(nested: dict) -> str:
    """Nested config values as YAML with a comment per key (yaml.safe_load reads it back to the same values)."""
    lines = []
    for key, value in nested.items():
        if key in SECTIONS:
            lines += ["", f"{key}:  # {SECTIONS[key].__doc__.rstrip('.')}"]
            for leaf, v in value.items():
                lines += [_comment(SPECS[f"{key}.{leaf}"].doc, "  "), f"  {leaf}: {_scalar(v)}"]
        else:
            lines += [_comment(SPECS[key].doc, ""), f"{key}: {_scalar(value)}"]
    return "\n".join(lines).lstrip("\n") + "\n"
