"""The original's post-train benchmark gate through `mens train`: VOX_BENCHMARK=1 runs the held-out benchmark
without --gate; VOX_BENCHMARK_MIN_PASS_RATE is its pass@1 floor; VOX_EVAL_STRICT=0 records a miss, exit 0."""

from __future__ import annotations

import json

import pytest

from mens.cli.main import app
from mens.errors import GateFailed


def _bench(tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"id": "t0", "category": "fn", "prompt": "write f0",
                                 "expect": {"decls": [["fn", "f0"]]}}) + "\n")
    return str(bench)


def test_vox_benchmark_runs_the_gate_after_training(tmp_path, tiny_model_dir, data_dir, monkeypatch, capsys):
    for name in ("MENS_EVAL_STRICT", "MENS_EVAL_MIN_PASS_AT_1", "MENS_BENCHMARK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VOX_BENCHMARK", "1")
    monkeypatch.setenv("VOX_BENCHMARK_MIN_PASS_RATE", "0.99")  # a 1-step tiny model passes nothing
    monkeypatch.setenv("VOX_EVAL_STRICT", "0")
    out = tmp_path / "run"
    args = ["train", "--data-dir", str(data_dir), "--output-dir", str(out), "--model", str(tiny_model_dir),
            "--backend", "lora", "--device", "cpu", "--max-steps", "1", "--gate-bench", _bench(tmp_path),
            "--gate-limit", "1"]
    assert app(args=args, standalone_mode=False) == 0
    assert "gates not met" in capsys.readouterr().out
    gate = json.loads((out / "gate_receipt.json").read_text())
    assert gate["overall_passed"] is False and gate["gates"][0]["gate"] == "min_pass_at_1"
    monkeypatch.setenv("VOX_EVAL_STRICT", "1")  # the same miss now blocks
    with pytest.raises(GateFailed, match="pass_at_1"):
        app(args=[*args[:4], str(tmp_path / "run2"), *args[5:]], standalone_mode=False)
