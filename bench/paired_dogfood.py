"""Paired `mens dogfood` runs of one commit, seed by seed, each from a fresh clone, recorded by bench/dogfood.py.

A data or recipe arm is judged against base records of the same path and seeds (docs/benchmarks.md): each run here
clones this repository into WORK/run-TAG-SEED, checks out the pinned commit (an arm's unlanded commit must be a
branch of this repository), times the command as a user runs it (the clone's own venv built by `scripts/mens`), and
records the finished directory with the held-out and features splits into WORK/dogfood-TAG-seedS.json.
`confirm` adds the confirmation split to those records (read once, after the rule written before the runs has
judged the other two splits); `show` prints a record's headline numbers in tasks of the split.

Run with any python3 (it imports neither torch nor mens), one run at a time on a quiet CPU:
  python3 bench/paired_dogfood.py run --commit C --tag T --note TEXT [--avx2-cap] 0 2
  python3 bench/paired_dogfood.py confirm --tag T 0 2
  python3 bench/paired_dogfood.py show WORK/dogfood-T-seed0.json ...
Progress lines go to WORK/status.log and each step's output to WORK/run-TAG-SEED.log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# Caps oneDNN and ATen at AVX2: the f32 path a CPU without AVX512-BF16 takes, on one that has it.
AVX2_CAP = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


class PairedRunError(Exception):
    """A run or record this harness refuses, with what to do about it."""


def record_path(work: Path, tag: str, seed: int) -> Path:
    return work / f"dogfood-{tag}-seed{seed}.json"


def clone_path(work: Path, tag: str, seed: int) -> Path:
    return work / f"run-{tag}-{seed}"


def _bench_dogfood(clone: Path, args: list[str], env: dict, out) -> int:
    """bench/dogfood.py on the clone's finished `df` directory, with the clone's own venv; its exit status."""
    return subprocess.run([str(clone / ".venv" / "bin" / "python"), "bench/dogfood.py", "--from-dir", "df", *args],
                          cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def _status(work: Path, line: str) -> None:
    with open(work / "status.log", "a", encoding="utf-8") as f:
        f.write(f"{time.strftime('%H:%M:%S')} {line}\n")


def _env(avx2_cap: bool) -> dict:
    return {**os.environ, **OFFLINE, **(AVX2_CAP if avx2_cap else {})}


def resolve_commit(repo: Path, commit: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                         capture_output=True, text=True)
    if out.returncode:
        raise PairedRunError(f"commit {commit!r} is not in {repo}: commit the arm on a branch of this repository")
    return out.stdout.strip()


def run_seed(repo: Path, commit: str, tag: str, seed: int, work: Path, note: str, avx2_cap: bool = False,
             splits: tuple[str, ...] = ("--features",), dogfood_args: tuple[str, ...] = ()) -> Path:
    """One timed `mens dogfood --seed SEED` at `commit` from a fresh clone, then its record; the record's path."""
    record = record_path(work, tag, seed)
    if record.exists():
        raise PairedRunError(f"{record} exists: a finished run's record is never overwritten; move it or pick a tag")
    clone = clone_path(work, tag, seed)
    log = clone.with_name(clone.name + ".log")
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    env = _env(avx2_cap)
    _status(work, f"{tag} seed {seed} start {commit[:7]}")
    with open(log, "a", encoding="utf-8") as out:
        t0 = time.monotonic()
        rc = subprocess.run([str(clone / "scripts" / "mens"), "dogfood", "-o", "df", "--seed", str(seed),
                             *dogfood_args], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
        wall = round(time.monotonic() - t0, 1)
        _status(work, f"{tag} seed {seed} dogfood rc={rc} wall={wall}")
        if rc:
            raise PairedRunError(f"mens dogfood failed (exit {rc}) for {tag} seed {seed}: see {log}")
        rc = _bench_dogfood(clone, ["--wall-s", str(wall), *splits, "--note", note, "--output", str(record)], env, out)
    _status(work, f"{tag} seed {seed} record rc={rc}")
    if rc:
        raise PairedRunError(f"recording {tag} seed {seed} failed (exit {rc}): see {log}")
    return record


def confirm_seed(tag: str, seed: int, work: Path, avx2_cap: bool = False) -> Path:
    """Adds the confirmation split to a finished run's record, in the run's own clone; refuses a second reading."""
    record, clone = record_path(work, tag, seed), clone_path(work, tag, seed)
    if not record.exists() or not (clone / "df").is_dir():
        raise PairedRunError(f"no finished run for {tag} seed {seed} under {work}: `run` it first")
    if "confirm" in json.loads(record.read_text(encoding="utf-8")):
        raise PairedRunError(f"{record} already holds the confirmation split: it is read once per run")
    _status(work, f"confirm {tag} {seed} start")
    with open(work / f"confirm-{tag}-{seed}.log", "a", encoding="utf-8") as out:
        rc = _bench_dogfood(clone, ["--add-to", str(record), "--confirm", "--output", str(record)], _env(avx2_cap), out)
    _status(work, f"confirm {tag} {seed} rc={rc}")
    if rc:
        raise PairedRunError(f"the confirmation split failed (exit {rc}) for {tag} seed {seed}: see {out.name}")
    return record


def _tasks(mode: dict, n: int) -> str:
    return f"{round(mode['nonempty_parse_rate'] * n)}/{round(mode['pass_at_1'] * n)}"


def summary(record: dict) -> str:
    """One line: commit, wall, steps trained of the recipe, validation loss, probe, then parse/pass in tasks per
    decoding mode of the held-out split and of each extra split the record holds."""
    budget, train = record.get("budget", {}), record.get("train", {})
    n = record.get("heldout_tasks") or 60
    parts = [f"{str(record.get('commit'))[:7]} wall {record.get('command_wall_s')} s",
             f"steps {train.get('steps')}/{budget.get('recipe_steps')}",
             f"val {train['val_loss']:.3f}" if isinstance(train.get("val_loss"), (int, float)) else "val -",
             f"probe {(budget.get('probe') or {}).get('step_s')} s/step",
             "held-out " + " ".join(f"{k} {_tasks(v, n)}" for k, v in (record.get("tuned") or {}).items())]
    for key in ("features", "confirm"):
        if record.get(key):
            split = record[key]
            parts.append(f"{key} " + " ".join(f"{k} {_tasks(v, split.get('tasks', 60))}"
                                              for k, v in split["modes"].items()))
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "mens-paired",
                    help="where the clones, logs and records go (default $TMPDIR/mens-paired)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one timed dogfood run and its record per seed, in order")
    run.add_argument("--commit", required=True, help="the commit every seed runs (pinned: a branch moves)")
    run.add_argument("--tag", required=True, help="names the records: dogfood-TAG-seedS.json")
    run.add_argument("--note", required=True, help="what the arm is and the rule it is judged by")
    run.add_argument("--avx2-cap", action="store_true", help="cap oneDNN and ATen at AVX2 (the f32 path)")
    run.add_argument("--no-features", action="store_true", help="record the held-out split only")
    run.add_argument("--dogfood-arg", action="append", default=[], help="passed on to `mens dogfood` (repeatable)")
    run.add_argument("seeds", nargs="+", type=int)
    conf = sub.add_parser("confirm", help="add the confirmation split to finished runs' records (once)")
    conf.add_argument("--tag", required=True)
    conf.add_argument("--avx2-cap", action="store_true", help="as the runs were made")
    conf.add_argument("seeds", nargs="+", type=int)
    show = sub.add_parser("show", help="a record's headline numbers per line")
    show.add_argument("records", nargs="+", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "show":
            for path in args.records:
                print(f"{path.name}: {summary(json.loads(path.read_text(encoding='utf-8')))}")
            return 0
        args.work.mkdir(parents=True, exist_ok=True)
        commit = resolve_commit(REPO, args.commit) if args.cmd == "run" else ""
        for seed in args.seeds:
            if args.cmd == "run":
                path = run_seed(REPO, commit, args.tag, seed, args.work, args.note, args.avx2_cap,
                                () if args.no_features else ("--features",), tuple(args.dogfood_arg))
            else:
                path = confirm_seed(args.tag, seed, args.work, args.avx2_cap)
            print(f"{path}: {summary(json.loads(path.read_text(encoding='utf-8')))}")
    except (PairedRunError, OSError, ValueError, KeyError, subprocess.CalledProcessError) as e:
        print(f"paired_dogfood: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
