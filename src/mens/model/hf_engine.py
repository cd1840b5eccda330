"""The real engine: a loaded Hugging Face model (run or merged directory) behind the `Engine` protocol.

`stream` decodes one answer token by token (what the server sends; with `max_batch` > 1, concurrent unconstrained
answers share each model step, `mens.model.batch_stream`). `generate_batch` (what evaluation asks for)
gives the same answers for less work: unconstrained answers, greedy or seeded, are decoded in left-padded batches
(`generate_greedy_batch`; an answer that has ended leaves the batch); greedy answers are
kept, so a later batch asking for the same prompt and budget (the next decoding mode) reuses them; a constrained
greedy answer is the kept greedy one whenever constrained decoding would have produced it anyway (it ended at a
stop token and `constraint_accepts` it); the rest are decoded with the constraint one at a time, taking the
draft's tokens as the model's choices up to where it needs repair (`stream_tokens(draft=)`), so the model runs
from there on only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from mens.model.batch_decode import BatchOutput, generate_greedy_batch, greedy_reproduces
from mens.model.batch_stream import BatchStreamer
from mens.model.constraint import language_constraint
from mens.model.engine import GenerationRequest, Progress, Usage
from mens.model.generate import chat_input_ids, code_block_closed, constraint_accepts, stream_tokens
from mens.model.inference import LoadedModel

if TYPE_CHECKING:  # only the Language protocol's shape is used: model/ does not depend on lang/
    from mens.lang import Language

MIN_TEMPERATURE = 1e-6
"""A smaller temperature decodes greedily (logits / T would overflow float32)."""
MIN_TOP_P = 1e-6
"""A smaller top_p is raised to this; both keep only the most likely token (its probability is >= 1/vocab)."""
BATCH_SIZE = 64
"""Answers decoded together by `generate_batch`. Ended answers leave the batch, so a larger batch costs fewer steps,
not wasted rows: dogfood's 60 held-out greedy answers took 28.7-30.1 s in one batch against 45.5-45.8 s in batches
of 16 that carried ended answers along, and the base model's 34.1-35.7 s against 67.3-70.4 s (2 cores, f32;
bench/results/eval-batch-avx2cap-f32-vm.json). `generate_greedy_batch` takes fewer at once where the KV cache or
the first step's logits would be too large."""

GreedyKey = tuple[tuple[int, ...], int, bool]
"""(prompt ids, max_tokens, stop_at_closed_block): what a greedy unconstrained answer depends on."""


