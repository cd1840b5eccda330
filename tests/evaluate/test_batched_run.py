"""How the bench runner asks its engine: greedy first answers of all tasks in one `generate_batch` call, retries a
round per call with the one-at-a-time seeds, sampled decoding one sample at a time."""

from __future__ import annotations

import pytest
from tests.evaluate.fake_engine import FakeEngine

from mens.errors import UsageError
from mens.evaluate.bench import BenchTask
from mens.evaluate.local import evaluate_model
from mens.evaluate.run import Decoding, run_bench
from mens.lang import get_language
from mens.lang.checks import Expect

PY = get_language("python")
TASKS = [
    BenchTask(id="add", category="fn", prompt="write add", expect=Expect(decls=[("fn", "add")])),
    BenchTask(id="point", category="class", prompt="write Point", expect=Expect(decls=[("class", "Point")])),
]
GREEDY = {"write add": "def add(a, b):\n    return a + b\n", "write Point": "class Point(:\n"}  # Point does not parse
SAMPLED = "class Point:\n    pass\n"


def fake() -> FakeEngine:
    """Greedy answers from GREEDY (Point's does not parse); any sampled answer is SAMPLED (it parses)."""
    return FakeEngine(lambda prompt, temperature, _seed: GREEDY[prompt] if temperature == 0 else SAMPLED)


class TableEngine(FakeEngine):
    """Batches without streaming: `generate_batch` looks every answer up (a real engine batches some other way)."""

    def generate_batch(self, requests, progress=None):
        self.batches.append([self._key(r) for r in requests])
        return [self.answer(r.messages[-1]["content"], r.temperature, r.seed) for r in requests]


def test_greedy_first_answers_come_from_one_batch_call():
    engine = fake()
    ticks = []
    report = run_bench(engine, TASKS, PY, max_new_tokens=32, progress=lambda i, n: ticks.append(i))
    assert engine.batches == [[("write add", 0.0, 0, False), ("write Point", 0.0, 1000, False)]]
    assert engine.max_tokens == {32}
    assert report["metrics"]["batched"] is True and report["metrics"]["tasks"] == 2
    outputs = [s["output"] for r in report["results"] for s in r["samples"]]
    assert outputs == [GREEDY["write add"], GREEDY["write Point"]]
    assert ticks == [1, 2, 1, 2]  # while the batch decodes, then while answers are checked


def test_retries_are_one_call_per_round_with_the_one_at_a_time_seeds():
    """Only the unparsed answer is retried: attempt 1 of sample seed 1000 draws at 0.7 with seed 1000 + 7919."""
    engine = fake()
    report = run_bench(engine, TASKS, PY, decoding=Decoding(name="retry", retries=2))
    assert engine.batches == [[("write add", 0.0, 0, False), ("write Point", 0.0, 1000, False)],
                              [("write Point", 0.7, 1000 + 7919, False)]]  # SAMPLED parses: no second round
    point = report["results"][1]["samples"][0]
    assert point["attempts"] == 2 and point["output"] == SAMPLED
    assert report["results"][0]["samples"][0]["attempts"] == 1


def test_a_batching_engine_and_a_streaming_engine_give_the_same_report():
    """The runner depends only on the answers, not on how the engine produces a batch."""
    for decoding in (Decoding(), Decoding(name="retry", retries=2), Decoding(temperature=0.8, retries=1)):
        a = run_bench(TableEngine(fake().answer), TASKS, PY, k=2, decoding=decoding)
        b = run_bench(fake(), TASKS, PY, k=2, decoding=decoding)
        assert a["results"] == b["results"] and a["metrics"]["batched"] == b["metrics"]["batched"]


def test_retry_rounds_go_on_until_the_retries_are_spent():
    never = FakeEngine(lambda *_: "class (:\n")
    report = run_bench(never, TASKS, PY, decoding=Decoding(name="retry", retries=2))
    assert [len(b) for b in never.batches] == [2, 2, 2]
    assert [b[1][2] for b in never.batches] == [1000, 1000 + 7919, 1000 + 2 * 7919]
    assert all(s["attempts"] == 3 for r in report["results"] for s in r["samples"])


def test_greedy_k_samples_share_one_batched_answer():
    engine = fake()
    report = run_bench(engine, TASKS, PY, k=3)
    assert len(engine.batches) == 1 and [b[0] for b in engine.batches[0]] == ["write add", "write Point"]
    assert [s["seed"] for s in report["results"][0]["samples"]] == [0, 1, 2]


def test_sampled_decoding_asks_one_sample_at_a_time():
    engine = fake()
    ticks = []
    report = run_bench(engine, TASKS, PY, k=2, decoding=Decoding(temperature=0.8),
                       progress=lambda i, n: ticks.append(i))
    assert engine.batches == [[("write add", 0.8, 0, False)], [("write add", 0.8, 1, False)],
                              [("write Point", 0.8, 1000, False)], [("write Point", 0.8, 1001, False)]]
    assert report["metrics"]["batched"] is False and ticks == [1, 2]


def test_evaluate_model_batches_greedy_modes_and_base():
    engine, base = fake(), fake()
    report = evaluate_model(engine, TASKS, PY, modes=["greedy", "retry", "constrained"], k=1, max_new_tokens=16,
                            base_engine=base)
    assert [len(b) for b in engine.batches] == [2, 2, 1, 2]  # greedy; retry and its one retry; constrained
    assert [b[0][3] for b in engine.batches] == [False, False, False, True]  # the constrained flag reaches it
    assert all(m["batched"] for m in report["modes"].values())
    assert len(base.batches) == 1 and report["base"]["metrics"]["batched"]


def test_evaluate_model_with_k_above_one_samples_one_at_a_time():
    engine = fake()
    evaluate_model(engine, TASKS, PY, modes=["greedy"], k=2, max_new_tokens=16)
    assert len(engine.batches) == 4 and all(len(b) == 1 for b in engine.batches)


def test_constrained_retries_ask_for_constrained_answers():
    engine = fake()
    run_bench(engine, TASKS, PY, decoding=Decoding(name="constrained", constrained=True, retries=1))
    assert engine.batches[1] == [("write Point", 0.7, 1000 + 7919, True)]


def test_constrained_decoding_needs_an_engine_that_constrains_the_language():
    with pytest.raises(UsageError, match="cannot constrain"):
        run_bench(FakeEngine(fake().answer, constrained_language=None), TASKS, PY,
                  decoding=Decoding(name="constrained", constrained=True))
    with pytest.raises(UsageError, match="constrains vox"):
        run_bench(FakeEngine(fake().answer, constrained_language="vox"), TASKS, PY,
                  decoding=Decoding(name="constrained", constrained=True))
