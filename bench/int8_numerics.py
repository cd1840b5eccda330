"""What int8 frozen base projections change in a LoRA step: loss and adapter gradients against f32.

SmolLM2-135M with a finished dogfood run's adapter (so the adapters say something, as mid-training) on batches of
that run's own packed training rows: each variant's loss and LoRA gradient per batch against f32's on the same
batch, with the fused LoRA MLP and per-example attention as in training. Variants: every adapted projection in
int8 without smoothing; smoothed (mens.train.int8_base, 4 sample rows); smoothed with only the projections that
read the hidden width (`model.int8_base: auto`: the MLP's down projection stays f32); bf16 autocast for scale where
the CPU has native bf16. Writes bench/results/int8-numerics-<host>.json.
Run: `python bench/int8_numerics.py --dogfood-dir /tmp/w/run0 [--batches 12] [--output PATH]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import time
from pathlib import Path

from machine import REPO, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dogfood-dir", type=Path, required=True, help="a finished dogfood run (data/ and run/)")
    ap.add_argument("--batches", type=int, default=12, help="Batches of 2 packed rows compared.")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/int8-numerics-<host>.json).")
    args = ap.parse_args()

    import torch

    from mens.dogfood.pipeline import SHORT_SYSTEM_PROMPT
    from mens.model.load import load_base, load_tokenizer, resolve_model
    from mens.model.lora import attach_lora, load_adapter_weights
    from mens.train import int8_base
    from mens.train.data import build_rows, read_examples
    from mens.train.lora_mlp import fuse_lora_mlps
    from mens.train.packing import batch_loss_sum
    from mens.train.run import cpu_has_native_bf16
    from mens.train.segment_attention import bind_segment_attention

    model_dir, _ = resolve_model("smollm2-135m")
    tok = load_tokenizer(model_dir)
    exs, _, _ = read_examples(args.dogfood_dir / "data" / "train.jsonl", tok, seq_len=512, ce_last_k=0,
                              system_prompt=SHORT_SYSTEM_PROMPT, min_rating=3)
    rows = build_rows(exs, pack=True, seq_len=512)
    sample, rest = rows[:4], rows[4:]  # the rows training calibrates on, then others
    random.Random(0).shuffle(rest)
    batches = [rest[2 * i:2 * i + 2] for i in range(args.batches)]
    torch.manual_seed(0)
    model = attach_lora(load_base(model_dir, backend="lora", device="cpu"), r=16, alpha=32, dropout=0.0)
    load_adapter_weights(model, args.dogfood_dir / "run")
    f32 = contextlib.nullcontext
    bind_segment_attention(model, "cpu", f32, len(tok))
    params = [p for p in model.parameters() if p.requires_grad]

    def calibrate():
        for i in range(0, len(sample), 2):
            batch_loss_sum(model, sample[i:i + 2], 0, "cpu", f32)

    def measure(autocast) -> tuple[list, float]:
        out, t0 = [], time.perf_counter()
        for b in batches:
            model.zero_grad(set_to_none=True)
            loss, n = batch_loss_sum(model, b, 0, "cpu", autocast)
            loss.backward()
            out.append((float(loss.detach()) / n, torch.cat([p.grad.flatten() for p in params])))
        return out, time.perf_counter() - t0

    fused = fuse_lora_mlps(model, f32)
    ref, t_ref = measure(f32)
    hidden = model.config.hidden_size
    variants = {"int8, every projection, not smoothed": dict(calibrate=None, width=None),
                "int8, every projection, smoothed": dict(calibrate=calibrate, width=None),
                "int8, hidden-width projections, smoothed (model.int8_base: auto)": dict(calibrate=calibrate,
                                                                                          width=hidden)}
    results = []
    for name, kw in variants.items():
        swapped, kept = int8_base.bind(model, kw["calibrate"], width=kw["width"])
        got, t = measure(f32)
        int8_base.restore(swapped)
        results.append((name, {"projections_int8": len(swapped), "kept_f32": kept}, got, t))
    if cpu_has_native_bf16():
        got, t = measure(lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        results.append(("bf16 autocast (native), for scale", {}, got, t))
    again, _ = measure(f32)
    assert all(a[0] == b[0] for a, b in zip(ref, again, strict=True)), "restore did not give back the f32 model"

    rows_out = []
    for name, extra, got, t in results:
        shift = [abs(g[0] - r[0]) / r[0] for g, r in zip(got, ref, strict=True)]
        cos = [float(torch.nn.functional.cosine_similarity(g[1], r[1], dim=0)) for g, r in zip(got, ref, strict=True)]
        rows_out.append({"variant": name, **extra,
                         "loss_relative_change": {"median": round(statistics.median(shift), 4),
                                                  "min": round(min(shift), 4), "max": round(max(shift), 4)},
                         "lora_grad_cosine": {"median": round(statistics.median(cos), 4), "min": round(min(cos), 4),
                                              "max": round(max(cos), 4)},
                         "seconds": round(t, 2), "speedup_vs_f32": round(t_ref / t, 2)})
    doc = {"bench": "int8_numerics", **machine(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "dogfood_dir": str(args.dogfood_dir), "batches": args.batches, "fused_mlp": fused, "f32_seconds":
           round(t_ref, 2), "f32_loss_median": round(statistics.median(r[0] for r in ref), 4), "variants": rows_out,
           "note": "per batch of 2 packed rows: |loss - f32 loss| / f32 loss and the cosine of the LoRA gradients; "
                   "seconds: forward and backward of all batches, one pass (a side value, not a speed bench)"}
    path = args.output or REPO / "bench" / "results" / f"int8-numerics-{doc['host']}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    for r in rows_out:
        print(r["variant"], r["loss_relative_change"], r["lora_grad_cosine"], r.get("speedup_vs_f32"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
