"""Error answers of the HTTP app, in the shape each API's clients parse.

`/api/*` (Ollama) answers `{"error": "message"}`; every other path answers OpenAI's
`{"error": {"message", "type", "param", "code"}}`. Once a stream has started, an error becomes the
stream's last event instead: an SSE `data: {"error": {...}}` followed by `data: [DONE]`, or an NDJSON
`{"error": "message"}` line.
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse


class ApiError(Exception):
    """A request the server answers with `status` and a message (never a traceback)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_


class ClientGone(Exception):
    """The client closed its connection; nothing more needs to be computed or sent."""


def safe_text(text: str) -> str:
    """`text` with lone surrogates escaped, so any message can be encoded as UTF-8 JSON."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/")


def error_body(path: str, message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    message = safe_text(message)
    if is_ollama_path(path):
        return {"error": message}
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(path: str, status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(path, message, type_, param, code), status_code=status, headers=headers)


def api_error_response(path: str, exc: ApiError) -> JSONResponse:
    return error_response(path, exc.status, exc.message, exc.type, exc.param, exc.code)


def sse_error(exc: ApiError) -> bytes:
    """The SSE event that ends a started OpenAI stream with an error (`[DONE]` follows it)."""
    body = {"error": {"message": safe_text(exc.message), "type": exc.type, "param": exc.param, "code": exc.code}}
    return f"data: {json.dumps(body)}\n\n".encode()


def ndjson_error(exc: ApiError) -> bytes:
    """The NDJSON line that ends a started Ollama stream with an error."""
    return (json.dumps({"error": safe_text(exc.message)}) + "\n").encode()
