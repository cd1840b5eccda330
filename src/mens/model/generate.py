"""Token-by-token generation with a KV cache: greedy or seeded sampling, stop tokens, and an optional
constraint that keeps the decoded text a viable prefix of a language (so every finished answer parses).
Many prompts decoded at once, and answers checked by teacher forcing, are in `mens.model.batch_decode`.

Written out instead of `model.generate` because constrained decoding needs the decoded text of each
candidate token, and streaming needs one token per step. Used by eval-local and serve.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass
class Constraint:
    """`viable(text)`: text can still be completed into valid code; `complete(text)`: text is finished code.

    `viable` is called with the successive prefixes of one answer, so a stateful checker that remembers the
    previous prefixes (e.g. `mens.lang.vox.prefix.PrefixChecker`) can judge each new one incrementally.
    """

    viable: Callable[[str], bool]
    complete: Callable[[str], bool]
    max_candidates: int = 48
    """How many of the most likely tokens are tried before giving up and ending the answer."""
    finish: Callable[[str], str] | None = None
    """The final text for an answer that stopped unfinished, was cut off by the token budget or reached a dead
    end (closed or cut back to parse)."""
    lookahead: int = 4
    """Kept tokens held back from the stream: a dead end may take back (backtrack over) only these."""
    closing: Callable[[str], str | None] | None = None
    """A suffix that makes the text complete, found cheaply, or None. With it, text is streamed only up to
    points it closes, so that whatever comes next the answer can end complete without taking back what was
    sent (`finish` may have to cut back unfinished text)."""
    stream_closing: Callable[[str], str | None] | None = None
    """A wider `closing` (placeholders allowed) that only decides how far text is streamed, and closes the streamed
    text of an answer nothing else finishes; never lets the model stop. Unset: `closing`."""


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


# An opening fence line, then (after any lines) a closing line of the same fence, as extract.py reads them.
_CLOSED_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n(?:[^\n]*\n)*?[ \t]*\1[ \t]*$", re.M)


def code_block_closed(text: str) -> bool:
    """True once `text` holds a complete fenced code block (opening fence line and a later closing line).

    Used as `stop_text` in evaluation: an answer that wraps its code in a fence and then goes on in prose can
    stop right there, since the code extractor takes the fenced block. Bare code (no fence) never triggers it.
    """
    if "```" not in text and "~~~" not in text:
        return False
    return _CLOSED_FENCE.search(text) is not None


def _keeps_last_logits_only(model) -> bool:
    """Whether the model's forward takes `logits_to_keep` (skip the LM head over the whole prompt)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper passes it on
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _last_logits(model, keep_last: bool, **inputs) -> tuple[torch.Tensor, object]:
    """One forward step: float logits of the last position of each row ([batch, vocab], CPU) and the cache."""
    if keep_last:
        inputs["logits_to_keep"] = 1
    out = model(**inputs, use_cache=True)
    return out.logits[:, -1].float().cpu(), out.past_key_values


