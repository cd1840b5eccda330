"""Must-show 2 on every held-out prompt: the served model gives the adapter's task results, not just on a sample.

The dogfood parity stage sends only the first 8 held-out prompts to the real server (a full run's default, to keep it
short; `mens dogfood --served-tasks N` sends more). This takes a finished full run and sends all of them: it starts
`mens serve` on the merged model (the same code path as the parity stage: OpenAI chat endpoint over HTTP,
temperature 0, the run's own token limit), checks each answer with the bench's task checks, and compares per task with
the merged model's and the adapter's greedy results. Writes bench/results/served-parity-<host>.json.
Run: `python bench/served_parity.py --from-dir DIR [--output F]`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from machine import REPO, machine


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR` (merge done).")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/served-parity-<host>.json).")
    args = ap.parse_args()

    from mens.dogfood.parity import compare_results, compare_served, finished_run, finished_tasks, served_answers
    from mens.lang import get_language

    out_dir = args.from_dir
    config, run, adapter = finished_run(out_dir)
    merged = _json(out_dir / "eval" / "merged_results.json")["results"]
    tasks = finished_tasks(out_dir, config)

    t0 = time.time()
    served = served_answers(out_dir / "merged", tasks, config["max_new_tokens"], config.get("device", "auto"))
    wall = time.time() - t0
    vs_merged = compare_served(tasks, served, merged, get_language("vox"))
    # served vs adapter: the served answers as a bench result list, so the merge comparison can be reused
    as_results = [{"id": row["id"], "samples": [{"pass": row["served_pass"], "output": text}]}
                  for row, text in zip(vs_merged["rows"], served, strict=True)]
    vs_adapter = compare_results(adapter, as_results)
    doc = {"bench": "served_parity", **machine(), "run_dir": str(out_dir), "seed": config.get("seed"),
           "decoding": "greedy", "max_new_tokens": config["max_new_tokens"], "served_wall_s": round(wall, 1),
           "served_vs_merged": {k: v for k, v in vs_merged.items() if k != "rows"},
           "served_vs_adapter": {"tasks": vs_adapter["tasks"], "same_result": vs_adapter["same_result"],
                                 "different_result": vs_adapter["different_result"],
                                 "same_text": vs_adapter["same_text"], "adapter_passed": vs_adapter["adapter_passed"],
                                 "served_passed": vs_adapter["merged_passed"]},
           "rows": vs_merged["rows"]}
    path = args.output or REPO / "bench" / "results" / f"served-parity-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"served = merged on {vs_merged['same_result']}/{vs_merged['tasks']} task results "
          f"({vs_merged['same_text']} identical); served = adapter on {vs_adapter['same_result']}/"
          f"{vs_adapter['tasks']} ({vs_adapter['same_text']} identical); {wall:.0f} s\nwrote {path}")


if __name__ == "__main__":
    main()
