"""bench/dogfood.py: a finished dogfood directory becomes a record that says where the budget's time went, read
from the run's own files (nothing added to a record by hand)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import dogfood as dogfood_bench  # noqa: E402
from mens.dogfood.budget import POST_TRAIN_STAGES  # noqa: E402


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)


def test_record_reads_the_post_training_time_the_modes_the_probe_and_the_final_validation(tmp_path):
    out, run = tmp_path / "df", tmp_path / "df" / "run"
    stages = {"eval-base": 100.0, "train": 1000.0, "eval-tuned": 150.0, "gate": 0.0, "merge": 3.0, "parity": 80.0,
              "card": 2.0}
    _write(out / "dogfood_summary.json", {
        "run": str(run), "stage_seconds": stages, "total_stage_seconds": 1335.0, "wall_time_s_this_session": 1530.0,
        "base": {}, "tuned": {},
        "gain_over_base": 0.9, "gate": True, "budget": {"steps": 133, "recipe_steps": 742}})
    _write(out / "dogfood_state.json", {"config": {"seed": 1}})
    _write(out / "data" / "heldout_split.json", {"heldout_tasks": 60, "kept": 2107, "dropped": 0})
    _write(out / "data" / "budget.json", {"steps": 122})
    _write(run / "benchmark_results.json", {"metrics": {"failures_by_category": {}},
                                            "modes": {"greedy": {"seconds": 84.7}, "retry": {"seconds": 99.3}}})
    _write(run / "run_summary.json", {"steps": 133, "wall_time_s": 940.0})
    events = [{"event": "train_start", "ts_ms": 0}, {"event": "step", "step": 1, "ts_ms": 5_000},
              {"event": "refit", "step": 25, "from_total": 122, "to_total": 135, "step_s": 6.9, "elapsed_s": 172.0},
              {"event": "step", "step": 133, "ts_ms": 900_000}, {"event": "eval", "step": 133, "ts_ms": 915_500}]
    _write(run / "telemetry.jsonl", "\n".join(json.dumps(e) for e in events) + "\n")

    rec = dogfood_bench.record(out, 1650.0, quick=False, note="what it measures")
    assert POST_TRAIN_STAGES == ("eval-tuned", "gate", "merge", "parity", "card")
    assert rec["post_train_s"] == 235.0  # 150 + 0 + 3 + 80 + 2: not the base eval, not training
    assert rec["eval_tuned_mode_seconds"] == {"greedy": 84.7, "retry": 99.3}
    train = rec["train"]
    assert train["final_val_pass_s"] == 15.5 and train["run_wall_time_s"] == 940.0 and train["probe_s"] == 60.0
    assert [r["to_total"] for r in train["refits"]] == [135]
    assert rec["summary_budget"] == {"steps": 133, "recipe_steps": 742} and rec["budget"] == {"steps": 122}
    assert rec["seed"] == 1 and rec["command_wall_s"] == 1650.0 and "commit" in rec and rec["cpu"]
    assert rec["setup_s"] == 120.0 and rec["note"] == "what it measures"  # 1650 - 1530: the venv and the CLI's start
    untimed = dogfood_bench.record(out, None, quick=False)
    assert untimed["setup_s"] is None and "note" not in untimed


def test_another_writers_split_is_answered_in_the_runs_modes_and_token_limit(tmp_path, monkeypatch):
    """--features and --confirm: the tuned run answers the split in every mode its own eval used, with its answer
    length, and each split's report goes to its own file."""
    out, run = tmp_path / "df", tmp_path / "df" / "run"
    _write(out / "dogfood_state.json", {"config": {"modes": ["greedy", "constrained"], "max_new_tokens": 384}})
    _write(out / "dogfood_summary.json", {"run": str(run)})
    row = {"prompt": "Write a Vox function that adds two integers.",
           "response": "fn add(a: int, b: int) to int {\n    return a + b\n}\n"}
    _write(out / "data" / "train.jsonl", json.dumps(row))
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        modes = {"greedy": {"nonempty_parse_rate": 0.9, "pass_at_1": 0.7},
                 "constrained": {"nonempty_parse_rate": 1.0, "pass_at_1": 0.75}}
        _write(Path(cmd[cmd.index("-o") + 1]), {"metrics": {"tasks": 60, **modes["greedy"],
                                                            "failures_by_category": {"name": 3}}, "modes": modes})

    monkeypatch.setattr(dogfood_bench.subprocess, "run", fake_run)
    features = dogfood_bench.split_eval(out, {}, dogfood_bench.FEATURES, "features")
    confirm = dogfood_bench.split_eval(out, {}, dogfood_bench.CONFIRM, "confirm")
    (f_cmd, c_cmd) = calls
    assert f_cmd[1:3] == ["eval-local", str(run)] and f_cmd[f_cmd.index("--bench") + 1] == str(dogfood_bench.FEATURES)
    assert c_cmd[c_cmd.index("--bench") + 1] == str(dogfood_bench.CONFIRM)
    assert f_cmd[f_cmd.index("--modes") + 1] == "greedy,constrained"
    assert f_cmd[f_cmd.index("--max-new-tokens") + 1] == "384"
    assert f_cmd[f_cmd.index("-o") + 1] == str(out / "eval" / "features_results.json")
    assert c_cmd[c_cmd.index("-o") + 1] == str(out / "eval" / "confirm_results.json")
    assert features["tasks"] == 60 and features["modes"]["constrained"]["pass_at_1"] == 0.75
    assert {k: v for k, v in features.items() if k not in ("training_rows_overlapping", "failed_tasks")} == \
        {k: v for k, v in confirm.items() if k != "training_rows_overlapping"}
    assert features["failed_tasks"] == {} and "failed_tasks" not in confirm  # never the confirmation split's tasks
    assert features["training_rows_overlapping"] == confirm["training_rows_overlapping"] == \
        {"same_code": 0, "near_duplicate_prompt": 0}
    assert dogfood_bench.FEATURES.is_file() and dogfood_bench.CONFIRM.is_file()


