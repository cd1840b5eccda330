"""Training steps with a micro-batch's common prompt prefix computed once (`packing.collate_shared`) against the
same steps with it computed per example (`segment_attention.SHARED_PREFIX = "off"`), on dogfood's own recipe and
training file.

Each run is a fresh process that trains `--steps` steps of the recipe dogfood would train (its preset, seed,
system prompt and data) on the training file of a finished or data-only dogfood directory; the arms alternate for
`--repeats` rounds on a quiet CPU. A step's time is read from the run's telemetry (the first step is left out: it
pays for the allocator's and kernels' warm-up). Both arms train the same rows in the same order, so their loss
curves must agree to float rounding; the JSON records both.

    .venv/bin/python bench/shared_prefix_speed.py --dogfood-dir /tmp/w/data0 --steps 30 --repeats 3
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
ARMS = ("shared", "per-example")


def worker(arm: str, dogfood_dir: Path, steps: int, seed: int, out: Path, result: Path) -> None:
    from alternate import dogfood_recipe, step_events

    from mens.train import segment_attention
    from mens.train.run import run_training

    segment_attention.SHARED_PREFIX = "auto" if arm == "shared" else "off"
    run_training(dogfood_recipe(dogfood_dir, seed, out, steps))
    steps_done, times = step_events(out)
    from mens.run_records import PREFLIGHT

    checks = json.loads((out / PREFLIGHT).read_text()).get("checks", [])
    notes = [c.get("detail", "") for c in checks if c.get("check") == "attention"]
    result.write_text(json.dumps({"arm": arm, "step_s": times, "losses": [e.get("loss") for e in steps_done],
                                  "tokens": [e.get("tokens") for e in steps_done], "attention": notes}))


def main() -> None:
    from alternate import dogfood_arms_parser, run_dogfood_arms

    ap = dogfood_arms_parser(__doc__.splitlines()[0], ARMS, repeats=3)
    ap.add_argument("--out", type=Path,
                    default=REPO / "bench" / "results" / f"shared_prefix_speed-{socket.gethostname()}.json")
    args = ap.parse_args()
    runs = run_dogfood_arms(__file__, ARMS, args, worker)
    if runs is None:
        return
    from alternate import speedup
    from machine import machine

    losses = {arm: [run["losses"] for run in runs if run["arm"] == arm][0] for arm in ARMS}
    report = {
        "bench": "shared_prefix_speed", "machine": machine(), "steps": args.steps, "repeats": args.repeats,
        "seed": args.seed, "dogfood_dir": str(args.dogfood_dir),
        "note": "mean step time over steps 2..N of dogfood's recipe; speedup = per-example / shared, per round",
        "speedup": speedup(runs, "per-example", "shared"),
        "max_loss_difference": max(abs(a - b) for a, b in zip(losses["shared"], losses["per-example"], strict=True)),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["speedup"]), "max loss difference", report["max_loss_difference"])


if __name__ == "__main__":
    main()
