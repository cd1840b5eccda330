"""A tokenizer loads as its tokenizer.json encodes, even where transformers would rebuild it as another class."""

from __future__ import annotations

import warnings

import pytest

from mens.model.load import TOKENIZER_PROBE, load_tokenizer


def _word_level_qwen2_dir(path):
    """What broke a benchmark: a word-level tokenizer saved beside a qwen2 config (transformers 5 then loads it as
    Qwen2Tokenizer, a byte-level BPE rebuilt from the vocabulary, and the words vanish)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    words = ["<unk>", "<|im_end|>", "fn", "add", "(", "a", ":", "int", ",", "b", ")", "to", "{", "return", "+", "}"]
    raw = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="<|im_end|>").save_pretrained(path)
    Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1).save_pretrained(path)
    return raw


def test_a_tokenizer_rebuilt_as_another_class_is_loaded_from_its_file(tmp_path):
    raw = _word_level_qwen2_dir(tmp_path)
    text = "fn add(a: int, b: int) to int { return a + b }"
    with pytest.warns(UserWarning, match="encodes text differently from its tokenizer.json"):
        tok = load_tokenizer(tmp_path)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == raw.encode(text).ids and {"fn", "add", "int", "return"} <= set(tok.decode(ids).split())
    assert tok.chat_template and tok.pad_token is not None  # the rest of load_tokenizer still applies


def test_a_tokenizer_that_loads_faithfully_is_left_as_transformers_loads_it(tmp_path):
    from tests.conftest import build_tiny_chat_lm

    _, tok = build_tiny_chat_lm("llama")
    tok.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, no warning
        again = load_tokenizer(tmp_path)
    assert type(again).__name__ == type(tok).__name__
    assert again(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"] == \
        tok(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
