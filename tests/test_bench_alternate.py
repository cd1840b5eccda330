"""bench/alternate.py's helpers for the benches that time dogfood's recipe in two arms: the config an arm trains
and the step times it reads back."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from alternate import dogfood_recipe, speedup, step_events  # noqa: E402


def test_an_arm_trains_dogfoods_recipe_for_the_asked_steps_without_checkpoints_or_mid_run_validation(tmp_path):
    from mens.dogfood import stages
    from mens.dogfood.pipeline import Context, DogfoodConfig

    out = tmp_path / "arm"
    tc = dogfood_recipe(tmp_path / "df", 3, out, 16)
    recipe = stages.train_config(Context(DogfoodConfig(output_dir=tmp_path / "df", seed=3), lambda *_: None))
    assert (tc.max_steps, tc.eval_every, tc.save_every, tc.output_dir) == (16, 0, 0, str(out))
    assert (tc.seed, tc.preset, tc.learning_rate, tc.data) == (3, recipe.preset, recipe.learning_rate, recipe.data)


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
