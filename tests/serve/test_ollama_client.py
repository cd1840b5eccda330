"""The official `ollama` client against a live loopback `mens serve`: list/show/ps, generate and chat (plain and
streamed), options reaching the engine, done_reason, and errors as `ResponseError` with Ollama's status codes."""

from __future__ import annotations

import datetime

import pytest
from tests.serve.echo_engine import EchoEngine

ollama = pytest.importorskip("ollama")

USER = [{"role": "user", "content": "write add"}]


@pytest.fixture
def client(server):
    engine = EchoEngine()
    base, _, _ = server(engine)
    return ollama.Client(host=base, timeout=10), engine


def test_list_show_ps(client):
    c, _ = client
    [model] = c.list().models
    assert model.model == "mens-echo" and isinstance(model.modified_at, datetime.datetime)
    shown = c.show("mens-echo")
    assert shown.capabilities == ["completion"] and shown.modelinfo["mens.context_length"] == 64
    assert c.show("mens-echo:latest").details.family == "mens"
    [running] = c.ps().models
    assert running.model == "mens-echo" and running.context_length == 64
    with pytest.raises(ollama.ResponseError) as e:
        c.show("llama3.2")
    assert e.value.status_code == 404 and "llama3.2" in e.value.error


def test_generate_plain_and_streamed(client):
    c, engine = client
    res = c.generate(model="mens-echo", prompt="Why?")
    assert res.response == EchoEngine.answer() and res.done and res.done_reason == "stop"
    assert res.eval_count == 5 and res.prompt_eval_count == 3
    assert engine.requests[-1].messages == [{"role": "user", "content": "Why?"}]
    parts = list(c.generate(model="mens-echo", prompt="Why?", stream=True, options={"num_predict": 3}))
    assert "".join(p.response for p in parts) == "seed=None w1 w2 "
    assert [p.done for p in parts] == [False] * 3 + [True] and parts[-1].done_reason == "length"
    raw = c.generate(model="mens-echo", prompt="fn add", raw=True, system="ignored when raw")
    assert raw.response == EchoEngine.answer() and engine.requests[-1].prompt == "fn add"
    load = c.generate(model="mens-echo")  # no prompt: Ollama's "load the model" call
    assert load.done and load.done_reason == "load" and load.response == ""


def test_chat_plain_and_streamed(client):
    c, engine = client
    res = c.chat(model="mens-echo", messages=[{"role": "system", "content": "You write Vox."}] + USER)
    assert res.message.role == "assistant" and res.message.content == EchoEngine.answer()
    assert res.done_reason == "stop" and engine.requests[-1].messages[0]["role"] == "system"
    parts = list(c.chat(model="mens-echo", messages=USER, stream=True, options={"num_predict": 2}))
    assert "".join(p.message.content for p in parts) == "seed=None w1 " and parts[-1].done_reason == "length"
    assert c.chat(model="mens-echo", messages=[]).done_reason == "load"


def test_options_reach_the_engine(client):
    c, engine = client
    options = {"num_predict": 4, "temperature": 0.5, "top_p": 0.9, "seed": 11, "stop": ["w3"], "num_ctx": 2048,
               "top_k": 0, "repeat_penalty": 1.0}
    res = c.generate(model="mens-echo", prompt="Why?", options=options, keep_alive="5m", think=False)
    req = engine.requests[-1]
    assert (req.max_tokens, req.temperature, req.top_p, req.seed, req.stop) == (4, 0.5, 0.9, 11, ["w3"])
    assert res.response == "seed=11 w1 w2 " and res.done_reason == "stop"


@pytest.mark.parametrize("kwargs, named", [
    ({"options": {"top_k": 40}}, "top_k"),
    ({"options": {"repeat_penalty": 1.3}}, "repeat_penalty"),
    ({"options": {"temperature": 9.0}}, "temperature"),
    ({"format": "json"}, "format"),
    ({"think": True}, "think"),
    ({"images": [b"\x89PNG"]}, "images"),
])
def test_unsupported_or_bad_options_are_400(client, kwargs, named):
    c, engine = client
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="mens-echo", prompt="Why?", **kwargs)
    assert e.value.status_code == 400 and named in e.value.error and engine.requests == []


def test_tools_are_refused_in_chat(client):
    c, _ = client

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
          a: first
          b: second
        """
        return a + b

    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="mens-echo", messages=USER, tools=[add])
    assert e.value.status_code == 400 and "tools" in e.value.error


def test_unknown_model_is_404_streamed_or_not(client):
    c, engine = client
    for call in (lambda: c.generate(model="llama3.2", prompt="Why?"),
                 lambda: list(c.generate(model="llama3.2", prompt="Why?", stream=True)),
                 lambda: list(c.chat(model="llama3.2", messages=USER, stream=True))):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 404 and "not found" in e.value.error
    assert engine.requests == []


def test_error_mid_stream_raises_in_the_client(server):
    base, _, _ = server(EchoEngine(fail_after=2))
    stream = ollama.Client(host=base, timeout=10).generate(model="mens-echo", prompt="Why?", stream=True)
    with pytest.raises(ollama.ResponseError, match="generation failed"):
        list(stream)
