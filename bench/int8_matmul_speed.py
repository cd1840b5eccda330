"""Would int8 frozen-weight matmuls make the f32 training path faster? One decoder layer's worth, without training.

On a CPU without native bf16 the cpu preset trains in f32, and three quarters of a step is matmuls running near
the f32 peak (bench/results/cpu_step_profile-avx2cap-f32-vm.json), so only less work or cheaper arithmetic makes a
step faster. The frozen base weights could be int8 (per output channel), with the activations and the incoming
gradients quantized per row on the fly (`torch._int_mm`, which follows the oneDNN ISA cap): this times the forward
(x @ W^T) and the input gradient (dy @ W) of SmolLM2-135M's projection shapes at a step's token count, f32 against
int8 with its quantize and dequantize, alternating (`--rounds`), and reports each one's error against f32.
Writes bench/results/int8-matmul-<host>.json.
Run: `python bench/int8_matmul_speed.py [--tokens 955] [--rounds 3] [--output PATH]`.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

from machine import REPO, machine

SHAPES = {"q_proj, o_proj": (576, 576, 2), "k_proj, v_proj": (576, 192, 2), "gate_proj, up_proj": (576, 1536, 2),
          "down_proj": (1536, 576, 1)}
"""(in, out, how many in a layer) of SmolLM2-135M's decoder-layer projections."""


def per_row_int8(x):
    """int8 rows and their scales (absmax / 127 per row)."""
    import torch

    scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    return torch.round(x / scale).to(torch.int8), scale


def f32_pair(x, dy, w):
    """Forward and input gradient of a frozen linear layer in f32."""
    return x @ w.t(), dy @ w


def int8_pair(x, dy, w8_t, w8_n, w_scale):
    """The same with int8 weights (per output channel) and per-row int8 activations and gradients."""
    import torch

    x8, sx = per_row_int8(x)
    y = torch._int_mm(x8, w8_t).to(torch.float32) * sx * w_scale
    d8, sd = per_row_int8(dy * w_scale)  # W's scale runs along dy's columns (the reduction): fold it in first
    return y, torch._int_mm(d8, w8_n).to(torch.float32) * sd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=955, help="Rows of each matmul (dogfood's tokens a step).")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20, help="Calls timed per round.")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/int8-matmul-<host>.json).")
    args = ap.parse_args()

    import torch

    def timed(fn) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            fn()
        return (time.perf_counter() - t0) / args.reps

    gen = torch.Generator().manual_seed(0)
    rows, layer = [], {"f32": 0.0, "int8": 0.0}
    for name, (k, n, count) in SHAPES.items():
        x, dy = torch.randn(args.tokens, k, generator=gen), torch.randn(args.tokens, n, generator=gen)
        w = torch.randn(n, k, generator=gen) * 0.02
        w_scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        w8 = torch.round(w / w_scale[:, None]).to(torch.int8)
        w8_t, w8_n = w8.t().contiguous(), w8.contiguous()

        f32 = functools.partial(f32_pair, x, dy, w)
        int8 = functools.partial(int8_pair, x, dy, w8_t, w8_n, w_scale)
        times = {"f32": [], "int8": []}
        for _ in range(args.rounds):
            times["f32"].append(timed(f32))
            times["int8"].append(timed(int8))
        (y, dx), (yq, dxq) = f32(), int8()
        med = {kind: statistics.median(v) for kind, v in times.items()}
        for kind in layer:
            layer[kind] += count * med[kind]
        rows.append({"projection": name, "in": k, "out": n, "per_layer": count,
                     "ms_forward_and_input_grad": {kind: [round(t * 1e3, 2) for t in v] for kind, v in times.items()},
                     "speedup_median": round(med["f32"] / med["int8"], 2),
                     "relative_error": {"forward": round(float((yq - y).norm() / y.norm()), 4),
                                        "input_grad": round(float((dxq - dx).norm() / dx.norm()), 4)}})
    doc = {"bench": "int8_matmul_speed", **machine(), "torch": torch.__version__,
           "torch_threads": torch.get_num_threads(), "tokens": args.tokens, "rounds": args.rounds, "reps": args.reps,
           "shapes": rows, "layer_ms": {k: round(v * 1e3, 2) for k, v in layer.items()},
           "layer_speedup": round(layer["f32"] / layer["int8"], 2),
           "note": "random activations and gradients (no outlier features); weights per output channel, activations "
                   "and gradients per row; times include quantizing and dequantizing"}
    path = args.output or REPO / "bench" / "results" / f"int8-matmul-{doc['host']}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"layer_ms": doc["layer_ms"], "layer_speedup": doc["layer_speedup"],
                      "per_shape": {r["projection"]: r["speedup_median"] for r in rows}}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
