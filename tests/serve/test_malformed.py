"""Malformed and extreme input on every generating endpoint, both API shapes, streamed or not: always a 4xx
JSON error in the path's shape (never a 500, never a 200 stream with nothing in it). The last tests use
the real HFEngine on a tiny model, where extreme sampling values reach torch."""

from __future__ import annotations

import json

import httpx
import pytest
from tests.serve.conftest import SleepyEngine

SURROGATE = "\ud800"
DROP = object()  # a field the case removes
LONG = "word " * 100  # 100 tokens for the fake engine, whose context is 64

# (path, base body, where sampling options go: top level or Ollama's "options", name of max_tokens)
ENDPOINTS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, None, "max_tokens"),
    ("/v1/completions", {"prompt": "hi"}, None, "max_tokens"),
    ("/generate", {"prompt": "hi"}, None, "max_tokens"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, "options", "num_predict"),
    ("/api/generate", {"prompt": "hi"}, "options", "num_predict"),
]

SAMPLING = [("temperature", "hot"), ("temperature", float("nan")), ("temperature", float("inf")),
            ("temperature", -1), ("temperature", 1e308), ("top_p", 0), ("top_p", float("nan")), ("top_p", 1.5),
            ("top_p", "x"), ("seed", 2**64), ("seed", -(2**63) - 1), ("seed", "x"), ("seed", 1.5),
            ("stop", [SURROGATE]), ("stop", ["x"] * 100), ("stop", [7]), ("max", 0), ("max", "many"),
            ("max", 10**30), ("max", -5)]


def _text_cases(path: str, base: dict) -> list[tuple[str, dict]]:
    """Bodies whose text is wrong: bad Unicode, wrong type, over-long, empty."""
    if "messages" in base:
        msg = base["messages"][0]
        cases = [("surrogate", {"messages": [msg | {"content": SURROGATE}]}),
                 ("content type", {"messages": [msg | {"content": 123}]}),
                 ("unknown role", {"messages": [msg | {"role": "wizard"}]}),
                 ("messages type", {"messages": "hi"}),
                 ("over-long", {"messages": [msg | {"content": LONG}]}),
                 ("over max_tokens", {"messages": [msg | {"content": "word " * 40}], "max_tokens": 30})]
        if path != "/api/chat":  # no messages there is Ollama's "load the model" call (200, done)
            cases.append(("no messages", {"messages": []}))
        return cases
    cases = [("surrogate", {"prompt": "a" + SURROGATE}), ("prompt type", {"prompt": ["a", 1]}),
             ("over-long", {"prompt": LONG})]
    if path == "/api/generate":  # no or an empty prompt there is Ollama's "load the model" call (200, done)
        cases.append(("system surrogate", {"system": SURROGATE}))
    else:
        cases += [("empty prompt", {"prompt": ""}), ("no prompt", {"prompt": DROP})]
    return cases


def _matrix() -> list[tuple[str, str, bytes]]:
    out = []
    for path, base, options, max_name in ENDPOINTS:
        for stream in ([False] if path == "/generate" else [False, True]):
            for name, value in SAMPLING:
                key = max_name if name == "max" else name
                body = base | ({options: {key: value}} if options else {key: value}) | {"stream": stream}
                out.append((path, f"{key}={value!r:.20} stream={stream}", json.dumps(body).encode()))
            for name, patch in _text_cases(path, base):
                if name == "over max_tokens" and options:
                    patch = {"messages": patch["messages"], "options": {"num_predict": 30}}
                body = {k: v for k, v in (base | patch | {"stream": stream}).items() if v is not DROP}
                out.append((path, f"{name} stream={stream}", json.dumps(body).encode()))
        for name, raw in [("not json", b"{not json"), ("array", b"[1, 2]"), ("bad utf-8", b'{"prompt": "\xff\xfe"}'),
                          ("empty body", b""), ("null", b"null")]:
            out.append((path, name, raw))
    return out


def _assert_error_shape(path: str, r: httpx.Response, case: str) -> None:
    assert 400 <= r.status_code < 500, f"{path} {case}: {r.status_code} {r.text[:200]}"
    assert r.headers["content-type"] == "application/json", f"{path} {case}: {r.headers['content-type']}"
    error = r.json()["error"]
    if path.startswith("/api/"):
        assert isinstance(error, str) and error, f"{path} {case}: {r.text[:200]}"
    else:
        assert isinstance(error["message"], str) and error["message"] and error["type"], f"{path} {case}"


