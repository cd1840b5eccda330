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
    from alternate import dogfood_arms_parser, run_dogfood_arms, write_same_rows_report

    ap = dogfood_arms_parser(__doc__.splitlines()[0], ARMS, repeats=3)
    ap.add_argument("--out", type=Path,
                    default=REPO / "bench" / "results" / f"shared_prefix_speed-{socket.gethostname()}.json")
    args = ap.parse_args()
    runs = run_dogfood_arms(__file__, ARMS, args, worker)
    if runs is not None:
        write_same_rows_report("shared_prefix_speed", args, runs, "per-example", "shared",
                               "mean step time over steps 2..N of dogfood's recipe; speedup = per-example / shared, "
                               "per round")


if __name__ == "__main__":
    main()
