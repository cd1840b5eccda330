"""The HTTP app: OpenAI (`/v1/*`) and Ollama (`/api/*`) shapes over one generation engine.

Generation is CPU/GPU-bound and the model is shared, so requests run one at a time behind a lock
and wait in a bounded queue (503 when it is full) rather than crash the server. Errors use OpenAI's
JSON shape (`{"error": {"message", "type", "param", "code"}}`) with 4xx codes.
Run: `mens serve RUN --port 8000`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool

from mens import __version__
from mens.serve.engine import Engine, GenerationRequest, StopScanner, Usage
from mens.serve.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    OllamaChatRequest,
    OllamaGenerateRequest,
)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_


def _error(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def create_app(engine: Engine, *, api_key: str | None = None, max_request_bytes: int = 1_000_000,
               max_tokens_limit: int = 2048, default_max_tokens: int = 256, max_queue: int = 32,
               constrained_default: bool = False) -> FastAPI:
    """Build the app around `engine`. `constrained_default` applies language-constrained decoding to all requests."""
    app = FastAPI(title="mens serve", version=__version__)
    lock = asyncio.Lock()
    waiting = {"n": 0}

    @app.middleware("http")
    async def _guard(request: Request, call_next):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_request_bytes:
            return _error(413, f"request body is {size} bytes; the limit is {max_request_bytes}", code="too_large")
        if api_key and request.url.path not in ("/health",):
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {api_key}":
                return _error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                              type_="authentication_error", code="invalid_api_key")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{loc or 'body'}: {first.get('msg')}", param=loc or None)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        return _error(exc.status, exc.message, exc.type, exc.param, exc.code)

    def _gen_request(*, messages=None, prompt=None, max_tokens, temperature, top_p, seed, stop, constrained):
        if max_tokens is not None and max_tokens > max_tokens_limit:
            raise ApiError(400, f"max_tokens={max_tokens} exceeds this server's limit of {max_tokens_limit}",
                           param="max_tokens")
        want = constrained_default if constrained is None else constrained
        if want and engine.constrained_language is None:
            raise ApiError(400, "this engine cannot constrain decoding; start the server with --constrained",
                           param="constrained")
        return GenerationRequest(messages=messages, prompt=prompt, max_tokens=max_tokens or default_max_tokens,
                                 temperature=temperature, top_p=top_p, seed=seed, stop=stop, constrained=want)

    async def _run_stream(req: GenerationRequest, usage: Usage) -> AsyncIterator[str]:
        """Text pieces of one generation, holding the engine for its whole length."""
        if waiting["n"] >= max_queue:
            raise ApiError(503, f"server busy: {max_queue} requests already queued; retry later",
                           type_="server_error", code="overloaded")
        waiting["n"] += 1
        try:
            await lock.acquire()
        finally:  # also when the client goes away while waiting
            waiting["n"] -= 1
        try:
            scanner = StopScanner(req.stop)

            def pieces() -> Iterator[str]:
                # The engine produces a token per next(): closing this generator stops generation.
                for piece in engine.stream(req, usage):
                    out = scanner.feed(piece)
                    if out:
                        yield out
                    if scanner.stopped:
                        return
                tail = scanner.flush()
                if tail:
                    yield tail

            async for piece in iterate_in_threadpool(pieces()):
                yield piece
        finally:
            lock.release()

    async def _complete(req: GenerationRequest) -> tuple[str, Usage, str]:
        usage = Usage()
        parts = [p async for p in _run_stream(req, usage)]
        text = "".join(parts)
        finish = "length" if usage.completion_tokens >= req.max_tokens else "stop"
        return text, usage, finish

    def _usage_json(u: Usage) -> dict:
        return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": engine.model_id, "constrained": engine.constrained_language}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": engine.model_id, "object": "model", "created": 0,
                                            "owned_by": "mens"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        req = _gen_request(messages=[m.model_dump() for m in body.messages], max_tokens=body.max_tokens,
                           temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=body.stops(),
                           constrained=body.constrained)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            return _sse(_chat_chunks(req, cid, created))
        text, usage, finish = await _complete(req)
        return {"id": cid, "object": "chat.completion", "created": created, "model": engine.model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": finish}],
                "usage": _usage_json(usage)}

    async def _chat_chunks(req: GenerationRequest, cid: str, created: int) -> AsyncIterator[dict]:
        def chunk(delta: dict, finish=None) -> dict:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": engine.model_id,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield chunk({"role": "assistant", "content": ""})
        usage = Usage()
        async for piece in _run_stream(req, usage):
            yield chunk({"content": piece})
        yield chunk({}, "length" if usage.completion_tokens >= req.max_tokens else "stop")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        req = _gen_request(prompt=body.prompt, max_tokens=body.max_tokens, temperature=body.temperature,
                           top_p=body.top_p, seed=body.seed, stop=body.stops(), constrained=body.constrained)
        cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            async def chunks() -> AsyncIterator[dict]:
                usage = Usage()
                async for piece in _run_stream(req, usage):
                    yield {"id": cid, "object": "text_completion", "created": created, "model": engine.model_id,
                           "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                finish = "length" if usage.completion_tokens >= req.max_tokens else "stop"
                yield {"id": cid, "object": "text_completion", "created": created, "model": engine.model_id,
                       "choices": [{"index": 0, "text": "", "finish_reason": finish}]}

            return _sse(chunks())
        text, usage, finish = await _complete(req)
        return {"id": cid, "object": "text_completion", "created": created, "model": engine.model_id,
                "choices": [{"index": 0, "text": text, "finish_reason": finish}], "usage": _usage_json(usage)}

    def _ollama_request(*, messages=None, prompt=None, options) -> GenerationRequest:
        return _gen_request(messages=messages, prompt=prompt, max_tokens=options.num_predict,
                            temperature=options.temperature, top_p=options.top_p, seed=options.seed,
                            stop=options.stop or [], constrained=None)

    @app.post("/api/generate")
    async def ollama_generate(body: OllamaGenerateRequest):
        if body.raw:
            req = _ollama_request(prompt=body.prompt, options=body.options)
        else:
            msgs = ([{"role": "system", "content": body.system}] if body.system else [])
            req = _ollama_request(messages=msgs + [{"role": "user", "content": body.prompt}], options=body.options)
        return await _ollama(req, body.stream, lambda piece: {"response": piece})

    @app.post("/api/chat")
    async def ollama_chat(body: OllamaChatRequest):
        req = _ollama_request(messages=[m.model_dump() for m in body.messages], options=body.options)
        return await _ollama(req, body.stream, lambda piece: {"message": {"role": "assistant", "content": piece}})

    async def _ollama(req: GenerationRequest, stream: bool, shape) -> object:
        def base() -> dict:
            return {"model": engine.model_id, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

        def final(usage: Usage, started: float) -> dict:
            return {**base(), **shape(""), "done": True, "done_reason": "stop",
                    "total_duration": int((time.perf_counter() - started) * 1e9),
                    "prompt_eval_count": usage.prompt_tokens, "eval_count": usage.completion_tokens}

        started = time.perf_counter()
        if not stream:
            text, usage, _ = await _complete(req)
            return {**final(usage, started), **shape(text)}

        async def lines() -> AsyncIterator[bytes]:
            usage = Usage()
            async for piece in _run_stream(req, usage):
                yield (json.dumps({**base(), **shape(piece), "done": False}) + "\n").encode()
            yield (json.dumps(final(usage, started)) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.get("/api/tags")
    async def ollama_tags():
        return {"models": [{"name": engine.model_id, "model": engine.model_id, "modified_at": "", "size": 0,
                            "details": {"format": "safetensors", "family": "mens"}}]}

    @app.get("/api/version")
    async def ollama_version():
        return {"version": __version__}

    @app.post("/api/embeddings")
    async def ollama_embeddings():
        return _error(501, "embeddings are not served by mens; this server only generates text",
                      type_="not_implemented", code="not_implemented")

    @app.post("/generate")
    async def scorecard_generate(body: CompletionRequest):
        """The original scorecard's `http_generate` shape: {prompt, max_tokens} -> {text, ...}."""
        req = _gen_request(messages=[{"role": "user", "content": body.prompt}], max_tokens=body.max_tokens,
                           temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=body.stops(),
                           constrained=body.constrained)
        text, usage, finish = await _complete(req)
        return {"text": text, "tokens_generated": usage.completion_tokens, "model": engine.model_id,
                "object": "text_completion", "choices": [{"text": text, "index": 0, "finish_reason": finish}]}

    return app


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n".encode()
        except ApiError as e:  # e.g. queue full, raised before the first piece
            yield f"data: {json.dumps({'error': {'message': e.message, 'type': e.type, 'code': e.code}})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
