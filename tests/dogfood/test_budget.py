"""`mens dogfood --budget`: the duration parser and the arithmetic that fits steps to a measured machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from mens.dogfood.budget import (
    MIN_STEPS,
    POST_TRAIN_FACTOR,
    POST_TRAIN_FACTOR_TRAINED,
    POST_TRAIN_FIXED_S,
    PROBE_VAL_SHARE,
    RUN_VAL_SHARE,
    SAFETY,
    TRAINED_SHARE,
    Probe,
    parse_budget,
    plan_budget,
)
from mens.errors import UsageError


def test_parse_budget_spellings():
    assert parse_budget("30m") == 1800 and parse_budget("1h30m") == 5400 and parse_budget("900") == 900
    assert parse_budget("90s") == 90 and parse_budget("1.5h") == 5400
    for off in (None, "none", "off", "", "0"):
        assert parse_budget(off) is None
    for bad in ("30 minutes", "m30", "1x", "30m garbage"):
        with pytest.raises(UsageError, match="expected a duration"):
            parse_budget(bad)


def _probe(step_s=6.0, recipe=742):
    return Probe(step_s=step_s, val_s=40.0, startup_s=15.0, recipe_steps=recipe)


def test_plan_fits_steps_to_what_the_budget_leaves():
    plan = plan_budget(1800, elapsed_s=120, base_eval_s=100, probe=_probe())
    # 1800 - 120 - (3.0 * 100 + 30) = 1350 s for training; the run's final validation reads a quarter of the rows,
    # a quarter of the probe's whole pass (40 s): 0.92 * 1350 - 15 - 10 = 1217 s -> 202 steps of 6 s
    assert RUN_VAL_SHARE == 0.25
    # the probe's rows (every 16th) are among the run's (every 4th), so its scaled time speaks for the same rows
    assert round(1 / PROBE_VAL_SHARE) % round(1 / RUN_VAL_SHARE) == 0
    assert plan.train_s == 1350 and plan.steps == 202 and plan.recipe_steps == 742
    assert "202 of the recipe's 742 steps" in plan.note
    planned = plan.steps * 6.0 + 10 + 15 + plan.elapsed_s + plan.reserve_s
    assert planned <= 1800  # the plan keeps the budget by its own numbers
    # the hard limit for a machine that slows down mid-run: the training share less start-up and a final validation
    assert plan.max_time_s == 1350 - 15 - 10 and plan.max_time_s > plan.steps * 6.0 + 10


def test_a_slower_machine_gets_fewer_steps_and_a_fast_one_never_more_than_the_recipe():
    slow = plan_budget(1800, 120, 100, _probe(step_s=12.0))
    fast = plan_budget(1800, 120, 100, _probe(step_s=0.5))
    assert slow.steps == 101 and fast.steps == 742 and "fit the budget" in fast.note


def test_a_plan_that_trains_most_of_the_recipe_reserves_less_for_the_stages_after_it():
    """The reserve follows the share of the recipe the plan trains: the smaller factor from TRAINED_SHARE on,
    decided on the plan made with it (a plan under the share is made again with the larger reserve)."""
    assert POST_TRAIN_FACTOR_TRAINED < POST_TRAIN_FACTOR

    def fit(reserve, step_s):  # the plan's own arithmetic (see the first test)
        return int((SAFETY * (1800 - 120 - reserve) - 15 - 10) // step_s)

    trained = plan_budget(1800, 120, 40, _probe(step_s=2.0))
    assert trained.reserve_factor == POST_TRAIN_FACTOR_TRAINED
    assert trained.reserve_s == POST_TRAIN_FACTOR_TRAINED * 40 + POST_TRAIN_FIXED_S == 110
    assert trained.steps == fit(110, 2.0) == 709 and trained.train_s == 1800 - 120 - 110
    assert "2 base evaluations and 30 s" in trained.note and trained.steps >= TRAINED_SHARE * 742
    # at the border: the smaller reserve fits just TRAINED_SHARE of the recipe, the larger would not
    step_s = 2.87
    border = plan_budget(1800, 120, 40, _probe(step_s=step_s))
    assert fit(110, step_s) >= TRAINED_SHARE * 742 > fit(150, step_s)
    assert border.reserve_factor == POST_TRAIN_FACTOR_TRAINED and border.steps == fit(110, step_s)
    # a short run (a weaker model, longer answers to repair) keeps the larger reserve, and plans with it
    short = plan_budget(1800, 120, 40, _probe(step_s=3.0))
    assert fit(110, 3.0) < TRAINED_SHARE * 742
    assert short.reserve_factor == POST_TRAIN_FACTOR and short.reserve_s == 150 and short.steps == fit(150, 3.0)
    assert "3 base evaluations and 30 s" in short.note


def test_a_budget_too_small_for_training_is_refused_with_the_numbers():
    with pytest.raises(UsageError, match=r"fewer than 20; give a longer --budget"):
        plan_budget(600, 120, 100, _probe())
    assert MIN_STEPS == 20


def test_the_plan_sets_the_length_only():
    """A cut schedule trains the preset's recipe as it is (the cpu preset's LoRA+ was measured cut and whole):
    the plan carries steps and limits, no learning-rate or optimizer changes."""
    cut, whole = plan_budget(1800, 120, 100, _probe()), plan_budget(1800, 120, 100, _probe(step_s=0.5))
    assert cut.steps == 202 and whole.steps == 742
    for plan in (cut, whole):
        assert not {"lr_scale", "lora_plus_ratio"} & set(vars(plan)) and "LoRA" not in plan.note


def test_the_whole_recipe_is_estimated_from_the_runs_own_step_time():
    from mens.dogfood.budget import mean_step_s, whole_recipe, whole_recipe_train_s

    assert mean_step_s([1.0, 7.0, 13.0, 19.0]) == 6.0  # the first step (warm-up) is left out
    assert mean_step_s([1.0, 7.0, 2.0, 8.0]) == 6.0  # a resumed run's clock starts again: that gap is left out
    assert mean_step_s([3.0]) is None
    probe = {"recipe_steps": 742, "startup_s": 15.0, "val_s": 40.0}
    # every step at the run's pace, start-up, and validation at steps 50, 100, ..., 700 and at the end: 15 passes
    assert whole_recipe_train_s(probe, 6.0, 50) == 15 + 742 * 6 + 15 * 40
    assert whole_recipe_train_s({**probe, "recipe_steps": 750}, 6.0, 50) == 15 + 750 * 6 + 15 * 40
    assert whole_recipe_train_s(probe, 6.0, 0) == 15 + 742 * 6 + 40  # no mid-run validation: the final one
    # at each epoch's end (371 and 742): two passes, the second the run's last
    assert whole_recipe_train_s({**probe, "steps_per_epoch": 371}, 6.0, "epoch") == 15 + 742 * 6 + 2 * 40
    assert whole_recipe_train_s({**probe, "steps_per_epoch": 300}, 6.0, "epoch") == 15 + 742 * 6 + 3 * 40
    plan = {"budget_s": 1800.0, "recipe_steps": 742, "whole_recipe": {"step_s": 6.0, "train_s": 5082.0}}
    # the stages as they took (1,500 s), with the training stage (1,100 s, the probe included) replaced
    assert whole_recipe(plan, trained_steps=170, train_stage_s=1100.0, stages_s=1500.0) == {
        "budget_s": 1800.0, "steps": 170, "recipe_steps": 742, "step_s": 6.0, "whole_recipe_s": 5482.0}
    assert whole_recipe(plan, 742, 1100.0, 1500.0) is None  # the budget fitted the whole recipe
    assert whole_recipe({"recipe_steps": 742}, 170, 1100.0, 1500.0) is None  # no estimate was written


def test_the_launch_time_counts_only_when_it_is_this_commands():
    from mens.dogfood.budget import LAUNCHED_AT_ENV, since_launch

    assert since_launch(1000.0, {LAUNCHED_AT_ENV: "910"}) == 90.0  # scripts/mens started 90 s ago (venv built)
    for value in ("-3000", "1001", "soon", ""):  # over an hour back, in the future, not a number, empty
        assert since_launch(1000.0, {LAUNCHED_AT_ENV: value}) is None, value
    assert since_launch(1000.0, {}) is None


STAT = """cpu  900 10 300 5000 40 5 6 70 0 0
cpu0 400 5 100 2500 20 2 3 30 0 0
cpu1 500 5 200 2500 20 3 3 40 0 0
cpu2 999 0 0 0 0 0 0 0 0 0
intr 12345
ctxt 678
"""


def test_busy_seconds_counts_the_allowed_cpus_without_idle_or_steal():
    from mens.dogfood.budget import busy_seconds

    # cpu0: user 400 + nice 5 + system 100 + irq 2 + softirq 3; idle, iowait and steal (30) are not busy
    assert busy_seconds(STAT, {0}, 100.0) == pytest.approx(5.10)
    assert busy_seconds(STAT, {0, 1}, 100.0) == pytest.approx(5.10 + 7.11)  # the aggregate line is not added
    assert busy_seconds(STAT, {5}, 100.0) == 0.0


def test_others_cores_is_busy_time_this_process_did_not_spend():
    from mens.dogfood.budget import CpuSnapshot, others_cores

    before = CpuSnapshot(wall_s=100.0, busy_s=1000.0, own_s=50.0)
    assert others_cores(before, CpuSnapshot(wall_s=110.0, busy_s=1030.0, own_s=70.0)) == 1.0  # 30 busy, 20 ours
    assert others_cores(before, CpuSnapshot(wall_s=110.0, busy_s=1019.0, own_s=70.0)) == 0.0  # tick rounding
    assert others_cores(before, None) is None and others_cores(None, before) is None
    assert others_cores(before, before) is None


def test_a_busy_probe_is_named_in_the_plan():
    quiet = plan_budget(1800, 120, 100, _probe())
    probe = _probe()
    probe.others_cores = 1.2
    busy = plan_budget(1800, 120, 100, probe)
    assert busy.steps == quiet.steps  # the reading informs the user; the plan still fits the measured step time
    assert "other processes kept 1.2 cores busy" in busy.note and "other processes" not in quiet.note
    probe.others_cores = 0.3
    assert "other processes" not in plan_budget(1800, 120, 100, probe).note


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads Linux's /proc/stat")
def test_a_real_reading_sees_another_process_and_not_this_one():
    import subprocess
    import sys
    import time

    from mens.dogfood.budget import cpu_snapshot, others_cores

    before = cpu_snapshot()
    end = time.monotonic() + 0.6
    while time.monotonic() < end:  # this process's own work is not "others"
        pass
    own = others_cores(before, cpu_snapshot())
    before = cpu_snapshot()
    subprocess.run([sys.executable, "-c", "import time\nt=time.monotonic()+0.8\nwhile time.monotonic()<t: pass"],
                   check=True)
    other = others_cores(before, cpu_snapshot())
    assert own is not None and other is not None
    assert other - own >= 0.4, (own, other)  # a difference: a steady load of other jobs is in both readings


def test_the_probe_times_part_of_a_validation_pass_and_scales_it_to_a_whole_one(tmp_path, monkeypatch):
    """The probe validates on PROBE_VAL_SHARE of the rows; the plan pays for a whole pass: the part's time (after
    the last step, in the loop's time) times every row's tokens over the tokens read."""
    import json
    from types import SimpleNamespace

    import mens.train.run
    from mens.dogfood import budget

    seen = {}

    def fake_run(cfg, *, val_share=1.0):
        seen["val_share"], seen["max_steps"] = val_share, cfg.max_steps
        events = [{"event": "train_start", "steps_per_epoch": 50},
                  *({"event": "step", "elapsed_s": 2.0 + 3.0 * i} for i in range(4)),  # 3 s a step after the first
                  {"event": "eval", "tokens": 250, "all_tokens": 1000}]
        Path(cfg.output_dir).mkdir(parents=True)
        (Path(cfg.output_dir) / "telemetry.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        return {"train_time_s": 11.0 + 4.0, "wall_time_s": 25.0, "steps": 4, "tokens_per_s": 100.0}

    monkeypatch.setattr(mens.train.run, "run_training", fake_run)
    tc = SimpleNamespace(max_steps=0, epochs=2, output_dir="", eval_every=0, save_every=0, resume=False,
                         log_every_s=0.0)
    probe = budget.probe_training(tc, tmp_path / "probe")
    assert seen == {"val_share": budget.PROBE_VAL_SHARE, "max_steps": budget.PROBE_STEPS}
    assert probe.step_s == 3.0 and probe.val_s == 16.0  # 4 s over a quarter of the tokens
    assert probe.startup_s == 10.0 and probe.recipe_steps == 100
    assert not (tmp_path / "probe").exists()