def test_malformed_input_matrix_gets_4xx_json_everywhere(server):
    engine = SleepyEngine(tokens=3, delay_s=0.0, context_length=64)
    base, _, _ = server(engine, max_tokens_limit=500)
    matrix = _matrix()
    assert len(matrix) > 250
    with httpx.Client(timeout=5, headers={"content-type": "application/json"}) as client:
        for path, case, raw in matrix:
            _assert_error_shape(path, client.post(f"{base}{path}", content=raw), case)
        for path in ("/v1/nope", "/api/nope"):
            _assert_error_shape(path, client.get(f"{base}{path}"), "unknown path")
        _assert_error_shape("/v1/chat/completions", client.get(f"{base}/v1/chat/completions"), "wrong method")
    assert engine.started == 0, "a malformed request reached the engine"


def test_context_errors_name_the_numbers(server):
    base, _, _ = server(SleepyEngine(context_length=64))
    r = httpx.post(f"{base}/v1/completions", json={"prompt": LONG}, timeout=5)
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert "100 tokens" in r.json()["error"]["message"] and "64" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "word " * 40, "max_tokens": 30}, timeout=5)
    assert r.json()["error"]["param"] == "max_tokens" and "at most 24" in r.json()["error"]["message"]
    # Without an explicit max_tokens the answer fits the room left: 64 - 60 = 4 tokens, cut at "length".
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "word " * 60}, timeout=5)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_extreme_but_valid_values_are_answered(server):
    engine = SleepyEngine(tokens=3, delay_s=0.0)
    base, _, _ = server(engine)
    for body in [{"top_p": 1e-300}, {"temperature": 2.0, "seed": 2**64 - 1}, {"seed": -(2**63)},
                 {"stop": "t1", "temperature": 5e-324}]:
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "hi"} | body, timeout=5)
        assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("t0"), (body, r.text)
    r = httpx.post(f"{base}/api/generate", json={"prompt": "hi", "options": {"num_predict": -1}, "stream": False})
    assert r.status_code == 200 and r.json()["response"] == "t0 t1 t2 "
    load = httpx.post(f"{base}/api/generate", json={"model": "mens-fake", "prompt": ""}, timeout=5).json()
    assert load["done"] is True and load["done_reason"] == "load" and engine.started == 5


@pytest.fixture
def real_server(server):
    """The real HFEngine over a 2-layer GPT-2 (learned positions, context n_positions=256) built in code."""
    torch = pytest.importorskip("torch")
    from tests.conftest import build_tiny_chat_lm

    from mens.model.hf_engine import HFEngine
    from mens.model.inference import LoadedModel

    torch.set_num_threads(1)
    model, tokenizer = build_tiny_chat_lm("gpt2")
    engine = HFEngine(LoadedModel(model, tokenizer, system_prompt=None, model_id="tiny-gpt2", kind="model"))
    assert engine.context_length == 256
    base, _, _ = server(engine)
    return base


def test_real_engine_takes_extreme_sampling_and_refuses_bad_prompts(real_server):
    base = real_server
    msg = [{"role": "user", "content": "Write add."}]
    greedy = httpx.post(f"{base}/v1/chat/completions", json={"messages": msg, "max_tokens": 8}, timeout=30).json()
    text = greedy["choices"][0]["message"]["content"]
    for sampling in [{"temperature": 1.0, "top_p": 1e-300}, {"temperature": 1e-300}, {"temperature": 5e-324}]:
        r = httpx.post(f"{base}/v1/chat/completions", json={"messages": msg, "max_tokens": 8} | sampling, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == text, sampling
    for seed in (2**64 - 1, -(2**63), 0):
        body = {"prompt": "fn", "max_tokens": 4, "temperature": 1.5, "seed": seed, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as s:
            events = [x.removeprefix("data: ") for x in s.iter_lines() if x]
        assert s.status_code == 200 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    for body, status in [({"prompt": ""}, 400), ({"prompt": "fn " * 300}, 400), ({"prompt": SURROGATE}, 400),
                         ({"prompt": "fn", "max_tokens": 300}, 400)]:
        r = httpx.post(f"{base}/v1/completions", content=json.dumps(body), timeout=30)  # json.dumps escapes U+D800
        assert r.status_code == status and r.json()["error"]["message"], (body, r.text)
    r = httpx.post(f"{base}/api/generate", json={"prompt": "fn " * 300, "raw": True}, timeout=30)
    assert r.status_code == 400 and "256" in r.json()["error"]
