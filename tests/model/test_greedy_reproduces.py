"""Teacher-forced greedy check: an answer is vouched for only where decoding would give exactly it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import build_tiny_chat_lm, teach_answer  # noqa: E402

import mens.model.batch_decode as batch_decode  # noqa: E402
from mens.model.batch_decode import generate_greedy_batch, greedy_reproduces  # noqa: E402
from mens.model.generate import chat_input_ids  # noqa: E402

PROMPTS = ["add one", "hello world hello", "fn add(a: int) to int { return a + 1 } and more words 0123", "9"]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_chat_lm("llama")


def _prompts(tok) -> list[list[int]]:
    return [chat_input_ids(tok, [{"role": "user", "content": p}], "You write code.") for p in PROMPTS]


def _same(a, b) -> bool:
    return a is not None and b is not None and (a.text, a.token_ids, a.finish) == (b.text, b.token_ids, b.finish)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_own_greedy_answers_are_reproduced_with_how_they_ended(arch):
    model, tok = build_tiny_chat_lm(arch)
    prompts = _prompts(tok)
    free = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=set())
    stop = free[0].token_ids[4]  # the first answer's fifth token ends answers: some end at a stop token
    target = free[1].text[:3]

    def stop_text(text: str) -> bool:
        return text.startswith(target)

    finishes = set()
    for kw in ({"stop_ids": set()}, {"stop_ids": {stop}}, {"stop_ids": set(), "stop_text": stop_text}):
        decoded = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, **kw)
        got = greedy_reproduces(model, tok, prompts, [d.token_ids for d in decoded], max_new_tokens=12,
                                batch_size=3, **kw)
        assert all(_same(g, d) for g, d in zip(got, decoded, strict=True)), kw
        finishes |= {d.finish for d in decoded}
    assert finishes == {"stop", "stop_text", "length"}


def test_answers_decoding_would_not_give_are_refused(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    free = [d.token_ids for d in generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=set())]
    stop = free[0][4]
    ids = [d.token_ids for d in generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids={stop})]

    def check(answers, stop_ids=frozenset({stop}), max_new_tokens=12, **kw):
        return greedy_reproduces(model, tok, prompts, answers, max_new_tokens=max_new_tokens, stop_ids=set(stop_ids),
                                 **kw)

    assert all(g is not None for g in check(ids)) and all(g is not None for g in check(free, stop_ids=()))
    other = (ids[0][0] + 1) % len(tok)
    assert check([[other, *a[1:]] if a else [other] for a in ids])[0] is None  # a different first token
    assert all(g is None for g, a in zip(check([a[:-1] for a in ids]), ids, strict=True) if a)  # cut short
    assert check([[*a, stop] for a in ids]) == [None] * len(ids)  # a stop token is never kept
    assert check(free, stop_ids=(), max_new_tokens=13) == [None] * len(free)  # decoding would go on past 12
    assert check(free, stop_ids=(), max_new_tokens=11) == [None] * len(free)  # or stop before the last token
    assert check(free, stop_ids=(), stop_text=lambda t: len(t) >= 1) == [None] * len(free)  # would stop earlier


def test_another_models_answers_and_near_ties_are_refused(tiny, monkeypatch):
    model, tok = tiny
    prompts = _prompts(tok)
    decoded = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=set())
    torch.manual_seed(1)
    other = transformers.LlamaForCausalLM(model.config).eval()
    assert greedy_reproduces(other, tok, prompts, [d.token_ids for d in decoded], max_new_tokens=12,
                             stop_ids=set()) == [None] * len(prompts)
    monkeypatch.setattr(batch_decode, "TIE_MARGIN", float("inf"))  # every choice a near tie: nothing is vouched for
    assert greedy_reproduces(model, tok, prompts, [d.token_ids for d in decoded], max_new_tokens=12,
                             stop_ids=set()) == [None] * len(prompts)


ANSWER = "fn add(a: int) to int { return a + 1 }"


def test_a_text_is_reproduced_only_where_it_tokenizes_back_to_itself():
    model, tok = build_tiny_chat_lm("llama")
    prompts = _prompts(tok)
    teach_answer(model, tok, prompts, ANSWER)
    decoded = generate_greedy_batch(model, tok, prompts, max_new_tokens=40)
    assert [d.text for d in decoded] == [ANSWER] * len(prompts) and {d.finish for d in decoded} == {"stop"}
    got = greedy_reproduces(model, tok, prompts, [ANSWER] * len(prompts), max_new_tokens=40)
    assert all(_same(g, d) for g, d in zip(got, decoded, strict=True))
    # Text the same token ids would not decode to (an extra space), or that the model would not end there.
    assert greedy_reproduces(model, tok, prompts[:2], [ANSWER + " ", ANSWER[:-1]], max_new_tokens=40) == [None] * 2
    # The same text as other tokens than the model's own (one character a token): decoding would not give them.
    spelled = [tok.convert_tokens_to_ids(tok.tokenize(c))[0] for c in ANSWER[:8]]
    assert tok.decode(spelled) == ANSWER[:8]
    assert greedy_reproduces(model, tok, prompts[:1], [spelled], max_new_tokens=40, stop_ids={-1}) == [None]


def test_a_half_precision_model_needs_the_wider_margin(monkeypatch):
    model, tok = build_tiny_chat_lm("llama")
    prompts = _prompts(tok)
    model = teach_answer(model, tok, prompts, ANSWER).to(torch.bfloat16)
    decoded = generate_greedy_batch(model, tok, prompts, max_new_tokens=40)
    assert [d.text for d in decoded] == [ANSWER] * len(prompts)
    monkeypatch.setattr(batch_decode, "TIE_MARGIN", float("inf"))  # not the f32 margin: bf16 reads HALF_TIE_MARGIN
    got = greedy_reproduces(model, tok, prompts, [ANSWER] * len(prompts), max_new_tokens=40)
    assert all(_same(g, d) for g, d in zip(got, decoded, strict=True))
    monkeypatch.setattr(batch_decode, "HALF_TIE_MARGIN", float("inf"))
    assert greedy_reproduces(model, tok, prompts, [ANSWER] * len(prompts), max_new_tokens=40) == [None] * len(prompts)


def test_chunks_keep_the_logits_budget():
    chunks = list(batch_decode._chunks(list(range(1, 9)), 3, lambda n: n * 10, budget=100))
    assert [x for c in chunks for x in c] == list(range(1, 9))
    assert all(len(c) <= 3 and (len(c) == 1 or len(c) * max(c) * 10 <= 100) for c in chunks)
