"""Batched greedy decoding: same tokens as the single-stream loop, stops and budgets, fences, constraint replay."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import build_tiny_chat_lm  # noqa: E402

from mens.model.batch_decode import generate_greedy_batch  # noqa: E402
from mens.model.generate import (  # noqa: E402
    Constraint,
    chat_input_ids,
    code_block_closed,
    constraint_accepts,
    stream_tokens,
)

PROMPTS = ["add one", "hello world hello", "fn add(a: int) to int { return a + 1 } and then some more words 0123", "9"]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_chat_lm("llama")


def _prompts(tok) -> list[list[int]]:
    return [chat_input_ids(tok, [{"role": "user", "content": p}], "You write code.") for p in PROMPTS]


def _single(model, tok, ids, **kw) -> tuple[list[int], str]:
    kept: list[int] = []
    text = "".join(stream_tokens(model, tok, ids, on_token=kept.append, **kw))
    return kept, text


@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_batched_greedy_equals_single_stream(tiny, batch_size):
    model, tok = tiny
    prompts = _prompts(tok)
    assert len({len(p) for p in prompts}) == len(prompts)  # different lengths: left padding is exercised
    outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=20, stop_ids=set(), batch_size=batch_size)
    for ids, out in zip(prompts, outs, strict=True):
        kept, text = _single(model, tok, ids, max_new_tokens=20, stop_ids=set())
        assert out.token_ids == kept and out.text == text and out.finish == "length"


def test_batched_greedy_equals_single_stream_with_absolute_positions():
    model, tok = build_tiny_chat_lm("gpt2")
    prompts = _prompts(tok)
    outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=16, stop_ids=set(), batch_size=4)
    for ids, out in zip(prompts, outs, strict=True):
        assert out.token_ids == _single(model, tok, ids, max_new_tokens=16, stop_ids=set())[0]


def test_stop_ids_and_budget_are_honoured(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    free = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=set())
    assert all(len(o.token_ids) == 12 for o in free)
    stop = free[0].token_ids[4]  # the first prompt's fifth greedy token becomes a stop token
    done: list[tuple[int, int]] = []
    outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids={stop},
                                 progress=lambda i, n: done.append((i, n)))
    first = free[0].token_ids.index(stop)
    assert outs[0].finish == "stop" and outs[0].token_ids == free[0].token_ids[:first]
    for ids, out in zip(prompts, outs, strict=True):
        kept, _ = _single(model, tok, ids, max_new_tokens=12, stop_ids={stop})
        assert out.token_ids == kept and stop not in out.token_ids
        assert out.finish == ("stop" if len(kept) < 12 else "length")
    assert done == [(i, len(prompts)) for i in range(1, len(prompts) + 1)]


def test_stop_text_keeps_the_token_that_triggers_it(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    free = generate_greedy_batch(model, tok, prompts, max_new_tokens=10, stop_ids=set())
    target = free[1].text[:3]  # stop once the second answer has produced its first three characters

    def stop_text(text: str) -> bool:
        return text.startswith(target)

    outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=10, stop_ids=set(), stop_text=stop_text)
    assert outs[1].finish == "stop_text" and outs[1].text.startswith(target)
    for ids, out in zip(prompts, outs, strict=True):
        kept, text = _single(model, tok, ids, max_new_tokens=10, stop_ids=set(), stop_text=stop_text)
        assert out.token_ids == kept and out.text == text


def test_code_block_closed():
    assert code_block_closed("Here:\n```vox\nfn f() {}\n```")
    assert code_block_closed("```\nx = 1\n```\nThis code sets x.")
    assert code_block_closed("  ```python\nx = 1\n  ```  \n")
    assert code_block_closed("~~~\nx\n~~~")
    assert not code_block_closed("```vox\nfn f() {}\n")  # still open
    assert not code_block_closed("```vox\nfn f() {}\n``")  # closing fence not finished yet
    assert not code_block_closed("```vox")  # opening line not finished
    assert not code_block_closed("fn f() {}\nreturn 1\n")  # bare code
    assert not code_block_closed("use ```x``` inline\nmore")  # no fence line
    assert not code_block_closed("```\nx\n~~~")  # a different fence does not close it


def _fake_constraint(bad: str = "!") -> Constraint:
    return Constraint(viable=lambda t: bad not in t, complete=lambda t: t.endswith("1"))


def test_constraint_replay(tiny):
    _, tok = tiny
    good = tok("return a + 1", add_special_tokens=False)["input_ids"]
    assert constraint_accepts(tok, good, _fake_constraint())
    assert not constraint_accepts(tok, good, _fake_constraint(bad="a"))  # a prefix is not viable
    unfinished = tok("return a +", add_special_tokens=False)["input_ids"]
    assert not constraint_accepts(tok, unfinished, _fake_constraint())  # the stop token would be refused
    assert constraint_accepts(tok, [], Constraint(viable=lambda t: True, complete=lambda t: t == ""))


def test_replayed_greedy_output_equals_constrained_decoding(tiny):
    """Where the replay accepts a greedy answer that ended at a stop token, the constrained decoder agrees."""
    model, tok = tiny
    prompts = _prompts(tok)
    free = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=set())
    stop = free[2].token_ids[5]
    outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids={stop})
    assert outs[2].finish == "stop"
    text = outs[2].text
    constraint = Constraint(viable=lambda t: text.startswith(t), complete=lambda t: t == text)
    assert constraint_accepts(tok, outs[2].token_ids, constraint)
    constrained = "".join(stream_tokens(model, tok, prompts[2], max_new_tokens=12, stop_ids={stop},
                                        constraint=constraint))
    assert constrained == text


def test_batched_sampling_equals_single_stream_with_the_same_seeds(tiny):
    """Parse-and-retry batches its sampled attempts: each row draws from its own seeded generator, so the
    answers are the ones `stream_tokens` gives with that seed, stops included (an ended row draws no more)."""
    model, tok = tiny
    prompts = _prompts(tok)
    seeds = [11, 22, 33, 44]
    stop = {int(tok.convert_tokens_to_ids("<|im_end|>"))}
    outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=24, stop_ids=stop, batch_size=3,
                                 temperature=0.9, seeds=seeds)
    for ids, seed, out in zip(prompts, seeds, outs, strict=True):
        kept, text = _single(model, tok, ids, max_new_tokens=24, stop_ids=stop, temperature=0.9, seed=seed)
        assert out.token_ids == kept and out.text == text
    assert len({tuple(o.token_ids) for o in outs}) > 1
    with pytest.raises(ValueError, match="one seed per prompt"):
        generate_greedy_batch(model, tok, prompts, temperature=0.9)


def _batch_rows_per_step(model) -> tuple[list[int], object]:
    """Rows of input_ids in each forward call of `model`, recorded by a pre-hook (remove it with .remove())."""
    rows: list[int] = []
    handle = model.register_forward_pre_hook(lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]),
                                             with_kwargs=True)
    return rows, handle


@pytest.fixture(scope="module")
def varied():
    """The tiny model with larger random weights, so that different prompts get different answers."""
    model, tok = build_tiny_chat_lm("llama")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model, tok


def _early_stop(model, tok, prompts) -> int:
    """A stop token that ends the first prompt's answer early and leaves some other answer going."""
    free = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=set())
    for token in free[0].token_ids[1:6]:
        if any(token not in o.token_ids[:8] for o in free[1:]):
            return token
    pytest.skip("no token ends the first answer early and another one late")


