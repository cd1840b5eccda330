"""bench/cpu_attention_dtype.py and bench/int8_matmul_speed.py: small runs write records that name the machine and
whose ratios are the times they report; the int8 pair computes the f32 pair's products to int8 rounding."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))


def _run(script: str, *args: str) -> None:
    subprocess.run([sys.executable, str(BENCH / script), *args], check=True, capture_output=True, timeout=300)


def test_attention_dtype_times_each_length_in_both_dtypes(tmp_path):
    out = tmp_path / "attn.json"
    _run("cpu_attention_dtype.py", "--lengths", "16,48", "--repeats", "2", "--output", str(out))
    doc = json.loads(out.read_text())
    assert doc["bench"] == "cpu_attention_dtype" and doc["machine"]["cpu"] and "native_bf16" in doc["machine"]
    assert [r["tokens"] for r in doc["rows"]] == [16, 48] and doc["repeats"] == 2
    for r in doc["rows"]:
        assert r["bf16_us"] > 0 and r["f32_us"] > 0
        # the record rounds both times to whole microseconds and the ratio (of the unrounded times) to 0.01: the
        # ratio of the rounded times can differ by up to 0.5 * (1 + ratio) / f32_us, plus the ratio's own 0.005
        ratio = r["bf16_over_f32"]
        assert ratio == pytest.approx(r["bf16_us"] / r["f32_us"], abs=0.006 + 0.5 * (1 + ratio) / (r["f32_us"] - 0.5))


def test_the_int8_pair_matches_f32_to_int8_rounding_and_a_run_records_every_shape(tmp_path):
    torch = pytest.importorskip("torch")
    import int8_matmul_speed as bench

    g = torch.Generator().manual_seed(0)
    x, dy, w = torch.randn(32, 64, generator=g), torch.randn(32, 48, generator=g), torch.randn(48, 64, generator=g)
    q, scale = bench.per_row_int8(x)
    assert q.dtype == torch.int8 and q.abs().max() == 127  # each row's largest entry maps to 127
    assert torch.allclose(q.float() * scale, x, atol=float(scale.max()) / 2 + 1e-6)
    w_scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    w8 = torch.round(w / w_scale[:, None]).to(torch.int8)
    (y, dx), (yq, dxq) = bench.f32_pair(x, dy, w), bench.int8_pair(x, dy, w8.t().contiguous(), w8, w_scale)
    for ref, got in ((y, yq), (dx, dxq)):
        rel = float((got - ref).norm() / ref.norm())
        assert 0 < rel < 0.02  # int8 on both sides: about 1% off, never exact and never a different product

    out = tmp_path / "int8.json"
    _run("int8_matmul_speed.py", "--tokens", "32", "--rounds", "2", "--reps", "1", "--output", str(out))
    doc = json.loads(out.read_text())
    assert doc["bench"] == "int8_matmul_speed" and doc["cpu"] and doc["tokens"] == 32
    assert [s["projection"] for s in doc["shapes"]] == list(bench.SHAPES)
    for s in doc["shapes"]:
        assert all(len(v) == 2 for v in s["ms_forward_and_input_grad"].values())
        assert all(0 < e < 0.05 for e in s["relative_error"].values())
    assert doc["layer_speedup"] == pytest.approx(doc["layer_ms"]["f32"] / doc["layer_ms"]["int8"], rel=0.1, abs=0.05)
