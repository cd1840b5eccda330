"""bench/alternate.py's helpers for the benches that time dogfood's recipe in two arms: the config an arm trains
and the step times it reads back."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from alternate import dogfood_recipe, speedup, step_events, write_same_rows_report  # noqa: E402


def test_an_arm_trains_dogfoods_recipe_for_the_asked_steps_without_checkpoints_or_mid_run_validation(tmp_path):
    from mens.dogfood import stages
    from mens.dogfood.pipeline import Context, DogfoodConfig

    out = tmp_path / "arm"
    tc = dogfood_recipe(tmp_path / "df", 3, out, 16)
    recipe = stages.train_config(Context(DogfoodConfig(output_dir=tmp_path / "df", seed=3), lambda *_: None))
    assert (tc.max_steps, tc.eval_every, tc.save_every, tc.output_dir) == (16, 0, 0, str(out))
    assert (tc.seed, tc.preset, tc.learning_rate, tc.data) == (3, recipe.preset, recipe.learning_rate, recipe.data)


def test_an_arm_trains_the_model_and_overrides_the_dogfood_run_recorded(tmp_path):
    """A run made with --model and --train overrides is timed on that model and recipe, not dogfood's defaults;
    the seed is the bench's."""
    from mens.dogfood.pipeline import DogfoodConfig, _config_json

    df = tmp_path / "df"
    df.mkdir()
    cfg = DogfoodConfig(output_dir=df, model="/models/tiny", seed=7, system_prompt="Answer in Vox.",
                        train={"optimizer.learning_rate": 0.001, "adapter.r": 4})
    (df / "dogfood_state.json").write_text(json.dumps({"config": _config_json(cfg), "stages": {}}))
    tc = dogfood_recipe(df, 3, tmp_path / "arm", 5)
    assert (tc.model.name, tc.learning_rate, tc.r, tc.system_prompt) == ("/models/tiny", 0.001, 4, "Answer in Vox.")
    assert tc.seed == 3


def test_step_times_leave_out_the_first_step_and_speedup_is_per_round(tmp_path):
    from mens.train.telemetry import Telemetry

    log = Telemetry(tmp_path)
    log.emit("train_start", steps_per_epoch=4)
    for step, elapsed in enumerate((5.0, 7.0, 10.0, 12.5), start=1):
        log.emit("step", step=step, elapsed_s=elapsed, loss=1.0 / step)
    steps, times = step_events(tmp_path)
    assert [e["step"] for e in steps] == [1, 2, 3, 4] and times == [2.0, 3.0, 2.5]
    runs = [{"round": 0, "arm": "a", "mean_step_s": 3.0}, {"round": 0, "arm": "b", "mean_step_s": 2.0},
            {"round": 1, "arm": "b", "mean_step_s": 2.5}, {"round": 1, "arm": "a", "mean_step_s": 2.5}]
    assert speedup(runs, "a", "b") == {"min": 1.0, "median": 1.25, "max": 1.5, "n": 2}


def test_a_same_rows_report_names_the_machine_the_speedup_and_the_largest_loss_difference(tmp_path):
    args = argparse.Namespace(steps=3, repeats=2, seed=0, dogfood_dir=tmp_path / "df", out=tmp_path / "r" / "x.json")
    runs = [{"round": 0, "arm": "slow", "mean_step_s": 3.0, "losses": [2.0, 1.5]},
            {"round": 0, "arm": "fast", "mean_step_s": 2.0, "losses": [2.0, 1.25]},
            {"round": 1, "arm": "fast", "mean_step_s": 2.0, "losses": [2.0, 1.25]},
            {"round": 1, "arm": "slow", "mean_step_s": 2.5, "losses": [2.0, 1.5]}]
    write_same_rows_report("some_bench", args, runs, "slow", "fast", "a note")
    doc = json.loads(args.out.read_text())
    assert doc["bench"] == "some_bench" and doc["machine"]["cpu_count"] >= 1 and doc["note"] == "a note"
    assert doc["speedup"] == {"min": 1.25, "median": 1.375, "max": 1.5, "n": 2}
    assert doc["max_loss_difference"] == 0.25 and len(doc["runs"]) == 4 and doc["steps"] == 3