class HFEngine:
    def __init__(self, loaded: LoadedModel, language: Language | None = None, *, batch_size: int = BATCH_SIZE,
                 max_batch: int = 1):
        """`batch_size`: answers `generate_batch` decodes together. `max_batch` > 1: concurrent `stream` calls
        whose requests are `batchable` are decoded together, up to that many (`mens serve --max-batch`)."""
        self.loaded = loaded
        self.model_id = loaded.model_id
        self.language = language
        self.constrained_language = language.name if language is not None else None
        self.batch_size = batch_size
        self.max_batch = max(1, max_batch)
        self._streamer = BatchStreamer(loaded.model, loaded.tokenizer, self.max_batch) if max_batch > 1 else None
        self._greedy: dict[GreedyKey, BatchOutput] = {}
        """Greedy answers decoded by `generate_batch`, kept for later batches (an evaluation asks for the same
        greedy answers in each decoding mode). `stream` neither reads nor fills it."""

    @property
    def context_length(self) -> int | None:
        """The model's position limit from its config (None when the config names none)."""
        return self.loaded.context_length

    def count_tokens(self, request: GenerationRequest) -> int:
        return len(self.prompt_ids(request))

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """A chat through the chat template (with the trained system prompt when it has none), a prompt as is."""
        tok = self.loaded.tokenizer
        if request.messages is not None:
            return chat_input_ids(tok, request.messages, self.loaded.system_prompt)
        return tok(request.prompt or "", add_special_tokens=False)["input_ids"]

    def _constrains(self, request: GenerationRequest) -> bool:
        return request.constrained and self.language is not None

    @staticmethod
    def _sampling(request: GenerationRequest) -> tuple[float, float]:
        """(temperature, top_p) as decoded. Below these floors the float32 sampling maths underflows (no token
        left, or inf/inf = NaN); the floors choose the same tokens as any smaller value would: the most likely."""
        temperature = 0.0 if request.temperature < MIN_TEMPERATURE else request.temperature
        return temperature, max(request.top_p, MIN_TOP_P)

    def batchable(self, request: GenerationRequest) -> bool:
        """Whether `stream` decodes `request` in a batch with other concurrent ones: batching is on and the
        request is unconstrained (constrained decoding searches each answer on its own). Cheap: the server asks in
        its event loop, so the prompt is not tokenized here; one that comes out empty (the server refuses those
        before they get here) is decoded on its own."""
        return self._streamer is not None and not self._constrains(request)

    def stream(self, request: GenerationRequest, usage: Usage) -> Iterator[str]:
        ids = self.prompt_ids(request) if self.batchable(request) else []
        if ids:
            usage.prompt_tokens = len(ids)
            temperature, top_p = self._sampling(request)
            return self._streamer.stream(ids, max_new_tokens=request.max_tokens, temperature=temperature,
                                         top_p=top_p, seed=request.seed, on_token=_counter(usage),
                                         should_stop=request.cancelled.is_set,
                                         stop_text=code_block_closed if request.stop_at_closed_block else None)
        return self._stream(request, usage)

    def _stream(self, request: GenerationRequest, usage: Usage, draft: list[int] | None = None) -> Iterator[str]:
        """`stream`, given the request's greedy draft where one was decoded (constrained greedy decoding then runs
        the model only from where the draft needs repair)."""
        ids = self.prompt_ids(request)
        usage.prompt_tokens = len(ids)
        constraint = language_constraint(self.language) if self._constrains(request) else None
        temperature, top_p = self._sampling(request)
        stop_text = code_block_closed if request.stop_at_closed_block and constraint is None else None
        yield from stream_tokens(self.loaded.model, self.loaded.tokenizer, ids, max_new_tokens=request.max_tokens,
                                 temperature=temperature, top_p=top_p, seed=request.seed, constraint=constraint,
                                 on_token=_counter(usage), stop_text=stop_text, should_stop=request.cancelled.is_set,
                                 draft=draft)

    def generate_batch(self, requests: list[GenerationRequest], progress: Progress | None = None) -> list[str]:
        """What `stream` gives for each request, batched where that gives the same answer (see the module doc).

        `progress(finished, total)` counts answers as they are decoded; a constrained answer counts once its
        greedy draft is decoded (one that the constraint refuses is then decoded again, one at a time).
        """
        ids = [tuple(self.prompt_ids(r)) for r in requests]
        answers: list[str | None] = [None] * len(requests)
        finished = _Finished(len(requests), progress)
        # Greedy answers (constrained ones too: their draft), from the kept ones or decoded now. An empty prompt
        # cannot be batched; it is streamed below.
        greedy = [i for i, r in enumerate(requests) if ids[i] and self._sampling(r)[0] == 0]
        self._decode_greedy([(ids[i], requests[i].max_tokens, requests[i].stop_at_closed_block) for i in greedy],
                            finished)
        constraint = None
        drafts: dict[int, list[int]] = {}
        for i in greedy:
            out = self._greedy[(ids[i], requests[i].max_tokens, requests[i].stop_at_closed_block)]
            if not self._constrains(requests[i]):
                answers[i] = out.text
                continue
            # A draft that ended at a stop token (not at the budget or the closed block) and that the constraint
            # keeps at every step is the constrained answer; one constraint serves the drafts checked in turn.
            # Any other is decoded again with the constraint, from its draft (the model's choices up to its repair).
            constraint = constraint or language_constraint(self.language)
            if out.finish == "stop" and constraint_accepts(self.loaded.tokenizer, out.token_ids, constraint):
                answers[i] = out.text
            else:
                drafts[i] = out.token_ids
        # Seeded sampling, unconstrained and without a nucleus cut: each row draws from its own seeded generator.
        sampled = [i for i, r in enumerate(requests) if ids[i] and not self._constrains(r)
                   and self._sampling(r)[0] > 0 and r.top_p >= 1.0]
        groups: dict[tuple[int, float, bool], list[int]] = {}
        for i in sampled:
            r = requests[i]
            groups.setdefault((r.max_tokens, self._sampling(r)[0], r.stop_at_closed_block), []).append(i)
        for (max_tokens, temperature, stop_at_block), rows in groups.items():
            outs = generate_greedy_batch(self.loaded.model, self.loaded.tokenizer, [list(ids[i]) for i in rows],
                                         max_new_tokens=max_tokens, batch_size=self.batch_size,
                                         stop_text=code_block_closed if stop_at_block else None,
                                         temperature=temperature, progress=finished.step,
                                         seeds=[requests[i].seed if requests[i].seed is not None else 0 for i in rows])
            for i, out in zip(rows, outs, strict=True):
                answers[i] = out.text
        counted = set(greedy) | set(sampled)
        for i, answer in enumerate(answers):  # constrained answers the draft was not, nucleus sampling, empty prompts
            if answer is None:
                answers[i] = "".join(self._stream(requests[i], Usage(), draft=drafts.get(i)))
                if i not in counted:
                    finished.add(1)
        return answers  # type: ignore[return-value]

    def adopt_greedy(self, requests: list[GenerationRequest], answers: list[str]) -> list[bool]:
        """Keep `answers[i]` as request i's greedy answer where this model is shown to decode exactly it
        (`greedy_reproduces`: teacher forcing, one forward pass per batch), so that `generate_batch` then decodes
        only the others. For answers another model gave (merge parity: the adapter's). Which were kept, in order;
        requests that are not greedy and unconstrained are never kept."""
        rows = [i for i, r in enumerate(requests) if self._sampling(r)[0] == 0 and not self._constrains(r)]
        kept = [False] * len(requests)
        groups: dict[tuple[int, bool], list[int]] = {}
        for i in rows:
            groups.setdefault((requests[i].max_tokens, requests[i].stop_at_closed_block), []).append(i)
        for (max_tokens, stop_at_block), idx in groups.items():
            prompts = [self.prompt_ids(requests[i]) for i in idx]
            outs = greedy_reproduces(self.loaded.model, self.loaded.tokenizer, prompts, [answers[i] for i in idx],
                                     max_new_tokens=max_tokens, batch_size=self.batch_size,
                                     stop_text=code_block_closed if stop_at_block else None)
            for i, prompt, out in zip(idx, prompts, outs, strict=True):
                if out is not None:
                    self._greedy[(tuple(prompt), max_tokens, stop_at_block)] = out
                    kept[i] = True
        return kept

    def _decode_greedy(self, keys: list[GreedyKey], finished: _Finished) -> None:
        """Decode (in batches) the greedy answers of `keys` not kept yet, and keep them."""
        missing = list(dict.fromkeys(k for k in keys if k not in self._greedy))
        new = set(missing)
        finished.add(sum(k not in new for k in keys))
        groups: dict[tuple[int, bool], list[tuple[int, ...]]] = {}
        for prompt, max_tokens, stop_at_block in missing:
            groups.setdefault((max_tokens, stop_at_block), []).append(prompt)
        for (max_tokens, stop_at_block), prompts in groups.items():
            outs = generate_greedy_batch(self.loaded.model, self.loaded.tokenizer, [list(p) for p in prompts],
                                         max_new_tokens=max_tokens, batch_size=self.batch_size,
                                         stop_text=code_block_closed if stop_at_block else None,
                                         progress=finished.step)
            self._greedy.update({(p, max_tokens, stop_at_block): out for p, out in zip(prompts, outs, strict=True)})
        finished.add(sum(k in new for k in keys) - len(missing))  # repeats of a prompt decoded once


class _Finished:
    """How many answers of a `generate_batch` call are done, reported to its `progress`."""

    def __init__(self, total: int, progress: Progress | None):
        self.total, self.progress, self.done = total, progress, 0

    def add(self, n: int) -> None:
        if n > 0:
            self.done = min(self.total, self.done + n)
            if self.progress is not None:
                self.progress(self.done, self.total)

    def step(self, _finished: int, _total: int) -> None:
        """A `generate_greedy_batch` progress callback: one more answer is done."""
        self.add(1)


def _counter(usage: Usage):
    """An `on_token` callback that counts completion tokens into `usage`."""

    def count(_token: int) -> None:
        usage.completion_tokens += 1

    return count
