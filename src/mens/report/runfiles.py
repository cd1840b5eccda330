"""Read what a run directory holds (telemetry, manifest, summary, benchmark results), tolerating absences."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mens.errors import DataError
from mens.run_records import BENCHMARK, MANIFEST, SUMMARY, TELEMETRY, BenchmarkResults, RunSummary, TrainingManifest


@dataclass
class RunFiles:
    """A run directory's records (empty records for the files it lacks) and its telemetry's step and eval events."""

    run: Path
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    manifest: TrainingManifest = field(default_factory=TrainingManifest)
    summary: RunSummary = field(default_factory=RunSummary)
    bench: BenchmarkResults = field(default_factory=BenchmarkResults)
    present: set[str] = field(default_factory=set)
    """Which of MANIFEST, SUMMARY and BENCHMARK the run has (an absent one reads as an empty record)."""


def as_manifest(manifest: TrainingManifest | dict, where: str | Path = "the manifest") -> TrainingManifest:
    """`manifest` as a TrainingManifest: a plain dict (as tests and bench scripts pass) is validated as one."""
    return manifest if isinstance(manifest, TrainingManifest) else TrainingManifest.parse(manifest, where)


def read_run(run_dir: str | Path) -> RunFiles:
    """Load the run's artifacts; a missing file leaves its record empty, a corrupt one is a one-line DataError."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"run directory {run} does not exist; pass the --output-dir of a `mens train` run")
    manifest = TrainingManifest.read_optional(run / MANIFEST)
    summary = RunSummary.read_optional(run / SUMMARY)
    bench = BenchmarkResults.read_optional(run / BENCHMARK)
    files = RunFiles(run=run, manifest=manifest or TrainingManifest(), summary=summary or RunSummary(),
                     bench=bench or BenchmarkResults(),
                     present={name for name, rec in ((MANIFEST, manifest), (SUMMARY, summary), (BENCHMARK, bench))
                              if rec is not None})
    tel = run / TELEMETRY
    if tel.is_file():
        for line in tel.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash mid-write: the rest of the run is still readable
            if not isinstance(ev, dict):
                continue
            kind = ev.get("event") or ev.get("type")
            if kind == "step":
                files.steps.append(ev)
            elif kind == "eval":
                files.evals.append(ev)
    return files
