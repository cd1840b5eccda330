"""Concurrent streamed answers decoded together: one model step advances every answer of a batch.

`mens serve` admits several requests at once when they can share the model (unconstrained decoding, greedy or
sampled); each still streams its own text as its tokens are chosen. A decoding step costs about the same for one
answer as for a few (on a CPU the weights are read once per step either way), so concurrent clients are answered
in about the time of the longest answer instead of the sum of all of them.

A request that arrives while a batch decodes joins it at its next step (continuous batching): its prompt is run
once on its own (with any others joining at that step), its first token chosen, and its KV cache appended to the
batch's, the shorter of the two left-padded to the other's length (masked, with each row's own positions), so
a short answer asked for during a long one does not wait for the long one to end. That takes a cache of per-row
keys and values (`_joinable`); with any other (linear-attention or recurrent layers, sliding windows, static,
quantized or offloaded caches), and while the batch is at its `max_rows` or its cache bound, a request waits
until the batch has ended and starts the next one with every request that waited. Answers that end, are
cancelled (`should_stop`) or whose reader leaves drop out at the next step, their cache rows too where the cache
allows (`batch_decode._drop_ended`).

No thread of its own runs the model: a reader that finds no text ready and no step running takes the next step
itself while other readers wait, so a batch nobody reads is not decoded further. An answer is the one
`generate.stream_tokens` gives alone, up to the float rounding of a batched, left-padded matmul (as with
`batch_decode.generate_greedy_batch`); sampled rows draw from their own seeded generators exactly as it does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from mens.model.batch_decode import _drop_ended, _left_padded, rows_within_bounds
from mens.model.generate import _Detokenizer, _keeps_last_logits_only, _last_logits, _model_choice, stop_token_ids

WAIT_S = 0.05
"""How often a reader waiting for another reader's step checks its own `should_stop`."""
GATHER_S = 0.05
"""How long a new batch waits, from its oldest row's arrival, for more rows: requests sent together reach the
engine a few milliseconds apart, and without the wait the first would start a batch of its own."""


@dataclass
class _Row:
    ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    gen: torch.Generator
    detok: _Detokenizer
    on_token: Callable[[int], None] | None = None
    should_stop: Callable[[], bool] | None = None
    stop_text: Callable[[str], bool] | None = None
    pieces: deque = field(default_factory=deque)
    arrived: float = 0.0
    done: bool = False
    """No more text will be added (ended, cancelled, left or failed)."""
    left: bool = False
    """The reader stopped reading: the row leaves the batch at its next step."""
    error: BaseException | None = None


class _Batch:
    """The rows of one batch (in cache order) and the model inputs of their next step."""

    def __init__(self, rows: list[_Row], pad_id: int, device):
        self.rows = rows
        self.ids, self.mask, self.positions = _left_padded([r.ids for r in rows], pad_id, device)
        self.past = None
        self.device = device

    @property
    def finished(self) -> bool:
        return all(r.done for r in self.rows)


