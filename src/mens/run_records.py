"""Every file mens writes into a run, merged or dogfood directory, by name, and the typed records inside them.

One module names the files and types the records, so a writer and its readers cannot drift apart: a key
renamed here is renamed for both, and a reader gets a typed object instead of string-keyed dicts.

- Record files are JSON, written atomically and durably (temp file beside the target, fsync, rename, fsync of the
  directory): a reader sees the old file or the new one, never half of one. No file is rewritten in place.
- Each record names its schema in `schema`. mens's own ids are spelled `vox_mens_<name>_v<N>`, as the original
  spells its own (`vox_mens_gate_receipt_v1`, `vox_mens_run_summary_v1`). Files whose format the original fixes
  keep its ids: `training-preflight.json` (`schema_version: vox.mens.preflight.v0`, its JSON schema),
  `external_serving_handoff_v1.json` (`vox_external_serving_handoff_v1`), training rows (`vox_dogfood_v1`).
- Readers validate: a file that is not what mens writes is a one-line DataError naming the file and the field.
  Keys a record does not declare are kept (a newer mens may add some), so read-then-write loses nothing.
- Files written by an older mens (the ids `mens.training_manifest.v1`, `mens_benchmark_results_v1`... under
  `schema` or `schema_version`) read as the current record.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mens.errors import DataError

# --- A training run directory (`mens train --output-dir RUN`) -------------------------------------------------------
CONFIG = "config.yaml"
"""The resolved training config, written before preflight; `mens train RUN/config.yaml` replays the run."""
MANIFEST = "training_manifest.json"
"""What ran, on what: written when training starts and again when it ends (TrainingManifest)."""
PREFLIGHT = "training-preflight.json"
"""The original's preflight contract (vox.mens.preflight.v0) plus mens's check results."""
SUMMARY = "run_summary.json"
"""How the run went (RunSummary)."""
TELEMETRY = "telemetry.jsonl"
"""One JSON event per line: train_start, step, eval, checkpoint, train_complete / train_failed."""
CHECKPOINTS = "checkpoints"
"""checkpoints/step-N/: weights, optimizer, scheduler, RNG and data cursor (safetensors + JSON)."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
FULL_WEIGHTS = "model.safetensors"
SYSTEM_PROMPT = "system_prompt.txt"
"""The trained system prompt, beside full or merged weights (a LoRA run keeps it in its manifest)."""

# --- Written into a run after training ------------------------------------------------------------------------------
BENCHMARK = "benchmark_results.json"
"""`mens eval-local`'s report (BenchmarkResults)."""
GATE_RECEIPT = "gate_receipt.json"
"""`mens gate`'s verdict, pass or fail (GateReceipt)."""
MERGE_PARITY = "merge_parity.json"
"""The merged and served models' answers against the adapter's (MergeParity)."""
MODEL_CARD = "README.md"
REPORT = "report.html"
PLOTS = "plots"

# --- A merged model directory (`mens merge`) ------------------------------------------------------------------------
HANDOFF = "external_serving_handoff_v1.json"
"""The original's external-serving hand-off (its JSON schema, contracts/external-serving-handoff.schema.json)."""
SERVING = "serving.json"
"""Ready commands for vLLM, Ollama and llama.cpp, and the stop strings."""
MODELFILE = "Modelfile"
TRAINING_CONFIG = "training_config.json"
"""In a published folder: the run's settings without local paths (TrainingConfigRecord)."""

# --- A dogfood directory (`mens dogfood -o DIR`) --------------------------------------------------------------------
DOGFOOD_STATE = "dogfood_state.json"
"""Which stages finished, with their notes and seconds (`--resume` reads it)."""
DOGFOOD_SUMMARY = "dogfood_summary.json"
"""Every stage's result in one record (DogfoodSummary)."""
HELDOUT_SPLIT = "heldout_split.json"
"""Under data/: the held-out tasks and the training rows dropped as overlapping them."""
BUDGET = "budget.json"
"""Under data/: a `--budget` run's plan and the measurements behind it."""

