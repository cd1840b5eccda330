"""The HTTP app: OpenAI (`/v1/*`) and Ollama (`/api/*`) shapes over one generation engine.

Generation is CPU/GPU-bound and the model is shared, so requests run one at a time and wait in a
bounded queue (`mens.serve.scheduler`: 503 when full, a deadline per request, dropped when the client
leaves). Bodies are bounded whatever their transfer encoding and the API key is checked first
(`mens.serve.guards`). Every error is JSON in the shape of the path's API (`mens.serve.errors`), with a
4xx code for what the client sent; prompts are checked against the model's context before they queue.
Run: `mens serve RUN --port 8000`.
"""

from __future__ import annotations

import logging
import time
import uuid

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from mens import __version__
from mens.serve.engine import Engine, GenerationRequest, Usage
from mens.serve.errors import ApiError, ClientGone, api_error_response, error_response
from mens.serve.guards import ApiKeyGuard, BodyLimit
from mens.serve.scheduler import Job, Scheduler
from mens.serve.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    OllamaChatRequest,
    OllamaGenerateRequest,
)
from mens.serve.streams import JobStream, ndjson_lines, sse_events

log = logging.getLogger("mens.serve")


def create_app(engine: Engine, *, api_key: str | None = None, max_request_bytes: int = 1_000_000,
               max_tokens_limit: int = 2048, default_max_tokens: int = 256, max_queue: int = 32,
               constrained_default: bool = False, request_timeout_s: float | None = 300.0,
               body_timeout_s: float = 30.0) -> FastAPI:
    """Build the app around `engine`. `constrained_default` applies language-constrained decoding to all requests.

    `request_timeout_s` bounds each request from arrival (queue wait included): see `mens.serve.scheduler`.
    """
    app = FastAPI(title="mens serve", version=__version__)
    scheduler = Scheduler(engine, max_queue=max_queue, request_timeout_s=request_timeout_s)
    app.state.scheduler = scheduler
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, body_timeout_s=body_timeout_s)
    app.add_middleware(ApiKeyGuard, api_key=api_key)  # added last: runs first, before any body is read
    _add_error_handlers(app)

    async def _start(request: Request, *, messages=None, prompt=None, max_tokens, temperature, top_p, seed, stop,
                     constrained) -> Job:
        """Check a generation and wait for the engine; the returned Job must be closed."""
        if max_tokens is not None and max_tokens > max_tokens_limit:
            raise ApiError(400, f"max_tokens={max_tokens} exceeds this server's limit of {max_tokens_limit}",
                           param="max_tokens")
        want = constrained_default if constrained is None else constrained
        if want and engine.constrained_language is None:
            raise ApiError(400, "this engine cannot constrain decoding; start the server with --constrained",
                           param="constrained")
        req = GenerationRequest(messages=messages, prompt=prompt, max_tokens=max_tokens or default_max_tokens,
                                temperature=temperature, top_p=top_p, seed=seed, stop=stop, constrained=want)
        await _check_prompt(engine, req, explicit_max_tokens=max_tokens is not None)
        return await scheduler.start(req, request.is_disconnected)

    async def _complete(request: Request, **fields) -> tuple[str, Usage, str]:
        job = await _start(request, **fields)
        try:
            return await job.collect(), job.usage, job.finish
        finally:
            job.close()

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": engine.model_id, "constrained": engine.constrained_language,
                "busy": scheduler.busy, "queued": scheduler.waiting,
                "shutting_down": scheduler.stop_at is not None}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": engine.model_id, "object": "model", "created": 0,
                                            "owned_by": "mens"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        fields = _sampling(body) | {"messages": [m.model_dump() for m in body.messages]}
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(delta: dict, finish=None) -> dict:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": engine.model_id,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        if body.stream:
            job = await _start(request, **fields)
            events = sse_events(job, chunk({"role": "assistant", "content": ""}),
                                lambda piece: chunk({"content": piece}), lambda j: chunk({}, j.finish))
            return JobStream(events, job, "text/event-stream")
        text, usage, finish = await _complete(request, **fields)
        return {"id": cid, "object": "chat.completion", "created": created, "model": engine.model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": finish}],
                "usage": _usage_json(usage)}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        fields = _sampling(body) | {"prompt": _nonempty(body.prompt)}
        cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(text: str, finish=None) -> dict:
            return {"id": cid, "object": "text_completion", "created": created, "model": engine.model_id,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish}]}

        if body.stream:
            job = await _start(request, **fields)
            events = sse_events(job, None, chunk, lambda j: chunk("", j.finish))
            return JobStream(events, job, "text/event-stream")
        text, usage, finish = await _complete(request, **fields)
        return {**chunk(text, finish), "usage": _usage_json(usage)}

    def _ollama_fields(options, *, messages=None, prompt=None) -> dict:
        return {"messages": messages, "prompt": prompt, "max_tokens": options.max_tokens(),
                "temperature": options.temperature, "top_p": options.top_p, "seed": options.seed,
                "stop": options.stop or [], "constrained": None}

    @app.post("/api/generate")
    async def ollama_generate(body: OllamaGenerateRequest, request: Request):
        if not body.prompt:  # Ollama's "load the model" call: nothing to generate
            return {"model": engine.model_id, "created_at": _now(), "response": "", "done": True,
                    "done_reason": "load"}
        if body.raw:
            fields = _ollama_fields(body.options, prompt=body.prompt)
        else:
            msgs = ([{"role": "system", "content": body.system}] if body.system else [])
            fields = _ollama_fields(body.options, messages=msgs + [{"role": "user", "content": body.prompt}])
        return await _ollama(request, fields, body.stream, lambda piece: {"response": piece})

    @app.post("/api/chat")
    async def ollama_chat(body: OllamaChatRequest, request: Request):
        fields = _ollama_fields(body.options, messages=[m.model_dump() for m in body.messages])
        return await _ollama(request, fields, body.stream,
                             lambda piece: {"message": {"role": "assistant", "content": piece}})

    async def _ollama(request: Request, fields: dict, stream: bool, shape) -> object:
        started = time.perf_counter()

        def final(usage: Usage, finish: str) -> dict:
            return {"model": engine.model_id, "created_at": _now(), **shape(""), "done": True, "done_reason": finish,
                    "total_duration": int((time.perf_counter() - started) * 1e9),
                    "prompt_eval_count": usage.prompt_tokens, "eval_count": usage.completion_tokens}

        if not stream:
            text, usage, finish = await _complete(request, **fields)
            return {**final(usage, finish), **shape(text)}
        job = await _start(request, **fields)
        lines = ndjson_lines(job, lambda piece: {"model": engine.model_id, "created_at": _now(), **shape(piece),
                                                 "done": False},
                             lambda j: final(j.usage, j.finish))
        return JobStream(lines, job, "application/x-ndjson")

    @app.get("/api/tags")
    async def ollama_tags():
        return {"models": [{"name": engine.model_id, "model": engine.model_id, "modified_at": "", "size": 0,
                            "details": {"format": "safetensors", "family": "mens"}}]}

    @app.get("/api/version")
    async def ollama_version():
        return {"version": __version__}

    @app.post("/api/embeddings")
    async def ollama_embeddings(request: Request):
        return error_response(request.url.path, 501, "embeddings are not served by mens; this server only "
                              "generates text", type_="not_implemented", code="not_implemented")

    @app.post("/generate")
    async def scorecard_generate(body: CompletionRequest, request: Request):
        """The original scorecard's `http_generate` shape: {prompt, max_tokens} -> {text, ...}."""
        fields = _sampling(body) | {"messages": [{"role": "user", "content": _nonempty(body.prompt)}]}
        text, usage, finish = await _complete(request, **fields)
        return {"text": text, "tokens_generated": usage.completion_tokens, "model": engine.model_id,
                "object": "text_completion", "choices": [{"text": text, "index": 0, "finish_reason": finish}]}

    return app


