"""Where a CPU training step of dogfood's recipe spends its time, against what the CPU's matmuls can do.

The question it answers: how much faster could the cpu preset train on this CPU without changing the work? It
trains dogfood's recipe (`--preset cpu`, dogfood's system prompt, the training file of a dogfood run) for a few
steps under torch.profiler and reports, over the profiled steps: seconds a step, tokens a step, the share of the
step's CPU time in matrix multiplies (aten::mm/addmm/bmm) and the rate those reached (the profiler's FLOP counts over
their time), next to the rate of a plain matmul of the recipe's largest shape ([tokens a step] x hidden x MLP width,
576 x 1536 on SmolLM2-135M: the MLP projection) timed on its own. A step whose time is nearly all matmul at nearly
the plain rate can only get faster by doing less work (fewer tokens, fewer layers in the backward pass) or cheaper
arithmetic (bf16 where native).

Runs on the allocator mens' training commands use (mimalloc where installed; mens/train/allocator.py). The validation
split is turned off (`eval.val_fraction=0`) so that no validation pass lands in the profiled steps; `--autocast
off` takes the f32 path, and with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 in the environment a bf16 CPU
takes an AVX2-only CPU's path (the record names the caps).

Run:  python bench/cpu_step_profile.py --data RUN/data/train.jsonl [--model M] [--steps 8] [--autocast bf16|off]
      [--lora-layers N] [--output PATH]      (writes bench/results/cpu_step_profile-<host>.json by default)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from machine import REPO, machine

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


def plain_matmul_rate(m: int, k: int, n: int, dtype, seconds: float = 1.0) -> float:
    """GFLOP/s of one [m, k] @ [k, n] matmul repeated for about `seconds` (after 3 untimed calls)."""
    import torch

    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        a @ b
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ b
        calls += 1
    return 2 * m * k * n * calls / (time.perf_counter() - t0) / 1e9


def mlp_shape(model: str) -> tuple[int, int]:
    """(hidden width, MLP width) of `model`: its largest projection, the MLP's up projection."""
    from transformers import AutoConfig

    from mens.model.load import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model)[0])
    return config.hidden_size, config.intermediate_size


def profile_steps(data: Path, model: str, steps: int, first_profiled: int, autocast: str, lora_layers: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mens.dogfood.pipeline import SHORT_SYSTEM_PROMPT
    from mens.train import loop
    from mens.train.resolve import resolve_config
    from mens.train.run import autocast_dtype, run_training

    out = Path(tempfile.mkdtemp(prefix="mens-step-profile-")) / "run"
    overrides = {"model.autocast": autocast, "eval.val_fraction": 0.0, "adapter.lora_layers": lora_layers}
    tc = resolve_config(overrides=overrides, flags={"data": str(data), "output_dir": str(out),
                                                    "model": model, "device": "cpu", "seed": 0,
                                                    "system_prompt": SHORT_SYSTEM_PROMPT})
    tc.max_steps, tc.eval_every, tc.save_every, tc.log_every_s = steps, 0, 0, 3600.0
    prof = profile(activities=[ProfilerActivity.CPU], with_flops=True)
    passes = {"n": 0, "t0": None}
    accumulate = loop.accumulate_gradients

    def counted(*args, **kwargs):  # the profiler starts with the first profiled step's forward pass
        passes["n"] += 1
        if passes["n"] == first_profiled:
            prof.start()
            passes["t0"] = time.perf_counter()
        return accumulate(*args, **kwargs)

    loop.accumulate_gradients = counted
    try:
        summary = run_training(tc)
    finally:
        loop.accumulate_gradients = accumulate
    wall = time.perf_counter() - passes["t0"]
    prof.stop()
    events = [json.loads(ln) for ln in (out / "telemetry.jsonl").read_text().splitlines()]
    profiled = [e for e in events if e.get("event") == "step"][first_profiled - 1:]
    tokens = sum(e["tokens"] for e in profiled) / len(profiled)
    ops = prof.key_averages()
    total_us = sum(e.self_cpu_time_total for e in ops) or 1.0
    mm = [e for e in ops if e.key in MATMUL_OPS]
    mm_us = sum(e.self_cpu_time_total for e in mm)
    mm_flops = sum(e.flops or 0 for e in mm)
    top = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return {"steps_profiled": len(profiled), "step_s": round(wall / len(profiled), 3),
            "tokens_per_step": round(tokens, 1), "matmul_dtype": autocast_dtype(autocast, "cpu", "lora") or "f32",
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "matmul_share": round(mm_us / total_us, 4),
            "matmul_gflop_per_step": round(mm_flops / 1e9 / len(profiled), 1),
            "matmul_gflops": round(mm_flops / (mm_us / 1e6) / 1e9, 1) if mm_us else None,
            "top_ops": [{"name": e.key[:80], "share": round(e.self_cpu_time_total / total_us, 4)} for e in top],
            "train_summary": {k: summary.get(k) for k in ("tokens_per_s", "steps", "train_time_s")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="A dogfood run's data/train.jsonl.")
    ap.add_argument("--model", default="smollm2-135m", help="Base model, as `mens train --model` takes it "
                                                             "(default: dogfood's, smollm2-135m).")
    ap.add_argument("--steps", type=int, default=8, help="Optimizer steps trained (default 8).")
    ap.add_argument("--first-profiled", type=int, default=3, help="First profiled step (earlier ones warm up).")
    ap.add_argument("--autocast", default="bf16", choices=("bf16", "off"),
                    help="bf16: the cpu preset as it is (bf16 where native); off: the f32 path.")
    ap.add_argument("--lora-layers", type=int, default=0, help="Adapt only the top N layers (0: all).")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/cpu_step_profile-<host>.json).")
    a = ap.parse_args()
    if not a.data.is_file():
        sys.exit(f"--data {a.data}: no such file; pass a dogfood run's data/train.jsonl")
    if not 1 <= a.first_profiled <= a.steps:
        sys.exit(f"--first-profiled {a.first_profiled}: expected 1..--steps ({a.steps})")
    from mens.train.allocator import preload_env

    env = preload_env(os.environ)
    if env is not None:  # run on the training commands' allocator, as dogfood's training does
        os.execvpe(sys.executable, [sys.executable, *sys.argv], env)

    import torch

    run = profile_steps(a.data, a.model, a.steps, a.first_profiled, a.autocast, a.lora_layers)
    m, (k, n) = int(run["tokens_per_step"]), mlp_shape(a.model)
    plain = {"shape": [m, k, n], "f32_gflops": round(plain_matmul_rate(m, k, n, torch.float32), 1),
             "bf16_gflops": round(plain_matmul_rate(m, k, n, torch.bfloat16), 1)}
    record = {"bench": "cpu_step_profile", "machine": machine(), "allocator": os.environ.get("LD_PRELOAD", "system"),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "data": str(a.data), "model": a.model,
              "lora_layers": a.lora_layers, "run": run, "plain_matmul": plain,
              "note": "matmul_gflops: the rate of the step's own matmuls (profiler FLOPs over their self time); "
                      "plain_matmul: one matmul of the MLP projection's shape at the step's token count, alone"}
    out = a.output or REPO / "bench" / "results" / f"cpu_step_profile-{socket.gethostname()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: run[k] for k in ("step_s", "tokens_per_step", "matmul_share", "matmul_gflops")}), plain)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
