"""Wire-level conformance with the OpenAI and Ollama APIs: Ollama's documented `curl -d` form, each API's error
shape, every parameter mens refuses (400 naming it) or takes at its no-op value (200), n answers under the
deadline and a dropped client, and both official clients against the real engine on a tiny model."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import pytest
from tests.serve.conftest import SleepyEngine, wait_until
from tests.serve.echo_engine import EchoEngine

from mens.serve.app import SEED_SPACE, choice_seed

CHAT = {"model": "mens-echo", "messages": [{"role": "user", "content": "write add"}]}
PROMPT = {"model": "mens-echo", "prompt": "fn add"}
OLLAMA = {"model": "mens-echo", "prompt": "Why?", "stream": False}


@pytest.fixture
def echo(server):
    engine = EchoEngine()
    base, _, _ = server(engine)
    return base, engine


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_in_ollamas_documented_form(echo):
    base, engine = echo

    def curl(body: str) -> str:
        # Exactly the form of Ollama's API docs: `-d` with no Content-Type header (curl sends form-urlencoded).
        out = subprocess.run(["curl", "-sS", "--max-time", "10", f"{base}/api/generate", "-d", body],
                             capture_output=True, text=True, timeout=20, check=True)
        return out.stdout

    lines = [json.loads(x) for x in curl('{"model": "mens-echo", "prompt": "Why?"}').splitlines()]
    assert "".join(x["response"] for x in lines) == EchoEngine.answer()  # streamed by default, one line a piece
    assert len(lines) == 6 and lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    once = json.loads(curl('{"model": "mens-echo", "prompt": "Why?", "stream": false, "options": {"num_predict": 2}}'))
    assert once["response"] == "seed=None w1 " and once["done_reason"] == "length" and once["eval_count"] == 2
    assert json.loads(curl('{"model": "mens-echo"}'))["done_reason"] == "load"
    assert json.loads(curl('{"model": "llama3.2", "prompt": "Why?"}')) == {
        "error": "model 'llama3.2' not found: this server serves 'mens-echo' (GET /api/tags lists it)"}
    assert len(engine.requests) == 2


def test_any_content_type_is_read_as_json(echo):
    base, _ = echo
    for ctype in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"content-type": ctype} if ctype else {}
        r = httpx.post(f"{base}/api/chat", content=json.dumps(CHAT | {"stream": False}), headers=headers, timeout=5)
        assert r.status_code == 200 and r.json()["message"]["content"] == EchoEngine.answer(), ctype
        r = httpx.post(f"{base}/v1/completions", content=json.dumps(PROMPT), headers=headers, timeout=5)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == EchoEngine.answer(), ctype


def test_each_api_has_its_own_error_shape(echo):
    base, engine = echo
    cases = [("/api/generate", OLLAMA | {"model": "llama3.2"}, 404), ("/api/chat", CHAT | {"model": "x"}, 404),
             ("/api/generate", OLLAMA | {"options": {"nope": 1}}, 400), ("/api/generate", OLLAMA | {"nope": 1}, 400),
             ("/api/show", {"model": "x"}, 404), ("/api/show", {}, 400)]
    for path, body, status in cases:
        r = httpx.post(f"{base}{path}", json=body, timeout=5)
        assert r.status_code == status and isinstance(r.json()["error"], str), (path, body, r.text)
    r = httpx.post(f"{base}/v1/chat/completions", json=CHAT | {"model": "gpt-4o"}, timeout=5)
    assert r.status_code == 404 and r.json()["error"] | {"message": ""} == {
        "message": "", "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    r = httpx.post(f"{base}/v1/chat/completions", json=CHAT | {"top_k": 3}, timeout=5)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "top_k" and error["code"] == "unknown_parameter"
    assert "top_k: unknown parameter" in error["message"]
    assert httpx.get(f"{base}/v1/models/gpt-4o", timeout=5).json()["error"]["code"] == "model_not_found"
    assert engine.requests == []


# (path, field, value): refused with 400 naming the field; the engine is never reached.
REFUSED = [
    *[("/v1/chat/completions", f, v) for f, v in [
        ("logprobs", True), ("top_logprobs", 2), ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "required"), ("functions", [{"name": "f"}]), ("function_call", {"name": "f"}),
        ("response_format", {"type": "json_object"}), ("response_format", {"type": "json_schema"}),
        ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy"}), ("prediction", {"type": "content"}),
        ("reasoning_effort", "high"), ("verbosity", "low"), ("web_search_options", {}),
        ("frequency_penalty", 0.5), ("presence_penalty", -1), ("logit_bias", {"50256": -100}), ("store", True),
        ("n", 2), ("n", 99), ("top_k", 5), ("repetition_penalty", 1.1)]],
    ("/v1/chat/completions", "messages.0.content",
     [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]),
    ("/v1/chat/completions", "messages.0.tool_calls", [{"id": "c", "type": "function"}]),
    *[("/v1/completions", f, v) for f, v in [
        ("echo", True), ("logprobs", 0), ("suffix", "}"), ("best_of", 3), ("prompt", [1, 2, 3]), ("prompt", [])]],
    *[("/api/generate", f, v) for f, v in [
        ("format", "json"), ("format", {"type": "object"}), ("think", True), ("images", ["aGk="]),
        ("suffix", "}"), ("template", "{{ .Prompt }}"), ("context", [1, 2]), ("logprobs", True), ("width", 64),
        ("options.top_k", 40), ("options.min_p", 0.05), ("options.typical_p", 0.5), ("options.tfs_z", 2),
        ("options.repeat_penalty", 1.1), ("options.presence_penalty", 1), ("options.frequency_penalty", 1),
        ("options.mirostat", 2), ("options.nonsense", 1)]],
    ("/api/chat", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/api/chat", "messages.0.images", ["aGk="]),
]

# (path, field, value): the value a client sends by default, or one that cannot change the answer: 200.
ACCEPTED = [
    *[("/v1/chat/completions", f, v) for f, v in [
        ("logprobs", False), ("top_logprobs", 0), ("tools", []), ("tool_choice", "none"), ("tool_choice", "auto"),
        ("parallel_tool_calls", True), ("response_format", {"type": "text"}), ("modalities", ["text"]),
        ("frequency_penalty", 0), ("presence_penalty", 0.0), ("logit_bias", {}), ("store", False), ("n", 1),
        ("user", "u"), ("metadata", {"a": "b"}), ("service_tier", "auto"), ("safety_identifier", "s"),
        ("prompt_cache_key", "k"), ("stream_options", {"include_usage": False}), ("max_completion_tokens", 3),
        ("reasoning_effort", "none"), ("temperature", None), ("top_p", None), ("seed", None), ("stop", None)]],
    ("/v1/chat/completions", "messages.0.name", "alice"),
    *[("/v1/completions", f, v) for f, v in [
        ("echo", False), ("logprobs", None), ("suffix", None), ("best_of", 1), ("prompt", ["fn a"])]],
    *[("/api/generate", f, v) for f, v in [
        ("format", ""), ("think", False), ("images", []), ("keep_alive", "5m"), ("keep_alive", 0), ("raw", False),
        ("truncate", True), ("options.num_ctx", 4096), ("options.num_thread", 2), ("options.top_k", 0),
        ("options.repeat_penalty", 1.0), ("options.repeat_last_n", 64), ("options.mirostat", 0),
        ("options.stop", "w3")]],
    ("/api/chat", "tools", []),
    ("/api/chat", "messages.0.thinking", "hmm"),
]


def _body(path: str, field: str, value) -> dict:
    body = json.loads(json.dumps({"/v1/chat/completions": CHAT, "/v1/completions": PROMPT, "/api/chat": CHAT,
                                  "/api/generate": OLLAMA}[path]))
    body["stream"] = False
    target, *keys = field.split(".")
    if target == "options":
        body["options"] = {keys[0]: value}
    elif target == "messages":
        body["messages"][int(keys[0])][keys[1]] = value
    else:
        body[target] = value
    return body


def test_refused_parameters_get_400_naming_them(echo):
    base, engine = echo
    with httpx.Client(timeout=5) as client:
        for path, field, value in REFUSED:
            r = client.post(f"{base}{path}", json=_body(path, field, value))
            assert r.status_code == 400, (path, field, value, r.text)
            error = r.json()["error"]
            if path.startswith("/api/"):
                assert isinstance(error, str) and field in error, (path, field, error)
            else:
                assert error["param"] == field and field in error["message"], (path, field, error)
    assert engine.requests == []


def test_no_op_values_are_accepted(echo):
    base, engine = echo
    with httpx.Client(timeout=5) as client:
        for path, field, value in ACCEPTED:
            r = client.post(f"{base}{path}", json=_body(path, field, value))
            assert r.status_code == 200, (path, field, value, r.text)
    assert len(engine.requests) == len(ACCEPTED)


def test_choice_seeds_are_distinct_and_valid():
    assert choice_seed(None, 0) is None and choice_seed(5, 0) == 5 and choice_seed(None, 2) == 2
    assert choice_seed(5, 1) == 6 and choice_seed(2**64 - 1, 1) == 0
    assert choice_seed(-1, 1) == 2**64 - 1  # torch reads -1 as 2**64 - 2
    seeds = [choice_seed(-(2**63), i) for i in range(1, 16)]
    assert len(set(seeds)) == 15 and all(0 <= s < SEED_SPACE for s in seeds)


def test_n_answers_share_the_deadline_and_free_the_engine(server):
    engine = SleepyEngine(tokens=50, delay_s=0.02)
    base, _, _ = server(engine, request_timeout_s=0.5)
    body = {"messages": [{"role": "user", "content": "x"}], "n": 3, "temperature": 1.0}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200 and [c["finish_reason"] for c in r.json()["choices"]] == ["length"] * 3
    assert 0 < engine.produced < 50
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body | {"stream": True}, timeout=10) as s:
        next(s.iter_lines())  # the client leaves after the first event
    wait_until(lambda: engine.active == 0, what="the engine freed after the client left an n-answer stream")
    # The engine's thread counts itself done a moment before the server's loop releases the engine's lock.
    wait_until(lambda: not httpx.get(f"{base}/health", timeout=5).json()["busy"],
               what="the server idle after the client left an n-answer stream")
    assert engine.max_active == 1


@pytest.fixture
def real(server):
    """The real HFEngine over a 2-layer GPT-2 built in code (it never emits its stop token in 64 greedy steps)."""
    torch = pytest.importorskip("torch")
    from tests.conftest import build_tiny_chat_lm

    from mens.model.hf_engine import HFEngine
    from mens.model.inference import LoadedModel

    torch.set_num_threads(1)
    model, tokenizer = build_tiny_chat_lm("gpt2")
    base, _, _ = server(HFEngine(LoadedModel(model, tokenizer, system_prompt=None, model_id="tiny", kind="model")))
    return base


def test_both_clients_against_the_real_engine(real):
    openai = pytest.importorskip("openai")
    ollama = pytest.importorskip("ollama")
    with openai.OpenAI(base_url=f"{real}/v1", api_key="unused", max_retries=0, timeout=30) as c:
        msgs = [{"role": "user", "content": "Write add."}]
        res = c.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=4)
        assert res.choices[0].finish_reason == "length" and res.usage.completion_tokens == 4
        streamed = c.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=4, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in streamed) == res.choices[0].message.content
        one = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, seed=3)
        many = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, seed=3, n=2)
        assert many.choices[0].message.content == one.choices[0].message.content
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model="tiny", prompt="fn", max_tokens=300)  # past the 256-token context
    client = ollama.Client(host=real, timeout=30)
    out = client.generate(model="tiny", prompt="Write add.", options={"num_predict": 4})
    assert out.done_reason == "length" and out.eval_count == 4
    chat = client.chat(model="tiny:latest", messages=msgs, options={"num_predict": 4})
    assert chat.message.content == res.choices[0].message.content  # same prompt, same greedy answer