def test_training_rows_that_reach_another_writers_split_are_counted_by_reason(tmp_path):
    """A row with a task's reference code and a row that nearly copies a task's prompt are each counted; a row
    that does neither is not."""
    bench = tmp_path / "b" / "split.jsonl"
    prompts = ["Write a Vox query endpoint that lists every open ticket sorted by age",
               "Declare a Vox table for invoices with a total and a paid flag"]
    _write(bench, "".join(json.dumps({"id": f"t{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    code = "fn open_tickets() to int {\n    return 0\n}\n"
    _write(bench.parent / "split_reference.jsonl", json.dumps({"id": "t0", "answer": code}) + "\n")
    rows = [{"prompt": "Something else entirely about widgets", "response": f"```vox\n{code}```"},
            {"prompt": prompts[1] + ".", "response": "fn f() to int {\n    return 1\n}\n"},
            {"prompt": "Write a Vox function that doubles a number.",
             "response": "fn d(x: int) to int {\n    return x * 2\n}\n"}]
    out = tmp_path / "df"
    _write(out / "data" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert dogfood_bench.training_overlap(out, bench) == {"same_code": 1, "near_duplicate_prompt": 1}


def test_a_split_is_added_to_the_runs_own_record_and_held_splits_are_not_evaluated_again(tmp_path, monkeypatch):
    """--add-to: the confirmation split joins a record that holds the features split; the features split is not
    answered again, a record of another run (another seed) is refused, and so is a second confirmation reading."""
    out = tmp_path / "df"
    _write(out / "dogfood_state.json", {"config": {"seed": 2}})
    _write(out / "data" / "heldout_split.json", {"heldout_tasks": 60, "kept": 2073, "dropped": 0})
    _write(out / "dogfood_summary.json", {"run": str(out / "run")})
    _write(out / "run" / "run_summary.json", {"steps": 719, "first_loss": 1.9, "final_loss": 0.11, "val_loss": 0.2})
    train = {"steps": 719, "first_loss": 1.9, "final_loss": 0.11}
    asked = []

    def fake_split_eval(out_dir, env, bench, name):
        asked.append((name, bench))
        return {"tasks": 60, "pass_at_1": 0.75}

    monkeypatch.setattr(dogfood_bench, "split_eval", fake_split_eval)
    features = {"tasks": 60, "pass_at_1": 0.6}
    rec = {"seed": 2, "heldout_tasks": 60, "training_rows": 2073, "train": train, "features": features}
    added = dogfood_bench.add_splits(rec, out, {}, ["features", "confirm"])
    assert added == ["confirm"] and asked == [("confirm", dogfood_bench.CONFIRM)]
    assert rec["features"] is features and rec["confirm"] == {"tasks": 60, "pass_at_1": 0.75}
    other_seed = {"seed": 0, "heldout_tasks": 60, "training_rows": 2073, "train": train}
    other_run = {"seed": 2, "heldout_tasks": 60, "training_rows": 2073, "train": {**train, "final_loss": 0.12}}
    for other, seen in ((other_seed, "'seed': 0"), (other_run, "'final_loss': 0.12")):
        try:
            dogfood_bench.add_splits(other, out, {}, ["confirm"])
        except SystemExit as e:
            assert "not of the run" in str(e) and seen in str(e)
        else:
            raise AssertionError(f"a record of another run was accepted: {other}")
        assert "confirm" not in other
    assert len(asked) == 1
    held = json.dumps(rec)
    for names in (["confirm"], ["features", "confirm"]):
        try:
            dogfood_bench.add_splits(rec, out, {}, names)
        except SystemExit as e:
            assert "already holds the confirmation split" in str(e)
        else:
            raise AssertionError(f"the confirmation split was read a second time with {names}")
    assert json.dumps(rec) == held and len(asked) == 1
    assert dogfood_bench.add_splits(rec, out, {}, ["features"]) == [] and len(asked) == 1
