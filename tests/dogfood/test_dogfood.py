"""`mens dogfood` end to end on a tiny Llama built in code: every stage's artifacts, the gate verdict, resume."""

from __future__ import annotations

import json

import pytest
import yaml
from tests.conftest import tiny_dogfood_config as _cfg

from mens.corpus.normalize import code_in_response
from mens.dogfood import DogfoodConfig, run_dogfood
from mens.dogfood.heldout import code_hash
from mens.errors import GateFailed, UsageError
from mens.evaluate.bench import load_references

STAGES = ["extract", "validate", "pairs", "generate", "mix", "heldout", "eval-base", "train", "eval-tuned", "gate",
          "merge", "parity", "card"]


def test_dogfood_runs_every_stage_and_writes_its_artifacts(tmp_path, tiny_base):
    gates = tmp_path / "gates.yaml"
    gates.write_text("min_parse_rate: 0.0\n")
    # A user's checkout holding a held-out task's reference answer: the split must drop every pair made from it.
    leak = tmp_path / "checkout"
    leak.mkdir()
    (leak / "count.vox").write_text(load_references()["fn-count-positive"])
    logs: list[str] = []
    summary = run_dogfood(_cfg(tmp_path / "df", tiny_base, gates=gates, corpus=[leak], repairs=10), log=logs.append)
    out = tmp_path / "df"
    state = json.loads((out / "dogfood_state.json").read_text())
    assert [k for k, v in state["stages"].items() if v["status"] == "done"] == STAGES
    for rel in ("corpus/units.jsonl", "corpus/validated.jsonl", "corpus/rejects.jsonl", "corpus/pairs.jsonl",
                "corpus/synthetic.jsonl", "corpus/tasks.jsonl", "corpus/bench_dev.jsonl", "corpus/requests.jsonl",
                "corpus/repairs.jsonl", "corpus/mix.yaml", "corpus/mixed.jsonl",
                "data/train.jsonl", "data/heldout_split.json", "data/eval_results.json", "bench/heldout.jsonl",
                "bench/heldout_reference.jsonl", "eval/base_results.json", "eval/merged_results.json",
                "run/merge_parity.json", "run/adapter_model.safetensors",
                "run/benchmark_results.json", "run/gate_receipt.json", "run/README.md", "run/report.html",
                "merged/config.json", "merged/README.md", "dogfood_summary.json"):
        assert (out / rel).is_file(), rel
    # the held-out split really is held out: no training row has a held-out answer's code
    split = json.loads((out / "data/heldout_split.json").read_text())
    assert split["kept"] + split["dropped"] == split["rows_in"]
    assert any(d["task"] == "fn-count-positive" for d in split["dropped_rows"])
    held = {code_hash(a) for a in load_references(out / "bench/heldout.jsonl").values()}
    train = [json.loads(line) for line in (out / "data/train.jsonl").read_text().splitlines()]
    assert len(train) == split["kept"]
    assert not held & {code_hash(code_in_response(r["response"], ("vox",))) for r in train}
    # the shipped hand-written requests are in the mix, once each
    requests = [r for r in train if r.get("origin") == "requests"]
    assert requests and len(requests) == len((out / "corpus/requests.jsonl").read_text().splitlines())
    # and the repair pairs asked for, made from them: each answer is one of those requests' answers
    repaired = [r for r in train if r.get("origin") == "repairs"]
    assert repaired and {r["response"] for r in repaired} <= {r["response"] for r in requests}
    bench = json.loads((out / "run/benchmark_results.json").read_text())
    assert set(bench["modes"]) == {"greedy", "constrained"} and bench["base"]["metrics"]["tasks"] == 2
    assert bench["metrics"]["gain_over_base"] == pytest.approx(
        bench["metrics"]["nonempty_parse_rate"] - bench["base"]["metrics"]["nonempty_parse_rate"], abs=1e-4)
    manifest = json.loads((out / "run/training_manifest.json").read_text())
    assert manifest["system_prompt"] == DogfoodConfig(output_dir=out).system_prompt
    assert summary["gate"] is True and summary["base"]["nonempty_parse_rate"] is not None
    card = (out / "run/README.md").read_text()
    assert "base model (greedy)" in card and f"{len(requests)} hand-written requests in users' words" in card
    assert any(line.startswith("[13/13] card") for line in logs)
    merged_card = (out / "merged/README.md").read_text()  # the merged weights' own card, not the adapter's
    assert "library_name: transformers" in merged_card and "library_name: peft" in card

    parity = json.loads((out / "run/merge_parity.json").read_text())
    assert parity["merged_vs_adapter"]["tasks"] == 2 and parity["served_vs_merged"]["tasks"] == 2
    # a tiny f32 LoRA merges exactly: the merged model and the server answer as the adapter did
    assert parity["merged_vs_adapter"]["same_text"] == 2 and parity["served_vs_merged"]["same_text"] == 2
    # each answer either shown by teacher forcing or decoded again; the merged results file says how many
    adopted = json.loads((out / "eval/merged_results.json").read_text())["greedy_adopted"]
    assert parity["merged_vs_adapter"]["teacher_forced"] == adopted and 0 <= adopted <= 2
    assert summary["merge_parity"]["merged_vs_adapter"] == {"tasks": 2, "same_result": 2, "teacher_forced": adopted}

    import transformers

    merged = transformers.AutoModelForCausalLM.from_pretrained(out / "merged")  # loads without mens
    assert merged.config.vocab_size > 0


