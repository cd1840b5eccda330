"""Requests that arrive while a batch decodes: joining the running batch against waiting for the next one.

Takes a finished `mens dogfood -o DIR` and streams its first N held-out prompts through the engine `mens serve`
uses (the merged model, `HFEngine` with `--max-batch` N, chat prompts, temperature 0, the run's token limit),
request i sent `i * gap` seconds after the first, each from its own thread as a client would. Two arms, alternating
over the rounds on the same loaded model: "join" (mens' batching: a request joins the running batch at its next
step) and "next_batch" (the batch's cache is treated as one that cannot take rows, so a request waits until the
running batch has ended, as static batching does). For each request it records the time from its sending to its
last token, and whether its answer is the merged model's greedy answer from the run's evaluation.
Writes bench/results/served-join-speed-<host>.json.
Run: `python bench/served_join_speed.py --from-dir DIR [--tasks 8] [--gap-s 1.0] [--rounds 2] [--output F]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from machine import REPO, commit, machine

ARMS = ("join", "next_batch")


def staggered(ask, n: int, gap_s: float) -> list[tuple[str, float]]:
    """(answer, seconds from its sending to its end) of `ask(i)` for i < n, request i sent i * gap_s after the
    first, each from its own thread."""
    out: list[tuple[str, float] | None] = [None] * n
    errors: list[BaseException] = []
    t0 = time.perf_counter()

    def client(i: int) -> None:
        time.sleep(max(0.0, t0 + i * gap_s - time.perf_counter()))
        start = time.perf_counter()
        try:
            out[i] = (ask(i), time.perf_counter() - start)
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out  # type: ignore[return-value]


def summary(runs: list[dict]) -> dict:
    """Per arm: the median over rounds of the mean and the longest request latency, and of the wall time; the
    ratios next_batch / join."""
    per = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        per[arm] = {"mean_latency_s": round(statistics.median(r["mean_latency_s"] for r in mine), 2),
                    "max_latency_s": round(statistics.median(r["max_latency_s"] for r in mine), 2),
                    "wall_s": round(statistics.median(r["wall_s"] for r in mine), 2)}
    ratio = {k: round(per["next_batch"][k] / per["join"][k], 2) for k in per["join"] if per["join"][k]}
    return {"arms": per, "next_batch_over_join": ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR` (merge done).")
    ap.add_argument("--tasks", type=int, default=8, help="Held-out prompts sent, one every --gap-s (default 8).")
    ap.add_argument("--gap-s", type=float, default=1.0, help="Seconds between two requests' sending (default 1).")
    ap.add_argument("--rounds", type=int, default=2, help="Rounds; each runs both arms, in alternating order.")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/served-join-speed-<host>.json).")
    args = ap.parse_args()

    import torch

    import mens.model.batch_stream as batch_stream
    from mens.dogfood.parity import finished_run, finished_tasks
    from mens.model.engine import GenerationRequest, Usage
    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference

    out_dir = args.from_dir
    config, _, _ = finished_run(out_dir)
    merged = {r["id"]: r["samples"][0]["output"] for r in
              json.loads((out_dir / "eval" / "merged_results.json").read_text(encoding="utf-8"))["results"]}
    tasks = finished_tasks(out_dir, config)[: args.tasks]
    loaded = load_for_inference(out_dir / "merged", device=config.get("device", "auto"))
    joinable = batch_stream._joinable
    runs = []
    try:
        for rnd in range(args.rounds):
            for arm in (ARMS if rnd % 2 == 0 else ARMS[::-1]):
                # "next_batch": every cache counts as one that cannot take rows, so the streamer batches statically
                batch_stream._joinable = joinable if arm == "join" else (lambda past: False)
                engine = HFEngine(loaded, max_batch=len(tasks))

                def ask(i: int, engine=engine) -> str:
                    request = GenerationRequest(messages=[{"role": "user", "content": tasks[i].prompt}],
                                                temperature=0.0, max_tokens=config["max_new_tokens"])
                    return "".join(engine.stream(request, Usage()))

                t0 = time.perf_counter()
                got = staggered(ask, len(tasks), args.gap_s)
                wall = time.perf_counter() - t0
                latencies = [round(s, 2) for _, s in got]
                same = sum(text == merged[t.id] for (text, _), t in zip(got, tasks, strict=True))
                runs.append({"round": rnd, "arm": arm, "wall_s": round(wall, 2), "latency_s": latencies,
                             "mean_latency_s": round(statistics.mean(latencies), 2), "max_latency_s": max(latencies),
                             "same_as_merged": same, "batches": list(engine._streamer.batches),
                             "joins": list(engine._streamer.joins)})
                print(f"round {rnd} {arm}: wall {wall:.1f} s, mean latency {statistics.mean(latencies):.1f} s, "
                      f"longest {max(latencies):.1f} s, same as merged {same}/{len(tasks)}", flush=True)
    finally:  # the module-level function is patched: put it back whatever happens in a round
        batch_stream._joinable = joinable
    doc = {"bench": "served_join_speed", **machine(), "commit": commit(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "run_dir": str(out_dir), "seed": config.get("seed"),
           "tasks": len(tasks), "gap_s": args.gap_s,
           "max_new_tokens": config["max_new_tokens"], **summary(runs), "runs": runs,
           "note": "latency_s: from a request's sending to its last token (model loaded once, before the rounds); "
                   "wall_s: from the first request's sending to the last answer; same_as_merged: answers equal to "
                   "the merged model's greedy answers from the run's evaluation (decoded there in one batch)"}
    path = args.output or REPO / "bench" / "results" / f"served-join-speed-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"{doc['arms']}\nnext_batch / join: {doc['next_batch_over_join']}\nwrote {path}")


if __name__ == "__main__":
    main()
