"""Token-by-token generation with a KV cache: greedy or seeded sampling, stop tokens, and an optional
constraint that keeps the decoded text a viable prefix of a language (so every finished answer parses).
`generate_greedy_batch` decodes many prompts at once (left-padded), which on CPU costs little more per step
than one prompt.

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
                  should_stop: Callable[[], bool] | None = None) -> Iterator[str]:
    """Yield text pieces of the continuation of `input_ids`, one model step at a time.

    With a constraint the model's own choice is kept whenever the text stays viable, so the constraint only
    repairs (see `_constrained`); pieces are streamed as they are decoded, `constraint.lookahead` tokens late,
    since a dead end may still take those back. `on_token` is called with each kept token id (stop tokens
    excluded) as it is streamed, e.g. to count usage. `stop_text(text so far)` ends an unconstrained answer after
    the token that made it true (that token is kept), as in `generate_greedy_batch`. `should_stop()` true ends
    the answer at the next model step (a server whose client left); held-back text is then dropped.
    """
    stop_ids = stop_token_ids(tokenizer, model) if stop_ids is None else stop_ids
    gen = torch.Generator(device="cpu").manual_seed(seed if seed is not None else 0)
    if constraint is not None:
        yield from _constrained(model, tokenizer, input_ids, max_new_tokens, temperature, top_p, gen, stop_ids,
                                constraint, on_token, should_stop)
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


@dataclass
class BatchOutput:
    """One answer of `generate_greedy_batch`."""

    text: str
    token_ids: list[int]
    """The kept tokens (a stop token is not kept; the token that made `stop_text` true is)."""
    finish: str
    """Why it ended: "stop" (a stop token), "stop_text" (`stop_text` became true) or "length" (the budget)."""


PREFILL_LOGITS = 2**27
"""Logits (512 MB in f32) a batch's first step may return, for models that return every position's."""
CACHE_BYTES = 2**31
"""KV cache (2 GiB) a batch may fill at its longest: 64 answers of SmolLM2-135M in f32 (1.2 GB at 400 tokens),
about 27 of a 4B Qwen in bf16."""


def _cache_bytes_per_token(model) -> int | None:
    """Bytes of keys and values one token adds to the cache (every layer full attention), from the config; None
    where the config does not say."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers, heads = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "num_attention_heads", None)
    hidden = getattr(cfg, "hidden_size", None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
        return None
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    dtype = next(model.parameters()).dtype
    width = 4 if not dtype.is_floating_point else dtype.itemsize  # 4-bit weights keep a float cache
    return int(layers * 2 * kv_heads * head_dim * max(2, width))


@torch.no_grad()
def generate_greedy_batch(model, tokenizer, prompts: list[list[int]], *, max_new_tokens: int = 256,
                          stop_ids: set[int] | None = None, batch_size: int = 16,
                          stop_text: Callable[[str], bool] | None = None,
                          progress: Callable[[int, int], None] | None = None, temperature: float = 0.0,
                          seeds: list[int] | None = None) -> list[BatchOutput]:
    """Greedy (or seeded sampled) continuations of many prompts, `batch_size` at a time, in the order of `prompts`.

    The same answers as `stream_tokens` at temperature 0 (up to float rounding of batched matmuls). With
    temperature > 0 each row draws from its own generator seeded with `seeds[i]`, exactly as `stream_tokens`
    with that seed does (one draw per kept step), so a sampled retry gives the same answer batched or not.
    Prompts are sorted by length before chunking so that little padding is computed. `progress(finished, total)`
    is called each time an answer ends. A batch holds no more prompts than keep its KV cache within CACHE_BYTES,
    nor, for a model that cannot keep only the last position's logits, its first step's logits within
    PREFILL_LOGITS.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: use 1 or more")
    if prompts:
        longest = max(map(len, prompts))
        if per_token := _cache_bytes_per_token(model):
            batch_size = max(1, min(batch_size, CACHE_BYTES // (per_token * (longest + max_new_tokens))))
        if not _keeps_last_logits_only(model):
            batch_size = max(1, min(batch_size, PREFILL_LOGITS // (longest * max(1, len(tokenizer)))))
    if temperature > 0 and (seeds is None or len(seeds) != len(prompts)):
        raise ValueError("sampling in a batch needs one seed per prompt (seeds=[...])")
    stop_ids = stop_token_ids(tokenizer, model) if stop_ids is None else stop_ids
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outputs: list[BatchOutput | None] = [None] * len(prompts)
    finished = 0

    def on_finish() -> None:
        nonlocal finished
        finished += 1
        if progress is not None:
            progress(finished, len(prompts))

    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        gens = None if temperature <= 0 else [torch.Generator(device="cpu").manual_seed(seeds[i]) for i in chunk]
        answers = _greedy_chunk(model, tokenizer, [prompts[i] for i in chunk], max_new_tokens, stop_ids, stop_text,
                                on_finish, temperature, gens)
        for i, answer in zip(chunk, answers, strict=True):
            outputs[i] = answer
    return outputs  # type: ignore[return-value]


def _left_padded(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, attention mask and position ids of left-padded prompts (each prompt starts at position 0)."""
    if any(not p for p in prompts):
        raise ValueError("generate_greedy_batch got an empty prompt; every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # padding positions are masked; any value will do
    return ids, mask, positions


def _greedy_chunk(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int],
                  stop_text: Callable[[str], bool] | None, on_finish: Callable[[], None], temperature: float = 0.0,
                  gens: list[torch.Generator] | None = None) -> list[BatchOutput]:
    """Decode one chunk until every row has ended.

    Ended rows leave the batch (their cache rows too, `_drop_ended`) where the cache can drop rows, so a step
    computes only the answers still going: a chunk of answers of 14-163 tokens otherwise computes 1.7x the tokens
    it keeps. Where it cannot, ended rows ride along and their tokens are ignored.
    """
    device = next(model.parameters()).device
    keep_last = _keeps_last_logits_only(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, mask, positions = _left_padded(prompts, pad_id, device)
    kept: list[list[int]] = [[] for _ in prompts]
    finish: list[str | None] = [None] * len(prompts)
    live = list(range(len(prompts)))  # the prompt index of each row of the batch
    past = None
    for _ in range(max_new_tokens):
        logits, past = _last_logits(model, keep_last, input_ids=ids, attention_mask=mask, position_ids=positions,
                                    past_key_values=past)
        if gens is None:
            tokens = logits.argmax(dim=-1).tolist()
        else:  # an ended row draws nothing more: its generator stays where stream_tokens would leave it
            tokens = [pad_id if finish[r] is not None else _model_choice(logits[b], temperature, 1.0, gens[r])
                      for b, r in enumerate(live)]
        for b, r in enumerate(live):
            if finish[r] is None:
                finish[r] = _push(kept[r], tokens[b], tokenizer, stop_ids, stop_text)
                if finish[r] is not None:
                    on_finish()
        if all(finish[r] is not None for r in live):
            break
        going = [b for b, r in enumerate(live) if finish[r] is None]
        if len(going) < len(live) and _drop_ended(past, index := torch.tensor(going, device=device)):
            live, tokens = [live[b] for b in going], [tokens[b] for b in going]
            mask, positions = mask[index], positions[index]
        ids = torch.tensor([[t] for t in tokens], device=device)
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
        positions = positions[:, -1:] + 1
    for row, f in enumerate(finish):
        if f is None:
            finish[row] = "length"
            on_finish()
    return [BatchOutput(tokenizer.decode(k, skip_special_tokens=True), k, f) for k, f in zip(kept, finish, strict=True)]


def _drop_ended(past, going: torch.Tensor) -> bool:
    """Keep only the batch rows `going` (indices) in the KV cache; False (cache untouched) where the cache holds
    any state other than per-row keys and values (linear-attention or recurrent layers, static, quantized or
    offloaded caches), whose rows are not all selected by transformers, so that the caller lets ended rows ride
    along."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(past, "layers", None)
    if type(past) is not DynamicCache or not layers or \
            not all(type(x) in (DynamicLayer, DynamicSlidingWindowLayer) for x in layers):
        return False
    past.batch_select_indices(going)
    return True


def _push(kept: list[int], token: int, tokenizer, stop_ids: set[int], stop_text: Callable[[str], bool] | None
          ) -> str | None:
    """Add a decoded token to a row; returns why the row ends now, or None while it goes on."""
    if token in stop_ids:
        return "stop"
    kept.append(token)
    if stop_text is not None and stop_text(tokenizer.decode(kept, skip_special_tokens=True)):
        return "stop_text"
    return None


TIE_MARGIN = 1e-3
"""Logit gap below which `greedy_reproduces` does not vouch for a choice of an f32 model: a full-sequence forward and
step-by-step decoding with a cache round differently (about 1e-5 of a logit in f32), so a nearer second choice is
decoded."""
HALF_TIE_MARGIN = 0.5
"""The same for a model that computes in bf16 or f16 (inference on CUDA): 8 or 11 bits of mantissa put one rounding
of a logit of 20-30 at 0.01-0.1, and two kernel paths may differ by a few of them."""


def _ends_as_decoded(tokenizer, answer: list[int], max_new_tokens: int, stop_ids: set[int],
                     stop_text: Callable[[str], bool] | None) -> str | None:
    """How `_push` would end a row that kept exactly `answer`: "stop_text", "length", "stop" (the next choice must
    then be a stop token), or None where it could not keep all of it (a stop token inside, too long, or
    `stop_text` true at an earlier token)."""
    if len(answer) > max_new_tokens or any(t in stop_ids for t in answer):
        return None
    if stop_text is not None:
        for n in range(1, len(answer)):
            if stop_text(tokenizer.decode(answer[:n], skip_special_tokens=True)):
                return None
        if answer and stop_text(tokenizer.decode(answer, skip_special_tokens=True)):
            return "stop_text"
    return "length" if len(answer) == max_new_tokens else "stop"


@torch.no_grad()
def greedy_reproduces(model, tokenizer, prompts: list[list[int]], answers: list[str | list[int]], *,
                      max_new_tokens: int = 256, stop_ids: set[int] | None = None,
                      stop_text: Callable[[str], bool] | None = None, batch_size: int = 8) -> list[BatchOutput | None]:
    """For each prompt, the answer as `generate_greedy_batch` would give it, where this model's greedy decoding is
    shown to reproduce `answers[i]` (a text, or token ids) exactly; None where it is not (then decode it to know).

    Checked by teacher forcing, one forward pass over prompt + answer: the answer's tokens (a text is tokenized
    again, and must decode back to the same text) must each be the model's argmax after the tokens before them,
    by at least TIE_MARGIN (HALF_TIE_MARGIN in bf16/f16) over the runner-up, and the answer must end as the
    decoder would end it (a stop token next, `stop_text` true at its last token and not before, or the token
    budget). That is what decoding computes, for about the cost of its first step per answer instead of one step
    per token: why merge parity (mens.dogfood.parity) checks the merged model against the adapter's answers so.
    """
    stop_ids = stop_token_ids(tokenizer, model) if stop_ids is None else stop_ids
    out: list[BatchOutput | None] = [None] * len(prompts)
    todo = []
    texts: list[str] = []
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        ids = tokenizer(answer, add_special_tokens=False)["input_ids"] if isinstance(answer, str) else list(answer)
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
        finish = _ends_as_decoded(tokenizer, ids, max_new_tokens, stop_ids, stop_text) if prompt else None
        if finish is not None and (not isinstance(answer, str) or texts[i] == answer):
            todo.append((i, ids, finish))
    first = next(model.parameters())
    device, margin = first.device, TIE_MARGIN if first.dtype == torch.float32 else HALF_TIE_MARGIN
    keep_last = _keeps_last_logits_only(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    todo.sort(key=lambda t: len(prompts[t[0]]) + len(t[1]))
    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or len(tokenizer)
    for chunk in _chunks(todo, batch_size, lambda t: (len(t[1]) + 1) * vocab):
        ids, mask, positions = _left_padded([prompts[i] + a for i, a, _ in chunk], pad_id, device)
        keep = max(len(a) for _, a, _ in chunk) + 1  # the logits that choose each answer token and the one after
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        if keep_last:
            inputs["logits_to_keep"] = keep
        logits = model(**inputs, use_cache=False).logits[:, -keep:].float().cpu()
        for row, (i, answer, finish) in enumerate(chunk):
            chosen = logits[row, keep - len(answer) - 1 :]  # row's choices for answer[0..n-1], then the next token
            top = chosen.topk(2, dim=-1)
            checked = len(answer) + (finish == "stop")
            wanted = torch.tensor(answer, dtype=torch.long)
            if not bool((top.indices[: len(answer), 0] == wanted).all()):
                continue
            if finish == "stop" and int(top.indices[-1, 0]) not in stop_ids:
                continue
            if bool(((top.values[:checked, 0] - top.values[:checked, 1]) < margin).any()):
                continue
            out[i] = BatchOutput(texts[i], answer, finish)
    return out


def _chunks(items: list, rows: int, logits_of: Callable[[object], int], budget: int = 2**26) -> Iterator[list]:
    """Consecutive chunks of at most `rows` items whose kept logits (rows x the longest item's) stay within
    `budget` elements (256 MB in f32); an item over it alone gets a chunk of its own."""
    chunk: list = []
    for item in items:
        if chunk and (len(chunk) == rows or (len(chunk) + 1) * max(map(logits_of, [*chunk, item])) > budget):
            yield chunk
            chunk = []
        chunk.append(item)
    if chunk:
        yield chunk


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
                 constraint: Constraint, on_token, should_stop=None) -> Iterator[str]:
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
    """
    device = next(model.parameters()).device
    keep_last = _keeps_last_logits_only(model)
    text = _Text(tokenizer)  # every kept token, held back or streamed
    out = _Detokenizer(tokenizer)  # the streamed ones
    stream_closing = constraint.stream_closing or constraint.closing
    streamed_suffix = "" if stream_closing is None else stream_closing("")  # closes the streamed text
    held: list[_Choices] = []  # per token that may still be taken back: the untried candidates at its position
    pending, past, backtracks, stopped = list(input_ids), None, 0, False
    closings: dict[str, str] = {}

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
        logits, past = _last_logits(model, keep_last, input_ids=torch.tensor([pending], device=device),
                                    past_key_values=past)
        choices = _Choices(logits[0], temperature, top_p, gen, constraint.max_candidates)
        token = _first_acceptable(choices, text, stop_ids, constraint, closes)
        while token is None and held and backtracks < MAX_BACKTRACKS:
            backtracks += 1
            text.pop()  # take back the latest choice and try what else was viable there
            choices = held.pop()
            token = _first_acceptable(choices, text, stop_ids, constraint, closes)
            past = _crop(past, len(input_ids) + len(text.ids))
        if token is None:
            break
        if token in stop_ids:
            stopped = True
            break
        text.push(token)
        held.append(choices)
        pending = [token] if past is not None else [*input_ids, *text.ids]
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

    def __init__(self, logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator, limit: int):
        self.fresh = True
        """Nothing has been taken yet: the next token is the model's own choice."""
        self._tokens = self._draw(logits, temperature, top_p, gen, limit)

    @staticmethod
    def _draw(logits, temperature, top_p, gen, limit) -> Iterator[int]:
        first = _model_choice(logits, temperature, top_p, gen)
        yield first
        if limit <= 1:
            return
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

