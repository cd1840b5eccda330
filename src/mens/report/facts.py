"""What the report and the model card both show, read from a run's files: rounded numbers, the resolved
hyperparameters, the score rows with their sample sizes, and sample held-out answers (passed and failed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mens.report.runfiles import RunFiles, as_manifest
from mens.run_records import BenchmarkResults, MergeParity, TrainingManifest

PATH_KEYS = {"data", "output_dir", "extra", "init_adapter"}
"""Config keys that hold local paths: never shown (they say nothing about the model and leak the machine's layout)."""
OPERATIONAL_KEYS = {"resume", "keep_checkpoints", "save_every", "log_every_s", "num_threads", "strict_targets"}
"""Config keys about running the job (checkpointing, logging, threads), not about what was trained."""


def num(v, digits: int = 3) -> str:
    """A number rounded for people: `digits` significant digits, thousands separated; anything else as text."""
    if isinstance(v, bool) or v is None:
        return {True: "yes", False: "no", None: "-"}[v]
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 10 ** digits:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def rate(value, n: int | None = None) -> str:
    """A rate as two decimals, with the count behind it when the rate is a whole number of n items: 0.62 (5/8)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    if isinstance(n, int) and n > 0 and abs(value * n - round(value * n)) < 0.01:
        return f"{value:.2f} ({round(value * n)}/{n})"
    return f"{value:.2f}"


def _is_local_path(v) -> bool:
    return isinstance(v, str) and (v.startswith(("/", "~", "./", "../")) or Path(v).is_dir())


def _module_names(modules) -> str:
    """`model.layers.3.self_attn.q_proj`, ... -> `q_proj, k_proj, ...` (the distinct leaf names, in order)."""
    seen: dict[str, None] = {}
    for m in modules or []:
        seen.setdefault(str(m).rsplit(".", 1)[-1], None)
    return ", ".join(seen)


def hyperparameters(manifest: TrainingManifest | dict) -> list[tuple[str, str]]:
    """(setting, value) rows of what the run actually used: the resolved config with the values training resolved
    (warmup steps, gradient checkpointing, global batch) taken from the manifest, local paths left out."""
    manifest = as_manifest(manifest)
    cfg = dict(manifest.config)
    steps = manifest.steps
    adapter = manifest.adapter or {}
    rows: list[tuple[str, str]] = []

    def add(label: str, value) -> None:
        if value is not None and value != "":
            rows.append((label, value if isinstance(value, str) else num(value)))

    add("method", cfg.pop("backend", manifest.backend))
    if manifest.backend in ("lora", "qlora") or "r" in cfg:
        add("LoRA rank r", cfg.pop("r", None))
        add("LoRA alpha", cfg.pop("lora_alpha", None))
        add("LoRA dropout", cfg.pop("lora_dropout", None))
        add("adapted modules", _module_names(adapter.get("modules") or manifest.target_modules) or None)
        if adapter.get("n_layers"):
            add("adapted layers", f"{len(adapter.get('adapted_layers') or [])} of {adapter['n_layers']}")
            cfg.pop("lora_layers", None)  # 0 means all: the resolved count above says it
        if adapter.get("trainable_parameters") and adapter.get("total_parameters"):
            t, total = adapter["trainable_parameters"], adapter["total_parameters"]
            add("trainable parameters", f"{num(float(t))} of {num(float(total))} ({100 * t / total:.2f}%)")
    add("optimizer steps", f"{num(steps['completed'])} of {num(steps['planned'])} planned"
        if steps.get("completed") is not None and steps.get("planned") else cfg.get("max_steps"))
    cfg.pop("max_steps", None)
    add("global batch (sequences)", steps.get("global_batch"))
    add("batch size per device", cfg.pop("batch_size", None))
    add("gradient accumulation", cfg.pop("grad_accum", None))
    add("learning rate", cfg.pop("learning_rate", None))
    warm = steps.get("warmup")
    configured = cfg.pop("warmup_steps", None)
    add("learning-rate schedule", "linear warmup, then cosine decay to 0")  # mens.train.schedule, the only one
    add("warmup steps", f"{warm} (configured {configured}; at most a tenth of the steps)"
        if warm is not None and configured is not None and warm != configured else (warm if warm is not None
                                                                                      else configured))
    add("sequence length", cfg.pop("seq_len", None))
    packing = (manifest.packing or {}).get("mode")
    pack = cfg.pop("pack", None)
    add("packing", packing if pack and packing else pack)
    gc = manifest.gradient_checkpointing
    cfg.pop("gradient_checkpointing", None)
    if isinstance(gc, dict):
        add("gradient checkpointing", "on" if gc.get("on") else "off")
    add("device", manifest.device)
    amp, configured = manifest.matmul_dtype, cfg.get("autocast")
    if amp is not None:  # the precision training resolved from the configured autocast and the device
        cfg.pop("autocast", None)
        add("matmul precision", f"{amp} (autocast configured {configured})" if configured and configured != amp
            else amp)
    if manifest.parallelism:
        cfg.pop("fsdp", None)
        world = manifest.world_size
        add("parallelism", "single process" if world == 1 else f"{manifest.parallelism} ({num(world)} processes)")
    cfg.pop("device", None)
    for key in ("system_prompt", "model", "contract_digest"):
        cfg.pop(key, None)  # shown elsewhere (the prompt, the base model) or noise
    for key, value in cfg.items():  # the rest, as named in the config, so nothing resolved is hidden
        skip = key in PATH_KEYS | OPERATIONAL_KEYS or isinstance(value, (dict, list)) or _is_local_path(value)
        if skip or value is None:
            continue
        add(key.replace("_", " "), value)
    return rows


def served_vs_merged(parity: MergeParity) -> dict:
    """The served model's answers against the merged model's; empty when the server was not compared."""
    return parity.served_vs_merged or {}


def training_numbers(files: RunFiles) -> list[tuple[str, str]]:
    """(what, value) rows of how training went: steps, losses, throughput (both kinds, labelled), time, memory."""
    s = files.summary
    val = num(s.val_loss)
    last_eval = files.evals[-1] if files.evals else {}
    read, every = last_eval.get("tokens"), last_eval.get("all_tokens")
    if s.val_loss is not None and isinstance(read, int) and isinstance(every, int) and read < every:
        val += f" (on {read:,} of the {every:,} validation tokens)"  # a budgeted run validates on a share
    rows = [("optimizer steps", num(s.steps if "steps" in s.model_fields_set else len(files.steps))),
            ("first / final train loss", f"{num(s.first_loss)} / {num(s.final_loss)}"),
            ("validation loss (last)", val)]
    step_rates = sorted(e["tokens_per_s"] for e in files.steps if isinstance(e.get("tokens_per_s"), (int, float)))
    if step_rates:
        rows.append(("tokens/s in optimizer steps (median)", num(step_rates[len(step_rates) // 2])))
    if s.tokens_per_s is not None:
        rows.append(("tokens/s over the training time (validation included)", num(s.tokens_per_s)))
    rows.append(("wall time", f"{num(s.wall_time_s)} s" if s.wall_time_s is not None else "-"))
    peak = s.peak_memory
    if peak:
        rows.append(("peak memory", ", ".join(_memory(k, v) for k, v in peak.items())))
    return rows


def _memory(key: str, value) -> str:
    """`cpu_max_rss_mb: 3893.0` -> `3,893 MB (cpu max rss)`."""
    if key.endswith("_mb") and isinstance(value, (int, float)):
        return f"{num(float(value))} MB ({key[:-3].replace('_', ' ')})"
    return f"{key.replace('_', ' ')} {num(value)}"


@dataclass
class ScoreRow:
    """One model/decoding row of the bench: its rates and how many tasks (n) they count."""

    model: str
    """"base model" or "tuned"."""
    mode: str
    """The decoding mode: greedy, retry, constrained."""
    metrics: dict

    @property
    def name(self) -> str:
        return f"{self.model} ({self.mode})"

    @property
    def tuned(self) -> bool:
        return self.model == "tuned"

    @property
    def n(self) -> int | None:
        t = self.metrics.get("tasks")
        return t if isinstance(t, int) else None

    @property
    def counts_tasks(self) -> bool:
        """One answer per task: the rates are counts of tasks, so `rate` can show them as k/n."""
        return self.n is not None and self.metrics.get("samples", self.n) == self.n


def score_rows(bench: BenchmarkResults) -> list[ScoreRow]:
    """The base model's row (when measured), then one row per decoding mode of the tuned model."""
    rows = []
    base_metrics = (bench.base or {}).get("metrics")
    if base_metrics:
        rows.append(ScoreRow("base model", "greedy", base_metrics))
    modes = bench.modes or ({"greedy": bench.metrics} if bench.metrics else {})
    rows += [ScoreRow("tuned", name, m) for name, m in modes.items()]
    return rows


@dataclass
class Sample:
    """A held-out task, the tuned model's answer and whether it passed (with the first failure's reason)."""

    task: str
    category: str
    prompt: str
    answer: str
    passed: bool
    reason: str


def sample_answers(bench: BenchmarkResults, *, passed: int = 3, failed: int = 5) -> list[Sample]:
    """Up to `passed` passing and `failed` failing answers of the main decoding mode, in bench order."""
    picked: list[Sample] = []
    left = {True: passed, False: failed}
    for r in bench.results:
        sample = (r.get("samples") or [{}])[0]
        ok = bool(sample.get("pass"))
        if left[ok] <= 0:
            continue
        left[ok] -= 1
        fails = sample.get("failures") or []
        reason = "" if ok else (fails[0].get("reason") if fails else sample.get("first_diagnostic")) or "failed"
        picked.append(Sample(str(r.get("id", "?")), str(r.get("category", "?")), str(r.get("prompt", "")),
                             str(sample.get("output", "")), ok, str(reason)))
    return picked
