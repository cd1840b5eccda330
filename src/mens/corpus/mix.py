"""`mens corpus mix`: combine JSONL sources by weight into one training file plus `<stem>.mix_report.json`.

mix.yaml (upstream schema): `sources: [{path, weight=1.0, optional=false, record_format?, sample_rate?}]`,
`output`, `include_lanes` (default [vox_codegen]), `exclude_lanes`. Strict by default: every missing or empty
non-optional source is reported together in one error. Sampling is seeded (upstream's is not).
Run: `mens corpus mix --config mix.yaml`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from mens.corpus.jsonl import read_objects, write_jsonl
from mens.corpus.records import BadLine
from mens.corpus.tool_trace import ToolTraceRecord, tool_trace_to_pair
from mens.errors import ConfigError, DataError


@dataclass
class MixSource:
    path: str
    """Source JSONL, relative to the mix base directory (the current directory unless --base)."""
    weight: float = 1.0
    """Repeats = max(1, ceil(weight)); weight <= 0 skips the source."""
    optional: bool = False
    """A missing or empty optional source is reported and skipped; a non-optional one is an error."""
    record_format: str | None = None
    """`tool_trace` rows are normalized into pairs; anything else passes through."""
    sample_rate: float | None = None
    """Keep each line with this probability (0..1), seeded."""


@dataclass
class MixConfig:
    sources: list[MixSource]
    output: str
    include_lanes: list[str] = field(default_factory=lambda: ["vox_codegen"])
    exclude_lanes: list[str] = field(default_factory=list)
    seed: int = 0


_SOURCE_KEYS = {f for f in MixSource.__dataclass_fields__}
_TOP_KEYS = {"sources", "output", "include_lanes", "exclude_lanes", "seed", "version"}


def load_mix_config(path: Path) -> MixConfig:
    """Parse and check mix.yaml; ConfigError naming the key, the value and the fix."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read mix config: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict) or not raw.get("sources") or not raw.get("output"):
        raise ConfigError(f"{path}: a mix config needs a non-empty `sources` list and an `output` path")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(_TOP_KEYS)}")
    sources = []
    for i, s in enumerate(raw["sources"]):
        if not isinstance(s, dict) or "path" not in s:
            raise ConfigError(f"{path}: sources[{i}] must be a mapping with a `path`, got {s!r}")
        bad = set(s) - _SOURCE_KEYS
        if bad:
            raise ConfigError(f"{path}: sources[{i}] has unknown key(s) {sorted(bad)}; valid: {sorted(_SOURCE_KEYS)}")
        src = MixSource(**s)
        if src.sample_rate is not None and not 0 <= src.sample_rate <= 1:
            raise ConfigError(f"{path}: sources[{i}].sample_rate = {src.sample_rate}, expected 0..1")
        sources.append(src)
    return MixConfig(sources, str(raw["output"]), list(raw.get("include_lanes") or ["vox_codegen"]),
                     list(raw.get("exclude_lanes") or []), int(raw.get("seed", 0)))


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


def mix_sources(config_path: Path, out: Path | None = None, base: Path | None = None,
                allow_missing: bool = False) -> dict:
    """Run the mix; returns the report (also written to `<output stem>.mix_report.json`)."""
    cfg = load_mix_config(config_path)
    base = base or Path.cwd()
    out = out or (base / cfg.output)
    rng = random.Random(cfg.seed)
    rows: list[dict] = []
    entries, problems = [], []
    for src in cfg.sources:
        resolved = base / src.path
        entry = {**asdict(src), "resolved_path": str(resolved), "input_lines": 0, "bad_lines": 0, "repeats": 0,
                 "emitted_lines": 0, "filtered_by_lane": 0, "skipped_reason": None}
        entries.append(entry)
        if src.weight <= 0:
            entry["skipped_reason"] = "weight_zero"
            continue
        if not resolved.is_file():
            entry["skipped_reason"] = "missing_file_optional" if src.optional else "missing_file"
            if not src.optional:
                problems.append(f"{src.path} (missing: {resolved})")
            continue
        kept = []
        for _, obj in read_objects(resolved):
            entry["input_lines"] += 1
            if isinstance(obj, BadLine):
                entry["bad_lines"] += 1
                continue
            if src.sample_rate is not None and rng.random() >= src.sample_rate:
                continue
            if src.record_format == "tool_trace" and "task_prompt" in obj:
                try:
                    obj = tool_trace_to_pair(ToolTraceRecord.model_validate(obj))
                except ValueError:
                    entry["bad_lines"] += 1
                    continue
            if not _usable(obj):
                entry["bad_lines"] += 1
                continue
            obj.setdefault("lane", infer_lane(obj))
            if obj["lane"] not in cfg.include_lanes or obj["lane"] in cfg.exclude_lanes:
                entry["filtered_by_lane"] += 1
                continue
            kept.append(obj)
        entry["repeats"] = max(1, math.ceil(src.weight))
        entry["emitted_lines"] = len(kept) * entry["repeats"]
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
    for e in entries:
        e["share_of_output"] = round(e["emitted_lines"] / total, 6) if total else 0.0
    report = {"config_path": str(config_path), "output_path": str(out), "strict": not allow_missing,
              "config_fingerprint": hashlib.sha256(config_path.read_bytes()).hexdigest(), "seed": cfg.seed,
              "include_lanes": cfg.include_lanes, "exclude_lanes": cfg.exclude_lanes, "total_emitted": total,
              "missing_or_empty": problems, "sources": entries}
    out.with_name(out.stem + ".mix_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report
