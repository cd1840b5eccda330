"""The HTTP app against a real uvicorn server on loopback, with a scripted engine (no model needed)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from mens.model.engine import GenerationRequest, SequentialBatch, Usage
from mens.serve.app import create_app
from mens.serve.engine import StopScanner

ANSWER = "fn add(a: int, b: int) to int {\n    return a + b\n}\n"


class ScriptedEngine(SequentialBatch):
    """Streams a fixed answer a few characters at a time; records what it was asked."""

    model_id = "mens-test"
    constrained_language = "vox"

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.requests: list[GenerationRequest] = []
        self.active = 0
        self.max_active = 0

    def stream(self, request: GenerationRequest, usage: Usage) -> Iterator[str]:
        self.requests.append(request)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            usage.prompt_tokens = 7
            pieces = [ANSWER[i : i + 4] for i in range(0, len(ANSWER), 4)][: request.max_tokens]
            for piece in pieces:
                time.sleep(self.delay_s)
                usage.completion_tokens += 1
                yield piece
        finally:
            self.active -= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve():
    servers = []

    def start(engine, **kwargs) -> str:
        port = _free_port()
        config = uvicorn.Config(create_app(engine, **kwargs), host="127.0.0.1", port=port, log_level="warning")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 10
        while not server.started and time.time() < deadline:
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=5)


def test_openai_client_chat_and_stream(serve):
    openai = pytest.importorskip("openai")
    base = serve(ScriptedEngine())
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    [model] = client.models.list().data
    assert model.id == "mens-test"
    res = client.chat.completions.create(model="mens-test", messages=[{"role": "user", "content": "add"}])
    assert res.choices[0].message.content == ANSWER
    assert res.choices[0].finish_reason == "stop"
    assert res.usage.prompt_tokens == 7 and res.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="mens-test", messages=[{"role": "user", "content": "add"}],
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == ANSWER
    comp = client.completions.create(model="mens-test", prompt="fn", max_tokens=2)
    assert comp.choices[0].text == ANSWER[:8] and comp.choices[0].finish_reason == "length"


def test_ollama_generate_and_chat_ndjson(serve):
    engine = ScriptedEngine()
    base = serve(engine)
    with httpx.stream("POST", f"{base}/api/generate", json={"model": "mens-test", "prompt": "add"}, timeout=10) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert "".join(x["response"] for x in lines) == ANSWER
    assert lines[-1]["done"] is True and all(not x["done"] for x in lines[:-1])
    assert engine.requests[-1].messages == [{"role": "user", "content": "add"}]
    chat = httpx.post(f"{base}/api/chat", json={"messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert chat.json()["message"]["content"] == ANSWER and chat.json()["done"] is True
    assert httpx.get(f"{base}/api/tags").json()["models"][0]["name"] == "mens-test"
    assert "version" in httpx.get(f"{base}/api/version").json()
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    assert httpx.post(f"{base}/api/embeddings", json={"prompt": "x"}).status_code == 501
    scorecard = httpx.post(f"{base}/generate", json={"prompt": "add", "max_tokens": 64}).json()
    assert scorecard["text"] == ANSWER and scorecard["tokens_generated"] > 0


def test_bad_requests_get_openai_shaped_4xx(serve):
    base = serve(ScriptedEngine(), max_tokens_limit=64, max_request_bytes=2000)
    r = httpx.post(f"{base}/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                         "max_tokens": 10_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(f"{base}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "x" * 5000})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400


def test_api_key_is_required_when_set(serve):
    base = serve(ScriptedEngine(), api_key="sekrit")
    assert httpx.get(f"{base}/v1/models").status_code == 401
    assert httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer sekrit"}).status_code == 200
    assert httpx.get(f"{base}/health").status_code == 200


def test_concurrent_requests_are_queued_not_interleaved(serve):
    engine = ScriptedEngine(delay_s=0.005)
    base = serve(engine)
    results: list[str] = []

    def call():
        r = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                       timeout=30)
        results.append(r.json()["choices"][0]["message"]["content"])

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [ANSWER] * 6
    assert engine.max_active == 1


def test_stop_strings_cut_the_stream():
    scanner = StopScanner(["}\n"])
    out = "".join(scanner.feed(p) for p in [ANSWER[i : i + 3] for i in range(0, len(ANSWER), 3)]) + scanner.flush()
    assert out == ANSWER[: ANSWER.index("}\n")]
    plain = StopScanner([])
    assert plain.feed("abc") + plain.flush() == "abc"
