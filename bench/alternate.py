"""Run a bench script's arms as fresh worker processes, alternating their order round by round.

Each arm of each round is `python SCRIPT --worker ARM --run-dir DIR --result FILE` plus the script's own
arguments; the worker writes its result as JSON, which gains `round` and `mean_step_s` (the mean of its `step_s`).
Alternating the order (A B, B A, ...) spreads a machine's slow drift over both arms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def dogfood_arms_parser(description: str, arms: tuple[str, str], repeats: int) -> argparse.ArgumentParser:
    """The options of a bench that trains dogfood's recipe in two arms: its data, steps, rounds and seed, and the
    hidden ones a worker process gets. The script adds `--out`."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--dogfood-dir", type=Path, required=True, help="a dogfood output directory with data/train.jsonl")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", choices=arms, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return ap


def run_dogfood_arms(script: str, arms: tuple[str, str], args: argparse.Namespace, worker) -> list[dict] | None:
    """In a worker process (`--worker ARM`): `worker(arm, dogfood_dir, steps, seed, run_dir, result)`, then None.
    Otherwise `alternate` with the options of `dogfood_arms_parser`: every arm's result."""
    if args.worker:
        worker(args.worker, args.dogfood_dir, args.steps, args.seed, args.run_dir, args.result)
        return None
    return alternate(script, arms, args.repeats, ["--dogfood-dir", str(args.dogfood_dir), "--steps", str(args.steps),
                                                  "--seed", str(args.seed)])


def alternate(script: str, arms: tuple[str, str], repeats: int, worker_args: list[str]) -> list[dict]:
    """Every arm's result, in the order run; prints one line per run."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                result = Path(tmp) / f"{arm}-{r}.json"
                cmd = [sys.executable, script, "--worker", arm, *worker_args,
                       "--run-dir", str(Path(tmp) / f"run-{arm}-{r}"), "--result", str(result)]
                subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
                run = json.loads(result.read_text())
                run["round"] = r
                run["mean_step_s"] = statistics.mean(run["step_s"])
                print(f"round {r} {arm}: {run['mean_step_s']:.3f} s/step, last loss {run['losses'][-1]}", flush=True)
                runs.append(run)
    return runs


def speedup(runs: list[dict], slow: str, fast: str) -> dict:
    """The slow arm's mean step time over the fast arm's, per round: min, median, max and how many rounds."""
    by_round: dict = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["arm"]] = run["mean_step_s"]
    ratios = [rnd[slow] / rnd[fast] for rnd in by_round.values() if len(rnd) == 2]
    return {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios), "n": len(ratios)}


RECIPE_SETTINGS = ("model", "device", "quick", "train", "system_prompt")
"""What of a dogfood run's own settings (its dogfood_state.json) decides the recipe it trains; the seed is the
bench's."""


def dogfood_recipe(dogfood_dir: Path, seed: int, out: Path, steps: int):
    """The TrainConfig dogfood trains on `dogfood_dir`'s data (its model, preset, training overrides and system
    prompt, as that run recorded them; dogfood's defaults for a directory without the record) with `seed`, as a
    timed arm runs it: `steps` steps into `out`, validating only at the end, no checkpoints, no progress lines."""
    from mens.dogfood import stages
    from mens.dogfood.pipeline import Context, DogfoodConfig
    from mens.run_records import DOGFOOD_STATE

    state = dogfood_dir / DOGFOOD_STATE
    saved = json.loads(state.read_text(encoding="utf-8")).get("config", {}) if state.is_file() else {}
    cfg = DogfoodConfig(output_dir=dogfood_dir, seed=seed, **{k: saved[k] for k in RECIPE_SETTINGS if k in saved})
    tc = stages.train_config(Context(cfg, lambda *_: None), run=str(out))
    tc.output_dir, tc.max_steps, tc.eval_every, tc.save_every, tc.log_every_s = str(out), steps, 0, 0, 3600.0
    return tc


def step_events(out: Path) -> tuple[list[dict], list[float]]:
    """A finished arm's step events and its step times (the first step left out: allocator and kernel warm-up)."""
    from mens.train.telemetry import read_events

    steps = [e for e in read_events(out) if e.get("event") == "step"]
    return steps, [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(steps, steps[1:], strict=False)]


def write_same_rows_report(bench: str, args: argparse.Namespace, runs: list[dict], slow: str, fast: str,
                           note: str) -> dict:
    """The record of a two-arm bench whose arms train the same rows (so their losses must agree to float rounding):
    the machine, the options, the per-round speedup slow / fast, the largest loss difference and every run; written
    to `args.out`, its headline printed."""
    import json

    from machine import machine

    losses = {arm: next(run["losses"] for run in runs if run["arm"] == arm) for arm in (slow, fast)}
    report = {"bench": bench, "machine": machine(), "steps": args.steps, "repeats": args.repeats, "seed": args.seed,
              "dogfood_dir": str(args.dogfood_dir), "note": note, "speedup": speedup(runs, slow, fast),
              "max_loss_difference": max(abs(a - b) for a, b in zip(losses[slow], losses[fast], strict=True)),
              "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["speedup"]), "max loss difference", report["max_loss_difference"])
    return report
