"""`mens train --gate FILE` (or the original's VOX_BENCHMARK=1): evaluate the fresh run on the bench's held-out
split, check the gates, and record the verdict in `training_manifest.json` (key `gate`). A failed gate raises
GateFailed (exit 1) unless the gates are warn-only (MENS_EVAL_STRICT / VOX_EVAL_STRICT = 0)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mens.errors import GateFailed
from mens.evaluate.gates import check_gates, load_gate_thresholds

BENCHMARK_VARIABLES = ("VOX_BENCHMARK", "MENS_BENCHMARK")
"""=1 asks `mens train` for the post-train benchmark gate without --gate (thresholds from the environment)."""


def benchmark_requested(env: dict[str, str] | None = None) -> bool:
    """The original's VOX_BENCHMARK=1 (or MENS_BENCHMARK=1): run the held-out benchmark after training."""
    env = os.environ if env is None else env
    return any((env.get(name) or "").strip().lower() in {"1", "true", "yes", "on"} for name in BENCHMARK_VARIABLES)


def gate_after_training(run_dir: str | Path, gate_file: str | Path | None, *, bench: str | None = None,
                        limit: int | None = None, language: str = "vox", max_new_tokens: int = 256,
                        device: str = "auto") -> dict:
    """Run eval-local then the gates (from `gate_file` and the environment; none: the benchmark alone, as the
    original's VOX_BENCHMARK=1 does); returns the verdict written into the manifest."""
    from mens.evaluate.local import eval_local

    run = Path(run_dir)
    wants_base = "min_gain_over_base" in load_gate_thresholds(gate_file)
    report = eval_local(run, bench, language=language, limit=limit, compare_base=wants_base,
                        max_new_tokens=max_new_tokens, device=device)
    verdict: dict = {"file": str(gate_file) if gate_file is not None else None, "report": report.name}
    failure: GateFailed | None = None
    if not load_gate_thresholds(gate_file):
        verdict.update(passed=True, reason="no thresholds set: the benchmark ran without gates", gates=[])
        _record(run, verdict)
        return verdict
    try:
        results = check_gates(run, gate_file)
        missed = [r.gate for r in results if not r.passed]
        verdict.update(passed=not missed, reason=f"not enforced: {', '.join(missed)} not met" if missed else None)
    except GateFailed as e:
        failure = e
        verdict.update(passed=False, reason=str(e))
        results = json.loads((run / "gate_receipt.json").read_text(encoding="utf-8"))["gates"]
    verdict["gates"] = [r if isinstance(r, dict) else r.__dict__ for r in results]
    _record(run, verdict)
    if failure is not None:
        raise failure
    return verdict


def _record(run: Path, verdict: dict) -> None:
    manifest_path = run / "training_manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    manifest["gate"] = verdict
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
