"""torch's CPU attention kernel in bf16 against f32, by example length: what `F32_ATTENTION_MAX_TOKENS` rests on.

The question it answers: for one example of n tokens, how long do the forward and backward passes of
`scaled_dot_product_attention` (causal, grouped-query heads as SmolLM2-135M has them: 9 query and 3 key heads of
64) take with bf16 inputs and with f32 ones? Each length is timed in both dtypes, alternating, the median of the
repeats after 3 untimed calls. mens.train.segment_attention attends an example in f32 under bf16 autocast where
f32 is not slower.

Run:  python bench/cpu_attention_dtype.py [--lengths 16,32,...] [--repeats 30] [--output PATH]
      (writes bench/results/cpu_attention_dtype-<host>.json by default)
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from pathlib import Path

from machine import REPO, machine

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def time_one(n: int, dtype, repeats: int) -> float:
    """Median microseconds of forward + backward over one n-token example."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(n)
    q = torch.randn(1, HEADS, n, HEAD_DIM, generator=g).to(dtype).requires_grad_(True)
    k, v = (torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=g).to(dtype).requires_grad_(True) for _ in range(2))
    grad = torch.randn(1, HEADS, n, HEAD_DIM, generator=g).to(dtype)
    times = []
    for _ in range(repeats + 3):
        t0 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(grad)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:]) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="16,32,64,96,128,192,256,384,512,768",
                    help="Example lengths in tokens, comma-separated.")
    ap.add_argument("--repeats", type=int, default=30, help="Timed calls per length and dtype (default 30).")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/cpu_attention_dtype-<host>.json).")
    a = ap.parse_args()
    import torch

    rows = []
    for n in (int(x) for x in a.lengths.split(",")):
        bf16_us, f32_us = time_one(n, torch.bfloat16, a.repeats), time_one(n, torch.float32, a.repeats)
        rows.append({"tokens": n, "bf16_us": round(bf16_us), "f32_us": round(f32_us),
                     "bf16_over_f32": round(bf16_us / f32_us, 2)})
        print(json.dumps(rows[-1]))
    record = {"bench": "cpu_attention_dtype", "machine": machine(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "heads": [HEADS, KV_HEADS, HEAD_DIM], "repeats": a.repeats, "rows": rows,
              "note": "median microseconds of forward + backward of causal sdpa over one example; bf16_over_f32 "
                      "above 1 means f32 is faster"}
    out = a.output or REPO / "bench" / "results" / f"cpu_attention_dtype-{socket.gethostname()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
