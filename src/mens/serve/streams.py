"""Streamed answers: SSE (OpenAI) and NDJSON (Ollama) bodies over a `Job`, and a response that always frees it.

A stream starts only after its request holds the engine, so every refusal (full queue, timeout in the
queue, shutdown) is a plain JSON error; what goes wrong later ends the stream with an error event.
`JobStream` closes the job when the response ends for any reason (finished, client gone, task
cancelled), which stops generation and frees the engine: the engine never outlives its request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from mens.serve.errors import ApiError, ndjson_error, sse_error
from mens.serve.scheduler import Job

log = logging.getLogger("mens.serve")


class JobStream(StreamingResponse):
    def __init__(self, content: AsyncIterator[bytes], job: Job, media_type: str):
        super().__init__(content, media_type=media_type)
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.close()  # synchronous: runs even when this task is being cancelled
            try:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            except RuntimeError:  # still running: it ends at its next step, the job being closed
                pass


def _internal(e: Exception) -> ApiError:
    log.exception("streaming the answer failed")
    return ApiError(500, f"streaming the answer failed: {type(e).__name__}", type_="server_error", code="internal")


def sse_events(job: Job, first: Callable[[int], dict] | None, piece: Callable[[int, str], dict],
               final: Callable[[Job], dict], usage: Callable[[Job], dict] | None = None) -> AsyncIterator[bytes]:
    """`data: {chunk}` events for each answer of `job` in turn: `first(index)` (if any), one `piece(index, text)`
    per piece, `final(job)`; then `usage(job)` (if any) once every answer is done. An error event instead of the
    final chunk when an answer failed; always `data: [DONE]` last (unless the client left)."""

    async def events() -> AsyncIterator[bytes]:
        try:
            while True:
                if first is not None:
                    yield _sse(first(job.index))
                while (text := await job.next_piece()) is not None:
                    yield _sse(piece(job.index, text))
                if job.gone:
                    return
                if job.error is not None:
                    yield sse_error(job.error)
                    break
                yield _sse(final(job))
                if not job.next_choice():
                    if usage is not None:
                        yield _sse(usage(job))
                    break
        except Exception as e:
            yield sse_error(_internal(e))
        yield b"data: [DONE]\n\n"

    return events()


def ndjson_lines(job: Job, piece: Callable[[str], dict], final: Callable[[Job], dict]) -> AsyncIterator[bytes]:
    """One JSON line per piece, then `final(job)`, or an `{"error": ...}` line when the answer failed."""

    async def lines() -> AsyncIterator[bytes]:
        try:
            while (text := await job.next_piece()) is not None:
                yield _line(piece(text))
            if job.gone:
                return
            yield ndjson_error(job.error) if job.error is not None else _line(final(job))
        except Exception as e:
            yield ndjson_error(_internal(e))

    return lines()


def _sse(chunk: dict) -> bytes:
    return f"data: {json.dumps(chunk)}\n\n".encode()


def _line(obj: dict) -> bytes:
    return (json.dumps(obj) + "\n").encode()
