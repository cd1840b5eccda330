"""The Vox lab tokenizer: 133 tokens, greedy longest match, lossless on ASCII, loadable with AutoTokenizer."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mens.model.lab_tokenizer import COMPOUND_TOKENS, VOCAB, build_lab_tokenizer  # noqa: E402

TOK = build_lab_tokenizer()
SRC = ('component Counter() {\n    state count: int = 0\n'
       '\tview: button(on_click=fn() { count = count + 1 }) { "+" }\n}\n')


def test_vocabulary_layout():
    assert len(VOCAB) == 133 and len(COMPOUND_TOKENS) == 35 and len(TOK) == 133
    assert TOK.convert_tokens_to_ids(["<pad>", "<unk>", "<eos>", " ", "~"]) == [0, 1, 2, 3, 97]


def test_greedy_longest_match():
    assert TOK.tokenize("fn main() to int {\n    return 1\n}") == [
        "fn ", "m", "a", "i", "n", "(", ")", " to ", "i", "n", "t", " ", "{", "\n", "    ", "return ", "1", "\n", "}"]
    assert TOK.tokenize("a => b == c") == ["a", " ", "=>", " ", "b", " ", "==", " ", "c"]


def test_lossless_on_vox_source_and_unk_for_non_ascii():
    ids = TOK(SRC, add_special_tokens=False)["input_ids"]
    assert TOK.decode(ids) == SRC
    assert len(ids) < len(SRC)  # compounds compress
    assert TOK.tokenize("é") == ["<unk>"] and TOK.tokenize("aéb") == ["a", "<unk>", "b"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from([chr(c) for c in range(32, 127)] + ["\n", "\t"]), max_size=300))
def test_roundtrip_any_ascii(text):
    assert TOK.decode(TOK(text, add_special_tokens=False)["input_ids"]) == text


def test_saved_tokenizer_loads_with_auto_classes(tmp_path):
    from transformers import AutoTokenizer

    TOK.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(SRC, add_special_tokens=False)["input_ids"] == TOK(SRC, add_special_tokens=False)["input_ids"]
    chat = again.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert again.tokenize("<|im_start|>") == ["<|im_start|>"]