@torch.no_grad()
def stream_tokens(model, tokenizer, input_ids: list[int], *, max_new_tokens: int = 256, temperature: float = 0.0,
                  top_p: float = 1.0, seed: int | None = None, stop_ids: set[int] | None = None,
                  constraint: Constraint | None = None, on_token: Callable[[int], None] | None = None,
                  stop_text: Callable[[str], bool] | None = None,
                  should_stop: Callable[[], bool] | None = None, draft: list[int] | None = None) -> Iterator[str]:
    """Yield text pieces of the continuation of `input_ids`, one model step at a time.

    With a constraint the model's own choice is kept whenever the text stays viable, so the constraint only
    repairs (see `_constrained`); pieces are streamed as they are decoded, `constraint.lookahead` tokens late,
    since a dead end may still take those back. `on_token` is called with each kept token id (stop tokens
    excluded) as it is streamed, e.g. to count usage. `stop_text(text so far)` ends an unconstrained answer after
    the token that made it true (that token is kept), as in `batch_decode.generate_greedy_batch`. `should_stop()`
    true ends the answer at the next model step (a server whose client left); held-back text is then dropped.

    `draft`: the model's greedy choices after `input_ids`, already decoded (a batch's unconstrained greedy answer).
    Constrained greedy decoding takes them as the model's choices without running the model, for as long as it
    follows them, so repairing an answer costs the model steps from its first repair on, not the whole answer.
    Ignored without a constraint or when sampling.
    """
    stop_ids = stop_token_ids(tokenizer, model) if stop_ids is None else stop_ids
    gen = torch.Generator(device="cpu").manual_seed(seed if seed is not None else 0)
    if constraint is not None:
        yield from _constrained(model, tokenizer, input_ids, max_new_tokens, temperature, top_p, gen, stop_ids,
                                constraint, on_token, should_stop, draft=draft if temperature <= 0 else None)
        return
    device = next(model.parameters()).device
    keep_last = _keeps_last_logits_only(model)
    detok = _Detokenizer(tokenizer)
    ids = torch.tensor([input_ids], device=device)
    past = None
    for _ in range(max_new_tokens):
        if should_stop is not None and should_stop():
            return
        logits, past = _last_logits(model, keep_last, input_ids=ids, past_key_values=past)
        token = _model_choice(logits[0], temperature, top_p, gen)
        if token in stop_ids:
            break
        if on_token is not None:
            on_token(token)
        piece = detok.push(token)
        if piece:
            yield piece
        if stop_text is not None and stop_text(detok.text_with()):
            break
        ids = torch.tensor([[token]], device=device)
    tail = detok.flush()
    if tail:
        yield tail


def constraint_accepts(tokenizer, token_ids: list[int], constraint: Constraint) -> bool:
    """Whether greedy constrained decoding would keep exactly `token_ids` and then stop, with the same text,
    given that they are the model's greedy choice followed by a stop token.

    The constrained decoder keeps the model's choice whenever its text is viable, and stops where the model
    stops once the text is complete; then it never intervenes and makes the same choices.
    """
    text = _Text(tokenizer)
    for token in token_ids:
        if not constraint.viable(text.with_token(token)):
            return False
        text.push(token)
    return constraint.complete(text.text)


MAX_BACKTRACKS = 32


