"""The bench runner with scripted answers: metrics, pass@k over seeds, retry, per-category failures."""

from __future__ import annotations

from tests.evaluate.fake_engine import scripted

from mens.evaluate.bench import BenchTask
from mens.evaluate.run import Decoding, failing_outputs, run_bench
from mens.lang import get_language
from mens.lang.checks import Expect

PY = get_language("python")
TASKS = [
    BenchTask(id="add", category="fn", prompt="write add", expect=Expect(decls=[("fn", "add")])),
    BenchTask(id="point", category="class", prompt="write Point", expect=Expect(decls=[("class", "Point")])),
]


def test_metrics_from_scripted_answers():
    gen = scripted({"write add": ["def add(a, b):\n    return a + b\n"], "write Point": ["class Pt:\n    pass\n"]})
    report = run_bench(gen, TASKS, PY, k=1)
    m = report["metrics"]
    assert m["tasks"] == 2 and m["nonempty_parse_rate"] == 1.0 and m["pass_at_1"] == 0.5
    assert m["coverage"] == 1.0  # fn and class both seen in parsing outputs
    assert m["failures_by_category"] == {"name": 1}
    assert m["per_category"]["class"]["pass_at_1"] == 0.0
    [fail] = failing_outputs(report)
    assert fail["id"] == "point" and "Point" in fail["reason"]
    assert [c[2] for c in gen.streams] == [0, 1000]  # seed = seed_base + 1000 * task_index + sample


def test_pass_at_k_uses_all_samples():
    gen = scripted({"write add": ["def add(a):\n  return a\n", "oops(", "def nope(): pass\n"],
                    "write Point": ["class Point: pass\n"]})
    report = run_bench(gen, TASKS, PY, k=3, decoding=Decoding(temperature=0.8))
    add = report["results"][0]
    assert [s["pass"] for s in add["samples"]] == [True, False, False]
    assert abs(add["pass_at_1"] - 1 / 3) < 1e-9 and add["pass_at_k"] == 1.0
    assert report["metrics"]["parse_rate"] < 1.0


def test_parse_and_retry_resamples_unparseable_answers():
    gen = scripted({"write add": ["def add(:\n", "def add(a):\n  return a\n"], "write Point": ["class Point: pass\n"]})
    plain = run_bench(gen, TASKS[:1], PY, k=1)
    assert plain["metrics"]["nonempty_parse_rate"] == 0.0
    retry = run_bench(gen, TASKS[:1], PY, k=1, decoding=Decoding(name="retry", retries=2))
    assert retry["metrics"]["nonempty_parse_rate"] == 1.0
    assert retry["results"][0]["samples"][0]["attempts"] == 2


def test_evaluate_model_reports_modes_and_gain_over_base():
    from mens.evaluate.local import evaluate_model

    tuned = scripted({"write add": ["def add(a, b):\n    return a + b\n"], "write Point": ["class Point:\n    pass\n"]})
    base = scripted({"write add": ["Sure! Here is some text."], "write Point": ["class (:"]})
    report = evaluate_model(tuned, TASKS, PY, modes=["greedy", "constrained"], k=1, max_new_tokens=32,
                            base_engine=base)
    assert set(report["modes"]) == {"greedy", "constrained"}
    assert report["metrics"]["pass_at_1"] == 1.0
    assert report["base"]["metrics"]["nonempty_parse_rate"] == 0.0
    assert report["metrics"]["gain_over_base"] == 1.0
    assert [c[3] for c in tuned.streams] == [False, False, True, True]  # constrained flag reaches the engine
    assert tuned.max_tokens == {32}
    import pytest

    from mens.errors import UsageError

    with pytest.raises(UsageError, match="unknown decoding mode"):
        evaluate_model(tuned, TASKS, PY, modes=["beam"], k=1, max_new_tokens=8)
