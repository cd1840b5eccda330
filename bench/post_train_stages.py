"""The stages after training against the base model's evaluation, re-run at this commit on finished dogfood runs.

A budgeted `mens dogfood` reserves `budget.POST_TRAIN_FACTOR` base evaluations plus `POST_TRAIN_FIXED_S` for the
stages after training (eval-tuned, gate, merge, parity, card), measured before training on the same machine. Whether
a smaller factor holds depends on the weakest models the budget trains (more failures to retry and repair) and on
how the machine's speed drifts between the base eval and those stages. For each `--from-dir`, this copies the
finished run, forgets its eval-base and every stage after training, and runs `mens dogfood --resume` on the copy:
the data and the trained model are kept, the base eval and the stages after it run again at this commit, one run at
a time. Each row records the stages' seconds, the stages after training in base evaluations beyond the fixed part,
and whether the current reserve held. `--collect` records copies that were re-run that way already.
`--records` reads the same numbers from finished `bench/dogfood.py` records instead (each row names the machine its
run had), with the share of the recipe each run's plan trained: the reserve's factor depends on it.
Writes bench/results/post-train-stages-<host>.json.
Run: `python bench/post_train_stages.py --from-dir DIR [--from-dir DIR ...] [--work /tmp/post-train]`
     `python bench/post_train_stages.py --records bench/results/dogfood-budget30-*.json --output OUT`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from machine import REPO, commit, machine

from mens.dogfood.budget import (
    POST_TRAIN_FACTOR,
    POST_TRAIN_FACTOR_TRAINED,
    POST_TRAIN_FIXED_S,
    POST_TRAIN_STAGES,
    TRAINED_SHARE,
    post_train_reserve,
    reserve_factor,
)

RERUN = ("eval-base", *POST_TRAIN_STAGES)


def rerun(source: Path, work: Path) -> Path:
    """A copy of `source` whose eval-base and later stages `mens dogfood --resume` runs again."""
    copy = work / source.resolve().parent.name / source.name
    shutil.rmtree(copy, ignore_errors=True)
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, copy, symlinks=True)
    state_path = copy / "dogfood_state.json"
    state = json.loads(state_path.read_text(encoding="utf-8"))
    for stage in RERUN:
        state["stages"].pop(stage, None)
    state["config"]["output_dir"] = str(copy)  # --resume checks the settings, the directory included
    state_path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(copy.with_suffix(".log"), "w", encoding="utf-8") as log:
        subprocess.run([str(REPO / "scripts" / "mens"), "dogfood", "--resume", "--seed", str(state["config"]["seed"]),
                        "-o", str(copy)], check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    return copy


def row(copy: Path, source: Path | None) -> dict:
    state = json.loads((copy / "dogfood_state.json").read_text(encoding="utf-8"))
    stages = state["stages"]
    missing = [s for s in RERUN if stages.get(s, {}).get("status") != "done"]
    if missing:
        sys.exit(f"{copy}: stages {missing} did not finish; re-run it")
    seconds = {s: stages[s]["seconds"] for s in RERUN}
    base, after = seconds["eval-base"], sum(seconds[s] for s in POST_TRAIN_STAGES)
    summary = json.loads((copy / "run" / "run_summary.json").read_text(encoding="utf-8"))
    plan_path = copy / "data" / "budget.json"
    share = planned_share(json.loads(plan_path.read_text(encoding="utf-8"))) if plan_path.is_file() else None
    return {"run": str(copy), "source": str(source) if source else None, "seed": state["config"]["seed"],
            "trained_steps": summary.get("steps"), "stage_seconds": seconds,
            **measured(base, after, share), "tuned": stages["eval-tuned"].get("note"),
            "parity": stages["parity"].get("note")}


def planned_share(plan: dict) -> float:
    """Share of the recipe's steps a budget plan (`data/budget.json`) trains."""
    return round(plan["steps"] / plan["recipe_steps"], 3)