async def _check_prompt(engine: Engine, req: GenerationRequest, *, explicit_max_tokens: bool) -> None:
    """400 when the prompt is empty or leaves no room in the model's context; fit a default max_tokens in it."""
    count = getattr(engine, "count_tokens", None)
    if count is None:
        return
    param = "prompt" if req.prompt is not None else "messages"
    try:
        n = await anyio.to_thread.run_sync(count, req)
    except Exception as e:  # e.g. a chat template that refuses this order of roles
        raise ApiError(400, f"cannot build a prompt from {param}: {type(e).__name__}: {e}", param=param) from e
    if n == 0:
        raise ApiError(400, f"{param} gives an empty prompt (0 tokens); send some text", param=param)
    ctx = getattr(engine, "context_length", None)
    if not ctx:
        return
    if n >= ctx:
        raise ApiError(400, f"the prompt is {n} tokens but the model's context is {ctx} tokens, leaving no room for "
                       "an answer; shorten the prompt", param=param, code="context_length_exceeded")
    if explicit_max_tokens and n + req.max_tokens > ctx:
        raise ApiError(400, f"prompt ({n} tokens) + max_tokens ({req.max_tokens}) = {n + req.max_tokens} tokens "
                       f"exceeds the model's context of {ctx}; ask for at most {ctx - n} tokens",
                       param="max_tokens", code="context_length_exceeded")
    req.max_tokens = min(req.max_tokens, ctx - n)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        problems = []
        for err in exc.errors()[:3]:
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        return error_response(request.url.path, 400, "; ".join(problems) or "invalid request body", param=param)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return api_error_response(request.url.path, exc)

    @app.exception_handler(ClientGone)
    async def _gone(_request: Request, _exc: ClientGone):
        return Response(status_code=408)  # nobody reads it: the client has closed the connection

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return error_response(request.url.path, exc.status_code, str(exc.detail), code=str(exc.status_code),
                              headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s", request.url.path)
        return error_response(request.url.path, 500, f"internal error: {type(exc).__name__}; see the server log",
                              type_="server_error", code="internal")


def _sampling(body) -> dict:
    return {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed,
            "stop": body.stops(), "constrained": body.constrained}


def _nonempty(prompt: str) -> str:
    if not prompt:
        raise ApiError(400, "prompt is empty; send the text to continue", param="prompt")
    return prompt


def _usage_json(u: Usage) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
