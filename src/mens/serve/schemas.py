"""Request bodies of the OpenAI and Ollama endpoints.

Every value the engine uses is checked here, so a bad one is a 400 naming the field, never a 500:
floats are finite and in range (0 <= temperature <= 2, 0 < top_p <= 1), seeds fit torch's generator
(-2**63 .. 2**64-1), and text holds no lone surrogates (JSON allows "\\ud800"; UTF-8 and tokenizers do not).

What mens cannot honour is refused, never ignored (the table is in docs/serving.md):
- a field neither API defines is a 400 naming it (`extra="forbid"`, error code `unknown_parameter`);
- a field mens does not implement (tools, logprobs, response formats, penalties, images, thinking...) is taken
  only with the value that asks for nothing (null, false, 0, [], {"type": "text"}), which clients send by
  default; any other value is a 400 naming it (code `unsupported_parameter`);
- fields that cannot change the answer (user, metadata, cache hints, Ollama's keep_alive and load options) are
  taken and have no effect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from mens.serve.errors import ApiError

MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
"""The seeds `torch.Generator.manual_seed` accepts."""
MAX_STOPS, MAX_STOP_CHARS = 16, 1000
"""Stop strings are scanned after every token: a bounded number of bounded strings."""
MAX_CHOICES = 16
"""Most answers one request may ask for (n, times the number of prompts of a completion): each is a full
generation holding the engine in turn."""

UNSUPPORTED = "unsupported"
"""Error type of a known parameter that mens does not implement (the app answers code `unsupported_parameter`)."""


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


def _refuse(message: str, kind: str = UNSUPPORTED) -> PydanticCustomError:
    """A validation error whose message is `message` as is (pydantic would prefix "Value error, ")."""
    return PydanticCustomError(kind, "{reason}", {"reason": message})


def _only(accepts: Callable[[Any], bool], reason: str) -> AfterValidator:
    """A field mens does not implement: values `accepts` says ask for nothing pass; others get 400 `reason`."""

    def check(value: Any) -> Any:
        if value is None or accepts(value):
            return value
        raise _refuse(f"{reason} (got {str(value)[:80]!r})")

    return AfterValidator(check)


def _is_false(v: Any) -> bool:
    return v is False


def _is_zero(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and v == 0


def _is_one(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and v == 1


def _is_empty(v: Any) -> bool:
    return v in ("", [], {})


def _never(_v: Any) -> bool:
    return False


Text = Annotated[str, AfterValidator(_utf8)]
Stop = Annotated[str, Field(max_length=MAX_STOP_CHARS), AfterValidator(_utf8)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Seed = Annotated[int, Field(ge=MIN_SEED, le=MAX_SEED)]
NoEffect = Any
"""A field taken and ignored because it cannot change the answer (an identifier, a cache or load hint)."""

NO_TOOLS = "tools are not supported: this server answers with text only; leave it out or send []"
NO_LOGPROBS = "log probabilities are not returned by this server; leave it out or send false/0"


def _content_text(value: Any) -> Any:
    """OpenAI message content: a string, or an array of text parts (joined by newlines, as vLLM does);
    image, audio and file parts are refused (this server reads text only)."""
    if not isinstance(value, list):
        return value
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str) and set(part) <= {"type", "text"}:
            texts.append(part["text"])
        elif kind in ("image_url", "input_audio", "file", "refusal"):
            raise _refuse(f"part {i} is a {kind!r} part; this server reads text only: send "
                          "[{\"type\": \"text\", \"text\": ...}] parts or a string")
        else:
            raise _refuse(f"part {i} is not a text part {{\"type\": \"text\", \"text\": str}}; send a string "
                          "or text parts", "content_part")
    return "\n".join(texts)


class ChatMessage(BaseModel):
    """An OpenAI chat message. `developer` (OpenAI's newer name for system instructions) acts as `system`."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[Text | None, BeforeValidator(_content_text)] = None
    name: NoEffect = None
    """A participant's name: chat templates take none, so it is accepted and not passed on."""
    tool_call_id: NoEffect = None
    tool_calls: Annotated[Any, _only(_is_empty, NO_TOOLS)] = None
    function_call: Annotated[Any, _only(_never, NO_TOOLS)] = None
    refusal: Annotated[Any, _only(_never, "refusal messages are not supported; send the text as content")] = None
    audio: Annotated[Any, _only(_never, "audio is not supported: this server reads text only")] = None

    @model_validator(mode="after")
    def _content_needed(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise _refuse(f"content is required for a {self.role} message", "missing")
        return self

    def for_template(self) -> dict[str, str]:
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content or ""}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None
    """A last chunk with no choices and the request's usage, before `[DONE]`."""
    include_obfuscation: NoEffect = None
    """Random padding against length side channels; this server sends none (no effect on the answer)."""


class _Sampling(BaseModel):
    """What both OpenAI generation endpoints take. null means the default, as in OpenAI's API."""

    model_config = ConfigDict(extra="forbid")
    model: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature | None = None
    """Default 0: greedy decoding (OpenAI's default is 1; greedy suits code and is reproducible)."""
    top_p: TopP | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    seed: Seed | None = None
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    constrained: bool | None = Field(default=None, description="mens extension: force language-constrained decoding.")
    frequency_penalty: Annotated[Any, _only(_is_zero, "frequency_penalty is not supported; leave it out or send 0")] \
        = None
    presence_penalty: Annotated[Any, _only(_is_zero, "presence_penalty is not supported; leave it out or send 0")] \
        = None
    logit_bias: Annotated[Any, _only(_is_empty, "logit_bias is not supported; leave it out or send {}")] = None
    user: NoEffect = None
    metadata: NoEffect = None
    service_tier: NoEffect = None
    store: Annotated[Any, _only(_is_false, "this server stores no completions; leave store out or send false")] = None

    @property
    def temp(self) -> float:
        return 0.0 if self.temperature is None else self.temperature

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """OpenAI's newer name for max_tokens; either may be sent (both: they must agree)."""
    logprobs: Annotated[Any, _only(_is_false, NO_LOGPROBS)] = None
    top_logprobs: Annotated[Any, _only(_is_zero, NO_LOGPROBS)] = None
    tools: Annotated[Any, _only(_is_empty, NO_TOOLS)] = None
    tool_choice: Annotated[Any, _only(lambda v: v in ("none", "auto"), NO_TOOLS)] = None
    parallel_tool_calls: NoEffect = None
    """Qualifies tools, which are refused: no effect on its own."""
    functions: Annotated[Any, _only(_is_empty, NO_TOOLS)] = None
    function_call: Annotated[Any, _only(lambda v: v in ("none", "auto"), NO_TOOLS)] = None
    response_format: Annotated[Any, _only(lambda v: v == {"type": "text"},
                                         "only {\"type\": \"text\"} is supported (no JSON mode or schema); "
                                         "ask for JSON in the prompt instead")] = None
    modalities: Annotated[Any, _only(lambda v: v == ["text"], "this server answers with text only; send [\"text\"]")] \
        = None
    audio: Annotated[Any, _only(_never, "audio output is not supported: this server answers with text only")] = None
    prediction: Annotated[Any, _only(_never, "predicted outputs are not supported; leave prediction out")] = None
    reasoning_effort: Annotated[Any, _only(lambda v: v == "none", "this model does not reason; leave "
                                          "reasoning_effort out")] = None
    verbosity: Annotated[Any, _only(_never, "verbosity is not supported; leave it out")] = None
    web_search_options: Annotated[Any, _only(_never, "web search is not supported; leave it out")] = None
    moderation: Annotated[Any, _only(_never, "moderation is not supported; leave it out")] = None
    prompt_cache_key: NoEffect = None
    prompt_cache_options: NoEffect = None
    prompt_cache_retention: NoEffect = None
    safety_identifier: NoEffect = None

    def max_new(self) -> tuple[int | None, str]:
        """The answer's token budget and the name it was sent under."""
        a, b = self.max_completion_tokens, self.max_tokens
        if a is not None and b is not None and a != b:
            raise ApiError(400, f"max_completion_tokens={a} and max_tokens={b} disagree; send one of them",
                           param="max_completion_tokens")
        return (a, "max_completion_tokens") if a is not None else (b, "max_tokens")


def _prompts(value: Any) -> Any:
    """A completion prompt: a string or a list of strings (token-id arrays are refused)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if not value:
            raise _refuse("prompt is an empty list; send a string or a list of strings", "prompt")
        if any(isinstance(x, int | list) and not isinstance(x, bool) for x in value):
            raise _refuse("token-id prompts are not supported; send text (a string or a list of strings)")
    return value


class CompletionRequest(_Sampling):
    prompt: Annotated[list[Text], BeforeValidator(_prompts), Field(max_length=MAX_CHOICES)]
    """One answer (times n) per prompt, in order."""
    best_of: int | None = Field(default=None, ge=1)
    echo: Annotated[Any, _only(_is_false, "echo is not supported; leave it out or send false")] = None
    logprobs: Annotated[Any, _only(_never, NO_LOGPROBS)] = None
    suffix: Annotated[Any, _only(_is_empty, "suffix (insertion) is not supported; leave it out")] = None

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n") or 1
        if value is not None and value != n:
            raise _refuse(f"best_of={value} is not supported (it must equal n={n}); leave it out")
        return value


# Ollama ------------------------------------------------------------------------------------------------------------

def _stops(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class OllamaOptions(BaseModel):
    """Ollama's `options`. Load and runtime options that cannot change the answer are taken with no effect;
    sampling options mens does not implement are taken only at their neutral values."""

    model_config = ConfigDict(extra="forbid")
    num_predict: Annotated[int, Field(ge=-2), AfterValidator(_not_zero)] | None = None
    """Ollama's -1 (no limit) and -2 (fill the context) mean this server's own limit."""
    temperature: Temperature | None = None
    """Default 0: greedy decoding (Ollama's default is 0.8; greedy suits code and is reproducible)."""
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Annotated[list[Stop], BeforeValidator(_stops), Field(max_length=MAX_STOPS)] | None = None
    top_k: Annotated[Any, _only(lambda v: _is_zero(v) or (isinstance(v, int) and v < 0),
                               "top_k is not supported (this server samples with temperature and top_p); "
                               "leave it out or send 0")] = None
    min_p: Annotated[Any, _only(_is_zero, "min_p is not supported; leave it out or send 0")] = None
    typical_p: Annotated[Any, _only(_is_one, "typical_p is not supported; leave it out or send 1")] = None
    tfs_z: Annotated[Any, _only(_is_one, "tfs_z is not supported; leave it out or send 1")] = None
    repeat_penalty: Annotated[Any, _only(_is_one, "repeat_penalty is not supported; leave it out or send 1")] = None
    presence_penalty: Annotated[Any, _only(_is_zero, "presence_penalty is not supported; leave it out or send 0")] \
        = None
    frequency_penalty: Annotated[Any, _only(_is_zero, "frequency_penalty is not supported; leave it out or send 0")] \
        = None
    mirostat: Annotated[Any, _only(_is_zero, "mirostat is not supported; leave it out or send 0")] = None
    # No effect on the answer: they tune the neutral-valued options above, or how Ollama loads and runs a model
    # (mens loads the model once, with its own context length).
    repeat_last_n: NoEffect = None
    penalize_newline: NoEffect = None
    mirostat_tau: NoEffect = None
    mirostat_eta: NoEffect = None
    num_keep: NoEffect = None
    num_ctx: NoEffect = None
    num_batch: NoEffect = None
    num_gpu: NoEffect = None
    main_gpu: NoEffect = None
    num_thread: NoEffect = None
    numa: NoEffect = None
    low_vram: NoEffect = None
    f16_kv: NoEffect = None
    logits_all: NoEffect = None
    vocab_only: NoEffect = None
    use_mmap: NoEffect = None
    use_mlock: NoEffect = None
    embedding_only: NoEffect = None

    def max_tokens(self) -> int | None:
        return None if self.num_predict is None or self.num_predict < 0 else self.num_predict


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: Text = ""
    images: Annotated[Any, _only(_is_empty, "images are not supported: this model reads text only")] = None
    tool_calls: Annotated[Any, _only(_is_empty, "tools are not supported by this model")] = None
    tool_name: NoEffect = None
    thinking: NoEffect = None
    """An earlier answer's reasoning trace: templates drop it, so it has no effect."""

    def for_template(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


class _OllamaBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Text | None = None
    stream: bool | None = None
    """Absent or null: true (NDJSON), as in Ollama."""
    options: OllamaOptions | None = None
    format: Annotated[Any, _only(_is_empty, "format (JSON mode or a schema) is not supported; ask for JSON in the "
                                           "prompt instead")] = None
    think: Annotated[Any, _only(_is_false, "this model does not support thinking; leave think out or send false")] \
        = None
    logprobs: Annotated[Any, _only(_is_false, NO_LOGPROBS)] = None
    top_logprobs: Annotated[Any, _only(_is_zero, NO_LOGPROBS)] = None
    keep_alive: NoEffect = None
    """The model stays loaded while the server runs."""
    truncate: NoEffect = None
    """Too long a prompt is refused with 400 whatever this says."""
    shift: NoEffect = None
    """An answer stops at the end of the context whatever this says (done_reason "length")."""

    @property
    def opts(self) -> OllamaOptions:
        return self.options or OllamaOptions()

    @property
    def streaming(self) -> bool:
        return self.stream is not False


class OllamaGenerateRequest(_OllamaBase):
    prompt: Text = ""
    """Absent or empty: Ollama's "load the model" call (nothing is generated)."""
    system: Text | None = None
    raw: bool | None = False
    suffix: Annotated[Any, _only(_is_empty, "suffix (insertion) is not supported; leave it out")] = None
    template: Annotated[Any, _only(_is_empty, "a Go prompt template is not supported: the model's own chat "
                                             "template is used; leave template out or send raw=true")] = None
    context: Annotated[Any, _only(_is_empty, "context (token history) is not supported; use /api/chat with "
                                            "messages")] = None
    images: Annotated[Any, _only(_is_empty, "images are not supported: this model reads text only")] = None
    width: Annotated[Any, _only(_never, "image generation is not supported")] = None
    height: Annotated[Any, _only(_never, "image generation is not supported")] = None
    steps: Annotated[Any, _only(_never, "image generation is not supported")] = None


class OllamaChatRequest(_OllamaBase):
    messages: list[OllamaMessage] = Field(default_factory=list)
    """Empty: Ollama's "load the model" call (nothing is generated)."""
    tools: Annotated[Any, _only(_is_empty, "tools are not supported by this model; leave it out or send []")] = None


class OllamaShowRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Text | None = None
    name: Text | None = None
    """The field's older name."""
    verbose: NoEffect = None