def test_ended_rows_leave_the_batch_and_the_answers_stay_the_same(varied, monkeypatch):
    """Answers that have ended are dropped from the batch and its KV cache, so a step computes only the answers
    still going; every answer is still the single-stream one, greedy and sampled, and the same as when ended rows
    ride along."""
    import mens.model.batch_decode as gen

    model, tok = varied
    prompts = _prompts(tok)
    stop = {_early_stop(model, tok, prompts)}
    rows, handle = _batch_rows_per_step(model)
    try:
        outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=stop, batch_size=16)
    finally:
        handle.remove()
    lengths = sorted(len(o.token_ids) for o in outs)
    assert rows[0] == len(prompts) and min(rows) < len(prompts)
    assert rows == [sum(1 for n in lengths if n >= step or n == 12) for step in range(len(rows))]
    for ids, out in zip(prompts, outs, strict=True):
        assert out.token_ids == _single(model, tok, ids, max_new_tokens=12, stop_ids=stop)[0]
    sampled = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=stop, temperature=0.9,
                                    seeds=[5, 6, 7, 8])
    monkeypatch.setattr(gen, "_drop_ended", lambda *a: False)  # the cache cannot drop rows: they ride along
    rows, handle = _batch_rows_per_step(model)
    try:
        along = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=stop, batch_size=16)
        sampled_along = generate_greedy_batch(model, tok, prompts, max_new_tokens=12, stop_ids=stop,
                                              temperature=0.9, seeds=[5, 6, 7, 8])
    finally:
        handle.remove()
    assert set(rows) == {len(prompts)}
    assert [o.token_ids for o in along] == [o.token_ids for o in outs]
    assert [o.token_ids for o in sampled_along] == [o.token_ids for o in sampled]
    assert [o.finish for o in along] == [o.finish for o in outs]


