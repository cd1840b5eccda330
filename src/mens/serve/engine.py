"""What the HTTP app needs from a model: a text stream for a chat or a raw prompt.

The app never touches torch; a real engine (`mens.serve.hf_engine`) or a test double implements this.
`context_length` and `count_tokens` are optional: an engine without them gets no prompt-length check.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol


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
    constrained: bool = False
    """Restrict decoding to text that stays a viable prefix of the engine's language."""
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


class StopScanner:
    """Cut a streamed text at the first stop string, holding back only what could start one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.buf = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.buf += piece
        cuts = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if cuts:
            out, self.buf, self.stopped = self.buf[: min(cuts)], "", True
            return out
        if self.hold <= 0:
            out, self.buf = self.buf, ""
            return out
        out, self.buf = self.buf[: -self.hold], self.buf[-self.hold :]
        return out

    def flush(self) -> str:
        out, self.buf = ("" if self.stopped else self.buf), ""
        return out
