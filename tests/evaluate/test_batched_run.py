"""The bench runner's batched path: greedy first answers come from one batch call, retries stay single."""

from __future__ import annotations

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


def fakes():
    """A single-stream and a batch generator that log their calls; the batch one answers as greedy would."""
    single, batches = [], []

    def generate(messages, max_new_tokens, temperature, seed, constrained):
        prompt = messages[-1]["content"]
        single.append((prompt, temperature, seed, constrained))
        return GREEDY[prompt] if temperature == 0 else SAMPLED

    def generate_batch(chats, max_new_tokens, constrained, progress=None):
        batches.append(([c[-1]["content"] for c in chats], max_new_tokens, constrained))
        if progress:
            for i in range(len(chats)):
                progress(i + 1, len(chats))
        return [GREEDY[c[-1]["content"]] for c in chats]

    return generate, generate_batch, single, batches


def test_greedy_first_answers_come_from_one_batch_call():
    generate, generate_batch, single, batches = fakes()
    ticks = []
    report = run_bench(generate, TASKS, PY, max_new_tokens=32, generate_batch=generate_batch,
                       progress=lambda i, n: ticks.append(i))
    assert batches == [(["write add", "write Point"], 32, False)] and single == []
    assert report["metrics"]["batched"] is True and report["metrics"]["tasks"] == 2
    outputs = [s["output"] for r in report["results"] for s in r["samples"]]
    assert outputs == [GREEDY["write add"], GREEDY["write Point"]]
    assert ticks == [1, 2, 1, 2]  # while the batch decodes, then while answers are checked


def test_batched_report_equals_the_single_stream_report():
    generate, generate_batch, _, _ = fakes()
    for decoding in (Decoding(), Decoding(name="retry", retries=2)):
        a = run_bench(generate, TASKS, PY, decoding=decoding, generate_batch=generate_batch)
        b = run_bench(generate, TASKS, PY, decoding=decoding)
        assert a["results"] == b["results"] and a["metrics"]["batched"] and not b["metrics"]["batched"]


def test_retry_keeps_sampled_attempts_single_stream():
    generate, generate_batch, single, batches = fakes()
    report = run_bench(generate, TASKS, PY, decoding=Decoding(name="retry", retries=2), generate_batch=generate_batch)
    assert len(batches) == 1
    assert single == [("write Point", 0.7, 1000 + 7919, False)]  # only the unparseable answer is retried
    point = report["results"][1]["samples"][0]
    assert point["attempts"] == 2 and point["output"] == SAMPLED


def test_greedy_k_samples_share_one_batched_answer():
    generate, generate_batch, single, batches = fakes()
    report = run_bench(generate, TASKS, PY, k=3, generate_batch=generate_batch)
    assert len(batches) == 1 and batches[0][0] == ["write add", "write Point"] and single == []
    assert [s["seed"] for s in report["results"][0]["samples"]] == [0, 1, 2]


def test_sampled_decoding_does_not_batch():
    generate, generate_batch, single, batches = fakes()
    report = run_bench(generate, TASKS, PY, k=2, decoding=Decoding(temperature=0.8), generate_batch=generate_batch)
    assert batches == [] and len(single) == 4 and report["metrics"]["batched"] is False


def test_evaluate_model_batches_greedy_modes_and_base():
    generate, generate_batch, single, batches = fakes()
    base, base_batch, base_single, base_batches = fakes()
    report = evaluate_model(generate, TASKS, PY, modes=["greedy", "retry", "constrained"], k=1, max_new_tokens=16,
                            base_generate=base, generate_batch=generate_batch, base_generate_batch=base_batch)
    assert [b[2] for b in batches] == [False, False, True]  # the constrained flag reaches the batch generator
    assert all(m["batched"] for m in report["modes"].values())
    assert len(base_batches) == 1 and base_single == [] and report["base"]["metrics"]["batched"]
    assert single == [("write Point", 0.7, 1000 + 7919, False)]  # retry's second attempt


