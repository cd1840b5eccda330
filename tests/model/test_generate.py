"""The hand-written decoding loop: parity with transformers' greedy generate, seeds, constraints."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import build_tiny_chat_lm  # noqa: E402

from mens.model.generate import Constraint, chat_input_ids, stream_tokens  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_chat_lm("llama")


def test_greedy_stream_equals_transformers_generate(tiny):
    model, tok = tiny
    ids = chat_input_ids(tok, [{"role": "user", "content": "add one"}], "You write code.")
    assert tok.decode(ids).startswith("<|im_start|>system\nYou write code.<|im_end|>")
    ours = "".join(stream_tokens(model, tok, ids, max_new_tokens=24, stop_ids=set()))
    ref = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                         pad_token_id=tok.pad_token_id)
    assert ours == tok.decode(ref[0, len(ids):], skip_special_tokens=True)


def test_sampling_is_reproducible_by_seed(tiny):
    model, tok = tiny
    ids = tok("hello", add_special_tokens=False)["input_ids"]
    kw = dict(max_new_tokens=16, temperature=1.0, top_p=0.9, stop_ids=set())
    a = "".join(stream_tokens(model, tok, ids, seed=1, **kw))
    b = "".join(stream_tokens(model, tok, ids, seed=1, **kw))
    assert a == b


def test_constraint_keeps_only_viable_text_and_ends_when_complete(tiny):
    model, tok = tiny
    ids = tok("hello", add_special_tokens=False)["input_ids"]
    digits = Constraint(viable=lambda t: all(c in "0123456789" for c in t), complete=lambda t: len(t) >= 3,
                        max_candidates=400)
    out = "".join(stream_tokens(model, tok, ids, max_new_tokens=12, constraint=digits))
    assert out and all(c in "0123456789" for c in out)


def test_vox_constrained_answers_parse_even_when_cut_by_the_budget(tmp_path):
    """A lab model briefly trained on Vox, sampled hot: every constrained answer parses, finished or cut."""
    from mens.lang import get_language
    from mens.model.constraint import language_constraint
    from mens.train.pretrain import PretrainConfig, pretrain

    src = tmp_path / "src"
    src.mkdir()
    program = "fn add(a: int, b: int) to int {\n    return a + b\n}\n\ntype Point {\n    x: float\n}\n"
    for i in range(8):
        (src / f"p{i}.vox").write_text(program.replace("add", f"add{i}"))
    cfg = PretrainConfig(steps=40, seq_len=64, batch_size=8, d_model=32, n_layers=2, n_heads=2, sample_tokens=8)
    pretrain([src], tmp_path / "lab", cfg)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lab").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "lab")
    vox = get_language("vox")
    constraint = language_constraint(vox)
    constraint.max_candidates = len(tok)  # a 133-token vocabulary: search all of it
    for seed in range(6):
        for budget in (120,):  # a tiny budget can end inside `@endpoint(kind: q`; closing that would invent code
            out = "".join(stream_tokens(model, tok, [tok.eos_token_id], max_new_tokens=budget, temperature=1.2,
                                        seed=seed, stop_ids={tok.eos_token_id}, constraint=constraint))
            assert vox.parse(out).has_code, (seed, budget, out)


def test_should_stop_ends_a_constrained_search_and_a_plain_answer_at_the_next_step(tiny):
    model, tok = tiny
    ids = tok("hello", add_special_tokens=False)["input_ids"]
    digits = Constraint(viable=lambda t: all(c in "0123456789" for c in t), complete=lambda t: len(t) >= 50,
                        max_candidates=400)
    calls = []

    def stop_after_3() -> bool:
        calls.append(1)
        return len(calls) > 3

    assert list(stream_tokens(model, tok, ids, max_new_tokens=40, constraint=digits, should_stop=stop_after_3)) == []
    assert len(calls) == 4  # three model steps, then it stopped
    calls.clear()
    out = list(stream_tokens(model, tok, ids, max_new_tokens=40, stop_ids=set(), should_stop=stop_after_3))
    assert len(calls) == 4 and len(out) <= 3
