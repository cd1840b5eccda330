"""Training recipes compared over several seeds, on one training file and one held-out bench.

The seed alone moves dogfood's held-out greedy numbers by 2-3 of its 60 tasks, so one run per recipe cannot tell
a small gain from luck. For each recipe this trains `mens train --preset cpu --seed S [its flags]` on the same
train.jsonl for every seed, then runs `mens eval-local` (greedy, dogfood's system prompt and answer length) on the
same bench; or, with --from-runs, records run directories that already carry a benchmark_results.json.

Writes bench/results/recipe_seeds-<host>.json: per run the seed, training data, what its config changes against
the first run, greedy non-empty parse and task pass@1 (as counts of tasks), training seconds and failed tasks; per
recipe the mean, min and max and the tasks that failed in every run; and, for each later recipe, its difference
from the first recipe on every seed both ran on the same data (a paired comparison).

Run:  python bench/recipe_seeds.py --data D --bench B --seeds 0,1,2 --recipe default= --recipe nef="--neftune-alpha 5"
      python bench/recipe_seeds.py --bench B --from-runs default=RUN,RUN --from-runs nef=RUN,RUN [--note nef=TEXT]
            [--data-recipe nef]   (nef trained on its own train.jsonl: pair its runs by seed alone)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from dogfood import REPO, machine
from mens.train.data import file_sha256 as sha256

IGNORED = {"output_dir", "data", "seed", "extra", "resume"}
"""Config keys that differ between runs without changing the recipe."""


def train_and_eval(data: Path, bench: Path, out: Path, seed: int, flags: list[str]) -> Path:
    from mens.dogfood.pipeline import SHORT_SYSTEM_PROMPT, DogfoodConfig

    mens = str(REPO / "scripts" / "mens")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([mens, "train", "--data-dir", str(data), "--output-dir", str(out), "--preset", "cpu",
                    "--seed", str(seed), "--system-prompt", SHORT_SYSTEM_PROMPT, *flags], check=True, env=env)
    tokens = DogfoodConfig(output_dir=out).max_new_tokens  # dogfood's answer length (no directory is made)
    subprocess.run([mens, "eval-local", str(out), "--bench", str(bench), "--split", "all", "--modes", "greedy",
                    "--max-new-tokens", str(tokens)], check=True, env=env)
    return out


def run_record(run: Path, reference: dict | None, bench_sha: str) -> dict:
    from mens.train.config import TrainConfig

    manifest = json.loads((run / "training_manifest.json").read_text(encoding="utf-8"))
    summary = json.loads((run / "run_summary.json").read_text(encoding="utf-8"))
    bench = json.loads((run / "benchmark_results.json").read_text(encoding="utf-8"))
    judged_on = Path(str(bench.get("bench")))
    if not judged_on.is_file() or sha256(judged_on) != bench_sha:
        sys.exit(f"{run}: evaluated on {judged_on}, which is not (or no longer) the --bench file; runs compared "
                 "here must be judged on the same tasks")
    greedy = (bench.get("modes") or {}).get("greedy") or bench["metrics"]
    tasks = greedy["tasks"]
    cfg = manifest["config"]
    # A key an older run's manifest lacks had its default then (a field added later defaults to the old behaviour).
    ref = TrainConfig().to_dict() | (reference or cfg)
    return {
        "run": str(run), "seed": cfg["seed"], "data_sha256": manifest["data_sha256"],
        "train_examples": manifest["examples"]["train"],
        "config_changes": {k: v for k, v in sorted(cfg.items()) if k not in IGNORED and ref.get(k) != v},
        "tasks": tasks, "nonempty_parse": round(greedy["nonempty_parse_rate"] * tasks),
        "task_pass": round(greedy["pass_at_1"] * tasks), "nonempty_parse_rate": greedy["nonempty_parse_rate"],
        "pass_at_1": greedy["pass_at_1"], "train_time_s": summary.get("train_time_s"),
        "failed": sorted(r["id"] for r in bench["results"] if not all(s["pass"] for s in r["samples"])),
        "unparsed": sorted(r["id"] for r in bench["results"] if not all(s["has_code"] for s in r["samples"])),
    }


def recipe_summary(runs: list[dict]) -> dict:
    def stats(key: str) -> dict:
        values = [r[key] for r in runs]
        return {"mean": round(sum(values) / len(values), 4), "min": min(values), "max": max(values)}

    always = set(runs[0]["failed"]).intersection(*(r["failed"] for r in runs[1:]))
    return {"n_runs": len(runs), "seeds": [r["seed"] for r in runs],
            "nonempty_parse_rate": stats("nonempty_parse_rate"), "pass_at_1": stats("pass_at_1"),
            "failed_in_every_run": sorted(always)}


def paired(first: list[dict], other: list[dict], *, any_data: bool = False) -> list[dict]:
    """Per seed run by both on the same data (any data with `any_data`: a recipe that is a change of the training
    file itself): the other recipe's gain in tasks (negative = fewer)."""
    key = (lambda r: r["seed"]) if any_data else (lambda r: (r["seed"], r["data_sha256"]))
    base = {key(r): r for r in first}
    return [{"seed": r["seed"], "nonempty_parse": r["nonempty_parse"] - b["nonempty_parse"],
             "task_pass": r["task_pass"] - b["task_pass"]}
            for r in other if (b := base.get(key(r)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=Path, required=True, help="The bench JSONL every run is judged on.")
    ap.add_argument("--data", type=Path, help="Training data dir (train.jsonl) for every recipe.")
    ap.add_argument("--seeds", default="0,1,2", help="Comma-separated training seeds.")
    ap.add_argument("--recipe", action="append", default=[], metavar="NAME=FLAGS",
                    help="A recipe: extra `mens train` flags on top of --preset cpu (empty = the preset).")
    ap.add_argument("--from-runs", action="append", default=[], metavar="NAME=RUN,RUN",
                    help="Record finished, evaluated run directories as recipe NAME instead of training.")
    ap.add_argument("--note", action="append", default=[], metavar="NAME=TEXT", help="What recipe NAME is.")
    ap.add_argument("--data-recipe", action="append", default=[], metavar="NAME",
                    help="Recipe NAME is a change of the training file (its runs trained on another file): pair its "
                         "runs with the first recipe's by seed alone.")
    ap.add_argument("--out-dir", type=Path, default=Path("runs/recipe_seeds"), help="Where new runs go.")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/recipe_seeds-<host>.json).")
    args = ap.parse_args()
    if bool(args.recipe) == bool(args.from_runs):
        ap.error("give either --recipe (with --data) or --from-runs")
    if args.recipe and not args.data:
        ap.error("--recipe trains: give --data DIR with the train.jsonl every recipe uses")

    groups: dict[str, list[Path]] = {}
    for spec in args.from_runs:
        name, _, dirs = spec.partition("=")
        groups[name] = [Path(d) for d in dirs.split(",") if d]
    for spec in args.recipe:
        name, _, flags = spec.partition("=")
        groups[name] = [train_and_eval(args.data, args.bench, args.out_dir / name / f"seed-{seed}", int(seed),
                                       shlex.split(flags))
                        for seed in args.seeds.split(",")]
    notes = dict(n.partition("=")[::2] for n in args.note)

    reference, recipes, bench_sha = None, {}, sha256(args.bench)
    for name, dirs in groups.items():
        runs = []
        for d in dirs:
            if reference is None:
                reference = json.loads((d / "training_manifest.json").read_text(encoding="utf-8"))["config"]
            runs.append(run_record(d, reference, bench_sha))
        recipes[name] = {"note": notes.get(name), **recipe_summary(runs), "runs": runs}
    first = next(iter(recipes))
    for name, rec in recipes.items():
        if name != first:
            rec["paired_gain_over_" + first] = paired(recipes[first]["runs"], rec["runs"],
                                                      any_data=name in args.data_recipe)
    result = {"bench": "recipe_seeds", **machine(), "heldout_bench": str(args.bench),
              "heldout_bench_sha256": bench_sha, "decoding": "greedy", "recipes": recipes}
    dest = args.output or REPO / "bench" / "results" / f"recipe_seeds-{socket.gethostname()}.json"
    dest.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for name, rec in recipes.items():
        p, t = rec["nonempty_parse_rate"], rec["pass_at_1"]
        print(f"{name:16s} {rec['n_runs']} runs  greedy parse {p['mean']:.3f} ({p['min']:.3f}-{p['max']:.3f})  "
              f"pass@1 {t['mean']:.3f} ({t['min']:.3f}-{t['max']:.3f})", file=sys.stderr)
    print(f"wrote {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
