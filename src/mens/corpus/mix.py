"""`mens corpus mix`: combine JSONL sources by weight into one training file plus `<stem>.mix_report.json`.

mix.yaml (upstream schema): `sources: [{path, weight=1.0, optional=false, record_format?, sample_rate?}]`,
`output`, `include_lanes` (default [vox_codegen]), `exclude_lanes`, plus `seed` and `max_output_rows`. Checked
by pydantic: weights are finite and 0..100, the output is bounded. Strict by default: every missing or empty
non-optional source is reported together in one error. Sampling is seeded (upstream's is not).
Run: `mens corpus mix --config mix.yaml`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mens.corpus.atomic import write_text_atomic
from mens.corpus.jsonl import read_objects, reject_row, write_jsonl
from mens.corpus.records import BadLine
from mens.corpus.safe_yaml import load_yaml_file
from mens.corpus.tool_trace import ToolTraceRecord, tool_trace_to_pair
from mens.errors import ConfigError, DataError

MAX_WEIGHT = 100.0
"""A source repeated more than 100 times is a mistake, not a mix."""
MAX_OUTPUT_ROWS = 10_000_000
"""Upper bound of `max_output_rows`: a mix larger than this would not fit in memory."""


class MixSource(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    path: str = Field(min_length=1)
    """Source JSONL, relative to the mix base directory (the current directory unless --base)."""
    weight: float = Field(default=1.0, ge=0.0, le=MAX_WEIGHT)
    """Repeats = max(1, ceil(weight)); weight 0 skips the source."""
    optional: bool = False
    """A missing or empty optional source is reported and skipped; a non-optional one is an error."""
    record_format: str | None = None
    """`tool_trace` rows are normalized into pairs; anything else passes through."""
    sample_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    """Keep each line with this probability (0..1), seeded."""


class MixConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    sources: list[MixSource] = Field(min_length=1)
    output: str = Field(min_length=1)
    include_lanes: list[str] = Field(default_factory=lambda: ["vox_codegen"])
    exclude_lanes: list[str] = Field(default_factory=list)
    seed: int = 0
    max_output_rows: int = Field(default=1_000_000, ge=1, le=MAX_OUTPUT_ROWS)
    """The mix stops with a DataError rather than write more rows than this."""
    version: int | str | None = None
    """Upstream's schema version tag (not used)."""


def _config_error(path: Path, e: ValidationError) -> ConfigError:
    """One line naming every bad key, the value seen and what was expected."""
    parts = []
    for err in e.errors()[:8]:
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".") or "(top)"
        value = "" if err["type"] == "missing" else f" = {err.get('input')!r}"[:80]
        parts.append(f"{key}{value}: {err['msg'].lower()}")
    more = f" (and {e.error_count() - 8} more)" if e.error_count() > 8 else ""
    return ConfigError(f"{path}: invalid mix config: {'; '.join(parts)}{more}. Expected sources: [{{path: str, "
                       f"weight: 0..{MAX_WEIGHT:g}, optional: bool, sample_rate: 0..1}}], output: str, seed: int")


def load_mix_config(path: Path) -> MixConfig:
    """Parse and check mix.yaml; ConfigError naming the key, the value and the fix."""
    raw = load_yaml_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a mix config is a mapping with `sources` and `output`, got "
                          f"{type(raw).__name__}")
    for key in ("include_lanes", "exclude_lanes"):  # empty means the default, as upstream reads it
        if key in raw and raw[key] in (None, []):
            del raw[key]
    try:
        return MixConfig.model_validate(raw)
    except ValidationError as e:
        raise _config_error(path, e) from None


def infer_lane(row: dict) -> str:
    """Upstream's lane backfill from `category` when a row has none."""
    cat = str(row.get("category", "")).lower()
    if "tool_trace" in cat:
        return "vox_tooling"
    if "speech" in cat or "asr_refine" in cat:
        return "vox_speech"
    if "documentation" in cat:
        return "vox_docs_qa" if row.get("response_mode") == "prose_only" else "vox_codegen"
    return "vox_codegen"


def _usable(row: dict) -> bool:
    return bool(row.get("messages") or row.get("response") or row.get("output"))