class _Text:
    """The decoded text of a growing (and, when backtracking, shrinking) list of token ids."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def with_token(self, token_id: int) -> str:
        return self.tokenizer.decode([*self.ids, token_id], skip_special_tokens=True)

    def push(self, token_id: int) -> None:
        self.ids.append(token_id)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def pop(self) -> int:
        token = self.ids.pop()
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        return token

    def decoded(self, n: int) -> str:
        """The text of the first `n` ids."""
        return self.text if n == len(self.ids) else self.tokenizer.decode(self.ids[:n], skip_special_tokens=True)


def _constrained(model, tokenizer, input_ids, max_new_tokens, temperature, top_p, gen, stop_ids,
                 constraint: Constraint, on_token, should_stop=None, draft: list[int] | None = None) -> Iterator[str]:
    """Decode with the model's own choices, repaired only where they would make the text unviable.

    Each step draws the model's choice exactly as unconstrained decoding does (argmax, or one seeded draw) and
    keeps it when its text stays viable; only when it does not are further candidates drawn, in model order,
    up to `constraint.max_candidates`. A stop token is kept when the text is finished code; when the model
    chose to stop on unfinished text that `constraint.closing` closes (an unclosed brace), it ends there,
    closed, since the model meant to end (forcing it on makes it write code it did not intend); else the next
    candidate is taken.

    At a dead end (no candidate viable) the latest choice still held back is swapped for its next viable
    alternative (at most MAX_BACKTRACKS times per answer; the KV cache is cropped back). Only the last
    `constraint.lookahead` kept tokens can be taken back that way; older tokens are final and are streamed as
    soon as the text up to them can be closed by `constraint.stream_closing` (else `closing`; at once without
    either). So the stream runs a few tokens behind the model and never has to take text back: at the end (the
    token budget, no choice left) `constraint.finish` closes the whole text, or, where that would cut into
    streamed text, the streamed text is closed with its known suffix and the tokens held back are dropped.

    While the kept tokens are a prefix of `draft` (greedy only), the next draft token is the model's choice at that
    position and no model step is run for it; the model runs (over every kept token its cache lacks, in one
    forward) only when a candidate past the draft's is needed: where the draft's token is refused, where the
    draft ends, or where a backtrack asks a position for its next candidate. The choices are the same; only float
    rounding can differ, as between a batch and one stream.
    """
    device = next(model.parameters()).device
    keep_last = _keeps_last_logits_only(model)
    text = _Text(tokenizer)  # every kept token, held back or streamed
    out = _Detokenizer(tokenizer)  # the streamed ones
    stream_closing = constraint.stream_closing or constraint.closing
    streamed_suffix = "" if stream_closing is None else stream_closing("")  # closes the streamed text
    held: list[_Choices] = []  # per token that may still be taken back: the untried candidates at its position
    past, cached, backtracks, stopped = None, 0, 0, False  # the KV cache holds the first `cached` of prompt + text
    draft = list(draft or [])
    on_draft = bool(draft)  # the kept tokens are a prefix of the draft
    closings: dict[str, str] = {}

    def next_logits() -> torch.Tensor:
        """The model's logits after the kept text: one forward over what the cache lacks (at least the last
        token, whose output they are)."""
        nonlocal past, cached
        seq = [*input_ids, *text.ids]
        start = max(0, min(cached, len(seq) - 1))
        if past is not None and past.get_seq_length() != start:
            past = _crop(past, start)
        if past is None:
            start = 0
        logits, past = _last_logits(model, keep_last, input_ids=torch.tensor([seq[start:]], device=device),
                                    past_key_values=past)
        cached = len(seq)
        return logits[0]

    def closes(unfinished: str) -> bool:
        """Whether the model may stop on `unfinished`: `closing` (else `finish`) closes it by appending."""
        if unfinished not in closings:
            if constraint.closing is not None:
                suffix = constraint.closing(unfinished)
                closings[unfinished] = unfinished + suffix if suffix is not None else ""
            else:
                closings[unfinished] = constraint.finish(unfinished) if constraint.finish is not None else ""
        closed = closings[unfinished]
        return closed.startswith(unfinished) and constraint.complete(closed)

    while len(text.ids) < max_new_tokens:
        if should_stop is not None and should_stop():
            return
        n = len(text.ids)
        if on_draft and n < len(draft):  # the model's choice here is known: its logits only if it is refused
            choices = _Choices(next_logits, temperature, top_p, gen, constraint.max_candidates, first=draft[n])
        else:
            choices = _Choices(next_logits(), temperature, top_p, gen, constraint.max_candidates)
        token = _first_acceptable(choices, text, stop_ids, constraint, closes)
        while token is None and held and backtracks < MAX_BACKTRACKS:
            backtracks += 1
            text.pop()  # take back the latest choice and try what else was viable there
            cached = min(cached, len(input_ids) + len(text.ids))  # the cache past the kept text is stale
            choices = held.pop()
            token = _first_acceptable(choices, text, stop_ids, constraint, closes)
        if token is None:
            break
        if token in stop_ids:
            stopped = True
            break
        on_draft = on_draft and len(text.ids) < len(draft) and token == draft[len(text.ids)]
        text.push(token)
        held.append(choices)
        if len(held) > constraint.lookahead:
            held.pop(0)  # the oldest is final now
        final = len(text.ids) - len(held)
        if final > len(out.ids):
            suffix = "" if stream_closing is None else stream_closing(text.decoded(final))
            if suffix is not None:  # the final tokens can be closed: stream them
                streamed_suffix = suffix
                for token in text.ids[len(out.ids):final]:
                    piece = _commit(token, out, on_token)
                    if piece:
                        yield piece
    answer = text.text
    if stopped and answer in closings:
        answer = closings[answer]
    elif not stopped and constraint.finish is not None and not constraint.complete(answer):
        answer = constraint.finish(answer)
    streamed = text.decoded(len(out.ids))
    if not answer.startswith(streamed):  # streamed text cannot be taken back
        answer = text.text
    if stream_closing is not None and streamed_suffix is not None and not constraint.complete(answer):
        answer = streamed + streamed_suffix  # drop what was held back, close what was streamed
    sent = out.emitted
    for token in text.ids[len(out.ids):]:  # report the held-back tokens the answer keeps
        if answer.startswith(text.decoded(len(out.ids) + 1)):
            _commit(token, out, on_token)
    if len(answer) > len(sent):
        yield answer[len(sent):]


def _commit(token: int, out: _Detokenizer, on_token) -> str:
    """Stream one final token: report it and return its text (held back while it ends mid-character)."""
    if on_token is not None:
        on_token(token)
    return out.push(token)


def _first_acceptable(choices: _Choices, text: _Text, stop_ids: set[int], constraint: Constraint,
                      closes: Callable[[str], bool]) -> int | None:
    """The next candidate of `choices` that keeps the text viable. A stop token: when the text is complete, or,
    if it is the model's own choice (the first of a fresh `choices`), when `closes(text)`."""
    model_choice = choices.fresh
    for token in choices:
        if token in stop_ids:
            if constraint.complete(text.text) or (model_choice and closes(text.text)):
                return token
        elif constraint.viable(text.with_token(token)):
            return token
        model_choice = False
    return None


