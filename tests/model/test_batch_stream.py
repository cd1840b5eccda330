"""Concurrent streamed answers decoded in one batch: each reader gets the answer it would get alone, rows that end,
leave or are cancelled drop out without disturbing the others, and a failed step reaches only its own batch."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import build_tiny_chat_lm  # noqa: E402

from mens.model.batch_stream import BatchStreamer  # noqa: E402
from mens.model.engine import GenerationRequest, Usage  # noqa: E402
from mens.model.generate import chat_input_ids, stop_token_ids, stream_tokens  # noqa: E402
from mens.model.hf_engine import HFEngine  # noqa: E402
from mens.model.inference import LoadedModel  # noqa: E402

PROMPTS = ["add one", "hello world hello", "fn add(a: int) to int { return a + 1 } and then some more words 0123", "9"]
# (max_new_tokens, temperature, top_p, seed) per prompt: greedy, sampled, a nucleus cut, a short budget
SETTINGS = [(20, 0.0, 1.0, None), (16, 0.9, 1.0, 7), (12, 1.2, 0.6, 3), (5, 0.0, 1.0, None)]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_chat_lm("llama")


def _ids(tok) -> list[list[int]]:
    return [chat_input_ids(tok, [{"role": "user", "content": p}], "You write code.") for p in PROMPTS]


def _alone(model, tok, ids, n, t, p, seed, stop_ids) -> str:
    return "".join(stream_tokens(model, tok, ids, max_new_tokens=n, temperature=t, top_p=p, seed=seed,
                                 stop_ids=stop_ids))


def _run(threads: list[threading.Thread]) -> None:
    """Start the threads together and wait for them (bounded)."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a reader did not finish within 60 s"


def _read_all(gens) -> list[list[str]]:
    """Read every generator to its end, each from its own thread, all starting together."""
    out: list[list[str]] = [[] for _ in gens]
    errors: list[BaseException] = []
    start = threading.Barrier(len(gens))

    def read(i):
        try:
            start.wait()
            out[i].extend(gens[i])
        except BaseException as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    _run([threading.Thread(target=read, args=(i,)) for i in range(len(gens))])
    assert not errors, errors
    return out


def _held_first_step(model):
    """Hold the model's first forward pass until `release` is set (the second reader's row then waits, so the
    rows that arrive meanwhile form one batch); returns (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    calls = []

    def hook(*_):
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            assert release.wait(30)

    handle = model.register_forward_pre_hook(hook)
    return entered, release, handle


def test_concurrent_answers_equal_each_answer_alone(tiny):
    """Greedy and sampled rows (a nucleus cut too), prompts of different lengths, different budgets, a stop token
    that ends some rows early: every reader's text is what `stream_tokens` gives alone."""
    model, tok = tiny
    prompts = _ids(tok)
    stop = {*stop_token_ids(tok, model), tok.convert_tokens_to_ids("Ġ")}
    streamer = BatchStreamer(model, tok, max_rows=8)
    streamer.stop_ids = stop
    gens = [streamer.stream(ids, max_new_tokens=n, temperature=t, top_p=p, seed=s)
            for ids, (n, t, p, s) in zip(prompts, SETTINGS, strict=True)]
    texts = ["".join(parts) for parts in _read_all(gens)]
    assert texts == [_alone(model, tok, ids, n, t, p, s, stop) for ids, (n, t, p, s) in zip(prompts, SETTINGS,
                                                                                             strict=True)]
    assert sum(streamer.batches) == len(prompts) and max(streamer.batches) > 1  # rows read together share a batch