# --- Schema ids --------------------------------------------------------------------------------------------------
CHECKPOINT_FORMAT = "vox_mens_checkpoint_v2"
OPTIMIZER_FORMAT = "vox_mens_optimizer_v1"
SCHEDULER_FORMAT = "vox_mens_scheduler_v1"
RNG_FORMAT = "vox_mens_rng_v1"
LEGACY_FORMATS = {"mens.checkpoint.v2": CHECKPOINT_FORMAT, "mens.optimizer.v1": OPTIMIZER_FORMAT,
                  "mens.scheduler.v1": SCHEDULER_FORMAT, "mens.rng.v1": RNG_FORMAT}
"""Checkpoint-part ids an older mens wrote, and the id each now reads as."""


def current_format(found: object) -> object:
    """A checkpoint part's `format` value with an older spelling mapped to the current id."""
    return LEGACY_FORMATS.get(found, found) if isinstance(found, str) else found


R = TypeVar("R", bound="Record")


class Record(BaseModel):
    """A JSON record mens writes; subclasses declare their schema id and fields."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    SCHEMA: ClassVar[str]
    LEGACY: ClassVar[tuple[str, ...]] = ()
    """Ids an older mens wrote for this record (read as SCHEMA)."""

    schema_id: str = Field("", alias="schema")

    @model_validator(mode="before")
    @classmethod
    def _schema(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        found = data.pop("schema", None) or data.pop("schema_version", None) or cls.SCHEMA
        if found != cls.SCHEMA and found not in cls.LEGACY:
            raise ValueError(f"schema is {found!r}, expected {cls.SCHEMA!r}")
        data["schema"] = cls.SCHEMA
        return data

    def to_json(self) -> dict:
        """The record as written: `schema` first, then the fields that were given (a field left at its default is
        left out, as readers of the files mens wrote before these records expect: no `base` key without a base)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def write(self, path: str | Path) -> Path:
        """Write atomically and durably; returns the path."""
        return write_json(path, self.to_json())

    @classmethod
    def parse(cls: type[R], data: object, where: str | Path) -> R:
        """Validate `data` (what was read from `where`) as this record; DataError naming the field otherwise."""
        if not isinstance(data, dict):
            raise DataError(f"{where}: expected a JSON object ({cls.SCHEMA}), found {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            what = f"field {loc}: {first['msg']}" if loc else first["msg"].removeprefix("Value error, ")
            raise DataError(f"{where}: not a {cls.SCHEMA} record: {what}; it was not written by mens, or was "
                            "edited by hand") from None

    @classmethod
    def read(cls: type[R], path: str | Path) -> R:
        """Read and validate; a missing, unreadable or malformed file is a DataError naming it."""
        return cls.parse(read_json(path), path)

    @classmethod
    def read_optional(cls: type[R], path: str | Path) -> R | None:
        """As `read`, but None when the file does not exist."""
        return cls.read(path) if Path(path).is_file() else None


def read_json(path: str | Path) -> object:
    """A JSON file's value; DataError (file, line, what to do) when it is missing, unreadable or malformed."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{p} not found") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 (byte {e.start})") from None
    except OSError as e:
        raise DataError(f"{p}: cannot read it ({e.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{p}:{e.lineno}: malformed JSON ({e.msg})") from None


def write_json(path: str | Path, data: object) -> Path:
    """Write `data` as indented JSON via a temp file in the same directory: fsync, rename, fsync the directory."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dfd = os.open(p.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return p
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
    return p


# --- The records --------------------------------------------------------------------------------------------------


class TrainingManifest(Record):
    """`training_manifest.json`: what a run trained, on what data and base, with which settings and software."""

    SCHEMA: ClassVar[str] = "vox_mens_training_manifest_v1"
    LEGACY: ClassVar[tuple[str, ...]] = ("mens.training_manifest.v1",)

    run_id: str = ""
    backend: str | None = None
    """lora, qlora or full."""
    base_model: str | None = None
    base_model_id: str | None = None
    """The base as the user named it (a Hub id or a path)."""
    base_model_path: str | None = None
    """The local directory the base was loaded from."""
    base_weights_sha256: str | None = None
    model_type: str | None = None
    vocab_size: int | None = None
    data: str | None = None
    data_files: list[str] = Field(default_factory=list)
    data_sha256: str | None = None
    system_prompt: str | None = None
    chat_template: str | list | None = None
    config: dict = Field(default_factory=dict)
    """The resolved training settings, flat (`TrainConfig.to_dict`)."""
    contract_digest: str | None = None
    execution_kernel: str | None = None
    versions: dict = Field(default_factory=dict)
    device: str | None = None
    world_size: int = 1
    matmul_dtype: str | None = None
    seeds: dict = Field(default_factory=dict)
    examples: dict = Field(default_factory=dict)
    steps: dict = Field(default_factory=dict)
    """planned, steps_per_epoch, global_batch, warmup, completed, resumed_from."""
    target_modules: list | dict | None = None
    adapter: dict | None = None
    parallelism: str | None = None
    gradient_checkpointing: dict | None = None
    packing: dict | None = None
    started_at: str | None = None
    finished_at: str | None = None


class RunSummary(Record):
    """`run_summary.json`: how a run went. Carries the original's keys (global_step, optimizer_step_count,
    avg_train_loss, avg_val_loss_last_epoch, total_tokens, artifacts) beside mens's own."""

    SCHEMA: ClassVar[str] = "vox_mens_run_summary_v1"
    LEGACY: ClassVar[tuple[str, ...]] = ("mens.run_summary.v1",)

    run_id: str = ""
    base_model: str | None = None
    backend: str | None = None
    steps: int = 0
    """Optimizer steps completed (the run's global step)."""
    steps_this_session: int | None = None
    stopped_early: bool = False
    """The time limit (schedule.max_time_s) ended the run before its planned last step."""
    global_step: int | None = None
    optimizer_step_count: int | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    avg_train_loss: float | None = None
    """Mean training loss over the steps of this session."""
    avg_train_loss_last10: float | None = None
    val_loss: float | None = None
    avg_val_loss_last_epoch: float | None = None
    """The last validation loss (the original's name)."""
    total_tokens: int | None = None
    supervised_tokens: int | None = None
    wall_time_s: float | None = None
    train_time_s: float | None = None
    tokens_per_s: float | None = None
    """Input tokens over the training loop's time, validation passes included."""
    peak_memory: dict = Field(default_factory=dict)
    world_size: int = 1
    artifacts: dict = Field(default_factory=dict)


class GateEntry(BaseModel):
    """One gate of a receipt: the original's fields (name, passed, block, message) and mens's."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _name(cls, data: Any) -> Any:
        """Receipts an older mens wrote name the gate in `gate` only."""
        if isinstance(data, dict) and "name" not in data and "gate" in data:
            return {**data, "name": data["gate"]}
        return data

    name: str
    passed: bool
    block: bool = True
    message: str = ""
    gate: str | None = None
    threshold: float | None = None
    value: float | None = None
    source: str | None = None


class GateReceipt(Record):
    """`gate_receipt.json`: the gates checked on a run's benchmark results, written pass or fail."""

    SCHEMA: ClassVar[str] = "vox_mens_gate_receipt_v1"

    timestamp_unix: int = 0
    run_dir: str = ""
    policy: str = ""
    """The gate file, or "environment" (thresholds from MENS_EVAL_* / VOX_* variables), or "none"."""
    overall_passed: bool = True
    enforced: bool = True
    """False when the gates only warn (MENS_EVAL_STRICT / VOX_EVAL_STRICT = 0)."""
    gates: list[GateEntry] = Field(default_factory=list)
    report: str | None = None
    """After `mens train --gate` (or VOX_BENCHMARK=1): the benchmark report the gates read."""
    reason: str | None = None
    """After `mens train --gate`: why the verdict is what it is, in one line (None when every gate passed)."""


class BenchmarkResults(Record):
    """`benchmark_results.json`: a model's answers to a bench, checked, per decoding mode (`mens eval-local`)."""

    SCHEMA: ClassVar[str] = "vox_mens_benchmark_results_v1"
    LEGACY: ClassVar[tuple[str, ...]] = ("mens_benchmark_results_v1",)

    k: int = 1
    max_new_tokens: int | None = None
    main_mode: str = "greedy"
    metrics: dict = Field(default_factory=dict)
    """The main mode's metrics: nonempty_parse_rate, pass_at_1, tasks, failures_by_category..."""
    modes: dict[str, dict] = Field(default_factory=dict)
    failures: list = Field(default_factory=list)
    results: list[dict] = Field(default_factory=list)
    results_by_mode: dict[str, list] = Field(default_factory=dict)
    base: dict | None = None
    model: str | None = None
    bench: str | None = None
    split: str | None = None
    language: str | None = None


class MergeParity(Record):
    """`merge_parity.json`: the merged model's (and the served model's) answers against the adapter's."""

    SCHEMA: ClassVar[str] = "vox_mens_merge_parity_v1"
    LEGACY: ClassVar[tuple[str, ...]] = ("mens_merge_parity_v1",)

    decoding: str = "greedy"
    merged_vs_adapter: dict = Field(default_factory=dict)
    """tasks, same_result, same_text and the differing tasks: the merged model's greedy answers against the
    adapter's."""
    served_vs_merged: dict | None = None
    """The same for the first tasks sent through a real `mens serve`, against the merged model."""


class HeldoutSplit(Record):
    """`data/heldout_split.json`: the held-out tasks and the training rows dropped as overlapping them."""

    SCHEMA: ClassVar[str] = "vox_mens_heldout_split_v1"
    LEGACY: ClassVar[tuple[str, ...]] = ("mens_heldout_split_v1",)

    rows_in: int = 0
    kept: int = 0
    """Training rows kept; rows_in = kept + dropped."""
    dropped: int = 0
    heldout_tasks: int = 0
    reference_answers: int = 0
    prompt_near_dup_threshold: float | None = None
    max_kept_prompt_similarity: float | None = None
    dropped_rows: list[dict] = Field(default_factory=list)


class DogfoodSummary(Record):
    """`dogfood_summary.json`: every stage's result of a `mens dogfood` run."""

    SCHEMA: ClassVar[str] = "vox_mens_dogfood_summary_v1"
    LEGACY: ClassVar[tuple[str, ...]] = ("mens_dogfood_summary_v1",)

    output_dir: str | None = None
    run: str | None = None
    """The trained run directory (the round-2 run with --rounds 2)."""
    wall_time_s_this_session: float | None = None
    stage_seconds: dict = Field(default_factory=dict)
    total_stage_seconds: float | None = None
    base: dict = Field(default_factory=dict)
    tuned: dict = Field(default_factory=dict)
    """Per decoding mode: nonempty_parse_rate, pass_at_1, pass_at_k."""
    gain_over_base: float | None = None
    round1: dict | None = None
    gate: bool | None = None
    merge_parity: dict = Field(default_factory=dict)
    merged: str | None = None
    card: str | None = None
    report: str | None = None
    budget: dict | None = None
    """Where `--budget` cut the recipe: budget_s, steps (trained), recipe_steps, step_s (the run's mean) and
    whole_recipe_s (about how long the whole command would take with `--budget none` on this machine)."""


class TrainingConfigRecord(Record):
    """`training_config.json` in a published folder: the run's settings without local paths."""

    SCHEMA: ClassVar[str] = "vox_mens_training_config_v1"
    LEGACY: ClassVar[tuple[str, ...]] = ("mens_training_config_v1",)

    base_model: str | None = None
    config: dict = Field(default_factory=dict)


RECORDS: dict[str, type[Record]] = {cls.SCHEMA: cls for cls in (
    TrainingManifest, RunSummary, GateReceipt, BenchmarkResults, MergeParity, HeldoutSplit, DogfoodSummary,
    TrainingConfigRecord)}
"""Every record type by its schema id."""
