"""Batched greedy decoding on a KV cache that grows in place, against transformers' cache that concatenates.

`generate_greedy_batch` hands the model a DynamicCache whose full-attention layers write each step into spare
capacity (`mens.model.batch_decode.growing_cache`); transformers' own DynamicLayer concatenates the whole cache every
step. On a finished dogfood run this times, alternating (`--rounds`), the held-out tasks' greedy answers of the base
model (dogfood's base eval, which sizes the post-training reserve) and of the tuned model (its greedy pass), each way
on the same loaded model, and checks that both ways give the same answers. Writes
bench/results/kv-cache-<host>.json. Run: `python bench/kv_cache_speed.py --from-dir DIR [--rounds 2]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from machine import REPO, commit, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR`.")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/kv-cache-<host>.json).")
    args = ap.parse_args()

    import torch

    import mens.model.batch_decode as gen
    from mens.dogfood.parity import finished_run, finished_tasks
    from mens.evaluate.run import greedy_requests
    from mens.lang import get_language
    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference, resolve_base

    config, run, _adapter = finished_run(args.from_dir)
    tasks = finished_tasks(args.from_dir, config)
    tokens = config["max_new_tokens"]
    requests = greedy_requests(tasks, tokens)
    lang = get_language("vox")
    device = config.get("device", "auto")
    tuned = load_for_inference(run, device=device)
    base = load_for_inference(resolve_base(run)[0], device=device)
    base.system_prompt = tuned.system_prompt  # as dogfood's base eval: the same prompt, other weights
    growing = gen.growing_cache
    ways = {"growing": growing, "concatenating": lambda model: None}  # None: the model makes transformers' cache

    seconds: dict[str, dict[str, list[float]]] = {}
    answers: dict[str, dict[str, list[str]]] = {}
    try:
        for _ in range(args.rounds):
            for model_name, loaded in (("base", base), ("tuned", tuned)):
                for way, make in ways.items():
                    gen.growing_cache = make
                    engine = HFEngine(loaded, lang)
                    t0 = time.perf_counter()
                    answers.setdefault(model_name, {})[way] = engine.generate_batch(requests)
                    seconds.setdefault(f"{model_name}_greedy", {}).setdefault(way, []).append(
                        round(time.perf_counter() - t0, 2))
    finally:
        gen.growing_cache = growing
    same = {m: sum(a == b for a, b in zip(w["growing"], w["concatenating"], strict=True)) for m, w in answers.items()}
    speedup = {k: round(statistics.median(v["concatenating"]) / statistics.median(v["growing"]), 3)
               for k, v in seconds.items()}
    doc = {"bench": "kv_cache_speed", **machine(), "commit": commit(), "torch_threads": torch.get_num_threads(),
           "run_dir": str(args.from_dir), "seed": config.get("seed"), "tasks": len(tasks), "max_new_tokens": tokens,
           "rounds": args.rounds, "order": "each round: base growing, base concatenating, tuned growing, tuned "
           "concatenating", "seconds": seconds, "speedup_median": speedup, "same_answers": same}
    path = args.output or REPO / "bench" / "results" / f"kv-cache-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"seconds": seconds, "speedup_median": speedup, "same_answers": same}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
