"""bench/recipe_seeds.py --from-runs: per-recipe means, tasks failed in every run, paired gains, config changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _run(root, name, bench, *, seed, data="d1", passed=(), parsed=(), **config):
    run = root / name
    run.mkdir()
    ids = ["a", "b", "c", "d"]
    (run / "training_manifest.json").write_text(json.dumps({
        "config": {"seed": seed, "learning_rate": 8e-4, "output_dir": str(run), **config},
        "data_sha256": data, "examples": {"train": 100}}))
    (run / "run_summary.json").write_text(json.dumps({"train_time_s": 12.5}))
    results = [{"id": i, "samples": [{"pass": i in passed, "has_code": i in parsed}]} for i in ids]
    greedy = {"tasks": 4, "nonempty_parse_rate": len(parsed) / 4, "pass_at_1": len(passed) / 4}
    (run / "benchmark_results.json").write_text(json.dumps({"bench": str(bench), "modes": {"greedy": greedy},
                                                            "metrics": greedy, "results": results}))
    return str(run)


def test_from_runs_summarizes_and_pairs(tmp_path):
    bench = tmp_path / "heldout.jsonl"
    bench.write_text('{"id": "a"}\n')
    a0 = _run(tmp_path, "a0", bench, seed=0, passed="ab", parsed="abc")
    a1 = _run(tmp_path, "a1", bench, seed=1, passed="a", parsed="abcd", neftune_alpha=0.0)  # a newer manifest
    b0 = _run(tmp_path, "b0", bench, seed=0, passed="abc", parsed="abcd", neftune_alpha=5.0)
    b1 = _run(tmp_path, "b1", bench, seed=1, data="d2", passed="abc", parsed="abcd", neftune_alpha=5.0)
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "recipe_seeds.py"), "--bench", str(bench),
                           "--from-runs", f"plain={a0},{a1}", "--from-runs", f"noise={b0},{b1}",
                           "--note", "noise=NEFTune", "--output", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    plain, noise = json.loads(out.read_text())["recipes"].values()
    assert plain["nonempty_parse_rate"] == {"mean": 0.875, "min": 0.75, "max": 1.0}
    assert plain["failed_in_every_run"] == ["c", "d"] and plain["runs"][0]["unparsed"] == ["d"]
    assert noise["note"] == "NEFTune" and noise["runs"][0]["config_changes"] == {"neftune_alpha": 5.0}
    # the first run's manifest predates neftune_alpha: a later run with its default value changes nothing
    assert plain["runs"][1]["config_changes"] == {}
    # seed 1 of `noise` trained on other data, so only seed 0 is a paired comparison
    assert noise["paired_gain_over_plain"] == [{"seed": 0, "nonempty_parse": 1, "task_pass": 1}]
    # unless the recipe is a change of the data itself: then runs pair by seed
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "recipe_seeds.py"), "--bench", str(bench),
                           "--from-runs", f"plain={a0},{a1}", "--from-runs", f"noise={b0},{b1}",
                           "--data-recipe", "noise", "--output", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["recipes"]["noise"]["paired_gain_over_plain"] == [
        {"seed": 0, "nonempty_parse": 1, "task_pass": 1}, {"seed": 1, "nonempty_parse": 0, "task_pass": 2}]


def test_a_run_judged_on_another_bench_is_refused(tmp_path):
    bench, other = tmp_path / "heldout.jsonl", tmp_path / "other.jsonl"
    bench.write_text('{"id": "a"}\n')
    other.write_text('{"id": "z"}\n')
    run = _run(tmp_path, "r", other, seed=0)
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "recipe_seeds.py"), "--bench", str(bench),
                           "--from-runs", f"x={run}", "--output", str(tmp_path / "o.json")],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "not (or no longer) the --bench file" in done.stderr