def test_failed_gate_skips_merge_keeps_card_and_resume_skips_done_stages(tmp_path, tiny_base):
    gates = tmp_path / "gates.yaml"
    gates.write_text("min_parse_rate: 1.01\n")  # unreachable: the gate must fail
    out = tmp_path / "df"
    with pytest.raises(GateFailed, match="nonempty_parse_rate"):
        run_dogfood(_cfg(out, tiny_base, gates=gates), log=lambda _: None)
    state = json.loads((out / "dogfood_state.json").read_text())["stages"]
    assert state["gate"]["status"] == "failed" and state["merge"]["status"] == "skipped"
    assert state["parity"]["status"] == "skipped"
    assert state["card"]["status"] == "done" and not (out / "merged").exists()
    assert "FAILED" in (out / "run/README.md").read_text()

    with pytest.raises(UsageError, match="--resume"):  # never overwrites a run by accident
        run_dogfood(_cfg(out, tiny_base, gates=gates), log=lambda _: None)
    logs: list[str] = []
    with pytest.raises(GateFailed):  # resumed: finished stages are skipped, the gate runs again
        run_dogfood(_cfg(out, tiny_base, gates=gates, resume=True), log=logs.append)
    assert sum("done earlier" in line for line in logs) == 10  # all but the failed gate and skipped merge


def test_missing_corpus_path_fails_in_extract_with_a_clear_message(tmp_path, tiny_base):
    with pytest.raises(UsageError, match="no such file"):
        run_dogfood(_cfg(tmp_path / "df", tiny_base, corpus=[tmp_path / "nope"]), log=lambda _: None)
    state = json.loads((tmp_path / "df" / "dogfood_state.json").read_text())["stages"]
    assert state["extract"]["status"] == "failed" and "nope" in state["extract"]["error"]


def test_second_round_aims_at_dev_failures_and_continues_from_round_one(tmp_path, tiny_base):
    out = tmp_path / "df"
    summary = run_dogfood(_cfg(out, tiny_base, rounds=2, tasks2=20, gates="none", modes=("greedy",)),
                          log=lambda _: None)
    state = json.loads((out / "dogfood_state.json").read_text())["stages"]
    assert [k for k in state][8:12] == ["eval-tuned", "focus", "train-2", "eval-tuned-2"]
    focus = json.loads((out / "data2/focus.json").read_text())
    assert focus["dev_metrics"]["tasks"] == 2 and focus["weights"]  # the dev split, never the held-out one
    dev_ids = {r["id"] for r in json.loads((out / "eval/dev_results.json").read_text())["results"]}
    heldout_ids = {t["id"] for t in map(json.loads, (out / "bench/heldout.jsonl").read_text().splitlines())}
    assert dev_ids and not dev_ids & heldout_ids
    manifest = json.loads((out / "run2/training_manifest.json").read_text())
    assert manifest["config"]["init_adapter"] == str(out / "run")
    assert summary["run"] == str(out / "run2") and summary["round1"]["greedy"] is not None
    assert (out / "run2/benchmark_results.json").is_file() and (out / "merged/config.json").is_file()


