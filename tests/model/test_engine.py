"""The engine interface: `generate_batch` answers are exactly the joined streams, for a stream-only test double
(`SequentialBatch`) and for the real `HFEngine` on a tiny model, whose batches, kept greedy answers and reused
constrained drafts must not change a single answer."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from mens.model.engine import GenerationRequest, SequentialBatch, Usage


class Countdown(SequentialBatch):
    """Streams "seed t<n> t<n-1> ..." down from max_tokens; knows nothing about batches."""

    model_id = "countdown"
    constrained_language = None

    def __init__(self):
        self.streamed: list[GenerationRequest] = []

    def stream(self, request: GenerationRequest, usage: Usage) -> Iterator[str]:
        self.streamed.append(request)
        yield f"{request.seed} "
        for n in range(request.max_tokens, 0, -1):
            usage.completion_tokens += 1
            yield f"t{n} "


def test_a_stream_only_engine_gets_generate_batch_equal_to_joining_its_streams():
    engine = Countdown()
    requests = [GenerationRequest(prompt="a", max_tokens=3, seed=1), GenerationRequest(prompt="b", max_tokens=0),
                GenerationRequest(messages=[{"role": "user", "content": "c"}], max_tokens=2, seed=7)]
    ticks = []
    answers = engine.generate_batch(requests, lambda i, n: ticks.append((i, n)))
    assert answers == ["".join(Countdown().stream(r, Usage())) for r in requests]
    assert answers == ["1 t3 t2 t1 ", "None ", "7 t2 t1 "]
    assert engine.streamed == requests and ticks == [(1, 3), (2, 3), (3, 3)]
    assert engine.generate_batch([]) == []


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.conftest import build_tiny_chat_lm, teach_answer  # noqa: E402

from mens.model.batch_decode import generate_greedy_batch  # noqa: E402
from mens.model.hf_engine import HFEngine  # noqa: E402
from mens.model.inference import LoadedModel  # noqa: E402

PROMPTS = ["write add", "write a much longer thing please, with more words", "x"]


@pytest.fixture
def one_thread():
    """One thread (beside other busy processes, more threads are many times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def loaded(one_thread):
    """A tiny chat model, run on one thread."""
    model, tok = build_tiny_chat_lm("llama")
    return LoadedModel(model, tok, "You write code.", "tiny", "model")


def chat(prompt: str, **kw) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": prompt}], **kw)


def streamed(engine: HFEngine, requests: list[GenerationRequest]) -> list[str]:
    return ["".join(engine.stream(r, Usage())) for r in requests]


def forwards(model) -> list[int]:
    """A list that grows by one per model forward step."""
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_hf_generate_batch_equals_streaming_each_request(loaded):
    """Greedy (prompts of different lengths: left padding), seeded sampling, a nucleus cut, a raw prompt, a
    temperature under the floor, both end rules and two budgets, in one call with batches of 2."""
    requests = [chat(p, max_tokens=10, stop_at_closed_block=i % 2 == 0) for i, p in enumerate(PROMPTS)]
    requests += [chat(p, max_tokens=8, temperature=0.8, seed=s) for p, s in zip(PROMPTS, (3, 4, 5), strict=True)]
    requests += [chat("x", max_tokens=8, temperature=1.3, seed=3, stop_at_closed_block=True),
                 chat("x", max_tokens=6, temperature=0.8, top_p=0.5, seed=9),
                 GenerationRequest(prompt="fn add(a: int)", max_tokens=7), chat("x", max_tokens=12, temperature=1e-9)]
    ticks = []
    answers = HFEngine(loaded, batch_size=2).generate_batch(requests, lambda i, n: ticks.append((i, n)))
    assert answers == streamed(HFEngine(loaded), requests)
    assert len(set(answers[3:6])) == 3  # the seeds matter: this is not greedy decoding three times
    assert ticks[-1] == (len(requests), len(requests)) and [i for i, _ in ticks] == sorted(i for i, _ in ticks)


def test_hf_greedy_answers_are_kept_per_prompt_and_budget(loaded):
    engine = HFEngine(loaded)
    requests = [chat(p, max_tokens=6) for p in PROMPTS]
    steps = forwards(loaded.model)
    first = engine.generate_batch(requests)
    assert steps
    steps.clear()
    assert engine.generate_batch([requests[2], requests[0]]) == [first[2], first[0]] and not steps  # kept
    assert engine.generate_batch([chat(PROMPTS[0], max_tokens=5)]) and steps  # another budget: decoded
    steps.clear()
    assert streamed(engine, requests[:1]) == first[:1] and steps  # a stream never takes a kept answer


def test_hf_adopted_answers_are_not_decoded_and_others_are(monkeypatch, one_thread):
    """Answers another model gave are adopted where this one is shown to decode exactly them (teacher forcing):
    those come back without being decoded, the refused one is decoded, and the answers are what decoding them all
    gives. A sampled request never adopts."""
    import mens.model.hf_engine as hf_engine

    model, tok = build_tiny_chat_lm("llama")
    loaded = LoadedModel(model, tok, "You write code.", "tiny", "model")
    requests = [chat(p, max_tokens=30) for p in PROMPTS]
    answer = "fn add(a: int) to int { return a + 1 }"
    teach_answer(model, tok, [HFEngine(loaded).prompt_ids(r) for r in requests[:2]], answer)
    expected = HFEngine(loaded).generate_batch(requests)
    assert expected[:2] == [answer, answer]

    engine = HFEngine(loaded)
    adopted = engine.adopt_greedy([*requests, chat(PROMPTS[0], max_tokens=30, temperature=0.8, seed=1)],
                                  [answer, answer + " ", expected[2], answer])
    assert adopted[:2] == [True, False] and adopted[3] is False
    decoded: list[tuple[int, ...]] = []
    batch = hf_engine.generate_greedy_batch

    def recording(model, tok, prompts, **kw):
        decoded.extend(tuple(p) for p in prompts)
        return batch(model, tok, prompts, **kw)

    monkeypatch.setattr(hf_engine, "generate_greedy_batch", recording)
    assert engine.generate_batch(requests) == expected
    assert decoded == [tuple(engine.prompt_ids(r)) for r, a in zip(requests, adopted, strict=False) if not a]


def streams_of(engine: HFEngine) -> list[str]:
    """A list that gets the prompt of each answer `engine` streams from now on (given a draft or not)."""
    calls: list[str] = []
    stream = engine._stream
    engine._stream = lambda request, usage, draft=None: (calls.append(request.messages[-1]["content"])
                                                         or stream(request, usage, draft))
    return calls


def fake_language(complete):
    """A language whose every text is viable and whose finished code is what `complete(text)` says."""
    return SimpleNamespace(name="fake", viable_prefix=lambda _text: True,
                           parse=lambda text: SimpleNamespace(has_code=complete(text)))


@pytest.mark.parametrize("accept", [True, False])
def test_hf_constrained_answers_reuse_the_greedy_draft_only_when_the_constraint_would(loaded, accept):
    """A greedy draft that ends at a stop token and that the constraint accepts is the constrained answer; a
    refused one is decoded again with the constraint. Either way the answers are the constrained streams."""
    model, tok = loaded.model, loaded.tokenizer
    prompt = HFEngine(loaded).prompt_ids(chat(PROMPTS[0]))
    [first] = generate_greedy_batch(model, tok, [prompt], max_new_tokens=10, stop_ids=set())
    model.generation_config.eos_token_id = first.token_ids[3]  # the first draft now ends at a stop token
    drafts = HFEngine(loaded).generate_batch([chat(p, max_tokens=10) for p in PROMPTS])
    target = drafts[0]
    complete = (lambda text: text == target) if accept else (lambda text: False)  # refused: its stop is not taken
    requests = [chat(p, max_tokens=10, constrained=True, stop_at_closed_block=True) for p in PROMPTS]
    expected = streamed(HFEngine(loaded, fake_language(complete)), requests)

    for warm in (False, True):  # drafts decoded inside the constrained call, or kept from a greedy call before
        engine = HFEngine(loaded, fake_language(complete))
        if warm:
            engine.generate_batch([chat(p, max_tokens=10, stop_at_closed_block=True) for p in PROMPTS])
        calls = streams_of(engine)
        assert engine.generate_batch(requests) == expected
        again = [p for p, d in zip(PROMPTS, drafts, strict=True) if not accept or d != target]
        assert calls == again and (accept or calls == PROMPTS) and (not accept or PROMPTS[0] not in calls)


def test_hf_refused_drafts_are_repaired_from_the_draft_not_decoded_again_from_scratch(loaded):
    """A constrained answer whose draft the constraint refuses takes the draft's tokens as the model's choices and
    runs the model only from where the draft ends (here: the stop it may not take): the same answers as streaming
    each from scratch, for fewer model steps."""
    model, tok = loaded.model, loaded.tokenizer
    prompt = HFEngine(loaded).prompt_ids(chat(PROMPTS[0]))
    [first] = generate_greedy_batch(model, tok, [prompt], max_new_tokens=10, stop_ids=set())
    model.generation_config.eos_token_id = first.token_ids[3]  # the first draft ends at a stop token it may not take
    never = fake_language(lambda _text: False)
    requests = [chat(p, max_tokens=10, constrained=True) for p in PROMPTS]
    steps = forwards(model)
    expected = streamed(HFEngine(loaded, never), requests)
    from_scratch = len(steps)
    engine = HFEngine(loaded, never)
    engine.generate_batch([chat(p, max_tokens=10) for p in PROMPTS])  # the drafts, kept
    steps.clear()
    calls = streams_of(engine)
    assert engine.generate_batch(requests) == expected and calls == PROMPTS
    assert len(steps) < from_scratch - 3  # at least the first answer's 3 draft tokens are not decoded again
