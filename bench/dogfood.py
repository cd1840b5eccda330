"""The main job end to end: `mens dogfood` on the embedded default, timed, its headline numbers recorded.

Runs the command as a user does (or, with --from-dir, records a run that already finished) and writes
bench/results/dogfood-<host>.json: stage seconds, base vs tuned parse rate and pass@1 per decoding mode,
gate verdict, merge/serve parity, and the machine. With --confirm it also has the tuned run answer the
confirmation split (bench/confirm: 60 tasks no recipe or data choice was ever tuned on, greedy, as eval-tuned does)
and records that beside the held-out numbers: a gain on the held-out split alone can be a product of having read its
failures. With --features it answers the documented-features split (bench/features, a third writer's) the same way:
a recipe is judged on the held-out and features splits before the confirmation split is read once. Each such
split's record also counts the training rows that share one of its reference answers' code or nearly copy one of its
prompts (dogfood itself keeps such rows away from the held-out split only).
Run: `python bench/dogfood.py [--quick] [--seed N] [--confirm] [--features] [--from-dir D [--wall-s S]] [--note TEXT]`.
`--from-dir D --add-to RECORD --confirm` adds a split to a finished run's record without evaluating again the splits
it already holds (reading the confirmation split once, after a recipe was judged on the other two).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import REPO, commit, machine

from mens.dogfood.budget import POST_TRAIN_STAGES
from mens.train.telemetry import read_events

CONFIRM = REPO / "bench" / "confirm" / "vox_confirm.jsonl"
FEATURES = REPO / "bench" / "features" / "vox_features.jsonl"


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def split_eval(out_dir: Path, env: dict, bench: Path, name: str) -> dict:
    """The tuned run's answers to another writer's split (`bench`) in every decoding mode its own eval used (greedy
    first), with the same token limit; the report goes to DIR/eval/<name>_results.json."""
    config = _json(out_dir / "dogfood_state.json")["config"]
    run = Path(_json(out_dir / "dogfood_summary.json")["run"])
    out = out_dir / "eval" / f"{name}_results.json"
    modes = ",".join(config.get("modes") or ["greedy"])
    subprocess.run([str(REPO / "scripts" / "mens"), "eval-local", str(run), "--bench", str(bench), "--split", "all",
                    "--modes", modes, "--max-new-tokens", str(config["max_new_tokens"]), "-o", str(out)],
                   check=True, env=env)
    report = _json(out)
    m = report["metrics"]
    return {"tasks": m["tasks"], "nonempty_parse_rate": m["nonempty_parse_rate"], "pass_at_1": m["pass_at_1"],
            "modes": {name: {"nonempty_parse_rate": mm["nonempty_parse_rate"], "pass_at_1": mm["pass_at_1"]}
                      for name, mm in report.get("modes", {}).items()},
            "failures_by_category": m.get("failures_by_category"),
            # The confirmation split's tasks are never listed: its totals are read once per finished recipe, and a
            # list of the tasks a run missed there is what a recipe could be tuned to.
            **({} if bench == CONFIRM else {"failed_tasks": failed_tasks(report)}),
            "training_rows_overlapping": training_overlap(out_dir, bench)}


def failed_tasks(report: dict) -> dict[str, str]:
    """Each task whose first answer in the report's first decoding mode (dogfood's one greedy answer) failed, by id,
    with the category of its first failure: what lets two runs be paired task by task (bench/paired_tasks.py), not
    only by their totals."""
    failed = {}
    for r in report.get("results", []):
        first = r["samples"][0] if r.get("samples") else None
        if first is not None and not first["pass"]:
            failed[r["id"]] = first["failures"][0]["category"] if first["failures"] else "unknown"
    return dict(sorted(failed.items()))


def training_overlap(out_dir: Path, bench: Path) -> dict:
    """How many of the run's training rows share a task's reference code or nearly copy its prompt in `bench`, by
    the test dogfood applies to its own held-out split. Dogfood checks only that split; this says, for another
    writer's split, whether a `--corpus` or new data reached its tasks (0 and 0 when nothing did)."""
    from mens.corpus.jsonl import read_objects
    from mens.corpus.records import BadLine
    from mens.dogfood.heldout import NEAR_DUPLICATE_PROMPT, SAME_CODE, decontaminate, heldout_tasks

    tasks, refs = heldout_tasks(str(bench), "all")
    rows = [obj for _, obj in read_objects(out_dir / "data" / "train.jsonl") if not isinstance(obj, BadLine)]
    _kept, rep = decontaminate(rows, tasks, refs)
    reasons = [d["reason"] for d in rep.dropped]
    return {"same_code": reasons.count(SAME_CODE), "near_duplicate_prompt": reasons.count(NEAR_DUPLICATE_PROMPT)}


