"""The Vox lab model: pretrains from scratch on CPU, its loss falls, it saves as a plain HF directory."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from mens.train.pretrain import PretrainConfig, pretrain  # noqa: E402

PROGRAM = """fn add(a: int, b: int) to int {
    return a + b
}

type Point {
    x: float
    y: float
}

@test
fn adds() {
    assert(add(1, 2) == 3)
}
"""


def test_lab_model_learns_and_loads_with_auto_classes(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"p{i}.vox").write_text(PROGRAM.replace("add", f"add{i}"))
    cfg = PretrainConfig(steps=60, seq_len=64, batch_size=8, d_model=32, n_layers=2, n_heads=2, sample_tokens=40)
    summary = pretrain([src], tmp_path / "lab", cfg)
    assert summary["final_loss"] < 0.5 * summary["initial_loss"]
    assert 0.0 <= summary["parse_share"] <= 1.0 and len(summary["samples"]) == 10
    out = tmp_path / "lab"
    assert json.loads((out / "pretrain_summary.json").read_text())["tokens"] == summary["tokens"]
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok) == 133
    events = [json.loads(line)["event"] for line in (out / "telemetry.jsonl").read_text().splitlines()]
    assert events.count("step") == 60 and "eval" in events
