"""Constrained decoding streams as it decodes and only repairs: the model's own choices are kept while viable."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import build_tiny_chat_lm  # noqa: E402

import mens.model.generate as generate_module  # noqa: E402
from mens.model.generate import Constraint, stream_tokens  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_chat_lm("llama")


def _ids(tok) -> list[int]:
    return tok("hello", add_special_tokens=False)["input_ids"]


def _free(model, tok, **kw) -> tuple[str, list[int]]:
    kept: list[int] = []
    text = "".join(stream_tokens(model, tok, _ids(tok), on_token=kept.append, **kw))
    return text, kept


def _anything(**kw) -> Constraint:
    return Constraint(viable=lambda t: True, complete=lambda t: True, **kw)


def _stop_token(model, tok) -> int:
    """A token the greedy answer reaches after a few steps: used as the stop token, so answers end early."""
    _, kept = _free(model, tok, max_new_tokens=16, stop_ids=set())
    return kept[6]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "top_p": 0.9, "seed": 7}])
def test_a_constraint_that_never_objects_changes_nothing(tiny, sampling):
    model, tok = tiny
    stop = _stop_token(model, tok)
    free, free_ids = _free(model, tok, max_new_tokens=24, stop_ids={stop}, **sampling)
    kept: list[int] = []
    constrained = "".join(stream_tokens(model, tok, _ids(tok), max_new_tokens=24, stop_ids={stop},
                                        constraint=_anything(), on_token=kept.append, **sampling))
    assert constrained == free and kept == free_ids


def test_the_constraint_repairs_only_where_the_model_choice_is_not_viable(tiny):
    model, tok = tiny
    free, ids = _free(model, tok, max_new_tokens=12, stop_ids=set())
    banned = tok.decode(ids[:4])  # the model's 4th choice makes the text unviable
    kept: list[int] = []
    out = "".join(stream_tokens(model, tok, _ids(tok), max_new_tokens=12, stop_ids=set(), on_token=kept.append,
                                constraint=Constraint(viable=lambda t: not t.startswith(banned),
                                                      complete=lambda t: True)))
    assert kept[:3] == ids[:3] and kept[3] != ids[3]  # kept as chosen up to the repair
    assert out == tok.decode(kept) and not out.startswith(banned)


def test_pieces_stream_as_tokens_are_decoded_a_lookahead_behind(tiny):
    model, tok = tiny
    steps = 0

    def count_step() -> bool:  # called once before every model step
        nonlocal steps
        steps += 1
        return False

    reported, arrivals = [], []
    for _piece in stream_tokens(model, tok, _ids(tok), max_new_tokens=20, stop_ids=set(), should_stop=count_step,
                                on_token=lambda _t: reported.append(steps), constraint=_anything(lookahead=2)):
        arrivals.append(steps)
    assert steps == 20 and len(reported) == 20
    # token i is final (and sent) at step i + 3: two more are held back in case a dead end takes them back
    assert reported[:18] == list(range(3, 21)) and reported[18:] == [20, 20]
    assert len(arrivals) >= 10 and sum(s < 20 for s in arrivals) >= len(arrivals) - 3


def test_text_is_streamed_only_up_to_points_the_constraint_can_close(tiny):
    """With `closing`, streamed text always has a known closing, so a later dead end never needs to take it back."""
    model, tok = tiny
    free, _ = _free(model, tok, max_new_tokens=12, stop_ids=set())
    closable_upto = len(tok.decode(_free(model, tok, max_new_tokens=5, stop_ids=set())[1]))
    seen = []

    def closing(text: str) -> str | None:
        seen.append(text)
        return "." if len(text) <= closable_upto else None

    pieces = list(stream_tokens(model, tok, _ids(tok), max_new_tokens=12, stop_ids=set(),
                                constraint=Constraint(viable=lambda t: True, complete=lambda t: t.endswith("."),
                                                      closing=closing, lookahead=1)))
    streamed_before_end = "".join(pieces[:-1])
    assert len(streamed_before_end) <= closable_upto and seen
    # the token budget ran out on text that cannot be closed: the streamed text is closed, the rest dropped
    assert "".join(pieces) == free[:closable_upto] + "."


def test_a_model_that_stops_on_unfinished_text_is_closed_where_it_stopped(tiny):
    model, tok = tiny
    stop = _stop_token(model, tok)
    free, _ = _free(model, tok, max_new_tokens=24, stop_ids={stop})
    closes = Constraint(viable=lambda t: True, complete=lambda t: t.endswith("!!"), closing=lambda t: "!!")
    assert "".join(stream_tokens(model, tok, _ids(tok), max_new_tokens=24, stop_ids={stop},
                                 constraint=closes)) == free + "!!"
    # where nothing closes the text the stop is refused and the model goes on
    never = Constraint(viable=lambda t: True, complete=lambda t: False)
    longer = "".join(stream_tokens(model, tok, _ids(tok), max_new_tokens=24, stop_ids={stop}, constraint=never))
    assert longer.startswith(free) and len(longer) > len(free)


def test_a_dead_end_takes_back_held_tokens_and_the_cache_follows(tiny, monkeypatch):
    model, tok = tiny
    _, ids = _free(model, tok, max_new_tokens=12, stop_ids=set())
    trap = tok.decode(ids[:3])  # viable itself, but nothing may follow it: a dead end after the 3rd token

    def viable(t: str) -> bool:
        return t == trap or not t.startswith(trap)

    def run() -> tuple[str, list[str]]:
        pieces = list(stream_tokens(model, tok, _ids(tok), max_new_tokens=12, stop_ids=set(),
                                    constraint=Constraint(viable=viable, complete=lambda t: True)))
        return "".join(pieces), pieces

    out, pieces = run()
    assert out.startswith(tok.decode(ids[:2])) and not out.startswith(trap)
    monkeypatch.setattr(generate_module, "_crop", lambda past, length: None)  # rebuild the cache instead
    assert run() == (out, pieces)


def test_constrained_sampling_is_reproducible_by_seed(tiny):
    model, tok = tiny
    c = Constraint(viable=lambda t: "0" not in t, complete=lambda t: True)
    kw = dict(max_new_tokens=16, temperature=1.0, seed=3, stop_ids=set())
    a = "".join(stream_tokens(model, tok, _ids(tok), constraint=c, **kw))
    assert a == "".join(stream_tokens(model, tok, _ids(tok), constraint=c, **kw)) and "0" not in a


def test_a_cropped_cache_gives_the_logits_of_a_fresh_forward(tiny):
    model, tok = tiny
    ids = _ids(tok) + [5, 6, 7, 8]
    _, past = generate_module._last_logits(model, False, input_ids=torch.tensor([ids]), past_key_values=None)
    past = generate_module._crop(past, len(ids) - 2)
    assert past is not None and past.get_seq_length() == len(ids) - 2
    cropped, _ = generate_module._last_logits(model, False, input_ids=torch.tensor([[9]]), past_key_values=past)
    fresh, _ = generate_module._last_logits(model, False, input_ids=torch.tensor([ids[:-2] + [9]]),
                                            past_key_values=None)
    assert torch.allclose(cropped, fresh, atol=1e-5)


def test_a_wider_stream_closing_streams_sooner_and_never_lets_the_model_stop(tiny):
    """stream_closing only moves where text may be streamed: a model that stops on text only it closes goes on."""
    model, tok = tiny
    stop = _stop_token(model, tok)
    free, _ = _free(model, tok, max_new_tokens=24, stop_ids={stop})

    def run(stream_closing) -> list[str]:
        c = Constraint(viable=lambda t: True, complete=lambda t: t.endswith("!!"), closing=lambda t: None,
                       stream_closing=stream_closing, lookahead=1)
        return list(stream_tokens(model, tok, _ids(tok), max_new_tokens=24, stop_ids={stop}, constraint=c))

    held = run(None)  # nothing closes anything: the stop is refused and nothing streams before the end
    assert len(held) == 1 and held[0].startswith(free) and len(held[0]) > len(free)
    wide = run(lambda t: "!!")
    assert len(wide) > 1  # streamed a token behind the model
    assert "".join(wide[:-1]) and "".join(wide).startswith(free) and len("".join(wide)) > len(free)  # still refused


def _model_steps(monkeypatch) -> list[int]:
    """A list that gets, per model step of the constrained decoder, how many tokens it fed."""
    steps: list[int] = []
    real = generate_module._last_logits

    def counted(model, keep_last, **inputs):
        steps.append(int(inputs["input_ids"].shape[1]))
        return real(model, keep_last, **inputs)

    monkeypatch.setattr(generate_module, "_last_logits", counted)
    return steps


def _dead_end_after(tok, ids, n: int):
    trap = tok.decode(ids[:n])
    return lambda t: t == trap or not t.startswith(trap)


@pytest.mark.parametrize("case", ["never objects", "repair", "dead end", "dead end, no crop", "closing", "stops"])
def test_a_greedy_draft_gives_the_same_answer_with_model_steps_only_from_its_repair(tiny, monkeypatch, case):
    """The draft (the model's unconstrained greedy answer) stands in for the model's choices while the answer
    follows it: every piece, every reported token and the answer are those of decoding from scratch."""
    model, tok = tiny
    stop = _stop_token(model, tok)
    stop_ids = {stop} if case == "stops" else set()
    _, ids = _free(model, tok, max_new_tokens=12, stop_ids=stop_ids)
    constraint = {
        "never objects": _anything(),
        "repair": Constraint(viable=lambda t: not t.startswith(tok.decode(ids[:4])), complete=lambda t: True),
        "dead end": Constraint(viable=_dead_end_after(tok, ids, 3), complete=lambda t: True),
        "dead end, no crop": Constraint(viable=_dead_end_after(tok, ids, 3), complete=lambda t: True),
        "closing": Constraint(viable=lambda t: True, complete=lambda t: t.endswith("."), lookahead=1,
                              closing=lambda t: "." if len(t) <= len(tok.decode(ids[:5])) else None),
        "stops": Constraint(viable=lambda t: True, complete=lambda t: t.endswith("!!"), closing=lambda t: "!!"),
    }[case]
    if case == "dead end, no crop":
        monkeypatch.setattr(generate_module, "_crop", lambda past, length: None)  # the cache is rebuilt instead
    steps = _model_steps(monkeypatch)

    def run(draft):
        kept: list[int] = []
        pieces = list(stream_tokens(model, tok, _ids(tok), max_new_tokens=12, stop_ids=stop_ids,
                                    constraint=constraint, on_token=kept.append, draft=draft))
        return pieces, kept

    expected = run(None)
    scratch = list(steps)
    steps.clear()
    assert run(ids) == expected
    assert len(steps) < len(scratch)
    if case in ("never objects", "closing"):  # every choice was the draft's: the model never ran (12: the budget)
        assert steps == [] and len(ids) == 12
    if case == "stops":  # the draft's tokens at once, with the prompt, where the model's stop is asked for
        assert steps == [len(_ids(tok)) + len(ids)]
    if case == "repair":  # the draft's first 3 tokens at once, with the prompt, at the repair; then one at a time
        assert steps == [len(_ids(tok)) + 3] + [1] * 8


def test_a_draft_is_not_used_when_sampling(tiny):
    model, tok = tiny
    c = Constraint(viable=lambda t: "0" not in t, complete=lambda t: True)
    kw = dict(max_new_tokens=16, temperature=1.0, seed=3, stop_ids=set(), constraint=c)
    assert ("".join(stream_tokens(model, tok, _ids(tok), draft=[5] * 16, **kw))
            == "".join(stream_tokens(model, tok, _ids(tok), **kw)))
