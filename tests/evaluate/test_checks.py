"""Task checks, code extraction, pass@k and gates (no model needed; Python stands in for Vox)."""

from __future__ import annotations

import json
import sys

import pytest

from mens.errors import ConfigError, DataError, GateFailed
from mens.evaluate.bench import load_bench
from mens.evaluate.gates import check_gates, load_gate_thresholds
from mens.evaluate.passk import pass_at_k, wilson_interval
from mens.lang import get_language
from mens.lang.checks import Expect, check_output, header_signature
from mens.lang.extract import extract_code

PY = get_language("python")


def test_extract_prefers_tagged_fence_and_handles_truncation():
    out = "Sure!\n```python\nprint(1)\n```\nand\n```vox\nfn a() {}\n```\n"
    assert extract_code(out, ("vox",)) == "fn a() {}\n"
    assert extract_code("```vox\nfn a() {\n", ("vox",)) == "fn a() {\n"  # no closing fence
    assert extract_code("fn a() {}<|im_end|>junk", ("vox",)) == "fn a() {}\n"
    assert extract_code("   \n", ("vox",)) == ""


def test_header_signature_reads_params_and_return_type():
    code = "fn add(a: int, b: map[str, int] = {}) to Result[int, str] {\n return a\n}\n"
    assert header_signature(code, "add") == (["a: int", "b: map[str, int]"], "Result[int, str]")
    assert header_signature(code, "missing") is None
    # An extern fn's module path follows its return type; it is not part of it.
    assert header_signature('extern fn now() to int = "./clock"\n', "now") == ([], "int")


def test_check_output_passes_only_when_everything_asked_is_there():
    expect = Expect(kinds=["fn"], names=["add"], contains=["return"])
    ok = check_output("```python\ndef add(a, b):\n    return a + b\n```", expect, PY)
    assert ok.passed and ok.failures == []
    wrong_name = check_output("def plus(a, b):\n    return a + b\n", expect, PY)
    assert not wrong_name.passed and wrong_name.failure_category == "name"
    broken = check_output("def add(a, b)\n    return a\n", expect, PY)
    assert not broken.passed and broken.failure_category == "parse" and broken.first_diagnostic
    empty = check_output("# just a comment\n", expect, PY)
    assert not empty.passed and empty.failure_category == "empty"
    stub = check_output("def add(a, b):\n    return a  # TODO\n", expect, PY)
    assert stub.failure_category == "placeholder"


def test_check_output_decl_pairs_distinguish_kind_from_name():
    expect = Expect(decls=[("class", "Point")])
    res = check_output("def Point():\n    pass\n", expect, PY)
    assert res.failures[0][0] == "kind"


def test_pass_at_k_matches_closed_form():
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_wilson_interval():
    lo, hi = wilson_interval(55, 60)
    assert (round(lo, 3), round(hi, 3)) == (0.819, 0.964)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] <= 1.0
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_default_bench_is_valid_and_large_enough():
    tasks = load_bench()
    assert len(tasks) >= 100
    assert len({t.id for t in tasks}) == len(tasks)
    assert len({t.category for t in tasks}) >= 12
    heldout = [t for t in tasks if t.split == "heldout"]
    assert len(heldout) >= 40
    assert all(t.expect.kinds or t.expect.decls for t in tasks)


