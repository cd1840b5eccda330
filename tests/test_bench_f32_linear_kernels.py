"""bench/f32_linear_kernels.py: both paths compute the same layer (to f32 rounding), and the record names the
machine, every round and the thread rates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_a_small_run_writes_a_record_whose_two_paths_agree(tmp_path):
    out = tmp_path / "f32.json"
    subprocess.run([sys.executable, str(BENCH / "f32_linear_kernels.py"), "--tokens", "16", "--rounds", "2",
                    "--reps", "1", "--output", str(out)], check=True, capture_output=True, timeout=300)
    doc = json.loads(out.read_text())
    assert doc["bench"] == "f32_linear_kernels" and doc["cpu"] and "native_bf16" in doc
    assert set(doc["layer_ms"]) == {"default", "onednn_packed"} and all(len(v) == 2 for v in doc["layer_ms"].values())
    assert doc["max_relative_difference"] < 1e-4  # the same products, summed in another order
    assert doc["speedup_median"] > 0 and "1" in doc["default_matmul_gflops_by_threads"]