def _read_source(src: MixSource, resolved: Path, entry: dict, cfg: MixConfig, rng: random.Random,
                 bad: list[dict]) -> list[dict]:
    """The rows of one source that pass; every other line is counted in `entry` (rejects also in `bad`)."""
    kept = []
    for no, obj in read_objects(resolved):
        entry["input_lines"] += 1
        where = f"{resolved}:{no}"
        if isinstance(obj, BadLine):
            reason, raw, obj = obj.reason, obj.raw, None
        elif src.sample_rate is not None and rng.random() >= src.sample_rate:
            entry["sampled_out"] += 1
            continue
        else:
            reason, raw = "", None
            if src.record_format == "tool_trace" and "task_prompt" in obj:
                try:
                    obj = tool_trace_to_pair(ToolTraceRecord.model_validate(obj))
                except ValueError as e:
                    reason = f"schema: not a tool_trace record: {str(e).splitlines()[0]}"
            if not reason and not _usable(obj):
                reason = "no_text: the row has no messages, response or output"
        if reason:
            entry["bad_lines"] += 1
            entry["rejected_by_reason"][reason.split(":", 1)[0]] = \
                entry["rejected_by_reason"].get(reason.split(":", 1)[0], 0) + 1
            bad.append(reject_row(reason, where, record=obj, raw=raw))
            continue
        lane = obj.setdefault("lane", infer_lane(obj))
        if lane not in cfg.include_lanes or lane in cfg.exclude_lanes:
            entry["filtered_by_lane"] += 1
            continue
        kept.append(obj)
    return kept


def mix_sources(config_path: Path, out: Path | None = None, base: Path | None = None,
                allow_missing: bool = False) -> dict:
    """Run the mix; returns the report (also written to `<output stem>.mix_report.json`).

    Per source: input_lines = kept + bad_lines + filtered_by_lane + sampled_out; bad lines go to
    `<output stem>.rejects.jsonl` with their reasons.
    """
    cfg = load_mix_config(config_path)
    base = base or Path.cwd()
    out = out or (base / cfg.output)
    rng = random.Random(cfg.seed)
    rows: list[dict] = []
    entries, problems, bad = [], [], []
    for src in cfg.sources:
        resolved = base / src.path
        entry = {**src.model_dump(), "resolved_path": str(resolved), "input_lines": 0, "bad_lines": 0,
                 "rejected_by_reason": {}, "sampled_out": 0, "kept_lines": 0, "repeats": 0, "emitted_lines": 0,
                 "filtered_by_lane": 0, "skipped_reason": None}
        entries.append(entry)
        if src.weight <= 0:
            entry["skipped_reason"] = "weight_zero"
            continue
        if not resolved.is_file():
            entry["skipped_reason"] = "missing_file_optional" if src.optional else "missing_file"
            if not src.optional:
                problems.append(f"{src.path} (missing: {resolved})")
            continue
        kept = _read_source(src, resolved, entry, cfg, rng, bad)
        entry["kept_lines"] = len(kept)
        entry["repeats"] = max(1, math.ceil(src.weight))
        entry["emitted_lines"] = len(kept) * entry["repeats"]
        if len(rows) + entry["emitted_lines"] > cfg.max_output_rows:
            raise DataError(f"{config_path}: sources[{len(entries) - 1}] ({src.path}, weight {src.weight:g}) would "
                            f"bring the mix to {len(rows) + entry['emitted_lines']} rows > max_output_rows "
                            f"{cfg.max_output_rows}; lower its weight or raise max_output_rows (at most "
                            f"{MAX_OUTPUT_ROWS})")
        rows.extend(kept * entry["repeats"])
        if not kept:
            entry["skipped_reason"] = "empty_file" if entry["input_lines"] == 0 else "no_lines_passed_filters"
            if not src.optional:
                problems.append(f"{src.path} ({entry['skipped_reason']}: {entry['input_lines']} lines read)")
    if problems and not allow_missing:
        raise DataError(f"{config_path}: {len(problems)} non-optional mix source(s) missing or empty: "
                        f"{'; '.join(problems)}. Create them (run the pipeline stage that writes each), mark them "
                        "`optional: true`, or pass --allow-missing-sources")
    if not rows and not allow_missing:
        raise DataError(f"{config_path}: the mix emitted 0 rows (expected at least 1); check sources and lanes")
    total = write_jsonl(out, rows)
    rejects = out.with_name(out.stem + ".rejects.jsonl")
    if bad or rejects.exists():
        write_jsonl(rejects, bad)
    for e in entries:
        e["share_of_output"] = round(e["emitted_lines"] / total, 6) if total else 0.0
    report = {"config_path": str(config_path), "output_path": str(out), "strict": not allow_missing,
              "config_fingerprint": hashlib.sha256(config_path.read_bytes()).hexdigest(), "seed": cfg.seed,
              "include_lanes": cfg.include_lanes, "exclude_lanes": cfg.exclude_lanes, "total_emitted": total,
              "rejects_path": str(rejects) if bad else None, "missing_or_empty": problems, "sources": entries}
    write_text_atomic(out.with_name(out.stem + ".mix_report.json"), json.dumps(report, indent=2) + "\n")
    return report
