"""Promotion gates: thresholds on a run's `benchmark_results.json`, from a YAML file and the environment.

Gate file (all keys optional; a missing key is no gate):

    min_parse_rate: 0.80      # non-empty parse rate of the evaluated model
    min_coverage: 0.50        # share of the bench's expected construct kinds seen in parsing outputs
    min_pass_at_1: 0.50
    min_pass_at_k: 0.60
    min_gain_over_base: 0.30  # parse-rate gain over the base model (needs --compare-base)

Environment variables override the file: MENS_EVAL_MIN_PARSE_RATE, MENS_EVAL_MIN_COVERAGE,
MENS_EVAL_MIN_PASS_AT_1, MENS_EVAL_MIN_PASS_AT_K, MENS_EVAL_MIN_GAIN (the original's VOX_EVAL_* names
are accepted too, and its VOX_BENCHMARK_MIN_PASS_RATE sets min_pass_at_1). `check_gates` writes
`gate_receipt.json` (mens.run_records.GateReceipt) and raises GateFailed with a one-line reason.

MENS_EVAL_STRICT / VOX_EVAL_STRICT = 0 makes the gates warn-only: the receipt records the misses with
`block: false` and nothing is raised. Unset means strict in mens; the original's legacy gate was warn-only
unless VOX_EVAL_STRICT=1, but a promotion gate that does not block by default is no gate.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from mens.errors import ConfigError, DataError, GateFailed
from mens.run_records import BENCHMARK, GATE_RECEIPT, BenchmarkResults, GateReceipt

# gate key -> (metric key in benchmark_results.json "metrics", environment variable suffix)
GATES = {
    "min_parse_rate": ("nonempty_parse_rate", "MIN_PARSE_RATE"),
    "min_coverage": ("coverage", "MIN_COVERAGE"),
    "min_pass_at_1": ("pass_at_1", "MIN_PASS_AT_1"),
    "min_pass_at_k": ("pass_at_k", "MIN_PASS_AT_K"),
    "min_gain_over_base": ("gain_over_base", "MIN_GAIN"),
}
ALIASES = {"VOX_BENCHMARK_MIN_PASS_RATE": "min_pass_at_1"}
"""The original's other names for a threshold (its post-train benchmark gate's minimum pass rate)."""
STRICT_VARIABLES = ("VOX_EVAL_STRICT", "MENS_EVAL_STRICT")
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


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
    names = list(ALIASES.items())
    names += [(prefix + suffix, key) for prefix in ("VOX_EVAL_", "MENS_EVAL_") for key, (_, suffix) in GATES.items()]
    for name, key in names:  # later names win: MENS_EVAL_* over VOX_EVAL_* over the aliases
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            thresholds[key] = float(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number (e.g. 0.8)") from None
    return thresholds


def gates_strict(env: dict[str, str] | None = None) -> bool:
    """Whether a missed gate blocks (MENS_EVAL_STRICT over VOX_EVAL_STRICT; unset: strict)."""
    env = os.environ if env is None else env
    strict = True
    for name in STRICT_VARIABLES:
        raw = (env.get(name) or "").strip().lower()
        if not raw:
            continue
        if raw not in _TRUE | _FALSE:
            raise ConfigError(f"{name}={env[name]!r}: expected 1 (gates block) or 0 (gates only warn)")
        strict = raw in _TRUE
    return strict


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
    """Check the run's benchmark results against the gates; write gate_receipt.json; raise GateFailed on a miss
    (unless the gates are warn-only: then the caller finds the misses in the results and the receipt's reason)."""
    run = Path(run_dir)
    bench = run / BENCHMARK
    if not bench.is_file():
        raise DataError(f"{bench} not found; run `mens eval-local {run} --bench ...` before `mens gate`")
    report = BenchmarkResults.read(bench)
    thresholds = load_gate_thresholds(gate_file, env)
    if not thresholds:
        raise ConfigError("no gates configured: pass --gates FILE or set MENS_EVAL_MIN_PARSE_RATE (and friends)")
    strict = gates_strict(env)
    results = evaluate_gates(report.metrics, thresholds, bench.name)
    failed = [r for r in results if not r.passed]
    reason = None
    if failed:
        extra = f" (+{len(failed) - 1} more gate(s) failed)" if len(failed) > 1 else ""
        missed = ", ".join(r.gate for r in failed)
        reason = f"{describe(failed[0])}{extra}" if strict else f"not enforced: {missed} not met"
    # The original's receipt fields (name, passed, block, message, run_dir, policy, timestamp_unix) plus mens's
    # threshold, value and source on each gate.
    GateReceipt(timestamp_unix=int(time.time()), run_dir=str(run.resolve()),
                policy=str(gate_file) if gate_file is not None else "environment", overall_passed=not failed,
                enforced=strict, report=bench.name, reason=reason,
                gates=[{"name": r.gate, "passed": r.passed, "block": strict, "message": describe(r), **asdict(r)}
                       for r in results]).write(run / GATE_RECEIPT)
    if failed and strict:
        raise GateFailed(reason)
    return results


def no_gates_receipt(run_dir: str | Path, reason: str, env: dict[str, str] | None = None) -> GateReceipt:
    """The receipt of a benchmark run without thresholds (`mens train` with VOX_BENCHMARK=1 alone): no gate, passed."""
    run = Path(run_dir)
    receipt = GateReceipt(timestamp_unix=int(time.time()), run_dir=str(run.resolve()), policy="none",
                          overall_passed=True, enforced=gates_strict(env), report=BENCHMARK, reason=reason)
    receipt.write(run / GATE_RECEIPT)
    return receipt


def describe(result: GateResult) -> str:
    """One line: `metric = value >= threshold` when met, `metric = value < threshold required (...)` when not."""
    got = "missing" if result.value is None else f"{result.value:.3f}"
    metric = GATES[result.gate][0]
    if result.passed:
        return f"{metric} = {got} >= {result.threshold:.3f} ({result.gate})"
    return f"{metric} = {got} < {result.threshold:.3f} required ({result.gate}; {result.source})"


def summary_lines(results: list[GateResult]) -> list[str]:
    """What a command prints after the gates: one line a gate (`ok` or `warn`), then the verdict."""
    lines = [f"{'ok  ' if r.passed else 'warn'} {describe(r)}" for r in results]
    missed = sum(not r.passed for r in results)
    if missed:
        lines.append(f"{missed} of {len(results)} gate(s) not met, not enforced (MENS_EVAL_STRICT/VOX_EVAL_STRICT=0)")
    else:
        lines.append(f"all {len(results)} gate(s) passed")
    return lines
