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

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
ARMS = ("shared", "per-example")


def worker(arm: str, dogfood_dir: Path, steps: int, seed: int, out: Path, result: Path) -> None:
    from mens.dogfood import stages
    from mens.dogfood.pipeline import Context, DogfoodConfig
    from mens.train import segment_attention
    from mens.train.run import run_training
    from mens.train.telemetry import read_events

    segment_attention.SHARED_PREFIX = "auto" if arm == "shared" else "off"
    ctx = Context(DogfoodConfig(output_dir=dogfood_dir, seed=seed), lambda *_: None)
    tc = stages.train_config(ctx, run=str(out))
    tc.output_dir, tc.max_steps, tc.eval_every, tc.save_every, tc.log_every_s = str(out), steps, 0, 0, 3600.0
    run_training(tc)
    events = read_events(out)
    step_events = [e for e in events if e.get("event") == "step"]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(step_events, step_events[1:], strict=False)]
    from mens.run_records import PREFLIGHT

    checks = json.loads((out / PREFLIGHT).read_text()).get("checks", [])
    notes = [c.get("detail", "") for c in checks if c.get("check") == "attention"]
    result.write_text(json.dumps({"arm": arm, "step_s": times, "losses": [e.get("loss") for e in step_events],
                                  "tokens": [e.get("tokens") for e in step_events], "attention": notes}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dogfood-dir", type=Path, required=True, help="a dogfood output directory with data/train.jsonl")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path,
                    default=REPO / "bench" / "results" / f"shared_prefix_speed-{socket.gethostname()}.json")
    ap.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.dogfood_dir, args.steps, args.seed, args.run_dir, args.result)
        return
    from machine import machine

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                result = Path(tmp) / f"{arm}-{r}.json"
                cmd = [sys.executable, __file__, "--worker", arm, "--dogfood-dir", str(args.dogfood_dir),
                       "--steps", str(args.steps), "--seed", str(args.seed),
                       "--run-dir", str(Path(tmp) / f"run-{arm}-{r}"), "--result", str(result)]
                subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
                run = json.loads(result.read_text())
                run["round"] = r
                run["mean_step_s"] = statistics.mean(run["step_s"])
                print(f"round {r} {arm}: {run['mean_step_s']:.3f} s/step, last loss {run['losses'][-1]}", flush=True)
                runs.append(run)
    by_round = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["arm"]] = run["mean_step_s"]
    speedups = [rnd["per-example"] / rnd["shared"] for rnd in by_round.values() if len(rnd) == 2]
    losses = {arm: [run["losses"] for run in runs if run["arm"] == arm][0] for arm in ARMS}
    report = {
        "bench": "shared_prefix_speed", "machine": machine(), "steps": args.steps, "repeats": args.repeats,
        "seed": args.seed, "dogfood_dir": str(args.dogfood_dir),
        "note": "mean step time over steps 2..N of dogfood's recipe; speedup = per-example / shared, per round",
        "speedup": {"min": min(speedups), "median": statistics.median(speedups), "max": max(speedups),
                    "n": len(speedups)},
        "max_loss_difference": max(abs(a - b) for a, b in zip(losses["shared"], losses["per-example"], strict=True)),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["speedup"]), "max loss difference", report["max_loss_difference"])


if __name__ == "__main__":
    main()
