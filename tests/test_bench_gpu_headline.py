"""bench/gpu_headline.py in its CPU mode (`--tiny --device cpu`): the headline job's code path end to end, in the
default run so CI covers what a device call runs (the GPU adds only the memory cap and the CUDA peaks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_tiny_headline_trains_every_projection_on_real_rows(tmp_path):
    out = tmp_path / "headline.json"
    cmd = [sys.executable, str(BENCH / "gpu_headline.py"), "--tiny", "--device", "cpu", "--steps", "2",
           "--workdir", str(tmp_path / "w"), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["train"]["exit_code"] == 0 and doc["preset"] == "qwen_4080_16g"
    run = doc["run"]
    assert run["config"]["backend"] == "qlora" and run["config"]["seq_len"] == 384
    # 3 linear-attention layers x 8 projections + 1 full-attention layer x 7: every projection of every layer
    assert run["adapted_modules"] == 31 and run["adapter"]["left_out"] == []
    assert run["packing"]["mode"] in ("unpacked", "varlen")  # never a refusal
    # rows of the synthetic text, not of chat markers alone: 2 steps x 8 rows, most of them near 384 tokens
    assert run["total_tokens"] >= 0.5 * 2 * 8 * 384, run["total_tokens"]
    assert doc["probe_estimate_16gb"]["preset"] == "qwen_4080_16g" and doc["probe_estimate_16gb"]["fits"]
