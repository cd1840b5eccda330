"""Request bodies of the OpenAI and Ollama endpoints (unknown fields are ignored, as those APIs do).

Every value the engine uses is checked here, so a bad one is a 400 naming the field, never a 500:
floats are finite and in range (0 <= temperature <= 2, 0 < top_p <= 1), seeds fit torch's generator
(-2**63 .. 2**64-1), and text holds no lone surrogates (JSON allows "\\ud800"; UTF-8 and tokenizers do not).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
"""The seeds `torch.Generator.manual_seed` accepts."""
MAX_STOPS, MAX_STOP_CHARS = 16, 1000
"""Stop strings are scanned after every token: a bounded number of bounded strings."""


def _utf8(text: str) -> str:
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raise ValueError(f"text holds a lone UTF-16 surrogate (U+{ord(ch):04X}) at character {i}; "
                             "send valid Unicode (escape pairs like \\ud83d\\ude00 together)")
    return text


def _not_zero(n: int) -> int:
    if n == 0:
        raise ValueError("0 asks for no tokens; send a positive number, or -1 for this server's limit")
    return n


Text = Annotated[str, AfterValidator(_utf8)]
Stop = Annotated[str, Field(max_length=MAX_STOP_CHARS), AfterValidator(_utf8)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Seed = Annotated[int, Field(ge=MIN_SEED, le=MAX_SEED)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: Text


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    seed: Seed | None = None
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    constrained: bool | None = Field(default=None, description="mens extension: force language-constrained decoding.")

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_Sampling):
    prompt: Text


class OllamaOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    num_predict: Annotated[int, Field(ge=-2), AfterValidator(_not_zero)] | None = None
    """Ollama's -1 (no limit) and -2 (fill the context) mean this server's own limit."""
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    seed: Seed | None = None
    stop: Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = None

    def max_tokens(self) -> int | None:
        return None if self.num_predict is None or self.num_predict < 0 else self.num_predict


class OllamaGenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    prompt: Text
    system: Text | None = None
    raw: bool = False
    stream: bool = True
    options: OllamaOptions = Field(default_factory=OllamaOptions)


class OllamaChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = True
    options: OllamaOptions = Field(default_factory=OllamaOptions)
