"""Promotion gates: thresholds on a run's `benchmark_results.json`, from a YAML file and the environment.

Gate file (all keys optional; a missing key is no gate):

    min_parse_rate: 0.80      # non-empty parse rate of the evaluated model
    min_coverage: 0.50        # share of the bench's expected construct kinds seen in parsing outputs
    min_pass_at_1: 0.50
    min_pass_at_k: 0.60
    min_gain_over_base: 0.30  # parse-rate gain over the base model (needs --compare-base)

Environment variables override the file: MENS_EVAL_MIN_PARSE_RATE, MENS_EVAL_MIN_COVERAGE,
MENS_EVAL_MIN_PASS_AT_1, MENS_EVAL_MIN_PASS_AT_K, MENS_EVAL_MIN_GAIN (the original's VOX_EVAL_* names
are accepted too). `check_gates` writes `gate_receipt.json` and raises GateFailed with a one-line reason.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from mens.errors import ConfigError, DataError, GateFailed

# gate key -> (metric key in benchmark_results.json "metrics", environment variable suffix)
GATES = {
    "min_parse_rate": ("nonempty_parse_rate", "MIN_PARSE_RATE"),
    "min_coverage": ("coverage", "MIN_COVERAGE"),
    "min_pass_at_1": ("pass_at_1", "MIN_PASS_AT_1"),
    "min_pass_at_k": ("pass_at_k", "MIN_PASS_AT_K"),
    "min_gain_over_base": ("gain_over_base", "MIN_GAIN"),
}
RECEIPT_SCHEMA = "vox_mens_gate_receipt_v1"


@dataclass
class GateResult:
    gate: str
    threshold: float
    value: float | None
    passed: bool
    source: str


def load_gate_thresholds(path: str | Path | None = None, env: dict[str, str] | None = None) -> dict[str, float]:
    """Thresholds from the YAML file (if any), overridden by MENS_EVAL_* / VOX_EVAL_* variables."""
    env = os.environ if env is None else env
    thresholds: dict[str, float] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"gate file {p} does not exist; pass a YAML file with keys {', '.join(GATES)}")
        doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        if not isinstance(doc, dict):
            raise ConfigError(f"{p}: expected a mapping of gate -> threshold, got {type(doc).__name__}")
        unknown = sorted(set(doc) - set(GATES))
        if unknown:
            raise ConfigError(f"{p}: unknown gate(s) {', '.join(unknown)}; valid gates: {', '.join(GATES)}")
        for key, value in doc.items():
            if value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigError(f"{p}: {key} must be a number, got {value!r}")
            thresholds[key] = float(value)
    for key, (_, suffix) in GATES.items():
        for prefix in ("VOX_EVAL_", "MENS_EVAL_"):  # MENS_ wins: applied last
            raw = env.get(prefix + suffix)
            if raw is None or raw == "":
                continue
            try:
                thresholds[key] = float(raw)
            except ValueError:
                raise ConfigError(f"{prefix}{suffix}={raw!r} is not a number (e.g. 0.8)") from None
    return thresholds


def evaluate_gates(metrics: dict, thresholds: dict[str, float], source: str) -> list[GateResult]:
    """Compare metrics with thresholds; a metric that is missing fails its gate."""
    results = []
    for key, threshold in thresholds.items():
        metric = GATES[key][0]
        value = metrics.get(metric)
        passed = value is not None and value >= threshold
        results.append(GateResult(key, threshold, value, passed, f"{source}: metrics.{metric}"))
    return results


def check_gates(run_dir: str | Path, gate_file: str | Path | None = None, env: dict[str, str] | None = None
                ) -> list[GateResult]:
    """Check the run's benchmark results against the gates; write gate_receipt.json; raise GateFailed on a miss."""
    run = Path(run_dir)
    bench = run / "benchmark_results.json"
    if not bench.is_file():
        raise DataError(f"{bench} not found; run `mens eval-local {run} --bench ...` before `mens gate`")
    try:
        report = json.loads(bench.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{bench}:{e.lineno}: malformed JSON: {e.msg}") from None
    thresholds = load_gate_thresholds(gate_file, env)
    if not thresholds:
        raise ConfigError("no gates configured: pass --gates FILE or set MENS_EVAL_MIN_PARSE_RATE (and friends)")
    results = evaluate_gates(report.get("metrics", {}), thresholds, bench.name)
    overall = all(r.passed for r in results)
    receipt = {"schema": RECEIPT_SCHEMA, "overall_passed": overall, "gates": [asdict(r) for r in results]}
    (run / "gate_receipt.json").write_text(json.dumps(receipt, indent=2) + "\n", encoding="utf-8")
    failed = [r for r in results if not r.passed]
    if failed:
        f = failed[0]
        got = "missing" if f.value is None else f"{f.value:.3f}"
        extra = f" (+{len(failed) - 1} more gate(s) failed)" if len(failed) > 1 else ""
        raise GateFailed(f"{GATES[f.gate][0]} = {got} < {f.threshold:.3f} required ({f.gate}; {f.source}){extra}")
    return results