class BatchStreamer:
    """Streams answers of one model, batching those that are read at the same time (see the module doc)."""

    def __init__(self, model, tokenizer, max_rows: int):
        if max_rows < 1:
            raise ValueError(f"max_rows={max_rows}: use 1 or more")
        self.model, self.tokenizer, self.max_rows = model, tokenizer, max_rows
        self.stop_ids = stop_token_ids(tokenizer, model)
        self.keep_last = _keeps_last_logits_only(model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.device = next(model.parameters()).device
        self._cond = threading.Condition()
        self._pending: list[_Row] = []
        self._batch: _Batch | None = None
        self._stepping = False
        self.batches: deque[int] = deque(maxlen=256)
        """Rows of each of the latest batches at their start (for tests and diagnostics)."""
        self.joins: deque[int] = deque(maxlen=256)
        """Rows of each of the latest joins of a running batch (for tests and diagnostics)."""

    def stream(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None, on_token: Callable[[int], None] | None = None,
               should_stop: Callable[[], bool] | None = None,
               stop_text: Callable[[str], bool] | None = None) -> Iterator[str]:
        """Text pieces of the continuation of `input_ids`, as `stream_tokens` yields them (same arguments)."""
        if not input_ids:
            raise ValueError("a batched answer needs at least one prompt token")
        if max_new_tokens <= 0:  # stream_tokens runs no step for it either
            return iter(())
        row = _Row(list(input_ids), max_new_tokens, temperature, top_p,
                   torch.Generator(device="cpu").manual_seed(seed if seed is not None else 0),
                   _Detokenizer(self.tokenizer), on_token, should_stop, stop_text)
        return self._pieces(row)

    def _pieces(self, row: _Row) -> Iterator[str]:
        with self._cond:  # the row waits from its first read: an answer never read never joins a batch
            row.arrived = time.monotonic()
            self._pending.append(row)
            self._cond.notify_all()
        try:
            while (piece := self._next(row)) is not None:
                yield piece
        finally:
            with self._cond:
                row.left = True
                if row in self._pending:
                    self._pending.remove(row)
                self._cond.notify_all()

    def _next(self, row: _Row) -> str | None:
        """The row's next piece (None once it has ended), taking model steps while none is ready."""
        while True:
            with self._cond:
                while True:
                    if row.pieces:
                        return row.pieces.popleft()
                    if row.error is not None:  # each reader raises its own error (one object, several threads)
                        raise RuntimeError(f"batched decoding failed: {type(row.error).__name__}: {row.error}") \
                            from row.error
                    if row.done:
                        return None
                    if row.should_stop is not None and row.should_stop():
                        row.done = row.left = True  # held-back text is dropped, as stream_tokens does
                        return None
                    if not self._stepping:
                        break
                    self._cond.wait(WAIT_S)
                self._stepping = True
            try:
                with self._cond:
                    batch = self._batch
                    if batch is None or batch.finished:
                        if not self._pending:  # not reached: a reader's row waits or is in the running batch
                            row.done = True
                            continue
                        self._gather()
                        batch = self._batch = self._start()
                self._step(batch)
            finally:
                with self._cond:
                    self._stepping = False
                    self._cond.notify_all()

    def _gather(self) -> None:
        """Wait (lock held, released while waiting) until GATHER_S after the oldest waiting row's arrival, or until
        `max_rows` rows wait."""
        deadline = self._pending[0].arrived + GATHER_S
        while len(self._pending) < self.max_rows and (left := deadline - time.monotonic()) > 0:
            self._cond.wait(left)

    def _start(self) -> _Batch:
        """A batch of the waiting rows, oldest first, as many as `max_rows` and the cache bound allow (called with
        the lock held, by a reader whose own row waits, so there is at least one)."""
        take: list[_Row] = []
        longest = new_tokens = 0
        for row in self._pending:
            longest, new_tokens = max(longest, len(row.ids)), max(new_tokens, row.max_new_tokens)
            if take and len(take) + 1 > rows_within_bounds(self.model, self.tokenizer, longest, new_tokens,
                                                           self.max_rows, self.keep_last):
                break
            take.append(row)
        self._pending = self._pending[len(take):]
        self.batches.append(len(take))
        return _Batch(take, self.pad_id, self.device)

    def _step(self, batch: _Batch) -> None:
        """One model step for the batch's live rows (their next tokens, as text pieces on each row), then the rows
        that wait join it where they can (`_joining`, `_join`)."""
        with self._cond:
            for r in batch.rows:
                if not r.done and (r.left or (r.should_stop is not None and r.should_stop())):
                    r.done = True
            if batch.finished:
                batch.past = None  # the cache is freed as soon as the batch has ended
                return
            joining = self._joining(batch)
        self._advance(batch)
        if joining:
            self._join(batch, joining)

    def _joining(self, batch: _Batch) -> list[_Row]:
        """The waiting rows that join the running batch at this step, oldest first (lock held): as many as
        `max_rows` and the cache bound leave room for, none where the batch's cache cannot take rows."""
        if not self._pending or batch.past is None or not _joinable(batch.past):
            return []
        live = [r for r in batch.rows if not r.done]
        rows = live + self._pending
        room = rows_within_bounds(self.model, self.tokenizer, max(batch.mask.shape[1], *(len(r.ids) for r in rows)),
                                  max(r.max_new_tokens for r in rows), self.max_rows, self.keep_last) - len(live)
        take = self._pending[:max(0, room)]
        if take:
            self._pending = self._pending[len(take):]
            self.joins.append(len(take))
        return take

    def _advance(self, batch: _Batch) -> None:
        """The model step of the batch's live rows."""
        try:
            with torch.no_grad():
                logits, batch.past = _last_logits(self.model, self.keep_last, input_ids=batch.ids,
                                                  attention_mask=batch.mask, position_ids=batch.positions,
                                                  past_key_values=batch.past)
        except Exception as e:  # every row of the batch gets the failure; rows waiting for the next batch do not
            self._fail(batch.rows, e)
            batch.past = None
            return
        tokens = [self.pad_id if r.done else _model_choice(logits[b], r.temperature, r.top_p, r.gen)
                  for b, r in enumerate(batch.rows)]
        with self._cond:
            for r, token in zip(batch.rows, tokens, strict=True):
                if not r.done:
                    self._push(r, token)
        going = [b for b, r in enumerate(batch.rows) if not r.done]
        if not going:
            batch.past = None  # the cache is freed as soon as the batch has ended
            return
        if len(going) < len(batch.rows) and _drop_ended(batch.past, index := torch.tensor(going, device=batch.device)):
            batch.rows, tokens = [batch.rows[b] for b in going], [tokens[b] for b in going]
            batch.mask, batch.positions = batch.mask[index], batch.positions[index]
        batch.ids = torch.tensor([[t] for t in tokens], device=batch.device)
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.rows), 1)], dim=1)
        batch.positions = batch.positions[:, -1:] + 1

    def _join(self, batch: _Batch, rows: list[_Row]) -> None:
        """Run the joining rows' prompts, choose their first tokens and append them to the batch (see the module
        doc); a failure reaches only the joining rows."""
        new = _Batch(rows, self.pad_id, self.device)
        self._advance(new)  # rows that end at their first token leave `new` there
        if new.past is None:
            return
        if batch.past is None:  # every earlier row ended (or failed) at this step: the joined rows are the batch
            batch.rows, batch.past, batch.ids, batch.mask, batch.positions = \
                new.rows, new.past, new.ids, new.mask, new.positions
            return
        width = max(batch.mask.shape[1], new.mask.shape[1])
        _append_cache(batch.past, new.past, width - 1)
        batch.rows = batch.rows + new.rows
        batch.ids = torch.cat([batch.ids, new.ids])
        batch.mask = torch.cat([_pad_left(batch.mask, width), _pad_left(new.mask, width)])
        batch.positions = torch.cat([batch.positions, new.positions])

    def _fail(self, rows: list[_Row], error: BaseException) -> None:
        with self._cond:
            for r in rows:
                if not r.done:
                    r.error, r.done = error, True

    def _push(self, row: _Row, token: int) -> None:
        """Add a chosen token to a row, as `stream_tokens` would (lock held)."""
        if token in self.stop_ids:
            self._end(row)
            return
        if row.on_token is not None:
            row.on_token(token)
        if piece := row.detok.push(token):
            row.pieces.append(piece)
        if len(row.detok.ids) >= row.max_new_tokens or (
                row.stop_text is not None and row.stop_text(row.detok.text_with())):
            self._end(row)

    @staticmethod
    def _end(row: _Row) -> None:
        if tail := row.detok.flush():
            row.pieces.append(tail)
        row.done = True


def _joinable(past) -> bool:
    """Whether rows can be appended to the cache `past`: a DynamicCache of plain per-row keys and values."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = getattr(past, "layers", None)
    return type(past) is DynamicCache and bool(layers) and all(type(x) is DynamicLayer and x.is_initialized
                                                               for x in layers)


def _pad_left(t: torch.Tensor, width: int, dim: int = 1) -> torch.Tensor:
    """`t` with zeros prepended along `dim` up to `width` (a mask's padding, or cache entries it masks)."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _append_cache(past, new, length: int) -> None:
    """Append the rows of cache `new` to cache `past`, each left-padded to `length` positions."""
    for layer, extra in zip(past.layers, new.layers, strict=True):
        layer.keys = torch.cat([_pad_left(layer.keys, length, -2), _pad_left(extra.keys, length, -2)])
        layer.values = torch.cat([_pad_left(layer.values, length, -2), _pad_left(extra.values, length, -2)])