def test_evaluate_model_with_k_above_one_samples_single_stream():
    generate, generate_batch, single, batches = fakes()
    evaluate_model(generate, TASKS, PY, modes=["greedy"], k=2, max_new_tokens=16, generate_batch=generate_batch)
    assert batches == [] and len(single) == 4


def _tiny_loaded():
    import pytest

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.conftest import build_tiny_tokenizer

    from mens.model.inference import LoadedModel

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LoadedModel(transformers.LlamaForCausalLM(cfg).eval(), tok, "You write code.", "tiny", "model")


def test_generate_batch_fn_matches_generate_fn_and_reuses_accepted_greedy_answers(monkeypatch):
    """On a tiny model: batched = single-stream greedy; constrained reuses a greedy answer only when the
    constraint accepts it, else decodes with the constraint, and both ways equal single-stream constrained."""
    import mens.model.constraint as constraint_module
    from mens.evaluate.local import generate_batch_fn, generate_fn
    from mens.model.generate import Constraint

    loaded = _tiny_loaded()
    chats = [[{"role": "user", "content": p}] for p in ("write add", "write a much longer thing please", "x")]
    single = generate_fn(loaded, PY)
    free = generate_batch_fn(loaded, PY, batch_size=2)(chats, 10, False)
    assert free == [single(c, 10, 0.0, 0, False) for c in chats]

    from mens.model.generate import chat_input_ids, generate_greedy_batch

    prompt = chat_input_ids(loaded.tokenizer, chats[0], loaded.system_prompt)
    [first] = generate_greedy_batch(loaded.model, loaded.tokenizer, [prompt], max_new_tokens=10, stop_ids=set())
    loaded.model.generation_config.eos_token_id = first.token_ids[3]  # the first answer now ends at a stop token
    calls = []

    def counting(messages, max_new_tokens, temperature, seed, constrained):
        calls.append(messages)
        return generate_fn(loaded, PY)(messages, max_new_tokens, temperature, seed, constrained)

    monkeypatch.setattr("mens.evaluate.local.generate_fn", lambda *_: counting)  # this module keeps the original
    greedy = generate_batch_fn(loaded, PY)(chats, 10, False)
    target = greedy[0]
    for accept in (True, False):
        complete = (lambda t: t == target) if accept else (lambda t: False)  # refused: the stop is not taken
        monkeypatch.setattr(constraint_module, "language_constraint",
                            lambda _lang, done=complete: Constraint(viable=lambda t: True, complete=done))
        calls.clear()
        answers = generate_batch_fn(loaded, PY)(chats, 10, True)
        assert answers == [generate_fn(loaded, PY)(c, 10, 0.0, 0, True) for c in chats]
        decoded_again = [c for c, g in zip(chats, greedy, strict=True) if not accept or g != target]
        assert calls == decoded_again and (accept or calls == chats)


def test_retries_batch_through_sample_with_the_single_stream_seeds():
    """With `generate_batch.sample`, every unparsed answer of a round is resampled in one call, with the seeds and
    attempt numbers of the one-at-a-time path, so the report is the same."""
    generate, generate_batch, single, batches = fakes()
    sampled = []

    def sample(chats, max_new_tokens, temperature, seeds):
        sampled.append(([c[-1]["content"] for c in chats], temperature, seeds))
        return [generate(c, max_new_tokens, temperature, s, False) for c, s in zip(chats, seeds, strict=True)]

    generate_batch.sample = sample
    retry = Decoding(name="retry", retries=2)
    a = run_bench(generate, TASKS, PY, decoding=retry, generate_batch=generate_batch)
    assert sampled == [(["write Point"], 0.7, [1000 + 7919])]  # SAMPLED parses: no second round
    b = run_bench(generate, TASKS, PY, decoding=retry)
    assert a["results"] == b["results"]
    sampled.clear()
    run_bench(generate, TASKS, PY, decoding=Decoding(name="constrained", constrained=True, retries=1),
              generate_batch=generate_batch)
    assert sampled == []  # constrained retries are decoded with the constraint, one at a time
