"""The trained system prompt is the chat template's default: no system message renders as training did."""

from __future__ import annotations

import pytest
from tests.conftest import build_tiny_tokenizer

from mens.model.chat_template import strip_default_system, with_default_system

# A base template that, like SmolLM2's, injects its own system prompt when the chat has none.
BASE_DEFAULT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PROMPTS = [
    "You write Vox.",
    'Quotes " and \' and back\\slash, braces {{ x }} {% if %} {% endraw %} and\nnewlines\n\ttabs',
    "Unicode: é, ß, 中文, and an emoji 🦊 outside the basic plane.",
]


@pytest.mark.parametrize("base", ["chatml", "base-default"])
@pytest.mark.parametrize("system", PROMPTS)
def test_no_system_message_renders_the_trained_prompt(tmp_path, base, system):
    from transformers import AutoTokenizer

    tok = build_tiny_tokenizer()
    if base == "base-default":
        tok.chat_template = BASE_DEFAULT
    user = [{"role": "user", "content": "Write a Vox fn that adds one."}]
    trained = tok.apply_chat_template([{"role": "system", "content": system}, *user], tokenize=False,
                                      add_generation_prompt=True)
    tok.chat_template = with_default_system(tok.chat_template, system)
    tok.save_pretrained(tmp_path)  # what a transformers user loads from the run or merged directory
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.apply_chat_template(user, tokenize=False, add_generation_prompt=True) == trained
    ids = reloaded.apply_chat_template(user, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids == tok(trained, add_special_tokens=False)["input_ids"]
    own = [{"role": "system", "content": "Be brief."}, *user]  # a caller's own system message still wins
    rendered = reloaded.apply_chat_template(own, tokenize=False, add_generation_prompt=True)
    assert "Be brief." in rendered and system not in rendered


def test_applying_twice_or_with_nothing_changes_nothing():
    once = with_default_system(BASE_DEFAULT, "You write Vox.")
    assert with_default_system(once, "You write Vox.") == once
    assert strip_default_system(once) == BASE_DEFAULT
    assert with_default_system(once, "Another prompt.").count("mens: default system prompt") == 1
    assert with_default_system(BASE_DEFAULT, None) == BASE_DEFAULT and with_default_system(None, "x") is None