def test_only_plain_key_value_caches_drop_rows():
    """A cache with any other per-row state (here a static layer) is left untouched and the caller told so."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, StaticLayer

    from mens.model.batch_decode import _drop_ended

    def filled(layer_types):
        cache = DynamicCache()
        cache.layers = [t() if t is DynamicLayer else t(max_cache_len=8) for t in layer_types]
        for i, layer in enumerate(cache.layers):
            kv = torch.arange(3 * 2 * 4 * 5, dtype=torch.float32).reshape(3, 2, 4, 5) + i
            if isinstance(layer, DynamicLayer):
                layer.update(kv, kv.clone())
        return cache

    rows = torch.tensor([0, 2])
    plain = filled([DynamicLayer, DynamicLayer])
    assert _drop_ended(plain, rows)
    assert all(layer.keys.shape[0] == 2 and torch.equal(layer.keys[1, 0, 0], torch.arange(80, 85) + i)
               for i, layer in enumerate(plain.layers))
    mixed = filled([DynamicLayer, StaticLayer])
    assert not _drop_ended(mixed, rows)
    assert mixed.layers[0].keys.shape[0] == 3
    assert not _drop_ended(None, rows) and not _drop_ended((), rows)


def test_a_model_that_returns_every_position_gets_fewer_prompts_at_once(tiny, monkeypatch):
    import mens.model.batch_decode as gen

    model, tok = tiny
    prompts = _prompts(tok)
    monkeypatch.setattr(gen, "_keeps_last_logits_only", lambda m: False)
    monkeypatch.setattr(gen, "PREFILL_LOGITS", 2 * max(map(len, prompts)) * len(tok))
    rows, handle = _batch_rows_per_step(model)
    try:
        outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=4, stop_ids=set(), batch_size=16)
    finally:
        handle.remove()
    assert max(rows) == 2 and rows[0] == 2
    for ids, out in zip(prompts, outs, strict=True):
        assert out.token_ids == _single(model, tok, ids, max_new_tokens=4, stop_ids=set())[0]


def test_a_batch_keeps_its_kv_cache_within_its_budget(tiny, monkeypatch):
    import mens.model.batch_decode as gen

    model, tok = tiny
    prompts = _prompts(tok)
    cfg = model.config
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert gen._cache_bytes_per_token(model) == per_token
    monkeypatch.setattr(gen, "CACHE_BYTES", 3 * per_token * (max(map(len, prompts)) + 4))
    rows, handle = _batch_rows_per_step(model)
    try:
        outs = generate_greedy_batch(model, tok, prompts, max_new_tokens=4, stop_ids=set(), batch_size=16)
    finally:
        handle.remove()
    assert rows[0] == 3 and max(rows) == 3
    for ids, out in zip(prompts, outs, strict=True):
        assert out.token_ids == _single(model, tok, ids, max_new_tokens=4, stop_ids=set())[0]
