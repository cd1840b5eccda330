"""The `tool_trace` record (one tool call and its outcome) and its normalization into a train pair.

Schema: mens-reference `tool_trace_record.schema.json` (upstream ToolTraceRecord). The prompt and response
shapes copy upstream's mix normalization. Run: used by `mens corpus pairs` and `mens corpus mix`.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from mens.corpus.jsonrow import parse_json_value

TOOL_TRACE_FIELDS = ("task_prompt", "tool_name", "arguments_json", "result_json", "success")
TOOL_PROMPT = ("[vox_tool_supervision]\nTask:\n{task}\n\nRespond with a single JSON object describing the tool "
               "call and outcome. Use keys: tool_name (string), arguments (object), result (any), "
               "success (boolean).\n")


class ToolTraceRecord(BaseModel):
    """One tool invocation from an agent session (record_format: tool_trace)."""

    model_config = ConfigDict(extra="allow")
    task_prompt: str = Field(description="User or system text that triggered the tool call")
    tool_name: str = Field(description="Registered tool name (MCP or internal)")
    arguments_json: str = Field(description="JSON-serialized arguments object (string field, not nested object)")
    result_json: str = Field(description="JSON-serialized tool result payload")
    success: bool
    followup_text: str | None = Field(default=None, description="If set, becomes the training response")
    session_id: str | None = Field(default=None, description="Emitted as source tool_trace:<id>")


def is_tool_trace(obj: dict) -> bool:
    """True when `obj` looks like a tool_trace record (has its required keys and no prompt/response)."""
    return all(k in obj for k in ("task_prompt", "tool_name")) and "response" not in obj


def _json_or_text(raw: str):
    """The JSON value held in a string field, or the string itself when it is not JSON that can be kept
    (malformed, nested without bound, or holding a lone surrogate)."""
    value, problem = parse_json_value(raw)
    return raw if problem else value


def tool_trace_to_pair(rec: ToolTraceRecord) -> dict:
    """The train-pair row for a tool trace: fixed supervision prompt, followup text or compact JSON answer."""
    if rec.followup_text and rec.followup_text.strip():
        response = rec.followup_text
    else:
        response = json.dumps({"tool_name": rec.tool_name, "arguments": _json_or_text(rec.arguments_json),
                               "result": _json_or_text(rec.result_json), "success": rec.success},
                              separators=(",", ":"), ensure_ascii=False)
    row = {"prompt": TOOL_PROMPT.format(task=rec.task_prompt), "response": response, "category": "tool_trace",
           "rating": 4 if rec.success else 2, "lane": "vox_tooling", "response_mode": "structured",
           "task_family": "tool_trace"}
    if rec.session_id:
        row["source"] = f"tool_trace:{rec.session_id}"
    return row
