"""Greedy evaluation with ended answers dropped from the batch, against batches of 16 that carry them to the end.

`generate_greedy_batch` drops an answer from the batch (and its KV cache rows) once it ends, and `HFEngine` decodes
up to 64 answers at once. Before, batches of 16 ran until their longest answer ended, computing every ended row.
On a finished dogfood run this times, alternating (`--rounds`), the held-out tasks' greedy answers of the base
model (dogfood's base eval) and of the tuned model (its greedy pass), each way on the same loaded model, then the
tuned eval's three modes (greedy, parse-and-retry, constrained) once each way; and checks that both ways give the
same answers. Writes bench/results/eval-batch-<host>.json.
Run: `python bench/eval_batch_speed.py --from-dir DIR [--rounds 2]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from machine import REPO, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR`.")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/eval-batch-<host>.json).")
    args = ap.parse_args()

    import torch

    import mens.model.batch_decode as gen
    from mens.dogfood.parity import finished_run, finished_tasks
    from mens.evaluate.local import evaluate_model
    from mens.evaluate.run import greedy_requests
    from mens.lang import get_language
    from mens.model.hf_engine import BATCH_SIZE, HFEngine
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
    drop = gen._drop_ended
    ways = {"dropped_64": (BATCH_SIZE, drop), "carried_16": (16, lambda *a: False)}

    def engine(loaded, way: str) -> HFEngine:
        size, dropper = ways[way]
        gen._drop_ended = dropper
        return HFEngine(loaded, lang, batch_size=size)

    seconds: dict[str, dict[str, list[float]]] = {}
    answers: dict[str, dict[str, list[str]]] = {}
    for _ in range(args.rounds):
        for model_name, loaded in (("base", base), ("tuned", tuned)):
            for way in ways:
                e = engine(loaded, way)
                t0 = time.perf_counter()
                answers.setdefault(model_name, {})[way] = e.generate_batch(requests)
                seconds.setdefault(f"{model_name}_greedy", {}).setdefault(way, []).append(
                    round(time.perf_counter() - t0, 2))
    modes: dict[str, dict] = {}
    for way in ways:
        report = evaluate_model(engine(tuned, way), tasks, lang, modes=["greedy", "retry", "constrained"], k=1,
                                max_new_tokens=tokens)
        modes[way] = {m: {"seconds": v["seconds"], "pass_at_1": v["pass_at_1"],
                          "nonempty_parse_rate": v["nonempty_parse_rate"]} for m, v in report["modes"].items()}
    gen._drop_ended = drop
    same = {m: sum(a == b for a, b in zip(w["dropped_64"], w["carried_16"], strict=True)) for m, w in answers.items()}
    speedup = {k: round(statistics.median(v["carried_16"]) / statistics.median(v["dropped_64"]), 2)
               for k, v in seconds.items()}
    doc = {"bench": "eval_batch_speed", **machine(), "torch_threads": torch.get_num_threads(),
           "run_dir": str(args.from_dir), "seed": config.get("seed"), "tasks": len(tasks), "max_new_tokens": tokens,
           "rounds": args.rounds, "ways": {k: {"batch_size": v[0], "ended_answers": "dropped" if k.startswith("dropped")
                                               else "carried to the batch's end"} for k, v in ways.items()},
           "seconds": seconds, "speedup_median": speedup, "same_answers": same,
           "tuned_eval_modes": modes,
           "tuned_eval_modes_seconds": {w: round(sum(m["seconds"] for m in v.values()), 2) for w, v in modes.items()}}
    path = args.output or REPO / "bench" / "results" / f"eval-batch-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"seconds": seconds, "speedup_median": speedup, "same_answers": same,
                      "tuned_eval_modes_seconds": doc["tuned_eval_modes_seconds"]}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
