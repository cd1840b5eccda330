"""data.second_pass "hardest": a run that ends inside its second pass trains first the rows its first pass found
hardest for their point in the run, and a resumed run orders that pass as the whole run would have."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from safetensors.torch import load_file
from train_tiny import tiny_config

from mens.train.checkpoint import second_pass_problem
from mens.train.data import LOSS_WINDOW, BatchPlan, hardest_first
from mens.train.run import run_training
from mens.train.telemetry import read_events


def _plan(n_rows=40, batch=2, seed=3):
    return BatchPlan(n_rows, batch, seed, 0)


def test_the_rows_of_the_steps_with_the_highest_relative_loss_come_first():
    plan = _plan()  # 20 steps a pass
    losses = [4.0 - 0.15 * s for s in range(20)]  # the loss falls as the run learns
    for s in (3, 11, 17):  # three steps well above their neighbours: step 17 is still below step 0's absolute loss
        losses[s] += 0.6
    order = hardest_first(plan, losses, total_steps=23)  # three steps into the second pass: 6 rows
    first = plan.epoch_order(0)
    spiked = {row for s in (3, 11, 17) for row in first[2 * s:2 * s + 2]}
    assert sorted(order) == list(range(40))
    assert set(order[:6]) == spiked
    # each group keeps the pass's own seeded random order
    shuffled = plan.epoch_order(1)
    assert order[:6] == [r for r in shuffled if r in spiked] and order[6:] == [r for r in shuffled if r not in spiked]


def test_hardness_is_measured_against_the_steps_around_not_the_whole_pass():
    """A falling loss alone makes no step hard, at the ends of the pass either: the window stays centred."""
    plan = _plan(n_rows=80)  # 40 steps a pass
    assert LOSS_WINDOW < 20
    losses = [4.0 - 0.08 * s for s in range(40)]
    assert hardest_first(plan, losses, total_steps=41) is not None
    losses[38] += 0.4  # 1.36 against neighbours at ~1.0, far below the first steps' ~4
    order = hardest_first(plan, losses, total_steps=41)  # 2 rows: one step's
    assert set(order[:2]) == set(plan.epoch_order(0)[76:78])
    losses[38] -= 0.4
    losses[1] += 0.2  # early in the pass, against its two neighbours only
    assert set(hardest_first(plan, losses, total_steps=41)[:2]) == set(plan.epoch_order(0)[2:4])


@pytest.mark.parametrize("total", [20, 40, 55, 19])
def test_a_run_that_reaches_the_end_of_the_second_pass_or_never_starts_it_keeps_the_random_order(total):
    assert hardest_first(_plan(), [1.0] * 20, total_steps=total) is None


def test_without_every_first_pass_loss_there_is_no_order():
    assert hardest_first(_plan(), [1.0] * 19, total_steps=25) is None


def test_the_plan_uses_the_order_for_the_second_pass_only():
    plan = _plan()
    before = [plan.epoch_order(e) for e in range(3)]
    plan.second_pass = list(reversed(range(40)))
    assert plan.epoch_order(1) == plan.second_pass and plan.rows_for_step(20) == [39, 38]
    assert plan.epoch_order(0) == before[0] and plan.epoch_order(2) == before[2] != before[1]


def test_a_checkpoint_with_a_bad_order_or_losses_is_refused_by_name():
    assert second_pass_problem({}) is None
    assert second_pass_problem({"first_pass_losses": [1.0, 2], "second_pass": [2, 0, 1]}) is None
    assert "first_pass_losses" in second_pass_problem({"first_pass_losses": [1.0, math.nan]})
    assert "first_pass_losses" in second_pass_problem({"first_pass_losses": "1.0"})
    assert "second_pass" in second_pass_problem({"second_pass": [0, 0, 1]})
    assert "second_pass" in second_pass_problem({"second_pass": [0, 1.0]})
    assert "second_pass" in second_pass_problem({"second_pass": {"0": 1}})


RUN = dict(pack=False, batch_size=4, max_steps=12, save_every=0, eval_every=0, second_pass="hardest",
           learning_rate=3e-3)  # 36 training rows: 9 steps a pass, 3 of the second


def test_a_cut_run_trains_the_hardest_rows_of_its_first_pass_in_its_second(data_dir, tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    run_training(tiny_config(data_dir, out, tiny_model_dir, **RUN))
    events = read_events(out)
    (ordered,) = [e for e in events if e["event"] == "second_pass"]
    assert ordered["step"] == 9 and ordered["rows"] == 36 and ordered["hardest_first"] == 12
    losses = [e["loss"] for e in events if e["event"] == "step"]
    plan = BatchPlan(36, 4, 42, 12)  # the config's default seed
    order = hardest_first(plan, losses[:9], total_steps=12)
    assert order is not None and order != plan.epoch_order(1)
    man = json.loads((out / "training_manifest.json").read_text())
    assert man["config"]["second_pass"] == "hardest"


def test_the_second_pass_order_survives_a_resume(data_dir, tmp_path, tiny_model_dir):
    """Resumed before the second pass (from the first pass's losses) and inside it (from the saved order), the
    run ends where the uninterrupted one did."""
    over = {**RUN, "save_every": 4, "keep_checkpoints": 3}
    ref = tmp_path / "ref"
    run_training(tiny_config(data_dir, ref, tiny_model_dir, **over))
    want = load_file(str(ref / "adapter_model.safetensors"))
    state8 = json.loads((ref / "checkpoints" / "step-8" / "state.json").read_text())
    assert len(state8["first_pass_losses"]) == 8 and "second_pass" not in state8
    for resume_at in (8, 4):
        cut = tmp_path / f"cut{resume_at}"
        shutil.copytree(ref, cut)
        for later in cut.glob("checkpoints/step-*"):
            if int(later.name.split("-")[1]) > resume_at:
                shutil.rmtree(later)
        (cut / "adapter_model.safetensors").unlink()
        run_training(tiny_config(data_dir, cut, tiny_model_dir, **over, resume=True))
        got = load_file(str(cut / "adapter_model.safetensors"))
        assert max((want[k] - got[k]).abs().max().item() for k in want) < 1e-6


def test_a_resume_inside_the_second_pass_reads_the_saved_order(data_dir, tmp_path, tiny_model_dir):
    over = {**RUN, "max_steps": 14, "save_every": 3, "keep_checkpoints": 2}
    ref = tmp_path / "ref"
    run_training(tiny_config(data_dir, ref, tiny_model_dir, **over))
    state9, state = (json.loads((ref / "checkpoints" / f"step-{n}" / "state.json").read_text()) for n in (9, 12))
    assert "second_pass" not in state9 and len(state9["first_pass_losses"]) == 9
    plan = BatchPlan(36, 4, 42, 14)  # the config's default seed
    assert state["second_pass"] == hardest_first(plan, state9["first_pass_losses"], 14) != plan.epoch_order(1)
    assert state["first_pass_losses"] == []  # they have served: later checkpoints carry the order alone
    cut = tmp_path / "cut"
    shutil.copytree(ref, cut)
    (cut / "adapter_model.safetensors").unlink()
    run_training(tiny_config(data_dir, cut, tiny_model_dir, **over, resume=True))
    assert [e["event"] for e in read_events(cut)].count("second_pass") == 1  # not ordered again
    want, got = load_file(str(ref / "adapter_model.safetensors")), load_file(str(cut / "adapter_model.safetensors"))
    assert max((want[k] - got[k]).abs().max().item() for k in want) < 1e-6