def test_manifest_bench_loads(tmp_path):
    (tmp_path / "spec.vox").write_text("fn main() {}\n")
    manifest = {"schema": "vox_mens_bench_manifest_v1", "benchmarks": [
        {"id": "t1", "category": "fn", "description": "adds two numbers", "file": "spec.vox",
         "semantic_expected_contains": ["fn add"]}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    [task] = load_bench(tmp_path)
    assert task.prompt.startswith("Write a Vox program that: adds two numbers")
    assert "```vox\nfn main() {}" in task.prompt
    assert task.expect.contains == ["fn add"]


def test_bad_bench_lines_are_reported_with_file_and_line(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text('{"id": "a", "prompt": "x"}\n{"id": "b"}\n')
    with pytest.raises(DataError, match=r"b.jsonl:2: prompt"):
        load_bench(p)


def _write_results(run, **metrics):
    (run / "benchmark_results.json").write_text(json.dumps({"metrics": metrics}))


def test_gates_pass_and_fail_as_configured(tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text("min_parse_rate: 0.8\nmin_pass_at_1: 0.5\n")
    _write_results(tmp_path, nonempty_parse_rate=0.9, pass_at_1=0.6)
    assert all(r.passed for r in check_gates(tmp_path, gates, env={}))
    receipt = json.loads((tmp_path / "gate_receipt.json").read_text())
    assert receipt["overall_passed"] is True
    _write_results(tmp_path, nonempty_parse_rate=0.9, pass_at_1=0.4)
    with pytest.raises(GateFailed, match=r"pass_at_1 = 0.400 < 0.500"):
        check_gates(tmp_path, gates, env={})
    assert json.loads((tmp_path / "gate_receipt.json").read_text())["overall_passed"] is False


def test_gate_thresholds_from_environment_and_errors(tmp_path):
    assert load_gate_thresholds(None, {"VOX_EVAL_MIN_PARSE_RATE": "0.7"}) == {"min_parse_rate": 0.7}
    both = {"VOX_EVAL_MIN_PARSE_RATE": "0.7", "MENS_EVAL_MIN_PARSE_RATE": "0.9"}
    assert load_gate_thresholds(None, both) == {"min_parse_rate": 0.9}
    with pytest.raises(ConfigError, match="not a number"):
        load_gate_thresholds(None, {"MENS_EVAL_MIN_GAIN": "lots"})
    bad = tmp_path / "g.yaml"
    bad.write_text("min_parse: 0.5\n")
    with pytest.raises(ConfigError, match="unknown gate"):
        load_gate_thresholds(bad, {})
    _write_results(tmp_path, pass_at_1=0.9)
    with pytest.raises(GateFailed, match="missing"):
        check_gates(tmp_path, None, env={"MENS_EVAL_MIN_GAIN": "0.3"})


def test_checking_imports_no_torch():
    import subprocess

    code = "import sys, mens.lang.checks, mens.evaluate.gates; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_original_gate_variables_warn_only_and_alias(tmp_path):
    """VOX_BENCHMARK_MIN_PASS_RATE is the original's pass@1 floor; VOX_EVAL_STRICT=0 turns a miss into a warning
    recorded in a receipt with the original's fields; MENS_EVAL_STRICT wins over it."""
    from mens.evaluate.gates import gates_strict, summary_lines

    assert load_gate_thresholds(None, {"VOX_BENCHMARK_MIN_PASS_RATE": "0.8"}) == {"min_pass_at_1": 0.8}
    both = {"VOX_BENCHMARK_MIN_PASS_RATE": "0.8", "MENS_EVAL_MIN_PASS_AT_1": "0.3"}
    assert load_gate_thresholds(None, both) == {"min_pass_at_1": 0.3}
    _write_results(tmp_path, pass_at_1=0.5)
    env = {"VOX_BENCHMARK_MIN_PASS_RATE": "0.8", "VOX_EVAL_STRICT": "0"}
    results = check_gates(tmp_path, None, env=env)  # no raise: warn-only
    assert [r.passed for r in results] == [False]
    receipt = json.loads((tmp_path / "gate_receipt.json").read_text())
    assert receipt["overall_passed"] is False and receipt["enforced"] is False and receipt["policy"] == "environment"
    gate = receipt["gates"][0]
    assert gate["name"] == "min_pass_at_1" and gate["block"] is False and "0.500 < 0.800" in gate["message"]
    assert {"timestamp_unix", "run_dir"} <= set(receipt)
    assert summary_lines(results)[0].startswith("warn pass_at_1 = 0.500 < 0.800")
    with pytest.raises(GateFailed, match="pass_at_1 = 0.500 < 0.800"):
        check_gates(tmp_path, None, env={**env, "MENS_EVAL_STRICT": "1"})
    assert gates_strict({}) is True and gates_strict({"VOX_EVAL_STRICT": "false"}) is False
    with pytest.raises(ConfigError, match="VOX_EVAL_STRICT='maybe'"):
        gates_strict({"VOX_EVAL_STRICT": "maybe"})
