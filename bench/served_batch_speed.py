"""Concurrent requests to `mens serve`: decoded one at a time against batched (`--max-batch`), same answers?

Takes a finished `mens dogfood -o DIR` and sends the first N held-out prompts to `mens serve` on its merged model all
at once (OpenAI chat endpoint, temperature 0, the run's token limit: dogfood's served-parity path), with the server
answering them one at a time (`max_batch` 1, what every server did before batching) or decoding them together
(`max_batch` N). Arms alternate over the rounds, each in a fresh server. For each it records the wall time from the
first request to the last answer, and per task whether the answer is the merged model's greedy answer from the
run's evaluation (text and task result). Writes bench/results/served-batch-speed-<host>.json.
Run: `python bench/served_batch_speed.py --from-dir DIR [--tasks 8] [--rounds 2] [--output F]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from machine import REPO, machine


def run_arms(tasks: list, rounds: int, serve, compare) -> list[dict]:
    """Both arms each round, in alternating order: `serve(max_batch)` gives the answers, `compare(answers)` their
    agreement with the merged model (`compare_served`'s counts)."""
    arms = {"one_at_a_time": 1, "batched": len(tasks)}
    runs = []
    for rnd in range(rounds):
        for arm in (list(arms) if rnd % 2 == 0 else list(arms)[::-1]):
            t0 = time.perf_counter()
            served = serve(arms[arm])
            wall = time.perf_counter() - t0
            cmp = compare(served)
            runs.append({"round": rnd, "arm": arm, "max_batch": arms[arm], "wall_s": round(wall, 2),
                         "same_result": cmp["same_result"], "same_text": cmp["same_text"], "answers": served})
            print(f"round {rnd} {arm}: {wall:.1f} s, same as merged {cmp['same_text']}/{len(tasks)} texts, "
                  f"{cmp['same_result']}/{len(tasks)} results", flush=True)
    return runs


def summary(runs: list[dict]) -> dict:
    """Wall times per arm, their medians, the speedup of batching, and how many answers the two arms' first runs
    share."""
    arms = ("one_at_a_time", "batched")
    walls = {arm: [r["wall_s"] for r in runs if r["arm"] == arm] for arm in arms}
    medians = {arm: statistics.median(w) for arm, w in walls.items()}
    first = {arm: next(r["answers"] for r in runs if r["arm"] == arm) for arm in arms}
    return {"wall_s": walls, "median_wall_s": medians,
            "speedup": round(medians["one_at_a_time"] / medians["batched"], 2),
            "arms_same_answers": sum(a == b for a, b in zip(first["one_at_a_time"], first["batched"], strict=True))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR` (merge done).")
    ap.add_argument("--tasks", type=int, default=8, help="Held-out prompts sent at once (default 8, dogfood's).")
    ap.add_argument("--rounds", type=int, default=2, help="Rounds; each runs both arms, in alternating order.")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/served-batch-speed-<host>.json).")
    args = ap.parse_args()

    import torch

    from mens.dogfood.parity import compare_served, finished_run, finished_tasks, served_answers
    from mens.lang import get_language

    out_dir = args.from_dir
    config, _, _ = finished_run(out_dir)
    merged = json.loads((out_dir / "eval" / "merged_results.json").read_text(encoding="utf-8"))["results"]
    tasks = finished_tasks(out_dir, config)[: args.tasks]
    lang = get_language("vox")
    runs = run_arms(tasks, args.rounds,
                    lambda max_batch: served_answers(out_dir / "merged", tasks, config["max_new_tokens"],
                                                     config.get("device", "auto"), max_batch=max_batch),
                    lambda served: compare_served(tasks, served, merged, lang))
    doc = {"bench": "served_batch_speed", **machine(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "run_dir": str(out_dir), "seed": config.get("seed"), "tasks": len(tasks),
           "max_new_tokens": config["max_new_tokens"], **summary(runs), "runs": runs,
           "note": "wall_s: from sending every request at once to the last answer, server start and model load "
                   "included (as in dogfood's parity stage); same_text/same_result: against the merged model's "
                   "greedy answers from the run's own evaluation (decoded there in a batch of every held-out task)"}
    path = args.output or REPO / "bench" / "results" / f"served-batch-speed-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    medians = doc["median_wall_s"]
    print(f"one at a time {medians['one_at_a_time']:.1f} s, batched {medians['batched']:.1f} s "
          f"({doc['speedup']}x); same answers in both arms {doc['arms_same_answers']}/{len(tasks)}\nwrote {path}")


if __name__ == "__main__":
    main()
