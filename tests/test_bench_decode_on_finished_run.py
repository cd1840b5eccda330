"""The benches that decode on a finished `mens dogfood -o DIR`, run end to end on a tiny dogfood run.

- Those that time two ways (bench/eval_batch_speed.py, bench/constrained_redo_speed.py, bench/cpu_decode_kernels.py,
  bench/parity_speed.py) record that both gave the same answers and scores.
- bench/constrained_speed.py records both answers of each prompt, free and constrained.
- bench/template_parity.py finds that plain transformers on the merged directory builds mens' prompt and gives
  eval-local's answers; bench/served_parity.py, that `mens serve` on it answers every task as the merged model and
  the adapter did.
"""

import json
import sys
from pathlib import Path

import pytest
from tests.conftest import tiny_dogfood_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import constrained_redo_speed  # noqa: E402
import constrained_speed  # noqa: E402
import cpu_decode_kernels  # noqa: E402
import eval_batch_speed  # noqa: E402
import parity_speed  # noqa: E402
import served_parity  # noqa: E402
import template_parity  # noqa: E402

TASKS = 2  # tiny_dogfood_config's --limit


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_base):
    from mens.dogfood import run_dogfood

    out = tmp_path_factory.mktemp("finished") / "df"
    run_dogfood(tiny_dogfood_config(out, tiny_base), log=lambda line: None)
    return out


def _run(script, finished: Path, out: Path, monkeypatch, *extra: str, rounds: bool = True) -> dict:
    """The script's record of `finished`, written to `out` (one round where the script takes --rounds)."""
    one_round = ["--rounds", "1"] if rounds else []
    monkeypatch.setattr(sys, "argv", [script.__file__, "--from-dir", str(finished), *one_round, "--output", str(out),
                                      *extra])
    script.main()
    return json.loads(out.read_text())


def test_eval_batch_speed_times_both_ways_and_they_answer_alike(finished, tmp_path, monkeypatch):
    import mens.model.batch_decode as gen

    dropper = gen._drop_ended
    rec = _run(eval_batch_speed, finished, tmp_path / "eval-batch.json", monkeypatch)
    assert gen._drop_ended is dropper  # put back for every later caller
    assert rec["bench"] == "eval_batch_speed" and rec["tasks"] == TASKS and rec["cpu"]
    assert rec["same_answers"] == {"base": TASKS, "tuned": TASKS}
    assert set(rec["seconds"]) == {"base_greedy", "tuned_greedy"}
    assert all(len(way) == 1 for times in rec["seconds"].values() for way in times.values())
    modes = rec["tuned_eval_modes"]
    assert set(modes) == {"dropped_64", "carried_16"} and set(modes["dropped_64"]) == {"greedy", "retry", "constrained"}
    for mode in ("greedy", "retry", "constrained"):
        assert modes["dropped_64"][mode]["pass_at_1"] == modes["carried_16"][mode]["pass_at_1"]


def test_constrained_redo_speed_repairs_from_the_draft_as_from_scratch(finished, tmp_path, monkeypatch):
    rec = _run(constrained_redo_speed, finished, tmp_path / "redo.json", monkeypatch)
    assert rec["bench"] == "constrained_redo_speed" and rec["tasks"] == TASKS
    assert rec["same_answers"] == f"{TASKS} of {TASKS}"
    assert rec["scores"]["from_draft"] == rec["scores"]["from_scratch"]
    assert rec["drafts_repaired"] <= TASKS  # one redo at most for each task's one answer
    # a repair from the draft runs the model from the first repair only: never more steps than from scratch
    assert rec["model_steps"]["from_draft"][0] <= rec["model_steps"]["from_scratch"][0]


def test_cpu_decode_kernels_packs_the_linears_and_answers_as_plain(finished, tmp_path, monkeypatch):
    from mens.model import cpu_linear

    if not cpu_linear.packing_available():
        pytest.skip("this torch build has no oneDNN")
    pack = cpu_linear.pack_linears
    rec = _run(cpu_decode_kernels, finished, tmp_path / "kernels.json", monkeypatch, "--note", "test")
    assert cpu_linear.pack_linears is pack
    assert rec["bench"] == "cpu_decode_kernels" and rec["note"] == "test" and rec["packed_layers"] > 0
    assert rec["same_answers"] == {"base": TASKS, "tuned": TASKS}
    assert set(rec["tuned_step_ms_by_rows"]) == {"1", "4", "16", "60"}
    assert all(set(ms) == {"packed", "plain"} for ms in rec["tuned_step_ms_by_rows"].values())
    for mode in ("greedy", "retry", "constrained"):
        assert rec["tuned_eval_modes"]["packed"][mode]["pass_at_1"] == rec["tuned_eval_modes"]["plain"][mode][
            "pass_at_1"]


def test_template_parity_finds_the_merged_model_answering_as_in_mens(finished, tmp_path, monkeypatch):
    rec = _run(template_parity, finished, tmp_path / "template.json", monkeypatch, rounds=False)
    assert rec["bench"] == "template_parity" and rec["tasks"] == TASKS and len(rec["rows"]) == TASKS
    # the merged directory's chat template carries the run's system prompt: a user's plain prompt is mens' prompt,
    # and plain greedy `generate` gives eval-local's answers
    assert rec["same_prompt"] == TASKS and rec["answer_reproduced"] == TASKS


def test_parity_speed_adopts_only_answers_that_decoding_gives(finished, tmp_path, monkeypatch):
    rec = _run(parity_speed, finished, tmp_path / "parity.json", monkeypatch)
    assert rec["bench"] == "parity_speed" and rec["tasks"] == TASKS
    assert all(len(v) == 1 for v in rec["seconds"].values())
    assert rec["adopted_but_decoded_differently"] == []  # teacher forcing never keeps an answer decoding changes
    assert rec["adopted"] + len(rec["refused"]) == TASKS
    assert all(r["why"] for r in rec["refused"])


def test_served_parity_sends_every_task_and_the_server_answers_as_the_adapter(finished, tmp_path, monkeypatch):
    rec = _run(served_parity, finished, tmp_path / "served.json", monkeypatch, rounds=False)
    assert rec["bench"] == "served_parity" and len(rec["rows"]) == TASKS
    assert rec["served_vs_merged"]["tasks"] == rec["served_vs_merged"]["same_result"] == TASKS
    # a tiny f32 LoRA merges exactly: the server's text is the adapter's
    assert rec["served_vs_adapter"]["same_text"] == rec["served_vs_adapter"]["tasks"] == TASKS


def test_constrained_speed_decodes_each_prompt_both_ways(finished, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [constrained_speed.__file__, "--model", str(finished / "merged"), "--bench",
                                      str(finished / "bench" / "heldout.jsonl"), "--tasks", str(TASKS), "--rounds",
                                      "1", "--max-new-tokens", "12", "--out", str(tmp_path)])
    constrained_speed.main()
    (path,) = tmp_path.glob("constrained_speed-*.json")
    rec = json.loads(path.read_text())
    assert rec["tasks"] == TASKS and len(rec["rounds_detail"]) == 1
    (done,) = rec["rounds_detail"]
    assert done["tokens"]["free"] > 0 and done["tokens"]["constrained"] > 0
    assert rec["paired_prompt_ratios"]["n"] == TASKS and len(rec["answers"]) == TASKS
    same_text = sum(a["free"].strip() == a["constrained"].strip() for a in rec["answers"].values())
    assert rec["answers_same_text"] == f"{same_text}/{TASKS}" and rec["machine"]["flags"]
    assert "shared these CPUs" not in json.dumps(rec)  # the record claims nothing it did not see
