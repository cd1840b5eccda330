"""Many answers at once: greedy (or seeded sampled) decoding of left-padded batches whose answers leave as they
end, and teacher forcing that shows a model decodes a given answer without decoding it.

What eval-local and dogfood's parity stage ask for: the same answers as `mens.model.generate.stream_tokens` gives
one at a time, for less work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from mens.model.generate import _keeps_last_logits_only, _last_logits, _model_choice, stop_token_ids


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


def rows_within_bounds(model, tokenizer, longest: int, max_new_tokens: int, limit: int, keep_last: bool) -> int:
    """How many rows (at least 1, at most `limit`) of prompts up to `longest` tokens, each decoding up to
    `max_new_tokens`, keep the KV cache within CACHE_BYTES and, for a model that cannot keep only the last position's
    logits (`keep_last` false), the first step's logits within PREFILL_LOGITS."""
    if per_token := _cache_bytes_per_token(model):
        limit = max(1, min(limit, CACHE_BYTES // (per_token * (longest + max_new_tokens))))
    if not keep_last:
        limit = max(1, min(limit, PREFILL_LOGITS // (longest * max(1, len(tokenizer)))))
    return limit


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
        batch_size = rows_within_bounds(model, tokenizer, max(map(len, prompts)), max_new_tokens, batch_size,
                                        _keeps_last_logits_only(model))
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