def test_quick_records_the_packaged_gate_without_enforcing_it(tmp_path, tiny_base):
    # --quick with the packaged gates (a tiny model cannot meet them): the verdict is recorded, merge and parity
    # still run; with explicit --gates the same verdict stops the run (test above).
    out = tmp_path / "df"
    logs: list[str] = []
    summary = run_dogfood(_cfg(out, tiny_base), log=logs.append)
    state = json.loads((out / "dogfood_state.json").read_text())["stages"]
    assert state["merge"]["status"] == "done" and state["parity"]["status"] == "done"
    assert summary["gate"] is False
    assert any("not enforced with --quick" in line for line in logs)


def test_zero_synthetic_task_and_repair_pairs_leave_those_sources_out(tmp_path, tiny_base):
    from mens.dogfood.pipeline import Pipeline

    p = Pipeline(_cfg(tmp_path / "df", tiny_base, synthetic=0, tasks=0, repairs=0))
    p.prepare()
    for name, fn in p.stages:
        if name == "eval-base":
            break
        note = fn(p.ctx)
        if name == "generate":
            assert note.startswith("no synthetic data")
    mix = yaml.safe_load((tmp_path / "df/corpus/mix.yaml").read_text())
    assert [s["path"] for s in mix["sources"]] == ["pairs.jsonl", "bench_dev.jsonl", "requests.jsonl"]
    assert not (tmp_path / "df/corpus/tasks.jsonl").exists()
    assert not (tmp_path / "df/corpus/repairs.jsonl").exists()
    rows = [json.loads(line) for line in (tmp_path / "df/data/train.jsonl").read_text().splitlines()]
    assert rows and not any(r["source"].startswith(("taskgen", "generate", "repair:")) for r in rows)