def measured(base: float, after: float, share: float | None) -> dict:
    """The stages after training in base evaluations, and whether the reserve for this plan's share held (a run
    without a plan is reserved the larger factor)."""
    reserve = post_train_reserve(base, share or 0.0)
    return {"planned_share": share, "after_training_s": round(after, 1),
            "base_evals_beyond_fixed": round((after - POST_TRAIN_FIXED_S) / base, 2),
            "reserve_factor": reserve_factor(share or 0.0), "reserve_s": round(reserve, 1),
            "reserve_held": after <= reserve}


def record_row(path: Path) -> dict | None:
    """The same numbers from a `bench/dogfood.py` record of a budgeted run; None for one without a plan or the
    stages' seconds (records written before they carried them)."""
    rec = json.loads(path.read_text(encoding="utf-8"))
    plan, seconds = rec.get("budget"), rec.get("stage_seconds") or {}
    if not plan or "eval-base" not in seconds or not all(s in seconds for s in POST_TRAIN_STAGES):
        return None
    after = sum(seconds[s] for s in POST_TRAIN_STAGES)
    return {"record": path.name, "commit": rec.get("commit"), "seed": rec.get("seed"),
            "machine": {k: rec.get(k) for k in ("cpu", "cpu_family_model", "cpu_count", "avx512", "native_bf16")},
            "trained_steps": (rec.get("train") or {}).get("steps"), "recipe_steps": plan["recipe_steps"],
            "base_eval_s": seconds["eval-base"], **measured(seconds["eval-base"], after, planned_share(plan)),
            "command_wall_s": rec.get("command_wall_s")}


def by_factor(rows: list[dict]) -> dict:
    """Per reserve factor: the runs it applies to, the largest use, and whether it held for every one."""
    out = {}
    for factor in (POST_TRAIN_FACTOR_TRAINED, POST_TRAIN_FACTOR):
        mine = [r for r in rows if r["reserve_factor"] == factor]
        if mine:
            out[f"{factor:g}"] = {"runs": len(mine), "planned_share": [min(r["planned_share"] or 0 for r in mine),
                                                                       max(r["planned_share"] or 0 for r in mine)],
                                  "max_base_evals_beyond_fixed": max(r["base_evals_beyond_fixed"] for r in mine),
                                  "all_held": all(r["reserve_held"] for r in mine)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, action="append", default=[],
                    help="A finished `mens dogfood -o DIR` (repeatable); with --collect, a copy already re-run.")
    ap.add_argument("--records", type=Path, nargs="+", default=[],
                    help="Finished bench/dogfood.py records of budgeted runs, read instead of re-running anything "
                    "(those without a plan or stage seconds are skipped).")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mens-post-train"), help="Where the copies go.")
    ap.add_argument("--collect", action="store_true", help="Record the given copies without running them again.")
    ap.add_argument("--commit", help="The commit the stages ran at (default this checkout's HEAD; with --collect, "
                    "give the one the copies were re-run at).")
    ap.add_argument("--note", default="", help="Free text for the record (e.g. where the copies came from).")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/post-train-stages-<host>.json).")
    args = ap.parse_args()

    if bool(args.from_dir) == bool(args.records):
        ap.error("give --from-dir (repeatable) or --records, not both")
    rows = [r for r in map(record_row, args.records) if r]
    if args.records and not rows:
        sys.exit("none of the --records is a budgeted dogfood record with its stages' seconds")
    for d in args.from_dir:
        rows.append(row(d, None) if args.collect else row(rerun(d, args.work), d))
        print(json.dumps({k: rows[-1][k] for k in ("run", "stage_seconds", "base_evals_beyond_fixed",
                                                   "reserve_held")}), flush=True)
    where = machine()
    record = {"bench": "post_train_stages", "machine": where, "commit": args.commit or commit(), "note": args.note,
              "post_train_factor": POST_TRAIN_FACTOR, "post_train_factor_trained": POST_TRAIN_FACTOR_TRAINED,
              "trained_share": TRAINED_SHARE, "post_train_fixed_s": POST_TRAIN_FIXED_S, "runs": rows,
              "by_factor": by_factor(rows),
              "max_base_evals_beyond_fixed": max(r["base_evals_beyond_fixed"] for r in rows),
              "all_held": all(r["reserve_held"] for r in rows)}
    out = args.output or REPO / "bench" / "results" / f"post-train-stages-{where['host']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
