"""A multi-turn chat with a loaded model: the trained system prompt first, answers streamed piece by piece.

The conversation is kept so each turn sees the earlier ones; when it no longer fits the model's positions the
oldest turns are dropped (the system prompt and the newest request always stay).
"""

from __future__ import annotations

from collections.abc import Iterator

from mens.errors import UsageError
from mens.model.generate import Constraint, chat_input_ids, stream_tokens
from mens.model.inference import LoadedModel


class ChatSession:
    """`ask(text)` streams the model's answer to `text` given the conversation so far, then remembers both."""

    def __init__(self, loaded: LoadedModel, *, constraint: Constraint | None = None, max_new_tokens: int = 512,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None):
        self.loaded = loaded
        self.constraint = constraint
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.messages: list[dict[str, str]] = []

    @property
    def context_length(self) -> int | None:
        """The model's position limit from its config (None when the config names none)."""
        return self.loaded.context_length

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The tokens the model sees for `messages`, with the trained system prompt first when they carry none."""
        return chat_input_ids(self.loaded.tokenizer, messages, self.loaded.system_prompt)

    def _fitting(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt ids of `messages` minus the oldest turns that do not fit beside `max_new_tokens` new tokens."""
        limit = self.context_length
        ids = self.prompt_ids(messages)
        while limit is not None and len(ids) + self.max_new_tokens > limit and len(messages) > 1:
            messages[:] = messages[2:] if len(messages) > 2 else messages[1:]  # drop one request and its answer
            ids = self.prompt_ids(messages)
        if limit is not None and len(ids) + self.max_new_tokens > limit:
            raise UsageError(f"the message takes {len(ids)} tokens and --max-new-tokens {self.max_new_tokens} more; "
                             f"the model reads at most {limit}: shorten the message or lower --max-new-tokens")
        return ids

    def ask(self, text: str) -> Iterator[str]:
        """Stream the answer to `text` (pieces as they are decoded); the turn is kept once the answer is done."""
        messages = [*self.messages, {"role": "user", "content": text}]
        ids = self._fitting(messages)
        seed = None if self.seed is None else self.seed + len(self.messages)  # a new draw per turn, reproducible
        answer = []
        for piece in stream_tokens(self.loaded.model, self.loaded.tokenizer, ids,
                                   max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                                   seed=seed, constraint=self.constraint):
            answer.append(piece)
            yield piece
        self.messages = [*messages, {"role": "assistant", "content": "".join(answer)}]

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.messages = []
