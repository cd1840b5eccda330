"""The HTTP app: OpenAI (`/v1/*`) and Ollama (`/api/*`) shapes over one generation engine.

Generation is CPU/GPU-bound and the model is shared, so requests run one at a time and wait in a
bounded queue (`mens.serve.scheduler`: 503 when full, a deadline per request, dropped when the client
leaves). Bodies are bounded whatever their transfer encoding and the API key is checked first
(`mens.serve.guards`). Every error is JSON in the shape of the path's API (`mens.serve.errors`), with a
4xx code for what the client sent; prompts are checked against the model's context before they queue.

Conformance with the two APIs as their official clients (`openai`, `ollama`) use them: a body is read as JSON
whatever its content type (Ollama's own examples send `curl -d`, which says form-encoded); a model name other
than the served one (its id, `ID:latest`, or `mens`) gets 404; what an API defines but mens does not implement is
refused with a 400 naming the parameter (`mens.serve.schemas`; the table is in docs/serving.md); `n` answers
(OpenAI) are generated in turn, each with its own seed, and a budget that ends an answer says "length".
Run: `mens serve RUN --port 8000`.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import uuid
from dataclasses import replace
from typing import TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from mens import __version__
from mens.model.engine import Engine, GenerationRequest
from mens.serve.errors import ApiError, ClientGone, api_error_response, error_response
from mens.serve.guards import ApiKeyGuard, BodyLimit
from mens.serve.scheduler import Job, Scheduler
from mens.serve.schemas import (
    MAX_CHOICES,
    UNSUPPORTED,
    ChatCompletionRequest,
    CompletionRequest,
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from mens.serve.streams import JobStream, ndjson_lines, sse_events

log = logging.getLogger("mens.serve")

SERVER_ALIAS = "mens"
"""A model name every mens server answers to, whatever the directory it serves is called."""
SEED_SPACE = 2**64
"""torch seeds are taken modulo 2**64 (negative ones as 2**64 - 1 + seed)."""

Body = TypeVar("Body", bound=BaseModel)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of answer `index` of an n-answer request: the request's seed for the first answer (so n=1 and
    the first of n answers agree), then the next seeds in torch's seed space. No seed (greedy): the engine's default."""
    if index == 0:
        return seed
    base = seed or 0
    return ((base if base >= 0 else base + SEED_SPACE - 1) + index) % SEED_SPACE


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The request's body as JSON validated by `model`, whatever its Content-Type header says."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ApiError(400, f"the body is not JSON ({str(e)[:200]}); send a JSON object",
                       code="invalid_json") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None


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
    started_at = _now()
    names = {engine.model_id, SERVER_ALIAS}

    def check_model(name: str | None, listed_at: str) -> None:
        """404 unless `name` is absent or names the served model (Ollama adds the tag ":latest" to bare names)."""
        if name is None or name in names or name.removesuffix(":latest") in names:
            return
        raise ApiError(404, f"model '{name}' not found: this server serves '{engine.model_id}' (GET {listed_at} "
                       "lists it)", param="model", code="model_not_found")

    async def prepare(inputs: list[dict], *, n: int = 1, max_tokens: int | None, max_param: str,
                      temperature: float, top_p: float | None, seed: int | None, stop: list[str],
                      constrained: bool | None) -> list[GenerationRequest]:
        """Check a generation and return one request per answer: each input (messages or a prompt) n times."""
        if max_tokens is not None and max_tokens > max_tokens_limit:
            raise ApiError(400, f"{max_param}={max_tokens} exceeds this server's limit of {max_tokens_limit}",
                           param=max_param)
        want = constrained_default if constrained is None else constrained
        if want and engine.constrained_language is None:
            raise ApiError(400, "this engine cannot constrain decoding; start the server with --constrained",
                           param="constrained")
        if n > 1 and temperature == 0:  # n greedy answers would be n copies of one answer, computed n times
            raise ApiError(400, f"n={n} with temperature 0 (greedy decoding, this server's default) gives {n} "
                           "identical answers; send a temperature above 0 for different answers, or n=1", param="n")
        if len(inputs) * n > MAX_CHOICES:
            raise ApiError(400, f"{len(inputs)} prompt(s) x n={n} asks for {len(inputs) * n} answers; this server "
                           f"gives at most {MAX_CHOICES} per request", param="n")
        if seed is None and temperature > 0:  # sampling without a seed differs from call to call, as in both APIs
            seed = secrets.randbits(63)
        cancelled = threading.Event()  # one request: stopping it stops whichever answer is being generated
        reqs = []
        for fields in inputs:
            req = GenerationRequest(**fields, max_tokens=max_tokens or default_max_tokens, temperature=temperature,
                                    top_p=1.0 if top_p is None else top_p, seed=seed, stop=stop, constrained=want,
                                    cancelled=cancelled)
            await _check_prompt(engine, req, explicit_max_tokens=max_tokens is not None, max_param=max_param)
            reqs += [replace(req, seed=choice_seed(seed, i)) for i in range(n)]
        return reqs

    async def complete(request: Request, reqs: list[GenerationRequest]) -> tuple[list[str], Job]:
        job = await scheduler.start(reqs, request.is_disconnected)
        try:
            return await job.collect(), job
        finally:
            job.close()

    def usage_json(job: Job, n: int) -> dict:
        """Token counts of the whole request: each prompt counted once (not once per answer), as OpenAI does."""
        prompt = sum(u.prompt_tokens for u in job.usages[::n])
        completion = sum(u.completion_tokens for u in job.usages)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def openai_fields(body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
                      max_param: str) -> dict:
        return {"n": body.n or 1, "max_tokens": max_tokens, "max_param": max_param, "temperature": body.temp,
                "top_p": body.top_p, "seed": body.seed, "stop": body.stops(), "constrained": body.constrained}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": engine.model_id, "constrained": engine.constrained_language,
                "busy": scheduler.busy, "queued": scheduler.waiting,
                "shutting_down": scheduler.stop_at is not None}

    def model_object() -> dict:
        return {"id": engine.model_id, "object": "model", "created": 0, "owned_by": "mens"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_object()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        check_model(model_id, "/v1/models")
        return model_object()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        check_model(body.model, "/v1/models")
        max_tokens, max_param = body.max_new()
        n = body.n or 1
        reqs = await prepare([{"messages": [m.for_template() for m in body.messages]}],
                             **openai_fields(body, max_tokens, max_param))
        cid, created, with_usage = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), body.include_usage()

        def chunk(index: int, delta: dict, finish=None) -> dict:
            out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": engine.model_id,
                   "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return out | ({"usage": None} if with_usage else {})

        if body.stream:
            job = await scheduler.start(reqs, request.is_disconnected)
            events = sse_events(job, lambda i: chunk(i, {"role": "assistant", "content": ""}),
                                lambda i, piece: chunk(i, {"content": piece}), lambda j: chunk(j.index, {}, j.finish),
                                (lambda j: chunk(0, {}) | {"choices": [], "usage": usage_json(j, n)})
                                if with_usage else None)
            return JobStream(events, job, "text/event-stream")
        texts, job = await complete(request, reqs)
        return {"id": cid, "object": "chat.completion", "created": created, "model": engine.model_id,
                "choices": [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": finish}
                            for i, (text, finish) in enumerate(zip(texts, job.finishes, strict=True))],
                "usage": usage_json(job, n)}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse_body(request, CompletionRequest)
        check_model(body.model, "/v1/models")
        n = body.n or 1
        reqs = await prepare([{"prompt": _nonempty(p)} for p in body.prompt],
                             **openai_fields(body, body.max_tokens, "max_tokens"))
        cid, created, with_usage = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time()), body.include_usage()

        def chunk(index: int, text: str, finish=None) -> dict:
            out = {"id": cid, "object": "text_completion", "created": created, "model": engine.model_id,
                   "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]}
            return out | ({"usage": None} if with_usage else {})

        if body.stream:
            job = await scheduler.start(reqs, request.is_disconnected)
            events = sse_events(job, None, chunk, lambda j: chunk(j.index, "", j.finish),
                                (lambda j: chunk(0, "") | {"choices": [], "usage": usage_json(j, n)})
                                if with_usage else None)
            return JobStream(events, job, "text/event-stream")
        texts, job = await complete(request, reqs)
        return {"id": cid, "object": "text_completion", "created": created, "model": engine.model_id,
                "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": finish}
                            for i, (text, finish) in enumerate(zip(texts, job.finishes, strict=True))],
                "usage": usage_json(job, n)}

    async def ollama_prepare(body: OllamaGenerateRequest | OllamaChatRequest, fields: dict
                             ) -> list[GenerationRequest]:
        o = body.opts
        return await prepare([fields], max_tokens=o.max_tokens(), max_param="options.num_predict",
                             temperature=o.temperature or 0.0, top_p=o.top_p, seed=o.seed, stop=o.stop or [],
                             constrained=None)

    @app.post("/api/generate")
    async def ollama_generate(request: Request):
        body = await parse_body(request, OllamaGenerateRequest)
        check_model(body.model, "/api/tags")
        name = body.model or engine.model_id
        if not body.prompt:  # Ollama's "load the model" call: nothing to generate
            return {"model": name, "created_at": _now(), "response": "", "done": True, "done_reason": "load"}
        if body.raw:
            fields = {"prompt": body.prompt}
        else:
            msgs = ([{"role": "system", "content": body.system}] if body.system else [])
            fields = {"messages": msgs + [{"role": "user", "content": body.prompt}]}
        reqs = await ollama_prepare(body, fields)
        return await ollama_answer(request, name, reqs, body.streaming, lambda piece: {"response": piece})

    @app.post("/api/chat")
    async def ollama_chat(request: Request):
        body = await parse_body(request, OllamaChatRequest)
        check_model(body.model, "/api/tags")
        name = body.model or engine.model_id
        if not body.messages:  # Ollama's "load the model" call: nothing to generate
            return {"model": name, "created_at": _now(), "message": {"role": "assistant", "content": ""},
                    "done": True, "done_reason": "load"}
        reqs = await ollama_prepare(body, {"messages": [m.for_template() for m in body.messages]})
        return await ollama_answer(request, name, reqs, body.streaming,
                                   lambda piece: {"message": {"role": "assistant", "content": piece}})

    async def ollama_answer(request: Request, name: str, reqs: list[GenerationRequest], stream: bool,
                            shape) -> object:
        started = time.perf_counter()

        def final(job: Job) -> dict:
            usage = job.usage
            return {"model": name, "created_at": _now(), **shape(""), "done": True, "done_reason": job.finish,
                    "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": 0,
                    "prompt_eval_count": usage.prompt_tokens, "eval_count": usage.completion_tokens}

        if not stream:
            texts, job = await complete(request, reqs)
            return {**final(job), **shape(texts[0])}
        job = await scheduler.start(reqs, request.is_disconnected)
        lines = ndjson_lines(job, lambda piece: {"model": name, "created_at": _now(), **shape(piece), "done": False},
                             final)
        return JobStream(lines, job, "application/x-ndjson")

    def ollama_details() -> dict:
        return {"parent_model": "", "format": "safetensors", "family": "mens", "families": ["mens"],
                "parameter_size": "", "quantization_level": ""}

    def ollama_model() -> dict:
        return {"name": engine.model_id, "model": engine.model_id, "modified_at": started_at, "size": 0,
                "digest": "", "details": ollama_details()}

    @app.get("/api/tags")
    async def ollama_tags():
        return {"models": [ollama_model()]}

    @app.get("/api/ps")
    async def ollama_ps():
        # The model stays loaded while the server runs: it never expires.
        return {"models": [ollama_model() | {"expires_at": "9999-12-31T23:59:59Z", "size_vram": 0,
                                             "context_length": getattr(engine, "context_length", None) or 0}]}

    @app.post("/api/show")
    async def ollama_show(request: Request):
        body = await parse_body(request, OllamaShowRequest)
        name = body.model or body.name
        if not name:
            raise ApiError(400, "model is required: send {\"model\": NAME} (GET /api/tags lists it)", param="model")
        check_model(name, "/api/tags")
        info = {"general.architecture": "mens", "general.basename": engine.model_id}
        if getattr(engine, "context_length", None):
            info["mens.context_length"] = engine.context_length
        # Ollama's template and parameters are Go-template and Modelfile text; the model's own (Jinja) chat template
        # applies here, so they are left empty rather than invented.
        return {"modelfile": f"# served by mens serve\nFROM {engine.model_id}\n", "parameters": "", "template": "",
                "license": "", "details": ollama_details(), "model_info": info, "capabilities": ["completion"],
                "modified_at": started_at}

    @app.get("/api/version")
    async def ollama_version():
        return {"version": __version__}

    @app.post("/api/embeddings")
    @app.post("/api/embed")
    async def ollama_embeddings(request: Request):
        return error_response(request.url.path, 501, "embeddings are not served by mens; this server only "
                              "generates text", type_="not_implemented", code="not_implemented")

    @app.post("/api/pull")
    @app.post("/api/push")
    @app.post("/api/create")
    @app.post("/api/copy")
    @app.delete("/api/delete")
    async def ollama_manage(request: Request):
        return error_response(request.url.path, 501, f"{request.url.path} is not served by mens: this server serves "
                              f"the one model it was started with ('{engine.model_id}')", type_="not_implemented",
                              code="not_implemented")

    @app.post("/generate")
    async def scorecard_generate(request: Request):
        """The original scorecard's `http_generate` shape: {prompt, max_tokens} -> {text, ...}."""
        body = await parse_body(request, CompletionRequest)
        if len(body.prompt) != 1 or (body.n or 1) != 1:
            raise ApiError(400, "/generate answers one prompt once; use /v1/completions for several", param="prompt")
        fields = openai_fields(body, body.max_tokens, "max_tokens")
        reqs = await prepare([{"messages": [{"role": "user", "content": _nonempty(body.prompt[0])}]}], **fields)
        texts, job = await complete(request, reqs)
        return {"text": texts[0], "tokens_generated": job.usage.completion_tokens, "model": engine.model_id,
                "object": "text_completion", "choices": [{"text": texts[0], "index": 0, "finish_reason": job.finish}]}

    return app


