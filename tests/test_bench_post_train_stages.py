"""bench/post_train_stages.py: a copy forgets eval-base and the stages after training (and only those) before
`mens dogfood --resume` runs it again; each row measures those stages in base evaluations against the reserve."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import post_train_stages  # noqa: E402

from mens.dogfood.budget import (  # noqa: E402
    POST_TRAIN_FACTOR,
    POST_TRAIN_FACTOR_TRAINED,
    POST_TRAIN_FIXED_S,
)

BEFORE = ("extract", "validate", "pairs", "generate", "mix", "heldout", "train")


def _finished(path: Path, seconds: dict) -> Path:
    stages = {s: {"status": "done", "seconds": 1.0, "note": s} for s in BEFORE}
    stages |= {s: {"status": "done", "seconds": v, "note": s} for s, v in seconds.items()}
    (path / "run").mkdir(parents=True)
    (path / "run" / "run_summary.json").write_text(json.dumps({"steps": 117}))
    (path / "dogfood_state.json").write_text(json.dumps({"config": {"output_dir": str(path), "seed": 3},
                                                         "stages": stages}))
    return path


def test_a_copy_runs_eval_base_and_the_stages_after_training_again(tmp_path, monkeypatch):
    after = {"eval-base": 100.0, "eval-tuned": 150.0, "gate": 0.0, "merge": 3.0, "parity": 80.0, "card": 2.0}
    source = _finished(tmp_path / "runs" / "df", after)
    calls = []

    def fake_run(cmd, **kw):
        copy = Path(cmd[cmd.index("-o") + 1])
        state = json.loads((copy / "dogfood_state.json").read_text())
        calls.append((cmd, sorted(state["stages"]), state["config"]))
        for s, v in after.items():  # what the resumed run records
            state["stages"][s] = {"status": "done", "seconds": v + 10, "note": s}
        (copy / "dogfood_state.json").write_text(json.dumps(state))

    monkeypatch.setattr(post_train_stages.subprocess, "run", fake_run)
    copy = post_train_stages.rerun(source, tmp_path / "work")
    (cmd, left, config), = calls
    assert cmd[1:4] == ["dogfood", "--resume", "--seed"] and cmd[4] == "3"
    assert left == sorted(BEFORE) and config["output_dir"] == str(copy) != str(source)
    assert json.loads((source / "dogfood_state.json").read_text())["stages"]["parity"]["seconds"] == 80.0

    row = post_train_stages.row(copy, source)
    assert row["after_training_s"] == 160 + 10 + 13 + 90 + 12 and row["trained_steps"] == 117
    assert row["base_evals_beyond_fixed"] == pytest.approx((285 - POST_TRAIN_FIXED_S) / 110, abs=0.01)
    assert row["reserve_s"] == pytest.approx(POST_TRAIN_FACTOR * 110 + POST_TRAIN_FIXED_S)
    assert row["reserve_held"] is (285 <= POST_TRAIN_FACTOR * 110 + POST_TRAIN_FIXED_S)


def test_a_copy_whose_stages_did_not_finish_is_refused(tmp_path):
    copy = _finished(tmp_path / "df", {"eval-base": 100.0, "eval-tuned": 150.0})
    with pytest.raises(SystemExit, match="did not finish"):
        post_train_stages.row(copy, None)


def _record(path: Path, *, steps: int | None, base: float, after: dict) -> Path:
    rec = {"bench": "dogfood", "commit": "abc1234", "seed": 0, "cpu": "AMD EPYC", "native_bf16": True,
           "stage_seconds": {"eval-base": base, **after}, "train": {"steps": steps}}
    if steps is not None:
        rec["budget"] = {"steps": steps, "recipe_steps": 742}
    path.write_text(json.dumps(rec))
    return path


def test_records_are_read_by_the_share_of_the_recipe_their_plan_trained(tmp_path, monkeypatch):
    """--records: each budgeted dogfood record is measured against the reserve its plan's share gets; records
    without a plan are skipped, and the record sums up each factor's runs."""
    stages = {"eval-tuned": 60.0, "gate": 0.0, "merge": 2.0, "parity": 40.0, "card": 2.0}  # 104 s after training
    long_run = _record(tmp_path / "long.json", steps=600, base=40.0, after=stages)  # 0.81 of the recipe
    short_run = _record(tmp_path / "short.json", steps=200, base=40.0, after=stages)
    old = _record(tmp_path / "old.json", steps=None, base=40.0, after=stages)
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["post_train_stages.py", "--records", str(long_run), str(short_run), str(old),
                                      "--output", str(out), "--commit", "abc1234"])
    post_train_stages.main()
    record = json.loads(out.read_text())
    long_row, short_row = record["runs"]
    assert long_row["record"] == "long.json" and long_row["planned_share"] == round(600 / 742, 3)
    assert long_row["reserve_factor"] == POST_TRAIN_FACTOR_TRAINED and short_row["reserve_factor"] == POST_TRAIN_FACTOR
    assert long_row["base_evals_beyond_fixed"] == short_row["base_evals_beyond_fixed"] == round((104 - 30) / 40, 2)
    # 104 s against 2 x 40 + 30 = 110 s and 3 x 40 + 30 = 150 s: both held
    assert long_row["reserve_s"] == 110 and short_row["reserve_s"] == 150 and record["all_held"]
    assert record["by_factor"]["2"]["runs"] == record["by_factor"]["3"]["runs"] == 1
    assert long_row["machine"]["cpu"] == "AMD EPYC" and long_row["commit"] == "abc1234"


def test_records_and_directories_are_not_mixed(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["post_train_stages.py"])
    with pytest.raises(SystemExit):
        post_train_stages.main()
    old = _record(tmp_path / "old.json", steps=None, base=40.0, after={})
    monkeypatch.setattr(sys, "argv", ["post_train_stages.py", "--records", str(old)])
    with pytest.raises(SystemExit, match="none of the --records"):
        post_train_stages.main()