def _arrive_during_first_step(streamer, model, prompts, settings):
    """Start a one-row batch with prompts[0], hold its first model step until the other rows (with their
    `settings`) wait in the streamer, then let everything run; returns every reader's text."""
    entered, release, handle = _held_first_step(model)
    try:
        first = streamer.stream(prompts[0], max_new_tokens=6)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(first))
        reader.start()
        assert entered.wait(30)  # the first batch (one row) is inside its first model step
        rest = [streamer.stream(ids, max_new_tokens=n, temperature=t, top_p=p, seed=s)
                for ids, (n, t, p, s) in zip(prompts[1:], settings, strict=True)]
        results: list[list[str]] = [[] for _ in rest]
        threads = [threading.Thread(target=lambda i=i: results[i].extend(rest[i])) for i in range(len(rest))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(streamer._pending) < len(rest):  # every later row waits for the running batch's step
            assert time.monotonic() < deadline, "the later rows never reached the streamer"
            time.sleep(0.01)
        release.set()
        reader.join(30)
        for t in threads:
            t.join(30)
    finally:
        handle.remove()
    return ["".join(out)] + ["".join(parts) for parts in results]


def test_rows_that_arrive_during_a_batch_join_it_and_answer_as_alone(tiny):
    """Rows that arrive while a batch decodes join it at its next step: a prompt longer than the batch's cache and
    shorter ones (the cache left-padded either way), greedy and sampled, each answering as it would alone."""
    model, tok = tiny
    prompts = _ids(tok)
    stop = stop_token_ids(tok, model)
    streamer = BatchStreamer(model, tok, max_rows=8)
    settings = [(16, 0.9, 1.0, 7), (30, 0.0, 1.0, None), (12, 1.2, 0.6, 3)]
    assert len(prompts[2]) > len(prompts[0]) + 1 > len(prompts[3])
    texts = _arrive_during_first_step(streamer, model, prompts, settings)
    assert list(streamer.batches) == [1] and list(streamer.joins) == [len(prompts) - 1]
    assert texts[0] == _alone(model, tok, prompts[0], 6, 0.0, 1.0, None, stop)
    for ids, (n, t, p, s), text in zip(prompts[1:], settings, texts[1:], strict=True):
        assert text == _alone(model, tok, ids, n, t, p, s, stop)


def test_a_full_batch_or_a_cache_that_cannot_take_rows_leaves_them_for_the_next_batch(tiny, monkeypatch):
    import mens.model.batch_stream as batch_stream

    model, tok = tiny
    prompts = _ids(tok)
    stop = stop_token_ids(tok, model)
    greedy = [(6, 0.0, 1.0, None)] * (len(prompts) - 1)
    full = BatchStreamer(model, tok, max_rows=1)
    texts = _arrive_during_first_step(full, model, prompts, greedy)
    assert list(full.joins) == [] and list(full.batches)[0] == 1 and sum(full.batches) == len(prompts)
    assert texts == [_alone(model, tok, ids, 6, 0.0, 1.0, None, stop) for ids in prompts]
    monkeypatch.setattr(batch_stream, "_joinable", lambda past: False)
    static = BatchStreamer(model, tok, max_rows=8)
    texts = _arrive_during_first_step(static, model, prompts, greedy)
    assert list(static.joins) == [] and list(static.batches) == [1, len(prompts) - 1]
    assert texts == [_alone(model, tok, ids, 6, 0.0, 1.0, None, stop) for ids in prompts]


def test_a_reader_that_leaves_or_is_cancelled_drops_out_and_the_others_finish(tiny):
    model, tok = tiny
    prompts = _ids(tok)
    streamer = BatchStreamer(model, tok, max_rows=8)
    streamer.stop_ids = set()
    cancel = threading.Event()
    steps: list[int] = []
    model_steps = model.register_forward_hook(lambda *_: steps.append(1))
    try:
        leaver = streamer.stream(prompts[0], max_new_tokens=30)
        cancelled = streamer.stream(prompts[1], max_new_tokens=30, should_stop=cancel.is_set)
        stays = [streamer.stream(ids, max_new_tokens=30) for ids in prompts[2:]]
        got: dict[str, list[str]] = {"leaver": [], "cancelled": []}

        def leave():
            got["leaver"].append(next(leaver))
            leaver.close()

        def cancel_after_one():
            for piece in cancelled:
                got["cancelled"].append(piece)
                cancel.set()

        results: list[list[str]] = [[] for _ in stays]
        threads = [threading.Thread(target=leave), threading.Thread(target=cancel_after_one)]
        threads += [threading.Thread(target=lambda i=i: results[i].extend(stays[i])) for i in range(len(stays))]
        _run(threads)
    finally:
        model_steps.remove()
    for ids, parts in zip(prompts[2:], results, strict=True):
        assert "".join(parts) == _alone(model, tok, ids, 30, 0.0, 1.0, None, set())
    assert len(got["leaver"]) == 1 and 1 <= len(got["cancelled"]) < 30
    assert max(streamer.batches) > 1
    assert len(steps) <= 31 * len(streamer.batches)  # no batch ran past the longest remaining answer


def test_a_failed_step_reaches_every_row_of_its_batch_and_the_next_batch_works(tiny):
    model, tok = tiny
    prompts = _ids(tok)
    streamer = BatchStreamer(model, tok, max_rows=8)

    def boom(*_):
        raise RuntimeError("out of memory")

    handle = model.register_forward_pre_hook(boom)
    try:
        gens = [streamer.stream(ids, max_new_tokens=5) for ids in prompts]
        errors: list[BaseException] = []

        def read(g):
            try:
                list(g)
            except RuntimeError as e:
                errors.append(e)

        _run([threading.Thread(target=read, args=(g,)) for g in gens])
    finally:
        handle.remove()
    assert len(errors) == len(prompts)
    assert all("batched decoding failed: RuntimeError: out of memory" in str(e) for e in errors)
    again = "".join(streamer.stream(prompts[0], max_new_tokens=5))
    assert again == _alone(model, tok, prompts[0], 5, 0.0, 1.0, None, stop_token_ids(tok, model))


def test_a_failed_join_reaches_only_the_joining_rows(tiny):
    """The running batch's rows finish as alone when the prompt step of rows joining it fails."""
    model, tok = tiny
    prompts = _ids(tok)
    stop = stop_token_ids(tok, model)
    streamer = BatchStreamer(model, tok, max_rows=8)
    calls = []

    def fail_the_join(_module, _args, kwargs):
        calls.append(kwargs.get("past_key_values"))
        if len(calls) > 1 and kwargs.get("past_key_values") is None:  # a prompt step after the batch's first
            raise RuntimeError("out of memory")

    entered, release, held = _held_first_step(model)
    failing = model.register_forward_pre_hook(fail_the_join, with_kwargs=True)
    try:
        first = streamer.stream(prompts[0], max_new_tokens=8)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(first))
        reader.start()
        assert entered.wait(30)
        late = streamer.stream(prompts[1], max_new_tokens=8)
        errors: list[BaseException] = []

        def read_late():
            try:
                list(late)
            except RuntimeError as e:
                errors.append(e)

        other = threading.Thread(target=read_late)
        other.start()
        deadline = time.monotonic() + 30
        while not streamer._pending:
            assert time.monotonic() < deadline, "the late row never reached the streamer"
            time.sleep(0.01)
        release.set()
        reader.join(30)
        other.join(30)
    finally:
        held.remove()
        failing.remove()
    assert list(streamer.joins) == [1]
    assert len(errors) == 1 and "batched decoding failed: RuntimeError: out of memory" in str(errors[0])
    assert "".join(out) == _alone(model, tok, prompts[0], 8, 0.0, 1.0, None, stop)


def test_hf_engine_batches_only_unconstrained_requests_with_a_prompt(tiny):
    model, tok = tiny
    loaded = LoadedModel(model, tok, "You write code.", "tiny", "model")
    plain, batched = HFEngine(loaded), HFEngine(loaded, max_batch=4)
    chat = GenerationRequest(messages=[{"role": "user", "content": "add one"}], max_tokens=9)
    assert not plain.batchable(chat) and batched.batchable(chat)
    assert batched.batchable(GenerationRequest(messages=chat.messages, constrained=True))  # no language: plain
    usage = Usage()
    assert "".join(batched.stream(chat, usage)) == "".join(plain.stream(chat, Usage()))
    assert usage.prompt_tokens == plain.count_tokens(chat) and usage.completion_tokens > 0