def _refits(events: list[dict]) -> list[dict]:
    """A time-fitted run's re-fits of its step count (schedule.fit_to_time), from its telemetry."""
    return [{k: e.get(k) for k in ("step", "from_total", "to_total", "step_s", "elapsed_s")}
            for e in events if e.get("event") == "refit"]


def _final_val_pass_s(events: list[dict]) -> float | None:
    """Seconds of the run's last validation pass: from its last step event to the eval event after it."""
    steps = [e for e in events if e.get("event") == "step"]
    evals = [e for e in events if e.get("event") == "eval"]
    if not steps or not evals or evals[-1]["ts_ms"] < steps[-1]["ts_ms"]:
        return None
    return round((evals[-1]["ts_ms"] - steps[-1]["ts_ms"]) / 1000, 1)


def record(out_dir: Path, wall_s: float | None, quick: bool, note: str | None = None) -> dict:
    summary = _json(out_dir / "dogfood_summary.json")
    state = _json(out_dir / "dogfood_state.json")
    split = _json(out_dir / "data" / "heldout_split.json")
    run = Path(summary["run"])
    bench = _json(run / "benchmark_results.json")
    run_summary = _json(run / "run_summary.json")
    stages = summary["stage_seconds"]
    run_wall = run_summary.get("wall_time_s")
    events = read_events(run)
    session = summary.get("wall_time_s_this_session")
    return {
        "bench": "dogfood", **machine(), "commit": commit(), "quick": quick, "seed": state["config"]["seed"],
        **({"note": note} if note else {}),
        "command_wall_s": wall_s,
        # the command's time outside mens' own stages: building or checking the venv, and starting the CLI
        "setup_s": round(wall_s - session, 1) if wall_s is not None and session is not None else None,
        "stage_seconds": stages, "total_stage_seconds": summary["total_stage_seconds"],
        "post_train_s": round(sum(stages.get(name) or 0.0 for name in POST_TRAIN_STAGES), 1),
        "eval_tuned_mode_seconds": {name: m.get("seconds") for name, m in bench.get("modes", {}).items()},
        "heldout_tasks": split["heldout_tasks"], "training_rows": split["kept"],
        "rows_dropped_as_overlap": split["dropped"],
        "train": {**{k: run_summary.get(k) for k in ("steps", "first_loss", "final_loss", "val_loss", "tokens_per_s",
                                                      "train_time_s", "peak_memory", "stopped_early")},
                  "run_wall_time_s": run_wall, "final_val_pass_s": _final_val_pass_s(events),
                  # the train stage less the run itself: the budget's probe (and config, data checks)
                  "probe_s": round(stages["train"] - run_wall, 1) if stages.get("train") and run_wall else None,
                  "refits": _refits(events)},
        "base": summary["base"], "tuned": summary["tuned"], "gain_over_base": summary["gain_over_base"],
        "gate_passed": summary["gate"], "merge_parity": summary.get("merge_parity"),
        "budget": _json(out_dir / "data" / "budget.json") if (out_dir / "data" / "budget.json").is_file() else None,
        "summary_budget": summary.get("budget"),
        "failures_by_category": bench["metrics"].get("failures_by_category"),
        "failed_tasks": failed_tasks(bench),
    }


SPLITS = {"features": FEATURES, "confirm": CONFIRM}
IDENTITY_TRAIN_KEYS = ("steps", "first_loss", "final_loss")
"""What `record` copies from the training run that tells one run from another of the same seed and data."""


