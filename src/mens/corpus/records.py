"""The `train.jsonl` contract (schema `vox_dogfood_v1`): one instruction pair or chat per line.

Readers accept the original's aliases (`instruction`/`output`, `turns`); writers emit the canonical names.
This module is the contract between the corpus tools and the trainer. No torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mens.corpus.jsonrow import LongLine, decode_line, iter_lines, parse_row
from mens.corpus.limits import MAX_LINE_BYTES

SCHEMA_VERSION = "vox_dogfood_v1"


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class TrainPair(BaseModel):
    """One training row. Either `prompt` + `response`, or `messages` (which wins when both are present)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    prompt: str | None = Field(default=None, description="The user's request. Alias: instruction.")
    response: str | None = Field(default=None, description="The assistant's answer. Alias: output.")
    messages: list[Message] | None = Field(default=None, description="Multi-turn chat; alias: turns.")
    category: str = Field(default="general", description="Construct or task category tag.")
    rating: int | None = Field(default=None, ge=1, le=5, description="Quality 1-5; rows below min_rating drop.")
    schema_version: str = SCHEMA_VERSION
    source: str | None = Field(default=None, description="Where the row came from (path:line or generator).")
    constructs: list[str] = Field(default_factory=list, description="Declaration kinds in the response code.")
    lane: str | None = Field(default=None, description="Training lane, e.g. vox_codegen, vox_docs_qa.")

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data):
        if isinstance(data, dict):
            data = dict(data)
            if data.get("prompt") is None and "instruction" in data:
                data["prompt"] = data.pop("instruction")
            if data.get("response") is None and "output" in data:
                data["response"] = data.pop("output")
            if data.get("messages") is None and "turns" in data:
                data["messages"] = data.pop("turns")
        return data

    @field_validator("prompt", "response")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v

    @model_validator(mode="after")
    def _has_text(self) -> TrainPair:
        if self.messages:
            if self.messages[-1].role != "assistant":
                raise ValueError("the last message must be the assistant's (it is what the model learns)")
        elif self.prompt is None or self.response is None:
            missing = [k for k in ("prompt", "response") if getattr(self, k) is None]
            raise ValueError(f"missing {' and '.join(missing)} (or give messages)")
        return self

    def chat(self) -> list[dict[str, str]]:
        """The row as chat messages (no system prompt added here; the trainer's text policy decides)."""
        if self.messages:
            return [m.model_dump() for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}, {"role": "assistant", "content": self.response or ""}]


def codegen_row(language: str, prompt: str, response: str, *, category: str, rating: int, source: str, origin: str,
                constructs: list[str] | None = None, **extra) -> dict:
    """One prompt -> code training row as the generators write it (requests, bench dev tasks, synthetic programs,
    task pairs): the same fields in the same order, lane and task family named for the language."""
    row = {"prompt": prompt, "response": response, "category": category, "rating": rating,
           "schema_version": SCHEMA_VERSION, "source": source}
    if constructs is not None:
        row["constructs"] = constructs
    return {**row, "lane": f"{language}_codegen", "response_mode": "code_only", "task_family": f"{language}_codegen",
            "origin": origin, **extra}


@dataclass(frozen=True)
class BadLine:
    """A line that is not a valid record, with where it is and why."""

    path: str
    line: int
    reason: str
    raw: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def read_pairs(path: str | Path) -> Iterator[tuple[int, TrainPair | BadLine]]:
    """Yield `(line_no, TrainPair | BadLine)` for every non-blank line; never raises on bad content.

    Uses the corpus tools' bounded reader (mens.corpus.jsonrow): line size, JSON depth, lone surrogates and NUL
    characters are checked the same way for the trainer as for `mens corpus validate`.
    """
    path = Path(path)
    for no, raw in iter_lines(path):
        if isinstance(raw, LongLine):
            yield no, BadLine(str(path), no, f"line is {raw.size} bytes > {MAX_LINE_BYTES} allowed", "")
            continue
        text = decode_line(raw)
        if isinstance(text, tuple):
            yield no, BadLine(str(path), no, f"not UTF-8 ({text[0].split(': ', 1)[1]})", text[1].rstrip("\n"))
            continue
        obj = parse_row(text)
        if isinstance(obj, str):
            code, detail = obj.split(": ", 1)
            reason = f"malformed JSON: {detail}" if code == "malformed_json" else obj
            yield no, BadLine(str(path), no, reason, text.rstrip("\n"))
            continue
        try:
            yield no, TrainPair.model_validate(obj)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "record"
            yield no, BadLine(str(path), no, f"{where}: {first['msg']}", text.rstrip("\n"))
