"""`mens train --gate`: evaluate the run, check the gates, record the verdict in the gate receipt."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from mens.errors import GateFailed  # noqa: E402
from mens.evaluate.after_train import gate_after_training  # noqa: E402


def _bench(tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(json.dumps({"id": f"t{i}", "category": "fn", "prompt": f"write f{i}",
                                           "expect": {"decls": [["fn", f"f{i}"]]}}) for i in range(2)) + "\n")
    return str(bench)


def _receipt(run) -> dict:
    return json.loads((run / "gate_receipt.json").read_text())


def test_gate_verdict_is_recorded_in_the_receipt_and_the_manifest_is_left_as_trained(tmp_path, make_tiny_run):
    _, run, _ = make_tiny_run("lora")
    passing = tmp_path / "pass.yaml"
    passing.write_text("min_parse_rate: 0.0\n")
    manifest = (run / "training_manifest.json").read_bytes()
    verdict = gate_after_training(run, passing, bench=_bench(tmp_path), language="python", max_new_tokens=4,
                                  device="cpu")
    assert verdict["passed"] is True
    assert _receipt(run)["overall_passed"] is True and _receipt(run)["report"] == "benchmark_results.json"
    failing = tmp_path / "fail.yaml"
    failing.write_text("min_pass_at_1: 0.5\nmin_gain_over_base: 0.1\n")
    with pytest.raises(GateFailed, match="pass_at_1"):
        gate_after_training(run, failing, bench=_bench(tmp_path), language="python", max_new_tokens=4, device="cpu")
    gate = _receipt(run)
    assert gate["overall_passed"] is False and "pass_at_1" in gate["reason"] and len(gate["gates"]) == 2
    assert (run / "training_manifest.json").read_bytes() == manifest
    assert "base" in json.loads((run / "benchmark_results.json").read_text())  # gain gate => base compared


def test_benchmark_from_the_environment_alone(tmp_path, make_tiny_run, monkeypatch):
    """The original's VOX_BENCHMARK=1 with no gate file: the benchmark runs; with VOX_BENCHMARK_MIN_PASS_RATE and
    VOX_EVAL_STRICT=0 a miss is recorded, not raised."""
    from mens.evaluate.after_train import benchmark_requested

    assert benchmark_requested({"VOX_BENCHMARK": "1"}) and not benchmark_requested({"VOX_BENCHMARK": "0"})
    _, run, _ = make_tiny_run("lora")
    for name in ("VOX_BENCHMARK_MIN_PASS_RATE", "MENS_EVAL_MIN_PASS_AT_1", "VOX_EVAL_STRICT", "MENS_EVAL_STRICT"):
        monkeypatch.delenv(name, raising=False)
    verdict = gate_after_training(run, None, bench=_bench(tmp_path), language="python", max_new_tokens=4,
                                  device="cpu")
    assert verdict["passed"] is True and verdict["gates"] == [] and (run / "benchmark_results.json").is_file()
    assert _receipt(run)["policy"] == "none" and _receipt(run)["overall_passed"] is True
    monkeypatch.setenv("VOX_BENCHMARK_MIN_PASS_RATE", "0.5")
    monkeypatch.setenv("VOX_EVAL_STRICT", "0")
    verdict = gate_after_training(run, None, bench=_bench(tmp_path), language="python", max_new_tokens=4,
                                  device="cpu")
    assert verdict["passed"] is False and "not enforced" in verdict["reason"]
    assert _receipt(run)["overall_passed"] is False and _receipt(run)["enforced"] is False
