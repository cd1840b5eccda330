"""The real engine: a loaded Hugging Face model (run or merged directory) behind the `Engine` protocol."""

from __future__ import annotations

from collections.abc import Iterator

from mens.lang import Language
from mens.model.constraint import language_constraint
from mens.model.generate import chat_input_ids, stream_tokens
from mens.model.inference import LoadedModel
from mens.serve.engine import GenerationRequest, Usage

MIN_TEMPERATURE = 1e-6
"""A smaller temperature decodes greedily (logits / T would overflow float32)."""
MIN_TOP_P = 1e-6
"""A smaller top_p is raised to this; both keep only the most likely token (its probability is >= 1/vocab)."""


class HFEngine:
    def __init__(self, loaded: LoadedModel, language: Language | None = None):
        self.loaded = loaded
        self.model_id = loaded.model_id
        self.language = language
        self.constrained_language = language.name if language is not None else None

    @property
    def context_length(self) -> int | None:
        """The model's position limit from its config (None when the config names none)."""
        return self.loaded.context_length

    def count_tokens(self, request: GenerationRequest) -> int:
        return len(self.prompt_ids(request))

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        tok = self.loaded.tokenizer
        if request.messages is not None:
            return chat_input_ids(tok, request.messages, self.loaded.system_prompt)
        return tok(request.prompt or "", add_special_tokens=False)["input_ids"]

    def stream(self, request: GenerationRequest, usage: Usage) -> Iterator[str]:
        ids = self.prompt_ids(request)
        usage.prompt_tokens = len(ids)
        constraint = language_constraint(self.language) if request.constrained and self.language else None

        def count(_token: int) -> None:
            usage.completion_tokens += 1

        # Below these floors the float32 sampling maths underflows (no token left, or inf/inf = NaN); the
        # floors choose the same tokens as any smaller value would: the most likely one.
        temperature = 0.0 if request.temperature < MIN_TEMPERATURE else request.temperature
        top_p = max(request.top_p, MIN_TOP_P)
        yield from stream_tokens(self.loaded.model, self.loaded.tokenizer, ids, max_new_tokens=request.max_tokens,
                                 temperature=temperature, top_p=top_p, seed=request.seed,
                                 constraint=constraint, on_token=count, should_stop=request.cancelled.is_set)
