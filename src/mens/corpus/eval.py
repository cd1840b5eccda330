"""`mens corpus eval`: parse rate, non-empty parse rate, construct and feature coverage and category counts of a
train file.

A row counts as parsing only when its code parses; it counts as *non-empty* parsing when it also declares
something (empty or comment-only text parses but is not code). Feature coverage counts, for each keyword and
decorator of the language, the samples whose parsing code uses it (`feature_counts`; `features_missing`: those no
sample uses). Optional gates in the eval-gates.yaml format fail with GateFailed (exit 1).
Run: `mens corpus eval train.jsonl -o eval_results.json --gates g.yaml`.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

from mens.corpus.atomic import write_text_atomic
from mens.corpus.frontend import resolve_language
from mens.corpus.jsonl import read_objects, require_input
from mens.corpus.normalize import code_in_response
from mens.corpus.progress import track
from mens.corpus.records import BadLine
from mens.corpus.safe_yaml import load_yaml_file
from mens.errors import ConfigError, GateFailed

SAFETY_PHRASES = ("ignore previous instructions", "ignore all above", "disregard your instructions",
                  "you are now", "new instructions:")
NON_CODE_LANES = {"vox_tooling", "vox_docs_qa", "vox_speech", "vox_research_expert"}


def _answer(row: dict) -> str | None:
    """The text to check: a unit's code, the last message's content, or the response; None when the row has
    none of these with the right type."""
    if "code" in row:
        return row["code"] if isinstance(row["code"], str) else None
    msgs = row.get("messages")
    if msgs:
        last = msgs[-1] if isinstance(msgs, list) else None
        content = last.get("content") if isinstance(last, dict) else None
        return content if isinstance(content, str) else None
    text = row.get("response") or row.get("output") or ""
    return text if isinstance(text, str) else None


def evaluate_file(inp: Path, language: str | None = None) -> dict:
    """The eval results for a train/validated JSONL (see module docstring)."""
    inp = require_input(inp, "eval")
    lang = resolve_language(language)
    cats, kinds, bad_by, features = Counter(), Counter(), Counter(), Counter()
    n = n_bad = n_valid = n_unsafe = n_code = n_parse = n_nonempty = 0
    with track("eval") as advance:
        for _, row in read_objects(inp):
            advance(1)
            n += 1
            text = None if isinstance(row, BadLine) else _answer(row)
            if text is None:
                n_bad += 1
                bad_by[row.reason.split(":", 1)[0] if isinstance(row, BadLine) else "no_text"] += 1
                continue
            cats[str(row.get("category", "general"))] += 1
            n_valid += bool(text.strip())
            n_unsafe += any(p in text.lower() for p in SAFETY_PHRASES)
            lane = row.get("lane")
            if (isinstance(lane, str) and lane in NON_CODE_LANES) or row.get("category") == "tool_trace":
                continue
            n_code += 1
            code = code_in_response(text, lang.fence_tags)
            res = lang.parse(code)
            n_parse += res.ok
            n_nonempty += res.has_code
            kinds.update(lang.base_kind(k) for k, _ in res.decls)
            if res.ok:  # a sample counts for the keywords and decorators it uses when its code parses
                features.update(lang.features(code))
    present = sorted(k for k in kinds if k in lang.construct_kinds)
    rate = n_parse / n_code if n_code else 0.0
    return {
        "run_id": f"eval_{int(time.time())}", "input": str(inp), "language": lang.name,
        "total_samples": n, "bad_lines": n_bad, "bad_by_reason": dict(sorted(bad_by.items())),
        "code_samples": n_code,
        "format_validity": n_valid / n if n else 0.0, "safety_rejection_rate": n_unsafe / n if n else 0.0,
        "parse_rate": rate, "nonempty_parse_rate": n_nonempty / n_code if n_code else 0.0,
        f"{lang.name}_parse_rate": rate,
        "construct_coverage": len(present), "construct_total": len(lang.construct_kinds),
        "construct_coverage_pct": 100.0 * len(present) / len(lang.construct_kinds),
        "constructs_present": present, "constructs_missing": sorted(set(lang.construct_kinds) - set(present)),
        "construct_counts": dict(sorted(kinds.items())),
        "feature_coverage": sum(1 for f in lang.feature_kinds if features[f]), "feature_total": len(lang.feature_kinds),
        "features_missing": [f for f in lang.feature_kinds if not features[f]],
        "feature_counts": {f: features[f] for f in lang.feature_kinds if features[f]},
        "per_category": dict(cats.most_common()),
        "quality_proxy": rate,
    }


def _pct(value: float) -> float:
    """Gate coverage thresholds: values <= 1 are fractions (upstream writes 0.35 for 35%)."""
    return value * 100.0 if value <= 1.0 else value


def _threshold(gate: dict, key: str, where: str) -> float | None:
    """A gate's number (None when unset); ConfigError naming the key and the value otherwise."""
    value = gate.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}.{key} = {value!r}: expected a finite number; fix the gates file")
    return float(value)


def check_gates(results: dict, gates_path: Path) -> list[str]:
    """Failures of the eval-gates.yaml thresholds that apply to corpus eval (`eval_local`, `corpus`)."""
    policy = load_yaml_file(gates_path) or {}
    if not isinstance(policy, dict):
        raise ConfigError(f"{gates_path}: expected a mapping of gate sections, got {type(policy).__name__}")
    failures = []
    for section in ("eval_local", "corpus"):
        gate = policy.get(section)
        if not isinstance(gate, dict) or gate.get("block") is False:
            continue
        need = {k: _threshold(gate, k, f"{gates_path}: {section}") for k in
                ("min_parse_rate", "min_nonempty_parse_rate", "min_coverage_pct", "min_rows")}
        if need["min_coverage_pct"] is not None:
            need["min_coverage_pct"] = _pct(need["min_coverage_pct"])
        checks = [("min_parse_rate", results["parse_rate"]),
                  ("min_nonempty_parse_rate", results["nonempty_parse_rate"]),
                  ("min_coverage_pct", results["construct_coverage_pct"]), ("min_rows", results["total_samples"])]
        for key, seen in checks:
            if need[key] is not None and seen < need[key]:
                failures.append(f"{key}: {seen:.4g} < {need[key]:.4g} required ({gates_path}: {section}.{key})")
    return failures


def eval_to_file(inp: Path, out: Path, gates: Path | None = None, language: str | None = None) -> dict:
    """Evaluate, write `out`, then raise GateFailed when a gate fails (the results are written first)."""
    results = evaluate_file(inp, language)
    failures = check_gates(results, gates) if gates else []
    results["gates"] = {"file": str(gates) if gates else None, "passed": not failures, "failures": failures}
    write_text_atomic(out, json.dumps(results, indent=2) + "\n")
    if failures:
        raise GateFailed(f"{len(failures)} corpus gate(s) failed: {'; '.join(failures)}. Report: {out}")
    return results
