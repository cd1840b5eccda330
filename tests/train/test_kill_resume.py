"""Kill anywhere: a tiny run SIGKILLed inside a checkpoint write (named points, MENS_TEST_KILL_AT) or at a random
moment (inside steps, evaluation, writes) always resumes from its last complete checkpoint and ends with the same
adapter, bit for bit, as an uninterrupted run. Training runs in forked children (no re-import: ~1-3 s each)."""

from __future__ import annotations

import random

import pytest
from ckpt_tiny import assert_same_adapter, config, resumed_from, run_child, train_seconds
from train_tiny import vox_rows, write_jsonl

from mens.train.checkpoint import latest_checkpoint, step_of, verify_files
from mens.train.run import run_training

# Each named point and the checkpoint a run killed there must resume from (checkpoints at steps 2 and 4 of 6).
POINTS = {"checkpoint.start@4": 2, "checkpoint.weights@4": 2, "checkpoint.optimizer@4": 2,
          "checkpoint.state@4": 2, "checkpoint.checksums@4": 2, "checkpoint.renamed@4": 4, "final.written@6": 4}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("kill")
    data = root / "data"
    data.mkdir()
    write_jsonl(data / "train.jsonl", vox_rows(40))
    run_training(config(data, root / "ref", tiny_model_dir))  # in this process: the children fork its code
    return root, data, tiny_model_dir, train_seconds(root / "ref")


def _complete_step(out) -> int | None:
    """The newest complete checkpoint's step, after proving it intact."""
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return None
    verify_files(ckpt)
    return step_of(ckpt)


def _kill_then_resume(setup, out, **kill) -> tuple[int | None, bool]:
    """One killed run, then one resume to the end; returns the step the resume started from (-1: the run finished
    before the kill) and whether the kill left a half-written checkpoint or final adapter behind."""
    root, data, model_dir, _ = setup
    code = run_child(data, out, model_dir, **kill)
    if code == 0:
        return -1, False
    partial = any(out.rglob(".tmp-*"))
    assert code == -9, f"the training child exited {code}, not by SIGKILL"
    if "kill_at" in kill:  # every named point comes before the final adapter is published
        assert not (out / "adapter_config.json").exists()
    expect = _complete_step(out)
    assert run_child(data, out, model_dir) == 0
    assert resumed_from(out)[-1] == expect
    assert_same_adapter(out, root / "ref")
    return expect, partial


def test_kill_in_checkpoint_writes_resumes_identically(setup, tmp_path):
    """Fast variant: one run directory killed three times (mid-write of step 4, after it, before the final
    adapter is moved in); each resume starts from the newest complete checkpoint."""
    root, data, model_dir, _ = setup
    out = tmp_path / "run"
    for point, expect in [("checkpoint.optimizer@2", None), ("checkpoint.checksums@4", 2), ("final.written@6", 4)]:
        assert run_child(data, out, model_dir, kill_at=point) == -9, point
        assert not (out / "adapter_model.safetensors").exists(), point
        assert _complete_step(out) == expect, point
    assert run_child(data, out, model_dir) == 0
    assert resumed_from(out) == [None, None, 2, 4]
    assert_same_adapter(out, root / "ref")
    assert not [p.name for p in out.rglob(".tmp-*")]  # crash leftovers cleaned on the way


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(POINTS))
def test_kill_at_every_named_point(point, setup, tmp_path):
    resumed, partial = _kill_then_resume(setup, tmp_path / "run", kill_at=point)
    assert resumed == POINTS[point]
    assert partial == (point != "checkpoint.renamed@4")  # every other point is in the middle of a write


@pytest.mark.slow
def test_kill_at_ten_random_moments(setup, tmp_path):
    """SIGKILL a seeded random delay after training starts, within an uninterrupted run's training time (inside
    steps, evaluation and checkpoint writes)."""
    duration = setup[3]
    rng = random.Random(20240611)
    delays = [rng.uniform(0.0, 0.9 * duration) for _ in range(10)]
    got = []
    for i, t in enumerate(delays):
        try:
            got.append(_kill_then_resume(setup, tmp_path / f"run{i}", kill_after_s=t))
        except AssertionError as e:
            raise AssertionError(f"kill {i} at {t:.2f} s into training: {e}") from e
    resumed = [r for r, _ in got]
    print(f"training {duration:.2f} s; kills at {[round(t, 2) for t in delays]} s; resumed from steps {resumed} "
          f"(-1: finished before the kill); {sum(p for _, p in got)} kills left a half-written directory")
    assert sum(r != -1 for r in resumed) >= 5  # most kills landed while training (timing varies with load)
