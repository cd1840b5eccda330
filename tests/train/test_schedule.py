"""The learning-rate schedule, and a run that re-fits its length to its time limit (schedule.fit_to_time): the
curve stays continuous and ends at 0 at the new count, the loop follows it, and a resumed run continues it."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from safetensors.torch import load_file
from train_tiny import tiny_config, vox_rows, write_jsonl

from mens.train.schedule import REFIT_TARGET, cosine_progress, lr_multiplier, refit_total


def _old_multiplier(step, warmup, total):  # the schedule before re-fits existed
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def test_without_refits_the_curve_is_warmup_then_cosine_to_zero():
    for warmup, total in ((0, 12), (10, 742), (3, 40)):
        got = [lr_multiplier(s, warmup=warmup, total=total) for s in range(total + 2)]
        assert got == [_old_multiplier(s, warmup, total) for s in range(total + 2)]
        assert got[total] == pytest.approx(0.0, abs=1e-12)
    # the plan itself as a first re-fit entry describes the same curve (what a checkpoint records)
    assert [lr_multiplier(s, warmup=10, total=99, refits=[(10, 742)]) for s in range(760)] == \
        [lr_multiplier(s, warmup=10, total=742) for s in range(760)]


@pytest.mark.parametrize("new_total", [300, 620, 900])
def test_a_refit_keeps_the_curve_continuous_and_ends_it_at_the_new_count(new_total):
    warmup, total, at = 10, 600, 130
    refits = [(warmup, total), (at, new_total)]
    curve = [lr_multiplier(s, warmup=warmup, total=total, refits=refits) for s in range(new_total + 1)]
    before = [lr_multiplier(s, warmup=warmup, total=total) for s in range(at + 1)]
    assert curve[:at + 1] == before  # unchanged up to and at the re-fit step
    assert curve[new_total] == pytest.approx(0.0, abs=1e-12) and curve[new_total - 1] > 0
    steps = [abs(b - a) for a, b in zip(curve[warmup:], curve[warmup + 1:], strict=False)]
    assert max(steps) < 3.0 / (new_total - at)  # no jump: each step moves at most what a cosine over the rest does
    assert all(b <= a for a, b in zip(curve[warmup:], curve[warmup + 1:], strict=False))  # still decaying
    # the progress reached at the re-fit is kept; the rest is spread evenly over the new count
    p_at = (at - warmup) / (total - warmup)
    mid = (at + new_total) // 2
    assert cosine_progress(mid, warmup=warmup, total=total, refits=refits) == pytest.approx(
        p_at + (mid - at) / (new_total - at) * (1 - p_at))


def test_refit_total_fills_the_target_share_of_the_limit_within_the_ceiling():
    # 100 steps in 200 s at 2 s a step, limit 1000 s: (0.97 * 1000 - 200) / 2 = 385 more steps
    assert refit_total(step=100, elapsed_s=200, step_s=2.0, max_time_s=1000, ceiling=742) == 100 + 385
    assert REFIT_TARGET == 0.97
    assert refit_total(step=100, elapsed_s=200, step_s=0.5, max_time_s=1000, ceiling=742) == 742  # the recipe's
    assert refit_total(step=100, elapsed_s=990, step_s=2.0, max_time_s=1000, ceiling=742) == 101  # at least one


def _refit_run(tmp_path, tiny_model_dir, monkeypatch, out, *, resume=False, fit_max_steps=0):
    """A tiny time-fitted run whose re-fits are fixed (the loop's arithmetic is tested above): 10 steps planned,
    16 at the first re-fit, 13 at the second, the epochs' 20 steps as the ceiling (or `fit_max_steps`)."""
    import mens.train.loop as loop
    from mens.train.run import run_training

    answers = {2: 16, 7: 13, 8: 13, 11: 14, 13: 14}
    calls = []

    def fixed(*, step, elapsed_s, step_s, max_time_s, ceiling):
        calls.append(step)
        assert step_s > 0 and elapsed_s > 0 and max_time_s == 3600.0 and ceiling == (fit_max_steps or 20)
        return min(ceiling, answers.get(step, 16))

    monkeypatch.setattr(loop, "refit_total", fixed)
    data = tmp_path / "data"
    if not data.is_dir():
        data.mkdir()
        write_jsonl(data / "train.jsonl", vox_rows(8))
    cfg = tiny_config(data, out, tiny_model_dir, max_steps=10, epochs=10, batch_size=4, val_fraction=0,
                      min_examples=4, save_every=4, keep_checkpoints=10, eval_every=0, learning_rate=1e-2)
    cfg.max_time_s, cfg.fit_to_time, cfg.resume, cfg.fit_max_steps = 3600.0, True, resume, fit_max_steps
    return run_training(cfg), calls


def test_fit_max_steps_is_the_ceiling_of_the_refits(tmp_path, tiny_model_dir, monkeypatch):
    """A recipe of 12 steps (dogfood's --max-steps under a budget) is never re-fitted past them, though the
    epochs would give 20 and the time limit more."""
    summary, calls = _refit_run(tmp_path, tiny_model_dir, monkeypatch, tmp_path / "capped", fit_max_steps=12)
    # 16 capped to 12 at step 2; the shares of 12 then fall at steps 5, 8, 10 and 11, each capped to 12 again
    assert calls == [2, 5, 8, 10, 11] and summary["steps"] == 12


def test_a_time_fitted_run_follows_its_refits_and_resumes_onto_the_same_curve(tmp_path, tiny_model_dir, monkeypatch):
    out = tmp_path / "fitted"
    summary, calls = _refit_run(tmp_path, tiny_model_dir, monkeypatch, out)
    # shares of the count planned at the time: 0.2 x 10 -> step 2 (16), 0.4 x 16 -> step 7 (13), 0.6 x 13 -> 8,
    # 0.8 x 13 -> 11 (14), 0.9 x 14 -> 13 (14: no change)
    assert calls == [2, 7, 8, 11, 13] and summary["steps"] == 14 and not summary["stopped_early"]
    events = [json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines()]
    assert [(e["step"], e["from_total"], e["to_total"]) for e in events if e["event"] == "refit"] == \
        [(2, 10, 16), (7, 16, 13), (11, 13, 14)]
    refits = [(0, 10), (2, 16), (7, 13), (11, 14)]
    lrs = [e["lr"] for e in events if e["event"] == "step"]
    assert lrs == pytest.approx([1e-2 * lr_multiplier(s, warmup=0, total=10, refits=refits) for s in range(14)])
    steps = json.loads((out / "training_manifest.json").read_text())["steps"]
    assert steps["planned"] == 10 and steps["completed"] == 14 and steps["refits"] == [list(r) for r in refits]
    state = json.loads((out / "checkpoints" / "step-8" / "state.json").read_text())
    assert state["refits"] == [[0, 10], [2, 16], [7, 13]] and state["total_steps"] == 13

    # Resumed from step 8 (after two re-fits): the same curve, re-fits and final adapter as without the stop.
    again = tmp_path / "resumed"
    shutil.copytree(out, again)
    for later in ("step-12",):
        shutil.rmtree(again / "checkpoints" / later)
    (again / "adapter_model.safetensors").unlink()
    summary2, calls2 = _refit_run(tmp_path, tiny_model_dir, monkeypatch, again, resume=True)
    assert summary2["steps"] == 14 and calls2 == [11, 13]
    events2 = [json.loads(line) for line in (again / "telemetry.jsonl").read_text().splitlines()]
    last_start = max(i for i, e in enumerate(events2) if e["event"] == "train_start")
    resumed = [e for e in events2[last_start:] if e["event"] == "step"]
    assert [e["step"] for e in resumed] == list(range(9, 15))
    assert [e["lr"] for e in resumed] == pytest.approx(lrs[8:])
    a, b = load_file(out / "adapter_model.safetensors"), load_file(again / "adapter_model.safetensors")
    assert set(a) == set(b) and all((a[k] == b[k]).all() for k in a)


def test_each_refit_reads_the_step_time_of_the_stretch_since_the_last(monkeypatch):
    """A slow stretch (another job on the machine) before one re-fit is not carried into the next; the time
    limit still counts from the loop's start."""
    from types import SimpleNamespace

    import mens.train.loop as loop
    from mens.train.distributed import Dist

    seen = []

    def record(*, step, elapsed_s, step_s, max_time_s, ceiling):
        seen.append((step, round(elapsed_s, 6), round(step_s, 6)))
        return 100

    clock = {"now": 0.0}
    monkeypatch.setattr(loop, "refit_total", record)
    monkeypatch.setattr(loop.time, "time", lambda: clock["now"])
    view = SimpleNamespace(note=lambda *_: None)
    telemetry = SimpleNamespace(emit=lambda *_, **__: None)
    cfg = SimpleNamespace(max_time_s=1000.0)
    window, refits, state = [10.0, 1], [], {}
    total, next_at = 100, 0
    for step, now in ((20, 200.0), (40, 220.0), (60, 240.0)):  # 10 s a step, then 1 s a step
        clock["now"] = now
        total, next_at = loop._refit(loop.LoopState(step=step), total=total, ceiling=200, next_at=next_at,
                                     t_start=0.0, window=window, cfg=cfg, d=Dist(), warmup=0, refits=refits,
                                     ckpt_state=state, telemetry=telemetry, view=view)
    assert seen == [(20, 200.0, 10.0), (40, 220.0, 1.0), (60, 240.0, 1.0)]
    assert window == [240.0, 60] and next_at == 3 and total == 100 and refits == []  # 100 = the count already planned


def test_malformed_refits_make_a_checkpoint_unusable():
    from mens.train.checkpoint import refits_problem

    assert refits_problem([]) is None and refits_problem([[0, 10], [2, 16], [7, 13]]) is None
    for bad in ([[2, "16"]], [[7, 13], [2, 16]], [[2]], "2,16", [[2, -1]], [[2, 16.0]], [[2, True]]):
        assert "refits" in refits_problem(bad), bad
