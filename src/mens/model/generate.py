"""Token-by-token generation with a KV cache: greedy or seeded sampling, stop tokens, and an optional
constraint that keeps the decoded text a viable prefix of a language (so every finished answer parses).

Written out instead of `model.generate` because constrained decoding needs the decoded text of each
candidate token, and streaming needs one token per step. Used by eval-local and serve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass
class Constraint:
    """`viable(text)`: text can still be completed into valid code; `complete(text)`: text is finished code."""

    viable: Callable[[str], bool]
    complete: Callable[[str], bool]
    max_candidates: int = 48
    """How many of the most likely tokens are tried before giving up and ending the answer."""
    finish: Callable[[str], str] | None = None
    """The final text for an answer cut off by the token budget or a dead end (closed or cut back to parse)."""


def stop_token_ids(tokenizer, model=None) -> set[int]:
    """EOS ids of the tokenizer, the model's generation config and the chat end markers it knows."""
    ids: set[int] = set()
    for source in (tokenizer, getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(i) for i in eos)
    vocab = tokenizer.get_vocab()
    for marker in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>"):
        if marker in vocab:
            ids.add(vocab[marker])
    return ids


def chat_input_ids(tokenizer, messages: list[dict[str, str]], system_prompt: str | None) -> list[int]:
    """Prompt ids for a chat, with the training system prompt added when the chat has none."""
    if system_prompt and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class _Detokenizer:
    """Incremental decoding that never emits half a UTF-8 character."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def text_with(self, token_id: int | None = None) -> str:
        ids = self.ids if token_id is None else [*self.ids, token_id]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.text_with()
        if text.endswith("\ufffd"):
            return ""
        piece, self.emitted = text[len(self.emitted):], text
        return piece

    def flush(self) -> str:
        """What is still held back (an incomplete character at the very end)."""
        text = self.text_with()
        piece, self.emitted = text[len(self.emitted):], text
        return piece


@torch.no_grad()
def stream_tokens(model, tokenizer, input_ids: list[int], *, max_new_tokens: int = 256, temperature: float = 0.0,
                  top_p: float = 1.0, seed: int | None = None, stop_ids: set[int] | None = None,
                  constraint: Constraint | None = None, on_token: Callable[[int], None] | None = None
                  ) -> Iterator[str]:
    """Yield text pieces of the continuation of `input_ids`, one model step at a time.

    With a constraint the answer is searched for (with bounded backtracking) and yielded once it is done,
    since a dead end may take back tokens. `on_token` is called with each kept token id (stop tokens
    excluded), e.g. to count usage.
    """
    stop_ids = stop_token_ids(tokenizer, model) if stop_ids is None else stop_ids
    gen = torch.Generator(device="cpu").manual_seed(seed if seed is not None else 0)
    if constraint is not None:
        yield from _constrained(model, tokenizer, input_ids, max_new_tokens, temperature, top_p, gen, stop_ids,
                                constraint, on_token)
        return
    device = next(model.parameters()).device
    detok = _Detokenizer(tokenizer)
    ids = torch.tensor([input_ids], device=device)
    past = None
    for _ in range(max_new_tokens):
        out = model(input_ids=ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        token = int(_candidates(out.logits[0, -1].float().cpu(), temperature, top_p, gen, 1)[0])
        if token in stop_ids:
            break
        if on_token is not None:
            on_token(token)
        piece = detok.push(token)
        if piece:
            yield piece
        ids = torch.tensor([[token]], device=device)
    tail = detok.flush()
    if tail:
        yield tail


MAX_BACKTRACKS = 32


def _constrained(model, tokenizer, input_ids, max_new_tokens, temperature, top_p, gen, stop_ids,
                 constraint: Constraint, on_token) -> Iterator[str]:
    """Depth-first decoding over viable prefixes.

    Each step keeps the first candidate (model order) whose text stays viable; a stop token is kept only
    when the text is finished code. At a dead end the most recent choice is swapped for its next viable
    alternative (at most MAX_BACKTRACKS times; the cache is rebuilt from the kept prefix). If the budget runs
    out first, `constraint.finish` closes the text.
    """
    device = next(model.parameters()).device
    detok = _Detokenizer(tokenizer)
    alternatives: list[list[int]] = []  # per kept token: the candidates not yet tried at that position
    pending, past, backtracks, done = list(input_ids), None, 0, False
    while len(detok.ids) < max_new_tokens and not done:
        out = model(input_ids=torch.tensor([pending], device=device), past_key_values=past, use_cache=True)
        past = out.past_key_values
        order = _candidates(out.logits[0, -1].float().cpu(), temperature, top_p, gen, constraint.max_candidates)
        token, rest = _first_viable(order[: constraint.max_candidates].tolist(), detok, stop_ids, constraint)
        while token is None and alternatives and backtracks < MAX_BACKTRACKS:
            backtracks += 1
            detok.ids.pop()  # take back the latest choice and try what else was viable there
            token, rest = _first_viable(alternatives.pop(), detok, stop_ids, constraint)
            past = None  # the cache holds the abandoned path: rebuild it from the kept prefix
        if token is None:
            break
        if token in stop_ids:
            done = True
            break
        detok.ids.append(token)
        alternatives.append(rest)
        pending = [token] if past is not None else [*input_ids, *detok.ids]
    text = detok.text_with()
    if not done and constraint.finish is not None and not constraint.complete(text):
        text = constraint.finish(text)
    if on_token is not None:
        for token in detok.ids:
            on_token(token)
    if text:
        yield text


def _first_viable(order: list[int], detok: _Detokenizer, stop_ids: set[int], constraint: Constraint
                  ) -> tuple[int | None, list[int]]:
    """The first acceptable candidate of `order` and the candidates after it."""
    text = detok.text_with()
    for i, token in enumerate(order):
        if token in stop_ids:
            if constraint.complete(text):
                return token, order[i + 1 :]
        elif constraint.viable(detok.text_with(token)):
            return token, order[i + 1 :]
    return None, []


def _candidates(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator, need: int
                ) -> torch.Tensor:
    """Token ids in the order they would be chosen: by logit (greedy) or by a seeded draw (sampling)."""
    if temperature <= 0:
        return torch.argsort(logits, descending=True)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
    n = int((probs > 0).sum())
    # Sampling without replacement gives the first draw plus fallbacks for the constraint, in one call.
    return torch.multinomial(probs, num_samples=max(1, min(n, need)), replacement=False, generator=gen)