def test_budget_times_probe_steps_and_plans_the_training(tmp_path, tiny_base, monkeypatch):
    """--budget: a few probe steps of the real recipe are timed, the plan (budget.json) gives training what fits,
    the stage note says so, and a resumed run keeps the plan. The time since scripts/mens started (the venv build)
    counts as spent."""
    import time

    from mens.dogfood.budget import LAUNCHED_AT_ENV, POST_TRAIN_FACTOR_TRAINED, POST_TRAIN_FIXED_S
    from mens.dogfood.pipeline import Pipeline

    monkeypatch.setenv(LAUNCHED_AT_ENV, str(int(time.time()) - 600))
    out = tmp_path / "df"
    pipeline = Pipeline(_cfg(out, tiny_base, budget="1h"), log=lambda _: None)
    pipeline.stages = pipeline.stages[: [name for name, _ in pipeline.stages].index("train") + 1]
    pipeline.run()
    plan = json.loads((out / "data/budget.json").read_text())
    assert plan["steps"] == plan["recipe_steps"] == 3 and plan["budget_s"] == 3600
    base_eval_s = json.loads((out / "dogfood_state.json").read_text())["stages"]["eval-base"]["seconds"]
    # the whole recipe fits: a trained model's reserve
    assert plan["reserve_factor"] == POST_TRAIN_FACTOR_TRAINED
    assert plan["reserve_s"] == pytest.approx(POST_TRAIN_FACTOR_TRAINED * base_eval_s + POST_TRAIN_FIXED_S, abs=0.2)
    assert plan["probe"]["step_s"] > 0 and plan["elapsed_s"] >= 600 and plan["cpu"] is not None
    assert not (out / "budget_probe").exists()  # the probe run is thrown away
    state = json.loads((out / "dogfood_state.json").read_text())
    assert "budget 1h: the recipe's 3 steps fit the budget" in state["stages"]["train"]["note"]
    # the run re-fits its length to the plan's time limit as it goes, and validates once, at its end
    config = json.loads((out / "run" / "training_manifest.json").read_text())["config"]
    assert config["fit_to_time"] is True and config["eval_every"] == 0
    assert config["max_time_s"] == pytest.approx(plan["max_time_s"]) and config["max_steps"] == 3
    # over every fourth validation row (budget.RUN_VAL_SHARE), as the probe's pass; the note and the report say so
    evals = [json.loads(line) for line in (out / "run" / "telemetry.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert [e["step"] for e in evals] == [3] and 0 < evals[0]["tokens"] < evals[0]["all_tokens"]
    assert "(every 4th validation row)" in state["stages"]["train"]["note"]
    from mens.report.facts import training_numbers
    from mens.report.runfiles import read_run
    rows = dict(training_numbers(read_run(out / "run")))
    assert rows["validation loss (last)"].endswith(
        f"(on {evals[0]['tokens']:,} of the {evals[0]['all_tokens']:,} validation tokens)")
    # after training, the plan gains the run's own pace and what the recipe's whole length would train in
    whole = plan["whole_recipe"]
    assert whole["step_s"] > 0 and whole["eval_every"] == 10  # --quick's preset validates every 10 steps
    assert whole["train_s"] == pytest.approx(plan["probe"]["startup_s"] + 3 * whole["step_s"] + plan["probe"]["val_s"],
                                             abs=0.2)  # one pass: 3 steps end before step 10
    assert plan["probe"]["steps_per_epoch"] >= 1
    # the recipe fitted, so the summary has no budget cut to report
    assert pipeline.summary(state, 1.0)["budget"] is None
    with pytest.raises(UsageError, match="--rounds 2"):
        _cfg(tmp_path / "x", tiny_base, budget="30m", rounds=2)
    with pytest.raises(UsageError, match="expected a duration"):
        _cfg(tmp_path / "x", tiny_base, budget="soon")


def test_a_cut_run_summary_says_what_the_whole_recipe_would_cost(tmp_path, tiny_base, monkeypatch):
    """Where the budget cut the recipe, the summary's `budget` block gives the steps trained of the recipe's and
    the whole command's estimated time with `--budget none`, from the run's own step time."""
    from mens.dogfood import stages
    from mens.dogfood.pipeline import Pipeline

    plan = {"budget_s": 1800.0, "steps": 2, "recipe_steps": 9, "max_time_s": 0.0, "note": "2 of 9 steps fit",
            "probe": {"step_s": 1.0, "val_s": 4.0, "startup_s": 3.0, "recipe_steps": 9, "steps_per_epoch": 5}}
    monkeypatch.setattr(stages, "_budget_plan", lambda *_: dict(plan))
    out = tmp_path / "df"
    pipeline = Pipeline(_cfg(out, tiny_base, budget="30m", quick=False, synthetic=5, tasks=5, requests=False,
                             dev_pairs=False), log=lambda _: None)
    pipeline.stages = [s for s in pipeline.stages if s[0] in ("extract", "validate", "pairs", "generate", "mix",
                                                                 "heldout", "train")]
    pipeline.run()
    written = json.loads((out / "data/budget.json").read_text())["whole_recipe"]
    state = json.loads((out / "dogfood_state.json").read_text())
    cut = pipeline.summary(state, 1.0)["budget"]
    stages_s = sum(v["seconds"] for v in state["stages"].values())
    assert cut["steps"] == 2 and cut["recipe_steps"] == 9 and cut["step_s"] == written["step_s"] > 0
    assert cut["whole_recipe_s"] == pytest.approx(stages_s - state["stages"]["train"]["seconds"]
                                                  + written["train_s"], abs=0.2)
    # validation at each epoch's end: steps 5 and 9 (the last)
    assert written["train_s"] == pytest.approx(3.0 + 9 * written["step_s"] + 4.0 * 2, abs=0.2)


def test_a_budgeted_schedule_trains_the_presets_recipe_for_the_planned_steps(tmp_path, tiny_base, monkeypatch):
    """The budget plan sets the length only: the cpu preset's rate and LoRA+ ratio reach the trained config
    unchanged, as does a rate the user gives."""
    from mens.dogfood import stages
    from mens.dogfood.pipeline import Pipeline
    from mens.train.presets import load_preset

    monkeypatch.setattr(stages, "_budget_plan", lambda *_: {"steps": 2, "max_time_s": 0.0,
                                                             "note": "2 of 9 steps fit"})
    cpu = load_preset("cpu")
    assert cpu["lora_plus_ratio"] == 16.0 and cpu["learning_rate"] == pytest.approx(6e-4)
    cases = {"default": ({"preset": "cpu"}, cpu["learning_rate"]),
             "own": ({"preset": "cpu", "optimizer.learning_rate": 1e-4}, 1e-4)}
    for name, (train, lr) in cases.items():
        out = tmp_path / name
        pipeline = Pipeline(_cfg(out, tiny_base, budget="1h", quick=False, train=train, synthetic=5, tasks=5,
                                 requests=False, dev_pairs=False), log=lambda _: None)
        pipeline.stages = [s for s in pipeline.stages if s[0] in ("extract", "validate", "pairs", "generate", "mix",
                                                                     "heldout", "train")]
        pipeline.run()
        config = json.loads((out / "run" / "training_manifest.json").read_text())["config"]
        assert config["learning_rate"] == pytest.approx(lr) and config["max_steps"] == 2, name
        assert config["lora_plus_ratio"] == 16.0, name
