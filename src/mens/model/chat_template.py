"""The trained system prompt as the chat template's default, so a model behaves the same outside mens.

mens trains and evaluates with its system prompt as the first message. A run's and a merged model's chat template
get a short header that inserts that prompt when the caller sends no system message of their own (a caller's own
system message still wins), so `apply_chat_template` in transformers, vLLM or TGI without a system message gives
token for token the prompt training used, instead of the base model's own default ("You are a helpful AI
assistant named ..."). Applying it twice changes nothing. Run: used by `mens train` and `mens merge`.
"""

from __future__ import annotations

import json

_START = "{#- mens: default system prompt -#}"
_END = "{#- mens: end default system prompt -#}"


def with_default_system(template: str | None, system_prompt: str | None) -> str | None:
    """`template` with `system_prompt` as the default first message; unchanged when either is empty."""
    if not template or not system_prompt:
        return template
    body = strip_default_system(template)
    # A Jinja string literal: Jinja decodes backslash escapes like Python's unicode-escape, which reads JSON's
    # escapes (\n, \", \\, \uXXXX) the same; non-ASCII text stays as it is (ensure_ascii=False) because
    # astral characters as JSON surrogate pairs would decode to two lone surrogates.
    literal = json.dumps(system_prompt, ensure_ascii=False)
    header = (f"{_START}{{%- set _mens_default_system = {literal} -%}}"
              "{%- if not (messages and messages[0]['role'] == 'system') -%}"
              "{%- set messages = [{'role': 'system', 'content': _mens_default_system}] + messages -%}"
              f"{{%- endif -%}}{_END}")
    return header + body


def strip_default_system(template: str) -> str:
    """The template without a header added by `with_default_system`."""
    if template.startswith(_START) and _END in template:
        return template[template.index(_END) + len(_END):]
    return template


def save_tokenizer(tokenizer, out_dir, system_prompt: str | None) -> None:
    """Save `tokenizer` to `out_dir` with `system_prompt` as its template's default (the object is unchanged)."""
    original = getattr(tokenizer, "chat_template", None)
    tokenizer.chat_template = with_default_system(original, system_prompt)
    try:
        tokenizer.save_pretrained(out_dir)
    finally:
        tokenizer.chat_template = original
