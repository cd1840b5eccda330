"""`mens train --gate FILE` (or the original's VOX_BENCHMARK=1): evaluate the fresh run on the bench's held-out
split, check the gates, and record the verdict in the run's `gate_receipt.json` (the training manifest stays as
training wrote it). A failed gate raises GateFailed (exit 1) unless the gates are warn-only (MENS_EVAL_STRICT /
VOX_EVAL_STRICT = 0)."""

from __future__ import annotations

import os
from pathlib import Path

from mens.errors import GateFailed
from mens.evaluate.gates import check_gates, load_gate_thresholds, no_gates_receipt
from mens.run_records import GATE_RECEIPT, GateReceipt

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
    original's VOX_BENCHMARK=1 does); returns the verdict, also written to gate_receipt.json."""
    from mens.evaluate.local import eval_local

    run = Path(run_dir)
    thresholds = load_gate_thresholds(gate_file)
    report = eval_local(run, bench, language=language, limit=limit, compare_base="min_gain_over_base" in thresholds,
                        max_new_tokens=max_new_tokens, device=device)
    failure: GateFailed | None = None
    if not thresholds:
        receipt = no_gates_receipt(run, "no thresholds set: the benchmark ran without gates")
    else:
        try:
            check_gates(run, gate_file)
        except GateFailed as e:
            failure = e
        receipt = GateReceipt.read(run / GATE_RECEIPT)
    verdict = {"file": str(gate_file) if gate_file is not None else None, "report": report.name,
               "passed": receipt.overall_passed, "reason": receipt.reason,
               "gates": [g.model_dump() for g in receipt.gates]}
    if failure is not None:
        raise failure
    return verdict
