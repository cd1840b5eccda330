"""One generation interface for everything that asks a model for text: `mens serve` streams one answer per request,
`mens eval-local` asks for many answers at once. Both go through an `Engine`.

The real engine is `mens.model.hf_engine.HFEngine`; test doubles implement `stream` and take `generate_batch` from
`SequentialBatch`. This module imports no torch, so the HTTP app and the bench runner load without it.
`context_length` and `count_tokens` are optional: an engine without them gets no prompt-length check in the server.
So are `max_batch` (int) and `batchable(request) -> bool`: an engine with both lets the server run up to `max_batch`
batchable requests' `stream`s at once (each from its own worker thread); without them it streams one at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

Progress = Callable[[int, int], None]
"""`progress(finished, total)`: called as answers of a batch finish."""


@dataclass
class GenerationRequest:
    """One generation. Exactly one of `messages` (chat) and `prompt` (raw completion) is set."""

    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    """Stop strings. The engine ignores them (its answer runs on past them); the server cuts the text at them."""
    constrained: bool = False
    """Restrict decoding to text that stays a viable prefix of the engine's language."""
    stop_at_closed_block: bool = False
    """End the answer right after the token that closes its first fenced code block (evaluation takes the code
    from that block, so the prose a model adds after it is not worth decoding). Unconstrained answers only:
    constrained decoding produces bare code and ignores it."""
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    """Set by the server when the answer is no longer wanted (client gone, deadline, shutdown). An engine checks it
    between model steps: a step that yields no text for a long while (a constrained search) still stops."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    """An engine may say why its answer ended ("stop" or "length"); when it does not, the server infers it:
    "length" when `completion_tokens` reached the request's `max_tokens`, else "stop"."""


class Engine(Protocol):
    model_id: str
    constrained_language: str | None
    """Name of the language constrained decoding enforces, or None when the engine cannot constrain."""

    context_length: int | None
    """Most tokens (prompt + answer) the model takes, or None when unknown (then no prompt check is made)."""

    def count_tokens(self, request: GenerationRequest) -> int:
        """Prompt tokens `request` would feed the model (raises ValueError when no prompt can be built)."""
        ...

    def stream(self, request: GenerationRequest, usage: Usage) -> Iterator[str]:
        """Yield text pieces of the completion; fill `usage` as tokens are consumed and produced.

        The app pulls one piece per `next()` (in a worker thread) and closes the generator when the client
        goes away or time runs out, so an engine must do no work between pieces and stop when closed.
        """
        ...

    def generate_batch(self, requests: list[GenerationRequest], progress: Progress | None = None) -> list[str]:
        """The full answers to `requests`, in order: answer i is exactly `"".join(stream(requests[i], Usage()))`
        (greedy, seeded sampling and constrained requests alike), so an engine may batch, reorder or reuse work
        however it likes. `progress(finished, total)` may be called as answers finish."""
        ...


def generate_sequentially(engine: Engine, requests: list[GenerationRequest],
                          progress: Progress | None = None) -> list[str]:
    """`Engine.generate_batch` the plain way: one `stream` after another, joined."""
    answers = []
    for i, request in enumerate(requests):
        answers.append("".join(engine.stream(request, Usage())))
        if progress is not None:
            progress(i + 1, len(requests))
    return answers


class SequentialBatch:
    """Mixin for an engine that only streams (a test double): `generate_batch` via `generate_sequentially`."""

    def generate_batch(self, requests: list[GenerationRequest], progress: Progress | None = None) -> list[str]:
        return generate_sequentially(self, requests, progress)  # type: ignore[arg-type]