def _crop(past, length: int):
    """The KV cache cut back to its first `length` positions, or None (rebuild it) where it cannot be cut."""
    try:
        if past is None or not hasattr(past, "crop") or not getattr(past, "is_croppable", True):
            return None
        remove = past.get_seq_length() - length
        if remove > 0:
            past.crop(-remove)  # a negative count removes that many positions (transformers 4.x and 5.x alike)
        return past if past.get_seq_length() == length else None
    except Exception:  # noqa: BLE001 - any cache this cannot cut is rebuilt from the kept tokens instead
        return None


def _model_choice(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """The token unconstrained decoding picks: the most likely (lowest id on ties), or one seeded draw."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    return int(_sample_probs(logits, temperature, top_p).multinomial(1, generator=gen)[0])


class _Choices:
    """Candidate tokens at one position in the order the model would choose them, drawn lazily: first the
    model's own choice (the same draw as unconstrained decoding, so an answer the constraint never repairs is
    the same answer), then, only when asked, up to `limit - 1` fallbacks: the next most likely tokens, or
    further seeded draws without replacement."""

    def __init__(self, logits: torch.Tensor | Callable[[], torch.Tensor], temperature: float, top_p: float,
                 gen: torch.Generator, limit: int, first: int | None = None):
        """`logits`, or a function that computes them when first needed; `first`: the model's own (greedy) choice
        where it is already known, so that the logits are needed only for a fallback."""
        self.fresh = True
        """Nothing has been taken yet: the next token is the model's own choice."""
        self._tokens = self._draw(logits, temperature, top_p, gen, limit, first)

    @staticmethod
    def _draw(logits, temperature, top_p, gen, limit, first) -> Iterator[int]:
        if first is None:
            logits = logits() if callable(logits) else logits
            first = _model_choice(logits, temperature, top_p, gen)
        yield first
        if limit <= 1:
            return
        logits = logits() if callable(logits) else logits
        if temperature <= 0:
            top = torch.topk(logits, min(limit, logits.numel())).indices.tolist()
            yield from (t for t in top if t != first)
            return
        probs = _sample_probs(logits, temperature, top_p)
        probs[first] = 0.0
        n = int((probs > 0).sum())
        if n:
            yield from torch.multinomial(probs, num_samples=min(n, limit - 1), replacement=False,
                                         generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        token = next(self._tokens)
        self.fresh = False
        return token


def _sample_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Sampling probabilities at `temperature`, zero outside the top-p nucleus."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
    return probs