def add_splits(rec: dict, out_dir: Path, env: dict, names: list[str]) -> list[str]:
    """Add to `rec` (a record of the run in out_dir) each split in `names` it does not hold yet; returns those added.
    Refuses a record of another run (its seed, held-out split, training rows, and the training run's steps and
    losses must be the directory's), and a second reading of the confirmation split."""
    state = _json(out_dir / "dogfood_state.json")
    split = _json(out_dir / "data" / "heldout_split.json")
    run = _json(Path(_json(out_dir / "dogfood_summary.json")["run"]) / "run_summary.json")
    mine = {"seed": state["config"]["seed"], "heldout_tasks": split["heldout_tasks"], "training_rows": split["kept"],
            **{k: run.get(k) for k in IDENTITY_TRAIN_KEYS}}
    theirs = {**{k: rec.get(k) for k in ("seed", "heldout_tasks", "training_rows")},
              **{k: (rec.get("train") or {}).get(k) for k in IDENTITY_TRAIN_KEYS}}
    if theirs != mine:
        raise SystemExit(f"bench/dogfood.py: the record is not of the run in {out_dir}: it has {theirs}, the run "
                         f"{mine}; pass the record written for that directory")
    if "confirm" in names and "confirm" in rec:
        # The confirmation split is read once per finished recipe; a second reading, even one that would only be
        # skipped, means a rule is being judged again on numbers already seen.
        raise SystemExit("bench/dogfood.py: the record already holds the confirmation split, which is read once per "
                         "run; leave out --confirm to add the other splits")
    added = [name for name in names if name not in rec]
    for name in added:
        rec[name] = split_eval(out_dir, env, SPLITS[name], name)
    return added


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--from-dir", type=Path, help="Record a finished `mens dogfood -o DIR` instead of running one.")
    ap.add_argument("--seed", type=int, default=0, help="Passed to `mens dogfood --seed` (default 0, its default); "
                    "with --from-dir the record names the run's own seed.")
    ap.add_argument("--confirm", action="store_true", help="Also evaluate the tuned run on the confirmation split.")
    ap.add_argument("--features", action="store_true",
                    help="Also evaluate the tuned run on the documented-features split.")
    ap.add_argument("--budget", help="Passed to `mens dogfood --budget` (e.g. 30m).")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/dogfood[-quick]-<host>.json).")
    ap.add_argument("--wall-s", type=float, help="With --from-dir: the command's wall time, timed by whoever ran it "
                    "(`scripts/mens dogfood` from the start, venv build included).")
    ap.add_argument("--note", help="What the record is for (the change it measures, how it was run).")
    ap.add_argument("--add-to", type=Path, help="With --from-dir: a record of that run to add --features/--confirm "
                    "to (splits it holds are not evaluated again; --confirm on a record that holds the "
                    "confirmation split is refused); written back in place unless --output is given.")
    args = ap.parse_args()
    if args.wall_s is not None and not args.from_dir:
        ap.error("--wall-s goes with --from-dir: a run this script starts is timed here")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    names = [name for name, on in (("features", args.features), ("confirm", args.confirm)) if on]
    if args.add_to:
        if not args.from_dir or not names or args.wall_s is not None or args.note:
            ap.error("--add-to goes with --from-dir and --features and/or --confirm (the record keeps its own "
                     "wall time and note)")
        rec = _json(args.add_to)
        added = add_splits(rec, args.from_dir, env, names)
        dest = args.output or args.add_to
        dest.write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")
        kept = [name for name in names if name not in added]
        print(f"wrote {dest}: added {', '.join(added) or 'nothing'}"
              + (f"; {', '.join(kept)} already there, not evaluated again" if kept else ""), file=sys.stderr)
        return
    wall = None if args.wall_s is None else round(args.wall_s, 1)  # as a run this script times
    if args.from_dir:
        out_dir = args.from_dir
    else:
        out_dir = Path(tempfile.mkdtemp(prefix="mens-dogfood-")) / "df"
        t0 = time.time()
        subprocess.run([str(REPO / "scripts" / "mens"), "dogfood", "-o", str(out_dir), "--seed", str(args.seed),
                        *(["--quick"] if args.quick else []), *(["--budget", args.budget] if args.budget else [])],
                       check=True, env=env)
        wall = round(time.time() - t0, 1)
    result = record(out_dir, wall, args.quick, args.note)
    for name in names:
        result[name] = split_eval(out_dir, env, SPLITS[name], name)
    name = f"dogfood{'-quick' if args.quick else ''}-{socket.gethostname()}.json"
    dest = args.output or REPO / "bench" / "results" / name
    dest.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
