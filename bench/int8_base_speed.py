"""Training steps with the frozen base projections in int8 (`model.int8_base: auto`) against the same steps in f32
(`off`), on dogfood's own recipe and training file, on the f32 path (a CPU without native bf16, or one capped to
AVX2 with `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`).

Each run is a fresh process that trains `--steps` steps of the recipe dogfood would train (its preset, seed,
system prompt and data) on the training file of a finished or data-only dogfood directory; the arms alternate for
`--repeats` rounds on a quiet CPU. A step's time is read from the run's telemetry (the first step is left out: it
pays for the allocator's and kernels' warm-up). Both arms train the same rows in the same order; their losses
differ by what int8 changes, which the JSON records per step.

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 .venv/bin/python bench/int8_base_speed.py \\
        --dogfood-dir /tmp/w/data0 --steps 30 --repeats 2
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
ARMS = ("int8", "f32")


def worker(arm: str, dogfood_dir: Path, steps: int, seed: int, out: Path, result: Path) -> None:
    from alternate import dogfood_recipe, step_events

    from mens.run_records import PREFLIGHT
    from mens.train.run import run_training

    tc = dogfood_recipe(dogfood_dir, seed, out, steps)
    tc.int8_base = "auto" if arm == "int8" else "off"
    run_training(tc)
    steps_done, times = step_events(out)
    checks = json.loads((out / PREFLIGHT).read_text()).get("checks", [])
    notes = {c.get("check"): c.get("detail", "") for c in checks if c.get("check") in ("int8 base", "matmul precision")}
    result.write_text(json.dumps({"arm": arm, "step_s": times, "losses": [e.get("loss") for e in steps_done],
                                  "preflight": notes}))


def main() -> None:
    from alternate import dogfood_arms_parser, run_dogfood_arms

    ap = dogfood_arms_parser(__doc__.splitlines()[0], ARMS, repeats=2)
    ap.add_argument("--out", type=Path, help="Result JSON (default bench/results/int8-base-speed-<host>.json).")
    args = ap.parse_args()
    runs = run_dogfood_arms(__file__, ARMS, args, worker)
    if runs is None:
        return
    import torch
    from alternate import speedup
    from machine import machine

    losses = {arm: [run["losses"] for run in runs if run["arm"] == arm][0] for arm in ARMS}
    rel = [abs(a - b) / b for a, b in zip(losses["int8"], losses["f32"], strict=True)]
    doc = {"bench": "int8_base_speed", **machine(), "torch": torch.__version__, "steps": args.steps,
           "repeats": args.repeats, "seed": args.seed, "dogfood_dir": str(args.dogfood_dir),
           "note": "mean step time over steps 2..N of dogfood's recipe; speedup = f32 / int8, per round; "
                   "loss_relative_difference: |int8 - f32| / f32 per step, same rows in the same order",
           "speedup": speedup(runs, "f32", "int8"),
           "loss_relative_difference": {"median": statistics.median(rel), "max": max(rel)},
           "runs": runs}
    path = args.out or REPO / "bench" / "results" / f"int8-base-speed-{doc['host']}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(doc["speedup"]), "loss difference", doc["loss_relative_difference"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
