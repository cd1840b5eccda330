"""A scripted engine for the bench runner's tests: answers come from a function of (prompt, temperature, seed);
every `generate_batch` call and every single stream is logged, so a test sees how the runner asks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from mens.model.engine import GenerationRequest, SequentialBatch, Usage


class FakeEngine(SequentialBatch):
    """`answer(prompt, temperature, seed)` is the whole answer (streamed as one piece) to a chat's last message.

    `batches` holds one list per `generate_batch` call of (prompt, temperature, seed, constrained) per request;
    `streams` the same for each answer streamed (this engine's batch streams each request in turn).
    """

    model_id = "fake"

    def __init__(self, answer: Callable[[str, float, int | None], str], constrained_language: str | None = "python"):
        self.answer, self.constrained_language = answer, constrained_language
        self.batches: list[list[tuple]] = []
        self.streams: list[tuple] = []
        self.max_tokens: set[int] = set()

    @staticmethod
    def _key(request: GenerationRequest) -> tuple:
        return request.messages[-1]["content"], request.temperature, request.seed, request.constrained

    def stream(self, request: GenerationRequest, usage: Usage) -> Iterator[str]:
        self.streams.append(self._key(request))
        self.max_tokens.add(request.max_tokens)
        yield self.answer(request.messages[-1]["content"], request.temperature, request.seed)

    def generate_batch(self, requests: list[GenerationRequest], progress=None) -> list[str]:
        self.batches.append([self._key(r) for r in requests])
        return super().generate_batch(requests, progress)


def scripted(answers: dict[str, list[str]]) -> FakeEngine:
    """A FakeEngine answering `answers[prompt][seed % len(answers[prompt])]`."""
    return FakeEngine(lambda prompt, _t, seed: answers[prompt][(seed or 0) % len(answers[prompt])])
