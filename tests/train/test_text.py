"""Text policy: system prompt rule, assistant-only labels, ce_last_k, left truncation."""

from __future__ import annotations

import pytest
from train_tiny import build_tokenizer

from mens.corpus.records import TrainPair
from mens.train.text import IGNORE, chat_for_row, default_system_prompt, encode_chat


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _chat(prompt="Write a function add1 that adds 1.", response="fn add1(a: int) -> int {\n    return a + 1\n}"):
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


def test_system_prompt_policy_prompt_rows_get_it_messages_rows_do_not():
    pair = TrainPair(prompt="p", response="r")
    assert chat_for_row(pair, "SYS")[0] == {"role": "system", "content": "SYS"}
    msgs = TrainPair(messages=[{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}])
    assert [m["role"] for m in chat_for_row(msgs, "SYS")] == ["user", "assistant"]
    own = TrainPair(messages=[{"role": "system", "content": "mine"}, {"role": "user", "content": "u"},
                              {"role": "assistant", "content": "a"}])
    assert chat_for_row(own, "SYS")[0]["content"] == "mine"
    sp = default_system_prompt()
    assert "Vox" in sp and len(sp) < 1200 and "ret " not in sp and "@action" not in sp


def test_labels_cover_exactly_the_assistant_answer(tok):
    ex = encode_chat(tok, _chat(), seq_len=512)
    supervised = [t for t, lab in zip(ex.ids, ex.labels, strict=True) if lab != IGNORE]
    assert tok.decode(supervised) == "fn add1(a: int) -> int {\n    return a + 1\n}<|im_end|>"
    first = next(i for i, lab in enumerate(ex.labels) if lab != IGNORE)
    assert tok.decode(ex.ids[:first]).endswith("<|im_start|>assistant\n")


def test_prompt_tokens_never_count(tok):
    """Two prompts, same answer: identical supervised tokens; prompt positions are all IGNORE."""
    a = encode_chat(tok, _chat(prompt="short"), seq_len=512)
    b = encode_chat(tok, _chat(prompt="a much longer request that says more"), seq_len=512)
    sup = [[t for t, lab in zip(e.ids, e.labels, strict=True) if lab != IGNORE] for e in (a, b)]
    assert sup[0] == sup[1]
    assert a.n_supervised == b.n_supervised


def test_ce_last_k_keeps_only_the_last_k_tokens(tok):
    full = encode_chat(tok, _chat(), seq_len=512)
    k = 5
    last = encode_chat(tok, _chat(), seq_len=512, ce_last_k=k)
    assert last.n_supervised == k
    assert last.labels[-k:] == full.labels[-k:]
    assert all(x == IGNORE for x in last.labels[:-k])
    big = encode_chat(tok, _chat(), seq_len=512, ce_last_k=10_000)
    assert big.labels == full.labels  # K larger than the answer: the prompt still never counts


def test_left_truncation_keeps_the_end(tok):
    full = encode_chat(tok, _chat(), seq_len=512)
    cut = encode_chat(tok, _chat(), seq_len=12)
    assert cut.ids == full.ids[-12:]
    assert cut.labels[1:] == full.labels[-11:] and cut.labels[0] == IGNORE
    assert encode_chat(tok, _chat(response="x"), seq_len=1) == "shorter than 2 tokens"


def test_loss_ignores_whatever_is_predicted_at_prompt_positions(tok):
    """Scrambling the logits at every non-supervised position leaves the loss unchanged; ce_last_k restricts it."""
    import torch

    from mens.train.packing import collate, token_loss_sum

    ex = encode_chat(tok, _chat(), seq_len=512)
    b = collate([[ex]], 0)
    torch.manual_seed(0)
    logits = torch.randn(1, len(ex.ids), len(tok))
    scrambled = logits.clone()
    prompt_pos = torch.tensor([t for t in range(len(ex.ids) - 1) if ex.labels[t + 1] == IGNORE])
    scrambled[0, prompt_pos] = torch.randn(len(prompt_pos), len(tok)) * 100
    assert torch.equal(token_loss_sum(logits, b["labels"]), token_loss_sum(scrambled, b["labels"]))
    k = 4
    last = collate([[encode_chat(tok, _chat(), seq_len=512, ce_last_k=k)]], 0)
    manual = torch.nn.functional.cross_entropy(logits[0, -k - 1:-1], torch.tensor(ex.ids[-k:]), reduction="sum")
    assert torch.allclose(token_loss_sum(logits, last["labels"]), manual)


def _pairs(groups: dict[str, int]) -> list[TrainPair]:
    """`n` phrasings of a request for each answer, interleaved as a template generator writes them."""
    rows = []
    for answer, n in groups.items():
        rows += [TrainPair(prompt=f"ask {answer} way {i}", response=answer) for i in range(n)]
    return rows


def test_keep_per_answer_keeps_at_most_n_of_each_answer_and_every_answer():
    from mens.train.data import keep_per_answer

    pairs = _pairs({"fn a() {}": 3, "fn b() {}": 1, "fn c() {}": 6, "fn d() {}": 2})
    for limit in (1, 2, 5):
        kept = keep_per_answer(pairs, limit)
        counts = {}
        for p in kept:
            counts[p.response] = counts.get(p.response, 0) + 1
        assert counts == {"fn a() {}": min(3, limit), "fn b() {}": 1, "fn c() {}": min(6, limit),
                          "fn d() {}": min(2, limit)}
        assert [pairs.index(p) for p in kept] == sorted(pairs.index(p) for p in kept)  # file order kept
    # the choice depends on the answer text only: the same rows whatever else is in the file
    alone = keep_per_answer(_pairs({"fn c() {}": 6}), 1)
    assert alone[0].prompt == next(p.prompt for p in keep_per_answer(pairs, 1) if p.response == "fn c() {}")
    # and not always the first phrasing
    firsts = [p.prompt.endswith("way 0") for p in keep_per_answer(_pairs({f"fn f{i}() {{}}": 3 for i in range(12)}), 1)]
    assert 0 < sum(firsts) < 12


def test_read_examples_max_per_answer_reports_what_it_dropped(tmp_path, tok):
    from mens.train.data import read_examples

    path = tmp_path / "train.jsonl"
    path.write_text("".join(p.model_dump_json() + "\n" for p in _pairs({"fn a() {}": 3, "fn b() {}": 2})))
    every, skipped, n = read_examples(path, tok, seq_len=128, ce_last_k=0, system_prompt=None, min_rating=1)
    assert (len(every), skipped, n) == (5, {}, 5)
    one, skipped, n = read_examples(path, tok, seq_len=128, ce_last_k=0, system_prompt=None, min_rating=1,
                                    max_per_answer=1)
    assert (len(one), n) == (2, 5)
    assert skipped == {"same answer as kept rows (max_per_answer)": 3}
