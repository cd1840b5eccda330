"""`mens train --gate FILE`: evaluate the fresh run on the bench's held-out split, check the gates, and
record the verdict in `training_manifest.json` (key `gate`). A failed gate still raises GateFailed (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mens.errors import GateFailed
from mens.evaluate.gates import check_gates


def gate_after_training(run_dir: str | Path, gate_file: str | Path, *, bench: str | None = None,
                        limit: int | None = None, language: str = "vox", max_new_tokens: int = 256,
                        device: str = "auto") -> dict:
    """Run eval-local then the gates; returns the verdict written into the manifest."""
    from mens.evaluate.local import eval_local

    run = Path(run_dir)
    wants_base = "min_gain_over_base" in (yaml.safe_load(Path(gate_file).read_text(encoding="utf-8")) or {})
    report = eval_local(run, bench, language=language, limit=limit, compare_base=wants_base,
                        max_new_tokens=max_new_tokens, device=device)
    verdict: dict = {"file": str(gate_file), "report": report.name}
    failure: GateFailed | None = None
    try:
        results = check_gates(run, gate_file)
        verdict.update(passed=True, reason=None)
    except GateFailed as e:
        failure = e
        verdict.update(passed=False, reason=str(e))
        results = json.loads((run / "gate_receipt.json").read_text(encoding="utf-8"))["gates"]
    verdict["gates"] = [r if isinstance(r, dict) else r.__dict__ for r in results]
    manifest_path = run / "training_manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    manifest["gate"] = verdict
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if failure is not None:
        raise failure
    return verdict
