"""Read what a run directory holds (telemetry, manifest, summary, benchmark results), tolerating absences."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mens.errors import DataError


@dataclass
class RunFiles:
    run: Path
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    bench: dict = field(default_factory=dict)


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON: {e.msg}") from None


def read_run(run_dir: str | Path) -> RunFiles:
    """Load the run's artifacts; a missing file leaves its field empty, a corrupt one is an error."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"run directory {run} does not exist; pass the --output-dir of a `mens train` run")
    files = RunFiles(run=run, manifest=_json(run / "training_manifest.json"), summary=_json(run / "run_summary.json"),
                     bench=_json(run / "benchmark_results.json"))
    tel = run / "telemetry.jsonl"
    if tel.is_file():
        for line in tel.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash mid-write: the rest of the run is still readable
            kind = ev.get("event") or ev.get("type")
            if kind == "step":
                files.steps.append(ev)
            elif kind == "eval":
                files.evals.append(ev)
    return files