async def _check_prompt(engine: Engine, req: GenerationRequest, *, explicit_max_tokens: bool,
                        max_param: str = "max_tokens") -> None:
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
        raise ApiError(400, f"prompt ({n} tokens) + {max_param} ({req.max_tokens}) = {n + req.max_tokens} tokens "
                       f"exceeds the model's context of {ctx}; ask for at most {ctx - n} tokens",
                       param=max_param, code="context_length_exceeded")
    req.max_tokens = min(req.max_tokens, ctx - n)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = list(exc.errors())
        # What mens does not implement comes first: it is the error to fix, whatever else is wrong.
        errors.sort(key=lambda e: e.get("type") not in (UNSUPPORTED, "extra_forbidden"))
        problems = []
        for err in errors[:3]:
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{loc or 'body'}: {_problem(err)}")
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        code = {UNSUPPORTED: "unsupported_parameter", "extra_forbidden": "unknown_parameter"}.get(first.get("type"))
        return error_response(request.url.path, 400, "; ".join(problems) or "invalid request body", param=param,
                              code=code)

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


def _problem(err: dict) -> str:
    if err.get("type") == "extra_forbidden":
        return "unknown parameter: this server does not implement it (docs/serving.md lists what it takes)"
    return str(err.get("msg", "invalid")).removeprefix("Value error, ")


def _nonempty(prompt: str) -> str:
    if not prompt:
        raise ApiError(400, "prompt is empty; send the text to continue", param="prompt")
    return prompt


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
