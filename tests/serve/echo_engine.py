"""A fake engine for the API-conformance tests: it records every request and answers with text that shows what
reached it (the seed, then numbered words), so a test can see options, seeds and roles arrive as sent."""

from __future__ import annotations

from collections.abc import Iterator

from mens.model.engine import GenerationRequest, SequentialBatch, Usage


class EchoEngine(SequentialBatch):
    """Answers "seed=S w1 w2 ..." (`words` pieces, fewer if max_tokens says so); one token per word of prompt."""

    model_id = "mens-echo"
    constrained_language = None

    def __init__(self, words: int = 5, context_length: int = 64, fail_after: int | None = None):
        self.words, self.context_length, self.fail_after = words, context_length, fail_after
        self.requests: list[GenerationRequest] = []

    def count_tokens(self, request: GenerationRequest) -> int:
        if request.messages is not None:
            return 2 + sum(len(m["content"].split()) for m in request.messages)
        return len((request.prompt or "").split())

    def stream(self, request: GenerationRequest, usage: Usage) -> Iterator[str]:
        self.requests.append(request)
        usage.prompt_tokens = self.count_tokens(request)
        pieces = [f"seed={request.seed} "] + [f"w{i} " for i in range(1, self.words)]
        for i, piece in enumerate(pieces[: request.max_tokens]):
            if self.fail_after is not None and i >= self.fail_after:
                raise RuntimeError("engine exploded")
            usage.completion_tokens += 1
            yield piece

    @staticmethod
    def answer(seed: int | None = None, words: int = 5) -> str:
        return "".join([f"seed={seed} "] + [f"w{i} " for i in range(1, words)])
