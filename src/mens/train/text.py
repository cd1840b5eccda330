"""Training text policy: chat template (ChatML fallback), system prompt, left truncation, loss masking.

An `Example` is token ids plus labels of the same length: `labels[t] = ids[t]` where the model is trained to
predict token t (the last assistant turn, optionally only its last K tokens), else -100. Run: used by data.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

IGNORE = -100


@dataclass
class Example:
    ids: list[int]
    labels: list[int]

    @property
    def n_supervised(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE)


def default_system_prompt() -> str:
    """The packaged short, current Vox system prompt (the same text is used in eval and serve)."""
    return resources.files("mens.train").joinpath("vox_system_prompt.txt").read_text(encoding="utf-8").strip()


def chat_for_row(pair, system_prompt: str | None) -> list[dict[str, str]]:
    """The original's policy: prompt/response rows get the system prompt; `messages` rows keep their own (if any)."""
    messages = pair.chat()
    if pair.messages or not system_prompt:
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def encode_chat(tokenizer, messages: list[dict[str, str]], *, seq_len: int, ce_last_k: int = 0) -> Example | str:
    """Tokenize a chat whose last turn is the assistant's; return an Example, or the reason it was skipped.

    Supervised: the tokens after the last `assistant` header (its content and end marker). Longer than
    seq_len: keep the last seq_len tokens. ce_last_k > 0: only the last K tokens of the example count.
    """
    if not messages or messages[-1]["role"] != "assistant":
        return "last turn is not the assistant's"
    full = tokenizer.apply_chat_template(messages, tokenize=False).rstrip()
    prefix = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    start = _common_prefix(ids, prefix_ids)  # robust to a merge across the prefix boundary
    labels = [IGNORE] * start + ids[start:]
    if len(ids) > seq_len:  # left truncation: the answer's end matters most
        ids, labels = ids[-seq_len:], labels[-seq_len:]
    if len(ids) < 2:
        return "shorter than 2 tokens"
    labels[0] = IGNORE  # the first token has no predecessor in its own example
    if ce_last_k:
        cut = len(ids) - ce_last_k
        labels = [IGNORE if t < cut else x for t, x in enumerate(labels)]
    if all(x == IGNORE for x in labels):
        return "no supervised tokens (the prompt fills seq_len)"
    return Example(ids, labels)
