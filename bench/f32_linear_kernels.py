"""Could the f32 training path's frozen projections run faster through oneDNN than through torch's default matmul?

On a CPU without native bf16 the cpu preset trains in f32, and three quarters of a step is matmuls of the frozen base
weights (bench/results/cpu_step_profile-avx2cap-f32-vm.json): their forward (x @ W^T) and input gradient (dy @ W).
torch sends an f32 `x @ w.t()` to its BLAS (MKL in the PyPI wheels); oneDNN, also inside torch, has its own kernels
for a linear layer with a weight packed once into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`,
`torch.ops.mkldnn._linear_pointwise`, what torch.compile's CPU freezing uses). This times one decoder layer's
projections of SmolLM2-135M (forward and input gradient) both ways at a step's token count, alternating rounds, and
the default matmul's rate on 1 thread and on all of torch's threads (how much a second core adds on this machine).
Nothing in mens uses oneDNN's path: this says whether it would be worth building, per CPU.
Writes bench/results/f32-linear-kernels-<host>.json.
Run: `python bench/f32_linear_kernels.py [--tokens 955] [--rounds 6] [--reps 10] [--output PATH]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from machine import REPO, machine

SHAPES = [(576, 576)] * 2 + [(576, 192)] * 2 + [(576, 1536)] * 2 + [(1536, 576)]
"""(in, out) of the seven projections of one SmolLM2-135M decoder layer: q, o, k, v, gate, up, down."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=955, help="Rows of each matmul (dogfood's tokens a step).")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=10, help="Layer passes timed per round.")
    ap.add_argument("--output", type=Path)
    args = ap.parse_args()

    import torch

    gen = torch.Generator().manual_seed(0)
    xs = {k: torch.randn(args.tokens, k, generator=gen) for k in {k for k, _ in SHAPES}}
    ws = [torch.randn(n, k, generator=gen) * k**-0.5 for k, n in SHAPES]
    dys = [torch.randn(args.tokens, n, generator=gen) for _, n in SHAPES]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, args.tokens) for w in ws]
    packed_t = [torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), args.tokens) for w in ws]
    linear = torch.ops.mkldnn._linear_pointwise

    def default_layer():
        return [(xs[k] @ w.t(), dy @ w) for (k, _), w, dy in zip(SHAPES, ws, dys, strict=True)]

    def onednn_layer():
        return [(linear(xs[k], p, None, "none", [], ""), linear(dy, pt, None, "none", [], ""))
                for (k, _), p, pt, dy in zip(SHAPES, packed, packed_t, dys, strict=True)]

    # the two paths sum in different orders: their largest difference, relative to each output's largest value
    outputs = [(a, b) for pa, pb in zip(default_layer(), onednn_layer(), strict=True)
               for a, b in zip(pa, pb, strict=True)]
    worst = max(float((b - a).abs().max() / a.abs().max()) for a, b in outputs)

    def timed_ms(fn) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            fn()
        return (time.perf_counter() - t0) / args.reps * 1000

    arms = {"default": default_layer, "onednn_packed": onednn_layer}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.rounds):
        for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            times[name].append(round(timed_ms(arms[name]), 2))
    flop = 2 * 2 * args.tokens * sum(k * n for k, n in SHAPES)  # forward and input gradient

    big_x, big_w = xs[576], ws[4]  # the gate projection's shape
    threads = torch.get_num_threads()
    rates = {}
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        rates[str(n)] = round(2 * args.tokens * 576 * 1536 / (min(timed_ms(lambda: big_x @ big_w.t())
                                                                     for _ in range(args.rounds)) / 1000) / 1e9, 1)
    torch.set_num_threads(threads)

    med = {name: statistics.median(v) for name, v in times.items()}
    doc = {"bench": "f32_linear_kernels", **machine(), "torch": torch.__version__, "torch_threads": threads,
           "tokens": args.tokens, "rounds": args.rounds, "reps": args.reps,
           "layer_ms": times, "layer_ms_median": med,
           "layer_gflops_median": {name: round(flop / (ms / 1000) / 1e9, 1) for name, ms in med.items()},
           "speedup_median": round(med["default"] / med["onednn_packed"], 2),
           "max_relative_difference": worst,
           "default_matmul_gflops_by_threads": rates,
           "note": "one SmolLM2-135M decoder layer's seven projections, forward (x @ W^T) and input gradient "
                   "(dy @ W) each, f32; default = torch's matmul (its BLAS), onednn_packed = oneDNN's linear with the "
                   "weight and its transpose packed once; rounds alternate; by_threads: the gate projection's forward "
                   "alone, best round"}
    path = args.output or REPO / "bench" / "results" / f"f32-linear-kernels-{doc['host']}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: doc[k] for k in ("layer_ms_median", "speedup_median", "default_matmul_gflops_by_threads")}))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
